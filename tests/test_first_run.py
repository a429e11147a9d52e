"""A newcomer's first run of scripts/test.sh, as an unprivileged user without sudo.

The script must say what to install (or to make a virtualenv) and stop, not
fail inside apt-get or pip. A private mount namespace hides this machine's
PostgreSQL from the script; runuser drops to `nobody`, who has no sudo.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from harness import ROOT

SCRIPT = ROOT / "scripts" / "test.sh"


def as_nobody(setup: str) -> subprocess.CompletedProcess:
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("runuser"):
        pytest.fail("simulating a non-root first run needs root, unshare and runuser (CI has them)",
                    pytrace=False)
    script = (f"mount --make-rprivate / && {setup} runuser -u nobody -- "
              f"env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp bash {SCRIPT} -q </dev/null")
    return subprocess.run(["unshare", "-m", "bash", "-c", script], capture_output=True, text=True,
                          timeout=60)


def test_without_postgresql_it_says_what_to_install() -> None:
    out = as_nobody("mount -t tmpfs none /usr/lib/postgresql &&")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "apt-get install postgresql postgresql-contrib" in out.stderr
    assert "nobody can neither install them" in out.stderr
    assert "Permission denied" not in out.stderr and "E: " not in out.stderr


def test_on_debians_python_it_asks_for_a_virtualenv() -> None:
    if not os.path.exists("/usr/lib/python3/dist-packages") or not shutil.which("python3", path="/usr/bin"):
        pytest.fail("no Debian python3 in /usr/bin to try this with", pytrace=False)
    out = as_nobody("")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "python3 -m venv .venv && . .venv/bin/activate" in out.stderr
    assert "externally-managed-environment" not in out.stderr  # pip never ran
