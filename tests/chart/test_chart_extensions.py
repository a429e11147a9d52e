"""The chart's extension points (issue 20 item 5), rendered by the real Helm
engine and validated against the Kubernetes schemas in strict mode.

extraEnv, extraEnvFrom, extraVolumes, extraVolumeMounts, initContainers,
sidecars, podAnnotations and podLabels (all templated with `tpl`, as bitnami's
common.tplvalues.render does), `database.tls` (a mounted CA, PGSSLMODE and
PGSSLROOTCERT), and autoscaling on open WebSockets per pod (an HPA `Pods`
metric served by prometheus-adapter). Every values file in chart/examples/ is
linted, rendered and validated, and docs/how-to/operations/extending.md quotes each of them
verbatim. tests/test_postgres_tls.py proves the TLS settings against a real
PostgreSQL; tests/image/test_extension_points_image.py runs the handler-package init
container and the mounted CA in the built image.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml
from test_chart import (
    CHART,
    KUBE_VERSIONS,
    MINIMAL,
    RELEASE,
    merged,
    only,
    render,
    validate_all,
)

ROOT = CHART.parent
EXAMPLES = sorted((CHART / "examples").glob("*.yaml"))
CHART_EXAMPLES = [p for p in EXAMPLES if p.name != "prometheus-adapter-values.yaml"]


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def example(name: str) -> dict[str, Any]:
    return yaml.safe_load((CHART / "examples" / name).read_text())


def pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    return only(objects, "Deployment")["spec"]["template"]["spec"]


def main_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = [c for c in pod_spec(objects)["containers"] if c["name"] == "switchboard"]
    return c


def test_chart_version_was_bumped_for_the_new_values() -> None:
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    major, minor, _ = (int(x) for x in meta["version"].split("."))
    assert (major, minor) >= (0, 2)


# --------------------------------------------------------------------------
# The example values files: lint, render, validate


@pytest.mark.parametrize("path", CHART_EXAMPLES, ids=lambda p: p.name)
def test_example_lints_strict(path: Path) -> None:
    report = helm.lint(CHART, yaml.safe_load(path.read_text()), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("path", CHART_EXAMPLES, ids=lambda p: p.name)
def test_example_renders_and_validates(chart: Any, path: Path, version: str) -> None:
    objects = render(chart, yaml.safe_load(path.read_text()))
    assert "Deployment" in validate_all(objects, version)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_operations_guide_quotes_every_example_verbatim(path: Path) -> None:
    guide = (ROOT / "docs" / "how-to" / "operations" / "extending.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", guide, re.DOTALL)
    assert path.read_text() in blocks, f"docs/how-to/operations/extending.md does not quote chart/examples/{path.name}"


def test_defaults_add_nothing(chart: Any) -> None:
    objects = render(chart, MINIMAL)
    pod = pod_spec(objects)
    assert "initContainers" not in pod
    assert [c["name"] for c in pod["containers"]] == ["switchboard"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    c = main_container(objects)
    assert not any(e["name"].startswith("PGSSL") for e in c["env"])
    assert len(c["envFrom"]) == 1


# --------------------------------------------------------------------------
# Every extension point, where it lands


def test_every_extension_point_lands_in_the_pod(chart: Any) -> None:
    objects = render(chart, example("extension-points.yaml"))
    dep = only(objects, "Deployment")
    meta = dep["spec"]["template"]["metadata"]
    pod = dep["spec"]["template"]["spec"]
    c = main_container(objects)
    # podAnnotations: templated, beside the chart's checksum.
    assert meta["annotations"]["example.com/release"] == RELEASE
    assert "checksum/config" in meta["annotations"]
    assert meta["labels"]["team"] == "payments"
    # extraEnv after the chart's own entries (the last duplicate wins in Kubernetes).
    names = [e["name"] for e in c["env"]]
    assert names[:2] == ["DATABASE_URL", "SWITCHBOARD_JWT_SECRET"]
    assert names[-2:] == ["SENTRY_ENVIRONMENT", "SENTRY_DSN"]
    assert c["env"][-1]["valueFrom"] == {"secretKeyRef": {"name": "sentry", "key": "dsn"}}
    # extraEnvFrom after the chart's ConfigMap, templated.
    assert c["envFrom"][1] == {"configMapRef": {"name": f"{RELEASE}-handler-settings", "optional": True}}
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"},
                                 {"name": "shared-logs", "mountPath": "/var/log/switchboard"}]
    assert [v["name"] for v in pod["volumes"]] == ["tmp", "shared-logs"]
    assert [i["name"] for i in pod["initContainers"]] == ["wait-for-dns"]
    # The replica stays the first container; sidecars follow it.
    assert [x["name"] for x in pod["containers"]] == ["switchboard", "log-shipper"]
    assert pod["containers"][1]["volumeMounts"][0]["readOnly"] is True


def test_pod_labels_are_templated_and_never_detach_the_selector(chart: Any) -> None:
    values = merged(MINIMAL, {"podLabels": {
        "release-copy": "{{ .Release.Name }}",
        "app.kubernetes.io/name": "hijacked",
        "app.kubernetes.io/instance": "hijacked",
        "app.kubernetes.io/part-of": "shop",
    }})
    objects = render(chart, values)
    dep = only(objects, "Deployment")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert labels["release-copy"] == RELEASE
    assert labels["app.kubernetes.io/part-of"] == "shop"  # a non-selector label may be changed
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert only(objects, "Service")["spec"]["selector"].items() <= labels.items()


# --------------------------------------------------------------------------
# Handler packages through an init container


@pytest.mark.parametrize("name", ["handler-package.yaml", "handler-package-pip.yaml"])
def test_handler_package_init_container_shares_a_directory_on_pythonpath(chart: Any, name: str) -> None:
    objects = render(chart, example(name))
    pod = pod_spec(objects)
    c = main_container(objects)
    (init,) = pod["initContainers"]
    (target,) = [m for m in init["volumeMounts"] if m["name"] == "handlers"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "handlers"]
    assert mount["mountPath"] == target["mountPath"] and mount["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == "handlers"]
    assert "emptyDir" in volume
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["PYTHONPATH"] == mount["mountPath"]
    assert target["mountPath"] in " ".join(init["command"])
    # The restricted profile holds for the init container too.
    assert init["securityContext"]["runAsNonRoot"] is True
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_pip_variant_runs_the_servers_own_image(chart: Any) -> None:
    objects = render(chart, example("handler-package-pip.yaml"))
    (init,) = pod_spec(objects)["initContainers"]
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert init["image"] == main_container(objects)["image"] == f"switchboard:{app_version}"
    assert init["command"][:2] == ["pip", "install"]


# --------------------------------------------------------------------------
# TLS to PostgreSQL


def tls_env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env", []) if e["name"].startswith("PGSSL")}


def test_database_tls_mounts_the_ca_and_points_libpq_at_it(chart: Any) -> None:
    objects = render(chart, example("postgresql-tls.yaml"))
    c = main_container(objects)
    assert tls_env(c) == {"PGSSLMODE": "verify-full",
                          "PGSSLROOTCERT": "/etc/switchboard/postgresql-ca/ca.crt"}
    assert {"name": "postgresql-ca", "mountPath": "/etc/switchboard/postgresql-ca",
            "readOnly": True} in c["volumeMounts"]
    (volume,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "postgresql-ca"]
    assert volume["secret"] == {"secretName": "postgresql-ca", "defaultMode": 0o444,
                                "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    # The URLs still come from the Secret, untouched.
    assert c["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "DATABASE_URL"


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_database_tls_from_a_configmap_and_in_the_migration_job(chart: Any, version: str) -> None:
    values = merged(MINIMAL, {
        "migrationJob": {"enabled": True},
        "database": {"tls": {"enabled": True, "sslMode": "verify-ca", "caConfigMap": "trust-bundle",
                             "caKey": "root-certs.pem", "mountPath": "/etc/pg-ca/"}},
        "extraEnv": [{"name": "PGCONNECT_TIMEOUT", "value": "5"}],
    })
    objects = render(chart, values)
    validate_all(objects, version)
    job = only(objects, "Job")["spec"]["template"]["spec"]
    for c, pod in ((main_container(objects), pod_spec(objects)), (job["containers"][0], job)):
        assert tls_env(c) == {"PGSSLMODE": "verify-ca", "PGSSLROOTCERT": "/etc/pg-ca/root-certs.pem"}
        (volume,) = [v for v in pod["volumes"] if v["name"] == "postgresql-ca"]
        assert volume["configMap"]["name"] == "trust-bundle"
        assert {"name": "PGCONNECT_TIMEOUT", "value": "5"} in c["env"]


# --------------------------------------------------------------------------
# Autoscaling on sockets per pod


def test_hpa_scales_on_sockets_per_pod(chart: Any) -> None:
    objects = render(chart, example("autoscaling-sockets.yaml"))
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Resource", "Pods"]
    assert hpa["spec"]["metrics"][1]["pods"] == {
        "metric": {"name": "switchboard_websockets_open"},
        "target": {"type": "AverageValue", "averageValue": "2000"},
    }
    assert only(objects, "ServiceMonitor")  # prometheus-adapter reads what Prometheus scraped


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_hpa_on_sockets_alone_and_extra_metrics(chart: Any, version: str) -> None:
    values = merged(MINIMAL, {"autoscaling": {
        "enabled": True, "targetCPUUtilizationPercentage": 0,
        "sockets": {"targetAveragePerPod": 500},
        "extraMetrics": [{"type": "Object", "object": {
            "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "{{ .Release.Name }}-switchboard"},
            "metric": {"name": "requests_per_second"},
            "target": {"type": "Value", "value": "1k"}}}],
    }})
    objects = render(chart, values)
    validate_all(objects, version)
    metrics = only(objects, "HorizontalPodAutoscaler")["spec"]["metrics"]
    assert [m["type"] for m in metrics] == ["Pods", "Object"]
    assert metrics[1]["object"]["describedObject"]["name"] == f"{RELEASE}-switchboard"


def test_the_adapter_rule_serves_the_gauge_the_server_exports_under_the_charts_name(chart: Any) -> None:
    rule = example("prometheus-adapter-values.yaml")["rules"]["custom"][0]
    series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)  # type: ignore[union-attr]
    metrics_py = (ROOT / "server" / "switchboard" / "metrics.py").read_text()
    assert re.search(rf'"{series}": \("Open WebSockets', metrics_py)
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    assert rule["name"]["as"] == chart.values["autoscaling"]["sockets"]["metricName"]
    assert example("autoscaling-sockets.yaml")["autoscaling"]["sockets"]["metricName"] == rule["name"]["as"]


# --------------------------------------------------------------------------
# Refusals: the template's `fail` and the schema


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"database": {"tls": {"enabled": True}}}, "database.tls.enabled needs database.tls.caSecret"),
        ({"database": {"tls": {"enabled": True, "caSecret": "a", "caConfigMap": "b"}}},
         "either database.tls.caSecret or database.tls.caConfigMap"),
        ({"extraVolumes": [{"name": "tmp", "emptyDir": {}}]}, 'the volume name "tmp" is the chart\'s own'),
        ({"sidecars": [{"name": "switchboard", "image": "x"}]}, "is the replica's own"),
        ({"autoscaling": {"enabled": True, "targetCPUUtilizationPercentage": 0}}, "has no metric"),
    ],
    ids=["tls-no-ca", "tls-two-cas", "volume-tmp", "sidecar-name", "hpa-no-metric"],
)
def test_inconsistent_extension_values_refuse_to_render(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(chart, merged(MINIMAL, values))


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"extraEnv": [{"name": "DATABASE_URL", "value": "postgresql://u:p@db/app"}]}, "/extraEnv/0"),
        ({"extraEnv": [{"name": "SWITCHBOARD_JWT_SECRET", "value": "x" * 40}]}, "/extraEnv/0"),
        ({"extraEnv": [{"value": "x"}]}, "/extraEnv/0"),
        ({"extraEnv": {"A": "b"}}, "/extraEnv"),
        ({"extraEnvFrom": [{}]}, "/extraEnvFrom/0"),
        ({"extraVolumes": [{"emptyDir": {}}]}, "/extraVolumes/0"),
        ({"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}, "/extraVolumeMounts/0/mountPath"),
        ({"initContainers": [{"name": "x"}]}, "/initContainers/0"),
        ({"sidecars": [{"image": "x"}]}, "/sidecars/0"),
        ({"podAnnotations": {"a": 1}}, "/podAnnotations/a"),
        ({"database": {"tls": {"enabled": True, "sslMode": "require"}}}, "/database/tls/sslMode"),
        ({"database": {"tls": {"mountPath": "certs"}}}, "/database/tls/mountPath"),
        ({"database": {"tls": {"caFile": "x"}}}, "'caFile' not allowed"),
        ({"autoscaling": {"sockets": {"targetAveragePerPod": -1}}}, "/autoscaling/sockets/targetAveragePerPod"),
        ({"autoscaling": {"sockets": {"metricName": "web sockets"}}}, "/autoscaling/sockets/metricName"),
        ({"autoscaling": {"extraMetrics": [{"type": "Cpu"}]}}, "/autoscaling/extraMetrics/0/type"),
    ],
)
def test_schema_rejects_bad_extension_values(chart: Any, values: dict[str, Any], where: str) -> None:
    bad = merged(MINIMAL, values)
    with pytest.raises(helm.HelmValuesError) as raised:
        render(chart, bad)
    assert where in str(raised.value), str(raised.value)


def test_extra_env_may_take_credentials_from_a_secret(chart: Any) -> None:
    """The schema refuses plain credential values, not a valueFrom."""
    values = merged(MINIMAL, {"extraEnv": [{"name": "SWITCHBOARD_LISTEN_DATABASE_URL", "valueFrom": {
        "secretKeyRef": {"name": "direct", "key": "url"}}}]})
    assert main_container(render(chart, values))["env"][-1]["name"] == "SWITCHBOARD_LISTEN_DATABASE_URL"


def test_notes_name_the_console_and_the_postgresql_ca(chart: Any) -> None:
    raw = chart.render(values=example("postgresql-tls.yaml"), name=RELEASE, namespace="apps", is_install=True)
    notes = raw["switchboard/templates/NOTES.txt"]
    assert 'PostgreSQL TLS: verify-full against the CA in Secret "postgresql-ca"' in notes
    assert "http://127.0.0.1:8080/console" in notes
    plain = chart.render(values=MINIMAL, name=RELEASE, namespace="apps", is_install=True)
    assert "PostgreSQL TLS" not in plain["switchboard/templates/NOTES.txt"]
