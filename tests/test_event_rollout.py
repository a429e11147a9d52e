"""Rolling update (issue 18 item 6): a previous-release replica (the server code
of the commit before V0009) beside a new one, on a V0009 database.

What each delivers, as README "Events" says: both deliver events that commit in
id order; when a transaction commits after a higher-numbered one was read, the
previous-release relay (id cursor) does not send it live, the new one does;
a client of the old replica that resumes on the new one with the bare id of its
last frame gets the late event, once.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import io
from pathlib import Path

import psycopg
import pytest
from websockets.sync.client import connect

from harness import ROOT, make_user

PREVIOUS = "c48fae1"   # main before V0009


@pytest.fixture
def previous_server_code(tmp_path: Path) -> Path:
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS, "server"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history ({PREVIOUS})")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "server"


def _events(ws, n: int) -> list[dict]:  # type: ignore[no-untyped-def]
    got = []
    while len(got) < n:
        f = json.loads(ws.recv(timeout=10))
        if f.get("id") is not None:
            got.append(f)
    return got


def _quiet(ws) -> list[dict]:  # type: ignore[no-untyped-def]
    out = []
    while True:
        try:
            f = json.loads(ws.recv(timeout=1.5))
        except TimeoutError:
            return out
        if f.get("id") is not None:
            out.append(f)


def test_previous_release_replica_beside_a_new_one(server_factory, db: str,  # type: ignore[no-untyped-def]
                                                   previous_server_code: Path) -> None:
    uid = make_user(db, "roll")
    old = server_factory(env={"PYTHONPATH": str(previous_server_code)}, name="old")
    new = server_factory(name="new")
    tok = new.login("roll")
    ws_old = connect(f"{old.ws_base}/ws?ticket={old.ticket(tok)}", open_timeout=10)
    ws_new = connect(f"{new.ws_base}/ws?ticket={new.ticket(tok)}", open_timeout=10)
    hello_old, hello_new = json.loads(ws_old.recv(timeout=10)), json.loads(ws_new.recv(timeout=10))
    assert "cursor" not in hello_old["payload"] and "cursor" in hello_new["payload"]

    with psycopg.connect(db, autocommit=True) as c:
        in_order = [c.execute("SELECT switchboard.notify_user(%s, 'a', '{}')", (uid,)).fetchone()[0]
                    for _ in range(3)]
    assert [f["id"] for f in _events(ws_old, 3)] == in_order          # both deliver these
    assert [f["id"] for f in _events(ws_new, 3)] == in_order

    t1, t2 = psycopg.connect(db), psycopg.connect(db)
    try:
        late = t1.execute("SELECT switchboard.notify_user(%s, 'late', '{}')", (uid,)).fetchone()[0]
        early = t2.execute("SELECT switchboard.notify_user(%s, 'early', '{}')", (uid,)).fetchone()[0]
        t2.commit()
        assert [f["id"] for f in _events(ws_old, 1)] == [early]
        assert [f["id"] for f in _events(ws_new, 1)] == [early]
        t1.commit()                                                    # commits after a higher id
    finally:
        t1.close()
        t2.close()
    new_frames = _events(ws_new, 1)
    assert [f["id"] for f in new_frames] == [late]                    # the new replica: exact
    assert [f["id"] for f in _quiet(ws_old)] == []                     # the old one: skipped live
    ws_old.close()
    # The old replica's client reconnects to a new replica with its last id: it gets the late event once.
    ws = connect(f"{new.ws_base}/ws?ticket={new.ticket(tok)}&after={early}", open_timeout=10)
    assert json.loads(ws.recv(timeout=10))["event"] == "hello"
    frames = []
    while True:
        f = json.loads(ws.recv(timeout=10))
        if f["event"] == "resumed":
            break
        frames.append(f)
    assert [f["id"] for f in frames if f.get("id") is not None] == [late]
    ws.close()
    ws_new.close()
