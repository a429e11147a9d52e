"""Streams: an answer written chunk by chunk on one replica, read live on any other.

- ``producer``: ``Stream`` (send / flush / close, ``stopped``) and the group append;
- ``writer``: ``Producer``, this process's open streams, their leases, stop hints;
- ``hub``: ``StreamHub``, every local subscription fed by one read per wake-up;
- ``sinks``: a WebSocket's queue or an SSE response as a subscription's consumer;
- ``runtime``: ``StreamsRuntime``, the LISTEN connection of channels switchboard_stream
  and switchboard_stream_stop wired to both (the only part that sits with the relay).
"""

from __future__ import annotations

from .hub import StreamHub, Subscription
from .producer import Stream, StreamError, StreamStopped
from .writer import Producer

__all__ = ["Producer", "Stream", "StreamError", "StreamHub", "StreamStopped", "Subscription"]
