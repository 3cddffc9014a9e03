"""API keys, scopes, rate limits, metrics, request ids and logs, on an engine
and a bridge started with keys configured."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request

import grpc
import pytest

from common import api_keys
from millm.v1 import (
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
    scoring_service_pb2,
    scoring_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    steering_service_pb2,
    steering_service_pb2_grpc,
    tokenization_service_pb2,
    tokenization_service_pb2_grpc,
)
from rest_bridge.engine_mux import Mux
from service.rate_limit import TokenBucket
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import chat_request, error_info, prompt_request
from tests.http_helpers import post

INFERENCE_KEY = "inf-0123456789abcdef-secret"
ADMIN_KEY = "adm-0123456789abcdef-secret"
LIMITED_KEY = "lim-0123456789abcdef-secret"
WRONG_KEY = "nope-0123456789abcdef-secret"
KEYS = json.dumps({"keys": [
    {"name": "svc", "scopes": ["inference"], "key": INFERENCE_KEY},
    {"name": "ops", "scopes": ["admin"], "sha256": api_keys.digest(ADMIN_KEY).hex()},
    {"name": "tight", "scopes": ["inference"], "key": LIMITED_KEY, "requests_per_minute": 12},
]})
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 3}


class KeyedStack(harness.OwnStack):
    def __init__(self, tmp):
        super().__init__(tmp, {"MILLM_API_KEYS": KEYS, "MILLM_LOG_LEVEL": "INFO"},
                         MILLM_API_KEYS=KEYS, MILLM_METRICS_PORT=str(harness.free_port()))
        found = re.search(r"metrics on http://127.0.0.1:(\d+)/metrics", self.engine.log())
        self.metrics_port = int(found.group(1))
        self.channel = grpc.insecure_channel(self.grpc_target)

    def stop(self):
        self.channel.close()
        super().stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    stack = KeyedStack(tmp_path_factory.mktemp("keyed"))
    yield stack
    stack.stop()


def auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


def grpc_auth(key: str | None):
    return (("authorization", f"Bearer {key}"),) if key else ()


def http(port: int, method: str, path: str, body=None, headers=None):
    if method == "POST":
        reply, content = post(port, path, body if body is not None else {}, headers=headers)
        return reply.status, content
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# -- the auth matrix -----------------------------------------------------------------------

NONE, WRONG, INF, ADMIN = None, WRONG_KEY, INFERENCE_KEY, ADMIN_KEY
MATRIX = [
    # (target, {key: expected HTTP status or gRPC code name})
    ("POST /v1/chat/completions", {NONE: 401, WRONG: 401, INF: 200, ADMIN: 200}),
    ("POST /v1/chat/completions stream", {NONE: 401, WRONG: 401, INF: 200, ADMIN: 200}),
    ("GET /v1/models", {NONE: 401, WRONG: 401, INF: 200, ADMIN: 200}),
    ("POST /api/prefix-cache/clear", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("GET /api/health/inference", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("GET /metrics", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("GET /api/models", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    # Loading the model already loaded changes nothing, so the matrix can run it.
    ("POST /api/models/millm-tiny/load", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("GET /healthz", {NONE: 200, WRONG: 200, INF: 200, ADMIN: 200}),
    ("GET /readyz", {NONE: 200, WRONG: 200, INF: 200, ADMIN: 200}),
    ("grpc Generate", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED", INF: "OK",
                       ADMIN: "OK"}),
    ("grpc Score", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED", INF: "OK", ADMIN: "OK"}),
    # The tokenizer is part of inference, as /v1 is.
    ("POST /tokenize", {NONE: 401, WRONG: 401, INF: 200, ADMIN: 200}),
    ("POST /detokenize", {NONE: 401, WRONG: 401, INF: 200, ADMIN: 200}),
    ("grpc Tokenize", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED", INF: "OK",
                       ADMIN: "OK"}),
    ("grpc ClearPrefixCache", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED",
                               INF: "PERMISSION_DENIED", ADMIN: "OK"}),
    # Inference keys may read steering over gRPC but never change it.
    ("grpc GetSteering", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED", INF: "OK",
                          ADMIN: "OK"}),
    ("grpc SetSteering", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED",
                          INF: "PERMISSION_DENIED", ADMIN: "OK"}),
    ("GET /api/steering", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("PUT /api/steering", {NONE: 401, WRONG: 401, INF: 403, ADMIN: 200}),
    ("grpc LoadModel", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED",
                        INF: "PERMISSION_DENIED", ADMIN: "OK"}),
    # The admin cell unloads the model the matrix uses: it runs last of the row,
    # and the next request names the model and loads it again.
    ("grpc UnloadModel", {NONE: "UNAUTHENTICATED", WRONG: "UNAUTHENTICATED",
                          INF: "PERMISSION_DENIED", ADMIN: "OK"}),
]
CELLS = [(target, key, expected) for target, row in MATRIX for key, expected in row.items()]


def _call(keyed, target: str, key: str | None):
    if target.startswith("grpc "):
        rpc = target.split()[1]
        try:
            if rpc == "Generate":
                stub = generation_service_pb2_grpc.GenerationServiceStub(keyed.channel)
                list(stub.Generate(chat_request(max_tokens=2), metadata=grpc_auth(key),
                                   timeout=30))
            elif rpc == "Score":
                stub = scoring_service_pb2_grpc.ScoringServiceStub(keyed.channel)
                request = scoring_service_pb2.ScoreRequest(
                    model=MODEL, prompt=prompt_request("The").prompt, top_logprobs=1)
                stub.Score(request, metadata=grpc_auth(key), timeout=30)
            elif rpc == "Tokenize":
                stub = tokenization_service_pb2_grpc.TokenizationServiceStub(keyed.channel)
                stub.Tokenize(tokenization_service_pb2.TokenizeRequest(model=MODEL, prompt="x"),
                              metadata=grpc_auth(key), timeout=30)
            elif rpc in ("GetSteering", "SetSteering"):
                stub = steering_service_pb2_grpc.SteeringServiceStub(keyed.channel)
                request = (steering_service_pb2.GetSteeringRequest() if rpc == "GetSteering"
                           else steering_service_pb2.SetSteeringRequest(enabled=True))
                getattr(stub, rpc)(request, metadata=grpc_auth(key), timeout=30)
            elif rpc in ("LoadModel", "UnloadModel"):
                stub = model_service_pb2_grpc.ModelServiceStub(keyed.channel)
                request_type = getattr(model_service_pb2, f"{rpc}Request")
                getattr(stub, rpc)(request_type(id=MODEL), metadata=grpc_auth(key), timeout=60)
            else:
                stub = server_service_pb2_grpc.ServerServiceStub(keyed.channel)
                stub.ClearPrefixCache(server_service_pb2.ClearPrefixCacheRequest(),
                                      metadata=grpc_auth(key), timeout=30)
        except grpc.RpcError as exc:
            return exc.code().name, exc
        return "OK", None
    method, path, *stream = target.split()
    body = ({**CHAT, "stream": True} if stream else CHAT if path.startswith("/v1/chat")
            else {"enabled": True} if method == "PUT"
            else {"model": MODEL, "prompt": "x"} if path == "/tokenize"
            else {"model": MODEL, "tokens": [5]} if path == "/detokenize" else None)
    status, content = http(keyed.http_port, method, path, body, auth(key))
    return status, content


KEY_NAMES = {NONE: "none", WRONG: "wrong", INF: "inference", ADMIN: "admin"}


@pytest.mark.parametrize(("target", "key", "expected"), CELLS,
                         ids=[f"{t}-{KEY_NAMES[k]}" for t, k, _ in CELLS])
def test_auth_matrix(keyed, target, key, expected):
    got, detail = _call(keyed, target, key)
    assert got == expected, detail
    if isinstance(expected, int) and expected in (401, 403):
        error = json.loads(detail)["error"]
        assert error["code"] == ("invalid_api_key" if expected == 401 else "permission_error")
    if expected in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        info = error_info(detail)
        assert info.reason == ("invalid_api_key" if expected == "UNAUTHENTICATED"
                               else "permission_error")
    if target.endswith("stream") and expected == 200:
        assert detail.endswith(b"data: [DONE]\n\n")


def test_x_api_key_header(keyed):
    status, _ = http(keyed.http_port, "POST", "/v1/chat/completions", CHAT,
                     {"X-API-Key": INFERENCE_KEY})
    assert status == 200


# -- rate limits -------------------------------------------------------------------------------


def test_anthropic_clients_keys_and_envelope(keyed):
    """Anthropic's SDKs send the key as x-api-key: the same keys and scopes
    hold, and refusals come in Anthropic's envelope with its error types."""
    message = {"model": MODEL, "max_tokens": 2,
               "messages": [{"role": "user", "content": "Hello!"}]}
    for headers in ({"x-api-key": INFERENCE_KEY, "anthropic-version": "2023-06-01"},
                    {"Authorization": f"Bearer {INFERENCE_KEY}"}):
        reply, content = post(keyed.http_port, "/v1/messages", message, headers)
        assert reply.status == 200, content
    for headers in ({}, {"x-api-key": WRONG_KEY}):
        reply, content = post(keyed.http_port, "/v1/messages", message, headers)
        assert reply.status == 401
        assert json.loads(content)["error"]["type"] == "authentication_error", content
    # An inference key on a management route, asked by an Anthropic client.
    status, content = http(keyed.http_port, "GET", "/api/models", None,
                           {"x-api-key": INFERENCE_KEY, "anthropic-version": "2023-06-01"})
    body = json.loads(content)
    assert status == 403 and body["type"] == "error"
    assert body["error"]["type"] == "permission_error"


