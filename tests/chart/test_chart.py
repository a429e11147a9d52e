"""The Helm chart and the container image, checked offline.

The chart is linted and rendered by the real Helm engine (helm-python-sdk binds
Helm's Go SDK, so `values.schema.json`, `fail` and `required` behave exactly as
in `helm install`), and every rendered object is validated against the
Kubernetes OpenAPI schemas in strict mode (unknown fields are errors) for the
oldest Kubernetes the chart supports and the newest the validator ships.

The Dockerfile is parsed here and its claims are checked against the
repository: the console script it runs, the files it copies, the user it runs
as, and the absence of build tools in the final stage. tests/image/ builds it
(buildah) and runs it and the chart's rendered pods (podman).
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import glob
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "chart"
DOCKERFILE = ROOT / "Dockerfile"

# The chart's kubeVersion floor and the newest schemas the validator ships.
OLDEST_KUBE = "1.27"
NEWEST_KUBE = kubernetes_validate.latest_version()
KUBE_VERSIONS = [OLDEST_KUBE, NEWEST_KUBE]

RELEASE = "sb"
NAMESPACE = "apps"
FULLNAME = "sb-switchboard"

# The smallest install: everything default except where the credentials live.
MINIMAL: dict[str, Any] = {"secrets": {"existingSecret": "switchboard-db"}}
HA: dict[str, Any] = yaml.safe_load((CHART / "ci" / "ha-values.yaml").read_text())

DB_URL = "postgresql://switchboard_app:db-pass-81f2c9@db.internal:5432/switchboard"
MIGRATION_URL = "postgresql://switchboard_owner:owner-pass-5d0e77@db.internal:5432/switchboard"
LISTEN_URL = "postgresql://switchboard_app:listen-pass-c41a0b@db-direct:5432/switchboard"
JWT = "jwt-signing-secret-3b9e1f6a0c-5d7e9f1a2b4c"  # >= 32 characters, as the server requires
INLINE: dict[str, Any] = {
    "secrets": {
        "databaseUrl": DB_URL,
        "jwtSecret": JWT,
        "migrationDatabaseUrl": MIGRATION_URL,
        "listenDatabaseUrl": LISTEN_URL,
    }
}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge value overlays, later ones winning (like repeated -f)."""
    out: dict[str, Any] = {}
    for layer in layers:
        _merge_into(out, copy.deepcopy(layer))
    return out


