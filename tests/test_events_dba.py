"""Events as a DBA meets them from psql, with no replica running (issue 32).

- The docs teach a DBA how to read what a user missed (docs/explanation/event-bus.md;
  README's DBA walkthrough, "Events", until issue 36). Its SQL is taken from that
  page itself, so the test follows the docs: a transaction that
  published the lower id commits after the higher id was read, and the reader, who
  keeps the cursor the page tells it to keep, still gets that event, once.
  (It lost it while the README taught events_since(user_id, after_id): an id
  cursor cannot see an event with a lower id commit late.)
- reap_events honours keep with no ticker: retention counts from the tick that
  covered an event, and with no relay running there was none, so nothing was ever
  reaped whatever keep said. Both overloads and the maintenance sweeps.
"""

from __future__ import annotations

import re
import time

import psycopg

from harness import ROOT, seal_event_partition

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"
END = 9223372036854775807


# -- the event bus page's psql ----------------------------------------------------------------
EVENT_BUS = ROOT / "docs" / "explanation" / "event-bus.md"


def _events_blocks() -> list[str]:
    """The code blocks of the page's text before its first section heading (the whole page
    while it has none): where it teaches publishing and reading from psql."""
    text = EVENT_BUS.read_text()
    assert text.startswith("# The event bus\n"), "docs/explanation/event-bus.md moved: re-point this test"
    end = text.find("\n## ")
    section = text if end < 0 else text[:end]
    return re.findall(r"```[a-z]*\n(.*?)```", section, re.S)


def _statements(block: str) -> list[str]:
    """The SQL statements of a psql transcript: from a line starting with a keyword to
    the line ending with ';' (a trailing -- comment aside); output lines are skipped."""
    out: list[str] = []
    cur: list[str] = []
    for line in block.splitlines():
        code = re.sub(r"\s+--.*$", "", line).rstrip()
        if not cur and not re.match(r"(SELECT|WITH|BEGIN|COMMIT|LISTEN)\b", code):
            continue
        cur.append(code)
        if code.endswith(";"):
            out.append("\n".join(cur))
            cur = []
    return out


def docs_read_missed() -> list[str]:
    """The statements the event bus page gives for reading what a user missed: its first
    code block that calls events_since*, its tick, read and checks."""
    blocks = [b for b in _events_blocks() if re.search(r"\bswitchboard\.events_since\w*\(", b)]
    assert blocks, "docs/explanation/event-bus.md: no code block reads missed events"
    stmts = [s for s in _statements(blocks[0])
             if re.search(r"switchboard\.(events_since\w*|event_tick|event_window)\(", s)]
    assert any("events_since" in s for s in stmts), blocks[0]
    return stmts