def test_rate_limit_answers_429_then_recovers(keyed):
    # 12 a minute refills one token every 5 s: the burst below and the refused
    # chat right after it take a small part of that even on a loaded machine
    # (at 120 a minute a refill every half second raced them).
    statuses, last = [], None
    for _ in range(40):
        status, content = http(keyed.http_port, "GET", "/v1/models", None, auth(LIMITED_KEY))
        statuses.append(status)
        if status == 429:
            last = content
            break
    assert statuses[-1] == 429 and set(statuses[:-1]) == {200} and len(statuses) >= 13
    assert json.loads(last)["error"]["code"] == "rate_limit_exceeded"
    reply, _ = post(keyed.http_port, "/v1/chat/completions", CHAT, headers=auth(LIMITED_KEY))
    assert reply.status == 429
    assert int(reply.getheader("Retry-After")) >= 1
    assert reply.getheader("x-ratelimit-limit-requests") == "12"
    assert reply.getheader("x-ratelimit-remaining-requests") == "0"
    assert reply.getheader("x-ratelimit-reset-requests").endswith("s")
    time.sleep(5.2)  # one token back
    status, _ = http(keyed.http_port, "GET", "/v1/models", None, auth(LIMITED_KEY))
    assert status == 200
    # Other keys are untouched.
    assert http(keyed.http_port, "GET", "/v1/models", None, auth(INFERENCE_KEY))[0] == 200


