"""A malformed numeric setting stops `switchboard serve` with one line, not a traceback.

The real CLI is started (no database is needed: settings are read before the
first connection). Every numeric SWITCHBOARD_* variable is read by config.py's
_int/_float, including uvicorn's connection limits (config.server_limits), which
were read only after the settings were checked and so died with a traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from harness import ROOT

BASE_ENV = {
    "PYTHONPATH": str(ROOT / "server"),
    "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",   # never reached
    "SWITCHBOARD_JWT_SECRET": "s" * 64,
}


def serve(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    return subprocess.run([sys.executable, "-m", "switchboard.cli", "serve", "--no-migrate", *extra],
                          env={**clean, **BASE_ENV, **env}, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("SWITCHBOARD_LIMIT_CONCURRENCY", "lots", "expected an integer in [16, 1000000]"),
    ("SWITCHBOARD_KEEPALIVE_TIMEOUT", "5s", "expected an integer in [1, 3600]"),
    ("SWITCHBOARD_MAX_HEADER_BYTES", "99999999", "expected an integer in [1024, 1048576]"),
    ("SWITCHBOARD_POOL_SIZE", "ten", "expected an integer in [1, 1000]"),
    ("SWITCHBOARD_POOL_TIMEOUT", "nan", "expected a number in [0.1, 300]"),
    ("SWITCHBOARD_LEASE_SECONDS", "1\n2", "expected a number in [1, 86400]"),
    ("SWITCHBOARD_HEADER_TIMEOUT", "0", "expected a number in [0.5, 3600]"),
    ("SWITCHBOARD_BODY_TIMEOUT", "forever", "expected a number in [0.5, 3600]"),
])
def test_a_bad_number_is_one_line_naming_the_variable_and_exit_2(name: str, value: str, expected: str) -> None:
    p = serve({name: value})
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"switchboard: {name}={value!r} is ") and expected in lines[0], lines[0]


def test_the_limits_are_checked_before_gunicorn_forks_its_workers() -> None:
    p = serve({"SWITCHBOARD_LIMIT_CONCURRENCY": "-1"}, "--workers", "2")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip() == ("switchboard: SWITCHBOARD_LIMIT_CONCURRENCY='-1' is out of range; "
                                "expected an integer in [16, 1000000], e.g. SWITCHBOARD_LIMIT_CONCURRENCY=4096")


@pytest.mark.parametrize("value", ["https://app.example/app", "app.example", "null", "https://app.example:99999"])
def test_an_allowed_origin_that_is_not_an_origin_is_refused(value: str) -> None:
    """Origins are compared exactly (scheme, host, port): an entry a browser can never
    send is a mistake to report, not a rule that silently matches nothing."""
    p = serve({"SWITCHBOARD_ALLOWED_ORIGINS": f"https://ok.example, {value}"})
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert "SWITCHBOARD_ALLOWED_ORIGINS" in p.stderr and repr(value) in p.stderr, p.stderr
