"""Handler options on a real replica: its registration reaches handler_options at start,
typed arguments are checked at enqueue and when the run starts (a mismatch fails the
run for good, naming the field), a timeout fails a run that overstays, and a named
queue never runs more handlers at once than its slots."""

from __future__ import annotations

import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness import ROOT
from switchboard import api
from switchboard.jobargs import ArgsError

MODULE = textwrap.dedent('''
    import asyncio
    from dataclasses import dataclass, field
    from switchboard.handlers import HandlerContext, RetryStrategy, registry

    @dataclass
    class InvoiceArgs:
        order_id: int
        email: str
        lines: list[str] = field(default_factory=list)

    @registry.register("t.invoice", args=InvoiceArgs, queue="emails", priority=5, max_attempts=4,
                       retry=RetryStrategy(base=0.05, cap=0.2, jitter=0.5))
    async def invoice(ctx: HandlerContext[InvoiceArgs]) -> dict:
        a = ctx.args
        return {"type": type(a).__name__, "order_id": a.order_id, "lines": a.lines}

    @registry.register("t.overstay", timeout=0.3, max_attempts=2, retry=RetryStrategy(base=0.05, cap=0.1))
    async def overstay(ctx):
        await asyncio.sleep(30)

    RUNNING = {"now": 0, "max": 0}

    @registry.register("t.narrow", queue="narrow")
    async def narrow(ctx):
        RUNNING["now"] += 1
        RUNNING["max"] = max(RUNNING["max"], RUNNING["now"])
        try:
            await asyncio.sleep(0.2)
        finally:
            RUNNING["now"] -= 1
        return {"max_seen": RUNNING["max"]}
''')


@dataclass
class InvoiceArgs:
    """The application's copy of the handler's args type (the same fields)."""
    order_id: int
    email: str
    lines: list[str]


def _wait(c: psycopg.Connection, sql: str, params: Any, done: Any, timeout: float = 60) -> Any:
    deadline = time.time() + timeout
    while True:
        row = c.execute(sql, params).fetchone()
        if done(row):
            return row
        assert time.time() < deadline, f"timed out waiting: last {row}"
        time.sleep(0.05)


@pytest.fixture
def replica(db: str, server_factory, tmp_path: Path):  # type: ignore[no-untyped-def]
    (tmp_path / "sb_opt_jobs.py").write_text(MODULE)
    return server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{tmp_path}", "SWITCHBOARD_HANDLERS": "sb_opt_jobs",
                               "SWITCHBOARD_QUEUES": "narrow=1", "SWITCHBOARD_POLL_INTERVAL": "0.2"})


def test_options_typed_args_timeout_and_queue_slots_on_a_replica(db: str, replica) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(db, autocommit=True) as c:
        # 1. the registration is stored (what enqueue() from anywhere now reads)
        row = _wait(c, "SELECT queue, priority, max_attempts, backoff_base, timeout FROM switchboard.handler_options "
                       "WHERE handler = %s", ("t.invoice",), lambda r: r is not None)
        assert row[:4] == ("emails", 5, 4, __import__("datetime").timedelta(seconds=0.05))
        assert c.execute("SELECT timeout FROM switchboard.handler_options WHERE handler = 't.overstay'"
                         ).fetchone()[0].total_seconds() == 0.3

        # 2. typed args: checked at enqueue (nothing sent on a mismatch) ...
        with pytest.raises(ArgsError, match="order_id") as err, c.transaction():
            api.enqueue(c, "t.invoice", InvoiceArgs(order_id="12", email="a@b", lines=[]))  # type: ignore[arg-type]
        assert "t.invoice" in str(err.value)
        # ... and at start: the handler gets an instance of its own type
        rid = api.enqueue(c, "t.invoice", InvoiceArgs(order_id=12, email="a@b", lines=["x"]))
        row = _wait(c, "SELECT status, queue, priority, result FROM switchboard.task_runs WHERE id = %s", (rid,),
                    lambda r: r[0] in ("succeeded", "failed"))
        assert row == ("succeeded", "emails", 5, {"type": "InvoiceArgs", "order_id": 12, "lines": ["x"]})

        # 3. args that do not match (written by hand) fail the run for good, naming the field
        bad = c.execute("SELECT id FROM switchboard.enqueue('t.invoice', '{\"order_id\": \"x\", \"email\": \"e\"}')"
                        ).fetchone()[0]
        row = _wait(c, "SELECT status, attempt, error FROM switchboard.task_runs WHERE id = %s", (bad,),
                    lambda r: r[0] in ("succeeded", "failed"))
        assert row[0:2] == ("failed", 1) and "order_id" in row[2] and "int" in row[2], row
        time.sleep(0.5)   # longer than the handler's backoff: a retry would exist by now
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE retry_of = %s", (bad,)).fetchone() == (0,)

        # 4. the timeout fails a run that overstays; it is retried by the handler's rule, up to max_attempts
        slow = c.execute("SELECT id FROM switchboard.enqueue('t.overstay')").fetchone()[0]
        row = _wait(c, "SELECT count(*) FILTER (WHERE status = 'failed'), max(attempt), "
                       "bool_and(error LIKE 'timed out after 0.3 s%%') FROM switchboard.task_runs "
                       "WHERE handler = 't.overstay'", (), lambda r: r[0] == 2)
        assert row == (2, 2, True), row
        assert slow

        # 5. the narrow queue has one slot on this replica: never two of its handlers at once
        ids = [r[0] for r in c.execute("SELECT (switchboard.enqueue('t.narrow')).id FROM generate_series(1, 4)")]
        rows = [_wait(c, "SELECT status, result FROM switchboard.task_runs WHERE id = %s", (i,),
                      lambda r: r[0] in ("succeeded", "failed")) for i in ids]
        assert [r[0] for r in rows] == ["succeeded"] * 4
        assert max(r[1]["max_seen"] for r in rows) == 1
