"""/metrics on prometheus-client: histograms that move, database gauges, and one
scrape of a `serve --workers 2` pod that sums both workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from harness import FAST_ENV, JWT_SECRET, ROOT, app_url_for, auth, free_port, make_user, probe_token
from monitoring import PROMETHEUS_SERIES, exported_name, used_metrics


def scrape(base: str) -> dict[str, list]:
    """{family name: samples} of one scrape (counter families keep their _total name)."""
    r = httpx.get(base + "/metrics", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(r.text):
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = fam.samples
    return out


def total(samples: list, sample_name: str, **labels: str) -> float:
    return sum(s.value for s in samples
               if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_every_metric_the_alerts_and_dashboard_use_is_exported(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    s = server_factory()
    httpx.get(s.base + "/healthz/ready")  # one request, so labelled families have samples
    families = scrape(s.base)
    used = used_metrics()
    assert len(used) > 15
    missing = {name: sorted(where) for name, where in used.items()
               if exported_name(name) not in families and name not in PROMETHEUS_SERIES}
    assert missing == {}
    # Gauges and histograms the alerts read have values right away.
    for gauge in ("switchboard_ready", "switchboard_listen_connected", "switchboard_expired_leases",
                  "switchboard_runs_due_age_seconds", "switchboard_event_backlog_seconds",
                  "switchboard_event_retention_seconds", "switchboard_live_replicas"):
        assert len(families[gauge]) == 1, gauge
    assert families["switchboard_ready"][0].value == 1.0
    assert families["switchboard_listen_connected"][0].value == 1.0
    assert families["switchboard_live_replicas"][0].value == 1.0
    assert families["switchboard_event_retention_seconds"][0].value == 300.0
    # No *_created noise.
    assert not [n for n in families if n.endswith("_created")]


def test_latency_histograms_move(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "alice")
    s = server_factory()
    h = auth(s.login("admin"))
    ws = s.ws(s.login("alice"))
    alice = ws.hello["payload"]["user_id"]
    for n in range(3):
        r = httpx.post(s.base + "/events", headers=h, json={"user_id": alice, "event": "e", "payload": {"n": n}})
        assert r.status_code == 202
        ws.recv_until(lambda f, eid=r.json()["id"]: f.get("id") == eid)
    ws.close()
    t = httpx.post(s.base + "/tasks", headers=h, json={"name": "m", "handler": "noop"})
    assert t.status_code == 201, t.text
    assert httpx.post(f"{s.base}/tasks/{t.json()['id']}/trigger", headers=h).status_code == 202
    deadline = time.time() + 10
    while time.time() < deadline:
        fam = scrape(s.base)
        if total(fam["switchboard_claim_latency_seconds"], "switchboard_claim_latency_seconds_count") >= 1:
            break
        time.sleep(0.1)
    delivery = fam["switchboard_delivery_latency_seconds"]
    assert total(delivery, "switchboard_delivery_latency_seconds_count") == 3
    # Delivered on loopback within a second, each of them.
    assert total(delivery, "switchboard_delivery_latency_seconds_bucket", le="1.0") == 3
    # One observation per claimed run (ours, and the built-in maintenance task's).
    claim = fam["switchboard_claim_latency_seconds"]
    claimed = total(fam["switchboard_claims_total"], "switchboard_claims_total")
    assert total(fam["switchboard_claims_total"], "switchboard_claims_total", handler="noop") == 1
    assert total(claim, "switchboard_claim_latency_seconds_count") == claimed >= 1
    assert total(claim, "switchboard_claim_latency_seconds_bucket", le="+Inf") == claimed
    requests = fam["switchboard_http_request_duration_seconds"]
    assert total(requests, "switchboard_http_request_duration_seconds_count",
                 route="/events", method="POST") == 3
    assert total(fam["switchboard_http_requests_total"], "switchboard_http_requests_total",
                 route="/events", method="POST", status="202") == 3


def test_database_gauges_follow_the_queue(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    s = server_factory(env={"SWITCHBOARD_SCHEDULER": "0"})
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('noop', '{}', now() - interval '90 seconds')")
        c.execute("SELECT switchboard.enqueue('noop', '{}', now() + interval '1 hour')")
        # A run whose worker died: running, lease expired.
        dead = c.execute("SELECT id FROM switchboard.enqueue('noop', '{}', now() - interval '3 minutes')"
                         ).fetchone()[0]
        c.execute("""UPDATE switchboard.task_runs SET status = 'running', worker = 'gone',
                            started_at = now() - interval '2 minutes',
                            lease_expires_at = now() - interval '1 minute'
                      WHERE id = %s""", (dead,))
    time.sleep(1.1)  # a scrape re-reads the database at most once a second
    fam = scrape(s.base)
    assert fam["switchboard_runs_due"][0].value == 1.0  # not the future one, not the running one
    assert 90 <= fam["switchboard_runs_due_age_seconds"][0].value < 120
    assert fam["switchboard_expired_leases"][0].value == 1.0


def _serve_workers(db: str, workers: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ)
    env.update(FAST_ENV)
    env.update({"DATABASE_URL": app_url_for(db), "SWITCHBOARD_JWT_SECRET": JWT_SECRET,
                "PYTHONPATH": str(ROOT / "server")})
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "switchboard.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
         "--workers", str(workers), "--no-migrate"],
        env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def test_a_scrape_of_a_two_worker_pod_sums_both_workers(db, tmp_path) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "workers.log"
    proc, base = _serve_workers(db, 2, log)
    try:
        replicas: dict[str, int] = {}
        attempts = 0   # a request the server answered may still time out on a loaded box
        deadline = time.time() + 60
        # Fresh connections, so the kernel spreads them over both workers' accept();
        # GET /me names the worker (replica id) that served it.
        while time.time() < deadline and (len(replicas) < 2 or sum(replicas.values()) < 20):
            assert proc.poll() is None, log.read_text()[-4000:]
            attempts += 1
            try:
                r = httpx.get(base + "/me", timeout=2, headers={"Connection": "close", **auth(probe_token())})
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            if r.status_code == 200:
                replicas[r.json()["replica"]] = replicas.get(r.json()["replica"], 0) + 1
            else:
                time.sleep(0.1)
        assert len(replicas) == 2, (replicas, log.read_text()[-4000:])
        served = sum(replicas.values())
        assert min(replicas.values()) < served  # each worker alone saw only part of them
        # Gauges are sampled every second in each worker; wait until both have
        # sampled a connected LISTEN (min over the workers).
        deadline = time.time() + 10
        while time.time() < deadline:
            if [s.value for s in scrape(base)["switchboard_listen_connected"]] == [1.0]:
                break
            time.sleep(0.2)
        for _ in range(4):  # whichever worker answers the scrape reports the pod's total
            fam = scrape(base)
            ok = {"route": "/me", "status": "200"}
            assert served <= total(fam["switchboard_http_requests_total"], "switchboard_http_requests_total",
                                   **ok) <= attempts
            assert total(fam["switchboard_http_request_duration_seconds"],
                         "switchboard_http_request_duration_seconds_count",
                         route="/me") >= served
            # Per-pod gauges combine: both LISTEN connections up (min), two registered replicas.
            assert [s.value for s in fam["switchboard_listen_connected"]] == [1.0]
            assert [s.value for s in fam["switchboard_live_replicas"]] == [2.0]
            assert len(fam["switchboard_pool_size"]) == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_run_outcomes_and_durations_by_handler(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    """The handler label is the registered name, or ``unknown`` for a name no handler has:
    whatever a job calls itself, the label set stays closed."""
    s = server_factory()
    with psycopg.connect(db, autocommit=True) as c:
        for handler in ("noop", "noop", "fail", "made.up.handler"):
            c.execute("SELECT switchboard.enqueue(%s, '{}', now(), NULL, 1)", (handler,))
    want = {("noop", "ok"): 2, ("fail", "failed"): 1, ("unknown", "failed"): 1}
    deadline = time.time() + 15
    while True:
        fam = scrape(s.base)
        got = {k: total(fam["switchboard_runs_finished_total"], "switchboard_runs_finished_total",
                        handler=k[0], outcome=k[1]) for k in want}
        if got == want or time.time() > deadline:
            break
        time.sleep(0.1)
    assert got == want
    dur = fam["switchboard_run_duration_seconds"]
    for (handler, outcome), n in want.items():
        assert total(dur, "switchboard_run_duration_seconds_count", handler=handler, outcome=outcome) == n
        assert total(dur, "switchboard_run_duration_seconds_bucket", handler=handler, outcome=outcome,
                     le="+Inf") == n
    assert not [x for x in dur if x.labels.get("handler") == "made.up.handler"]
