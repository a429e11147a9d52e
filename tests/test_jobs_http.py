"""POST /jobs: an admin enqueues a one-off job over HTTP (switchboard.enqueue).

A real replica: the job is queued (201, the run), runs and finishes; a held
queueing_lock is 409 with the job that holds it; bad fields, an unknown handler
and a member are refused; a run_at in the future is not run before it."""

from __future__ import annotations

import time

import httpx
import psycopg
import pytest
from harness import auth, make_user


def wait_run(db: str, run_id: int, timeout: float = 30) -> tuple[str, object, object]:
    deadline = time.time() + timeout
    with psycopg.connect(db, autocommit=True) as c:
        while time.time() < deadline:
            row = c.execute("SELECT status, result, error FROM switchboard.task_runs WHERE id = %s",
                            (run_id,)).fetchone()
            if row[0] in ("succeeded", "failed", "cancelled", "abandoned"):
                return row
            time.sleep(0.1)
    raise TimeoutError(f"run {run_id} did not finish")


@pytest.fixture
def live(server_factory, db: str):  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "mia")
    s = server_factory()
    return s, auth(s.login("admin")), auth(s.login("mia"))


def test_an_admin_enqueues_a_job_that_runs(live, db: str) -> None:  # type: ignore[no-untyped-def]
    s, admin, _ = live
    r = httpx.post(s.base + "/jobs", headers=admin, json={"handler": "sleep", "args": {"seconds": 0.1}}, timeout=30)
    assert r.status_code == 201, r.text
    run = r.json()["run"]
    assert run["handler"] == "sleep" and run["args"] == {"seconds": 0.1} and run["status"] == "queued"
    assert run["trigger"] == "enqueue" and run["task_id"] is None and run["max_attempts"] == 3
    status, result, _ = wait_run(db, run["id"])
    assert status == "succeeded" and result == {"slept": 0.1}
    # a failing job fails with its error; max_attempts is honoured
    r = httpx.post(s.base + "/jobs", headers=admin,
                   json={"handler": "fail", "args": {"message": "boom"}, "max_attempts": 1}, timeout=30)
    assert r.status_code == 201 and r.json()["run"]["max_attempts"] == 1
    status, _, error = wait_run(db, r.json()["run"]["id"])
    assert status == "failed" and "boom" in str(error)


def test_a_held_queueing_lock_is_409_with_the_active_run(live, db: str) -> None:  # type: ignore[no-untyped-def]
    s, admin, _ = live
    first = httpx.post(s.base + "/jobs", headers=admin, timeout=30,
                       json={"handler": "sleep", "args": {"seconds": 30}, "queueing_lock": "digest:1"})
    assert first.status_code == 201, first.text
    again = httpx.post(s.base + "/jobs", headers=admin, timeout=30,
                       json={"handler": "noop", "queueing_lock": "digest:1"})
    assert again.status_code == 409, again.text
    assert again.headers["content-type"].startswith("application/problem+json")
    p = again.json()
    assert p["type"].endswith("/active-run") and p["active_run"]["id"] == first.json()["run"]["id"]
    assert p["active_run"]["status"] in ("queued", "running")
    other = httpx.post(s.base + "/jobs", headers=admin, timeout=30, json={"handler": "noop", "queueing_lock": "digest:2"})
    assert other.status_code == 201
    with psycopg.connect(db, autocommit=True) as c:
        n = c.execute("SELECT count(*) FROM switchboard.task_runs WHERE queueing_lock = 'digest:1'").fetchone()[0]
        c.execute("UPDATE switchboard.task_runs SET status = 'cancelled' WHERE queueing_lock = 'digest:1'")
    assert n == 1
    free = httpx.post(s.base + "/jobs", headers=admin, timeout=30, json={"handler": "noop", "queueing_lock": "digest:1"})
    assert free.status_code == 201, free.text   # the lock is free once its holder is no longer queued or running


def test_a_future_run_at_is_kept(live, db: str) -> None:  # type: ignore[no-untyped-def]
    s, admin, _ = live
    r = httpx.post(s.base + "/jobs", headers=admin, timeout=30,
                   json={"handler": "noop", "run_at": "2999-01-01T00:00:00Z"})
    assert r.status_code == 201, r.text
    with psycopg.connect(db, autocommit=True) as c:
        at, st = c.execute("SELECT run_at, status FROM switchboard.task_runs WHERE id = %s",
                           (r.json()["run"]["id"],)).fetchone()
    assert at.year == 2999 and st == "queued"
    naive = httpx.post(s.base + "/jobs", headers=admin, timeout=30, json={"handler": "noop", "run_at": "2999-01-01T00:00:00"})
    assert naive.status_code == 201 and naive.json()["run"]["run_at"].startswith("2999-01-01")


@pytest.mark.parametrize(("body", "status", "detail"), [
    ({"args": {}}, 422, "'handler' is required"),
    ({"handler": "nobody.runs.this"}, 422, "known handlers"),
    ({"handler": "noop", "args": [1]}, 422, "'args' must be a JSON object"),
    ({"handler": "noop", "args": "x"}, 422, "'args' must be a JSON object"),
    ({"handler": "noop", "max_attempts": 0}, 422, "max_attempts"),
    ({"handler": "noop", "max_attempts": 101}, 422, "max_attempts"),
    ({"handler": "noop", "max_attempts": True}, 422, "'max_attempts' must be an integer"),
    ({"handler": "noop", "max_attempts": 2**40}, 422, "'max_attempts' must be an integer"),
    ({"handler": "noop", "queueing_lock": ""}, 422, "'queueing_lock'"),
    ({"handler": "noop", "queueing_lock": "x" * 201}, 422, "'queueing_lock'"),
    ({"handler": "noop", "run_at": "tomorrow"}, 422, "'run_at'"),
    ({"handler": "noop", "run_at": 17}, 422, "'run_at'"),
    ({"handler": "noop", "nope": 1}, 422, "unknown field(s): nope"),
])
def test_bad_fields_are_422(live, db: str, body: dict, status: int, detail: str) -> None:  # type: ignore[no-untyped-def]
    s, admin, _ = live
    r = httpx.post(s.base + "/jobs", headers=admin, json=body, timeout=30)
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert detail in r.json()["detail"], r.json()
    if body.get("handler") == "nobody.runs.this":
        assert "noop" in r.json()["known_handlers"]
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE trigger = 'enqueue'").fetchone()[0] == 0


def test_admin_only_and_json_only(live) -> None:  # type: ignore[no-untyped-def]
    s, _, member = live
    assert httpx.post(s.base + "/jobs", json={"handler": "noop"}, timeout=30).status_code == 401
    r = httpx.post(s.base + "/jobs", headers=member, json={"handler": "noop"}, timeout=30)
    assert r.status_code == 403 and r.json()["type"].endswith("/forbidden")
    _, admin, _ = live
    r = httpx.post(s.base + "/jobs", headers={**admin, "Content-Type": "text/plain"}, content=b"{}", timeout=30)
    assert r.status_code == 415
    r = httpx.post(s.base + "/jobs", headers={**admin, "Content-Type": "application/json"}, content=b"[1]", timeout=30)
    assert r.status_code == 400
