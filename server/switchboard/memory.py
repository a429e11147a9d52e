"""Giving freed memory back to the operating system.

A socket closed for being too slow may have held up to SWITCHBOARD_WS_QUEUE_BYTES
of frames. Python frees those strings at once, but glibc keeps freed heap pages
mapped (only the top of the heap is trimmed by itself), so the replica's RSS
would stay at its high-water mark. ``release_soon`` asks glibc to return free
pages (malloc_trim), at most once per ``DEBOUNCE`` seconds whatever the number
of closes. A no-op where glibc is not the allocator.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging

LOG = logging.getLogger("switchboard.memory")
LARGE = 1 << 20     # a queue this large is worth a trim once released
DEBOUNCE = 1.0

_libc: ctypes.CDLL | None = None
_scheduled = False
try:
    _name = ctypes.util.find_library("c")
    if _name:
        _lib = ctypes.CDLL(_name)
        if hasattr(_lib, "malloc_trim"):
            _libc = _lib
except OSError:   # no C library to load (not glibc): nothing to trim
    _libc = None


def trim() -> None:
    if _libc is not None:
        _libc.malloc_trim(0)


def release_soon() -> None:
    """Trim within DEBOUNCE seconds (one trim for a burst of closes)."""
    global _scheduled
    if _libc is None or _scheduled:
        return
    _scheduled = True

    def run() -> None:
        global _scheduled
        _scheduled = False
        trim()
    try:
        asyncio.get_running_loop().call_later(DEBOUNCE, run)
    except RuntimeError:   # no loop (a unit test): trim now
        run()
