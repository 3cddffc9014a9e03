"""The Python client (clients/python): the wrapper against a live engine, and a
fresh install without the server's dependencies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from millm.client import AsyncClient, Client, MillmError
from tests import harness
from tests.conftest import MODEL

HELLO = [{"role": "user", "content": "Hello!"}]


def test_sync_client(stack):
    with Client(stack.grpc_target, model=MODEL, timeout=30) as client:
        deltas = list(client.chat(HELLO, max_tokens=6, temperature=0, request_id="py-1"))
        assert deltas and deltas[-1].finish_reason in ("stop", "length")
        text = "".join(d.text for d in deltas)
        again = client.complete(["The river", "Cats"], max_tokens=3, temperature=0)
        assert sorted(again.texts) == [0, 1] and again.completion_tokens > 0
        # Greedy: the same request streams the same text again.
        assert text == "".join(d.text for d in client.chat(HELLO, max_tokens=6, temperature=0))
        assert [d.index for d in deltas] == [0] * len(deltas)
        scored = client.score("The river", allowed_token_ids=[40, 41], top_logprobs=2)
        assert {t.token_id for t in scored.choices[0].next.top} == {40, 41}
        vectors = client.embed(["a", "b"])
        assert len(vectors) == 2 and len(vectors[0]) == 64
        assert MODEL in client.list_models()
        assert client.capabilities().features.scoring
        with pytest.raises(MillmError) as caught:
            list(client.chat(HELLO, temperature=5))
        assert (caught.value.code, caught.value.param, caught.value.http_status) == (
            "invalid_parameter", "temperature", 400)


def test_async_client(stack):
    async def go():
        async with AsyncClient(stack.grpc_target, model=MODEL, timeout=30) as client:
            pieces = [d.text async for d in client.chat(HELLO, max_tokens=4)]
            vectors = await client.embed("a")
            with pytest.raises(MillmError) as caught:
                await client.score("x", allowed_token_ids=[10**6])
            return pieces, vectors, caught.value.code

    pieces, vectors, code = asyncio.run(go())
    assert pieces and len(vectors) == 1 and code == "invalid_scoring_request"


@pytest.mark.timeout(600)
def test_installs_alone_without_torch(stack, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                    str(harness.ROOT / "clients" / "python")], check=True, timeout=500)
    script = textwrap.dedent(f"""
        import importlib.util
        from millm.client import Client
        assert importlib.util.find_spec("torch") is None, "torch must not be needed"
        with Client("{stack.grpc_target}", timeout=30) as client:
            text = "".join(d.text for d in client.chat(
                [{{"role": "user", "content": "Hello!"}}], max_tokens=5))
        print("streamed", len(text))
    """)
    done = subprocess.run([str(python), "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("streamed ")
