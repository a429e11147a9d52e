"""switchboard.testing: a handler run against a real throwaway database, no replica."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest

from harness import make_user

from switchboard.handlers import HandlerContext, HandlerError
from switchboard.jobargs import ArgsError
from switchboard.testing import run_handler, run_handler_sync, throwaway_database


async def digest(ctx: HandlerContext) -> dict[str, Any]:
    await ctx.notify_user(ctx.args["user_id"], "digest.sent", {"n": 3})
    await ctx.enqueue("digest.cleanup", {"user": ctx.args["user_id"]}, queueing_lock="cleanup")
    return {"sent": 3, "attempt": ctx.attempt}


def sync_digest(ctx: HandlerContext) -> str:
    ctx.sync(ctx.notify_room("team", "digest.room", {}))
    return "done"


async def refuses(ctx: HandlerContext) -> None:
    raise HandlerError("smtp said no")


def test_what_a_handler_did_is_read_back_from_the_real_tables(db: str) -> None:
    uid = make_user(db, "tia")
    out = run_handler_sync(digest, {"user_id": uid}, database_url=db, name="digest.send")
    assert out.ok and out.error is None and out.result == {"sent": 3, "attempt": 1}
    assert [(e.event, str(e.user_id), e.payload) for e in out.events] == [("digest.sent", uid, {"n": 3})]
    assert [(j.handler, j.args, j.queueing_lock) for j in out.jobs] == [("digest.cleanup", {"user": uid}, "cleanup")]
    # A plain def, through the same path as on a replica (worker thread, ctx.sync).
    out2 = asyncio.run(run_handler(sync_digest, database_url=db))
    assert out2.ok and out2.result == "done" and [e.event for e in out2.events] == ["digest.room"]
    # A failure is recorded as the scheduler records it.
    out3 = run_handler_sync(refuses, database_url=db)
    assert not out3.ok and out3.error == "smtp said no" and out3.result is None
    import psycopg

    with psycopg.connect(db) as c:
        rows = c.execute("SELECT id, status, error FROM switchboard.task_runs WHERE id = ANY(%s) ORDER BY id",
                         ([out.run_id, out2.run_id, out3.run_id],)).fetchall()
    assert [r[1] for r in rows] == ["succeeded", "succeeded", "failed"] and rows[2][2] == "smtp said no"


def test_throwaway_database_is_migrated_and_gone_after() -> None:
    import psycopg

    with throwaway_database() as url:
        out = run_handler_sync(lambda ctx: {"args": ctx.args}, {"x": 1}, database_url=url)
        assert out.ok and out.result == {"args": {"x": 1}}
    try:
        psycopg.connect(url, connect_timeout=2).close()
        raise AssertionError("the throwaway database still answers")
    except psycopg.OperationalError:
        pass


@dataclass
class ReportArgs:
    team: str
    weeks: int = 1


async def report(ctx: HandlerContext[ReportArgs]) -> dict[str, Any]:
    return {"type": type(ctx.args).__name__, "team": ctx.args.team, "weeks": ctx.args.weeks}


async def dawdles(ctx: HandlerContext) -> None:
    await asyncio.sleep(30)


def test_typed_args_and_a_timeout_as_the_registration_gives_them(db: str) -> None:
    out = run_handler_sync(report, ReportArgs(team="core"), database_url=db, args_type=ReportArgs)
    assert out.ok and out.result == {"type": "ReportArgs", "team": "core", "weeks": 1}
    # a mismatch is refused before anything is queued, naming the field
    with pytest.raises(ArgsError, match="weeks"):
        run_handler_sync(report, {"team": "core", "weeks": "two"}, database_url=db, args_type=ReportArgs)
    out2 = run_handler_sync(dawdles, database_url=db, timeout=0.2)
    assert not out2.ok and out2.error is not None and out2.error.startswith("timed out after 0.2 s")
