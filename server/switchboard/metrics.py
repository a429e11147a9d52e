"""A small Prometheus text-format registry (one per process = one per replica)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(v: str) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Metrics:
    def __init__(self) -> None:
        self._counters: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
        self._help: dict[str, tuple[str, str]] = {}
        self._gauges: dict[str, Callable[[], float]] = {}
        self.describe("switchboard_http_requests_total", "counter", "HTTP requests by route and status")
        self.describe("switchboard_events_relayed_total", "counter", "Event frames written to local sockets")
        self.describe("switchboard_notifications_total", "counter", "NOTIFY messages received by the relay")
        self.describe("switchboard_claims_total", "counter", "Runs claimed by this replica's scheduler")
        self.describe("switchboard_runs_finished_total", "counter", "Runs finished by this replica, by outcome")
        self.describe("switchboard_ratelimit_denied_total", "counter", "Requests refused by rate limits")
        self.describe("switchboard_ratelimit_fail_open_total", "counter",
                      "Rate-limit checks that failed or timed out and let the request through")
        self.describe("switchboard_ws_closed_total", "counter", "WebSockets closed by the server, by code")
        self.describe("switchboard_listen_reconnects_total", "counter", "LISTEN connection (re)connects")

    def describe(self, name: str, kind: str, help_text: str) -> None:
        self._help[name] = (kind, help_text)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self._counters[name][tuple(sorted(labels.items()))] += value

    def gauge(self, name: str, help_text: str, fn: Callable[[], float]) -> None:
        self._help[name] = ("gauge", help_text)
        self._gauges[name] = fn

    def value(self, name: str, **labels: str) -> float:
        return self._counters[name].get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        out: list[str] = []
        for name, (kind, help_text) in sorted(self._help.items()):
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            if kind == "gauge":
                try:
                    val = float(self._gauges[name]())
                except Exception:  # a gauge must never break the scrape
                    val = float("nan")
                out.append(f"{name} {val}")
                continue
            series = self._counters.get(name) or {(): 0.0}
            for labels, val in sorted(series.items()):
                out.append(f"{name}{_labels(labels)} {val}")
        return "\n".join(out) + "\n"
