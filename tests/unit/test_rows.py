"""Unit tier: typed rows match the columns the data layer selects."""

from __future__ import annotations

import dataclasses
import datetime
import re

import pytest

from switchboard.db import EVENT_COLUMNS, RUN_COLUMNS, TASK_COLUMNS
from switchboard.handlers import HandlerContext
from switchboard.rows import EVENT_FIELDS, RUN_FIELDS, TASK_FIELDS, Event, Run, Task
from switchboard.sockets import event_frame, replay_frame


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


def test_task_and_event_have_exactly_the_selected_columns_in_order() -> None:
    assert list(TASK_FIELDS) == _selected(TASK_COLUMNS)
    assert list(EVENT_FIELDS) == _selected(EVENT_COLUMNS)


def test_task_from_row_and_back() -> None:
    row = {name: None for name in TASK_FIELDS} | {"name": "nightly", "handler": "noop", "args": {"a": 1}}
    task = Task.from_row(row)
    assert (task.name, task.handler, task.args) == ("nightly", "noop", {"a": 1})
    assert task.as_dict() == row and list(task.as_dict()) == list(TASK_FIELDS)
    del row["updated_at"]
    with pytest.raises(KeyError, match="updated_at"):
        Task.from_row(row)


def test_a_replayed_event_makes_the_frame_the_relay_sends_live() -> None:
    at = datetime.datetime(2026, 1, 1, 12, 0, 0, 123000, tzinfo=datetime.timezone.utc)
    row = {"tick": 7, "id": 42, "room": "lobby", "event": "msg", "payload": {"x": 1}, "created_at": at}
    ev = Event.from_row(row)
    assert ev.position == (7, 42) and ev.as_dict() == row
    ts = int(at.timestamp() * 1000)
    assert replay_frame(ev) == event_frame(row, ts)
    pos, f = replay_frame(ev)
    assert pos == (7, 42) and f["ts"] == ts and f["id"] == 42 and f["room"] == "lobby"


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
