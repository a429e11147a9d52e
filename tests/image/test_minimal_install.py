"""The documented smallest install, run literally, from an empty database.

The SQL, the `kubectl create secret`, the `helm install --set` and the
first-admin command are read from docs/how-to/operations/install.md ("The smallest install,
step by step") — and must match the example at the top of chart/values.yaml.
They run against a fresh PostgreSQL cluster that checks passwords (scram) for
everyone but the DBA, so the URLs in the Secret really log in. The chart is
rendered with the documented values, and the rendered pods (the migration Job
first when enabled, then replicaCount replicas started at once) run in the
built image, as in tests/image/pod.py.
"""

from __future__ import annotations

import re
import secrets
import shlex
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from kit import HOST_FROM_CONTAINER, Container, Kit
from pod import PodRun, deployment, objects_of, render, resolve, start, wait_probes

from switchboard.pgtest import ThrowawayPostgres

pytestmark = [pytest.mark.slow, pytest.mark.image]

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "how-to" / "operations" / "install.md"
VALUES = ROOT / "chart" / "values.yaml"


# -- the documented steps ---------------------------------------------------------------
def doc_blocks() -> tuple[list[str], str, str]:
    """(SQL statements, the secret+helm shell block, the first-admin command)."""
    text = DOC.read_text()
    section = text[text.index("## The smallest install, step by step"):]
    section = section[: section.index("\n## ", 10)]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.DOTALL)
    sql = [b for lang, b in blocks if lang == "sql"]
    sh = [b for lang, b in blocks if lang == "sh"]
    assert len(sql) == 1 and len(sh) == 2, blocks
    statements = [s.strip() for s in _strip_sql_comments(sql[0]).split(";") if s.strip()]
    return statements, _dedent(sh[0]), _dedent(sh[1]).strip()


def _dedent(block: str) -> str:
    return "\n".join(line.strip() for line in block.splitlines())


def _strip_sql_comments(sql: str) -> str:
    return "\n".join(line.split("--")[0] for line in sql.splitlines())


def test_values_yaml_example_is_the_documented_one() -> None:
    statements, shell, _ = doc_blocks()
    header = []
    for line in VALUES.read_text().splitlines():
        if not line.startswith("#"):
            break
        header.append(line.lstrip("#").strip())
    header_text = "\n".join(header)
    header_sql = [s.strip() for s in _strip_sql_comments(header_text).split(";")]
    for statement in statements:
        assert any(s.endswith(statement) for s in header_sql), statement
    for line in shell.splitlines():
        assert line.strip() in header_text, line


