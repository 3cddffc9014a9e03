"""Both servers run their threads under SCHED_BATCH unless told otherwise
(common/scheduling.py): checked on the running session stack, every thread of
the engine and of the bridge after a generation (so the threads gRPC, uvicorn
and the model start lazily exist too), and in a child process for `normal`,
for threads started before and after the call."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.harness import ROOT

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux only")


def policies(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = os.sched_getscheduler(int(tid))
        except ProcessLookupError:
            pass
    return out


def test_every_thread_of_both_servers_runs_under_sched_batch(stack, client):
    reply = client.chat.completions.create(
        model="millm-tiny", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert reply.usage.completion_tokens >= 1
    for process in (stack.engine, stack.bridge):
        seen = policies(process.proc.pid)
        assert len(seen) > 2, seen  # the event loop, gRPC's threads, the model thread
        assert set(seen.values()) == {os.SCHED_BATCH}, seen


def test_normal_keeps_the_kernels_policy_for_threads_before_and_after():
    script = textwrap.dedent("""
        import logging, os, threading
        from common import scheduling
        log = logging.getLogger("t")
        hold = threading.Event()
        early = threading.Thread(target=hold.wait); early.start()
        def policy(thread): return os.sched_getscheduler(thread.native_id)
        assert scheduling.apply("batch", log)
        late = threading.Thread(target=hold.wait); late.start()
        print(policy(early), policy(late), os.sched_getscheduler(0))
        assert scheduling.apply("normal", log)
        print(policy(early), policy(late), os.sched_getscheduler(0))
        hold.set()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    batch, normal = done.stdout.split("\n")[:2]
    assert batch.split() == [str(os.SCHED_BATCH)] * 3
    assert normal.split() == [str(os.SCHED_OTHER)] * 3
