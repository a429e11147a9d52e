"""The maintenance handler sweeps again while a bounded reaper comes back full
(V0013: reap_runs / reap_rate_limits delete at most 10,000 rows per call)."""

from __future__ import annotations

import asyncio

import pytest


class _FakeDB:
    """Database.maintenance() as the handler sees it: counts per reaper, one sweep per call."""

    def __init__(self, backlog: int) -> None:
        self.backlog, self.calls = backlog, 0

    async def maintenance(self, keep_events: int, replica_stale: float) -> dict:
        self.calls += 1
        n = min(self.backlog, 10_000)
        self.backlog -= n
        return {"runs": n, "rate_limits": 0, "events": 1}


@pytest.mark.parametrize(("backlog", "calls"), [(0, 1), (25_000, 3), (20_000, 3)])
def test_maintenance_handler_sweeps_again_while_a_batch_comes_back_full(backlog: int, calls: int) -> None:
    from switchboard.builtin_handlers import builtin_handlers
    from switchboard.config import Config

    fake = _FakeDB(backlog)
    cfg = Config(database_url="postgresql://x/y", jwt_secret="s" * 40)
    reg = builtin_handlers(fake, cfg)  # type: ignore[arg-type]
    res = asyncio.run(reg.get("maintenance")(None))  # type: ignore[misc, arg-type]
    assert fake.calls == calls
    assert res["runs"] == backlog and res["events"] == calls
