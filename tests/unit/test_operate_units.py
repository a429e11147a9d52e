"""Unit tier: parsing and formatting of the operate commands and endpoints (no database)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import falcon
import pytest

from switchboard import cli
from switchboard.http import operate
from switchboard.rows import TASK_FIELDS, Task


def test_cursor_round_trips_and_refuses_anything_else() -> None:
    assert operate._cursor(None) is None
    assert operate._cursor("v1.42") == 42
    assert operate._cursor("v1.9223372036854775807") == 2**63 - 1
    for bad in ("42", "v2.42", "v1.", "v1.-1", "v1.4 2", "v1.9223372036854775808", "v1.²", "v1.42\n"):
        with pytest.raises(falcon.HTTPBadRequest):
            operate._cursor(bad)


def test_since_is_iso_and_naive_means_utc() -> None:
    assert operate._since("2026-01-31T12:00:00Z") == datetime(2026, 1, 31, 12, tzinfo=timezone.utc)
    assert operate._since("2026-01-31T12:00:00").tzinfo is timezone.utc  # type: ignore[union-attr]
    with pytest.raises(falcon.HTTPBadRequest):
        operate._since("yesterday")


def test_cli_since_takes_an_age_or_a_time() -> None:
    assert cli._since("90m") == timedelta(minutes=90)
    assert cli._since("7d") == timedelta(days=7)
    assert cli._since("2026-01-31T12:00:00+00:00") == datetime(2026, 1, 31, 12, tzinfo=timezone.utc)
    with pytest.raises(SystemExit):
        cli._since("last week")


def test_cli_durations_and_parked_tasks_read_well() -> None:
    assert [cli._duration(v) for v in (None, 12, 1500, 61_000, 3_723_000)] == ["-", "12ms", "1.5s", "1m01s",
                                                                               "1h02m"]
    def task(**cols: object) -> Task:
        return Task.from_row({name: None for name in TASK_FIELDS} | cols)
    assert cli._next_run(task(next_run_at=None, schedule="@hourly")) == "never (parked)"
    assert cli._next_run(task(next_run_at=None, schedule=None)) == "-"
    assert cli._one_line("line one\nline two", 60) == "line one\\x0aline two"


def test_cli_parser_knows_the_operate_commands() -> None:
    p = cli.build_parser()
    a = p.parse_args(["runs", "list", "--status", "failed", "--limit", "5", "--before", "9", "--json"])
    assert (a.runs_cmd, a.status, a.limit, a.before, a.json) == ("list", "failed", 5, 9, True)
    assert p.parse_args(["runs", "cancel", "7"]).id == 7
    assert p.parse_args(["handlers", "pause", "myapp.mail"]).name == "myapp.mail"
    assert p.parse_args(["status", "--json"]).json is True
    with pytest.raises(SystemExit):
        p.parse_args(["runs", "list", "--status", "lost"])
