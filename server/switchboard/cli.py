"""The `switchboard` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys

EXIT_USAGE = 2


def _die(msg: str, code: int = EXIT_USAGE) -> None:
    print(f"switchboard: {msg}", file=sys.stderr)
    raise SystemExit(code)


def _require_env(name: str) -> str:
    val = os.environ.get(name)
    if not val:
        _die(f"{name} is not set (required); see README 'Configuration'")
    return val  # type: ignore[return-value]


def cmd_migrate(args: argparse.Namespace) -> int:
    from .migrate import MigrationError, migrate

    url = os.environ.get("SWITCHBOARD_MIGRATION_DATABASE_URL") or _require_env("DATABASE_URL")
    try:
        migrate(url)
    except MigrationError as exc:
        _die(str(exc), 1)
    except Exception as exc:  # psycopg2 connection errors etc.: one line, no traceback
        _die(f"migration failed: {exc}".strip(), 1)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="switchboard", description=__doc__)
    p.add_argument("--log-level", default=os.environ.get("SWITCHBOARD_LOG_LEVEL", "INFO"))
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("migrate", help="apply migrations and functions under an advisory lock")
    m.set_defaults(func=cmd_migrate)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
