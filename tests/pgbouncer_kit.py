"""A real PgBouncer (the Debian package) in front of the suite's PostgreSQL.

PgBouncer refuses to run as root, so when the suite runs as root it runs as the
unprivileged ``postgres`` OS user (``setpriv`` execs in place: the PID we hold
is PgBouncer's own). Free port, files in a temp dir removed by ``stop()``.

Used two ways:
- ``SWITCHBOARD_TEST_PGBOUNCER=1``: tests/conftest.py's ``server_factory`` starts
  every server with DATABASE_URL through PgBouncer (transaction mode) and
  SWITCHBOARD_LISTEN_DATABASE_URL direct -- the deployment docs/how-to/operations/poolers.md
  recommends -- so the HTTP/WebSocket server tests run through it unchanged;
- tests/pgha/test_pgbouncer.py: the suite through PgBouncer, the
  prepared-statement trap, and GET /tasks req/s and jobs/s beside direct.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

USERS = ("postgres", "sb_app_login")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    def __init__(self, pg_port: int, pool_mode: str = "transaction", pool_size: int = 20,
                 pg_host: str = "127.0.0.1") -> None:
        self.pg_host, self.pg_port, self.pool_mode, self.pool_size = pg_host, pg_port, pool_mode, pool_size
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"sb-pgbouncer-{os.getpid()}-"))
        os.chmod(self.dir, 0o755)
        self.proc: subprocess.Popen | None = None
        self.run_as = os.environ.get("SWITCHBOARD_PG_USER", "postgres") if os.geteuid() == 0 else None

    def url_for(self, direct_url: str) -> str:
        """The same user and database as ``direct_url`` (postgresql://user@host:port/db), through PgBouncer."""
        head, _, rest = direct_url.partition("@")
        db = rest.split("/", 1)[1]
        return f"{head}@127.0.0.1:{self.port}/{db}"

    def start(self) -> "PgBouncer":
        ini = self.dir / "pgbouncer.ini"
        (self.dir / "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in USERS))
        ini.write_text(f"""[databases]
* = host={self.pg_host} port={self.pg_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {self.port}
unix_socket_dir =
auth_type = trust
auth_file = {self.dir}/userlist.txt
admin_users = postgres
stats_users = postgres
pool_mode = {self.pool_mode}
default_pool_size = {self.pool_size}
max_client_conn = 2000
max_db_connections = 0
server_reset_query = DISCARD ALL
server_check_delay = 1
server_lifetime = 3600
server_idle_timeout = 60
; tests/conftest.py exports PGOPTIONS (-c switchboard.shared_roles=on, for migrations into a
; shared cluster); PgBouncer 1.18 refuses any "options" startup parameter, so drop it here.
; The servers behind PgBouncer never migrate (--no-migrate), so they do not need it.
ignore_startup_parameters = options
logfile = {self.dir}/pgbouncer.log
pidfile = {self.dir}/pgbouncer.pid
log_connections = 0
log_disconnections = 0
""")
        if self.run_as:
            pw = pwd.getpwnam(self.run_as)
            for p in (self.dir, *self.dir.iterdir()):
                os.chown(p, pw.pw_uid, pw.pw_gid)
        cmd = [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", str(ini)]
        if self.run_as:
            cmd = ["setpriv", f"--reuid={self.run_as}", f"--regid={self.run_as}", "--init-groups", *cmd]
        self._out = open(self.dir / "stdout.log", "ab")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT)
        deadline = time.time() + 15
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited {self.proc.returncode}: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"pgbouncer not listening: {self.log()}")

    def log(self) -> str:
        out = []
        for name in ("stdout.log", "pgbouncer.log"):
            try:
                out.append((self.dir / name).read_text(errors="replace")[-3000:])
            except OSError:
                pass
        return "\n".join(out)

    def stats(self, database: str) -> dict:
        """SHOW STATS for one database (admin console: simple query protocol only)."""
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/pgbouncer", autocommit=True,
                             cursor_factory=psycopg.ClientCursor) as c:
            cur = c.execute("SHOW STATS")
            cols = [d.name for d in cur.description]
            for row in cur.fetchall():
                rec = dict(zip(cols, row))
                if rec["database"] == database:
                    return rec
        return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)     # safe shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc is not None:
            self._out.close()
        shutil.rmtree(self.dir, ignore_errors=True)
