"""Real Switchboard replicas for the JS client's `node --test` suites.

Starts a throwaway PostgreSQL (migrated with the real migrations), N real
`switchboard serve` processes on it, and a layer-4 round-robin proxy in front
of them (tests/browser/lbproxy.py: the load balancer), then prints one JSON
line -- the URLs, the replicas and the users -- and serves commands, one JSON
object per stdin line, answering one JSON line each:

  {"cmd": "sql", "sql": "...", "params": [...]}   -> {"rows": [[...], ...]}
  {"cmd": "sigterm", "replica": "<replica id>"}    -> {"exit": <code>}   (drains, exits)
  {"cmd": "start", "name": "r3"}                     -> {"replica": {...}}  (a new replica, in the pool)
  {"cmd": "signal", "replica": "<id>", "sig": "SIGSTOP"}  -> {}   (SIGSTOP/SIGCONT: a hung replica)
  {"cmd": "hold"} / {"cmd": "release"}                -> {}   (the proxy parks / forwards new connections)
  {"cmd": "log", "replica": "<id>"}                   -> {"log": "..."}

Everything stops on stdin EOF (the test process exited) or {"cmd": "quit"}.

    python3 clients/js/test/replicas.py [--replicas 2] [--env SWITCHBOARD_X=1 ...]
        [--example ai_chat] [--env-for r2:SWITCHBOARD_SCHEDULER=off ...]

``--example NAME`` loads examples/NAME's handlers on every replica (SWITCHBOARD_HANDLERS=NAME,
examples/NAME on PYTHONPATH); ``--env-for rN:KEY=VALUE`` sets one replica's environment (e.g.
the scheduler off on all but one: that one runs every handler, the others only serve clients).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "server"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "browser"))

import psycopg  # noqa: E402

from harness import APP_LOGIN, Server, app_url_for, auth, make_user, probe_token  # noqa: E402
from lbproxy import RoundRobinProxy  # noqa: E402
from switchboard.migrate import migrate  # noqa: E402
from switchboard.pgtest import ThrowawayPostgres  # noqa: E402

PASSWORD = "pw-" + "s" * 12
# Tests log in many times from 127.0.0.1: the login buckets must not be what they measure.
ENV = {"SWITCHBOARD_LOGIN_IP_RATE": "1000", "SWITCHBOARD_LOGIN_IP_BURST": "1000",
       "SWITCHBOARD_LOGIN_USER_RATE": "1000", "SWITCHBOARD_LOGIN_USER_BURST": "1000",
       # ... nor the per-user ticket bucket (reconnect storms are what they provoke)
       "SWITCHBOARD_WS_TICKET_RATE": "1000", "SWITCHBOARD_WS_TICKET_BURST": "1000"}
USERS = {"admin": "admin", "alice": "member", "bob": "member", "carol": "member"}


def replica_info(s: Server) -> dict[str, Any]:
    import httpx

    # which replica answers: GET /me (anonymous readiness names no replica)
    r = httpx.get(s.base + "/me", headers=auth(probe_token()), timeout=10)
    return {"name": s.log_path.stem, "base": s.base, "port": s.port, "replica": r.json()["replica"]}


def replica_env(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    """Every replica's environment, and each named replica's additions (--env-for)."""
    env = dict(ENV)
    if args.example:
        env["SWITCHBOARD_HANDLERS"] = ",".join(args.example)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "server"), *(str(ROOT / "examples" / e) for e in args.example)])
    env.update(dict(kv.split("=", 1) for kv in args.env))
    env_for: dict[str, dict[str, str]] = {}
    for item in args.env_for:
        name, kv = item.split(":", 1)
        k, v = kv.split("=", 1)
        env_for.setdefault(name, {})[k] = v
    return env, env_for


def command(msg: dict[str, Any], url: str, servers: dict[str, Server], proxy: RoundRobinProxy,
            start: Any) -> dict[str, Any]:
    """One command from the test on stdin; its answer."""
    cmd = msg["cmd"]
    if cmd == "sql":
        with psycopg.connect(url, autocommit=True) as c:
            cur = c.execute(msg["sql"], msg.get("params") or [])
            rows = cur.fetchall() if cur.description else []
        return {"rows": json.loads(json.dumps(rows, default=str))}
    if cmd == "sigterm":
        return {"exit": servers.pop(msg["replica"]).terminate(timeout=60)}
    if cmd == "start":
        s = start(msg.get("name", f"r{len(servers) + 10}"))
        proxy.backends.append(("127.0.0.1", s.port))
        return {"replica": replica_info(s)}
    if cmd == "signal":
        servers[msg["replica"]].proc.send_signal(getattr(signal, msg["sig"]))  # type: ignore[union-attr]
        return {}
    if cmd == "hold":
        proxy.hold()
        return {}
    if cmd == "release":
        proxy.release()
        return {}
    if cmd == "log":
        return {"log": servers[msg["replica"]].log()}
    return {"error": f"unknown command {cmd!r}"}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment for the replicas (repeatable)")
    ap.add_argument("--example", action="append", default=[], metavar="NAME",
                    help="load examples/NAME's handlers (SWITCHBOARD_HANDLERS, PYTHONPATH; repeatable)")
    ap.add_argument("--env-for", action="append", default=[], metavar="NAME:KEY=VALUE",
                    help="extra environment for one replica, by name (r1, r2, ...; repeatable)")
    args = ap.parse_args()
    env, env_for = replica_env(args)
    os.environ["PGOPTIONS"] = (os.environ.get("PGOPTIONS", "") + " -c switchboard.shared_roles=on").strip()
    logs = Path(tempfile.mkdtemp(prefix="sb-js-"))
    pg = ThrowawayPostgres()
    servers: dict[str, Server] = {}
    proxy: RoundRobinProxy | None = None
    try:
        with psycopg.connect(pg.url(), autocommit=True) as c:
            c.execute(f"CREATE ROLE {APP_LOGIN} LOGIN")
            c.execute("CREATE DATABASE sb_js")
        url = pg.url("sb_js")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(f"GRANT switchboard_app TO {APP_LOGIN}")
        users = {name: {"id": make_user(url, name, PASSWORD, role), "role": role} for name, role in USERS.items()}

        def start(name: str) -> Server:
            s = Server(app_url_for(url), env={**env, **env_for.get(name, {})}, log_dir=logs, name=name).start()
            servers[replica_info(s)["replica"]] = s
            return s

        for i in range(args.replicas):
            start(f"r{i + 1}")
        proxy = RoundRobinProxy([("127.0.0.1", s.port) for s in servers.values()]).start()
        print(json.dumps({
            "proxy": proxy.base, "database": url, "password": PASSWORD, "users": users, "logs": str(logs),
            "replicas": [replica_info(s) for s in servers.values()],
        }), flush=True)

        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
                if msg["cmd"] == "quit":
                    print("{}", flush=True)
                    break
                out = command(msg, url, servers, proxy, start)
            except Exception as exc:
                out = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            print(json.dumps(out), flush=True)
    finally:
        if proxy is not None:
            proxy.stop()
        for s in servers.values():
            try:
                s.terminate(timeout=20)
            except Exception:
                s.kill()
        pg.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
