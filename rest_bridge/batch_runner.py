"""Runs the lines of stored batches (service/batches) through this bridge's
own routes.

Why here: a line is a REST request (a chat completion, a Messages call, …)
and only the bridge translates REST; the engine keeps the batches and hands
out their lines (BatchService.ClaimBatchLines), so any bridge in front of
any replica can run any batch, and what is recorded there
(CompleteBatchLines) is done once. A line is sent through the whole app in
process (its ASGI interface: the same checks, translation and answers as a
client's request over HTTP), as a background request (priority 1 unless the
line asks for a higher value: engines/admission.py keeps a row free for
interactive requests). Its answer, whatever its status, is the line's
result, except a failure of the engine itself (502/503/504: killed,
restarting, draining, busy), which is retried; while the engine is away the
answers wait here and are recorded when it is back. A bridge that dies
loses only unrecorded answers: their lines are claimed again once their
lease ends, and run again.

The runner calls with MILLM_BATCH_API_KEY when the engine has keys: claiming
and recording every owner's lines needs the admin scope, and the lines then
run under that key (the key is never logged).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid

import grpc

from millm.v1 import batch_service_pb2 as pb

log = logging.getLogger("millm.bridge.batches")

LEASE_S = 30.0  # renewed every RENEW_S while the lines run
RENEW_S = 10.0
CLAIM_WAVES = 8  # lines claimed at once: this many times the concurrency (at most 256)
IDLE_S = 1.0  # between claims while nothing is to run
RETRY_S = 1.0  # backoff step after an engine failure
ENGINE_FAILURES = (502, 503, 504)
MAX_ATTEMPTS = 20  # of one line through engine failures, then its answer stands
GENERATING = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


async def post_in_process(app, path: str, body: bytes, key: str | None
                          ) -> tuple[int, bytes, str]:
    """POST `body` to the app's `path` without a socket: (status, body, request id)."""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if key:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0)}
    delivered = False
    never = asyncio.Event()

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the caller never leaves

    status, chunks, request_id = 500, [], ""

    async def send(message):
        nonlocal status, request_id
        if message["type"] == "http.response.start":
            status = message["status"]
            for name, value in message.get("headers", []):
                if name.lower() == b"x-request-id":
                    request_id = value.decode("latin-1")
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    try:
        await app(scope, receive, send)
    except Exception:
        # Starlette answers an unhandled error 500, then raises it again: the
        # line is answered with that 500, and the runner goes on.
        log.exception("batch runner: %s failed inside the bridge", path)
        if not chunks:
            chunks.append(json.dumps({"error": {
                "message": "The bridge failed on this request; see its log.",
                "type": "server_error", "param": None, "code": "internal_error"}}).encode())
    return status, b"".join(chunks), request_id


def line_body(endpoint: str, body: str) -> bytes | str:
    """The request a line sends, or why it cannot be sent (a streamed line)."""
    request = json.loads(body)
    if request.get("stream"):
        return "A batch line cannot stream: its answer is read whole."
    if endpoint in GENERATING:
        priority = request.get("priority")
        if not isinstance(priority, int) or isinstance(priority, bool) or priority < 1:
            request["priority"] = 1
    return json.dumps(request).encode()


def _model_of(body: str) -> str:
    model = json.loads(body).get("model")
    return model if isinstance(model, str) else ""


class BatchRunner:
    def __init__(self, app, engine, concurrency: int):
        self.app, self.engine, self.concurrency = app, engine, concurrency
        self.key = os.environ.get("MILLM_BATCH_API_KEY") or None
        self.runner_id = f"bridge-{uuid.uuid4().hex[:12]}"
        self.metadata = (("authorization", f"Bearer {self.key}"),) if self.key else ()
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        if self.concurrency:
            self.task = asyncio.create_task(self._loop(), name="batch-runner")

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            try:
                reply = await self.engine.batches.ClaimBatchLines(pb.ClaimBatchLinesRequest(
                    runner_id=self.runner_id, lease_s=LEASE_S,
                    max_lines=min(256, self.concurrency * CLAIM_WAVES)),
                    timeout=30, metadata=self.metadata)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
                    log.warning("batch runner: the engine needs an admin key "
                                "(MILLM_BATCH_API_KEY) to run batches")
                    await asyncio.sleep(60)
                await asyncio.sleep(IDLE_S)
                continue
            if not reply.lines:
                await asyncio.sleep(IDLE_S)
                continue
            # Lines of one model together: a batch mixing models switches the
            # engine's model once per group, not once per line.
            groups: dict[str, list[pb.BatchLine]] = {}
            for line in reply.lines:
                groups.setdefault(_model_of(line.body), []).append(line)
            renewing = asyncio.create_task(self._renew(reply.batch_id))
            try:
                for lines in groups.values():
                    # A wave at a time, each recorded when it ends: progress shows as
                    # it is made, and a bridge that dies loses at most one wave.
                    for start in range(0, len(lines), self.concurrency):
                        wave = lines[start:start + self.concurrency]
                        results = await asyncio.gather(*(self._run(line) for line in wave))
                        await self._record(reply.batch_id, results)
            finally:
                renewing.cancel()
                await asyncio.gather(renewing, return_exceptions=True)

    async def _renew(self, batch_id: str) -> None:
        """Keep this runner's claims in the batch live while its lines run."""
        while True:
            await asyncio.sleep(RENEW_S)
            try:
                await self.engine.batches.RenewBatchClaims(pb.RenewBatchClaimsRequest(
                    runner_id=self.runner_id, batch_id=batch_id, lease_s=LEASE_S),
                    timeout=10, metadata=self.metadata)
            except grpc.aio.AioRpcError:
                pass  # the engine is away: the answers wait, and so does the renewal

    async def _run(self, line: pb.BatchLine) -> pb.BatchLineResult:
        endpoint = line.url
        body = line_body(endpoint, line.body)
        if isinstance(body, str):
            error = {"error": {"message": body, "type": "invalid_request_error",
                               "param": "stream", "code": "invalid_parameter"}}
            return pb.BatchLineResult(line=line.line, status_code=400, body=json.dumps(error))
        for attempt in range(1, MAX_ATTEMPTS + 1):
            status, answer, request_id = await post_in_process(self.app, endpoint, body,
                                                               self.key)
            if status not in ENGINE_FAILURES or attempt == MAX_ATTEMPTS:
                break
            await asyncio.sleep(min(RETRY_S * attempt, 10.0))
        return pb.BatchLineResult(line=line.line, status_code=status,
                                  body=answer.decode("utf-8", "replace"),
                                  request_id=request_id)

    async def _record(self, batch_id: str, results: list[pb.BatchLineResult]) -> None:
        attempt = 0
        while True:
            try:
                await self.engine.batches.CompleteBatchLines(pb.CompleteBatchLinesRequest(
                    batch_id=batch_id, results=results), timeout=30, metadata=self.metadata)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in (grpc.StatusCode.UNAVAILABLE,
                                      grpc.StatusCode.DEADLINE_EXCEEDED):
                    log.error("batch runner: recording answers of %s failed: %s", batch_id,
                              exc.code().name)
                    return  # not the engine's absence: the lines run again after their lease
                attempt += 1
                await asyncio.sleep(min(RETRY_S * attempt, 10.0))
