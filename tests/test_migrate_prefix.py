"""`switchboard migrate` refuses a database whose applied versions are not a prefix
of the versions it knows, instead of letting pgmigrate skip the gap for good.

The case from the field: a development database reached V0007 on a branch before
V0005/V0006 were merged; pgmigrate only applies versions above the newest one
applied, so V0005 and V0006 would never run there.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg

from harness import ROOT
from switchboard.migrate import known_versions, migrate

MIGRATE = [sys.executable, "-m", "switchboard.cli", "migrate"]


def _versions(url: str) -> list[int]:
    with psycopg.connect(url) as c:
        return [v for (v,) in c.execute("SELECT version FROM switchboard.schema_version ORDER BY 1")]


def _cli(url: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "server") + ":" + env.get("PYTHONPATH", "")
    env["DATABASE_URL"] = url
    env.pop("SWITCHBOARD_MIGRATION_DATABASE_URL", None)
    return subprocess.run(MIGRATE, env=env, capture_output=True, text=True, timeout=120)


def test_a_gap_below_the_head_is_refused_with_the_missing_versions(empty_db: str) -> None:
    known = known_versions(ROOT / "db")
    assert migrate(empty_db) == known
    # the out-of-order database: V0005 and V0006 never applied, V0007 and later were
    with psycopg.connect(empty_db) as c:
        c.execute("DELETE FROM switchboard.schema_version WHERE version IN (5, 6)")
    before = _versions(empty_db)
    r = _cli(empty_db)
    assert r.returncode == 1, r.stdout + r.stderr
    err = r.stderr
    assert f"has V{max(known):04d} applied but not V0005, V0006" in err, err
    assert "not a prefix of the known ones" in err and "Hint:" in err, err
    assert "Traceback" not in err, err
    assert _versions(empty_db) == before  # nothing applied, nothing recorded
    # the advisory lock was released with the refusal: another migrate is not stuck behind it
    with psycopg.connect(empty_db) as c:
        assert c.execute("SELECT pg_try_advisory_xact_lock(hashtext('switchboard.migrate'))").fetchone() == (True,)


def test_versions_of_a_newer_release_are_not_a_gap(empty_db: str) -> None:
    """A rolling update: the database already holds a version this release does not
    know (an older replica restarting). That is a prefix plus more: migrate applies nothing."""
    known = known_versions(ROOT / "db")
    assert migrate(empty_db) == known
    with psycopg.connect(empty_db) as c:
        c.execute("INSERT INTO switchboard.schema_version (version, description, type, installed_by) "
                  "VALUES (9999, 'from a newer release', 'auto', current_user)")
    r = _cli(empty_db)
    assert r.returncode == 0, r.stderr
    assert "nothing applied" in r.stderr
    assert _versions(empty_db) == [*known, 9999]
