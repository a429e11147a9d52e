"""A PostgreSQL primary and one streaming hot standby (pg_basebackup -R), for the
read-replica tests (tests/test_read_replica.py).

The primary is a ThrowawayPostgres with WAL for replication; the standby is a
copy of it taken with pg_basebackup, started as its own postmaster on another
port. Like the suite's own cluster, both run as an unprivileged OS user when the
tests run as root (setpriv), since PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time

import psycopg

from switchboard.pgtest import DEFAULT_SETTINGS, ThrowawayPostgres

from harness import free_port

REPLICATION = {"wal_level": "replica", "max_wal_senders": "4", "wal_keep_size": "256MB",
               "hot_standby_feedback": "on"}


class PrimaryAndStandby:
    def __init__(self) -> None:
        self.primary = ThrowawayPostgres(settings=REPLICATION)
        self.bindir = self.primary.bindir
        self.run_as = os.environ.get("SWITCHBOARD_PG_USER", "postgres") if os.geteuid() == 0 else None
        self.dir = tempfile.mkdtemp(prefix="switchboard-standby-")
        self.data = os.path.join(self.dir, "data")
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)

    def _as_pg(self, cmd: list[str]) -> None:
        prefix = ["setpriv", f"--reuid={self.run_as}", f"--regid={self.run_as}", "--init-groups"] if self.run_as else []
        subprocess.run(prefix + cmd, check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def start_standby(self, timeout: float = 60) -> None:
        """Start the standby (the first time: copy the primary as it is now)."""
        if not os.path.exists(self.data):
            self._as_pg([os.path.join(self.bindir, "pg_basebackup"), "-D", self.data, "-R", "-X", "stream",
                         "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres", "-c", "fast"])
        conf = {**DEFAULT_SETTINGS, **REPLICATION, "hot_standby": "on", "listen_addresses": "127.0.0.1",
                "port": str(self.port), "unix_socket_directories": self.dir, "logging_collector": "off"}
        cmd = [os.path.join(self.bindir, "postgres"), "-D", self.data] + \
              [a for k, v in conf.items() for a in ("-c", f"{k}={v}")]
        if self.run_as:
            cmd = ["setpriv", f"--reuid={self.run_as}", f"--regid={self.run_as}", "--init-groups"] + cmd
        log = open(os.path.join(self.dir, "standby.log"), "ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2) as c:
                    if c.execute("SELECT pg_is_in_recovery()").fetchone()[0]:
                        return
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the standby did not start: " + self.log())
            time.sleep(0.1)

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "standby.log")) as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop_standby(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)   # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def wait_replayed(self, database: str, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary had written when called."""
        with psycopg.connect(self.primary.url(database), autocommit=True) as p:
            lsn = p.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.url(database), autocommit=True) as s:
            while not s.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError("the standby did not catch up")
                time.sleep(0.05)

    def stop(self) -> None:
        try:
            self.stop_standby()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.primary.stop()
