"""WebSocket tickets: 128 random bits, hash-only storage, single use, expiry.

Issued and consumed with issue_ticket_v2 / consume_ticket_v2 without a session
(session NULL); what a session adds is tested in test_sessions.py and
db/tests/50_sessions.sql."""

from __future__ import annotations

import hashlib
import re
import threading

import psycopg
import pytest
from pgtap import is_unlogged, race, throws_ok

ARGON = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"


def new_user(c: psycopg.Connection, name: str) -> str:
    return c.execute("SELECT switchboard.create_user(%s, %s)", (name, ARGON)).fetchone()[0]


def consume(c: psycopg.Connection, ticket: str | None) -> object:
    """The ticket's user, or None when consume_ticket_v2 refuses it (no row)."""
    row = c.execute("SELECT user_id FROM switchboard.consume_ticket_v2(%s)", (ticket,)).fetchone()
    return None if row is None else row[0]


def test_tickets_are_128_random_bits_in_hex(conn: psycopg.Connection) -> None:
    uid = new_user(conn, "tix")
    tickets = [r[0] for r in conn.execute(
        "SELECT switchboard.issue_ticket_v2(%s, NULL) FROM generate_series(1, 1000)", (uid,))]
    assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in tickets), tickets[:3]
    assert len(set(tickets)) == 1000
    # Sanity, not a randomness proof: every one of the 128 bit positions is set
    # in about half the tickets (a fixed bit such as a UUID version or variant
    # bit leaking through would sit at 0 or 1000; 5 sigma is about 80).
    bits = [int(t, 16) for t in tickets]
    for pos in range(128):
        ones = sum((b >> pos) & 1 for b in bits)
        assert 380 <= ones <= 620, f"bit {pos} set in {ones}/1000 tickets"
    assert conn.execute("SELECT count(*) FROM switchboard.tickets WHERE user_id = %s",
                        (uid,)).fetchone()[0] == 1000


def test_only_the_hash_is_stored(db: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "hashonly")
        ticket = c.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
        # the whole schema, row by row as text (bytea columns print as \x<hex>)
        tables = [r[0] for r in c.execute(
            """SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'switchboard' AND c.relkind IN ('r', 'p')""")]
        assert "switchboard.tickets" in tables and len(tables) >= 10
        for table in tables:
            hits = c.execute(
                f"SELECT count(*) FROM {table} t WHERE strpos(lower(t::text), %s) > 0", (ticket,)
            ).fetchone()[0]
            assert hits == 0, f"raw ticket found in {table}"
        stored = c.execute("SELECT hash, user_id FROM switchboard.tickets").fetchall()
        assert stored == [(hashlib.sha256(bytes.fromhex(ticket)).digest(), uid)]
        assert c.execute("SELECT hash = sha256(decode(%s, 'hex')) FROM switchboard.tickets",
                         (ticket,)).fetchone()[0] is True
        is_unlogged(c, "tickets")


def test_a_ticket_is_consumed_once_under_concurrency(db: str) -> None:
    rounds = 50
    with psycopg.connect(db, autocommit=True) as c:
        uid = new_user(c, "racer")
        tickets = [r[0] for r in c.execute(
            "SELECT switchboard.issue_ticket_v2(%s, NULL) FROM generate_series(1, %s)", (uid, rounds))]

    def consumer(i: int, barrier: threading.Barrier) -> list:
        got = []
        with psycopg.connect(db, autocommit=True) as w:
            for t in tickets:
                barrier.wait()
                got.append(consume(w, t))
        return got

    per_thread = race(8, consumer)
    for n in range(rounds):
        outcomes = [got[n] for got in per_thread]
        assert sorted(outcomes, key=str) == sorted([uid] + [None] * 7, key=str), (n, outcomes)
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM switchboard.tickets").fetchone()[0] == 0


def test_expired_ticket_is_refused(conn: psycopg.Connection) -> None:
    uid = new_user(conn, "late")
    fresh = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL, '1 hour')", (uid,)).fetchone()[0]
    stale = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL, '1 hour')", (uid,)).fetchone()[0]
    conn.execute(
        "UPDATE switchboard.tickets SET expires_at = clock_timestamp() - interval '1 ms' "
        "WHERE hash = sha256(decode(%s, 'hex'))", (stale,))
    assert consume(conn, stale) is None
    assert consume(conn, fresh) == uid
    assert consume(conn, fresh) is None


def test_reap_tickets_deletes_only_expired(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM switchboard.tickets")
    uid = new_user(conn, "reaped")
    keep = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
    conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL) FROM generate_series(1, 3)", (uid,))
    conn.execute("UPDATE switchboard.tickets SET expires_at = now() - interval '1 second' "
                 "WHERE hash <> sha256(decode(%s, 'hex'))", (keep,))
    assert conn.execute("SELECT switchboard.reap_tickets()").fetchone()[0] == 3
    assert consume(conn, keep) == uid


def test_unknown_and_disabled_users_get_no_ticket(conn: psycopg.Connection) -> None:
    throws_ok(conn, "SELECT switchboard.issue_ticket_v2(gen_random_uuid(), NULL)", "P0002")
    uid = new_user(conn, "gone")
    outstanding = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
    conn.execute("SELECT switchboard.disable_user(%s)", (uid,))
    throws_ok(conn, "SELECT switchboard.issue_ticket_v2(%s, NULL)", "28000", (uid,), match=str(uid))
    # a ticket issued before the user was disabled dies with it
    assert consume(conn, outstanding) is None


def test_ticket_ttl_is_validated(conn: psycopg.Connection) -> None:
    uid = new_user(conn, "ttl")
    throws_ok(conn, "SELECT switchboard.issue_ticket_v2(%s, NULL, '0 seconds')", "22023", (uid,), match="ttl")
    throws_ok(conn, "SELECT switchboard.issue_ticket_v2(%s, NULL, '2 hours')", "22023", (uid,), match="02:00:00")
    t = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
    assert conn.execute(
        "SELECT expires_at - now() FROM switchboard.tickets WHERE hash = sha256(decode(%s, 'hex'))",
        (t,)).fetchone()[0].total_seconds() == 30


@pytest.mark.parametrize("bad", [None, "", "xyz", "0" * 31, "0" * 33, "g" * 32, " " + "0" * 31,
                                 "0" * 32 + "\n"])
def test_malformed_ticket_is_refused(conn: psycopg.Connection, bad: str | None) -> None:
    assert consume(conn, bad) is None


def test_upper_case_hex_is_the_same_ticket(conn: psycopg.Connection) -> None:
    uid = new_user(conn, "upper")
    t = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (uid,)).fetchone()[0]
    assert consume(conn, t.upper()) == uid
    assert consume(conn, t) is None


def test_a_password_change_drops_the_users_unused_tickets(conn: psycopg.Connection) -> None:
    # A ticket minted with the old credentials just before a password change must not
    # open a socket after it; another user's ticket is untouched.
    u = conn.execute("SELECT switchboard.create_user('pwchange', '$argon2id$h1', 'member')").fetchone()[0]
    other = conn.execute("SELECT switchboard.create_user('bystander', '$argon2id$h2', 'member')").fetchone()[0]
    old = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (u,)).fetchone()[0]
    keep = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (other,)).fetchone()[0]
    conn.execute("SELECT switchboard.set_user_password_hash(%s, '$argon2id$h3')", (u,))
    assert consume(conn, old) is None
    assert consume(conn, keep) == other
    fresh = conn.execute("SELECT switchboard.issue_ticket_v2(%s, NULL)", (u,)).fetchone()[0]
    assert consume(conn, fresh) == u
