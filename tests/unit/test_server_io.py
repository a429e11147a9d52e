"""SWITCHBOARD_UVLOOP: asyncio + h11 by default, uvloop + httptools when on and
either is not importable; `serve` and the gunicorn worker take the same settings."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest


@pytest.mark.parametrize(("raw", "want"), [(None, False), ("on", True), ("1", True), ("off", False),
                                           ("OFF", False), ("no", False), (" false ", False)])
def test_uvloop_switch(monkeypatch: pytest.MonkeyPatch, raw: str | None, want: bool) -> None:
    from switchboard.config import uvloop_enabled

    if raw is None:
        monkeypatch.delenv("SWITCHBOARD_UVLOOP", raising=False)
    else:
        monkeypatch.setenv("SWITCHBOARD_UVLOOP", raw)
    assert uvloop_enabled() is want


def test_a_bad_value_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchboard.config import Config, ConfigError, uvloop_enabled

    monkeypatch.setenv("SWITCHBOARD_UVLOOP", "sometimes")
    with pytest.raises(ConfigError, match="SWITCHBOARD_UVLOOP"):
        uvloop_enabled()
    monkeypatch.setenv("DATABASE_URL", "postgresql://x/y")
    monkeypatch.setenv("SWITCHBOARD_JWT_SECRET", "s" * 40)
    with pytest.raises(ConfigError, match="SWITCHBOARD_UVLOOP"):
        Config.from_env()


@pytest.mark.parametrize("installed", [set(), {"uvloop"}, {"httptools"}, {"uvloop", "httptools"}])
def test_server_io_falls_back_unless_both_are_importable(monkeypatch: pytest.MonkeyPatch,
                                                         installed: set[str]) -> None:
    from switchboard.config import server_io

    real = importlib.util.find_spec

    def find_spec(name: str, *a: Any) -> Any:
        if name in ("uvloop", "httptools"):
            return object() if name in installed else None
        return real(name, *a)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    fast = {"loop": "uvloop", "http": "httptools"}
    slow = {"loop": "asyncio", "http": "h11"}
    assert server_io(True) == (fast if installed == {"uvloop", "httptools"} else slow)
    assert server_io(False) == slow


def test_gunicorn_worker_uses_the_same_settings() -> None:
    from switchboard.config import server_io, uvloop_enabled
    from switchboard.gunicorn_worker import Worker
    from switchboard.http.protocol import H11Protocol

    io = server_io(uvloop_enabled())
    want = {"loop": io["loop"], "http": H11Protocol if io["http"] == "h11" else io["http"]}
    assert {k: Worker.CONFIG_KWARGS[k] for k in ("loop", "http")} == want
