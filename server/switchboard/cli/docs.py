"""``switchboard docs``: serve the documentation site (mkdocs.yml, docs/) locally with
``mkdocs serve``, which rebuilds a page when it is saved. Works from a source checkout:
the site's sources are not in the wheel."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from .common import _die

MKDOCS_HINT = ("mkdocs is not installed: pip install 'mkdocs>=1.6' 'mkdocs-material>=9.5' "
               "(both are in the test extra: pip install -e '.[test]')")


def find_config(start: Path) -> Path | None:
    """mkdocs.yml of the checkout ``start`` is in (or under), else of the one this package runs from."""
    package_checkout = Path(__file__).resolve().parents[3]
    for d in [start, *start.parents, package_checkout]:
        if (d / "mkdocs.yml").is_file() and (d / "docs").is_dir():
            return d / "mkdocs.yml"
    return None


def cmd_docs(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        _die(MKDOCS_HINT)
    config = Path(args.config_file) if args.config_file else find_config(Path.cwd())
    if config is None or not config.is_file():
        _die("no mkdocs.yml found: run `switchboard docs` inside a Switchboard checkout, "
             "or pass --config-file")
    cmd = [sys.executable, "-m", "mkdocs", "serve", "--config-file", str(config), "--dev-addr", args.addr]
    print(f"switchboard docs: serving {config.parent / 'docs'} on http://{args.addr}/ (Ctrl-C stops)",
          flush=True)
    # exec, not a child: a SIGTERM to `switchboard docs` (a test stopping it, a process
    # manager) reaches mkdocs itself, which a child process would outlive as an orphan.
    os.execve(sys.executable, cmd, {**os.environ, "NO_MKDOCS_2_WARNING": "1"})
