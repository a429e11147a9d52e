"""The psql walkthrough's function reference cannot drift from the installed catalog.

"Function reference" (docs/tutorials/psql-walkthrough.md, README's until issue 36) is
the DBA's map of the public API. It drifted once:
it listed login_lookup, auth_snapshot and tool_call_start/take, which the server
no longer calls, and none of the _v2 / relay functions it does call. So, against
the migrated template database:
- every public function (schema switchboard, no leading underscore) is listed;
- every function the table names exists;
- a row that says "kept for a rolling update" (the previous release's forms, which
  its servers call while they run beside this one) lists functions this release's
  server never calls.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg

from harness import ROOT

PAGE = ROOT / "docs" / "tutorials" / "psql-walkthrough.md"


def _table_rows() -> list[str]:
    text = PAGE.read_text()
    section = text[text.index("\n## Function reference\n"):]
    section = section[: section.index("\n## ", 10)]
    return [line for line in section.splitlines() if line.startswith("| `")]


def _names(cell: str) -> set[str]:
    return set(re.findall(r"`([a-z_0-9]+)\(", cell))


def _server_calls() -> set[str]:
    out: set[str] = set()
    for p in (ROOT / "server" / "switchboard").rglob("*.py"):
        out |= set(re.findall(r"switchboard\.([a-z_0-9]+)\(", p.read_text()))
    return out


def _catalog(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute(
            "SELECT DISTINCT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'switchboard' AND p.proname NOT LIKE '\\_%'")}


def test_the_function_table_matches_the_catalog(pg, template_db: str) -> None:  # type: ignore[no-untyped-def]
    rows = _table_rows()
    listed = set().union(*(_names(r.split(" | ")[0]) for r in rows))
    installed = _catalog(pg.url(template_db))
    assert len(installed) > 40
    missing = sorted(installed - listed)
    assert missing == [], f"add these public functions to 'Function reference' in {PAGE.name}: {missing}"
    unknown = sorted(listed - installed)
    assert unknown == [], f"'Function reference' in {PAGE.name} lists functions that do not exist: {unknown}"


def test_previous_release_rows_list_nothing_the_server_calls() -> None:
    rows = [r for r in _table_rows() if "kept for a rolling update" in r.split(" | ")[0]]
    assert rows, "the row of functions kept for the previous release is gone"
    old = set().union(*(_names(r.split(" | ")[0]) for r in rows))
    called = _server_calls()
    assert old and not (old & called), sorted(old & called)


def test_the_server_calls_only_listed_functions() -> None:
    listed = set().union(*(_names(r.split(" | ")[0]) for r in _table_rows()))
    unlisted = sorted(n for n in _server_calls() - listed if not n.startswith("_"))
    assert unlisted == [], f"the server calls functions 'Function reference' in {PAGE.name} omits: {unlisted}"


def test_the_parser_reads_the_table() -> None:
    assert _names("| `a_b(x)`, `c2(y, z)` — see `not_a_call` |") == {"a_b", "c2"}
    assert Path(PAGE).exists()
