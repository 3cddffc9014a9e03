"""/v1/files and /v1/batches: OpenAI's Files and Batch APIs, stored by the
engine (BatchService, service/batches) and translated here into OpenAI's
objects. The lines of a batch are run by rest_bridge/batch_runner.py."""

from __future__ import annotations

import grpc
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from common.grpc_limits import MAX_FILE_BYTES
from millm.v1 import batch_service_pb2 as pb
from rest_bridge.access import call_metadata
from rest_bridge.engine_client import EngineClient
from rest_bridge.errors import OpenAIError, from_rpc_error

FORM_OVERHEAD = 64 * 1024  # multipart boundaries and the purpose field
_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
          "failed_at", "expired_at", "cancelling_at", "cancelled_at")


def file_object(f: pb.FileObject) -> dict:
    return {"id": f.id, "object": "file", "bytes": f.bytes, "created_at": f.created_at,
            "filename": f.filename, "purpose": f.purpose, "status": "processed",
            "expires_at": None, "status_details": None}


def batch_object(b: pb.BatchObject) -> dict:
    out = {"id": b.id, "object": "batch", "endpoint": b.endpoint, "errors": None,
           "input_file_id": b.input_file_id, "completion_window": b.completion_window,
           "status": b.status, "output_file_id": b.output_file_id or None,
           "error_file_id": b.error_file_id or None,
           "request_counts": {"total": b.total, "completed": b.completed, "failed": b.failed},
           "metadata": dict(b.metadata) or None}
    out.update({t: getattr(b, t) or None for t in _TIMES})
    out["created_at"] = b.created_at
    return out


def _listing(items: list[dict], more: bool) -> dict:
    return {"object": "list", "data": items, "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None, "has_more": more}


def _int(value: str | None, name: str) -> int:
    if value is None:
        return 0
    if not value.isdigit():
        raise OpenAIError(400, f"'{name}' must be a whole number.", param=name,
                          code="invalid_parameter")
    return int(value)


class FilesHandler:
    def __init__(self, engine: EngineClient):
        self.engine = engine

    async def _call(self, method: str, message, http_request: Request):
        try:
            return await getattr(self.engine.batches, method)(
                message, timeout=http_request.app.state.config.engine_deadline_max_s,
                metadata=call_metadata.get())
        except grpc.aio.AioRpcError as exc:
            raise from_rpc_error(exc) from None

    # -- files --------------------------------------------------------------------------------

    async def upload(self, http_request: Request):
        declared = http_request.headers.get("content-length")
        if declared is not None and declared.isdigit() and \
                int(declared) > MAX_FILE_BYTES + FORM_OVERHEAD:
            raise OpenAIError(413, f"A file may hold at most {MAX_FILE_BYTES} bytes.",
                              param="file", code="file_too_large")
        try:
            form = await http_request.form(max_files=1, max_fields=8)
        except Exception:  # a body that is no multipart form (the parser's own errors)
            raise OpenAIError(400, "The upload must be a multipart form with 'file' and "
                              "'purpose'.", param="file", code="invalid_parameter") from None
        try:
            upload, purpose = form.get("file"), form.get("purpose")
            if upload is None or isinstance(upload, str):
                raise OpenAIError(400, "The form needs 'file': the file to upload.",
                                  param="file", code="invalid_parameter")
            if not isinstance(purpose, str):
                raise OpenAIError(400, "The form needs 'purpose' (for a batch: 'batch').",
                                  param="purpose", code="invalid_parameter")
            content = await upload.read(MAX_FILE_BYTES + 1)
            if len(content) > MAX_FILE_BYTES:
                raise OpenAIError(413, f"A file may hold at most {MAX_FILE_BYTES} bytes.",
                                  param="file", code="file_too_large")
            reply = await self._call("CreateFile", pb.CreateFileRequest(
                purpose=purpose, filename=upload.filename or "upload", content=content),
                http_request)
        finally:
            await form.close()
        return JSONResponse(file_object(reply.file))

    async def list_files(self, http_request: Request):
        q = http_request.query_params
        reply = await self._call("ListFiles", pb.ListFilesRequest(
            purpose=q.get("purpose", ""), limit=_int(q.get("limit"), "limit"),
            after=q.get("after", "")), http_request)
        items = [file_object(f) for f in reply.files]
        if q.get("order") == "asc":
            items.reverse()
        return JSONResponse(_listing(items, reply.has_more))

    async def get_file(self, file_id: str, http_request: Request):
        reply = await self._call("GetFile", pb.GetFileRequest(file_id=file_id), http_request)
        return JSONResponse(file_object(reply.file))

    async def content(self, file_id: str, http_request: Request):
        reply = await self._call("GetFileContent", pb.GetFileContentRequest(file_id=file_id),
                                 http_request)
        return Response(reply.content, media_type="application/octet-stream")

    async def delete_file(self, file_id: str, http_request: Request):
        await self._call("DeleteFile", pb.DeleteFileRequest(file_id=file_id), http_request)
        return JSONResponse({"id": file_id, "object": "file", "deleted": True})

    # -- batches ------------------------------------------------------------------------------

    async def create_batch(self, body, http_request: Request):
        reply = await self._call("CreateBatch", pb.CreateBatchRequest(
            input_file_id=body.input_file_id, endpoint=body.endpoint,
            completion_window=body.completion_window, metadata=body.metadata or {}),
            http_request)
        return JSONResponse(batch_object(reply.batch))

    async def list_batches(self, http_request: Request):
        q = http_request.query_params
        reply = await self._call("ListBatches", pb.ListBatchesRequest(
            limit=_int(q.get("limit"), "limit"), after=q.get("after", "")), http_request)
        return JSONResponse(_listing([batch_object(b) for b in reply.batches], reply.has_more))

    async def get_batch(self, batch_id: str, http_request: Request):
        reply = await self._call("GetBatch", pb.GetBatchRequest(batch_id=batch_id),
                                 http_request)
        return JSONResponse(batch_object(reply.batch))

    async def cancel_batch(self, batch_id: str, http_request: Request):
        reply = await self._call("CancelBatch", pb.CancelBatchRequest(batch_id=batch_id),
                                 http_request)
        return JSONResponse(batch_object(reply.batch))
