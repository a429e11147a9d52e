"""The chart's extension points, executed in the built image (issue 20 item 5).

chart/examples/handler-package.yaml and chart/examples/postgresql-tls.yaml,
merged, rendered by the real Helm engine and run as a kubelet would
(tests/image/pod.py): the handler image is built from examples/handler_package
(its Dockerfile, on the freshly built server image); the init container copies
the installed package into the shared emptyDir; the replica, with that
directory read-only on its PYTHONPATH and the CA Secret mounted for
PGSSLMODE=verify-full, migrates and serves over TLS only (the PostgreSQL here
rejects every non-TLS connection and its certificate names 10.0.2.2, the
address the container uses) and runs `example.greet` through the package's
entry point. With a CA that did not sign the server's certificate, the replica
refuses to start.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from harness import APP_LOGIN, JWT_SECRET, ROOT, make_user
from kit import HOST_FROM_CONTAINER, Kit
from pg_tls_kit import TlsPostgres
from pod import (
    CHART,
    PodVolumes,
    deployment,
    object_store,
    render,
    resolve,
    resolve_init,
    run_init,
    run_sidecar,
    sidecars,
    start_with,
    wait_probes,
)

pytestmark = [pytest.mark.slow, pytest.mark.image]

EXAMPLE = ROOT / "examples" / "handler_package"


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / "examples" / name).read_text())


def merged(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture(scope="module")
def handler_image(kit: Kit, image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """examples/handler_package/Dockerfile, built as its header says."""
    context = tmp_path_factory.mktemp("handler-image")
    src = context / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("dist", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(src / "dist"), str(src)],
                   check=True, capture_output=True, timeout=300)
    ref = f"localhost/switchboard-example-handlers:{kit.tag}"
    t0 = time.monotonic()
    kit.buildah("bud", "--isolation", "chroot", "--layers=false",
                "--build-arg", f"SWITCHBOARD_IMAGE={image}",
                "-f", str(src / "Dockerfile"), "-t", ref, str(src),
                timeout=600, what="buildah bud (examples/handler_package/Dockerfile)")
    kit.figures.smoke["handler image build"] = f"{time.monotonic() - t0:.1f} s"
    return ref


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[TlsPostgres]:
    pg = TlsPostgres(dns=["localhost"], ips=[HOST_FROM_CONTAINER, "127.0.0.1"])
    try:
        with psycopg.connect(pg.admin_url(), autocommit=True) as c:
            c.execute("CREATE ROLE switchboard_app NOLOGIN")
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN IN ROLE switchboard_app")
        yield pg
    finally:
        pg.stop()


def fresh_db(pg: TlsPostgres, name: str) -> str:
    with psycopg.connect(pg.admin_url(), autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    return name


def operator_secrets(pg: TlsPostgres, db: str, ca: Path) -> dict[str, dict[str, str]]:
    """What the operator created: the credentials (plain URLs, no ssl parameters)
    and the CA Secret of chart/examples/postgresql-tls.yaml."""
    host = f"{HOST_FROM_CONTAINER}:{pg.port}"
    return {
        "switchboard": {
            "DATABASE_URL": f"postgresql://{APP_LOGIN}@{host}/{db}",
            "SWITCHBOARD_MIGRATION_DATABASE_URL": f"postgresql://postgres@{host}/{db}",
            "SWITCHBOARD_JWT_SECRET": JWT_SECRET,
        },
        "postgresql-ca": {"ca.crt": ca.read_text()},
    }


def values_for(kit: Kit, handler_image: str) -> dict[str, Any]:
    values = merged(example("handler-package.yaml"), example("postgresql-tls.yaml"))
    repository, _, tag = kit.image_ref.rpartition(":")
    values["image"] = {"repository": repository, "tag": tag, "pullPolicy": "Never"}
    values["initContainers"][0]["image"] = handler_image
    return values


# A sidecar that checks the replica over the pod's shared loopback, as a proxy or a
# log shipper beside it would reach it; it prints what it got and exits.
SIDECAR_CHECK = """
import time, urllib.request
for _ in range(120):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8000/healthz/ready", timeout=2) as r:
            print("sidecar: replica ready", r.status); break
    except Exception as exc:
        time.sleep(0.5)
else:
    raise SystemExit("sidecar: replica never ready on 127.0.0.1:8000")
