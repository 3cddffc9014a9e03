"""The gRPC limits the engine's server and the bridge's channel agree on.

Both sides set them here, deliberately, instead of inheriting gRPC's defaults
(a 4 MiB receive limit, no keepalive): a large embeddings batch on a wide
model must fit the reply, a request must not be allowed to be arbitrarily
large, and a half-open connection must be noticed in seconds rather than when
TCP gives up. docs/operations.md lists the figures.
"""

from __future__ import annotations

MIB = 1024 * 1024

# Requests: the bridge's own body limit is 1 MiB, and a direct gRPC caller's
# largest legitimate request (2,048 prompts of token ids) fits easily.
MAX_REQUEST_BYTES = 16 * MIB
# A stored file (POST /v1/files, BatchService.CreateFile): the bridge reads an
# upload up to this, the engine refuses more (413 file_too_large); it travels in
# one request, so it stays well under MAX_REQUEST_BYTES.
MAX_FILE_BYTES = 8 * MIB
# Replies: 2,048 embeddings of a 16,384-wide model are 128 MiB of floats.
MAX_REPLY_BYTES = 256 * MIB

# A generation whose reader takes nothing for STREAM_STALL_S (MILLM_STREAM_STALL_S)
# or leaves this many replies unread is cancelled. The engine sees it on a
# Generate call (generation/job.py); on the bridge's shared GenerateMany stream
# only the bridge can (rest_bridge/engine_mux.py). One rule, both sides.
STREAM_STALL_S = 30.0
MAX_UNREAD_REPLIES = 4096

# The client pings an idle-looking connection every KEEPALIVE_TIME_MS and
# drops it when the ping is not answered within KEEPALIVE_TIMEOUT_MS, so a
# vanished engine (a host that died, a cable pulled) is seen within 15 s.
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
# The server accepts pings that often (its default, 5 minutes, would answer
# the bridge's pings with GOAWAY "too_many_pings") and pings its own clients
# so that streams of a vanished bridge are cancelled and their rows freed.
SERVER_MIN_PING_INTERVAL_MS = 5_000
SERVER_KEEPALIVE_TIME_MS = 30_000


def server_options() -> list[tuple[str, int]]:
    """Options for the engine's grpc.aio.server."""
    return [
        ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
        ("grpc.max_send_message_length", MAX_REPLY_BYTES),
        ("grpc.keepalive_time_ms", SERVER_KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", SERVER_MIN_PING_INTERVAL_MS),
    ]


def channel_options() -> list[tuple[str, int]]:
    """Options for a client channel to the engine (the bridge's)."""
    return [
        ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
        ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
