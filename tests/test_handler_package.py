"""The README's example handler package, installed and run through its entry point.

The package (examples/handler_package) is pip-installed with --target into a
throwaway directory that only the server process gets on its PYTHONPATH: the
shared site-packages is never touched. A real `switchboard serve` then finds
the handlers through the switchboard.handlers entry-point group (no
SWITCHBOARD_HANDLERS), runs them on a trigger, and the public HandlerContext
does what the README promises: notify_user reaches the user's socket,
enqueue queues a job, and lease_lost is set when the run is taken away.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from harness import ROOT, auth, make_user

EXAMPLE = ROOT / "examples" / "handler_package"


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("example-site")
    build = tmp_path_factory.mktemp("example-build")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    src = build / "handler_package"
    subprocess.run(["cp", "-r", str(EXAMPLE), str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(target), str(src)],
                   check=True, capture_output=True, timeout=300)
    assert list(target.glob("switchboard_example_handlers-1.0.0.dist-info/entry_points.txt"))
    return target


def _wait_run(base: str, h: dict, tid: str, status: str, timeout: float = 10) -> dict:
    deadline = time.time() + timeout
    runs: list = []
    while time.time() < deadline:
        runs = httpx.get(f"{base}/tasks/{tid}/runs", headers=h, timeout=10).json()["runs"]
        if runs and runs[0]["status"] == status:
            return runs[0]
        time.sleep(0.05)
    raise AssertionError(f"run did not reach {status}: {runs}")


def test_example_package_runs_through_the_entry_point(db: str, server_factory, example_site: Path) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    uid = make_user(db, "alice")
    srv = server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{example_site}",
                              "SWITCHBOARD_HANDLERS": ""})
    h = auth(srv.login("admin"))
    ws = srv.ws(srv.login("alice"))
    try:
        t = httpx.post(srv.base + "/tasks", headers=h, timeout=10, json={
            "name": "greet-alice", "handler": "example.greet", "args": {"user_id": uid, "name": "Alice"}})
        assert t.status_code == 201, t.text
        tid = t.json()["id"]
        assert httpx.post(f"{srv.base}/tasks/{tid}/trigger", headers=h, timeout=10).status_code == 202
        run = _wait_run(srv.base, h, tid, "succeeded")
        f = ws.recv_until(lambda f: f["event"] == "greeting", timeout=10)
        assert f["payload"] == {"text": "Hello, Alice!"}
        assert run["result"]["event_id"] == f["id"]
        assert run["result"]["run"] == run["id"] and run["result"]["task"] == tid
        with psycopg.connect(db, autocommit=True) as c:
            job = c.execute("SELECT handler, args, trigger, queueing_lock FROM switchboard.task_runs "
                            "WHERE id = %s", (run["result"]["followup_run"],)).fetchone()
        assert job == ("noop", {"after": run["id"]}, "enqueue", f"greet-followup:{uid}")
    finally:
        ws.close()


def test_lost_lease_is_seen_by_the_handler(db: str, server_factory, example_site: Path) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    uid = make_user(db, "alice")
    srv = server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{example_site}",
                              "SWITCHBOARD_LEASE_SECONDS": "3"})
    h = auth(srv.login("admin"))
    ws = srv.ws(srv.login("alice"))
    try:
        t = httpx.post(srv.base + "/tasks", headers=h, timeout=10, json={
            "name": "report", "handler": "example.report", "max_attempts": 1,
            "args": {"user_id": uid, "chunks": 200, "chunk_seconds": 0.1}})
        tid = t.json()["id"]
        assert httpx.post(f"{srv.base}/tasks/{tid}/trigger", headers=h, timeout=10).status_code == 202
        ws.recv_until(lambda f: f["event"] == "report.progress", timeout=10)
        # Another worker takes the run over (as a rescue after a stall would).
        with psycopg.connect(db, autocommit=True) as c:
            n = c.execute("UPDATE switchboard.task_runs SET worker = 'someone-else' "
                          "WHERE task_id = %s AND status = 'running'", (tid,)).rowcount
        assert n == 1
        t0 = time.time()
        f = ws.recv_until(lambda f: f["event"] == "report.abandoned", timeout=10)
        assert time.time() - t0 < 8  # heartbeat every lease/3 = 1 s; the run alone would take 20 s
        assert 1 <= f["payload"]["done"] < 200
        with psycopg.connect(db, autocommit=True) as c:
            row = c.execute("SELECT status, worker FROM switchboard.task_runs WHERE task_id = %s",
                            (tid,)).fetchone()
        assert row == ("running", "someone-else")  # the fenced finish did not touch it
    finally:
        ws.close()


def test_deadline_moves_to_the_end_of_the_shutdown_grace(db: str, server_factory, example_site: Path) -> None:  # type: ignore[no-untyped-def]
    """On SIGTERM a running handler's ctx.deadline becomes the end of the shutdown grace
    (not the lease expiry, 30 s away): the example's report handler sees seconds_left()
    run out and fails cleanly inside the grace, so its outcome is recorded, not handed back."""
    make_user(db, "admin", role="admin")
    uid = make_user(db, "alice")
    srv = server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{example_site}",
                              "SWITCHBOARD_LEASE_SECONDS": "30", "SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "2"})
    h = auth(srv.login("admin"))
    ws = srv.ws(srv.login("alice"))
    try:
        tid = httpx.post(srv.base + "/tasks", headers=h, timeout=10, json={
            "name": "report", "handler": "example.report", "max_attempts": 1,
            "args": {"user_id": uid, "chunks": 500, "chunk_seconds": 0.1}}).json()["id"]
        assert httpx.post(f"{srv.base}/tasks/{tid}/trigger", headers=h, timeout=10).status_code == 202
        ws.recv_until(lambda f: f["event"] == "report.progress", timeout=10)
        t0 = time.time()
        assert srv.terminate(timeout=30) == 0
        assert time.time() - t0 < 15  # the 5 s grace plus a loaded box; the run alone takes 50 s
    finally:
        ws.close()
    with psycopg.connect(db, autocommit=True) as c:
        status, error = c.execute("SELECT status, error FROM switchboard.task_runs WHERE task_id = %s",
                                  (tid,)).fetchone()
    assert status == "failed" and error.startswith("out of time after "), (status, error)


def test_a_broken_handler_source_stops_the_replica_with_one_line(db: str, tmp_path: Path) -> None:
    """A replica that cannot load a declared handler refuses to start (exit 2, one line
    naming the entry point and its distribution, or the module) instead of running
    without it and failing every run of that handler."""
    import os

    from harness import JWT_SECRET, app_url_for, free_port

    site = tmp_path / "site"
    info = site / "broken_handlers-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-handlers\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[switchboard.handlers]\nbroken.one = sb_no_such_module:run\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    base.update({"DATABASE_URL": app_url_for(db), "SWITCHBOARD_JWT_SECRET": JWT_SECRET})
    cmd = [sys.executable, "-m", "switchboard.cli", "serve", "--no-migrate", "--host", "127.0.0.1",
           "--port", str(free_port())]
    for env, needle in (
        ({"PYTHONPATH": f"{ROOT / 'server'}:{site}"},
         "handler entry point broken.one = sb_no_such_module:run (distribution broken-handlers) failed to load"),
        ({"PYTHONPATH": str(ROOT / "server"), "SWITCHBOARD_HANDLERS": "sb_no_such_module"},
         "SWITCHBOARD_HANDLERS: cannot import 'sb_no_such_module'"),
    ):
        p = subprocess.run(cmd, env=base | env, capture_output=True, text=True, timeout=60)
        assert p.returncode == 2, p
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1 and needle in lines[0], p.stderr
