"""Fixtures for the PostgreSQL failover suite (tests/pgha/).

- ``patroni``: a real Patroni cluster for the module (etcd + 3 PostgreSQL 15
  nodes, synchronous_mode on), torn down afterwards.
- ``pgha_db``: a database on that cluster, migrated by the real migrations,
  with the least-privilege login the replicas use; its multi-host URL
  (``host=a,b,c``, ``target_session_attrs=read-write``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "ha"))   # hakit: the replica harness this suite extends
sys.path.insert(0, str(HERE))

from patroni_kit import PatroniCluster  # noqa: E402

from harness import APP_LOGIN  # noqa: E402


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    """The figures this run measured, whatever the output capture: failover and readiness
    times (seconds from the fault) and PgBouncer vs direct throughput."""
    from failover_load import FIGURES, dumps

    if not FIGURES:
        return
    terminalreporter.section("tests/pgha: measured figures")
    for name, figs in FIGURES.items():
        keep = {k: v for k, v in figs.items() if k not in ("status",)}
        terminalreporter.write_line(f"{name}: {dumps(keep)}")


@pytest.fixture(scope="module")
def patroni() -> Iterator[PatroniCluster]:
    cluster = PatroniCluster(3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def pgha_db(patroni: PatroniCluster) -> str:
    from switchboard.migrate import migrate

    leader = patroni.leader()
    assert leader is not None
    name = f"sb_pgha{os.getpid()}"
    with psycopg.connect(leader.url(), autocommit=True) as c:
        c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
        c.execute(f'CREATE DATABASE "{name}"')
    migrate(leader.url(name))
    with psycopg.connect(leader.url(name), autocommit=True) as c:
        c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
        # written by the pgha.job handler (pgha_handlers.py) through its own connection
        c.execute("CREATE TABLE public.pgha_job_log (n int NOT NULL, run_id bigint NOT NULL, "
                  "worker text NOT NULL, started_at timestamptz NOT NULL, ended_at timestamptz NOT NULL, "
                  "PRIMARY KEY (run_id, worker))")
    return patroni.multi_host_url(name)
