"""The composition root: build_services(config) constructs every component, fully.

Construction order follows the dependency arrows, so no field is ever None
and nothing is patched in afterwards:

    config -> db, metrics, auth, registry, replica state
           -> handlers (built-ins + entry points + SWITCHBOARD_HANDLERS)
           -> tools(db), limiter(db, metrics), scheduler(db, metrics, config, handlers)
           -> relay(db, auth, registry, metrics, config, on_run_wake=scheduler.wake,
                    on_tool_result=tools.resolve)
           -> heartbeat(db, registry, auth)
           -> failover watch(db, metrics, on reset: tools.database_reset, heartbeat.beat),
              called by the relay on every (re)connect

Only app.py (create_app) imports this module; components never do.
"""

from __future__ import annotations

from dataclasses import dataclass

from .auth import AuthState
from .builtin_handlers import builtin_handlers
from .config import Config
from .db import Database
from .failover import FailoverWatch
from .handlers import HandlerRegistry, load_handlers
from .heartbeat import ReplicaHeartbeat
from .metrics import Metrics
from .ratelimit import RateLimiter
from .relay import Registry, Relay
from .replica import ReplicaState
from .scheduler import Scheduler
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
    tools: ToolBridge
    limiter: RateLimiter
    scheduler: Scheduler
    relay: Relay
    heartbeat: ReplicaHeartbeat
    failover: FailoverWatch


def build_services(config: Config) -> Services:
    db = Database(config.database_url, config.pool_min, config.pool_size, config.pool_timeout,
                  prepare_threshold=config.prepare_threshold)
    metrics = Metrics()
    auth = AuthState(config.jwt_secret, config.jwt_ttl)
    registry = Registry()
    replica = ReplicaState()
    handlers = load_handlers(config.handler_modules, builtin_handlers(db, config))
    tools = ToolBridge(db, replica.replica_id)
    limiter = RateLimiter(db, metrics, config.ratelimit_timeout)
    scheduler = Scheduler(db, metrics, config, handlers, replica)
    heartbeat = ReplicaHeartbeat(db, registry, auth, replica, config.heartbeat_interval)
    failover = FailoverWatch(db, metrics, on_unlogged_reset=[tools.database_reset, heartbeat.beat])
    relay = Relay(db, auth, registry, metrics, config, replica.replica_id,
                  on_run_wake=scheduler.wake, on_tool_result=tools.resolve, on_connect=failover.observe)

    metrics.gauge("switchboard_websockets_open", "Open WebSockets on this replica", lambda: registry.count)
    metrics.gauge("switchboard_listen_connected", "1 while the LISTEN connection is up",
                  lambda: 1 if relay.connected else 0)
    metrics.gauge("switchboard_runs_running", "Runs executing on this replica", lambda: scheduler.running)
    metrics.gauge("switchboard_pool_size", "Connections in the request pool",
                  lambda: db.pool.get_stats().get("pool_size", 0))
    metrics.gauge("switchboard_pool_available", "Idle connections in the request pool",
                  lambda: db.pool.get_stats().get("pool_available", 0))
    metrics.gauge("switchboard_pool_waiting", "Requests waiting for a connection",
                  lambda: db.pool.get_stats().get("requests_waiting", 0))
    return Services(config=config, db=db, metrics=metrics, auth=auth, registry=registry, replica=replica,
                    handlers=handlers, tools=tools, limiter=limiter, scheduler=scheduler, relay=relay,
                    heartbeat=heartbeat, failover=failover)
