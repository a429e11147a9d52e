"""Test harness: one real PostgreSQL per session, a migrated template, clones.

- ``pg``: the session's ThrowawayPostgres (root-safe: runs postgres as an
  unprivileged OS user when the suite runs as root, as CI does).
- ``template_db``: a database migrated once with the real migrations.
- ``db``: a fresh clone of the template for tests that commit (races,
  LISTEN/NOTIFY, server processes). Dropped afterwards.
- ``conn``: a connection to a shared migrated database inside a transaction
  that is rolled back at the end (pure function tests).
- ``app_url`` / ``app_conn``: connect as a login role that holds only
  ``switchboard_app`` — the least-privilege role the server uses.
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from switchboard.migrate import migrate  # noqa: E402
from switchboard.pgtest import ThrowawayPostgres  # noqa: E402

from harness import APP_LOGIN, app_url_for  # noqa: E402

# The suite installs Switchboard into many databases of one cluster (a template,
# its clones, fresh databases for migration/sqitch tests) that all trust each
# other, so it opts in to sharing the cluster-wide roles (docs/explanation/security.md).
# tests/test_trust_boundary.py overrides it to prove the refusal.
os.environ["PGOPTIONS"] = (os.environ.get("PGOPTIONS", "") + " -c switchboard.shared_roles=on").strip()
_counter = itertools.count()


@pytest.fixture(scope="session")
def pg() -> Iterator[ThrowawayPostgres]:
    server = ThrowawayPostgres()
    try:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
        yield server
    finally:
        server.stop()


def _create_db(pg: ThrowawayPostgres, name: str, template: str | None = None) -> str:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        if template:
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        else:
            c.execute(f'CREATE DATABASE "{name}"')
    return pg.url(name)


def drop_db(pg: ThrowawayPostgres, name: str) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def template_db(pg: ThrowawayPostgres) -> str:
    url = _create_db(pg, "sb_template")
    migrate(url)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
    return "sb_template"


@pytest.fixture
def db(pg: ThrowawayPostgres, template_db: str) -> Iterator[str]:
    """A fresh migrated database (URL, superuser) for a test that commits."""
    name = f"sb_t{os.getpid()}_{next(_counter)}"
    url = _create_db(pg, name, template_db)
    yield url
    drop_db(pg, name)


@pytest.fixture
def empty_db(pg: ThrowawayPostgres) -> Iterator[str]:
    """A genuinely empty database (no Switchboard objects at all)."""
    name = f"sb_e{os.getpid()}_{next(_counter)}"
    url = _create_db(pg, name)
    yield url
    drop_db(pg, name)


@pytest.fixture(scope="session")
def shared_db(pg: ThrowawayPostgres, template_db: str) -> str:
    return _create_db(pg, "sb_shared", template_db)


@pytest.fixture
def conn(shared_db: str) -> Iterator[psycopg.Connection]:
    """A superuser connection in a transaction that is always rolled back."""
    with psycopg.connect(shared_db) as c:
        yield c
        c.rollback()


@pytest.fixture
def app_url(db: str) -> str:
    return app_url_for(db)


# -- server processes -----------------------------------------------------------------
VIA_PGBOUNCER = os.environ.get("SWITCHBOARD_TEST_PGBOUNCER", "") == "1"


@pytest.fixture(scope="session")
def pgbouncer(pg: ThrowawayPostgres) -> Iterator[object]:
    """A real PgBouncer (transaction mode) in front of the session's PostgreSQL."""
    from pgbouncer_kit import PgBouncer

    b = PgBouncer(pg.port).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def server_factory(db: str, tmp_path, request):  # type: ignore[no-untyped-def]
    """Start real `switchboard serve` processes against this test's database.

    With SWITCHBOARD_TEST_PGBOUNCER=1 every server's DATABASE_URL goes through a real
    PgBouncer in transaction mode and its LISTEN connection goes direct
    (SWITCHBOARD_LISTEN_DATABASE_URL), as docs/how-to/operations/poolers.md recommends."""
    from harness import Server

    started: list = []
    bouncer = request.getfixturevalue("pgbouncer") if VIA_PGBOUNCER else None

    def start(env: dict | None = None, url: str | None = None, **kw):  # type: ignore[no-untyped-def]
        if bouncer is not None and url is None:
            direct = app_url_for(db)
            url = bouncer.url_for(direct)
            env = {"SWITCHBOARD_LISTEN_DATABASE_URL": direct, **(env or {})}
        s = Server(url or app_url_for(db), env=env, log_dir=tmp_path, **kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc and s.proc.poll() is None:
            try:
                s.terminate(timeout=20)
            except Exception:
                s.kill()
