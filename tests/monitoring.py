"""What the alerts and the dashboard read: the metric names in their PromQL."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ALERTS = ROOT / "chart" / "files" / "alerts.yaml"
DASHBOARD = ROOT / "chart" / "files" / "dashboard.json"

# Series Prometheus itself records for every scrape target (not exported by the server).
PROMETHEUS_SERIES = {"up"}
_HISTOGRAM_PARTS = ("_bucket", "_sum", "_count")


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (selectors, not functions or labels)."""
    without_labels = re.sub(r"\{[^}]*\}", "{}", expr)
    names = set(re.findall(r"\b(switchboard_[a-z0-9_]+|up)\b(?=\s*(?:\{|\[|\)|\s|$|offset))",
                           without_labels))
    return names


def exported_name(name: str) -> str:
    """The family a series belongs to: a histogram's _bucket/_sum/_count are one family."""
    for suffix in _HISTOGRAM_PARTS:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def used_metrics() -> dict[str, set[str]]:
    """{series name: where it is used} for every alert and dashboard panel."""
    used: dict[str, set[str]] = {}
    for rule in alert_rules():
        for name in metric_names(rule["expr"]):
            used.setdefault(name, set()).add(f"alert {rule['alert']}")
    for expr in dashboard_exprs():
        for name in metric_names(expr):
            used.setdefault(name, set()).add("dashboard")
    return used