def secret_and_values(shell: str) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The Secret (name, data) of `kubectl create secret generic` and the values of `helm install --set`."""
    joined = shell.replace("\\\n", " ")
    name, data, values = "", {}, {}
    for line in joined.splitlines():
        words = shlex.split(line.replace('"$(openssl rand -hex 32)"', secrets.token_hex(32)))
        if words[:4] == ["kubectl", "create", "secret", "generic"]:
            name = words[4]
            for w in words[5:]:
                key, _, value = w.removeprefix("--from-literal=").partition("=")
                data[key] = value
        elif words[:2] == ["helm", "install"]:
            for i, w in enumerate(words):
                if w == "--set":
                    path, _, value = words[i + 1].partition("=")
                    node = values
                    *parents, leaf = path.split(".")
                    for p in parents:
                        node = node.setdefault(p, {})
                    node[leaf] = {"true": True, "false": False}.get(value, value)
    assert name and data and values, shell
    return name, data, values


# -- a fresh cluster that checks passwords ---------------------------------------------
@pytest.fixture
def cluster() -> Iterator[ThrowawayPostgres]:
    pg = ThrowawayPostgres()
    try:
        hba = Path(pg.base_dir) / "cluster" / "data" / "pg_hba.conf"
        hba.write_text(
            "local all all trust\n"
            "host all postgres 127.0.0.1/32 trust\n"  # the suite's DBA
            "host all all 127.0.0.1/32 scram-sha-256\n"
        )
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute("SELECT pg_reload_conf()")
            c.execute("CREATE DATABASE app")
        yield pg
    finally:
        pg.stop()


def on_cluster(url: str, pg: ThrowawayPostgres) -> str:
    """The documented host db:5432 is this cluster, as the containers reach it."""
    return url.replace("@db:5432/", f"@{HOST_FROM_CONTAINER}:{pg.port}/")


def run_to_completion(kit: Kit, run: PodRun, timeout: float = 120) -> subprocess.CompletedProcess:
    """A Job's pod: the container runs once; its exit code is the Job's outcome."""
    env_flags = [f for k, v in run.env.items() for f in ("-e", f"{k}={v}")]
    import json

    cmd = kit.podman_cmd("run", "--rm", "--runtime", "runc",
                         "--network", "slirp4netns:allow_host_loopback=true",
                         "--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096",
                         *run.podman_flags(), "--entrypoint", json.dumps(run.entrypoint),
                         *env_flags, kit.image_ref, *run.args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("with_job", [False, True], ids=["start-up-migration", "migration-job"])
def test_documented_minimal_install_on_an_empty_database(
    kit: Kit, image: str, cluster: ThrowawayPostgres, with_job: bool
) -> None:
    statements, shell, admin_cmd = doc_blocks()
    # 1. The DBA's SQL, as written.
    with psycopg.connect(cluster.url("app"), autocommit=True) as c:
        for statement in statements:
            c.execute(statement)
    # 2. The Secret and the release.
    name, data, values = secret_and_values(shell)
    if with_job:
        values["migrationJob"] = {"enabled": True}
    secret = {name: {k: on_cluster(v, cluster) for k, v in data.items()}}
    objects = render(values)
    jobs = objects_of(objects, "Job")
    assert len(jobs) == (1 if with_job else 0)
    for job in jobs:
        assert "pre-install" in job["metadata"]["annotations"]["helm.sh/hook"]
        out = run_to_completion(kit, resolve(job["spec"]["template"], objects, secret))
        assert out.returncode == 0, out.stdout + out.stderr
    dep = deployment(objects)
    run = resolve(dep["spec"]["template"], objects, secret)
    assert ("--no-migrate" in run.args) == with_job
    assert ("SWITCHBOARD_MIGRATION_DATABASE_URL" in run.env) == (not with_job)

    replicas: list[Container] = []
    errors: list[BaseException] = []

    def start_one(i: int) -> None:
        try:
            replicas.append(start(kit, run, what=f"install{i}"))
        except BaseException as exc:  # noqa: BLE001 - asserted below
            errors.append(exc)

    threads = [threading.Thread(target=start_one, args=(i,)) for i in range(dep["spec"]["replicas"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not errors, errors
        assert len(replicas) == 2
        for c in replicas:
            wait_probes(c, run)
        with psycopg.connect(cluster.url("app")) as conn:
            owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace "
                                 "WHERE nspname = 'switchboard'").fetchone()[0]
            serving = {r[0] for r in conn.execute(
                "SELECT usename FROM pg_stat_activity WHERE datname = 'app' "
                "AND pid <> pg_backend_pid() AND usename IS NOT NULL")}
            live = conn.execute("SELECT count(*) FROM switchboard.replicas").fetchone()[0]
        # The cluster really checks the passwords the Secret carries.
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(f"postgresql://sb_app:wrong@127.0.0.1:{cluster.port}/app").close()
        assert owner == "sb_owner"
        assert serving == {"sb_app"}
        assert live == 2

        # 3. The first administrator, through a replica, then a login.
        m = re.fullmatch(r"kubectl exec -i deploy/\S+ -- (.+?) <<< '([^']+)'", admin_cmd)
        assert m, admin_cmd
        argv, password = shlex.split(m.group(1)), m.group(2)
        out = subprocess.run(kit.podman_cmd("exec", "-i", replicas[0].name, *argv),
                             input=password + "\n", capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        r = httpx.post(replicas[1].base + "/auth/login",
                       json={"username": "admin", "password": password}, timeout=10)
        assert r.status_code == 200, r.text
        kit.figures.smoke[f"documented install ({'job' if with_job else 'start-up'} migration)"] = (
            "2 replicas ready, admin login 200")
        for c in replicas:  # (the preStop/grace sequence is test_chart_wiring's)
            code, _ = c.stop(int(run.pod["terminationGracePeriodSeconds"]))
            assert code == 0, c.logs()
    finally:
        for c in replicas:
            c.remove()
