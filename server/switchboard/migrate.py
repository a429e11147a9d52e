"""Apply Switchboard's migrations with pgmigrate, serialised by an advisory lock.

The lock lives in pgmigrate.yml's ``session`` statements, so it is taken on the
migration connection *before* pgmigrate reads ``schema_version``. Replicas that
start at once queue on it; each loser then reads the schema at head and applies
nothing. The lock is transaction scoped and released by pgmigrate's COMMIT.
"""

from __future__ import annotations

import argparse
import logging
import os
from importlib import resources
from pathlib import Path

import pgmigrate

LOG = logging.getLogger("switchboard.migrate")


class MigrationError(RuntimeError):
    """pgmigrate refused or failed; the message says why."""


def db_dir() -> Path:
    """Where db/ (migrations/, functions/, migrations.yml) lives: inside the package.

    The wheel carries db/ as package data (switchboard/db); in the source tree
    server/switchboard/db is a link to the repository's db/. Either way
    importlib.resources finds it, from any working directory, with no setting.
    $SWITCHBOARD_DB_DIR still overrides it (a DBA testing another copy of db/).
    """
    env = os.environ.get("SWITCHBOARD_DB_DIR")
    if env:
        cand = Path(env)
        if not _is_db_dir(cand):
            raise MigrationError(f"SWITCHBOARD_DB_DIR={env} holds no migrations/ and migrations.yml")
        return cand
    packaged = resources.files("switchboard") / "db"
    # pgmigrate reads a directory; an installed wheel is a directory on disk (a
    # zipimport install would give a Traversable that is not a Path).
    if isinstance(packaged, Path) and _is_db_dir(packaged):
        return packaged
    raise MigrationError(
        f"the package's SQL files are missing ({packaged}); reinstall switchboard from its "
        "wheel or sdist, or set SWITCHBOARD_DB_DIR to a folder holding migrations/, "
        "functions/ and migrations.yml"
    )


def _is_db_dir(cand: Path) -> bool:
    return (cand / "migrations").is_dir() and (cand / "migrations.yml").is_file()


def _libpq_dsn(url: str) -> str:
    # pgmigrate adds application_name with psycopg2's make_dsn, which accepts URIs.
    return url


def status(url: str, base: Path | None = None) -> dict[int, bool]:
    """{version: applied?} for every migration file."""
    base = base or db_dir()
    conf = pgmigrate.get_config(str(base), argparse.Namespace(conn=_libpq_dsn(url), target="latest", base_dir=str(base)))
    state = pgmigrate.info(conf, stdout=False)
    return {int(v): info.meta["installed_on"] is not None for v, info in state.items()}


def known_versions(base: Path) -> list[int]:
    """The versions of the migration files in ``base``/migrations, in order."""
    out = []
    for p in (base / "migrations").glob("V*__*.sql"):
        num = p.name[1:].split("__", 1)[0]
        if num.isdigit():
            out.append(int(num))
    return sorted(out)


def missing_below_head(applied: list[int], known: list[int]) -> list[int]:
    """Known versions a database skipped: not applied, yet older than its newest applied one.

    pgmigrate only applies versions above the newest one applied, so a database that
    reached V0007 before V0005 was merged would silently never get V0005. Versions
    applied that this release does not know (a newer release's, during a rolling
    update) are fine: only gaps below the head count.
    """
    if not applied:
        return []
    head = max(applied)
    done = set(applied)
    return [v for v in known if v < head and v not in done]


def not_a_prefix_message(applied: list[int], missing: list[int]) -> str:
    names = ", ".join(f"V{v:04d}" for v in missing)
    return (f"refusing to migrate: this database has V{max(applied):04d} applied but not {names} "
            f"(its applied versions are not a prefix of the known ones; pgmigrate would skip "
            f"{'it' if len(missing) == 1 else 'them'} for good). Hint: a development database that "
            "ran a branch before an earlier-numbered migration was merged: recreate it, or have a DBA "
            "apply the missing file(s) by hand and record them in switchboard.schema_version.")


def migrate(url: str, base: Path | None = None) -> list[int]:
    """Apply every pending version (and then the function files). Returns the versions applied."""
    base = base or db_dir()
    args = argparse.Namespace(conn=_libpq_dsn(url), target="latest", base_dir=str(base))
    try:
        conf = pgmigrate.get_config(str(base), args)
        # The advisory lock is held from here (session statements) until COMMIT.
        state = pgmigrate._get_state(conf.base_dir, conf.baseline, conf.target,  # noqa: SLF001
                                     conf.schema, conf.cursor)
        applied = [int(v) for v, i in state.items() if i.meta["installed_on"] is not None]
        missing = missing_below_head(applied, known_versions(base))
        if missing:
            conf.conn_instance.rollback()  # releases the advisory lock
            conf.conn_instance.close()
            raise MigrationError(not_a_prefix_message(applied, missing))
        pending = sorted(int(v) for v, i in state.items() if i.meta["installed_on"] is None)
        pgmigrate.migrate(conf)
    except pgmigrate.MigrateError as exc:
        # pgmigrate logs the database's error and raises a generic one; the cause
        # (message, DETAIL, HINT: e.g. the shared-roles refusal) belongs in ours.
        cause = exc.__cause__ or exc.__context__
        detail = f": {str(cause).strip()}" if cause is not None else ""
        raise MigrationError(f"migration failed: {exc}{detail}") from exc
    except pgmigrate.MalformedMigration as exc:
        raise MigrationError(f"malformed migration: {exc}") from exc
    except pgmigrate.ConfigurationError as exc:
        raise MigrationError(f"pgmigrate configuration: {exc}") from exc
    if pending:
        LOG.info("applied migrations %s", pending)
    else:
        LOG.info("schema already at head; nothing applied")
    return pending
