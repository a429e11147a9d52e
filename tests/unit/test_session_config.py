"""SWITCHBOARD_SESSION_MAX_LIFETIME and the refresh grace (issue 32): defaults, bounds,
the rule max >= TTL, and the 0.2 name of the grace as an alias."""

from __future__ import annotations

import os

import pytest

from switchboard.config import Config, ConfigError

BASE = {"DATABASE_URL": "postgresql://x@localhost/x", "SWITCHBOARD_JWT_SECRET": "s" * 40}


def config(monkeypatch: pytest.MonkeyPatch, **env: str) -> Config:
    for k in list(os.environ):
        if k.startswith("SWITCHBOARD_SESSION") or k.startswith("SWITCHBOARD_REFRESH"):
            monkeypatch.delenv(k)
    for k, v in {**BASE, **env}.items():
        monkeypatch.setenv(k, v)
    return Config.from_env()


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    c = config(monkeypatch)
    assert (c.session_ttl, c.session_max_lifetime, c.session_refresh_grace) == (14 * 86400, 30 * 86400, 60.0)
    assert c.refresh_session_burst >= 10 and c.refresh_ip_burst >= c.refresh_session_burst


def test_max_lifetime_shorter_than_the_ttl_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"SWITCHBOARD_SESSION_MAX_LIFETIME=3600 is shorter than "
                                          r"SWITCHBOARD_SESSION_TTL=7200"):
        config(monkeypatch, SWITCHBOARD_SESSION_TTL="7200", SWITCHBOARD_SESSION_MAX_LIFETIME="3600")
    with pytest.raises(ConfigError, match="SWITCHBOARD_SESSION_MAX_LIFETIME.*out of range"):
        config(monkeypatch, SWITCHBOARD_SESSION_MAX_LIFETIME=str(400 * 86400))
    assert config(monkeypatch, SWITCHBOARD_SESSION_TTL="60", SWITCHBOARD_SESSION_MAX_LIFETIME="60").session_max_lifetime == 60


def test_a_ttl_longer_than_the_default_max_raises_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """An installation that set a 60-day TTL before max lifetimes existed still starts."""
    c = config(monkeypatch, SWITCHBOARD_SESSION_TTL=str(60 * 86400))
    assert c.session_max_lifetime == 60 * 86400


def test_the_race_window_name_is_an_alias_of_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    assert config(monkeypatch, SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS="0").session_refresh_grace == 0
    assert config(monkeypatch, SWITCHBOARD_SESSION_REFRESH_RACE_SECONDS="5",
                  SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS="90").session_refresh_grace == 90
    with pytest.raises(ConfigError, match="SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS"):
        config(monkeypatch, SWITCHBOARD_SESSION_REFRESH_GRACE_SECONDS="3600")
