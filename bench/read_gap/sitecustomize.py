"""Bench only, never the product: the time-based read coalescing proposed in
BENCHMARKS.md ("Many replicas"), patched into a replica so bench/replicas.py can
measure it beside the unpatched relay (relay.py itself is not changed here).

bench/replicas.py puts this directory on a replica's PYTHONPATH with
SWITCHBOARD_BENCH_READ_GAP=<seconds>; Python imports sitecustomize at start-up.
An event read then starts no sooner than the gap after the previous one started;
announcements (users, revocations, rooms, tools, sessions, ephemeral ids) never
start a pause.
"""

from __future__ import annotations

import os

_GAP = float(os.environ.get("SWITCHBOARD_BENCH_READ_GAP", "0") or 0)

if _GAP > 0:
    import asyncio

    from switchboard import relay
    from switchboard.hints import Hints

    async def _read_loop(self: relay.Relay) -> None:
        loop = asyncio.get_running_loop()
        last = float("-inf")
        while True:
            await self._wake.wait()
            h = self._hints
            only_events = not (h.ephemeral or h.users or h.revoked or h.members or h.tools or h.sessions)
            wait = last + _GAP - loop.time()
            if only_events and wait > 0:
                await asyncio.sleep(wait)       # notices meanwhile land in the same Hints
            self._wake.clear()
            hints, self._hints = self._hints, Hints()
            if hints.events or hints.tick:
                last = loop.time()
            if hints:
                await self._read(hints)

    relay.Relay._read_loop = _read_loop  # type: ignore[method-assign]
