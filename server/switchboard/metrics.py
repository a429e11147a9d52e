"""The replica's Prometheus metrics, on prometheus-client.

Every family is declared here, once, with its labels: counters, gauges and the
three latency histograms (request duration, claim latency = due to claimed on
the database clock, delivery latency = event commit to frame offered).
Components record through ``inc`` / ``observe``; nothing else in the server
knows prometheus-client.

Gauges are values, not callbacks: prometheus-client's multiprocess mode (used
by ``serve --workers N``, where each gunicorn worker is a replica of its own
and any of them may answer a scrape) cannot call into another process. The
``GaugeSampler`` sets them from the components every few seconds and just
before a scrape is rendered; with several workers each gauge declares how the
workers' values combine (sum of sockets, min of readiness, most recent
database snapshot), so one scrape describes the whole pod and counters and
histograms are summed over all workers.

Multiprocess mode is on when ``PROMETHEUS_MULTIPROC_DIR`` is set before the
process imports prometheus-client; ``switchboard serve --workers N`` sets it to
a fresh directory under /tmp.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import disable_created_metrics, multiprocess

# No *_created series: they double the exposition and nothing here reads them.
disable_created_metrics()

LOG = logging.getLogger("switchboard.metrics")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Latency buckets in seconds: requests are short; claims and deliveries can lag
# by minutes when something is wrong (the alerts compare them with minutes).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
RUN_BUCKETS = (0.005, 0.025, 0.1, 0.5, 1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0)
LAG_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)

_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "switchboard_http_requests_total": ("HTTP requests by route, method and status",
                                        ("route", "method", "status")),
    "switchboard_events_relayed_total": ("Event frames written to local sockets", ()),
    "switchboard_live_frames_total": (
        "Event frames sent from a verified live message before the relay read the event (live path, V0020)", ()),
    "switchboard_relay_reads_total": ("Event reads of the relay (at most one per SWITCHBOARD_RELAY_READ_GAP)", ()),
    "switchboard_live_key_reads_total": (
        "Reads of the live path's key by the relay (each (re)connect, each idle check, each announced key "
        "change: at most one per read; never per live message)", ()),
    "switchboard_relay_gaps_total": (
        "Times the relay found events after its position reaped before it read them (every local socket "
        "got resume_gap)", ()),
    "switchboard_ws_behind_total": (
        "Sockets whose send queue was full during the relay's catch-up (each then caught up on its own)", ()),
    "switchboard_live_unconfirmed_dropped_total": (
        "Ids sent live that no read confirmed in time (they left the cursors; the read path covers them)", ()),
    "switchboard_notifications_total": ("NOTIFY messages received by the relay", ("channel",)),
    "switchboard_notify_rejected_total": (
        "NOTIFY payloads the relay refused (oversized, nested, wrong types, ids past bigint, unknown kinds)",
        ("reason",)),
    "switchboard_claims_total": ("Runs claimed by this replica's scheduler", ("handler",)),
    "switchboard_runs_finished_total": ("Runs finished by this replica, by outcome and handler (a registered "
                                        "name, or unknown)", ("outcome", "handler")),
    "switchboard_ratelimit_denied_total": ("Requests refused by rate limits", ("policy",)),
    "switchboard_session_refreshes_total": (
        "POST /auth/refresh by outcome: rotated, resent (a lost response or two tabs: the same successor "
        "again), limited, concurrent, unknown, ended, reused (the session was revoked)", ("outcome",)),
    "switchboard_ratelimit_fail_open_total": (
        "Rate-limit checks that failed or timed out and let the request through", ("policy",)),
    "switchboard_ws_closed_total": ("WebSockets closed by the server, by code", ("code",)),
    "switchboard_listen_reconnects_total": ("LISTEN connection (re)connects", ()),
    # streams/: the stream hub's subscriptions (docs/how-to/streams.md)
    "switchboard_stream_catch_ups_total": (
        "Stream subscriptions that read on their own (a new one, a full send queue, a gap) before joining the "
        "shared read", ()),
    "switchboard_stream_errors_total": ("Stream reads that failed, by what (the subscriber was told)", ("what",)),
    "switchboard_stream_listen_reconnects_total": ("The streams' LISTEN connection (re)connects", ()),
    # runfeed.py: the admin console's live run updates (polls only while an admin subscribes)
    "switchboard_runfeed_polls_total": ("Polls of the admin run feed, by outcome (ok, failed)", ("outcome",)),
    "switchboard_runfeed_frames_total": ("run.updated frames offered to subscribed admin sockets", ()),
    # data/history.py: history reads and the read replica (SWITCHBOARD_READ_DATABASE_URL)
    "switchboard_history_reads_total": (
        "History reads (read: runs, run, task_runs, runfeed, resume) by where they were served (replica, "
        "primary); counted only while a read replica is configured", ("read", "served")),
    "switchboard_read_fallbacks_total": (
        "History reads sent to the primary instead of the read replica, by reason (unknown: not sampled yet, "
        "lagging, not_in_recovery, unreachable, error: the read failed there, not_found: a run the replica "
        "does not have yet)", ("reason",)),
    # presence.py: pushed presence (one query per SWITCHBOARD_PRESENCE_INTERVAL)
    "switchboard_presence_frames_total": (
        "presence.state and presence.diff frames offered to local sockets (at most one per socket, room and "
        "interval)", ()),
    # bounded.SOURCES x bounded.REASONS: closed label sets, whatever the input was
    "switchboard_bad_input_total": ("Outside inputs refused by their bounds, by entry point and reason",
                                    ("source", "reason")),
    "switchboard_leases_lost_total": (
        "Runs whose lease this replica could no longer prove or was told it lost (handler told, then cancelled)",
        ()),
    "switchboard_metrics_snapshot_errors_total": (
        "Failed reads of switchboard.metrics_snapshot() (database gauges keep their last value)", ()),
    # failover.py: what this replica observed of its PostgreSQL on each LISTEN (re)connect
    "switchboard_db_failovers_total": ("PostgreSQL promotions observed (the server's WAL timeline changed)", ()),
    "switchboard_db_restarts_total": ("PostgreSQL restarts observed (postmaster start time changed)", ()),
    "switchboard_db_unlogged_resets_total": (
        "Times the UNLOGGED state (tickets, rate buckets, registry, presence, tool calls) was found emptied "
        "by crash recovery or a promotion", ()),
}

_HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "switchboard_http_request_duration_seconds": (
        "HTTP request duration, by route and method", ("route", "method"), REQUEST_BUCKETS),
    "switchboard_claim_latency_seconds": (
        "Seconds from a run being due (run_at) to its claim (database clock)", (), LAG_BUCKETS),
    "switchboard_run_duration_seconds": (
        "Seconds a run's handler ran on this replica, by handler and outcome (ok, failed)",
        ("handler", "outcome"), RUN_BUCKETS),
    "switchboard_delivery_latency_seconds": (
        "Seconds from an event's commit to its frame being offered to local sockets", (), LAG_BUCKETS),
}

# name: (help, how several workers of one pod combine)
# prometheus_client's accepted values (its Gauge declares them as a Literal)
_Mode = Literal["all", "liveall", "min", "livemin", "max", "livemax", "sum", "livesum",
                "mostrecent", "livemostrecent"]
_GAUGES: dict[str, tuple[str, _Mode]] = {
    "switchboard_ready": ("1 while this replica is ready (database answers, LISTEN up, not draining)",
                          "livemin"),
    "switchboard_listen_connected": ("1 while the LISTEN connection is up", "livemin"),
    "switchboard_websockets_open": ("Open WebSockets (and SSE streams) on this replica", "livesum"),
    "switchboard_sse_streams_open": ("Open Server-Sent Events streams (GET /sse) on this replica", "livesum"),
    "switchboard_runs_running": ("Runs executing on this replica", "livesum"),
    "switchboard_pool_size": ("Connections in the request pool", "livesum"),
    "switchboard_pool_available": ("Idle connections in the request pool", "livesum"),
    "switchboard_pool_waiting": ("Requests waiting for a connection", "livesum"),
    "switchboard_event_retention_seconds": ("Configured event retention window", "livemax"),
    "switchboard_relay_cache_entries": (
        "Entries the relay keeps per hint (auth cache users, ephemeral ids seen); bounded", "livesum"),
    "switchboard_runfeed_subscribers": ("Admin sockets subscribed to the run feed on this replica", "livesum"),
    "switchboard_live_unconfirmed": (
        "Ids sent live waiting for the read that confirms them (bounded; back to ~0 when idle)", "livesum"),
    "switchboard_ws_queued_bytes": ("Bytes queued in the send queues of this replica's sockets", "livesum"),
    "switchboard_streams_producing": ("Streams this replica's producers have open", "livesum"),
    "switchboard_stream_subscriptions": ("Stream subscriptions (WebSocket and SSE) on this replica", "livesum"),
    "switchboard_read_replica_lag_seconds": (
        "How far the read replica is behind the primary, by WAL position (NaN: none configured, unreachable "
        "or not in recovery)", "livemax"),
    "switchboard_read_replica_usable": (
        "1 while history reads go to the read replica (configured, in recovery, answering, within "
        "SWITCHBOARD_READ_MAX_LAG)", "livemin"),
    # From switchboard.metrics_snapshot(): the same for every replica.
    "switchboard_expired_leases": ("Running task runs whose lease has expired", "livemostrecent"),
    "switchboard_runs_due": ("Queued task runs that are due", "livemostrecent"),
    "switchboard_runs_due_age_seconds": ("Age of the oldest due queued run (0 when none)",
                                         "livemostrecent"),
    "switchboard_event_backlog_seconds": (
        "Age of the oldest event retention should have removed by now (the newest event of the oldest "
        "partition whose ids are all given out, or the oldest in events_default)", "livemostrecent"),
    "switchboard_events_default_rows": (
        "Events in the DEFAULT partition: no partition covered their id (a burst outran the partitions "
        "created ahead)", "livemostrecent"),
    "switchboard_event_partitions_ahead": (
        "Partitions of events created ahead of event_id_seq (no id given out in them yet)", "livemostrecent"),
    "switchboard_live_replicas": ("Replica processes registered in the database", "livemostrecent"),
    "switchboard_runs_history_default": (
        "Finished runs in the default partition of task_runs_history, up to 100000 (0 unless a day partition "
        "was missing)", "livemostrecent"),
    "switchboard_runs_partitions_ahead": (
        "Day partitions of task_runs_history created for days to come (3 after a maintenance sweep)",
        "livemostrecent"),
    "switchboard_notification_queue_usage": (
        "Fraction of PostgreSQL's NOTIFY queue in use (pg_notification_queue_usage()); near 0 unless a "
        "listener stopped reading", "livemostrecent"),
    "switchboard_db_timeline": ("WAL timeline of the PostgreSQL primary this replica uses (NaN: not seen yet)",
                                "livemax"),
    "switchboard_db_last_change_timestamp_seconds": (
        "When this replica last observed a failover, restart or UNLOGGED reset (0: never)", "livemax"),
}
SNAPSHOT_GAUGES = {
    "expired_leases": "switchboard_expired_leases",
    "runs_due": "switchboard_runs_due",
    "runs_due_age_seconds": "switchboard_runs_due_age_seconds",
    "event_backlog_seconds": "switchboard_event_backlog_seconds",
    "events_default_rows": "switchboard_events_default_rows",
    "event_partitions_ahead": "switchboard_event_partitions_ahead",
    "live_replicas": "switchboard_live_replicas",
    "runs_history_default": "switchboard_runs_history_default",
    "runs_partitions_ahead": "switchboard_runs_partitions_ahead",
    "notification_queue_usage": "switchboard_notification_queue_usage",
}

class Family(NamedTuple):
    """One metric family as declared here (docs/reference/metrics.md is written from these)."""

    name: str
    type: str  # counter, gauge, histogram
    help: str
    labels: tuple[str, ...]
    detail: str  # histogram buckets, or how a gauge's workers combine


def families() -> list[Family]:
    """Every family this module declares, sorted by name."""
    out = [Family(n, "counter", h, labels, "") for n, (h, labels) in _COUNTERS.items()]
    out += [Family(n, "histogram", h, labels, "buckets " + ", ".join(f"{b:g}" for b in buckets))
            for n, (h, labels, buckets) in _HISTOGRAMS.items()]
    out += [Family(n, "gauge", h, (), f"workers combine: {mode}") for n, (h, mode) in _GAUGES.items()]
    return sorted(out)


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


class Metrics:
    """One replica's metric families, in a registry of its own (several apps may
    live in one test process)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = multiprocess_dir() is not None
        self._counters = {n: Counter(n.removesuffix("_total"), h, labels, registry=self.registry)
                          for n, (h, labels) in _COUNTERS.items()}
        self._histograms = {n: Histogram(n, h, labels, buckets=b, registry=self.registry)
                            for n, (h, labels, b) in _HISTOGRAMS.items()}
        self._gauges = {n: Gauge(n, h, registry=self.registry, multiprocess_mode=mode)
                        for n, (h, mode) in _GAUGES.items()}
        self._children: dict[tuple[Any, ...], Any] = {}

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        if labels:
            self._child(self._counters, name, labels).inc(value)
        else:
            self._counters[name].inc(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        if labels:
            self._child(self._histograms, name, labels).observe(max(0.0, seconds))
        else:
            self._histograms[name].observe(max(0.0, seconds))

    def _child(self, family: dict[str, Any], name: str, labels: dict[str, str]) -> Any:
        """The labelled child, cached: prometheus_client's labels() validates and locks on
        every call, and the relay counts every notification it hears (about 4 % of a
        replica's CPU per event on the live path). Label values come from closed sets
        (channels, reasons, codes, routes), so the cache has the families' own
        cardinality."""
        key = (name, *labels.items())
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family[name].labels(**labels)
        return child

    def set(self, name: str, value: float) -> None:
        self._gauges[name].set(value)

    def value(self, name: str, **labels: str) -> float:
        """This process's value of a counter (tests)."""
        c = self._counters[name]
        return float((c.labels(**labels) if labels else c)._value.get())  # noqa: SLF001

    def render(self) -> bytes:
        """The Prometheus text exposition; with several workers, all of them."""
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


def mark_process_dead(pid: int) -> None:
    """gunicorn child_exit hook: drop a dead worker's live gauges."""
    if multiprocess_dir():
        multiprocess.mark_process_dead(pid)


class GaugeSampler:
    """Keeps the gauges current: local values from the components, database
    values from switchboard.metrics_snapshot() (rate-limited, bounded by a
    timeout; a failure keeps the last values and counts an error)."""

    def __init__(self, metrics: Metrics, local: dict[str, Callable[[], float]],
                 snapshot: Callable[[], Awaitable[dict[str, float]]],
                 ready: Callable[[bool], bool], interval: float = 10.0,
                 timeout: float = 2.0) -> None:
        self.metrics = metrics
        self.local = local
        self.snapshot = snapshot
        self.ready = ready
        self.interval = interval
        self.timeout = timeout
        self._db_ok = False
        self._last_snapshot = 0.0
        self._task: asyncio.Task[None] | None = None

    def sample_local(self) -> None:
        for name, fn in self.local.items():
            try:
                self.metrics.set(name, float(fn()))
            except Exception:  # a gauge must never break a scrape
                LOG.debug("gauge %s failed", name, exc_info=True)
        self.metrics.set("switchboard_ready", 1.0 if self.ready(self._db_ok) else 0.0)

    async def refresh(self, max_age: float = 1.0) -> None:
        """Re-read the database snapshot unless the last one is younger than
        max_age seconds (a scraper hammering /metrics costs one query a second),
        then sample the local gauges."""
        now = time.monotonic()
        if now - self._last_snapshot >= max_age:
            self._last_snapshot = now
            try:
                values = await asyncio.wait_for(self.snapshot(), self.timeout)
                for item, name in SNAPSHOT_GAUGES.items():
                    if item in values:
                        self.metrics.set(name, float(values[item]))
                self._db_ok = True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._db_ok = False
                self.metrics.inc("switchboard_metrics_snapshot_errors_total")
                LOG.debug("metrics snapshot failed: %s", exc)
        self.sample_local()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="metrics-sampler")

    async def _loop(self) -> None:
        # Local gauges every second (cheap: no I/O), so another worker's scrape
        # never reports this one's state older than that; the database snapshot
        # every `interval` seconds.
        while True:
            await self.refresh(max_age=self.interval)
            await asyncio.sleep(1.0)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self.metrics.set("switchboard_ready", 0.0)
