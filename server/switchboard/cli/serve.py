"""``switchboard serve``: one replica under uvicorn, or --workers N under gunicorn."""

from __future__ import annotations

import argparse
import os
import signal
from typing import Any

from .common import _die, _migrate


def cmd_serve(args: argparse.Namespace) -> int:
    from ..config import Config, ConfigError, header_timeout, server_limits

    dev = os.environ.get("SWITCHBOARD_DEV") == "1"
    try:
        config = Config.from_env(dev=dev)
        limits = server_limits()    # read here too: a bad value is a usage error, not a traceback
        header_timeout()
    except ConfigError as exc:
        _die(str(exc))
    if not args.no_migrate:
        _migrate(config.migration_database_url or config.database_url)
    if args.workers > 1:
        return _serve_gunicorn(args, config)
    import uvicorn

    from ..app import create_app
    from ..handlers import HandlerLoadError
    from ..http import protocol

    # uvicorn's own 400/503 answers as problem+json, and h11 with a header read timeout
    io = protocol.uvicorn_io(config.uvloop, header_timeout())

    try:
        app = create_app(config)
    except HandlerLoadError as exc:
        _die(str(exc))
    uconf = uvicorn.Config(
        app, host=args.host, port=args.port, lifespan="on", proxy_headers=False,
        forwarded_allow_ips="", access_log=False, ws_max_size=2 * 1024 * 1024,
        ws_per_message_deflate=config.ws_compression, **io,
        timeout_graceful_shutdown=max(1, int(config.shutdown_grace) + 5),
        log_level=config.log_level.lower(), server_header=False, **limits,
    )
    server = uvicorn.Server(uconf)
    # uvicorn re-raises the captured SIGTERM/SIGINT after a graceful shutdown, restoring
    # the previous handlers first; make those no-ops so a drained replica exits 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    server.run()
    return 0


def _serve_gunicorn(args: argparse.Namespace, config: Any) -> int:
    import shutil
    import tempfile

    # Each worker is a replica of its own, and any of them may answer a scrape:
    # prometheus-client's multiprocess mode writes every worker's values to files
    # in one directory and /metrics sums them. It must be set before a worker
    # imports prometheus_client, and fresh for every start (old files would add
    # a previous run's counts).
    metrics_dir = tempfile.mkdtemp(prefix="switchboard-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir

    from gunicorn.app.base import BaseApplication

    def child_exit(server: Any, worker: Any) -> None:
        from ..metrics import mark_process_dead

        mark_process_dead(worker.pid)

    class _App(BaseApplication):  # type: ignore[misc]  # gunicorn ships no types (no py.typed)
        def load_config(self) -> None:
            self.cfg.set("bind", f"{args.host}:{args.port}")
            self.cfg.set("workers", args.workers)
            self.cfg.set("worker_class", "switchboard.gunicorn_worker.Worker")
            self.cfg.set("graceful_timeout", max(1, int(config.shutdown_grace) + 5))
            self.cfg.set("forwarded_allow_ips", "")
            self.cfg.set("accesslog", None)
            self.cfg.set("loglevel", config.log_level.lower())
            self.cfg.set("child_exit", child_exit)

        def load(self) -> Any:
            from ..asgi import app

            return app

    try:
        _App().run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0