def test_token_bucket():
    now = [0.0]
    bucket = TokenBucket(60, clock=lambda: now[0])
    assert all(bucket.take().allowed for _ in range(60))
    refused = bucket.take()
    assert not refused.allowed and 0.99 < refused.retry_after_s <= 1.0
    now[0] += 1.0
    assert bucket.take().allowed and not bucket.take().allowed


# -- metrics, request ids, logs ----------------------------------------------------------------


def _scrape(url: str, key: str) -> str:
    req = urllib.request.Request(url, headers=auth(key))
    with urllib.request.urlopen(req, timeout=10) as reply:
        return reply.read().decode()


def _value(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_metrics_move_by_the_requests_made(keyed):
    bridge_url = f"http://127.0.0.1:{keyed.http_port}/metrics"
    engine_url = f"http://127.0.0.1:{keyed.metrics_port}/metrics"
    before_b, before_e = _scrape(bridge_url, ADMIN_KEY), _scrape(engine_url, ADMIN_KEY)
    reply, content = post(keyed.http_port, "/v1/chat/completions", {**CHAT, "max_tokens": 5},
                          headers=auth(INFERENCE_KEY))
    produced = json.loads(content)["usage"]["completion_tokens"]
    post(keyed.http_port, "/v1/chat/completions", {**CHAT, "temperature": 9},
         headers=auth(INFERENCE_KEY))
    after_b, after_e = _scrape(bridge_url, ADMIN_KEY), _scrape(engine_url, ADMIN_KEY)
    route = dict(route="/v1/chat/completions")
    assert _value(after_b, "millm_bridge_requests_total", status="200", **route) - _value(
        before_b, "millm_bridge_requests_total", status="200", **route) == 1
    assert _value(after_b, "millm_bridge_requests_total", status="400",
                  code="invalid_parameter", **route) - _value(
        before_b, "millm_bridge_requests_total", status="400", code="invalid_parameter",
        **route) == 1
    generate = dict(method="/millm.v1.GenerationService/Generate")
    assert _value(after_e, "millm_engine_rpcs_total", code="OK", **generate) - _value(
        before_e, "millm_engine_rpcs_total", code="OK", **generate) == 1
    assert _value(after_e, "millm_engine_generated_tokens_total") - _value(
        before_e, "millm_engine_generated_tokens_total") == produced
    assert _value(after_e, "millm_engine_model_loaded", model=MODEL) == 1
    assert "millm_bridge_request_duration_seconds_bucket" in after_b
    assert "millm_engine_running_rows" in after_e
    # Behind the admin key like the bridge's.
    with pytest.raises(urllib.error.HTTPError) as refused:
        _scrape(engine_url, INFERENCE_KEY)
    assert refused.value.code == 403


def test_request_ids_reach_both_logs_and_keys_never_do(keyed):
    reply, _ = post(keyed.http_port, "/v1/chat/completions", CHAT,
                    headers={**auth(INFERENCE_KEY), "X-Request-Id": "trace.42:a-b_c"})
    assert reply.getheader("X-Request-Id") == "trace.42:a-b_c"
    bad, _ = post(keyed.http_port, "/v1/chat/completions", CHAT,
                  headers={**auth(INFERENCE_KEY), "X-Request-Id": "no spaces allowed"})
    assert re.fullmatch(r"[0-9a-f]{32}", bad.getheader("X-Request-Id"))
    time.sleep(0.3)
    bridge_lines = [json.loads(line.split("millm.access: ", 1)[1])
                    for line in keyed.bridge.log().splitlines() if "millm.access: " in line]
    engine_lines = [json.loads(line.split("millm.access: ", 1)[1])
                    for line in keyed.engine.log().splitlines() if "millm.access: " in line]
    mine = [e for e in bridge_lines if e["request_id"] == "trace.42:a-b_c"]
    assert len(mine) == 1 and mine[0]["status"] == 200 and mine[0]["path"] == \
        "/v1/chat/completions"
    assert mine[0]["client"] == api_keys.fingerprint(api_keys.digest(INFERENCE_KEY))
    assert any(e["request_id"] == "trace.42:a-b_c" and e["method"].endswith("/Generate")
               for e in engine_lines)
    # Successful probes are not logged.
    http(keyed.http_port, "GET", "/healthz")
    assert not any(e["path"] == "/healthz" for e in bridge_lines)
    for log in (keyed.bridge.log(), keyed.engine.log()):
        for key in (INFERENCE_KEY, ADMIN_KEY, LIMITED_KEY, WRONG_KEY):
            assert key not in log


def test_each_call_on_one_generate_many_stream_is_checked_with_its_own_key(keyed):
    """The stream needs no key; every call started on it meets the rules a
    Generate call with that metadata meets, and is logged as one."""
    async def run():
        async with grpc.aio.insecure_channel(keyed.grpc_target) as channel:
            mux = Mux(channel)
            try:
                outcomes = []
                for key in (None, WRONG_KEY, INFERENCE_KEY):
                    metadata = (("x-request-id", f"mux-{key is not None}"),)
                    if key is not None:
                        metadata = (("authorization", f"Bearer {key}"), *metadata)
                    call = mux.start(chat_request(max_tokens=2), metadata, 60, None)
                    try:
                        while await call.read() is not grpc.aio.EOF:
                            pass
                        outcomes.append("OK")
                    except grpc.aio.AioRpcError as exc:
                        outcomes.append((exc.code().name, error_info(exc).reason))
                return outcomes
            finally:
                await mux.close()

    assert asyncio.run(run()) == [("UNAUTHENTICATED", "invalid_api_key"),
                                  ("UNAUTHENTICATED", "invalid_api_key"), "OK"]
    time.sleep(0.3)
    engine_lines = [json.loads(line.split("millm.access: ", 1)[1])
                    for line in keyed.engine.log().splitlines() if "millm.access: " in line]
    ok = [e for e in engine_lines if e["request_id"] == "mux-True"]
    assert [e["code"] for e in ok] == ["UNAUTHENTICATED", "OK"]
    assert all(e["method"] == "/millm.v1.GenerationService/Generate" for e in ok)
    assert ok[1]["client"] == api_keys.fingerprint(api_keys.digest(INFERENCE_KEY))


# -- startup refusals ------------------------------------------------------------------------------


def test_no_keys_beyond_loopback_is_refused_unless_asked(tmp_path):
    # Both processes refuse before they bind anything; no test listens beyond
    # loopback, so the opt-in is checked on the rule itself.
    refused, _ = harness.start_bridge(tmp_path, 1, MILLM_HOST="0.0.0.0")
    assert refused.proc.wait(timeout=30) == 2
    assert "refusing to listen on 0.0.0.0 without API keys" in refused.log()
    engine, _ = harness.start_engine(tmp_path, MILLM_HOST="0.0.0.0")
    assert engine.proc.wait(timeout=30) == 2
    warning = api_keys.check_exposure(None, "0.0.0.0", {"MILLM_ALLOW_UNAUTHENTICATED": "1"})
    assert "with no API keys (MILLM_ALLOW_UNAUTHENTICATED=1)" in warning
    assert api_keys.check_exposure(None, "127.0.0.1", {}) is None
    with pytest.raises(api_keys.KeyConfigError):
        api_keys.check_exposure(None, "::", {})


def test_key_configuration_errors():
    with pytest.raises(api_keys.KeyConfigError):
        api_keys.from_env({"MILLM_API_KEYS": '{"keys": [{"name": "a", "scopes": ["root"], '
                                             '"key": "0123456789abcdef"}]}'})
    with pytest.raises(api_keys.KeyConfigError):
        api_keys.from_env({"MILLM_API_KEYS": '{"keys": [{"name": "a", "scopes": ["admin"], '
                                             '"key": "short"}]}'})
    ring = api_keys.from_env({"MILLM_API_KEYS": KEYS})
    assert ring.identify(ADMIN_KEY).name == "ops" and ring.identify(ADMIN_KEY).allows("inference")
    assert ring.identify(INFERENCE_KEY).allows("admin") is False
    assert ring.identify(WRONG_KEY) is None and ring.identify("") is None