def _call_args(stmt: str) -> tuple[str, list[str], int, int]:
    """(function, argument texts, start, end) of the events_since* call in stmt."""
    m = re.search(r"switchboard\.(events_since\w*)\(", stmt)
    assert m, stmt
    depth, args, arg, i = 1, [], "", m.end()
    while depth:
        ch = stmt[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if depth == 1 and ch == ",":
            args.append(arg.strip())
            arg = ""
        elif depth:
            arg += ch
        i += 1
    args.append(arg.strip())
    return m.group(1), args, m.end(), i - 1


def _psql_vars(stmt: str, variables: dict[str, object]) -> str:
    """psql's :'name' (a quoted literal) and :name (as is); '::' casts are left alone."""
    stmt = re.sub(r":'(\w+)'", lambda m: "'" + str(variables[m.group(1)]).replace("'", "''") + "'", stmt)
    return re.sub(r"(?<![:\w]):(\w+)", lambda m: str(variables[m.group(1)]), stmt)


class DocsReader:
    """A DBA following the docs: run the page's statements; keep the position the read
    returns (the last row's (tick, id), or its id where the function has no tick)."""

    def __init__(self, conn: psycopg.Connection, user_id: str) -> None:
        self.conn = conn
        self.user_id = user_id
        self.tick, self.id = 0, 0
        self.stmts = docs_read_missed()

    def _bind(self, stmt: str) -> str:
        """The read with the user and this reader's position as its arguments, by the
        function's own argument names (user_id, after_tick, after_id)."""
        fn, args, lo, hi = _call_args(stmt)
        names = self.conn.execute(
            "SELECT proargnames FROM pg_proc WHERE pronamespace = 'switchboard'::regnamespace AND proname = %s "
            "ORDER BY pronargs DESC LIMIT 1", (fn,)).fetchone()
        assert names, f"the page reads with switchboard.{fn}, which does not exist"
        values = {"user_id": f"'{self.user_id}'", "after_tick": str(self.tick), "after_id": str(self.id)}
        bound = [values.get(name, text) for name, text in zip(names[0], args)]
        return stmt[:lo] + ", ".join(bound) + stmt[hi:]

    def read(self) -> list[dict]:
        """Run the page's statements once, in order; the rows its read returned."""
        rows: list[dict] = []
        for stmt in self.stmts:
            q = _psql_vars(stmt, {"alice_id": self.user_id, "tick": self.tick, "id": self.id}).rstrip(";")
            if "events_since" in stmt:
                cur = self.conn.execute(self._bind(q))
                cols = [d.name for d in cur.description or []]
                rows = [dict(zip(cols, r)) for r in cur.fetchall()]
                if rows:
                    self.tick = int(rows[-1].get("tick", 0))
                    self.id = int(rows[-1]["id"])
            else:
                res = self.conn.execute(q).fetchall()
                if "resume_gap" in stmt:
                    assert res == [(False,)], f"resume_gap where nothing was reaped: {stmt}"
        return rows


def test_the_docs_statements_are_found() -> None:
    stmts = docs_read_missed()
    assert any("events_since_v2" in s for s in stmts)
    assert any("event_tick" in s for s in stmts), "from psql alone, the page must say to tick"
    assert any("event_window" in s and "resume_gap" in s for s in stmts)


def test_the_docs_resume_keeps_an_event_that_commits_after_a_higher_id(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = c.execute("SELECT switchboard.create_user('dba-reader', %s)", (ARGON,)).fetchone()[0]
        c.execute("SELECT switchboard.add_room_member('ops', %s)", (uid,))
        reader = DocsReader(c, str(uid))
        first = c.execute("SELECT switchboard.notify_user(%s, 'before', '{}')", (uid,)).fetchone()[0]
        assert [r["id"] for r in reader.read()] == [first]

        a, b = psycopg.connect(db), psycopg.connect(db)
        try:
            late = a.execute("SELECT switchboard.notify_user(%s, 'late', '{}')", (uid,)).fetchone()[0]
            early = b.execute("SELECT switchboard.notify_room('ops', 'early', '{}')").fetchone()[0]
            assert late < early
            b.commit()
            assert [r["id"] for r in reader.read()] == [early]     # A is still open
            assert reader.read() == []                               # nothing new, nothing again
            a.commit()
        finally:
            a.close()
            b.close()
        # A's event has the lower id and committed after the reader's cursor passed
        # the higher one: the page's read still returns it, once.
        assert [r["id"] for r in reader.read()] == [late]
        assert reader.read() == []


# -- reap_events with no ticker -------------------------------------------------------------
def _publish(c: psycopg.Connection, uid: str, n: int) -> list[int]:
    return [c.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,)).fetchone()[0] for _ in range(n)]


def _retained(c: psycopg.Connection, ids: list[int]) -> list[int]:
    return [r[0] for r in c.execute("SELECT id FROM switchboard.events WHERE id = ANY(%s) ORDER BY id", (ids,))]


def _window(c: psycopg.Connection) -> tuple[int, int]:
    return c.execute("SELECT first_tick, reaped_through FROM switchboard.event_window()").fetchone()


def _clock(c: psycopg.Connection) -> float:
    return c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]


