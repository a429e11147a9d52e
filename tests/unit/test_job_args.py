"""Unit tier: refused job arguments of the built-in handlers are counted as bad input."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from switchboard import bounded
from switchboard.builtin_handlers import builtin_handlers
from switchboard.config import Config
from switchboard.handlers import HandlerContext, HandlerError
from switchboard.rows import RUN_FIELDS, Run

UID = "6f1c2b9e-3a4d-4e5f-8a9b-0c1d2e3f4a5b"


def run_with(handler: str, args: dict[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    counted: list[tuple[str, str]] = []
    rej = bounded.Rejections(lambda s, r: counted.append((s, r)), logging.getLogger("t.job"))
    reg = builtin_handlers(None, Config(database_url="postgresql://x/y", jwt_secret="s" * 40),  # type: ignore[arg-type]  # no db use
                           rej)
    run = Run.from_row({n: None for n in RUN_FIELDS} | {"id": 7, "handler": handler, "args": args, "attempt": 1,
                                                         "max_attempts": 1, "task_id": UID})
    ctx = HandlerContext(run, None, lease_seconds=1)  # type: ignore[arg-type]  # no db use
    fn = reg.get(handler)
    assert fn is not None
    with pytest.raises(HandlerError) as exc:
        asyncio.run(fn(ctx))
    return str(exc.value), counted


@pytest.mark.parametrize(("handler", "args", "reason"), [
    ("sleep", {"seconds": "x"}, "bad_type"),
    ("sleep", {"seconds": True}, "bad_type"),
    ("sleep", {"seconds": 1e308}, "out_of_range"),
    ("sql", {"sql": 5}, "bad_type"),
    ("sql", {"sql": "  "}, "bad_text"),
    ("sql", {"sql": "SELECT 1", "timeout_seconds": -1}, "out_of_range"),
    ("notify", {"user_id": "not-a-uuid", "event": "x"}, "malformed"),
    ("notify", {"user_id": UID, "event": "a\nforged"}, "bad_text"),
    ("notify", {"room": "lobby", "event": "e" * 500}, "too_large"),
    ("notify", {"room": "lobby", "event": None}, "bad_type"),
])
def test_a_refused_job_argument_fails_the_run_and_is_counted(handler: str, args: dict[str, Any],
                                                               reason: str) -> None:
    message, counted = run_with(handler, args)
    assert counted == [("job", reason)], message
    assert "Traceback" not in message


def test_what_is_not_a_bound_is_not_counted() -> None:
    _, counted = run_with("fail", {"message": "on purpose"})
    assert counted == []
