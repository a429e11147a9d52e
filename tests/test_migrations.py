"""Migrations: the chain on an empty database, concurrency, idempotence."""

from __future__ import annotations

import subprocess
import sys

import psycopg

from harness import ROOT

MIGRATE = [sys.executable, "-m", "switchboard.cli", "migrate"]


def _versions(url: str) -> list[tuple[int, int]]:
    with psycopg.connect(url) as c:
        return c.execute(
            "SELECT version, count(*) FROM switchboard.schema_version GROUP BY 1 ORDER BY 1"
        ).fetchall()


def _migration_files() -> list[int]:
    return sorted(int(p.name[1:].split("__")[0]) for p in (ROOT / "db/migrations").glob("V*.sql"))


def _catalog(url: str) -> list[tuple]:
    """What the schema holds: relations, columns, functions (with bodies' md5), indexes."""
    with psycopg.connect(url) as c:
        rels = c.execute(
            """SELECT c.relname, c.relkind, c.relpersistence FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                WHERE n.nspname = 'switchboard' ORDER BY 1"""
        ).fetchall()
        cols = c.execute(
            """SELECT table_name, column_name, data_type, column_default
                 FROM information_schema.columns WHERE table_schema = 'switchboard'
                ORDER BY 1, 2"""
        ).fetchall()
        funcs = c.execute(
            """SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(p.prosrc),
                      p.prosecdef, p.proconfig
                 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                WHERE n.nspname = 'switchboard' ORDER BY 1, 2"""
        ).fetchall()
        idx = c.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'switchboard' ORDER BY 1"
        ).fetchall()
    return [rels, cols, funcs, idx]


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "server") + ":" + env.get("PYTHONPATH", "")
    return env


def test_chain_on_empty_database_matches_template(empty_db: str, pg, template_db: str) -> None:
    from switchboard.migrate import migrate

    applied = migrate(empty_db)
    assert applied == _migration_files()
    assert _versions(empty_db) == [(v, 1) for v in _migration_files()]
    assert _catalog(empty_db) == _catalog(pg.url(template_db))
    # a second run is a no-op
    assert migrate(empty_db) == []
    assert _versions(empty_db) == [(v, 1) for v in _migration_files()]


def test_five_concurrent_migrate_processes(empty_db: str) -> None:
    env = _env()
    env["DATABASE_URL"] = empty_db
    procs = [
        subprocess.Popen(MIGRATE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(5)
    ]
    outs = [p.communicate(timeout=120)[0].decode() for p in procs]
    codes = [p.returncode for p in procs]
    assert codes == [0] * 5, outs
    assert _versions(empty_db) == [(v, 1) for v in _migration_files()]
    # exactly one process applied the chain; the others found it at head
    applied = [o for o in outs if "applied migrations" in o]
    assert len(applied) == 1, outs
    # re-running is a no-op
    again = subprocess.run(MIGRATE, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "nothing applied" in again.stdout + again.stderr
    assert _versions(empty_db) == [(v, 1) for v in _migration_files()]


def test_plain_pgmigrate_cli_uses_the_repo_config(empty_db: str, pg, template_db: str) -> None:
    """`pgmigrate -d db -c <dsn> migrate` with no other flags finds pgmigrate.yml via
    db/migrations.yml (target, schema, session lock, afterAll functions)."""
    import shutil

    exe = shutil.which("pgmigrate")
    assert exe, "pgmigrate (yandex-pgmigrate) is not installed"
    p = subprocess.run([exe, "-vv", "-d", "db", "-c", empty_db, "migrate"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    # the session statements (two SETs, then SELECT pg_advisory_xact_lock(...)) ran first
    first = [line.rsplit(":", 1)[-1].strip() for line in p.stderr.splitlines()[:3]]
    assert first == ["SET", "SET", "SELECT 1"], p.stderr[:500]
    assert "db/functions/80_status.sql" in p.stderr  # afterAll applied the function files
    assert _versions(empty_db) == [(v, 1) for v in _migration_files()]
    assert _catalog(empty_db) == _catalog(pg.url(template_db))