REAPS = {
    "reap_events(keep)": "SELECT switchboard.reap_events(%s::interval)",
    "reap_events(keep, max_rows)": "SELECT switchboard.reap_events(%s::interval, 10000)",
    "maintenance(keep_events =>)": "SELECT (switchboard.maintenance(keep_events => %s::interval) ->> 'events')::int",
    "maintenance(max_rows, keep_events =>)":
        "SELECT (switchboard.maintenance(max_rows => 10000, keep_events => %s::interval) ->> 'events')::int",
}


def test_reap_events_honours_keep_with_no_ticker(db: str) -> None:
    """No relay runs: nobody else ticks. Each form, on its own user's events: a call,
    then (more than keep later) another, deletes what the first call saw committed;
    an event younger than keep stays; the window moves."""
    keep = "1 second"
    with psycopg.connect(db, autocommit=True) as c:
        for n, (form, call) in enumerate(REAPS.items()):
            uid = c.execute("SELECT switchboard.create_user(%s, %s)", (f"reaped-{n}", ARGON)).fetchone()[0]
            old = _publish(c, uid, 5)
            seal_event_partition(db)                      # their partition is full (V0037)
            first_tick, through = _window(c)
            c.execute(call, (keep,))                      # sees them committed: the tick is its own
            seen_at = _clock(c)
            young = _publish(c, uid, 2)
            while _clock(c) < seen_at + 1.2:
                time.sleep(0.1)
            gone = c.execute(call, (keep,)).fetchone()[0]
            assert _retained(c, old) == [], f"{form}: events seen committed more than keep ago are still there"
            assert gone >= len(old), form
            new_first, new_through = _window(c)
            assert new_first > first_tick and new_through >= max(old) > through, form
            # The young events committed after the first call: the second one covered
            # them with its own tick, so they stay at least keep from now.
            assert _retained(c, young) == young, f"{form}: an event younger than keep was reaped"
            assert c.execute(call, ("1 hour",)).fetchone()[0] == 0, form
            assert _retained(c, young) == young, f"{form}: keep '1 hour' reaped an event younger than it"


def test_reap_ticks_only_when_no_relay_ticked_since_its_previous_call(db: str) -> None:
    """With a relay ticking (here: this test, as a relay would), reap_events leaves the
    ticker row alone: it never holds it from the relays. With none since its previous
    call, it ticks (one tick covering what committed)."""
    with psycopg.connect(db, autocommit=True) as c, psycopg.connect(db, autocommit=True) as relay:
        uid = c.execute("SELECT switchboard.create_user('ticked', %s)", (ARGON,)).fetchone()[0]
        c.execute("SELECT switchboard.reap_events('1 hour')")
        _publish(c, uid, 1)
        assert relay.execute("SELECT switchboard.event_tick()").fetchone()[0] > 0     # a relay ticked
        _publish(c, uid, 1)                                                           # not yet ticked
        newest = c.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0]
        c.execute("SELECT switchboard.reap_events('1 hour')")
        assert c.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0] == newest
        # no relay ticked since that call: the next one ticks
        c.execute("SELECT switchboard.reap_events('1 hour')")
        assert c.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0] > newest
        assert c.execute("SELECT count(*) FROM switchboard.events e WHERE switchboard.event_batch(e.id) IS NULL"
                         ).fetchone()[0] == 0
        # a call inside a transaction that already wrote does not tick (nor fail)
        with psycopg.connect(db) as t:
            t.execute("SELECT switchboard.notify_user(%s, 'x', '{}')", (uid,))
            before = t.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0]
            t.execute("SELECT switchboard.reap_events('1 hour')")
            assert t.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0] == before
        # nor under REPEATABLE READ (the tick's snapshot must follow the ticker lock)
        with psycopg.connect(db) as t:
            t.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            before = t.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0]
            t.execute("SELECT switchboard.reap_events('1 hour')")
            assert t.execute("SELECT max(tick) FROM switchboard.event_ticks").fetchone()[0] == before