def _merge_into(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge_into(dst[key], value)
        else:
            dst[key] = value


@pytest.fixture(scope="module")
def chart() -> Any:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_raw(chart: Any, values: dict[str, Any] | None) -> dict[str, str]:
    return chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(chart: Any, values: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every object the chart renders (NOTES.txt excluded), in file order."""
    objects = []
    for path, text in sorted(render_raw(chart, values).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


def only(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = only(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["switchboard"]
    return containers[0]


# --------------------------------------------------------------------------
# 1. helm lint --strict, through the real Helm engine


@pytest.mark.parametrize(
    "values",
    [None, MINIMAL, HA, merged(MINIMAL, INLINE)],
    ids=["chart-defaults", "minimal", "ha", "inline-secret"],
)
@pytest.mark.parametrize(
    "kube_version", [None, f"v{OLDEST_KUBE}.0"], ids=["helm-default", "oldest"]
)
def test_helm_lint_strict_passes(values: dict[str, Any] | None, kube_version: str | None) -> None:
    report = helm.lint(CHART, values, strict=True, kube_version=kube_version)
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); warnings (2) and
    # errors (3) fail a --strict lint.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_helm_lint_reports_a_schema_violation() -> None:
    report = helm.lint(CHART, {"replicaCount": -1}, strict=True)
    assert report["errors"], report
    assert any("replicaCount" in e for e in report["errors"])


# --------------------------------------------------------------------------
# 2. Every rendered object against the Kubernetes schemas, strictly

PROFILES: dict[str, dict[str, Any]] = {
    "minimal": MINIMAL,
    "ha": HA,
    "inline-secret": merged(MINIMAL, {"secrets": {"existingSecret": ""}}, INLINE),
    "single-replica": merged(MINIMAL, {"replicaCount": 1}),
    "hpa-memory-min-available": merged(
        HA,
        {
            "autoscaling": {"targetMemoryUtilizationPercentage": 80},
            "pdb": {"maxUnavailable": "", "minAvailable": 2},
            "tmpVolume": {"medium": "Memory"},
            "server": {"migrateOnStart": False, "workers": 2},
            "image": {"digest": "sha256:" + "ab" * 32},
            "imagePullSecrets": [{"name": "regcred"}],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "sb"}],
            "nodeSelector": {"kubernetes.io/os": "linux"},
            "priorityClassName": "high",
        },
    ),
}


def validate_all(objects: list[dict[str, Any]], version: str) -> list[str]:
    validated = []
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema in kubernetes-validate; checked by hand below
        kubernetes_validate.validate(obj, version, strict=True)
        validated.append(obj["kind"])
    return validated


@pytest.mark.parametrize("version", KUBE_VERSIONS)
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_rendered_objects_validate_against_kubernetes_schemas(
    chart: Any, profile: str, version: str
) -> None:
    validated = validate_all(render(chart, PROFILES[profile]), version)
    assert "Deployment" in validated and "Service" in validated and "ConfigMap" in validated


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_ha_renders_every_optional_object(chart: Any, version: str) -> None:
    objects = render(chart, HA)
    assert kinds(objects) == [
        "ConfigMap",
        "ConfigMap",  # the Grafana dashboard
        "Deployment",
        "HorizontalPodAutoscaler",
        "Ingress",
        "NetworkPolicy",
        "Pod",  # the helm test hook
        "PodDisruptionBudget",
        "PrometheusRule",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    ]
    assert sorted(validate_all(objects, version)) == [
        k for k in kinds(objects) if k not in ("ServiceMonitor", "PrometheusRule")
    ]


def test_minimal_renders_the_core_objects_only(chart: Any) -> None:
    assert kinds(render(chart, MINIMAL)) == [
        "ConfigMap",
        "Deployment",
        "Pod",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]


def test_sleep_action_prestop_validates_where_kubernetes_has_it(chart: Any) -> None:
    objects = render(chart, merged(MINIMAL, {"preStop": {"mode": "sleepAction"}}))
    assert container(objects)["lifecycle"]["preStop"] == {"sleep": {"seconds": 5}}
    validate_all(objects, "1.30")
    validate_all(objects, NEWEST_KUBE)
    # The validator is strict enough to matter: before 1.29 the field is unknown.
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_all(objects, OLDEST_KUBE)


def test_service_monitor_structure(chart: Any) -> None:
    objects = render(chart, HA)
    sm = only(objects, "ServiceMonitor")
    service = only(objects, "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["name"] == FULLNAME
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert set(sm["spec"]) == {"selector", "namespaceSelector", "endpoints"}
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    # The selector must pick the chart's Service.
    selector = sm["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]
    assert "http" in [p["name"] for p in service["spec"]["ports"]]


# --------------------------------------------------------------------------
# 3. What the rendered objects say


def test_replicas_default_to_two(chart: Any) -> None:
    assert chart.values["replicaCount"] == 2
    assert only(render(chart, MINIMAL), "Deployment")["spec"]["replicas"] == 2
    assert (
        only(render(chart, merged(MINIMAL, {"replicaCount": 5})), "Deployment")["spec"]["replicas"]
        == 5
    )


def test_ha_hands_replicas_to_the_autoscaler(chart: Any) -> None:
    objects = render(chart, HA)
    deployment = only(objects, "Deployment")
    assert "replicas" not in deployment["spec"]  # helm upgrade must not fight the HPA
    hpa = only(objects, "HorizontalPodAutoscaler")
    assert hpa["spec"]["minReplicas"] == 3 and hpa["spec"]["maxReplicas"] == 10
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert [m["resource"]["name"] for m in hpa["spec"]["metrics"]] == ["cpu"]
    assert hpa["spec"]["metrics"][0]["resource"]["target"] == {
        "type": "Utilization",
        "averageUtilization": 70,
    }


def test_probes_port_and_paths(chart: Any) -> None:
    c = container(render(chart, MINIMAL))
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz/live", "port": "http"}
    assert c["startupProbe"]["httpGet"] == {"path": "/healthz/live", "port": "http"}
    # The start-up budget covers migrations (and waiting for another replica's lock).
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120


def test_service_routes_port_80_to_http(chart: Any) -> None:
    objects = render(chart, MINIMAL)
    service = only(objects, "Service")
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_command_serves_and_migrates_unless_told_not_to(chart: Any) -> None:
    c = container(render(chart, MINIMAL))
    assert c["command"] == ["switchboard"]
    assert c["args"] == ["serve", "--host", "0.0.0.0", "--port", "8000", "--workers", "1"]
    c = container(render(chart, merged(MINIMAL, {"server": {"migrateOnStart": False}})))
    assert c["args"][-1] == "--no-migrate"


def test_rolling_update_never_drops_below_ready_count(chart: Any) -> None:
    spec = only(render(chart, MINIMAL), "Deployment")["spec"]
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    assert spec["minReadySeconds"] >= 1


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"replicaCount": 1}, None),
        ({"replicaCount": 2}, {"maxUnavailable": 1}),
        ({"replicaCount": 2, "pdb": {"enabled": False}}, None),
        (
            {
                "replicaCount": 1,
                "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 4},
            },
            {"maxUnavailable": 1},
        ),
        (
            {
                "replicaCount": 3,
                "autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 4},
            },
            None,
        ),
        (
            {"replicaCount": 3, "pdb": {"maxUnavailable": "", "minAvailable": 2}},
            {"minAvailable": 2},
        ),
        ({"replicaCount": 4, "pdb": {"maxUnavailable": "50%"}}, {"maxUnavailable": "50%"}),
    ],
    ids=[
        "one-replica",
        "two-replicas",
        "disabled",
        "hpa-min-2",
        "hpa-min-1",
        "min-available",
        "percent",
    ],
)
def test_pdb_only_when_more_than_one_replica_always_runs(
    chart: Any, values: dict[str, Any], expected: dict[str, Any] | None
) -> None:
    objects = render(chart, merged(MINIMAL, values))
    pdbs = [o for o in objects if o["kind"] == "PodDisruptionBudget"]
    if expected is None:
        assert pdbs == []
        return
    (pdb,) = pdbs
    budget = {k: v for k, v in pdb["spec"].items() if k in ("minAvailable", "maxUnavailable")}
    assert budget == expected
    assert pdb["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_ha_has_a_pdb(chart: Any) -> None:
    assert only(render(chart, HA), "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_replicas_spread_over_nodes_and_zones(chart: Any) -> None:
    objects = render(chart, MINIMAL)
    pod = only(objects, "Deployment")["spec"]["template"]
    constraints = pod["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in constraints] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    for c in constraints:
        assert c["whenUnsatisfiable"] == "ScheduleAnyway"
        assert c["maxSkew"] == 1
        assert c["labelSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        assert c["matchLabelKeys"] == ["pod-template-hash"]
    assert "affinity" not in pod["spec"]  # anti-affinity is opt-in


def test_optional_preferred_anti_affinity(chart: Any) -> None:
    pod = only(render(chart, HA), "Deployment")["spec"]["template"]
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert term["weight"] == 100
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["podAffinityTerm"]["labelSelector"]["matchLabels"].items()
        <= pod["metadata"]["labels"].items()
    )
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution"
        not in pod["spec"]["affinity"]["podAntiAffinity"]
    )


def test_restricted_security_context(chart: Any) -> None:
    objects = render(chart, MINIMAL)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    # /tmp is the only writable path.
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    sa = only(objects, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"] == FULLNAME
    assert sa["automountServiceAccountToken"] is False


def test_secrets_are_referenced_never_inlined(chart: Any) -> None:
    raw = render_raw(chart, merged(MINIMAL, {"secrets": {"existingSecret": ""}}, INLINE))
    objects = [
        d for p, t in raw.items() if not p.endswith("NOTES.txt") for d in yaml.safe_load_all(t) if d
    ]
    for path, text in raw.items():
        for plaintext in (DB_URL, MIGRATION_URL, LISTEN_URL, JWT, "db-pass-81f2c9"):
            assert plaintext not in text, f"{plaintext!r} appears in {path}"
    secret = only(objects, "Secret")
    decoded = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert decoded == {
        "DATABASE_URL": DB_URL,
        "SWITCHBOARD_JWT_SECRET": JWT,
        "SWITCHBOARD_MIGRATION_DATABASE_URL": MIGRATION_URL,
        "SWITCHBOARD_LISTEN_DATABASE_URL": LISTEN_URL,
    }
    env = {e["name"]: e for e in container(objects)["env"]}
    assert set(env) == set(decoded)
    for name, entry in env.items():
        assert "value" not in entry, f"{name} is a plain env value"
        assert entry["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
        assert entry["valueFrom"]["secretKeyRef"]["key"] == name
    # Optional URLs fall back to DATABASE_URL when the key is missing.
    assert (
        env["SWITCHBOARD_MIGRATION_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True
    )
    assert env["SWITCHBOARD_LISTEN_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert "optional" not in env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert "optional" not in env["SWITCHBOARD_JWT_SECRET"]["valueFrom"]["secretKeyRef"]
    configmap = only(objects, "ConfigMap")
    assert not any(re.search("DATABASE_URL|JWT", key) for key in configmap["data"])


def test_existing_secret_with_custom_key_names(chart: Any) -> None:
    objects = render(
        chart,
        {
            "secrets": {
                "existingSecret": "vault-sb",
                "keys": {
                    "databaseUrl": "app-url",
                    "jwtSecret": "jwt",
                    "migrationDatabaseUrl": "owner-url",
                    "listenDatabaseUrl": "direct-url",
                    "readDatabaseUrl": "replica-url",
                },
            }
        },
    )
    assert "Secret" not in kinds(objects)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container(objects)["env"]}
    assert {n: (r["name"], r["key"]) for n, r in refs.items()} == {
        "DATABASE_URL": ("vault-sb", "app-url"),
        "SWITCHBOARD_JWT_SECRET": ("vault-sb", "jwt"),
        "SWITCHBOARD_MIGRATION_DATABASE_URL": ("vault-sb", "owner-url"),
        "SWITCHBOARD_LISTEN_DATABASE_URL": ("vault-sb", "direct-url"),
        "SWITCHBOARD_READ_DATABASE_URL": ("vault-sb", "replica-url"),
    }


def test_a_read_replica_url_goes_through_the_secret_never_the_configmap(chart: Any) -> None:
    """secrets.readDatabaseUrl (SWITCHBOARD_READ_DATABASE_URL, history reads on a streaming
    replica): in the chart-created Secret and an optional secretKeyRef; never plain env."""
    replica = "postgresql://switchboard_app:ro-pass-7e21@db-ro:5432/switchboard"
    objects = render(chart, {"secrets": {"databaseUrl": DB_URL, "jwtSecret": JWT, "readDatabaseUrl": replica},
                             "config": {"extra": {"SWITCHBOARD_READ_MAX_LAG": "3"}}})
    secret = only(objects, "Secret")["data"]
    assert base64.b64decode(secret["SWITCHBOARD_READ_DATABASE_URL"]).decode() == replica
    env = {e["name"]: e for e in container(objects)["env"]}
    ref = env["SWITCHBOARD_READ_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"], ref["optional"]) == (FULLNAME, "SWITCHBOARD_READ_DATABASE_URL", True)
    configmap = only(objects, "ConfigMap")["data"]
    assert configmap["SWITCHBOARD_READ_MAX_LAG"] == "3"
    assert replica not in str(configmap) and "value" not in env["SWITCHBOARD_READ_DATABASE_URL"]
    with pytest.raises(Exception, match="readDatabaseUrl empty"):
        render(chart, {"secrets": {"existingSecret": "vault-sb", "readDatabaseUrl": replica}})


def test_inline_secret_without_optional_urls_sets_no_optional_env(chart: Any) -> None:
    objects = render(chart, {"secrets": {"databaseUrl": DB_URL, "jwtSecret": JWT}})
    assert sorted(only(objects, "Secret")["data"]) == ["DATABASE_URL", "SWITCHBOARD_JWT_SECRET"]
    assert [e["name"] for e in container(objects)["env"]] == [
        "DATABASE_URL",
        "SWITCHBOARD_JWT_SECRET",
    ]


def test_settings_come_from_the_configmap(chart: Any) -> None:
    values = merged(
        MINIMAL,
        {
            "config": {
                "poolSize": 7,
                "logLevel": "debug",
                "trustedProxies": "10.0.0.0/8",
                "allowedOrigins": "https://app.example.com",
                "extra": {"SWITCHBOARD_EVENT_RETENTION_SECONDS": "600"},
            }
        },
    )
    objects = render(chart, values)
    configmap = only(objects, "ConfigMap")
    assert configmap["data"] == {
        "SWITCHBOARD_POOL_SIZE": "7",
        "SWITCHBOARD_SHUTDOWN_GRACE_SECONDS": "20",
        "SWITCHBOARD_LOG_LEVEL": "debug",
        "SWITCHBOARD_TRUSTED_PROXIES": "10.0.0.0/8",
        "SWITCHBOARD_ALLOWED_ORIGINS": "https://app.example.com",
        "SWITCHBOARD_EVENT_RETENTION_SECONDS": "600",
    }
    assert container(objects)["envFrom"] == [
        {"configMapRef": {"name": configmap["metadata"]["name"]}}
    ]
    # Empty settings are left unset (server default), not set to "".
    assert "SWITCHBOARD_TRUSTED_PROXIES" not in only(render(chart, MINIMAL), "ConfigMap")["data"]


def pod_annotations(chart: Any, values: dict[str, Any]) -> dict[str, str]:
    return only(render(chart, values), "Deployment")["spec"]["template"]["metadata"]["annotations"]


def test_config_checksum_rolls_pods_on_config_change(chart: Any) -> None:
    base = pod_annotations(chart, MINIMAL)
    assert re.fullmatch(r"[0-9a-f]{64}", base["checksum/config"])
    assert pod_annotations(chart, MINIMAL) == base  # deterministic
    assert (
        pod_annotations(chart, merged(MINIMAL, {"replicaCount": 4})) == base
    )  # scaling rolls nothing
    changed = pod_annotations(chart, merged(MINIMAL, {"config": {"logLevel": "debug"}}))
    assert changed["checksum/config"] != base["checksum/config"]
    # An existing Secret is invisible to the chart: no secret checksum claimed.
    assert "checksum/secret" not in base


def test_secret_checksum_rolls_pods_on_secret_change(chart: Any) -> None:
    one = pod_annotations(chart, {"secrets": {"databaseUrl": DB_URL, "jwtSecret": JWT}})
    two = pod_annotations(
        chart, {"secrets": {"databaseUrl": DB_URL, "jwtSecret": JWT + "-rotated"}}
    )
    assert one["checksum/config"] == two["checksum/config"]
    assert one["checksum/secret"] != two["checksum/secret"]


def test_graceful_drain_fits_in_the_grace_period(chart: Any) -> None:
    objects = render(chart, MINIMAL)
    pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    c = container(objects)
    assert c["lifecycle"]["preStop"] == {"exec": {"command": ["/bin/sleep", "5"]}}
    drain = int(only(objects, "ConfigMap")["data"]["SWITCHBOARD_SHUTDOWN_GRACE_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > 5 + drain


@pytest.mark.parametrize(
    "values",
    [
        {"terminationGracePeriodSeconds": 25},  # 5 + 20: no margin at all
        {"terminationGracePeriodSeconds": 10},
        {"config": {"shutdownGraceSeconds": 40}},  # drain raised, grace forgotten
        {"preStop": {"sleepSeconds": 30}},
    ],
    ids=["equal", "short", "drain-raised", "sleep-raised"],
)
def test_too_short_grace_period_refuses_to_render(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(
        helm.HelmRenderError, match="terminationGracePeriodSeconds .* must be larger than"
    ):
        render(chart, merged(MINIMAL, values))


def test_grace_period_one_second_over_renders(chart: Any) -> None:
    pod = only(render(chart, merged(MINIMAL, {"terminationGracePeriodSeconds": 26})), "Deployment")
    assert pod["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 26


def test_ingress_keeps_websockets_open(chart: Any) -> None:
    ingress = only(render(chart, HA), "Ingress")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert annotations["nginx.ingress.kubernetes.io/proxy-send-timeout"] == "3600"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "switchboard.example.com"
    for path in rule["http"]["paths"]:
        assert path["backend"]["service"] == {"name": FULLNAME, "port": {"name": "http"}}
    # User annotations win over the defaults.
    override = merged(
        HA, {"ingress": {"annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "7200"}}}
    )
    annotations = only(render(chart, override), "Ingress")["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "7200"


def test_network_policy_opens_only_the_http_port(chart: Any) -> None:
    policy = only(render(chart, HA), "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    test_pod = only(render(chart, HA), "Pod")
    # The ingress controller, Prometheus, and the `helm test` pod.
    assert len(rule["from"]) == 3
    assert (
        rule["from"][2]["podSelector"]["matchLabels"].items()
        <= test_pod["metadata"]["labels"].items()
    )
    egress_ports = [p["port"] for r in policy["spec"]["egress"] for p in r.get("ports", [])]
    assert 53 in egress_ports and 5432 in egress_ports


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_helm_test_pod_is_never_counted_as_a_replica(chart: Any) -> None:
    objects = render(chart, HA)
    test_pod = only(objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    labels = test_pod["metadata"]["labels"]
    pod_labels = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = {
        "Service": only(objects, "Service")["spec"]["selector"],
        "PodDisruptionBudget": only(objects, "PodDisruptionBudget")["spec"]["selector"][
            "matchLabels"
        ],
        "NetworkPolicy": only(objects, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"],
        "Deployment": only(objects, "Deployment")["spec"]["selector"]["matchLabels"],
    }
    for kind, selector in selectors.items():
        assert selects(selector, pod_labels), kind
        assert not selects(selector, labels), f"{kind} selects the helm test pod"
    url = test_pod["spec"]["containers"][0]["command"][2]
    assert f"http://{FULLNAME}:80/healthz/ready" in url


def test_notes_tell_how_to_reach_and_size_it(chart: Any) -> None:
    notes = render_raw(chart, HA)["switchboard/templates/NOTES.txt"]
    assert "kubectl -n apps rollout status deployment/sb-switchboard" in notes
    assert "https://switchboard.example.com/" in notes
    # 10 pods x 1 worker x (12 pool + 1 LISTEN + 1 migration)
    assert "up to 170 (10 pods x 1 worker(s) x 17)" in notes
    minimal = render_raw(chart, MINIMAL)["switchboard/templates/NOTES.txt"]
    assert "port-forward service/sb-switchboard 8080:80" in minimal
    assert "/healthz/ready" in minimal
    single = render_raw(chart, merged(MINIMAL, {"replicaCount": 1}))[
        "switchboard/templates/NOTES.txt"
    ]
    assert "not highly available" in single


# --------------------------------------------------------------------------
# Relations the template enforces with `fail`


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "no credentials"),
        ({"secrets": {"databaseUrl": DB_URL}}, "no credentials"),
        ({"secrets": {"existingSecret": "x", "jwtSecret": JWT}}, "leave secrets.databaseUrl"),
        (
            {"autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 3}},
            "larger than autoscaling.maxReplicas",
        ),
        ({"pdb": {"minAvailable": 1}}, "either pdb.minAvailable or pdb.maxUnavailable"),
        ({"pdb": {"maxUnavailable": "", "minAvailable": 2}}, "smaller than the replica floor"),
        ({"ingress": {"enabled": True}}, "at least one entry in ingress.hosts"),
        (
            # null deletes a default in Helm: no CPU request left
            {"autoscaling": {"enabled": True}, "resources": {"requests": {"cpu": None}}},
            "needs resources.requests.cpu",
        ),
    ],
    ids=[
        "nothing",
        "no-jwt",
        "both-sources",
        "hpa-bounds",
        "pdb-both",
        "pdb-blocks-drains",
        "ingress-no-host",
        "hpa-no-cpu",
    ],
)
def test_inconsistent_values_refuse_to_render(
    chart: Any, values: dict[str, Any], message: str
) -> None:
    # Cases about credentials start from the chart defaults, the rest from MINIMAL.
    base = {} if "secrets" in values or not values else MINIMAL
    with pytest.raises(helm.HelmRenderError, match=re.escape(message)):
        render(chart, merged(base, values))


# --------------------------------------------------------------------------
# 4. values.schema.json rejects bad values


@pytest.mark.parametrize(
    ("values", "where"),
    [
        ({"replicaCount": -1}, "/replicaCount"),
        ({"replicaCount": 0}, "/replicaCount"),
        ({"replicaCount": "2"}, "/replicaCount"),
        ({"replicaCount": 1.5}, "/replicaCount"),
        ({"replicas": 3}, "'replicas' not allowed"),
        ({"image": {"registry": "ghcr.io"}}, "'registry' not allowed"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"config": {"poolSize": 0}}, "/config/poolSize"),
        ({"config": {"poolSize": "10"}}, "/config/poolSize"),
        ({"config": {"pool_size": 10}}, "'pool_size' not allowed"),
        # propertyNames failures are reported at '' by Helm's validator
        (
            {"config": {"extra": {"DATABASE_URL": "postgresql://x"}}},
            "invalid propertyName 'DATABASE_URL'",
        ),
        (
            {"config": {"extra": {"SWITCHBOARD_JWT_SECRET": "s"}}},
            "invalid propertyName 'SWITCHBOARD_JWT_SECRET'",
        ),
        ({"config": {"extra": {"SWITCHBOARD_LISTEN_DATABASE_URL": "x"}}}, "invalid propertyName"),
        (
            {"config": {"extra": {"SWITCHBOARD_POOL_SIZE": "3"}}},
            "invalid propertyName 'SWITCHBOARD_POOL_SIZE'",
        ),
        ({"config": {"extra": {"SWITCHBOARD_LEASE_SECONDS": 60}}}, "/config/extra"),
        ({"secrets": {"password": "x"}}, "'password' not allowed"),
        ({"secrets": {"keys": {"jwtSecret": ""}}}, "/secrets/keys/jwtSecret"),
        (
            {
                "secrets": {
                    "existingSecret": "",
                    "databaseUrl": "postgresql://x",
                    "jwtSecret": "short",
                }
            },
            "/secrets/jwtSecret",
        ),
        ({"server": {"migrateOnStart": "yes"}}, "/server/migrateOnStart"),
        ({"server": {"workers": 0}}, "/server/workers"),
        ({"preStop": {"mode": "httpGet"}}, "/preStop/mode"),
        ({"preStop": {"sleepSeconds": -1}}, "/preStop/sleepSeconds"),
        ({"terminationGracePeriodSeconds": "60"}, "/terminationGracePeriodSeconds"),
        ({"probes": {"readiness": {"path": "/other"}}}, "'path' not allowed"),
        ({"rollingUpdate": {"maxSurge": 0}}, "/rollingUpdate/maxSurge"),
        ({"rollingUpdate": {"maxUnavailable": 1}}, "'maxUnavailable' not allowed"),
        ({"pdb": {"maxUnavailable": 0}}, "/pdb/maxUnavailable"),
        ({"pdb": {"minAvailable": "100%"}}, "/pdb/minAvailable"),
        ({"autoscaling": {"minReplicas": 0}}, "/autoscaling/minReplicas"),
        ({"autoscaling": {"enabled": "true"}}, "/autoscaling/enabled"),
        ({"service": {"port": 70000}}, "/service/port"),
        ({"topologySpread": {"whenUnsatisfiable": "Never"}}, "/topologySpread/whenUnsatisfiable"),
        ({"serviceMonitor": {"interval": "soon"}}, "/serviceMonitor/interval"),
        ({"ingress": {"hosts": ["switchboard.example.com"]}}, "/ingress/hosts/0"),
        ({"ingress": {"paths": [{"path": "metrics", "pathType": "Prefix"}]}}, "/ingress/paths/0/path"),
        ({"ingress": {"paths": []}}, "/ingress/paths"),
        ({"migrationJob": {"backoffLimit": -1}}, "/migrationJob/backoffLimit"),
        ({"migrationJob": {"enabled": "yes"}}, "/migrationJob/enabled"),
        ({"database": {"appRole": "Robert'); DROP"}}, "/database/appRole"),
        ({"prometheusRule": {"labels": {"release": 1}}}, "/prometheusRule/labels/release"),
    ],
)
def test_schema_rejects_bad_values(chart: Any, values: dict[str, Any], where: str) -> None:
    bad = merged(MINIMAL, values)
    with pytest.raises(helm.HelmValuesError) as raised:
        render(chart, bad)
    message = str(raised.value)
    assert "don't meet the specifications of the schema" in message
    assert where in message, message
    report = helm.lint(CHART, bad, strict=True)
    assert any(where in e for e in report["errors"]), report


def test_schema_closes_every_key_object() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["additionalProperties"] is False
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(defaults) <= set(schema["properties"])
    open_by_design = {"podSecurityContext", "securityContext", "affinity", "global"}
    for key, sub in schema["properties"].items():
        if sub.get("type") == "object" and "properties" in sub and key not in open_by_design:
            assert sub.get("additionalProperties") is False, key


def test_every_value_is_commented() -> None:
    """Every leaf in values.yaml has its own comment, except inside Kubernetes
    objects passed through as-is (securityContext, resources, ...): there the
    comment on the object's key documents it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^(\s*)([A-Za-z][A-Za-z0-9]*):(.*)$")

    def commented(i: int) -> bool:
        return i > 0 and lines[i - 1].strip().startswith("#")

    def next_content(i: int) -> str:
        for line in lines[i + 1 :]:
            if line.strip() and not line.strip().startswith("#"):
                return line
        return ""

    def passthrough(path: list[str]) -> bool:
        node: dict[str, Any] = schema
        for name in path:
            if "properties" not in node:
                return True
            node = node["properties"][name]
        return node.get("type") == "object" and "properties" not in node

    uncommented = []
    stack: list[tuple[int, str, bool]] = []  # enclosing block keys: (indent, name, commented)
    leaves = 0
    for i, line in enumerate(lines):
        m = key.match(line)
        if not m:
            continue
        indent, name = len(m.group(1)), m.group(2)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        following = next_content(i)
        if not m.group(3).strip() and (
            len(following) - len(following.lstrip()) > indent or following.lstrip().startswith("- ")
        ):
            stack.append((indent, name, commented(i)))
            continue
        leaves += 1
        parents = [n for _, n, _ in stack]
        covered = passthrough(parents) and any(doc for _, _, doc in stack)
        if not (commented(i) or covered):
            uncommented.append(".".join(parents + [name]))
    assert leaves > 60
    assert uncommented == []


# --------------------------------------------------------------------------
# 5. The Dockerfile, as far as this machine allows (no Docker engine)


def parse_dockerfile(text: str) -> list[dict[str, Any]]:
    """Stages of a Dockerfile: [{"from", "name", "instructions": [(KEYWORD, args)]}]."""
    logical: list[str] = []
    buf = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not buf):
            continue
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        if buf.strip():
            logical.append(buf.strip())
        buf = ""
    assert not buf, "dangling line continuation"
    args: dict[str, str] = {}
    stages: list[dict[str, Any]] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "ARG" and not stages:
            name, _, default = rest.partition("=")
            args[name] = default
            continue
        if keyword == "FROM":
            m = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", rest, re.IGNORECASE)
            assert m, line
            image = re.sub(
                r"\$\{(\w+)\}|\$(\w+)", lambda v: args[v.group(1) or v.group(2)], m.group(1)
            )
            stages.append({"from": image, "name": m.group(2), "instructions": []})
            continue
        assert stages, f"{keyword} before FROM"
        stages[-1]["instructions"].append((keyword, rest))
    return stages


@pytest.fixture(scope="module")
def stages() -> list[dict[str, Any]]:
    return parse_dockerfile(DOCKERFILE.read_text())


def instructions(stage: dict[str, Any], keyword: str) -> list[str]:
    return [rest for kw, rest in stage["instructions"] if kw == keyword]


def test_dockerfile_is_multi_stage_on_one_base(stages: list[dict[str, Any]]) -> None:
    assert len(stages) == 2
    builder, final = stages
    assert builder["name"] == "builder"
    # The venv's interpreter links to the base image's python: same image both sides.
    assert builder["from"] == final["from"]
    assert re.fullmatch(r"python:3\.1[1-9]-slim(-\w+)?", final["from"]), final["from"]
    assert any(
        r.startswith("--from=builder /opt/venv /opt/venv") for r in instructions(final, "COPY")
    )


def test_entrypoint_is_the_declared_console_script(stages: list[dict[str, Any]]) -> None:
    final = stages[-1]
    (entrypoint,) = instructions(final, "ENTRYPOINT")
    (cmd,) = instructions(final, "CMD")
    assert json.loads(entrypoint) == ["switchboard"]  # exec form: PID 1 receives SIGTERM
    assert json.loads(cmd) == ["serve", "--host", "0.0.0.0", "--port", "8000"]
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["switchboard"] == "switchboard.cli:main"
    assert pyproject["tool"]["setuptools"]["package-dir"] == {"": "server"}
    cli = ROOT / "server" / "switchboard" / "cli" / "__init__.py"
    assert re.search(r"^def main\(", cli.read_text(), re.MULTILINE), "switchboard.cli has no main()"


def test_final_stage_runs_as_the_charts_numeric_non_root_user(stages: list[dict[str, Any]]) -> None:
    (user,) = instructions(stages[-1], "USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or (gid.isdigit() and int(gid) > 0))
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert (
        int(uid)
        == values["securityContext"]["runAsUser"]
        == values["podSecurityContext"]["runAsUser"]
    )


BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|build-essential|make|libpq-dev|python3-dev|[\w.+-]+-dev)\b"
)


