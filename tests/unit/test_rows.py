"""Unit tier: typed rows match the columns the data layer selects."""

from __future__ import annotations

import dataclasses
import datetime
import re

import pytest

from switchboard.db import RUN_COLUMNS
from switchboard.handlers import HandlerContext
from switchboard.rows import RUN_FIELDS, Run


def _selected(columns: str) -> list[str]:
    """Output names of a select list: `x`, or the alias of `CASE ... END AS x`."""
    out = []
    for part in re.split(r",(?![^()]*\))", columns):
        part = part.strip()
        m = re.search(r"\bAS (\w+)$", part)
        out.append(m.group(1) if m else part)
    return out


def test_run_has_exactly_the_selected_columns_in_order() -> None:
    assert list(RUN_FIELDS) == _selected(RUN_COLUMNS)


def test_from_row_and_back() -> None:
    row = {name: None for name in RUN_FIELDS} | {
        "id": 5, "handler": "noop", "args": {"k": 1}, "status": "running", "attempt": 2, "max_attempts": 3,
        "run_at": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)}
    run = Run.from_row(row)
    assert (run.id, run.handler, run.args, run.attempt) == (5, "noop", {"k": 1}, 2)
    assert run.as_dict() == row and list(run.as_dict()) == list(RUN_FIELDS)
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.status = "x"  # type: ignore[misc]
    del row["retry_of"]
    with pytest.raises(KeyError, match="retry_of"):
        Run.from_row(row)


def test_a_handler_context_takes_a_run_or_its_row() -> None:
    row = {name: None for name in RUN_FIELDS} | {"id": 9, "handler": "h", "args": {"a": 1}, "attempt": 2,
                                                 "max_attempts": 5, "trigger": "manual"}
    for given in (row, Run.from_row(row)):
        ctx = HandlerContext(given, None, lease_seconds=1)  # type: ignore[arg-type]  # no db use
        assert (ctx.run_id, ctx.handler, ctx.args, ctx.attempt, ctx.max_attempts, ctx.trigger) == \
            (9, "h", {"a": 1}, 2, 5, "manual")


def test_a_run_still_answers_dict_style_reads_during_the_merge() -> None:
    run = Run.from_row({name: None for name in RUN_FIELDS} | {"id": 3, "handler": "h"})
    assert run["id"] == 3 and run.get("handler") == "h" and run.get("nope", 7) == 7
    with pytest.raises(KeyError):
        run["nope"]
