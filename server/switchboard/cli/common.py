"""What every command shares: the usage exit code, one-line failures, required
settings, and migrating (``switchboard migrate``, and serve and dev before they start)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

EXIT_USAGE = 2


def _die(msg: str, code: int = EXIT_USAGE) -> NoReturn:
    print(f"switchboard: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _require_env(name: str) -> str:
    val = os.environ.get(name)
    if not val:
        _die(f"{name} is not set (required); see docs/reference/configuration.md")
    return val


def _migrate(url: str) -> list[int]:
    from ..migrate import MigrationError, migrate

    try:
        return migrate(url)
    except MigrationError as exc:
        _die(str(exc), 1)
    except Exception as exc:  # connection errors: one line, no traceback
        _die(f"migration failed: {str(exc).strip()}", 1)


def cmd_migrate(args: argparse.Namespace) -> int:
    url = os.environ.get("SWITCHBOARD_MIGRATION_DATABASE_URL") or _require_env("DATABASE_URL")
    _migrate(url)
    return 0
