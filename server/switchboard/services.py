"""The composition root: build_services(config) constructs every component, fully.

Construction order follows the dependency arrows, so no field is ever None
and nothing is patched in afterwards:

    config -> db, metrics, auth, registry, replica state
           -> handlers (built-ins + entry points + SWITCHBOARD_HANDLERS)
           -> catalog(db, handlers), tools(db), limiter(db, metrics),
              scheduler(db, metrics, config, handlers)
           -> relay(db, auth, registry, metrics, config, on_run_wake=scheduler.wake,
                    on_tool_result=tools.resolve, on_sessions=sessions.recheck)
           -> sessions(db, auth, registry, close=relay.close_client): sockets bound to
              their login session (the relay hands it "session" hints and calls its
              on_connect after every reconnect)
           -> presence(db, registry): pushed presence frames (presence.py)
           -> heartbeat(db, registry, auth, handler names, also: presence.sync)
           -> sampler(metrics, gauges read from the components, db.metrics_snapshot)
           -> failover watch(db, metrics, on reset: tools.database_reset, heartbeat.beat),
              called by the relay on every (re)connect
           -> run feed(db): run state changes for the admin sockets that subscribed
              (runfeed.py; polls only while one is subscribed)

Only app.py (create_app) imports this module; components never do.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psycopg

from . import __version__, bounded
from .auth import AuthState
from .builtin_handlers import builtin_handlers
from .catalog import HandlerCatalog
from .config import Config
from .db import Database
from .failover import FailoverWatch
from .handlers import HandlerRegistry, load_handlers
from .heartbeat import ReplicaHeartbeat
from .metrics import GaugeSampler, Metrics
from .presence import Presence
from .ratelimit import RateLimiter
from .relay import Relay
from .sockets import Registry
from .streams.runtime import StreamsRuntime
from .replica import ReplicaState
from .runfeed import RunFeed
from .scheduler import Scheduler
from .sessions import SessionWatch
from .tools import ToolBridge


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    metrics: Metrics
    auth: AuthState
    registry: Registry
    replica: ReplicaState
    handlers: HandlerRegistry
    catalog: HandlerCatalog
    tools: ToolBridge
    limiter: RateLimiter
    scheduler: Scheduler
    relay: Relay
    heartbeat: ReplicaHeartbeat
    sampler: GaugeSampler
    failover: FailoverWatch
    sessions: SessionWatch
    feed: RunFeed
    streams: StreamsRuntime
    presence: Presence


def build_services(config: Config) -> Services:
    # sql jobs get a connection of their own; through the direct (session-mode) URL when
    # there is one, since a transaction-mode pooler would hand their session state on.
    # history reads (GET /runs, run detail, the run feed, resumes) go to the read replica
    # while it keeps up (data/history.py); metrics counts where each one went.
    metrics = Metrics()
    db = Database(config.database_url, config.pool_min, config.pool_size, config.pool_timeout,
                  prepare_threshold=config.prepare_threshold, job_url=config.listen_database_url,
                  read_url=config.read_database_url, read_max_lag=config.read_max_lag,
                  read_pool_size=config.read_pool_size, count=metrics.inc)
    auth = AuthState(config.jwt_secret, config.jwt_ttl)
    registry = Registry()
    replica = ReplicaState()
    job_rejections = bounded.Rejections(
        lambda source, reason: metrics.inc("switchboard_bad_input_total", source=source, reason=reason),
        logging.getLogger("switchboard.input"))
    handlers = load_handlers(config.handler_modules, builtin_handlers(db, config, job_rejections))
    served = handlers.names() if config.scheduler_enabled else []
    catalog = HandlerCatalog(db, handlers, __version__, config.scheduler_enabled)
    tools = ToolBridge(db, replica.replica_id)
    limiter = RateLimiter(db, metrics, config.ratelimit_timeout)
    streams = StreamsRuntime(db, config, metrics)
    scheduler = Scheduler(db, metrics, config, handlers, replica, producer=streams.producer)
    presence = Presence(db, registry, replica.replica_id, config.presence_interval, metrics)
    heartbeat = ReplicaHeartbeat(db, registry, auth, replica, config.heartbeat_interval, served, __version__,
                                 also=[presence.sync])
    failover = FailoverWatch(db, metrics, on_unlogged_reset=[tools.database_reset, heartbeat.beat])
    # The watch closes sockets through the relay, and the relay hands the watch its
    # hints: the close callback is late-bound to the relay built on the next line.
    sessions = SessionWatch(db, auth, registry, lambda c, code, reason: relay.close_client(c, code, reason),
                            config.session_check_interval)

    async def on_connect(conn: psycopg.AsyncConnection) -> None:
        await failover.observe(conn)
        await sessions.on_connect(conn)

    relay = Relay(db, auth, registry, metrics, config, replica.replica_id,
                  on_run_wake=scheduler.wake, on_tool_result=tools.resolve, on_connect=on_connect,
                  on_sessions=sessions.recheck)

    feed = RunFeed(db, metrics=metrics)
    pool_stat = db.pool.get_stats
    sampler = GaugeSampler(
        metrics,
        local={
            "switchboard_websockets_open": lambda: registry.count,
            "switchboard_listen_connected": lambda: 1 if relay.connected else 0,
            "switchboard_runs_running": lambda: scheduler.running,
            "switchboard_pool_size": lambda: pool_stat().get("pool_size", 0),
            "switchboard_pool_available": lambda: pool_stat().get("pool_available", 0),
            "switchboard_pool_waiting": lambda: pool_stat().get("requests_waiting", 0),
            "switchboard_event_retention_seconds": lambda: config.event_retention_seconds,
            "switchboard_relay_cache_entries": relay.cache_entries,
            "switchboard_runfeed_subscribers": lambda: len(feed.subscribers),
            "switchboard_live_unconfirmed": relay.live.unconfirmed,
            "switchboard_ws_queued_bytes": lambda: sum(c.queue.bytes for c in registry.clients()),
            "switchboard_streams_producing": lambda: len(streams.producer.open),
            "switchboard_stream_subscriptions": streams.hub.count,
            "switchboard_read_replica_lag_seconds": lambda: db.history.lag,
            "switchboard_read_replica_usable": lambda: 1 if db.history.usable() else 0,
        },
        snapshot=db.metrics_snapshot,
        # The readiness probe's rule, with the last snapshot standing in for its ping.
        ready=lambda db_ok: db_ok and relay.connected and not replica.draining,
    )
    return Services(config=config, db=db, metrics=metrics, auth=auth, registry=registry, replica=replica,
                    handlers=handlers, catalog=catalog, tools=tools, limiter=limiter, scheduler=scheduler, relay=relay,
                    heartbeat=heartbeat, sampler=sampler, failover=failover, sessions=sessions,
                    feed=feed, streams=streams, presence=presence)
