"""A batch on two engine replicas sharing PostgreSQL behind one bridge: its
lines run on both (the router picks a replica per line, the claims are in the
shared database), and when one replica is killed (SIGKILL) midway the batch
completes on the other with every line answered once."""

from __future__ import annotations

import json
import os
import signal
import time

import openai
import pytest

from tests import harness
from tests.postgres import PostgresCluster
from tests.test_batches import chat_line, jsonl, wait_done
from tests.test_replicas import Replica


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batch-replicas")
    pg = PostgresCluster()
    replicas, bridge = [], None
    try:
        replicas = [Replica(tmp, pg.url, name) for name in ("a", "b")]
        for r in replicas:
            harness.wait_serving(r.process, r.port)
        targets = ",".join(f"127.0.0.1:{r.port}" for r in replicas)
        bridge, http_port = harness.start_bridge(tmp, replicas[0].port,
                                                 MILLM_ENGINE_TARGETS=targets)
        harness.wait_http(bridge, f"http://127.0.0.1:{http_port}/readyz")
        yield replicas, http_port
    finally:
        if bridge is not None:
            bridge.stop()
        for r in replicas:
            r.stop()
        pg.close()


def prompt_tokens(replica: Replica) -> float:
    """Prompt tokens the replica has read (0 before its first request)."""
    try:
        return replica.metric("vllm:prompt_tokens_total")
    except KeyError:
        return 0.0


def test_a_batch_runs_on_both_replicas_and_survives_losing_one(cluster):
    (a, b), http_port = cluster
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused",
                           max_retries=2, timeout=60)
    lines = [chat_line(i, f"Tell me about the harbour, part {i}.", max_tokens=16)
             for i in range(48)]
    uploaded = client.files.create(file=("r.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    before = (prompt_tokens(a), prompt_tokens(b))
    deadline = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 12:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    served = (prompt_tokens(a) - before[0], prompt_tokens(b) - before[1])
    assert min(served) > 0, served  # the lines went to both replicas
    os.kill(a.process.proc.pid, signal.SIGKILL)
    a.process.proc.wait(10)
    done = wait_done(client, batch.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (48, 0)
    ids = [json.loads(x)["custom_id"]
           for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(ids) == sorted(f"chat-{i}" for i in range(48))
