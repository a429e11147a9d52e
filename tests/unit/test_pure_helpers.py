"""Unit tier: pure helpers of the release, config, rate-limit, lease and HTTP-input code.

No database, no processes: what each helper decides, from its inputs alone.
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from pathlib import Path

import falcon
import falcon.asgi
import falcon.testing
import pytest

from switchboard import config as cfgmod
from switchboard.domain_errors import AuthError
from switchboard.handlers import HandlerContext, _cap_deadline, _extend_deadline
from switchboard.http.common import check_fields, field_str, jsonable_row, read_json
from switchboard.migrate import db_dir, known_versions, missing_below_head, not_a_prefix_message
from switchboard.ratelimit import Decision, client_ip, ip_key
from switchboard.rows import RUN_FIELDS


# -- migrate: the prefix rule ---------------------------------------------------------------
def test_a_prefix_is_fine_and_an_empty_database_is_fine() -> None:
    assert missing_below_head([], [1, 2, 3]) == []
    assert missing_below_head([1, 2], [1, 2, 3]) == []
    assert missing_below_head([1, 2, 3], [1, 2, 3]) == []


def test_a_gap_below_the_head_is_reported_in_order() -> None:
    assert missing_below_head([1, 2, 3, 4, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]) == [5, 6]
    assert missing_below_head([1, 3], [1, 2, 3, 4]) == [2]


def test_versions_of_a_newer_release_are_not_a_gap() -> None:
    assert missing_below_head([1, 2, 3, 9], [1, 2, 3]) == []
    # ...but a known version below an unknown applied one is
    assert missing_below_head([1, 9], [1, 2, 3]) == [2, 3]


def test_the_refusal_names_the_head_the_missing_versions_and_a_hint() -> None:
    msg = not_a_prefix_message([1, 2, 7], [5, 6])
    assert "V0007 applied but not V0005, V0006" in msg and "Hint:" in msg
    assert "skip them" in msg
    assert "skip it" in not_a_prefix_message([1, 3], [2])


def test_known_versions_reads_the_file_names(tmp_path: Path) -> None:
    (tmp_path / "migrations").mkdir()
    for name in ("V0002__b.sql", "V0010__c.sql", "V0001__a.sql", "README.md", "Vx__bad.sql"):
        (tmp_path / "migrations" / name).write_text("")
    assert known_versions(tmp_path) == [1, 2, 10]


def test_the_package_finds_its_sql_with_no_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("SWITCHBOARD_DB_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # any working directory
    d = db_dir()
    assert d.name == "db" and d.parent.name == "switchboard"
    assert (d / "migrations.yml").is_file() and known_versions(d)[0] == 1
    monkeypatch.setenv("SWITCHBOARD_DB_DIR", str(tmp_path))
    with pytest.raises(Exception, match="holds no migrations"):
        db_dir()


# -- config ---------------------------------------------------------------------------------
def test_numbers_are_range_checked_with_the_setting_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SB_X", "7")
    assert cfgmod._int("SB_X", 1, 0, 10) == 7
    monkeypatch.setenv("SB_X", "")
    assert cfgmod._int("SB_X", 3, 0, 10) == 3
    for bad, why in (("11", "out of range"), ("1.5", "not an integer"), ("x", "not an integer")):
        monkeypatch.setenv("SB_X", bad)
        with pytest.raises(cfgmod.ConfigError, match=f"SB_X=.*{why}"):
            cfgmod._int("SB_X", 1, 0, 10)
    monkeypatch.setenv("SB_X", "0.25")
    assert cfgmod._float("SB_X", 1.0, 0.1, 5) == 0.25


def test_prepare_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SWITCHBOARD_PREPARE_THRESHOLD", raising=False)
    assert cfgmod.prepare_threshold(None) == 5
    assert cfgmod.prepare_threshold("postgresql://listen") is None  # a pooler is in front
    monkeypatch.setenv("SWITCHBOARD_PREPARE_THRESHOLD", "off")
    assert cfgmod.prepare_threshold(None) is None
    monkeypatch.setenv("SWITCHBOARD_PREPARE_THRESHOLD", "0")
    assert cfgmod.prepare_threshold("x") == 0
    monkeypatch.setenv("SWITCHBOARD_PREPARE_THRESHOLD", "-1")
    with pytest.raises(cfgmod.ConfigError, match="out of range"):
        cfgmod.prepare_threshold(None)


def test_config_requires_a_long_secret_outside_dev(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://x@127.0.0.1/x")
    monkeypatch.setenv("SWITCHBOARD_JWT_SECRET", "short")
    with pytest.raises(cfgmod.ConfigError, match="at least 32"):
        cfgmod.Config.from_env()
    assert cfgmod.Config.from_env(dev=True).jwt_secret == "short"
    monkeypatch.setenv("SWITCHBOARD_JWT_SECRET", "s" * 32)
    monkeypatch.setenv("SWITCHBOARD_TRUSTED_PROXIES", "10.0.0.0/8, not-an-ip")
    with pytest.raises(cfgmod.ConfigError, match="'not-an-ip' is not an IP or CIDR"):
        cfgmod.Config.from_env()


# -- rate limits ----------------------------------------------------------------------------
def test_ipv6_clients_share_a_bucket_per_64_and_mapped_ipv4_is_ipv4() -> None:
    assert ip_key("2001:db8:1:2:aaaa::1") == ip_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"
    assert ip_key("2001:db8:1:3::1") != ip_key("2001:db8:1:2::1")
    assert ip_key("::ffff:203.0.113.7") == "203.0.113.7"
    assert ip_key("203.0.113.7") == "203.0.113.7"
    assert ip_key("unknown") == "unknown"


@dataclass
class _Req:
    remote_addr: str | None
    xff: str | None = None

    def get_header(self, name: str) -> str | None:
        return self.xff if name == "X-Forwarded-For" else None


def test_client_ip_trusts_forwarded_for_only_from_trusted_proxies() -> None:
    trusted = [ipaddress.ip_network("10.0.0.0/8")]
    assert client_ip(_Req("203.0.113.5", "1.2.3.4"), trusted) == "203.0.113.5"  # not a proxy: ignored
    assert client_ip(_Req("10.0.0.2", "1.2.3.4"), []) == "10.0.0.2"              # nothing trusted
    # right-most untrusted hop: a client cannot forge its way past the proxy's own append
    assert client_ip(_Req("10.0.0.2", "6.6.6.6, 1.2.3.4, 10.0.0.9"), trusted) == "1.2.3.4"
    assert client_ip(_Req("10.0.0.2", "garbage"), trusted) == "10.0.0.2"
    assert client_ip(_Req(None), trusted) == "unknown"


def test_decision_headers_follow_the_ietf_draft() -> None:
    ok = Decision(True, 4, 0, 12_001, "login-user", 5, 60)
    assert ok.headers() == {"RateLimit-Policy": '"login-user";q=5;w=60', "RateLimit": '"login-user";r=4;t=13'}
    denied = Decision(False, 0, 1, 60_000, "login-ip", 10, 60)
    assert denied.headers()["Retry-After"] == "1"  # never 0: at least one second


# -- lease arithmetic -----------------------------------------------------------------------
def _run(**over: object) -> dict[str, object]:
    row: dict[str, object] = {name: None for name in RUN_FIELDS}
    row.update({"handler": "h", "attempt": 1, "max_attempts": 3, "args": {}})
    row.update(over)
    return row


def test_a_deadline_is_extended_by_the_heartbeat_and_capped_by_the_shutdown() -> None:
    ctx = HandlerContext(_run(id=1), None, lease_seconds=30)  # type: ignore[arg-type]  # no db use
    start = ctx.seconds_left()
    assert 29 < start <= 30
    _extend_deadline(ctx, time.time() + 60)
    assert 59 < ctx.seconds_left() <= 60
    _cap_deadline(ctx, time.time() + 5)           # SIGTERM: the grace is shorter
    assert 4 < ctx.seconds_left() <= 5
    _cap_deadline(ctx, time.time() + 50)          # a cap never extends
    assert ctx.seconds_left() <= 5
    _cap_deadline(ctx, time.time() - 10)
    assert ctx.seconds_left() == 0.0              # never negative
    assert ctx.deadline.tzinfo is not None


def test_a_context_reads_defaults_from_a_sparse_row() -> None:
    ctx = HandlerContext(_run(id=7, attempt=None, max_attempts=None, args=None), None,  # type: ignore[arg-type]
                         lease_seconds=1)
    assert (ctx.attempt, ctx.max_attempts, ctx.args, ctx.task_id) == (1, 1, {}, None)
    assert not ctx.lease_lost.is_set()


# -- HTTP input helpers (in-process) --------------------------------------------------------
def test_field_str_and_check_fields() -> None:
    body = {"name": "x", "empty": "", "n": 3, "nul": None}
    assert field_str(body, "name") == "x"
    assert field_str(body, "missing", required=False) is None
    assert field_str(body, "nul", nullable=True) is None
    for name in ("empty", "n", "missing"):
        with pytest.raises(falcon.HTTPError) as e:
            field_str(body, name)
        assert e.value.status == falcon.HTTP_422 and f"'{name}'" in (e.value.description or "")
    with pytest.raises(falcon.HTTPError):
        field_str({"name": "x" * 11}, "name", max_len=10)
    check_fields({"a": 1}, {"a", "b"})
    with pytest.raises(falcon.HTTPError) as e:
        check_fields({"a": 1, "zz": 2}, {"a"})
    assert "zz" in (e.value.description or "")


def test_jsonable_row_makes_uuids_strings_and_leaves_the_rest() -> None:
    import uuid

    u = uuid.uuid4()
    assert jsonable_row({"id": u, "n": 1, "s": "x", "none": None}) == {"id": str(u), "n": 1, "s": "x", "none": None}


class _Echo:
    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        resp.media = await read_json(req, 64)


@pytest.mark.parametrize(("body", "status"), [
    (b'{"a": 1}', falcon.HTTP_200), (b"[1]", falcon.HTTP_400), (b"{", falcon.HTTP_400),
    (b'{"a": "' + b"x" * 100 + b'"}', falcon.HTTP_413),
])
def test_read_json_bounds_and_shapes_the_body(body: bytes, status: str) -> None:
    app = falcon.asgi.App()
    app.add_route("/echo", _Echo())
    r = falcon.testing.TestClient(app).simulate_post("/echo", body=body,
                                                     headers={"Content-Type": "application/json"})
    assert r.status == status, r.text


def test_auth_error_is_a_domain_error_with_a_bearer_challenge() -> None:
    e = AuthError("The token is invalid.")
    assert e.headers == {"WWW-Authenticate": 'Bearer error="invalid_token"'}
    assert str(e) == e.description == "The token is invalid."
