"""The distribution is self-contained: the wheel carries db/ as package data, and
installed into a fresh virtualenv outside the source tree it migrates an empty
database from any directory, with no environment variable pointing at the SQL.

The wheel is built from a copy of the tree (so the build leaves nothing in the
worktree), its dependencies are installed the way the Dockerfile installs them
(pgmigrate with --no-deps beside psycopg2-binary: pgmigrate declares the
source-only psycopg2), and pip reaches the configured index for them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import psycopg
import pytest

from dbtools import catalog
from harness import ROOT
from switchboard import __version__

pytestmark = pytest.mark.slow

DB_FILES = ("migrations", "functions", "deploy", "revert", "verify", "tests")
DB_TOP = ("migrations.yml", "functions.lock", "sqitch.conf", "sqitch.plan")


def _source_db_files() -> set[str]:
    """Every file of the repository's db/ that the package must carry, as wheel paths."""
    out = {f"switchboard/db/{name}" for name in DB_TOP}
    for d in DB_FILES:
        out |= {f"switchboard/db/{d}/{p.name}" for p in (ROOT / "db" / d).glob("*.sql")}
    return out


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _clean_env() -> dict[str, str]:
    """The environment of a user who just installed the wheel: no SWITCHBOARD_* setting,
    no PYTHONPATH into the source tree. (PGOPTIONS stays: the suite's databases share
    one cluster, see the shared-roles check of V0004.)"""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SWITCHBOARD_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    # symlinks=False: server/switchboard/db (a link to db/) arrives as the files themselves,
    # which is also what the sdist holds.
    shutil.copytree(ROOT / "server", src / "server", symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
          "-w", str(dist), str(src)], cwd=src)
    (whl,) = dist.glob("switchboard-*.whl")
    return whl


def test_wheel_carries_every_sql_file(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    sql = sorted(n for n in names if n.endswith(".sql"))
    db = {n for n in names if n.startswith("switchboard/db/")}
    print(f"\n{wheel.name}: {len(names)} files, {len(sql)} .sql")
    for n in sorted(names):
        print(f"  {n}")
    assert db == _source_db_files()
    assert len(sql) == len([n for n in _source_db_files() if n.endswith(".sql")])
    # the pgmigrate configuration is the file itself, not a link into the source tree
    with zipfile.ZipFile(wheel) as z:
        conf = z.read("switchboard/db/migrations.yml").decode()
    assert "pg_advisory_xact_lock(hashtext('switchboard.migrate'))" in conf
    assert "afterAll" in conf
    assert "switchboard/static/index.html" in names
    # PEP 561: type checkers use the package's annotations (switchboard.api, handlers)
    assert "switchboard/py.typed" in names


def test_installed_wheel_migrates_an_empty_database_from_anywhere(
        wheel: Path, tmp_path: Path, empty_db: str, pg, template_db: str) -> None:  # type: ignore[no-untyped-def]
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path)
    py, env = str(venv / "bin" / "python"), _clean_env()
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pgmigrate = [d for d in deps if d.startswith("yandex-pgmigrate")]
    others = [d for d in deps if not d.startswith("yandex-pgmigrate")]
    pip = [py, "-m", "pip", "install", "-q"]
    _run([*pip, "psycopg2-binary>=2.9.11", "PyYAML>=6.0.3", "sqlparse>=0.4"], tmp_path, env)
    _run([*pip, "--no-deps", *pgmigrate], tmp_path, env)
    _run([*pip, *others], tmp_path, env)
    _run([*pip, "--no-deps", str(wheel)], tmp_path, env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exe = str(venv / "bin" / "switchboard")
    out = _run([exe, "--version"], elsewhere, env).stdout.strip()
    assert out == f"switchboard {__version__}"
    where = _run([py, "-c", "from switchboard.migrate import db_dir; print(db_dir())"],
                 elsewhere, env).stdout.strip()
    assert where.startswith(str(venv)) and where.endswith("site-packages/switchboard/db"), where

    env["DATABASE_URL"] = empty_db
    r = _run([exe, "migrate"], elsewhere, env)
    assert "applied migrations" in r.stderr, r.stderr
    files = sorted(int(p.name[1:5]) for p in (ROOT / "db/migrations").glob("V*.sql"))
    with psycopg.connect(empty_db) as c:
        versions = [v for (v,) in c.execute("SELECT version FROM switchboard.schema_version ORDER BY 1")]
    assert versions == files
    assert catalog(empty_db) == catalog(pg.url(template_db))
    again = _run([exe, "migrate"], elsewhere, env)
    assert "nothing applied" in again.stderr, again.stderr
