"""`switchboard dev` from a fresh clone: throwaway Postgres, 2 replicas, clean stop on Ctrl-C.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, so
the test starts dev as a group leader and signals the group, as a terminal
does: the replicas must drain before PostgreSQL stops (no connection errors),
and the output holds what a person needs, not INFO logs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from harness import ROOT, free_port


def test_dev_from_a_fresh_clone(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SWITCHBOARD_"))}
    env["PYTHONPATH"] = str(clone / "server")
    port = free_port()
    while port + 1 == free_port():  # need two consecutive free ports; retry on the rare clash
        port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "switchboard.cli", "dev", "--port", str(port)],
                            cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = []
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        text = "".join(out)
        assert "Switchboard dev is up" in text, text[-4000:]
        m = re.search(r"login\s+admin / (\S+)", text)
        assert m, text
        for p in (port, port + 1):
            r = httpx.get(f"http://127.0.0.1:{p}/healthz/ready", timeout=5)
            assert r.status_code == 200, r.text
        # the printed login works on both replicas
        for p in (port, port + 1):
            r = httpx.post(f"http://127.0.0.1:{p}/auth/login", json={"username": "admin", "password": m.group(1)})
            assert r.status_code == 200, r.text
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest[-4000:]
        assert "switchboard dev: stopped" in rest
        everything = text + rest
        assert "Traceback" not in everything, everything[-4000:]
        for noise in ("Connection refused", "server closed the connection", "shutting down",
                      "WARNING", " INFO ", "INFO:", "pgmigrate"):
            assert noise not in everything, everything[-4000:]
        assert len(everything.splitlines()) <= 16, everything
        for p in (port, port + 1):
            try:
                httpx.get(f"http://127.0.0.1:{p}/healthz/live", timeout=2)
                raise AssertionError(f"port {p} still serving after stop")
            except httpx.HTTPError:
                pass
    finally:
        if proc.poll() is None:
            proc.kill()
