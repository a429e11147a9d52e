"""Every error path of a real replica answers RFC 9457 problem+json.

One walk over the statuses a client can provoke over real HTTP (400, 401, 403,
404 for a path and for a row, 405, 409 from a SQLSTATE and from the trigger
rule, 413 from the middleware and from the body reader, 422 from the
resource and from a SQLSTATE, 429 with its headers), each checked for the
media type, the members, the stable type URI and the deprecated description
alias. 500 and 503 cannot be provoked from outside on purpose; the unit tier
(tests/unit/test_error_serializer.py) drives them through the same serializer.
"""

from __future__ import annotations

import uuid

import httpx

from harness import auth, make_user

BASE = "https://switchboard.dev/problems/"


def check(r: httpx.Response, status: int, slug: str, **ext: object) -> dict:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json", r.headers
    body = r.json()
    assert body["type"] == BASE + slug, body
    assert body["status"] == status
    assert isinstance(body["title"], str) and body["title"] and not body["title"][:3].isdigit()
    assert isinstance(body["detail"], str) and body["detail"]
    assert body["description"] == body["detail"]  # kept for one release
    for k, v in ext.items():
        assert body[k] == v, (k, body)
    return body


def test_every_error_path_is_problem_json(server_factory, db: str) -> None:  # type: ignore[no-untyped-def]
    make_user(db, "admin", role="admin")
    make_user(db, "mo")
    s = server_factory(env={"SWITCHBOARD_LOGIN_IP_BURST": "6", "SWITCHBOARD_LOGIN_IP_RATE": "0.001"})
    h = auth(s.login("admin"))
    member = auth(s.login("mo"))
    b = s.base

    check(httpx.post(b + "/tasks", headers={**h, "Content-Type": "application/json"}, content=b"{"),
          400, "bad-request")
    body = check(httpx.get(b + "/me"), 401, "unauthorized")
    assert "bearer" in body["detail"].lower()
    assert httpx.get(b + "/me").headers["www-authenticate"].startswith("Bearer")
    check(httpx.get(b + "/me", headers={"Authorization": "Bearer not.a.jwt"}), 401, "unauthorized")
    check(httpx.get(b + "/tasks", headers=member), 403, "forbidden")
    body = check(httpx.get(b + "/no/such/route"), 404, "not-found")
    assert body["title"] == "Not Found" and "/no/such/route" in body["detail"]
    check(httpx.get(b + f"/tasks/{uuid.uuid4()}", headers=h), 404, "not-found")
    r = httpx.delete(b + "/tasks", headers=h)
    check(r, 405, "method-not-allowed")
    assert {"GET", "POST"} <= set(r.headers["allow"].replace(" ", "").split(","))
    # 413: from the middleware (declared length) and from the reader (the same limit)
    check(httpx.post(b + "/tasks", headers=h, content=b"x" * (2 * 1024 * 1024 + 10)), 413, "content-too-large")
    # 422 from the resource, from SQL (with its SQLSTATE), and the unknown-handler extension
    check(httpx.post(b + "/tasks", headers=h, json={"name": "x", "handler": "noop", "bogus": 1}),
          422, "unprocessable")
    check(httpx.post(b + "/tasks", headers=h, json={"name": "y", "handler": "noop", "max_attempts": 0}),
          422, "unprocessable", sqlstate="22023")
    body = check(httpx.post(b + "/tasks", headers=h, json={"name": "z", "handler": "no.such.handler"}),
                 422, "unknown-handler")
    assert "noop" in body["known_handlers"]
    # 409 from a SQLSTATE (unique name) and from the trigger rule (with active_run)
    task = httpx.post(b + "/tasks", headers=h, json={"name": "dup", "handler": "sleep", "args": {"seconds": 30}})
    assert task.status_code == 201, task.text
    check(httpx.post(b + "/tasks", headers=h, json={"name": "dup", "handler": "noop"}), 409, "conflict",
          sqlstate="23505")
    tid = task.json()["id"]
    assert httpx.post(b + f"/tasks/{tid}/trigger", headers=h).status_code == 202
    body = check(httpx.post(b + f"/tasks/{tid}/trigger", headers=h), 409, "active-run")
    assert body["active_run"]["task_id"] == tid and body["active_run"]["status"] in ("queued", "running")
    # the WebSocket endpoint spoken to in plain HTTP
    check(httpx.get(b + "/ws"), 400, "bad-request")
    # 429: the login IP bucket (6, two already spent above), with the IETF headers
    last = None
    for _ in range(10):
        last = httpx.post(b + "/auth/login", json={"username": "mo", "password": "wrong-password"})
        if last.status_code == 429:
            break
        check(last, 401, "unauthorized")
    assert last is not None
    check(last, 429, "rate-limited")
    assert int(last.headers["retry-after"]) >= 1
    assert last.headers["ratelimit"].startswith('"login-ip"') and "ratelimit-policy" in last.headers
