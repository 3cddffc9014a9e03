"""millm.v1.BatchService: files and batches (service/batches).

The caller's key (servicers/access.py) decides ownership, as for stored
responses: what a key creates is its own, another key's reads and deletes
answer not found, and an admin key (or an engine without keys) sees all.
The runner's RPCs (ClaimBatchLines, RenewBatchClaims, CompleteBatchLines)
hand out and record every owner's lines, so they need the admin scope
(access.ADMIN_METHODS). Database calls run off the event loop.
"""

from __future__ import annotations

import asyncio

from common import api_keys
from millm.v1 import batch_service_pb2 as pb
from millm.v1 import batch_service_pb2_grpc
from service.batches.batches import Batch, BatchStore
from service.batches.files import FileStore, StoredFile
from service.servicers import access
from service.servicers.error_handling import unary_errors

_TIMES = ("created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at",
          "failed_at", "expired_at", "cancelling_at", "cancelled_at")


def _reader() -> str | None:
    key = access.caller.get()
    return None if key is None or key.allows(api_keys.ADMIN) else key.name


def _owner() -> str:
    key = access.caller.get()
    return key.name if key is not None else ""


def file_pb(f: StoredFile) -> pb.FileObject:
    return pb.FileObject(id=f.id, bytes=f.bytes, created_at=f.created_at, filename=f.filename,
                         purpose=f.purpose)


def batch_pb(b: Batch) -> pb.BatchObject:
    d = b.doc
    return pb.BatchObject(
        id=b.id, endpoint=d["endpoint"], input_file_id=d["input_file_id"],
        completion_window=d["completion_window"], status=b.status,
        output_file_id=d.get("output_file_id", ""), error_file_id=d.get("error_file_id", ""),
        total=d["total"], completed=d["completed"], failed=d["failed"],
        metadata=d.get("metadata", {}), **{t: int(d.get(t, 0)) for t in _TIMES})


class BatchServicer(batch_service_pb2_grpc.BatchServiceServicer):
    def __init__(self, files: FileStore, batches: BatchStore):
        self._files, self._batches = files, batches

    @unary_errors
    async def CreateFile(self, request, context):
        stored = await asyncio.to_thread(self._files.create, _owner(), request.purpose,
                                         request.filename, request.content)
        return pb.CreateFileResponse(file=file_pb(stored))

    @unary_errors
    async def GetFile(self, request, context):
        stored = await asyncio.to_thread(self._files.get, request.file_id, _reader())
        return pb.GetFileResponse(file=file_pb(stored))

    @unary_errors
    async def ListFiles(self, request, context):
        found, more = await asyncio.to_thread(self._files.list, _reader(), request.purpose,
                                              request.limit, request.after)
        return pb.ListFilesResponse(files=[file_pb(f) for f in found], has_more=more)

    @unary_errors
    async def GetFileContent(self, request, context):
        text = await asyncio.to_thread(self._files.content, request.file_id, _reader())
        return pb.GetFileContentResponse(content=text.encode())

    @unary_errors
    async def DeleteFile(self, request, context):
        await asyncio.to_thread(self._files.delete, request.file_id, _reader())
        return pb.DeleteFileResponse(file_id=request.file_id)

    @unary_errors
    async def CreateBatch(self, request, context):
        batch = await asyncio.to_thread(self._batches.create, _owner(), request.input_file_id,
                                        request.endpoint, request.completion_window,
                                        dict(request.metadata))
        return pb.CreateBatchResponse(batch=batch_pb(batch))

    @unary_errors
    async def GetBatch(self, request, context):
        batch = await asyncio.to_thread(self._batches.get, request.batch_id, _reader())
        return pb.GetBatchResponse(batch=batch_pb(batch))

    @unary_errors
    async def ListBatches(self, request, context):
        found, more = await asyncio.to_thread(self._batches.list, _reader(), request.limit,
                                              request.after)
        return pb.ListBatchesResponse(batches=[batch_pb(b) for b in found], has_more=more)

    @unary_errors
    async def CancelBatch(self, request, context):
        batch = await asyncio.to_thread(self._batches.cancel, request.batch_id, _reader())
        return pb.CancelBatchResponse(batch=batch_pb(batch))

    @unary_errors
    async def ClaimBatchLines(self, request, context):
        batch, lines = await asyncio.to_thread(self._batches.claim, request.runner_id,
                                               request.max_lines, request.lease_s)
        if batch is None:
            return pb.ClaimBatchLinesResponse()
        return pb.ClaimBatchLinesResponse(
            batch_id=batch.id, endpoint=batch.doc["endpoint"],
            lines=[pb.BatchLine(line=ln.index, custom_id=ln.custom_id, body=ln.body, url=ln.url)
                   for ln in lines])

    @unary_errors
    async def RenewBatchClaims(self, request, context):
        renewed = await asyncio.to_thread(self._batches.renew, request.runner_id,
                                          request.batch_id, request.lease_s)
        return pb.RenewBatchClaimsResponse(renewed=renewed)

    @unary_errors
    async def CompleteBatchLines(self, request, context):
        recorded = await asyncio.to_thread(
            self._batches.complete, request.batch_id,
            [(r.line, r.status_code, r.body, r.request_id) for r in request.results])
        return pb.CompleteBatchLinesResponse(recorded=recorded)