def test_no_build_tools_and_no_pip_in_the_final_stage(stages: list[dict[str, Any]]) -> None:
    final_runs = instructions(stages[-1], "RUN")
    for run in final_runs:
        assert not BUILD_TOOLS.search(run), run
        assert "pip" not in run and "apt-get install" not in run, run
    # Nothing compiles in the builder either: every dependency comes as a wheel.
    for run in instructions(stages[0], "RUN"):
        assert not BUILD_TOOLS.search(run), run


def test_psycopg2_comes_from_the_binary_wheel(stages: list[dict[str, Any]]) -> None:
    runs = " ".join(instructions(stages[0], "RUN"))
    assert "psycopg2-binary" in runs
    # pgmigrate declares "psycopg2" (source-only on Linux); it must be installed
    # --no-deps, and the project too, or pip resolves the sdist back in.
    assert "pip install --no-deps -r /tmp/pgmigrate.txt" in runs
    assert "pip install --no-deps /tmp/dist/switchboard-*.whl" in runs
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.startswith("yandex-pgmigrate") for d in deps)
    assert any(d.startswith("psycopg[binary]") for d in deps)


def test_image_installs_the_built_wheel_with_its_sql(stages: list[dict[str, Any]]) -> None:
    """The image runs what a user's `pip install` of the wheel gives: the builder builds
    the wheel (db/ inside it as package data) and installs it; the final stage copies
    only the venv, with no db/ beside it and no SWITCHBOARD_DB_DIR to find it."""
    builder, final = stages[0], stages[-1]
    runs = " ".join(instructions(builder, "RUN"))
    assert "pip wheel --no-deps -w /tmp/dist ." in runs
    assert "pip install --no-deps /tmp/dist/switchboard-*.whl" in runs
    assert "pip install --no-deps ." not in runs
    # the build proves the installed package finds its SQL from outside the source tree
    assert "cd / && switchboard --version" in runs and "db_dir()" in runs
    assert ["db/", "db/"] in [c.split() for c in instructions(builder, "COPY")]
    envs = " ".join(instructions(final, "ENV"))
    assert "SWITCHBOARD_DB_DIR" not in envs
    assert re.search(r"\bPYTHONDONTWRITEBYTECODE=1\b", envs)  # read-only root filesystem
    copies = [c.split() for c in instructions(final, "COPY") if not c.startswith("--")]
    assert copies == [], copies
    # the package's db/ is a link to the repository's db/ (one copy of every SQL file)
    link = ROOT / "server" / "switchboard" / "db"
    assert link.is_symlink() and os.readlink(link) == "../../db"
    assert not (ROOT / "db" / "migrations.yml").is_symlink()


