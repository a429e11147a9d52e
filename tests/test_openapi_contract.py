"""/openapi.json is a valid OpenAPI 3.1 document that says what the server does.

- openapi-spec-validator accepts it (it declares 3.1 and uses 3.1 syntax);
- every operation has a unique operationId and declared tags;
- every error response is problem+json, every 429 declares Retry-After and
  the RateLimit headers, free-form JSON is declared free-form;
- real responses of a running replica (login, refresh, /me, room members,
  task, run, problems) validate against the schemas the document declares.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from harness import auth, make_user

METHODS = ("get", "put", "post", "delete", "patch", "options", "head")


@pytest.fixture
def live(server_factory, db: str) -> tuple[Any, dict]:  # type: ignore[no-untyped-def]
    s = server_factory()
    doc = httpx.get(s.base + "/openapi.json").json()
    return s, doc


def operations(doc: dict) -> list[tuple[str, str, dict]]:
    return [(p, m, o) for p, item in doc["paths"].items() for m, o in item.items() if m in METHODS]


def response_schema(doc: dict, path: str, method: str, status: int, media: str = "application/json") -> dict:
    resp = doc["paths"][path][method]["responses"][str(status)]
    if "$ref" in resp:
        resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
    return resp["content"][media]["schema"]


def conforms(doc: dict, s: dict, instance: Any) -> None:
    """Validate with the document's components in scope (JSON Schema 2020-12, as 3.1 says)."""
    root = {**s, "components": doc["components"]}
    errors = sorted(Draft202012Validator(root).iter_errors(instance), key=str)
    assert not errors, [f"{list(e.path)}: {e.message}" for e in errors[:5]]


def test_the_document_validates_as_openapi_3_1(live) -> None:  # type: ignore[no-untyped-def]
    _, doc = live
    assert doc["openapi"].startswith("3.1.")
    validate(doc)


def test_every_operation_has_an_operation_id_and_tags(live) -> None:  # type: ignore[no-untyped-def]
    _, doc = live
    ops = operations(doc)
    assert len(ops) >= 20
    ids = [o.get("operationId") for _, _, o in ops]
    assert all(ids) and len(set(ids)) == len(ids), ids
    declared = {t["name"] for t in doc["tags"]}
    for path, method, o in ops:
        assert o.get("tags") and set(o["tags"]) <= declared, (path, method)


def test_errors_are_problems_and_429_declares_its_headers(live) -> None:  # type: ignore[no-untyped-def]
    _, doc = live
    seen_429 = 0
    for path, method, o in operations(doc):
        for status, resp in o["responses"].items():
            if int(status) < 400:
                continue
            if "$ref" in resp:
                resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
            assert list(resp["content"]) == ["application/problem+json"], (path, method, status)
            if status == "429":
                seen_429 += 1
                assert {"Retry-After", "RateLimit", "RateLimit-Policy"} <= set(resp["headers"])
    assert seen_429 >= 1
    problem = doc["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail"} <= set(problem["required"])
    assert {"known_handlers", "active_run", "reasons"} <= set(problem["properties"])


