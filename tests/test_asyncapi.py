"""The AsyncAPI 3.0 document (GET /asyncapi.json) against real frames from a real server.

The JS client's frame types are generated from this document, so it must say
what the server really sends. One real replica; a scenario that makes it send
every server message the document lists (hello, events to a user and a room,
joined, left, left-removed, typing, tool.call, pong, resumed, resume_gap,
error, presence.state and presence.diff, and the admin run feed's run.updated and subscribed); every frame received is validated against the
document's ServerFrame schema (exactly one message matches), every frame sent
against ClientFrame, and each listed message must have been seen at least once
(a message nobody sends is a lie in the contract too).
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import psycopg
import pytest
from websockets.exceptions import ConnectionClosed

from harness import ROOT, WS, auth, make_user, seal_event_partition, tick_covering_everything

DOC_PATH = ROOT / "server" / "switchboard" / "static" / "asyncapi.json"
SID = "6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60"   # a stream id


def load_doc() -> dict[str, Any]:
    return json.loads(DOC_PATH.read_text())


def validator(doc: dict[str, Any], name: str) -> jsonschema.Draft7Validator:
    # AsyncAPI's default schema format is a superset of JSON Schema draft 7; refs point into
    # #/components/schemas, so the components travel with the schema.
    schema = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def message_of(doc: dict[str, Any], frame: dict, direction: str) -> str:
    """The one message of `direction` (receiveFrames / sendActions) this frame is; fails otherwise."""
    matches = []
    for ref in doc["operations"][direction]["messages"]:
        name = ref["$ref"].rsplit("/", 1)[-1]
        if validator(doc, doc["components"]["messages"][name]["payload"]["$ref"].rsplit("/", 1)[-1]).is_valid(frame):
            matches.append(name)
    assert len(matches) == 1, f"{direction}: {frame} matches {matches or 'no message'}"
    return matches[0]


def test_document_shape_and_refs() -> None:
    doc = load_doc()
    assert doc["asyncapi"] == "3.0.0"
    channel = doc["channels"]["socket"]
    assert channel["address"] == "/ws"
    for op in doc["operations"].values():
        assert op["channel"] == {"$ref": "#/channels/socket"}
        assert op["action"] in ("send", "receive")
        for ref in op["messages"]:
            name = ref["$ref"].removeprefix("#/channels/socket/messages/")
            assert name in channel["messages"], ref
    for name, msg in doc["components"]["messages"].items():
        assert channel["messages"][name] == {"$ref": f"#/components/messages/{name}"}
        target = msg["payload"]["$ref"].rsplit("/", 1)[-1]
        assert target in doc["components"]["schemas"], (name, target)
    for name in doc["components"]["schemas"]:
        validator(doc, name)   # each one is a valid draft-7 schema with resolvable refs
    # client frames the README documents are all valid ClientFrames
    for f in ({"action": "join", "room": "ops"}, {"action": "leave", "room": "ops"}, {"action": "resume", "after": 12},
              {"action": "resume", "cursor": "abc.DEF_1-~"}, {"action": "ping"},
              {"action": "publish", "event": "typing", "room": "ops", "payload": {}},
              {"action": "publish", "event": "tool.result.6f1c1f0e-4b9e-4c1a-9d6a-1b2c3d4e5f60", "payload": {"x": 1}},
              {"action": "subscribe", "feed": "runs"}, {"action": "unsubscribe", "feed": "runs"},
              {"action": "stream.subscribe", "stream": SID, "after": 0}, {"action": "stream.subscribe", "stream": SID},
              {"action": "stream.unsubscribe", "stream": SID}, {"action": "stream.stop", "stream": SID},
              {"action": "presence.subscribe", "room": "ops"},
              {"action": "presence.track", "room": "ops", "meta": {"status": "away", "n": 1, "ok": True, "x": None}}):
        message_of(doc, f, "sendActions")
    # the stream frames of docs/how-to/streams.md, each exactly one message
    for f, name in (
        ({"id": None, "event": "stream.chunks", "room": None, "ts": 1,
          "payload": {"stream": SID, "seq": 813, "chunks": ["Hel", "lo"]}}, "streamChunks"),
        ({"id": None, "event": "stream.end", "room": None, "ts": 1,
          "payload": {"stream": SID, "status": "done", "last_seq": 814, "final": {"text": "..."}}}, "streamEnd"),
        ({"id": None, "event": "stream.unsubscribed", "room": None, "ts": 1, "payload": {"stream": SID}},
         "streamUnsubscribed"),
        ({"id": None, "event": "error", "room": None, "ts": 1,
          "payload": {"code": "stream_not_found", "message": "...", "stream": SID}}, "error"),
    ):
        assert message_of(doc, f, "receiveFrames") == name
    with pytest.raises(AssertionError):
        message_of(doc, {"action": "publish", "event": "order.shipped", "payload": {}}, "sendActions")
    with pytest.raises(AssertionError):
        message_of(doc, {"id": None, "event": "order.shipped", "room": None, "payload": {}, "ts": 1}, "receiveFrames")


def test_real_frames_match_the_document(server_factory, db) -> None:  # type: ignore[no-untyped-def]
    doc = load_doc()
    make_user(db, "admin", role="admin")
    alice = make_user(db, "alice")
    bob = make_user(db, "bob")
    srv = server_factory(name="asyncapi")
    r = httpx.get(srv.base + "/asyncapi.json", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == doc
    admin = srv.login("admin")
    for u in (alice, bob):
        assert httpx.put(f"{srv.base}/rooms/lobby/members/{u}", headers=auth(admin), timeout=30).status_code == 204

    received: list[dict] = []
    sent: list[dict] = []

    class Recording(WS):
        def recv(self, timeout: float = 5) -> dict:
            f = super().recv(timeout)
            received.append(f)
            return f

        def send(self, obj: Any) -> None:
            sent.append(obj)
            super().send(obj)

    def connect(token: str, query: str = "") -> Recording:
        from websockets.sync.client import connect as ws_connect

        return Recording(ws_connect(f"{srv.ws_base}/ws?ticket={srv.ticket(token)}{query}", open_timeout=10))

    def publish(**body: Any) -> int:
        r = httpx.post(srv.base + "/events", headers=auth(admin), json=body, timeout=30)
        assert r.status_code == 202, r.text
        return r.json()["id"]

    a_tok, b_tok = srv.login("alice"), srv.login("bob")
    a, b = connect(a_tok), connect(b_tok)
    assert a.join("lobby")["event"] == "joined"
    assert b.join("lobby")["event"] == "joined"
    a.join("secret")                                                    # error (forbidden)
    a.conn.send(json.dumps({"action": "dance"}))    # error (unknown_action); not a ClientFrame, not recorded
    a.recv_until(lambda f: f["event"] == "error" and f["payload"]["code"] == "unknown_action")
    a.send({"action": "ping"})
    a.recv_until(lambda f: f["event"] == "pong")
    e1 = publish(user_id=alice, event="order.shipped", payload={"order": 41})
    e2 = publish(room="lobby", event="room.message", payload={"text": "hi", "n": [1, 2]})
    a.recv_until(lambda f: f.get("id") == e2)
    b.send({"action": "publish", "event": "typing", "room": "lobby", "payload": {"typing": True}})
    a.recv_until(lambda f: f["event"] == "typing")
    # pushed presence: a tracks itself (its state comes), b watches, then b's track is a diff to a
    a.send({"action": "presence.track", "room": "lobby", "meta": {"status": "here"}})
    a.recv_until(lambda f: f["event"] == "presence.state")
    b.send({"action": "presence.subscribe", "room": "lobby"})
    b.recv_until(lambda f: f["event"] == "presence.state")
    b.send({"action": "presence.track", "room": "lobby", "meta": {"status": "busy"}})
    a.recv_until(lambda f: f["event"] == "presence.diff")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        call = pool.submit(httpx.post, srv.base + "/tools/call", headers=auth(admin), timeout=60,
                           json={"user_id": alice, "name": "echo", "args": {"x": 1}, "timeout_ms": 20000})
        tc = a.recv_until(lambda f: f["event"].startswith("tool.call."), timeout=20)
        a.send({"action": "publish", "event": "tool.result." + tc["event"].removeprefix("tool.call."),
                "payload": tc["payload"]["args"]})
        assert call.result(timeout=60).json() == {"result": {"x": 1}}

    a.send({"action": "leave", "room": "lobby"})
    a.recv_until(lambda f: f["event"] == "left")
    r = httpx.delete(f"{srv.base}/rooms/lobby/members/{bob}", headers=auth(admin), timeout=30)
    assert r.status_code == 204
    b.recv_until(lambda f: f["event"] == "left" and f["payload"].get("reason") == "removed", timeout=10)
    # A role change closes the socket 1008 "session revoked" (the document lists no
    # session.updated any more: the server stopped sending it when sessions landed).
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.set_user_role(%s, 'admin')", (bob,))
    with pytest.raises(ConnectionClosed) as closed:
        b.recv_until(lambda f: False, timeout=10)
    assert closed.value.rcvd is not None and (closed.value.rcvd.code, closed.value.rcvd.reason) == \
        (1008, "session revoked"), closed.value

    # resume in the handshake, then with a resume action; then below the horizon (resume_gap)
    a.close()
    e3 = publish(user_id=alice, event="while.away", payload={})
    a = connect(a_tok, f"&after={e1}&rooms=lobby")
    a.recv_until(lambda f: f["event"] == "resumed")
    a.send({"action": "resume", "after": e2})
    a.recv_until(lambda f: f["event"] == "resumed")
    seal_event_partition(db)                      # their partition is full: reap_events may drop it
    tick_covering_everything(db)
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT switchboard.reap_events('0 seconds')").fetchone()[0] >= 1
    a.send({"action": "resume", "after": 0})
    a.recv_until(lambda f: f["event"] == "resume_gap")
    a.recv_until(lambda f: f["event"] == "resumed")
    assert any(f.get("id") == e3 for f in received)
    a.close()
    try:
        b.close()
    except Exception:
        pass

    # The admin run feed: subscribed in the handshake, a run claimed and finished by the
    # scheduler arrives as run.updated (id null); unsubscribe / subscribe answer subscribed.
    ad = connect(admin, "&feeds=runs")
    r = httpx.post(srv.base + "/tasks", headers=auth(admin), timeout=30, json={"name": "feed", "handler": "noop"})
    assert r.status_code == 201, r.text
    assert httpx.post(f"{srv.base}/tasks/{r.json()['id']}/trigger", headers=auth(admin), timeout=30).status_code == 202
    ad.recv_until(lambda f: f["event"] == "run.updated"
                  and any(x["status"] == "succeeded" for x in f["payload"]["runs"]), timeout=30)
    ad.send({"action": "unsubscribe", "feed": "runs"})
    ad.recv_until(lambda f: f["event"] == "subscribed")
    ad.send({"action": "subscribe", "feed": "runs"})
    ad.recv_until(lambda f: f["event"] == "subscribed" and f["payload"]["feeds"] == ["runs"])
    ad.close()

    # Streams: chunks, the end, unsubscribe, stop (docs/how-to/streams.md).
    s = connect(a_tok)
    with psycopg.connect(db, autocommit=True) as c:
        sid = str(c.execute("SELECT switchboard.stream_open(%s, 'completion')", (alice,)).fetchone()[0])
        other = str(c.execute("SELECT switchboard.stream_open(%s, 'completion')", (alice,)).fetchone()[0])
        c.execute("SELECT switchboard.stream_append(%s, ARRAY['Hel', 'lo'])", (sid,))
    s.send({"action": "stream.subscribe", "stream": sid, "after": 0})
    s.recv_until(lambda f: f["event"] == "stream.chunks" and f["payload"]["stream"] == sid)
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.stream_close(%s, 'done', '{\"text\": \"Hello\"}')", (sid,))
    s.recv_until(lambda f: f["event"] == "stream.end" and f["id"] is None)
    s.send({"action": "stream.subscribe", "stream": other})
    s.send({"action": "stream.unsubscribe", "stream": other})
    s.recv_until(lambda f: f["event"] == "stream.unsubscribed")
    s.send({"action": "stream.stop", "stream": other})
    s.send({"action": "stream.subscribe", "stream": other})
    with psycopg.connect(db, autocommit=True) as c:         # the producer closes the stopped stream
        deadline = time.time() + 15
        while c.execute("SELECT status FROM switchboard.streams WHERE id = %s", (other,)).fetchone()[0] == "open":
            assert time.time() < deadline
            time.sleep(0.05)
        c.execute("SELECT switchboard.stream_close(%s, 'stopped', '{\"text\": \"\"}')", (other,))
    s.recv_until(lambda f: f["event"] == "stream.end" and f["payload"]["stream"] == other and f["id"] is None)
    s.close()

    seen_received = {message_of(doc, f, "receiveFrames") for f in received}
    seen_sent = {message_of(doc, f, "sendActions") for f in sent}
    listed_received = {ref["$ref"].rsplit("/", 1)[-1] for ref in doc["operations"]["receiveFrames"]["messages"]}
    deprecated = {name for name in listed_received
                  if doc["components"]["schemas"][doc["components"]["messages"][name]["payload"]["$ref"]
                                                  .rsplit("/", 1)[-1]].get("deprecated")}
    listed_received -= deprecated - seen_received   # a deprecated message may no longer be sent
    listed_sent = {ref["$ref"].rsplit("/", 1)[-1] for ref in doc["operations"]["sendActions"]["messages"]}
    assert seen_received == listed_received, f"never seen: {listed_received - seen_received}"
    assert seen_sent == listed_sent, f"never sent: {listed_sent - seen_sent}"


def test_generated_frame_types_are_current() -> None:
    """clients/js/src/frames.ts is generated from the document; a stale copy would lie to TypeScript users."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.fail("node is not installed (scripts/test.sh installs nodejs)", pytrace=False)
    js = ROOT / "clients" / "js"
    before = (js / "src" / "frames.ts").read_text()
    out = subprocess.run([node, "scripts/gen-frames.mjs"], cwd=js, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (js / "src" / "frames.ts").read_text() == before, "frames.ts was stale: commit the regenerated file"
    assert Path(js / "src" / "frames.ts").exists()


def test_document_validates_against_the_official_asyncapi_3_0_schema() -> None:
    """The JSON Schema of AsyncAPI 3.0.0 as the AsyncAPI initiative publishes it
    (@asyncapi/specs, a pinned devDependency of clients/js, installed by npm ci):
    the shape checks above are ours; this is the spec's own."""
    doc = load_doc()
    assert doc["asyncapi"] == "3.0.0"
    spec = json.loads((ROOT / "clients" / "js" / "node_modules" / "@asyncapi" / "specs" / "schemas"
                       / "3.0.0-without-$id.json").read_text())
    v = jsonschema.validators.validator_for(spec)(spec)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in v.iter_errors(doc)]
    assert not errors, errors[:10]
    # The validator really checks: 2.x's operation verbs are not 3.0.
    bad = json.loads(json.dumps(doc))
    bad["operations"][next(iter(bad["operations"]))]["action"] = "publish"
    assert any(True for _ in v.iter_errors(bad))