def dockerignore_excludes(path: str) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also covers children."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = raw.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        parts = path.rstrip("/").split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        bare = pattern.removeprefix("**/")
        hit = any(
            fnmatch.fnmatchcase(p, pattern)
            or (pattern.startswith("**/") and fnmatch.fnmatchcase(p.split("/")[-1], bare))
            for p in prefixes
        )
        if hit:
            excluded = not negate
    return excluded


def test_every_copy_source_exists_and_is_in_the_build_context(stages: list[dict[str, Any]]) -> None:
    checked = 0
    for stage in stages:
        for rest in instructions(stage, "COPY"):
            words = rest.split()
            if any(w.startswith("--from=") for w in words):
                continue
            sources = [w for w in words if not w.startswith("--")][:-1]
            assert sources, rest
            matched_any = False
            for source in sources:
                if glob.has_magic(source):
                    matches = glob.glob(source, root_dir=ROOT)
                else:
                    assert (ROOT / source).exists(), f"COPY source {source} is missing"
                    matches = [source]
                for match in matches:
                    assert not dockerignore_excludes(match), f"{match} is excluded by .dockerignore"
                    matched_any = True
                    checked += 1
            assert matched_any, f"COPY {rest}: no source matches"
    assert checked >= 4


def test_dockerignore_keeps_the_context_small() -> None:
    for path in ("tests", "bench", "chart", ".git", "server/switchboard/__pycache__"):
        assert dockerignore_excludes(path), path
    for path in ("server/switchboard/cli.py", "db/migrations", "pgmigrate.yml", "pyproject.toml"):
        assert not dockerignore_excludes(path), path


