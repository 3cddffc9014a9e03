"""The Linux scheduling policy the engine's and the bridge's threads run under.

Each server is a handful of threads sharing what cores it has: the engine's
model thread, its event loop and gRPC's pollers; the bridge's event loop.
Under Linux's default policy (SCHED_OTHER) a thread that wakes, say a gRPC
poller when a frame arrives, may preempt the thread on its core at once. Where
the servers have fewer cores than busy threads (a loaded machine, a pod's CPU
quota, the benches' one-core stacks), the model thread is then interrupted
several times a decode step, each interruption costing a switch and cold caches
afterwards: measured on a 2-core machine with the engine on one core, the
model thread was preempted about five times a step and a 9 µs numpy pass over
the logits took 50–120 µs inside the engine.

SCHED_BATCH (sched(7)) keeps the same CPU share and nice value; only a waking
thread no longer preempts the running one, which keeps its core until it
blocks (the GIL, a socket, an idle queue) or its slice ends. On the same
machine it raised the demo GGUF model's throughput at 8 clients by about a
third (docs/performance.md). With cores to spare nothing changes: a waking
thread goes to an idle core. The cost is that a wake-up can wait up to a
slice on a saturated core (a few milliseconds of time to first token).

So `batch` is the default and `normal` (MILLM_SCHED_POLICY=normal) keeps the
kernel's default; where the policy cannot be set (not Linux, or a sandbox that
forbids sched_setscheduler) the server says so and runs under what it has.
Shared by both servers' configs and entry points.
"""

from __future__ import annotations

import logging
import os

POLICIES = ("batch", "normal")
DEFAULT = "batch"
HELP = ("MILLM_SCHED_POLICY: batch (the default) runs the server's threads under Linux's "
        "SCHED_BATCH, so a waking thread does not preempt a busy one on a shared core; "
        "normal keeps the kernel's default policy")


def apply(policy: str, log: logging.Logger) -> bool:
    """Put every thread of this process under `policy` (threads started later
    inherit it from the one that starts them); True if it is in force."""
    if policy not in POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}")
    if not hasattr(os, "SCHED_BATCH"):
        log.info("scheduling policy %s: not available on this platform", policy)
        return policy == "normal"
    wanted = os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    try:
        for thread in threads:
            try:
                os.sched_setscheduler(thread, wanted, os.sched_param(0))
            except ProcessLookupError:  # the thread ended meanwhile
                pass
    except OSError as exc:
        log.warning("scheduling policy %s could not be set (%s); running under the "
                    "kernel's default", policy, exc.strerror)
        return False
    return True