def test_free_form_json_is_declared_free_form(live) -> None:  # type: ignore[no-untyped-def]
    _, doc = live
    task = doc["components"]["schemas"]["Task"]
    assert task["properties"]["args"] == {"type": "object", "additionalProperties": True}
    create = doc["paths"]["/tasks"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert create["properties"]["args"]["additionalProperties"] is True
    conforms(doc, create, {"name": "n", "handler": "sql", "args": {"sql": "SELECT 1", "timeout_seconds": 5}})


def test_real_responses_conform(live, db: str) -> None:  # type: ignore[no-untyped-def]
    s, doc = live
    admin_id = make_user(db, "admin", role="admin")
    make_user(db, "mia")
    login = httpx.post(s.base + "/auth/login", json={"username": "admin", "password": "pw-" + "s" * 12})
    conforms(doc, response_schema(doc, "/auth/login", "post", 200), login.json())
    assert {"RateLimit", "RateLimit-Policy", "Set-Cookie"} <= set(doc["paths"]["/auth/login"]["post"]
                                                                    ["responses"]["200"]["headers"])
    h = auth(login.json()["access_token"])
    refreshed = httpx.post(s.base + "/auth/refresh", cookies=login.cookies)
    conforms(doc, response_schema(doc, "/auth/refresh", "post", 200), refreshed.json())
    conforms(doc, response_schema(doc, "/me", "get", 200), httpx.get(s.base + "/me", headers=h).json())
    assert httpx.put(s.base + f"/rooms/lobby/members/{admin_id}", headers=h).status_code == 204
    s.ws(login.json()["access_token"]).conn.close()
    members = httpx.get(s.base + "/rooms/lobby/members", headers=h).json()
    assert members["members"][0]["user_id"] == admin_id
    conforms(doc, response_schema(doc, "/rooms/{room}/members", "get", 200), members)
    task = httpx.post(s.base + "/tasks", headers=h,
                      json={"name": "t", "handler": "noop", "args": {"nested": {"any": [1, "x", None]}}})
    conforms(doc, response_schema(doc, "/tasks", "post", 201), task.json())
    tid = task.json()["id"]
    run = httpx.post(s.base + f"/tasks/{tid}/trigger", headers=h)
    conforms(doc, response_schema(doc, "/tasks/{task_id}/trigger", "post", 202), run.json())
    conforms(doc, response_schema(doc, "/tasks/{task_id}/runs", "get", 200),
             httpx.get(s.base + f"/tasks/{tid}/runs", headers=h).json())
    conforms(doc, response_schema(doc, "/tasks", "get", 200), httpx.get(s.base + "/tasks", headers=h).json())
    problem = response_schema(doc, "/tasks/{task_id}", "get", 404, "application/problem+json")
    conforms(doc, problem, httpx.get(s.base + "/tasks/00000000-0000-0000-0000-000000000000", headers=h).json())
    conforms(doc, problem, httpx.post(s.base + "/tasks", headers=h, json={"name": "u", "handler": "nope"}).json())
    conforms(doc, response_schema(doc, "/healthz/ready", "get", 200), httpx.get(s.base + "/healthz/ready").json())


def test_stream_and_job_responses_conform(live, db: str) -> None:  # type: ignore[no-untyped-def]
    import psycopg

    s, doc = live
    admin_id = make_user(db, "admin", role="admin")
    h = auth(s.login("admin"))
    with psycopg.connect(db, autocommit=True) as c:
        sid = str(c.execute("SELECT switchboard.stream_open(%s, 'completion', '{\"prompt\": \"p\"}')",
                            (admin_id,)).fetchone()[0])
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['a', 'b'])", (sid,))
    listed = httpx.get(s.base + "/streams", headers=h).json()
    assert [x["id"] for x in listed["streams"]] == [sid] and listed["streams"][0]["last_seq"] == 2
    conforms(doc, response_schema(doc, "/streams", "get", 200), listed)
    stop = httpx.post(s.base + f"/streams/{sid}/stop", headers=h)
    conforms(doc, response_schema(doc, "/streams/{stream_id}/stop", "post", 200), stop.json())
    with psycopg.connect(db, autocommit=True) as c:        # the producer closes it with its final
        c.execute("SELECT switchboard.stream_close(%s, 'stopped', '{\"text\": \"ab\"}')", (sid,))
    sse = httpx.get(s.base + f"/streams/{sid}", headers=h, params={"after": 1}, timeout=30)
    assert sse.headers["content-type"].startswith("text/event-stream")
    assert "text/event-stream" in doc["paths"]["/streams/{stream_id}"]["get"]["responses"]["200"]["content"]
    assert "id: 2\ndata: b\n" in sse.text and "event: end" in sse.text
    problem = response_schema(doc, "/streams/{stream_id}", "get", 404, "application/problem+json")
    conforms(doc, problem, httpx.get(s.base + "/streams/00000000-0000-0000-0000-000000000000", headers=h).json())
    job = httpx.post(s.base + "/jobs", headers=h, json={"handler": "noop", "args": {"x": [1]}, "queueing_lock": "l"})
    conforms(doc, response_schema(doc, "/jobs", "post", 201), job.json())
    held = httpx.post(s.base + "/jobs", headers=h, json={"handler": "noop", "queueing_lock": "l"})
    if held.status_code == 409:           # (unless the first one already ran)
        conforms(doc, response_schema(doc, "/jobs", "post", 409, "application/problem+json"), held.json())
