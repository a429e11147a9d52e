"""TLS to PostgreSQL with a private CA, as docs/how-to/operations/extending.md documents it.

A CA and a server certificate are made with openssl; a throwaway PostgreSQL
runs with ssl=on on that certificate and refuses every connection that is not
TLS (hostnossl ... reject). Then the real `switchboard` command, in its own
process:

- migrates and serves (readiness 200) with `sslmode=verify-full` and
  `sslrootcert=<CA>` in the URL, and every connection it holds is TLS;
- does the same with a plain URL and PGSSLMODE / PGSSLROOTCERT in the
  environment, which is exactly what the chart's `database.tls` renders;
- refuses a server whose certificate was not signed by the CA it was given
  (wrong CA: "certificate verify failed"), both to migrate and to serve;
- with verify-full refuses a host name the certificate does not name, which
  verify-ca (the chart's `database.tls.sslMode: verify-ca`) accepts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from harness import APP_LOGIN, ROOT, Server
from pg_tls_kit import TlsPostgres


@pytest.fixture(scope="module")
def tls_pg() -> Iterator[TlsPostgres]:
    server = TlsPostgres(dns=["localhost"])
    try:
        with psycopg.connect(server.admin_url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
        yield server
    finally:
        server.stop()


_n = iter(range(1000))


@pytest.fixture
def database(tls_pg: TlsPostgres) -> str:
    name = f"sb_tls_{next(_n)}"
    with psycopg.connect(tls_pg.admin_url(), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return name


def url(pg: TlsPostgres, db: str, user: str = "postgres", host: str = "localhost", **params: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in params.items())
    return f"postgresql://{user}@{host}:{pg.port}/{db}" + (f"?{query}" if query else "")


def switchboard(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("PGSSL")}
    full.update({"PYTHONPATH": str(ROOT / "server"), **env})
    return subprocess.run([sys.executable, "-m", "switchboard.cli", *args], env=full,
                          capture_output=True, text=True, timeout=180)


def grant_app(pg: TlsPostgres, db: str) -> None:
    with psycopg.connect(pg.admin_url(db), autocommit=True) as c:
        c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")


def ssl_of_app_connections(pg: TlsPostgres, db: str) -> list[tuple[bool, str]]:
    with psycopg.connect(pg.admin_url(db), autocommit=True) as c:
        return [(r[0], r[1]) for r in c.execute(
            "SELECT s.ssl, s.version FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
            "WHERE a.datname = current_database() AND a.usename = %s", (APP_LOGIN,))]


def test_plain_connections_are_refused(tls_pg: TlsPostgres, database: str) -> None:
    # The premise of the other tests: a connection that works here is TLS.
    with pytest.raises(psycopg.OperationalError, match="no encryption|SSL off"):
        psycopg.connect(url(tls_pg, database, sslmode="disable")).close()


def test_migrate_and_serve_with_verify_full_in_the_url(
    tls_pg: TlsPostgres, database: str, tmp_path: Path
) -> None:
    tls = {"sslmode": "verify-full", "sslrootcert": str(tls_pg.ca.cert)}
    done = switchboard("migrate", env={"DATABASE_URL": url(tls_pg, database, **tls)})
    assert done.returncode == 0, done.stderr
    grant_app(tls_pg, database)
    srv = Server(url(tls_pg, database, user=APP_LOGIN, **tls), log_dir=tmp_path,
                 env={"PGSSLMODE": "", "PGSSLROOTCERT": ""}).start(timeout=60)
    try:
        conns = ssl_of_app_connections(tls_pg, database)
        # The pool and the LISTEN connection: all of them TLS.
        assert len(conns) >= 2, conns
        assert all(ssl for ssl, _ in conns), conns
        assert {v for _, v in conns} <= {"TLSv1.2", "TLSv1.3"}
    finally:
        assert srv.terminate() == 0


def test_migrate_and_serve_with_the_environment_the_chart_sets(
    tls_pg: TlsPostgres, database: str, tmp_path: Path
) -> None:
    """database.tls renders PGSSLMODE and PGSSLROOTCERT; the URLs stay plain."""
    env = {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(tls_pg.ca.cert)}
    done = switchboard("migrate", env={"DATABASE_URL": url(tls_pg, database), **env})
    assert done.returncode == 0, done.stderr
    grant_app(tls_pg, database)
    srv = Server(url(tls_pg, database, user=APP_LOGIN), log_dir=tmp_path, env=env,
                 migrate=True).start(timeout=60)
    try:
        conns = ssl_of_app_connections(tls_pg, database)
        assert len(conns) >= 2 and all(ssl for ssl, _ in conns), conns
    finally:
        assert srv.terminate() == 0


@pytest.mark.parametrize("form", ["url", "environment"])
def test_a_server_signed_by_another_ca_is_refused(
    tls_pg: TlsPostgres, database: str, tmp_path: Path, form: str
) -> None:
    wrong = str(tls_pg.other_ca.cert)
    if form == "url":
        target, env = url(tls_pg, database, sslmode="verify-full", sslrootcert=wrong), {}
    else:
        target, env = url(tls_pg, database), {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": wrong}
    done = switchboard("migrate", env={"DATABASE_URL": target, **env})
    assert done.returncode != 0
    assert "certificate verify failed" in done.stderr, done.stderr[-2000:]
    # serve migrates at start-up: it stops there instead of serving.
    srv = Server(target, log_dir=tmp_path, env={"PGSSLMODE": "", "PGSSLROOTCERT": "", **env},
                 migrate=True)
    with pytest.raises(RuntimeError, match="exited"):
        srv.start(timeout=60)
    assert "certificate verify failed" in srv.log()
    with psycopg.connect(tls_pg.admin_url(database)) as c:
        assert c.execute("SELECT to_regnamespace('switchboard')").fetchone() == (None,)


def test_verify_full_checks_the_host_name_and_verify_ca_does_not(
    tls_pg: TlsPostgres, database: str
) -> None:
    """The certificate names localhost, not 127.0.0.1."""
    ca = str(tls_pg.ca.cert)
    done = switchboard("migrate", env={
        "DATABASE_URL": url(tls_pg, database, host="127.0.0.1", sslmode="verify-full", sslrootcert=ca)})
    assert done.returncode != 0
    assert 'does not match host name "127.0.0.1"' in done.stderr, done.stderr[-2000:]
    done = switchboard("migrate", env={
        "DATABASE_URL": url(tls_pg, database, host="127.0.0.1"),
        "PGSSLMODE": "verify-ca", "PGSSLROOTCERT": ca})
    assert done.returncode == 0, done.stderr
