"""pgTAP-style assertions, so a test reads like a DBA's check."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg


def has_function(conn: psycopg.Connection, name: str, args: list[str] | None = None,
                 schema: str = "switchboard") -> None:
    rows = conn.execute(
        """SELECT pg_get_function_identity_arguments(p.oid)
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname = %s AND p.proname = %s""",
        (schema, name),
    ).fetchall()
    assert rows, f"function {schema}.{name} does not exist"
    if args is not None:
        found = [
            conn.execute(
                """SELECT array_agg(format_type(t, NULL) ORDER BY i)
                     FROM unnest(p.proargtypes::oid[]) WITH ORDINALITY AS a(t, i)""".replace(
                    "p.proargtypes", "(SELECT proargtypes FROM pg_proc WHERE oid = %s)"),
                (oid,),
            ).fetchone()[0] or []
            for (oid,) in conn.execute(
                """SELECT p.oid FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                    WHERE n.nspname = %s AND p.proname = %s""", (schema, name)).fetchall()
        ]
        assert list(args) in found, f"{schema}.{name}({', '.join(args)}) not found; have {found}"


def throws_ok(conn: psycopg.Connection, sql: str, sqlstate: str, params: Any = None,
              match: str | None = None) -> psycopg.Error:
    """Run sql in a savepoint; assert it raises with sqlstate (and message matching)."""
    try:
        with conn.transaction():
            conn.execute(sql, params)
    except psycopg.Error as exc:
        assert exc.sqlstate == sqlstate, (
            f"expected SQLSTATE {sqlstate}, got {exc.sqlstate}: {exc}"
        )
        if match is not None:
            assert match in str(exc), f"message {str(exc)!r} does not mention {match!r}"
        return exc
    raise AssertionError(f"{sql!r} did not raise (expected {sqlstate})")


def lives_ok(conn: psycopg.Connection, sql: str, params: Any = None) -> None:
    with conn.transaction():
        conn.execute(sql, params)


def results_eq(conn: psycopg.Connection, sql: str, expected: list[tuple], params: Any = None) -> None:
    got = conn.execute(sql, params).fetchall()
    assert [tuple(r) for r in got] == [tuple(r) for r in expected], f"{sql}: {got} != {expected}"


def is_unlogged(conn: psycopg.Connection, table: str, schema: str = "switchboard") -> None:
    row = conn.execute(
        """SELECT c.relpersistence FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s""",
        (schema, table),
    ).fetchone()
    assert row is not None, f"table {schema}.{table} does not exist"
    assert row[0] == "u", f"{schema}.{table} is not UNLOGGED (relpersistence={row[0]})"


def function_privs_are(conn: psycopg.Connection, signature: str, role: str,
                       privileges: list[str]) -> None:
    """signature like 'switchboard.rate_check(text, double precision, integer, integer)'."""
    have = [p for p in ("EXECUTE",)
            if conn.execute("SELECT has_function_privilege(%s, %s, %s)",
                            (role, signature, p)).fetchone()[0]]
    assert have == privileges, f"{role} on {signature}: {have} != {privileges}"


# --- Concurrency and LISTEN helpers (isolation-spec style) -------------------
# Added for the race and NOTIFY tests: N real connections, a Barrier so the
# racing statements start together, outcomes counted by the test.

def race(n: int, fn: Callable[[int, threading.Barrier], Any], timeout: float = 60.0) -> list[Any]:
    """Run fn(i, barrier) in n threads; return their results in order of i.

    Each fn opens its own connection and calls barrier.wait() right before the
    racing statement. An exception in any thread is re-raised here.
    """
    barrier = threading.Barrier(n, timeout=timeout)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = fn(i, barrier)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a racing thread did not finish"
    if errors:
        raise errors[0]
    return results


def listener(url: str, *channels: str) -> psycopg.Connection:
    """A separate autocommit connection LISTENing on channels (close it when done)."""
    c = psycopg.connect(url, autocommit=True)
    for ch in channels:
        c.execute(f'LISTEN "{ch}"')
    return c


def notifications(conn: psycopg.Connection, timeout: float, stop_after: int | None = None) -> list:
    """Notifications that arrive on conn within timeout seconds (or after stop_after of them)."""
    return list(conn.notifies(timeout=timeout, stop_after=stop_after))