"""


def test_init_container_handler_package_and_verify_full_ca_in_the_image(
    kit: Kit, image: str, handler_image: str, tls_cluster: TlsPostgres, tmp_path: Path
) -> None:
    """Also the chart's other extension points, executed: `extraEnvFrom` (a Secret of
    the operator's, read last, so it overrides the chart's ConfigMap) and `sidecars`
    (run in the pod's network namespace, with the restricted securityContext)."""
    db = fresh_db(tls_cluster, "sb_ext_ok")
    values = values_for(kit, handler_image)
    values["extraEnvFrom"] = [{"secretRef": {"name": "switchboard-extra-env"}}]
    values["sidecars"] = [{
        "name": "ready-check", "image": image, "command": ["python", "-c", SIDECAR_CHECK],
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
    }]
    objects = render(values)
    template = deployment(objects)["spec"]["template"]
    secrets = operator_secrets(tls_cluster, db, tls_cluster.ca.cert)
    secrets["switchboard-extra-env"] = {"SWITCHBOARD_ALLOWED_ORIGINS": "https://app.example"}
    volumes = PodVolumes(template["spec"], object_store(objects, secrets), tmp_path / "volumes")
    run = resolve(template, objects, secrets)
    assert run.container["image"] == image
    assert run.env["PGSSLMODE"] == "verify-full"
    assert run.env["PYTHONPATH"] == "/opt/switchboard-handlers"
    assert "sslmode" not in run.env["DATABASE_URL"]
    assert run.env["SWITCHBOARD_ALLOWED_ORIGINS"] == "https://app.example"
    (sidecar,) = sidecars(template, objects, secrets)

    (init,) = resolve_init(template, objects, secrets)
    t0 = time.monotonic()
    run_init(kit, init, volumes)
    kit.figures.smoke["handler init container (cp -R)"] = f"{time.monotonic() - t0:.1f} s"
    copied = volumes.dirs["handlers"]
    assert (copied / "switchboard_example" / "handlers.py").exists()
    (dist,) = copied.glob("switchboard_example_handlers-1.0.0.dist-info")
    assert "example.greet" in (dist / "entry_points.txt").read_text()

    c = start_with(kit, run, volumes, what="extensions")
    try:
        took = wait_probes(c, run)
        kit.figures.smoke["extensions: startup probe (TLS verify-full, migrate)"] = f"{took['startup']:.1f} s"
        out = run_sidecar(kit, sidecar, c, volumes)
        assert "sidecar: replica ready 200" in out, out
        kit.figures.smoke["extensions: sidecar reached the replica on the pod's loopback"] = "200"
        # extraEnvFrom's Secret reached the process: its origin gets CORS answers.
        pre = httpx.options(c.base + "/auth/login", timeout=10, headers={
            "Origin": "https://app.example", "Access-Control-Request-Method": "POST"})
        assert pre.headers.get("access-control-allow-origin") == "https://app.example", pre.headers
        other = httpx.options(c.base + "/auth/login", timeout=10, headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.headers.get("access-control-allow-origin") is None, other.headers
        with psycopg.connect(tls_cluster.admin_url(db), autocommit=True) as conn:
            conns = conn.execute(
                "SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) "
                "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
                "AND a.usename IS NOT NULL").fetchall()
            owner = conn.execute("SELECT nspowner::regrole::text FROM pg_namespace "
                                 "WHERE nspname = 'switchboard'").fetchone()
        assert conns and all(ssl for _, ssl in conns), conns
        assert {u for u, _ in conns} == {APP_LOGIN}
        assert owner == ("postgres",)  # the start-up migration went over verify-full too
        # The package directory is the init container's output, read-only here.
        denied = c.exec("sh", "-c", "touch /opt/switchboard-handlers/x")
        assert denied.returncode != 0

        admin_url = tls_cluster.admin_url(db)
        make_user(admin_url, "admin", role="admin")
        uid = make_user(admin_url, "alice")
        r = httpx.post(c.base + "/auth/login", timeout=10,
                       json={"username": "admin", "password": "pw-" + "s" * 12})
        assert r.status_code == 200, r.text
        h = {"Authorization": f"Bearer {r.json()['access_token']}"}
        t = httpx.post(c.base + "/tasks", headers=h, timeout=10, json={
            "name": "greet-alice", "handler": "example.greet",
            "args": {"user_id": uid, "name": "Alice"}})
        assert t.status_code == 201, t.text
        tid = t.json()["id"]
        assert httpx.post(f"{c.base}/tasks/{tid}/trigger", headers=h, timeout=10).status_code == 202
        deadline = time.monotonic() + 60
        runs: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            runs = httpx.get(f"{c.base}/tasks/{tid}/runs", headers=h, timeout=10).json()["runs"]
            if runs and runs[0]["status"] in ("succeeded", "failed", "abandoned"):
                break
            time.sleep(0.2)
        assert runs and runs[0]["status"] == "succeeded", (runs, c.logs())
        assert runs[0]["result"]["run"] == runs[0]["id"]
        kit.figures.smoke["extensions: example.greet from the init container's package"] = "succeeded"
        code, _ = c.stop(int(run.pod["terminationGracePeriodSeconds"]))
        assert code == 0, c.logs()
    finally:
        c.remove()


def test_a_ca_that_did_not_sign_the_server_keeps_the_replica_from_starting(
    kit: Kit, image: str, handler_image: str, tls_cluster: TlsPostgres, tmp_path: Path
) -> None:
    db = fresh_db(tls_cluster, "sb_ext_wrong_ca")
    objects = render(values_for(kit, handler_image))
    template = deployment(objects)["spec"]["template"]
    secrets = operator_secrets(tls_cluster, db, tls_cluster.other_ca.cert)
    volumes = PodVolumes(template["spec"], object_store(objects, secrets), tmp_path / "volumes")
    run = resolve(template, objects, secrets)
    for init in resolve_init(template, objects, secrets):
        run_init(kit, init, volumes)
    c = start_with(kit, run, volumes, what="wrong-ca")
    try:
        deadline = time.monotonic() + 90
        while c.state().get("Running") and time.monotonic() < deadline:
            time.sleep(0.5)
        state = c.state()
        assert not state.get("Running"), "the replica kept running with a CA that does not match"
        assert state["ExitCode"] != 0
        assert "certificate verify failed" in c.logs()
        with psycopg.connect(tls_cluster.admin_url(db)) as conn:
            assert conn.execute("SELECT to_regnamespace('switchboard')").fetchone() == (None,)
    finally:
        c.remove()
