"""Rolling update from the previous release: a 0.2.0 replica (the server code of the
commit that stamped v0.2.0 in db/functions.lock) beside a new one, on this
release's database.

Upgrades go one release at a time (0.1 -> 0.2 -> this release), so 0.2.0 is the
only older server that runs beside this one; V0026 dropped the 0.1 forms no 0.2.0
code calls. What each replica delivers, as README "Rolling update from the
previous release (0.2)" says: both are exact (both read by ticks), also for a
transaction that commits after a higher-numbered one was delivered; a client of
the old replica resumes on the new one with the cursor of its last frame and gets
what it missed, once; the old replica's maintenance sweep (the four-argument
maintenance, unbounded reap_events) still runs.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import psycopg
import pytest
from websockets.sync.client import connect

from harness import ROOT, make_user

PREVIOUS = "8302152"   # "Release 0.2.0" (git log -S v0.2.0 -- db/functions.lock)


@pytest.fixture
def previous_server_code(tmp_path: Path) -> Path:
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "archive", PREVIOUS, "server"],
                              capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history ({PREVIOUS})")
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        tar.extractall(tmp_path, filter="data")
    assert '__version__ = "0.2.0"' in (tmp_path / "server/switchboard/__init__.py").read_text()
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
    assert "cursor" in hello_old["payload"] and "cursor" in hello_new["payload"]

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
    # Both replicas read by ticks: the late committer reaches both, once.
    old_frames = _events(ws_old, 1)
    assert [f["id"] for f in old_frames] == [late]
    assert [f["id"] for f in _events(ws_new, 1)] == [late]
    assert _quiet(ws_old) == [] and _quiet(ws_new) == []
    # The old replica's client goes away, misses one, and resumes on a new replica with
    # the cursor of its last frame: exactly the one it missed.
    ws_old.close()
    with psycopg.connect(db, autocommit=True) as c:
        missed = c.execute("SELECT switchboard.notify_user(%s, 'missed', '{}')", (uid,)).fetchone()[0]
        # the 0.2.0 server's sweep: maintenance by name, the four-argument form
        assert c.execute("SELECT switchboard.maintenance(keep_events => '5 minutes', "
                         "replica_stale => '30 seconds') ? 'events'").fetchone()[0] is True
    assert [f["id"] for f in _events(ws_new, 1)] == [missed]
    ws = connect(f"{new.ws_base}/ws?ticket={new.ticket(tok)}&cursor={old_frames[-1]['cursor']}",
                 open_timeout=10)
    assert json.loads(ws.recv(timeout=10))["event"] == "hello"
    frames = []
    while True:
        f = json.loads(ws.recv(timeout=10))
        if f["event"] == "resumed":
            break
        frames.append(f)
    assert [f["id"] for f in frames if f.get("id") is not None] == [missed]
    ws.close()
    ws_new.close()
    assert old.proc is not None and old.proc.poll() is None, old.log()
