"""The DBA's pgTAP suite (db/tests/*.sql) with the real pg_prove, on a fresh
migrated database: every test passes, and the run leaves nothing behind -- no
row, no NOTIFY delivered, no pgtap extension."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Iterator

import psycopg
import pytest

from dbtools import DB, SCHEMA, pg_prove, sqitch_gen


def _planned() -> int:
    return sum(int(m) for p in sorted((DB / "tests").glob("*.sql"))
               for m in re.findall(r"SELECT plan\((\d+)\)", p.read_text()))


def _contents(c: psycopg.Connection) -> dict[str, tuple[int, str | None]]:
    """Every switchboard table: (row count, md5 of its rows)."""
    tables = [r[0] for r in c.execute(
        "SELECT relname FROM pg_class WHERE relnamespace = %s::regnamespace AND relkind = 'r' ORDER BY 1",
        (SCHEMA,))]
    out = {}
    for t in tables:
        out[t] = c.execute(psycopg.sql.SQL(
            "SELECT count(*), md5(string_agg(x::text, ',' ORDER BY x::text)) FROM {}.{} x").format(
                psycopg.sql.Identifier(SCHEMA), psycopg.sql.Identifier(t))).fetchone()
    return out


def _channels() -> list[str]:
    text = "\n".join(p.read_text() for p in sqitch_gen.function_files())
    return sorted(set(re.findall(r"pg_notify\('(\w+)'", text)))


@pytest.fixture
def listener(db: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(db, autocommit=True) as c:
        for ch in _channels():
            c.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(ch)))
        yield c


def test_pg_prove_passes_and_leaves_nothing(db: str, listener: psycopg.Connection) -> None:
    assert len(_channels()) >= 3
    with psycopg.connect(db) as c:
        before = _contents(c)
        seq_before = c.execute("SELECT last_value FROM switchboard.event_id_seq").fetchone()
    p = pg_prove(db)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert "not ok" not in out
    planned = _planned()
    assert planned >= 220  # 126 before V0002..V0007's 102 (40_boundary_failover.sql)
    assert len(re.findall(r"^ok \d+ ", p.stdout, re.M)) == planned, out[-2000:]
    assert f"Tests={planned}" in out and "Result: PASS" in out
    assert "# SKIP" not in p.stdout, "the suite runs as a superuser here: nothing may be skipped"

    # a NOTIFY of a rolled-back transaction is never delivered
    assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    with psycopg.connect(db) as c:
        assert _contents(c) == before, "pg_prove left rows behind"
        assert c.execute("SELECT count(*) FROM pg_extension WHERE extname = 'pgtap'").fetchone() == (0,)
        # sequences are not transactional: the event ids the test took are a gap
        assert c.execute("SELECT last_value FROM switchboard.event_id_seq").fetchone() >= seq_before
    # the listener itself works: a committed notify_user arrives
    with psycopg.connect(db) as c:
        uid = c.execute("SELECT switchboard.create_user('pgtap-probe', '$2b$12$abcdefghijklmnopqrstuv')").fetchone()[0]
        c.execute("SELECT switchboard.notify_user(%s, 'probe')", (uid,))
    got = []
    for n in listener.notifies(timeout=10):
        got.append(n.channel)
        if n.channel == "switchboard_events":
            break
    assert "switchboard_events" in got


def test_the_docs_state_the_planned_count() -> None:
    """The docs quote the pgTAP total twice -- docs/how-to/releases.md and tests/README.md (both
    in README until issue 36); it drifted (228, 280) while files were added."""
    root = pathlib.Path(__file__).resolve().parent.parent
    releases = (root / "docs" / "how-to" / "releases.md").read_text()
    proves = (root / "tests" / "README.md").read_text()
    stated = (re.findall(r"`db/tests/\*\.sql` \((\d+)", releases)
              + re.findall(r"`pg_prove` \((\d+) pgTAP tests\)", proves))
    assert len(stated) == 2 and set(map(int, stated)) == {_planned()}, stated
    # and the sample pg_prove run lists today's files and totals (it showed 5 files, 228 tests for long)
    sample = releases[releases.index("$ pg_prove"):]
    files = sorted(p.relative_to(root).as_posix() for p in (root / "db" / "tests").glob("*.sql"))
    assert re.findall(r"^(db/tests/\S+\.sql) \.+ ok$", sample, re.M) == files
    assert re.search(r"^Files=(\d+), Tests=(\d+),", sample, re.M).groups() == (str(len(files)), str(_planned()))
