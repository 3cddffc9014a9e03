from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FileObject(_message.Message):
    __slots__ = ("id", "bytes", "created_at", "filename", "purpose")
    ID_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    def __init__(self, id: _Optional[str] = ..., bytes: _Optional[int] = ..., created_at: _Optional[int] = ..., filename: _Optional[str] = ..., purpose: _Optional[str] = ...) -> None: ...

class CreateFileRequest(_message.Message):
    __slots__ = ("purpose", "filename", "content")
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    purpose: str
    filename: str
    content: bytes
    def __init__(self, purpose: _Optional[str] = ..., filename: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class CreateFileResponse(_message.Message):
    __slots__ = ("file",)
    FILE_FIELD_NUMBER: _ClassVar[int]
    file: FileObject
    def __init__(self, file: _Optional[_Union[FileObject, _Mapping]] = ...) -> None: ...

class GetFileRequest(_message.Message):
    __slots__ = ("file_id",)
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    def __init__(self, file_id: _Optional[str] = ...) -> None: ...

class GetFileResponse(_message.Message):
    __slots__ = ("file",)
    FILE_FIELD_NUMBER: _ClassVar[int]
    file: FileObject
    def __init__(self, file: _Optional[_Union[FileObject, _Mapping]] = ...) -> None: ...

class ListFilesRequest(_message.Message):
    __slots__ = ("purpose", "limit", "after")
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    purpose: str
    limit: int
    after: str
    def __init__(self, purpose: _Optional[str] = ..., limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ListFilesResponse(_message.Message):
    __slots__ = ("files", "has_more")
    FILES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    files: _containers.RepeatedCompositeFieldContainer[FileObject]
    has_more: bool
    def __init__(self, files: _Optional[_Iterable[_Union[FileObject, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class GetFileContentRequest(_message.Message):
    __slots__ = ("file_id",)
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    def __init__(self, file_id: _Optional[str] = ...) -> None: ...

class GetFileContentResponse(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: bytes
    def __init__(self, content: _Optional[bytes] = ...) -> None: ...

class DeleteFileRequest(_message.Message):
    __slots__ = ("file_id",)
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    def __init__(self, file_id: _Optional[str] = ...) -> None: ...

class DeleteFileResponse(_message.Message):
    __slots__ = ("file_id",)
    FILE_ID_FIELD_NUMBER: _ClassVar[int]
    file_id: str
    def __init__(self, file_id: _Optional[str] = ...) -> None: ...

class BatchObject(_message.Message):
    __slots__ = ("id", "endpoint", "input_file_id", "completion_window", "status", "output_file_id", "error_file_id", "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at", "total", "completed", "failed", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    INPUT_FILE_ID_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_WINDOW_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FILE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FILE_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    IN_PROGRESS_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    FINALIZING_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    FAILED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLING_AT_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_AT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str
    error_file_id: str
    created_at: int
    in_progress_at: int
    expires_at: int
    finalizing_at: int
    completed_at: int
    failed_at: int
    expired_at: int
    cancelling_at: int
    cancelled_at: int
    total: int
    completed: int
    failed: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, id: _Optional[str] = ..., endpoint: _Optional[str] = ..., input_file_id: _Optional[str] = ..., completion_window: _Optional[str] = ..., status: _Optional[str] = ..., output_file_id: _Optional[str] = ..., error_file_id: _Optional[str] = ..., created_at: _Optional[int] = ..., in_progress_at: _Optional[int] = ..., expires_at: _Optional[int] = ..., finalizing_at: _Optional[int] = ..., completed_at: _Optional[int] = ..., failed_at: _Optional[int] = ..., expired_at: _Optional[int] = ..., cancelling_at: _Optional[int] = ..., cancelled_at: _Optional[int] = ..., total: _Optional[int] = ..., completed: _Optional[int] = ..., failed: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateBatchRequest(_message.Message):
    __slots__ = ("input_file_id", "endpoint", "completion_window", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    INPUT_FILE_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_WINDOW_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, input_file_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., completion_window: _Optional[str] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class CreateBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: BatchObject
    def __init__(self, batch: _Optional[_Union[BatchObject, _Mapping]] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    def __init__(self, batch_id: _Optional[str] = ...) -> None: ...

class GetBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: BatchObject
    def __init__(self, batch: _Optional[_Union[BatchObject, _Mapping]] = ...) -> None: ...

class ListBatchesRequest(_message.Message):
    __slots__ = ("limit", "after")
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    limit: int
    after: str
    def __init__(self, limit: _Optional[int] = ..., after: _Optional[str] = ...) -> None: ...

class ListBatchesResponse(_message.Message):
    __slots__ = ("batches", "has_more")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    HAS_MORE_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[BatchObject]
    has_more: bool
    def __init__(self, batches: _Optional[_Iterable[_Union[BatchObject, _Mapping]]] = ..., has_more: _Optional[bool] = ...) -> None: ...

class CancelBatchRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    def __init__(self, batch_id: _Optional[str] = ...) -> None: ...

class CancelBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: BatchObject
    def __init__(self, batch: _Optional[_Union[BatchObject, _Mapping]] = ...) -> None: ...

class ClaimBatchLinesRequest(_message.Message):
    __slots__ = ("runner_id", "max_lines", "lease_s")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_LINES_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    max_lines: int
    lease_s: float
    def __init__(self, runner_id: _Optional[str] = ..., max_lines: _Optional[int] = ..., lease_s: _Optional[float] = ...) -> None: ...

class ClaimBatchLinesResponse(_message.Message):
    __slots__ = ("batch_id", "endpoint", "lines")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    endpoint: str
    lines: _containers.RepeatedCompositeFieldContainer[BatchLine]
    def __init__(self, batch_id: _Optional[str] = ..., endpoint: _Optional[str] = ..., lines: _Optional[_Iterable[_Union[BatchLine, _Mapping]]] = ...) -> None: ...

class BatchLine(_message.Message):
    __slots__ = ("line", "custom_id", "body", "url")
    LINE_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    line: int
    custom_id: str
    body: str
    url: str
    def __init__(self, line: _Optional[int] = ..., custom_id: _Optional[str] = ..., body: _Optional[str] = ..., url: _Optional[str] = ...) -> None: ...

class RenewBatchClaimsRequest(_message.Message):
    __slots__ = ("runner_id", "batch_id", "lease_s")
    RUNNER_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_S_FIELD_NUMBER: _ClassVar[int]
    runner_id: str
    batch_id: str
    lease_s: float
    def __init__(self, runner_id: _Optional[str] = ..., batch_id: _Optional[str] = ..., lease_s: _Optional[float] = ...) -> None: ...

class RenewBatchClaimsResponse(_message.Message):
    __slots__ = ("renewed",)
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    renewed: int
    def __init__(self, renewed: _Optional[int] = ...) -> None: ...

class CompleteBatchLinesRequest(_message.Message):
    __slots__ = ("batch_id", "results")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: str
    results: _containers.RepeatedCompositeFieldContainer[BatchLineResult]
    def __init__(self, batch_id: _Optional[str] = ..., results: _Optional[_Iterable[_Union[BatchLineResult, _Mapping]]] = ...) -> None: ...

class BatchLineResult(_message.Message):
    __slots__ = ("line", "status_code", "body", "request_id")
    LINE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    line: int
    status_code: int
    body: str
    request_id: str
    def __init__(self, line: _Optional[int] = ..., status_code: _Optional[int] = ..., body: _Optional[str] = ..., request_id: _Optional[str] = ...) -> None: ...

class CompleteBatchLinesResponse(_message.Message):
    __slots__ = ("recorded",)
    RECORDED_FIELD_NUMBER: _ClassVar[int]
    recorded: int
    def __init__(self, recorded: _Optional[int] = ...) -> None: ...
