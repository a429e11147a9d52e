"""A plain ``def`` handler on a real replica: it runs in a worker thread, so while it
blocks the replica keeps answering, and its run succeeds on the first attempt (it was
run on the event loop, then failed with TypeError and was retried, repeating its side
effects)."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import httpx
import psycopg

from harness import ROOT, make_user

MODULE = textwrap.dedent('''
    import pathlib, threading, time
    from switchboard.handlers import registry

    @registry.register("t.blocking")
    def blocking(ctx):
        gate = pathlib.Path(ctx.args["gate"])
        pathlib.Path(ctx.args["started"]).write_text(str(ctx.attempt))
        deadline = time.time() + 60
        while not gate.exists() and time.time() < deadline:
            time.sleep(0.05)          # blocking, as a sync library call is
        eid = ctx.sync(ctx.notify_user(ctx.args["user"], "sync.done", {"n": 1}))
        return {"thread": threading.current_thread().name, "event": eid}
''')


def test_a_blocking_plain_def_handler_never_stalls_the_replica(db: str, server_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "sb_sync_jobs.py").write_text(MODULE)
    uid = make_user(db, "sam")
    s = server_factory(env={"PYTHONPATH": f"{ROOT / 'server'}:{tmp_path}", "SWITCHBOARD_HANDLERS": "sb_sync_jobs"})
    gate, started = tmp_path / "gate", tmp_path / "started"
    with psycopg.connect(db, autocommit=True) as c:
        rid = c.execute("SELECT id FROM switchboard.enqueue('t.blocking', %s::jsonb, now(), NULL, 3)",
                        (f'{{"gate": "{gate}", "started": "{started}", "user": "{uid}"}}',)).fetchone()[0]
        deadline = time.time() + 30
        while not started.exists():
            assert time.time() < deadline, "the job never started"
            time.sleep(0.05)
        # The handler is blocked in its thread: the replica still serves requests.
        for _ in range(3):
            assert httpx.get(s.base + "/healthz/live", timeout=10).status_code == 200
            assert httpx.post(s.base + "/auth/login", json={"username": "sam", "password": "pw-" + "s" * 12},
                              timeout=10).status_code == 200
        gate.write_text("go")
        deadline = time.time() + 30
        while True:
            row = c.execute("SELECT status, attempt, result, error FROM switchboard.task_runs WHERE id = %s",
                            (rid,)).fetchone()
            if row[0] in ("succeeded", "failed") or time.time() > deadline:
                break
            time.sleep(0.05)
        status, attempt, result, error = row
        assert (status, attempt, error) == ("succeeded", 1, None), row
        assert result["thread"].startswith("switchboard-handler")
        assert c.execute("SELECT event FROM switchboard.events WHERE id = %s",
                         (result["event"],)).fetchone() == ("sync.done",)
