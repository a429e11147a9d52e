"""A throwaway PostgreSQL for `switchboard dev`, the test suite and the benchmarks.

Wraps testing.postgresql with the machine's own binaries. When started as root
(CI runs as root) initdb and postgres must not run as root: they are started
through small wrapper executables that `exec setpriv` to the unprivileged
``postgres`` user, after the data directory is chowned to it. ``setpriv`` execs
in place, so the PID testing.postgresql signals on stop is the postmaster
itself (``runuser`` would fork and not forward the signal).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import stat
import tempfile
from typing import Any

import testing.postgresql

DEFAULT_SETTINGS = {
    "max_connections": "400",
    "shared_buffers": "256MB",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_locks_per_transaction": "256",
    "log_min_messages": "warning",
    "unix_socket_permissions": "0777",
}


def find_bindir() -> str:
    """Directory holding initdb/postgres: $SWITCHBOARD_PG_BINDIR, else the newest Debian one."""
    env = os.environ.get("SWITCHBOARD_PG_BINDIR")
    if env:
        return env
    for cand in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True,
                       key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0):
        if os.path.exists(os.path.join(cand, "postgres")):
            return cand
    path = shutil.which("postgres")
    if path:
        return os.path.dirname(path)
    raise RuntimeError(
        "PostgreSQL server binaries not found; install postgresql (15+) or set SWITCHBOARD_PG_BINDIR"
    )


def _write_wrapper(path: str, target: str, user: str | None, own_session: bool = False) -> None:
    # setsid execs in place (the Popen child is not a group leader), like setpriv.
    prefix = "setsid " if own_session else ""
    if user:
        prefix += f"setpriv --reuid={user} --regid={user} --init-groups "
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" f"exec {prefix}{target} \"$@\"\n")
    os.chmod(path, 0o755)


class _RootSafePostgresql(testing.postgresql.Postgresql):  # type: ignore[misc]  # testing.postgresql ships no types
    run_as: str | None = None

    def initialize_database(self) -> None:  # noqa: D401 - testing.postgresql hook
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            for root, dirs, files in os.walk(self.base_dir):
                os.chown(root, pw.pw_uid, pw.pw_gid)
                for name in files + dirs:
                    os.chown(os.path.join(root, name), pw.pw_uid, pw.pw_gid)
        super().initialize_database()


class ThrowawayPostgres:
    """One PostgreSQL cluster in a temporary directory, stopped and removed on stop()."""

    def __init__(self, settings: dict[str, str] | None = None, port: int | None = None,
                 own_session: bool = False) -> None:
        """own_session: run the postmaster in a session of its own, so a Ctrl-C in
        the terminal (SIGINT to the whole foreground process group) does not stop
        it before the processes using it have shut down (`switchboard dev`)."""
        bindir = find_bindir()
        self.base_dir = tempfile.mkdtemp(prefix="switchboard-pg-")
        os.chmod(self.base_dir, 0o755)
        conf = dict(DEFAULT_SETTINGS)
        conf.update(settings or {})
        args = "-h 127.0.0.1 -c logging_collector=off " + " ".join(
            f"-c {k}={v}" for k, v in conf.items()
        )
        initdb = os.path.join(bindir, "initdb")
        postgres = os.path.join(bindir, "postgres")
        run_as = None
        if os.geteuid() == 0:
            run_as = os.environ.get("SWITCHBOARD_PG_USER", "postgres")
            try:
                pwd.getpwnam(run_as)
            except KeyError as exc:
                raise RuntimeError(
                    f"running as root needs an unprivileged OS user {run_as!r} for PostgreSQL; "
                    "create it (useradd --system postgres) or set SWITCHBOARD_PG_USER"
                ) from exc
        if run_as or own_session:
            wrap = os.path.join(self.base_dir, "bin")
            os.mkdir(wrap)
            _write_wrapper(os.path.join(wrap, "initdb"), initdb, run_as)
            _write_wrapper(os.path.join(wrap, "postgres"), postgres, run_as, own_session)
            initdb = os.path.join(wrap, "initdb")
            postgres = os.path.join(wrap, "postgres")
        _RootSafePostgresql.run_as = run_as
        kwargs: dict[str, Any] = dict(
            base_dir=os.path.join(self.base_dir, "cluster"),
            initdb=initdb,
            postgres=postgres,
            initdb_args="-U postgres -A trust -E UTF8 --locale=C",
            postgres_args=args,
        )
        if port:
            kwargs["port"] = port
        os.mkdir(kwargs["base_dir"])
        self._pg = _RootSafePostgresql(**kwargs)
        self.port: int = self._pg.settings["port"]
        self.bindir = bindir

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    @property
    def pid(self) -> int | None:
        pid = self._pg.server_pid
        return None if pid is None else int(pid)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove the directory."""
        try:
            self._pg.stop()
        finally:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # Used by the Postgres-restart tests: stop the server but keep its data.
    def stop_server(self) -> None:
        self._pg.terminate()

    def start_server(self) -> None:
        self._pg.start()

    # Used by the crash tests: kill -9 the postmaster (the next start runs crash recovery,
    # which empties every UNLOGGED table). Its backends exit when they notice.
    def kill_server(self) -> None:
        proc = self._pg.child_process
        if proc is None:
            return
        proc.kill()
        proc.wait()
        self._pg.child_process = None

    def __enter__(self) -> "ThrowawayPostgres":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ThrowawayPostgres", "find_bindir", "stat"]
