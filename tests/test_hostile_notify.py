"""Hostile NOTIFY payloads (issue 21, items 1-2): a bad payload is counted and
dropped, never a reconnect, never an unready replica, never unbounded memory.

The attacker is a LOGIN role with nothing but CONNECT (as in
test_trust_boundary.py): PostgreSQL lets it pg_notify anything on any channel.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import auth, make_user

INTRUDER = f"sb_hostile_{os.getpid()}"
CHANNELS = ("switchboard_events", "switchboard_control", "switchboard_runs")


@pytest.fixture
def intruder_url(pg, db: str) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute(f"DROP ROLE IF EXISTS {INTRUDER}")
        c.execute(f"CREATE ROLE {INTRUDER} LOGIN")
    yield db.replace("postgres@", f"{INTRUDER}@", 1)
    with psycopg.connect(pg.url(), autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (INTRUDER,))
        c.execute(f"DROP ROLE IF EXISTS {INTRUDER}")


def hostile_payloads() -> list[str]:
    deep_list = "[" * 100_000 + "]" * 100_000          # RecursionError in json.loads
    deep_obj = '{"id":' * 3000 + "1" + "}" * 3000
    return [
        deep_list[:7990],
        deep_obj[:7990],
        json.dumps({"id": 2**70}),                        # past bigint: the read would fail
        json.dumps({"eph": 2**64}),
        json.dumps({"tick": -(2**63) - 1}),
        json.dumps({"id": "12"}),
        json.dumps({"id": True}),
        json.dumps({"id": 1.5}),
        json.dumps({"eph": [1, 2, 3]}),
        '{"id": NaN}',
        "x" * 7999,
        "",
        "null",
        "[1, 2]",
        "\u2028\n\r forged log line",
        json.dumps({"kind": "user", "user_id": 12}),
        json.dumps({"kind": "user", "user_id": "not-a-uuid"}),
        json.dumps({"kind": "member", "room": ["lobby"], "user_id": str(uuid.uuid4())}),
        json.dumps({"kind": "member", "room": "r" * 129, "user_id": str(uuid.uuid4())}),
        json.dumps({"kind": "revoke", "jti": {"a": 1}}),
        json.dumps({"kind": "tool_result", "call_id": "zz", "replica_id": {"x": 1}}),
        json.dumps({"kind": "shutdown"}),
        json.dumps({"kind": {"nested": [[[[[[1]]]]]]}}),
    ]


def scrape(base: str) -> dict[tuple[str, tuple], float]:
    out: dict[tuple[str, tuple], float] = {}
    for fam in text_string_to_metric_families(httpx.get(base + "/metrics", timeout=10).text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(m: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in m.items() if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def test_hostile_payloads_on_every_channel_are_counted_not_fatal(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                                  intruder_url: str) -> None:
    make_user(db, "admin", role="admin")
    member = make_user(db, "mia")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.add_room_member('lobby', %s)", (member,))
    s = server_factory()
    h_admin = auth(s.login("admin"))
    ws = s.ws(s.login("mia"))
    assert ws.join("lobby")["event"] == "joined"
    before = scrape(s.base)

    stop = threading.Event()
    sent = {"n": 0}
    errors: list[BaseException] = []

    def attack() -> None:
        try:
            with psycopg.connect(intruder_url, autocommit=True) as c:
                payloads = hostile_payloads()
                while not stop.is_set():
                    for ch in CHANNELS:
                        for p in payloads:
                            c.execute("SELECT pg_notify(%s, %s)", (ch, p))
                            sent["n"] += 1
                    time.sleep(0.2)   # every payload on every channel, about 5 rounds a second
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    probes: list[int] = []
    published: list[int] = []
    received: list[int] = []
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            probes.append(httpx.get(s.base + "/healthz/ready", timeout=10).status_code)
            r = httpx.post(s.base + "/events", headers=h_admin, timeout=10,
                           json={"room": "lobby", "event": "real", "payload": {"n": len(published)}})
            assert r.status_code == 202, r.text
            published.append(r.json()["id"])
            time.sleep(0.25)
    finally:
        stop.set()
        attacker.join(10)
    assert not errors, errors
    assert sent["n"] > 500
    # Real events still arrive, each once; the replica stayed ready throughout.
    while len(received) < len(published):
        f = ws.recv_until(lambda f: f["event"] == "real", timeout=10)
        received.append(f["id"])
    assert sorted(received) == sorted(published)
    assert probes and set(probes) == {200}, probes
    after = scrape(s.base)
    assert value(after, "switchboard_listen_reconnects_total") == value(before, "switchboard_listen_reconnects_total") == 1
    rejected = {reason: value(after, "switchboard_notify_rejected_total", reason=reason)
                - value(before, "switchboard_notify_rejected_total", reason=reason)
                for reason in ("too_deep", "malformed", "out_of_range", "bad_number", "bad_type",
                               "bad_field", "too_large", "unknown_kind")}
    for reason in ("too_deep", "malformed", "out_of_range", "bad_number", "bad_type", "unknown_kind"):
        assert rejected[reason] > 0, rejected
    # The closed label set: nothing but the documented reasons ever appears.
    labels = {dict(ls).get("reason") for (n, ls) in after if n == "switchboard_notify_rejected_total"}
    assert labels <= {"too_large", "too_deep", "malformed", "bad_number", "out_of_range", "bad_type",
                      "bad_field", "unknown_kind", "unknown_channel"}, labels
    # Logged at most once a minute, not once per payload.
    assert s.log().count("refused a NOTIFY payload") <= 2
    assert not any(line.lstrip("\r ").startswith("forged log line") for line in s.log().splitlines())
    ws.close()


def test_forged_hints_naming_random_users_do_not_grow_memory(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                             intruder_url: str) -> None:
    make_user(db, "mo")
    s = server_factory()
    ws = s.ws(s.login("mo"))
    baseline = value(scrape(s.base), "switchboard_relay_cache_entries")
    with psycopg.connect(intruder_url, autocommit=True) as c:
        for _ in range(20):
            c.execute("SELECT pg_notify('switchboard_control', x) FROM (SELECT json_build_object("
                      "'kind', 'user', 'user_id', gen_random_uuid())::text AS x FROM generate_series(1, 1000)) s")
            c.execute("SELECT pg_notify('switchboard_events', json_build_object('eph', g)::text) "
                      "FROM generate_series(1, 1000) g")
    # Let the relay read them all (the /metrics gauges are sampled every second).
    time.sleep(3)
    entries = value(scrape(s.base), "switchboard_relay_cache_entries")
    assert entries <= baseline + 100, (baseline, entries)
    assert httpx.get(s.base + "/healthz/ready", timeout=10).status_code == 200
    ws.send({"action": "ping"})
    assert ws.recv_until(lambda f: f["event"] == "pong", timeout=10)["event"] == "pong"
    ws.close()
