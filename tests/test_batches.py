"""OpenAI's Files and Batch APIs end to end (service/batches, BatchService,
rest_bridge/serving/files.py, rest_bridge/batch_runner.py): the openai SDK's
own path (files.create, batches.create, batches.retrieve, files.content)
unmodified, each result equal to the same request made alone (greedy), bad
lines in the error file while the rest run, and a batch that survives its
engine being killed (SIGKILL) midway: every line answered once."""

from __future__ import annotations

import json
import time

import numpy as np
import openai
import pytest

from tests import harness
from tests.conftest import MODEL
from tests.http_helpers import call

QUESTIONS = ["Tell me about the river.", "What does the miller do?", "Hello!",
             "Where is the market?", "Who keeps the lighthouse?", "What did the cat do?"]


def chat_line(i: int, question: str, **extra) -> dict:
    return {"custom_id": f"chat-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": question}],
                     "max_tokens": 8, "temperature": 0, **extra}}


def jsonl(items) -> bytes:
    return ("\n".join(x if isinstance(x, str) else json.dumps(x) for x in items) + "\n").encode()


def sdk(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def wait_done(client, batch_id: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.3)
    raise AssertionError(f"batch {batch_id} still {batch.status} after {timeout}s")


def results(client, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    text = client.files.content(file_id).text
    return {(item["custom_id"] or f"line-{n}"): item
            for n, item in enumerate(json.loads(x) for x in text.splitlines())}


def test_the_sdk_path_gives_each_line_its_own_answer(stack):
    client = sdk(stack)
    lines = [chat_line(i, q) for i, q in enumerate(QUESTIONS)]
    lines.append({"custom_id": "text-0", "method": "POST", "url": "/v1/completions",
                  "body": {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8,
                           "temperature": 0}})
    lines.append({"custom_id": "embed-0", "method": "POST", "url": "/v1/embeddings",
                  "body": {"model": MODEL, "input": ["the mill", "the river"]}})
    lines += ["not json", {"custom_id": "bad-method", "method": "GET",
                           "url": "/v1/chat/completions", "body": {}},
              chat_line(99, "Hi", max_tokens=-3)]
    uploaded = client.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes == len(jsonl(lines))
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "test"})
    assert batch.status == "in_progress" and batch.request_counts.total == len(lines)
    done = wait_done(client, batch.id)
    assert done.status == "completed" and done.metadata == {"run": "test"}
    assert (done.request_counts.completed, done.request_counts.failed) == (8, 3)
    out, errors = results(client, done.output_file_id), results(client, done.error_file_id)
    assert sorted(out) == sorted([f"chat-{i}" for i in range(6)] + ["text-0", "embed-0"])
    for i, question in enumerate(QUESTIONS):
        alone = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=8,
            temperature=0)
        body = out[f"chat-{i}"]["response"]["body"]
        assert out[f"chat-{i}"]["response"]["status_code"] == 200
        assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content
    text = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8,
                                     temperature=0)
    assert out["text-0"]["response"]["body"]["choices"][0]["text"] == text.choices[0].text
    vectors = client.embeddings.create(model=MODEL, input=["the mill", "the river"])
    got = [d["embedding"] for d in out["embed-0"]["response"]["body"]["data"]]
    assert np.allclose(got, [d.embedding for d in vectors.data], atol=1e-5)
    # The lines that were no request, and the request the engine refused.
    assert errors["line-0"]["error"]["code"] == "invalid_json_line"
    assert errors["bad-method"]["error"]["code"] == "invalid_method"
    assert errors["chat-99"]["response"]["status_code"] == 400
    assert errors["chat-99"]["response"]["body"]["error"]["param"] == "max_tokens"
    # Listing, the finished batch's cancel (OpenAI's refusal), and the file's deletion.
    assert batch.id in [b.id for b in client.batches.list().data]
    with pytest.raises(openai.BadRequestError):
        client.batches.cancel(batch.id)
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


@pytest.mark.parametrize(("body", "param", "status"), [
    ({"input_file_id": "file-nothing", "endpoint": "/v1/chat/completions",
      "completion_window": "24h"}, "input_file_id", 404),
    ({"input_file_id": "file-x", "endpoint": "/v1/audio", "completion_window": "24h"},
     "endpoint", 400),
    ({"input_file_id": "file-x", "endpoint": "/v1/chat/completions",
      "completion_window": "2 days"}, "completion_window", 400),
])
def test_bad_batches_are_refused_naming_the_field(stack, body, param, status):
    reply = call(stack.http_port, "POST", "/v1/batches", body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"]["param"] == param


def test_uploads_are_checked(stack):
    client = sdk(stack)
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.bin", b"\xff\xfe\x00"), purpose="batch")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}"), purpose="nothing")
    too_big = b"x" * (8 * 1024 * 1024 + 1)
    with pytest.raises(openai.APIStatusError) as caught:
        client.files.create(file=("x.jsonl", too_big), purpose="batch")
    assert caught.value.status_code == 413
    twice = client.files.create(file=("t.jsonl", jsonl([chat_line(0, "a"), chat_line(0, "b")])),
                                purpose="batch")
    with pytest.raises(openai.BadRequestError) as caught:
        client.batches.create(input_file_id=twice.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
    assert "custom_id" in str(caught.value)


def test_a_batch_survives_its_engine_being_killed(tmp_path):
    stack = harness.OwnStack(tmp_path)
    try:
        client = sdk(stack)
        # Long enough (120 tokens each) that the kill lands with most lines unanswered.
        lines = [chat_line(i, f"{QUESTIONS[i % 6]} ({i})", max_tokens=120, ignore_eos=True)
                 for i in range(40)]
        uploaded = client.files.create(file=("b.jsonl", jsonl(lines)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        deadline = time.monotonic() + 120
        while (completed := client.batches.retrieve(batch.id).request_counts.completed) < 8:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        stack.engine.proc.kill()
        # Killed midway (a batch done before the kill would prove nothing).
        assert completed < 40
        stack.engine.proc.wait()
        time.sleep(1)
        stack.engine, _ = harness.start_engine(tmp_path, MILLM_GRPC_PORT=str(stack.grpc_port))
        harness.wait_serving(stack.engine, stack.grpc_port)
        done = wait_done(client, batch.id)
        assert done.status == "completed"
        assert (done.request_counts.completed, done.request_counts.failed) == (40, 0)
        out = client.files.content(done.output_file_id).text.splitlines()
        ids = [json.loads(x)["custom_id"] for x in out]
        assert sorted(ids) == sorted(f"chat-{i}" for i in range(40))  # each once
        for item in (json.loads(x) for x in out[:5]):
            i = int(item["custom_id"].split("-")[1])
            alone = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": f"{QUESTIONS[i % 6]} ({i})"}],
                max_tokens=120, temperature=0, extra_body={"ignore_eos": True})
            assert item["response"]["body"]["choices"][0]["message"]["content"] == \
                alone.choices[0].message.content
    finally:
        stack.stop()
