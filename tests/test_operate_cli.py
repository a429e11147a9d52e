"""The operator's command line, run for real (`python -m switchboard.cli ...` in a
process of its own) against a real database as the least-privilege application
role: runs list/show/retry/cancel, handlers list/pause/resume, status, and
`task list` with a task parked at 'infinity'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]


def cli(url: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(ROOT / "server")}
    env.pop("SWITCHBOARD_LOG_LEVEL", None)
    p = subprocess.run([sys.executable, "-m", "switchboard.cli", *args], env=env, capture_output=True,
                       text=True, timeout=60)
    if check:
        assert p.returncode == 0, (args, p.returncode, p.stdout, p.stderr)
    return p


def test_task_list_shows_a_task_parked_at_infinity(db: str, app_url: str) -> None:
    cli(app_url, "task", "add", "parked", "--schedule", "@hourly", "--handler", "noop")
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("UPDATE switchboard.tasks SET next_run_at = 'infinity' WHERE name = 'parked'")
    out = cli(app_url, "task", "list").stdout
    line = next(x for x in out.splitlines() if x.startswith("parked "))
    assert line.split()[-2:] == ["never", "(parked)"], out
    tasks = json.loads(cli(app_url, "task", "list", "--json").stdout)
    assert [t["next_run_at"] for t in tasks if t["name"] == "parked"] == [None]


def test_runs_list_show_retry_cancel(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('mail.send', '{\"to\": \"x\"}', now(), NULL, 1)")
        claimed = c.execute("SELECT id FROM switchboard.claim_due_tasks('cli-w', '1 minute', 10) "
                            "WHERE handler = 'mail.send'").fetchone()[0]
        c.execute("SELECT switchboard.finish_run(%s, 'cli-w', false, NULL, 'smtp: 554 no')", (claimed,))
    cli(app_url, "task", "add", "nightly", "--handler", "noop")
    out = cli(app_url, "task", "trigger", "nightly").stdout.split()
    assert out[0] == "run" and out[2] == "queued"
    nightly = int(out[1])

    table = cli(app_url, "runs", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["ID", "STATUS", "HANDLER"]
    rows = {int(x.split()[0]): x.split() for x in table[1:] if x[:1].isdigit()}
    assert rows[nightly][1:4] == ["queued", "noop", "nightly"]
    assert rows[claimed][1:3] == ["failed", "mail.send"]
    assert "smtp: 554 no" in table[[i for i, x in enumerate(table) if x.startswith(f"{claimed} ")][0]]

    # filters, JSON, keyset paging
    page = json.loads(cli(app_url, "runs", "list", "--status", "failed", "--json").stdout)
    assert [r["id"] for r in page["runs"]] == [claimed] and page["next_before"] is None
    assert [r["id"] for r in json.loads(cli(app_url, "runs", "list", "--task", "nightly", "--json").stdout)["runs"]] \
        == [nightly]
    first = json.loads(cli(app_url, "runs", "list", "--limit", "1", "--json").stdout)
    second = json.loads(cli(app_url, "runs", "list", "--limit", "1", "--before", str(first["next_before"]),
                            "--json").stdout)
    assert first["runs"][0]["id"] > second["runs"][0]["id"]
    assert json.loads(cli(app_url, "runs", "list", "--since", "1h", "--json").stdout)["runs"]
    assert json.loads(cli(app_url, "runs", "list", "--since", "2999-01-01T00:00:00+00:00",
                          "--json").stdout)["runs"] == []

    shown = cli(app_url, "runs", "show", str(claimed)).stdout
    assert "status:           failed" in shown and '"to": "x"' in shown

    # retry a failed run; cancel it; retry again; a second retry is refused while one is queued
    out = cli(app_url, "runs", "retry", str(claimed)).stdout
    retry_id = int(out.split()[1])
    assert f"a retry of run {claimed}" in out
    refused = cli(app_url, "runs", "retry", str(claimed), check=False)
    assert refused.returncode == 1 and f"run {retry_id} is already queued" in refused.stderr
    assert "hint:" in refused.stderr
    assert cli(app_url, "runs", "cancel", str(retry_id)).stdout.strip() == f"run {retry_id} cancelled"
    assert "cancelled by cli:" in cli(app_url, "runs", "show", str(retry_id)).stdout
    again = cli(app_url, "runs", "cancel", str(retry_id), check=False)
    assert again.returncode == 1 and "is cancelled" in again.stderr
    missing = cli(app_url, "runs", "show", "999999", check=False)
    assert missing.returncode == 1 and "run 999999 does not exist" in missing.stderr
    bad = cli(app_url, "runs", "list", "--task", "no-such-task", check=False)
    assert bad.returncode == 1 and 'task "no-such-task" does not exist' in bad.stderr

    status = json.loads(cli(app_url, "status", "--json").stdout)["status"]
    assert status["runs_cancelled"] == 1 and status["runs_failed"] == 1 and status["runs_queued"] == 1
    text = cli(app_url, "status").stdout
    assert any(line.split() == ["runs_cancelled", "1"] for line in text.splitlines())
    assert "UTC" in next(line for line in text.splitlines() if line.startswith("db_started_at"))


def test_handlers_pause_and_resume(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.enqueue('mail.send')")
    assert "paused" in cli(app_url, "handlers", "pause", "mail.send").stdout
    assert "already paused" in cli(app_url, "handlers", "pause", "mail.send").stdout
    hs = {h["name"]: h for h in json.loads(cli(app_url, "handlers", "list", "--json").stdout)["handlers"]}
    assert hs["mail.send"]["paused"] is True and hs["mail.send"]["pending_runs"] == 1
    assert hs["maintenance"]["paused"] is False
    table = cli(app_url, "handlers", "list").stdout
    assert next(x for x in table.splitlines() if x.startswith("mail.send")).split()[1] == "since"
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.claim_due_tasks('w', '1 minute', 10) "
                         "WHERE handler = 'mail.send'").fetchone()[0] == 0
    assert json.loads(cli(app_url, "status", "--json").stdout)["status"]["handlers_paused"] == 1
    bad = cli(app_url, "handlers", "pause", "no good", check=False)
    assert bad.returncode == 1 and 'invalid handler name "no good"' in bad.stderr
    assert "resumed" in cli(app_url, "handlers", "resume", "mail.send").stdout
    assert "was not paused" in cli(app_url, "handlers", "resume", "mail.send").stdout
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.claim_due_tasks('w', '1 minute', 10) "
                         "WHERE handler = 'mail.send'").fetchone()[0] == 1


def test_cli_without_a_database_is_one_line(tmp_path: Path) -> None:
    p = cli("postgresql://nobody@127.0.0.1:1/none", "runs", "list", check=False)
    assert p.returncode == 1 and p.stderr.startswith("switchboard: cannot connect to the database")
    assert "Traceback" not in p.stderr


def test_enqueue_from_the_command_line(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("SELECT switchboard.replica_heartbeat('r1', '{}', ARRAY['mail.send','noop'], '5 seconds', '1')")
    out = cli(app_url, "enqueue", "mail.send", "--args", '{"to": "ann"}', "--queueing-lock", "mail-ann").stdout
    assert out.startswith("run ") and "queued: mail.send" in out, out
    rid = int(out.split()[1])
    run = json.loads(cli(app_url, "enqueue", "noop", "--run-at", "10m", "--max-attempts", "1", "--json").stdout)["run"]
    with psycopg.connect(db, autocommit=True) as c:
        rows = c.execute("SELECT id, handler, args, queueing_lock, max_attempts, run_at > now() + interval '9 minutes' "
                         "FROM switchboard.task_runs WHERE trigger = 'enqueue' ORDER BY id").fetchall()
    assert rows == [(rid, "mail.send", {"to": "ann"}, "mail-ann", 3, False), (run["id"], "noop", {}, None, 1, True)]
    # Refusals: one line, a non-zero exit, nothing queued.
    for argv, code, says in (
            (["enqueue", "mail.send", "--queueing-lock", "mail-ann"], 1, f"held by run {rid} (queued): nothing queued"),
            (["enqueue", "report.build"], 1, "no live replica runs handler 'report.build'"),
            (["enqueue", "noop", "--args", "[1]"], 2, "--args must be a JSON object"),
            (["enqueue", "noop", "--args", "{x"], 2, "--args is not JSON"),
            (["enqueue", "noop", "--run-at", "soon"], 2, "--run-at 'soon'"),
            (["enqueue", "noop", "--max-attempts", "0"], 1, "invalid max_attempts 0 (hint: max_attempts is between")):
        p = cli(app_url, *argv, check=False)
        assert p.returncode == code and says in p.stderr and "Traceback" not in p.stderr, (argv, p.stderr)
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    with psycopg.connect(db, autocommit=True) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE trigger = 'enqueue'").fetchone()[0] == 2
    # A handler about to be deployed: queued on request.
    assert cli(app_url, "enqueue", "report.build", "--unserved-ok").stdout.startswith("run ")


def test_runs_retry_and_cancel_by_filter(db: str, app_url: str) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        c.execute("""SELECT switchboard.update_task(id, '{"is_active": false}')
                       FROM switchboard.tasks WHERE name = 'switchboard.maintenance'""")
        c.execute("SELECT switchboard.enqueue('mail.send', '{}', now(), NULL, 1) FROM generate_series(1, 12)")
        for (rid,) in c.execute("SELECT id FROM switchboard.claim_due_tasks('w', '1 minute', 12)").fetchall():
            c.execute("SELECT switchboard.finish_run(%s, 'w', false, NULL, 'smtp down')", (rid,))
        c.execute("SELECT switchboard.enqueue('mail.later', '{}', now() + interval '1 hour') FROM generate_series(1, 4)")
    # Pages of 5 until one does nothing: all 12, once each.
    assert cli(app_url, "runs", "retry", "--status", "failed", "--handler", "mail.send", "--since", "1h",
               "--max", "5").stdout.strip() == "12 runs retried"
    assert cli(app_url, "runs", "retry", "--status", "failed", "--handler", "mail.send").stdout.strip() == "0 runs retried"
    assert cli(app_url, "runs", "cancel", "--status", "queued", "--handler", "mail.later").stdout.strip() == "4 runs cancelled"
    with psycopg.connect(db) as c:
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE retry_of IS NOT NULL").fetchone() == (12,)
        assert c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'mail.later' "
                         "AND status = 'cancelled' AND error LIKE 'cancelled by cli:%'").fetchone() == (4,)
    for argv, says in ((["runs", "retry"], "give a run id, or --status"),
                       (["runs", "retry", "1", "--status", "failed"], "not both"),
                       (["runs", "retry", "--status", "queued"], "failed, abandoned, cancelled or succeeded"),
                       (["runs", "cancel", "--status", "queued", "--max", "0"], "1 to 10000")):
        p = cli(app_url, *argv, check=False)
        assert p.returncode in (1, 2) and says in p.stderr and "Traceback" not in p.stderr, (argv, p.stderr)
