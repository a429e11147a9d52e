"""The maintenance handler sweeps again while a bounded reaper comes back full
(reap_runs / reap_rate_limits since V0013, reap_events since V0015: at most
max_rows per call, and the handler asks for 10,000)."""

from __future__ import annotations

import asyncio

import pytest


class _FakeDB:
    """Database.maintenance() as the handler sees it: counts per reaper, one sweep per call."""

    def __init__(self, backlog: int, reaper: str) -> None:
        self.backlog, self.reaper, self.calls = backlog, reaper, 0
        self.max_rows: list[int] = []

    async def maintenance(self, keep_events: int, replica_stale: float, max_rows: int) -> dict:
        self.calls += 1
        self.max_rows.append(max_rows)
        n = min(self.backlog, max_rows)
        self.backlog -= n
        res = {"runs": 0, "rate_limits": 0, "events": 0, "tickets": 1}
        res[self.reaper] = n
        return res


@pytest.mark.parametrize("reaper", ["runs", "rate_limits", "events"])
@pytest.mark.parametrize(("backlog", "calls"), [(0, 1), (25_000, 3), (20_000, 3)])
def test_maintenance_handler_sweeps_again_while_a_batch_comes_back_full(backlog: int, calls: int, reaper: str) -> None:
    from switchboard.builtin_handlers import builtin_handlers
    from switchboard.config import Config

    fake = _FakeDB(backlog, reaper)
    cfg = Config(database_url="postgresql://x/y", jwt_secret="s" * 40)
    reg = builtin_handlers(fake, cfg)  # type: ignore[arg-type]
    res = asyncio.run(reg.get("maintenance")(None))  # type: ignore[misc, arg-type]
    assert fake.calls == calls
    assert fake.max_rows == [10_000] * calls
    assert res[reaper] == backlog and res["tickets"] == calls
    assert fake.backlog == 0
