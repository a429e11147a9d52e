"""Alert rules and dashboard: promtool checks and unit-tests the rules, the
chart wraps exactly them in a PrometheusRule scoped to the release, and every
alert has a runbook in docs/how-to/operations/runbooks.md.

That every metric they read is really exported is proved against a running
replica in tests/image/test_observability.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from monitoring import ALERTS, DASHBOARD, ROOT, alert_rules, metric_names

CHART = ROOT / "chart"
OPERATIONS = ROOT / "docs" / "how-to" / "operations" / "runbooks.md"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "alerts-test.yaml"
VALUES = {"secrets": {"existingSecret": "switchboard-db"},
          "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
          "grafanaDashboard": {"enabled": True}}

# What an on-call needs to hear about (issue 14); each one is unit-tested in
# alerts-test.yaml.
EXPECTED_ALERTS = {
    "SwitchboardReplicaDown", "SwitchboardReplicaNotReady", "SwitchboardListenDown",
    "SwitchboardExpiredLeasesGrowing", "SwitchboardQueueBacklog",
    "SwitchboardEventBacklogNearRetention", "SwitchboardEventsNotReaped",
    "SwitchboardRateLimiterFailOpen", "SwitchboardHigh5xxRate", "SwitchboardSlowRequests",
    "SwitchboardPoolExhausted",
    "SwitchboardNotifyQueueFilling",   # issue 21: a pinned NOTIFY queue stops every event
    "SwitchboardRelayBehindRetention",  # issue 30: events reaped before a relay read them
    "SwitchboardRunsFailing",   # issue 33: a handler failing a large share of its runs
    "SwitchboardReadReplicaSkipped",   # issue 35: the read replica configured but never used
    "SwitchboardRunsHistoryNotMaintained",   # issue 35: run history partitions not created ahead
    "SwitchboardEventsInDefaultPartition",   # issue 35: events no partition covered (a burst)
    "SwitchboardEventPartitionsNotAhead",    # issue 35: no partition created ahead of the sequence
}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is missing (Debian package `prometheus`; scripts/test.sh installs it)",
                    pytrace=False)
    return path


def rendered(values: dict[str, Any]) -> dict[str, Any]:
    with helm.Chart.load(CHART) as chart:
        raw = chart.render(values=values, name="sb", namespace="apps", is_install=True)
    return {p: list(yaml.safe_load_all(t)) for p, t in raw.items() if not p.endswith("NOTES.txt")}


def test_promtool_checks_the_rule_file() -> None:
    out = subprocess.run([promtool(), "check", "rules", str(ALERTS)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(EXPECTED_ALERTS)} rules found" in out.stdout


def test_promtool_unit_tests_every_alert() -> None:
    tests = yaml.safe_load(PROMTOOL_TESTS.read_text())
    fired = {t["alertname"] for g in tests["tests"] for t in g["alert_rule_test"] if t["exp_alerts"]}
    quiet = {t["alertname"] for g in tests["tests"] for t in g["alert_rule_test"]
             if not t["exp_alerts"]}
    assert fired == quiet == EXPECTED_ALERTS
    out = subprocess.run([promtool(), "test", "rules", PROMTOOL_TESTS.name],
                         cwd=PROMTOOL_TESTS.parent, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_labelled_and_has_a_runbook() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} == EXPECTED_ALERTS
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#{2,5} (.+)$", OPERATIONS.read_text(), re.MULTILINE)
    }
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        anchor = rule["annotations"]["runbook_url"].removeprefix("docs/how-to/operations/runbooks.md#")
        assert anchor == rule["alert"].lower()
        assert anchor in headings, f"no runbook heading for {rule['alert']} in docs/how-to/operations/runbooks.md"


def test_prometheus_rule_is_the_rule_file_scoped_to_the_release(tmp_path: Path) -> None:
    (rule,) = rendered(VALUES)["switchboard/templates/prometheusrule.yaml"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    source = yaml.safe_load(ALERTS.read_text())
    ours = rule["spec"]["groups"][0]["rules"]
    assert [r["alert"] for r in ours] == [r["alert"] for r in source["groups"][0]["rules"]]
    for mine, original in zip(ours, source["groups"][0]["rules"]):
        assert 'job="switchboard"' not in mine["expr"]
        assert mine["expr"] == original["expr"].replace(
            'job="switchboard"', 'namespace="apps", job="sb-switchboard"')
        # Annotations keep Prometheus' own templates (not eaten by Helm).
        assert mine["annotations"] == original["annotations"]
        assert mine["labels"] == original["labels"]
        for name in metric_names(mine["expr"]):
            selectors = re.findall(re.escape(name) + r"\{([^}]*)\}", mine["expr"])
            assert selectors and all('job="sb-switchboard"' in s for s in selectors), mine["expr"]
    # What the operator deploys passes promtool too.
    path = tmp_path / "rendered.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    out = subprocess.run([promtool(), "check", "rules", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rules_and_dashboard_are_off_by_default() -> None:
    paths = rendered({"secrets": {"existingSecret": "switchboard-db"}})
    assert [d for d in paths["switchboard/templates/prometheusrule.yaml"] if d] == []
    assert [d for d in paths["switchboard/templates/dashboard.yaml"] if d] == []


def test_dashboard_configmap_for_the_grafana_sidecar() -> None:
    (cm,) = rendered(VALUES)["switchboard/templates/dashboard.yaml"]
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["switchboard.json"])
    assert dash == json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "switchboard"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)) >= 12
    for panel in dash["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert metric_names(target["expr"]), target["expr"]
            assert '$job' in target["expr"] and '$namespace' in target["expr"]
