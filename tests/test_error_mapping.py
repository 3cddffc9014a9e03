"""The bridge's one table from engine statuses to HTTP, fed real engine statuses."""

from __future__ import annotations

import grpc
import pytest

from rest_bridge.errors import from_rpc_error
from service import errors as engine_errors


def as_rpc_error(error: engine_errors.EngineError) -> grpc.aio.AioRpcError:
    status = error.to_status()
    return grpc.aio.AioRpcError(status.code, grpc.aio.Metadata(),
                                grpc.aio.Metadata(*status.trailing_metadata), status.details)


@pytest.mark.parametrize(
    ("error", "http", "type_"),
    [
        (engine_errors.invalid_parameter("top_p", "bad top_p"), 400, "invalid_request_error"),
        (engine_errors.model_not_found("x"), 404, "invalid_request_error"),
        (engine_errors.model_not_loaded("loading"), 503, "server_error"),
        (engine_errors.context_length_exceeded("messages", "too long"), 400,
         "invalid_request_error"),
        (engine_errors.internal_error(), 500, "server_error"),
        (engine_errors.queue_full(4), 503, "server_error"),
        (engine_errors.field_not_honoured("tools", "no tools"), 400, "invalid_request_error"),
        (engine_errors.EngineError("constrained_output_invalid", "bad json"), 500,
         "server_error"),
        (engine_errors.EngineError("profile_not_found", "no such profile", "profile"), 404,
         "invalid_request_error"),
    ],
)
def test_engine_errors_map_to_openai_envelopes(error, http, type_):
    mapped = from_rpc_error(as_rpc_error(error))
    assert mapped.status == http
    body = mapped.body()["error"]
    assert body == {"message": error.message, "type": type_, "param": error.param,
                    "code": error.code}
    assert ("Retry-After" in mapped.headers) == (http == 503)


@pytest.mark.parametrize("code", sorted(engine_errors.ERROR_CODES))
def test_every_code_in_the_table_reaches_http_as_listed(code):
    entry = engine_errors.ERROR_CODES[code]
    mapped = from_rpc_error(as_rpc_error(engine_errors.EngineError(code, "m", "p")))
    assert (mapped.status, mapped.code, mapped.type) == (entry.http_status, code, entry.type)


def test_unknown_code_is_a_programming_error():
    with pytest.raises(ValueError):
        engine_errors.EngineError("no_such_code", "m")


def test_status_without_error_info():
    bare = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(),
                                grpc.aio.Metadata(), "connection refused")
    mapped = from_rpc_error(bare)
    assert (mapped.status, mapped.code) == (503, "engine_unavailable")
    assert "connection refused" not in mapped.message


def test_the_documented_error_table_is_the_engine_table():
    import pathlib
    import re

    doc = (pathlib.Path(__file__).parent.parent / "docs" / "request-validation.md").read_text()
    table = doc.split("## Error codes", 1)[1].split("The bridge adds", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (\d{3}) \| (\w+) \|", table, flags=re.M)
    assert {code: (int(http), status) for code, http, status in rows} == {
        code: (e.http_status, e.status.name) for code, e in engine_errors.ERROR_CODES.items()}
