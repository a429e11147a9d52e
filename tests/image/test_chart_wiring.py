"""The chart's wiring, executed: what the Deployment declares, run in the image.

For the chart's defaults (plus an existing Secret, the documented smallest
install), for every chart/ci/*.yaml profile, and for two workers per pod, the
rendered container's command, args, env (Secret and ConfigMap references
resolved), port, probes, securityContext and drain settings are run as a
kubelet would (tests/image/pod.py) against a fresh database. This is the
closest thing to `helm install` without a cluster.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import httpx
import psycopg
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness import APP_LOGIN, JWT_SECRET
from kit import Kit, container_url
from monitoring import PROMETHEUS_SERIES, exported_name, used_metrics
from pod import CHART, deployment, delete, http_probe, render, resolve, start, wait_probes

pytestmark = [pytest.mark.slow, pytest.mark.image]

MINIMAL = {"secrets": {"existingSecret": "switchboard"}}
PROFILES: dict[str, dict[str, Any]] = {"defaults+existing-secret": MINIMAL}
for _path in sorted((CHART / "ci").glob("*.yaml")):
    PROFILES[f"ci/{_path.name}"] = yaml.safe_load(_path.read_text())
PROFILES["two-workers"] = {**copy.deepcopy(MINIMAL), "server": {"workers": 2}}


def test_profiles_cover_every_ci_values_file() -> None:
    assert {p for p in PROFILES if p.startswith("ci/")} == {
        f"ci/{p.name}" for p in (CHART / "ci").glob("*.yaml")}
    assert len(PROFILES) >= 3


def operator_secret(values: dict[str, Any], owner_url: str) -> dict[str, dict[str, str]]:
    """The Secret an operator creates for this profile (docs/how-to/operations/install.md)."""
    name = values["secrets"]["existingSecret"]
    keys = {"databaseUrl": "DATABASE_URL", "jwtSecret": "SWITCHBOARD_JWT_SECRET",
            "migrationDatabaseUrl": "SWITCHBOARD_MIGRATION_DATABASE_URL",
            **values["secrets"].get("keys", {})}
    return {name: {
        keys["databaseUrl"]: container_url(owner_url.replace("postgres@", f"{APP_LOGIN}@", 1)),
        keys["migrationDatabaseUrl"]: container_url(owner_url),
        keys["jwtSecret"]: JWT_SECRET,
    }}


@pytest.mark.parametrize("profile", list(PROFILES))
def test_rendered_deployment_runs_in_the_image(
    kit: Kit, image: str, empty_db: str, template_db: str, profile: str
) -> None:
    values = PROFILES[profile]
    objects = render(values)
    dep = deployment(objects)
    run = resolve(dep["spec"]["template"], objects, operator_secret(values, empty_db))
    # The securityContext's user is the image's user (the image owns nothing else).
    uid, gid = run.security()
    assert kit.image_config()["User"] == f"{uid}:{gid}"
    assert "SWITCHBOARD_LISTEN_DATABASE_URL" not in run.env  # optional key, absent: unset
    workers = int(run.args[run.args.index("--workers") + 1])

    c = start(kit, run, what="chart")
    try:
        took = wait_probes(c, run)
        kit.figures.smoke[f"chart {profile}: startup probe passed"] = f"{took['startup']:.1f} s"

        # Prometheus scrapes the pod port the ServiceMonitor names (http).
        path, port, _, _, _ = http_probe(run, "readinessProbe")
        assert port == run.port("http")
        text = httpx.get(c.base + "/metrics", timeout=10).text
        families = {f.name + ("_total" if f.type == "counter" else "")
                    for f in text_string_to_metric_families(text)}
        missing = sorted(n for n in used_metrics()
                         if exported_name(n) not in families and n not in PROMETHEUS_SERIES)
        if workers == 1:
            assert missing == []
        else:
            # prometheus-client's multiprocess collector shows a labelled counter
            # only after its first increment (there are no files before); every
            # gauge and histogram is there from the start.
            assert [n for n in missing if not n.endswith("_total")] == []

        with psycopg.connect(empty_db, autocommit=True) as conn:
            # Every worker of the pod is a registered replica; they serve as the app login.
            # The probes pass once one worker answers; the others register as they come up.
            deadline = time.monotonic() + 60
            while (n := conn.execute("SELECT count(*) FROM switchboard.replicas").fetchone()[0]) != workers:
                assert time.monotonic() < deadline, f"{n} of {workers} workers registered after 60 s"
                time.sleep(0.2)
            users = {r[0] for r in conn.execute(
                "SELECT usename FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND usename IS NOT NULL")}
        assert users == {APP_LOGIN}

        grace = int(run.pod["terminationGracePeriodSeconds"])
        code, elapsed, served = delete(c, run)
        kit.figures.smoke[f"chart {profile}: deletion to exit"] = (
            f"{elapsed:.1f} s of {grace} s grace (exit {code})")
        assert code == 0, c.logs()
        assert served, "stopped answering during the preStop sleep"
        assert elapsed < grace
        with psycopg.connect(empty_db) as conn:
            assert conn.execute("SELECT count(*) FROM switchboard.replicas").fetchone()[0] == 0
    finally:
        c.remove()


def test_a_missing_required_secret_key_is_a_config_error(empty_db: str) -> None:
    from pod import ConfigError

    objects = render(MINIMAL)
    secret = operator_secret(MINIMAL, empty_db)
    del secret["switchboard"]["SWITCHBOARD_JWT_SECRET"]
    with pytest.raises(ConfigError, match="no key 'SWITCHBOARD_JWT_SECRET'"):
        resolve(deployment(objects)["spec"]["template"], objects, secret)

