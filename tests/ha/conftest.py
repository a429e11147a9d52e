"""Fixtures for the multi-replica HA suite (helpers live in hakit.py).

- ``trio``: a module-scoped set of three replicas on a fresh clone of the
  migrated template, for tests that do not destroy replicas.
- ``fresh_trio``: a factory for destructive tests: a fresh database (or a given
  URL) and N replicas, all stopped at teardown.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import psycopg
import pytest
from hakit import Trio

_counter = itertools.count()


def _create_db(pg, name: str, template: str | None = None) -> str:  # type: ignore[no-untyped-def]
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
    return pg.url(name)


def drop_db(pg, name: str) -> None:  # type: ignore[no-untyped-def]
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def ha_db(pg, template_db) -> Iterator[str]:  # type: ignore[no-untyped-def]
    name = f"sb_ha{os.getpid()}_{next(_counter)}"
    url = _create_db(pg, name, template_db)
    yield url
    drop_db(pg, name)


@pytest.fixture(scope="module")
def trio(ha_db, tmp_path_factory) -> Iterator[Trio]:  # type: ignore[no-untyped-def]
    t = Trio(ha_db, tmp_path_factory.mktemp("ha-trio"))
    t.user("admin", "admin")
    t.start(3)
    try:
        yield t
    finally:
        t.stop_all()


@pytest.fixture
def fresh_trio(pg, template_db, tmp_path) -> Iterator[Callable[..., Trio]]:  # type: ignore[no-untyped-def]
    """Factory: fresh_trio(n=3, env=None, db_url=None) -> Trio with n replicas started."""
    made: list[Trio] = []
    dbs: list[str] = []

    def make(n: int = 3, env: dict[str, str] | None = None, db_url: str | None = None) -> Trio:
        if db_url is None:
            name = f"sb_hf{os.getpid()}_{next(_counter)}"
            db_url = _create_db(pg, name, template_db)
            dbs.append(name)
        t = Trio(db_url, tmp_path, env)
        made.append(t)
        t.user("admin", "admin")
        if n:
            t.start(n)
        return t

    yield make
    for t in made:
        t.stop_all()
    for name in dbs:
        drop_db(pg, name)


