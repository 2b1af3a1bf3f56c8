"""Size limits every process agrees on: the gRPC message size and what must fit in one message.

Servers and clients set :data:`GRPC_MESSAGE_OPTIONS` on every gRPC server and
channel, so a message one side may send the other may receive. A changelog
entry is returned whole by FetchLog (at least one per answer), so one write's
entry must fit a message: :data:`MAX_ENTRY_BYTES`. An update's entry carries
the row's before- and after-image, so ``table.max-row-size`` is at most
:data:`MAX_ROW_SIZE_BOUND` (half an entry).
"""

from __future__ import annotations

#: The largest gRPC message (send and receive) of every kvlease server and client.
MAX_MESSAGE_BYTES = 256 << 20
#: Room in a message for everything but the changelog entry it carries (framing, offsets, error).
MESSAGE_OVERHEAD_BYTES = 1 << 20
#: The largest changelog entry one write may append: FetchLog can always return it.
MAX_ENTRY_BYTES = MAX_MESSAGE_BYTES - MESSAGE_OVERHEAD_BYTES
#: The largest ``table.max-row-size`` allowed: an update's entry holds the row twice.
MAX_ROW_SIZE_BOUND = MAX_ENTRY_BYTES // 2

GRPC_MESSAGE_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

#: Options of every kvlease gRPC server: the message sizes, and no SO_REUSEPORT (gRPC's default on
#: Linux), so a second server on a port in use fails to start instead of silently taking half of
#: the first one's connections.
GRPC_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (*GRPC_MESSAGE_OPTIONS, ("grpc.so_reuseport", 0))
