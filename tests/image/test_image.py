"""The image, built from the repository's Dockerfile and run against a real PostgreSQL.

What a Kubernetes node would do with it, as far as one machine allows: run it
read-only as its own non-root user, migrate an empty database from it, serve
until ready, drain on SIGTERM within the grace period, and start two replicas
at once on an empty database (the migration lock).
"""

from __future__ import annotations

import json
import threading

import psycopg
import pytest

from harness import APP_LOGIN, JWT_SECRET, ROOT
from kit import Container, Kit, container_url

pytestmark = [pytest.mark.slow, pytest.mark.image]

# The chart's defaults: terminationGracePeriodSeconds 35 = preStop 5 + drain 20 + margin.
GRACE = 35


def migration_files() -> list[int]:
    return sorted(int(p.name[1:].split("__")[0]) for p in (ROOT / "db/migrations").glob("V*.sql"))


def versions(url: str) -> list[tuple[int, int]]:
    with psycopg.connect(url) as c:
        return c.execute(
            "SELECT version, count(*) FROM switchboard.schema_version GROUP BY 1 ORDER BY 1"
        ).fetchall()


def replica_env(owner_url: str) -> dict[str, str]:
    """The pods' environment: the app login for requests, the owner to migrate."""
    return {
        "DATABASE_URL": container_url(owner_url.replace("postgres@", f"{APP_LOGIN}@", 1)),
        "SWITCHBOARD_MIGRATION_DATABASE_URL": container_url(owner_url),
        "SWITCHBOARD_JWT_SECRET": JWT_SECRET,
    }


def test_image_runs_as_the_charts_non_root_user(kit: Kit, image: str) -> None:
    assert kit.image_config()["User"] == "10001:10001"
    r = kit.run_once(["-c", "import os; print(os.getuid(), os.getgid(), os.geteuid())"],
                     entrypoint="python")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["10001", "10001", "10001"]


def test_root_filesystem_is_read_only_except_tmp(kit: Kit, image: str) -> None:
    probe = (
        "import errno, json\n"
        "out = {}\n"
        "for p in ['/x', '/app/x', '/opt/venv/lib/python3.11/site-packages/switchboard/db/x', '/opt/venv/x', '/etc/x', '/tmp/x']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); out[p] = 'written'\n"
        "    except OSError as e:\n"
        "        out[p] = errno.errorcode[e.errno]\n"
        "print(json.dumps(out))\n"
    )
    r = kit.run_once(["-c", probe], entrypoint="python")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {
        "/x": "EROFS", "/app/x": "EROFS", "/opt/venv/x": "EROFS",
        "/opt/venv/lib/python3.11/site-packages/switchboard/db/x": "EROFS",
        "/etc/x": "EROFS", "/tmp/x": "written",
    }


def test_migrate_from_the_image_on_an_empty_database(kit: Kit, image: str, empty_db: str) -> None:
    r = kit.run_once(["migrate"], env={"DATABASE_URL": container_url(empty_db)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert versions(empty_db) == [(v, 1) for v in migration_files()]
    with psycopg.connect(empty_db) as c:
        functions = c.execute(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'switchboard'"
        ).fetchone()[0]
    assert functions > 20  # the afterAll callback applied the wheel's switchboard/db/functions
    # Idempotent: a second run applies nothing.
    r = kit.run_once(["migrate"], env={"DATABASE_URL": container_url(empty_db)})
    assert r.returncode == 0, r.stdout + r.stderr
    assert versions(empty_db) == [(v, 1) for v in migration_files()]


def test_missing_setting_is_one_line_and_exit_2(kit: Kit, image: str) -> None:
    r = kit.run_once(["serve"])
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "DATABASE_URL" in r.stderr


def test_serve_turns_ready_and_drains_on_sigterm(
    kit: Kit, image: str, empty_db: str, template_db: str
) -> None:
    # No args: the image's own CMD (serve --host 0.0.0.0 --port 8000).
    c = kit.start([], env=replica_env(empty_db), what="serve")
    try:
        took = c.wait_status("/healthz/ready", 200)
        kit.figures.smoke["first replica ready on an empty database"] = f"{took:.1f} s"
        assert c.get("/healthz/live").status_code == 200
        metrics = c.get("/metrics")
        assert metrics.status_code == 200 and "switchboard_listen_connected 1" in metrics.text
        code, elapsed = c.stop(GRACE)
        kit.figures.smoke["SIGTERM to exit"] = f"{elapsed:.1f} s (exit {code}, grace {GRACE} s)"
        assert code == 0, c.logs()
        assert elapsed < GRACE
        with psycopg.connect(empty_db) as conn:
            # A drained replica deregisters itself.
            assert conn.execute("SELECT count(*) FROM switchboard.replicas").fetchone()[0] == 0
    finally:
        c.remove()


def test_two_replicas_at_once_on_an_empty_database(
    kit: Kit, image: str, empty_db: str, template_db: str
) -> None:
    started: list[Container] = []
    errors: list[BaseException] = []

    def start() -> None:
        try:
            started.append(kit.start([], env=replica_env(empty_db), what="pair"))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert len(started) == 2
        for c in started:
            c.wait_status("/healthz/ready", 200)
        # Both migrated under the lock: every version applied exactly once.
        assert versions(empty_db) == [(v, 1) for v in migration_files()]
        with psycopg.connect(empty_db) as conn:
            assert conn.execute("SELECT count(*) FROM switchboard.replicas").fetchone()[0] == 2
        codes = [c.stop(GRACE)[0] for c in started]
        assert codes == [0, 0], [c.logs() for c in started]
        kit.figures.smoke["two replicas at once on an empty database"] = "both ready, exit 0"
    finally:
        for c in started:
            c.remove()