# --------------------------------------------------------------------------
# Ingress: the application, not the internals


def ingress_routes(paths: list[dict[str, str]], request_path: str) -> bool:
    """Kubernetes Ingress matching: Exact is string equality; Prefix matches
    whole path elements (/ws matches /ws and /ws/ticket, never /wsx)."""
    for p in paths:
        if p["pathType"] == "Exact" and request_path == p["path"]:
            return True
        if p["pathType"] == "Prefix":
            prefix = p["path"].rstrip("/")
            if prefix == "" or request_path == prefix or request_path.startswith(prefix + "/"):
                return True
    return False


def server_routes() -> list[str]:
    """Every route the server registers (templated segments filled in)."""
    found = set()
    for py in (ROOT / "server" / "switchboard").rglob("*.py"):
        found.update(re.findall(r'add_route\(\s*"([^"]+)"', py.read_text()))
    assert len(found) > 10, found
    return sorted(re.sub(r"\{[^}]+\}", "x1", r) for r in found)


def test_ingress_routes_every_app_path_but_not_metrics(chart: Any) -> None:
    ingress = only(render(chart, HA), "Ingress")
    (rule,) = ingress["spec"]["rules"]
    paths = rule["http"]["paths"]
    routes = server_routes()
    assert "/metrics" in routes
    for route in routes:
        assert ingress_routes(paths, route) == (route != "/metrics"), route
    for internal in ("/metrics", "/metrics/", "/metricsx"):
        assert not ingress_routes(paths, internal), internal
    # Prometheus scrapes the pods through the Service's endpoints instead.
    sm = only(render(chart, HA), "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["spec"]["endpoints"][0]["port"] == "http"


# --------------------------------------------------------------------------
# The optional migration Job (pre-install/pre-upgrade hook)

JOB = merged(MINIMAL, {"migrationJob": {"enabled": True}})


@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_migration_job_validates(chart: Any, version: str) -> None:
    objects = render(chart, JOB)
    assert "Job" in validate_all(objects, version)


def test_migration_job_is_off_by_default(chart: Any) -> None:
    assert chart.values["migrationJob"]["enabled"] is False
    assert "Job" not in kinds(render(chart, MINIMAL))


def test_migration_job_runs_migrate_with_the_owner_url_before_the_pods(chart: Any) -> None:
    objects = render(chart, JOB)
    job = only(objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == (
        "before-hook-creation,hook-succeeded"
    )
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["switchboard"] and c["args"] == ["migrate"]
    assert c["env"][0] == {
        "name": "DATABASE_URL",
        "valueFrom": {"secretKeyRef": {"name": "switchboard-db",
                                        "key": "SWITCHBOARD_MIGRATION_DATABASE_URL"}},
    }
    # A pre-install hook runs before the chart's ServiceAccount exists.
    assert "serviceAccountName" not in pod
    assert pod["automountServiceAccountToken"] is False
    assert pod["restartPolicy"] == "Never"
    deployment_container = container(objects)
    assert c["securityContext"] == deployment_container["securityContext"]
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    # The replicas no longer migrate and never see the owner URL.
    assert deployment_container["args"][-1] == "--no-migrate"
    names = [e["name"] for e in deployment_container["env"]]
    assert "SWITCHBOARD_MIGRATION_DATABASE_URL" not in names
    assert "DATABASE_URL" in names


def test_migration_job_needs_an_existing_secret(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match="migrationJob.enabled needs secrets.existingSecret"):
        render(chart, {"secrets": {"databaseUrl": DB_URL, "jwtSecret": JWT},
                       "migrationJob": {"enabled": True}})


def test_notes_print_the_dba_sql_with_the_configured_role(chart: Any) -> None:
    notes = render_raw(chart, merged(MINIMAL, {"database": {"appRole": "sb_orders_app"}}))[
        "switchboard/templates/NOTES.txt"
    ]
    assert "CREATE ROLE sb_orders_app NOLOGIN;" in notes
    assert "IN ROLE sb_orders_app;" in notes
