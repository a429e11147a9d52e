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
    for attempt in range(3):
        # Free when picked, but other lanes start servers on free ports too: one may take
        # ours before dev's replicas bind. dev then refuses (exit 2, "is in use") instead
        # of reporting a foreign server's readiness as its own, and we pick again.
        port = free_port()
        while port + 1 == free_port():  # need two consecutive free ports; retry on the rare clash
            port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "switchboard.cli", "dev", "--port", str(port)],
                                cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        out = []
        deadline = time.time() + 120
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if line.startswith("Press Ctrl-C"):
                break
        text = "".join(out)
        if "is in use" in text and attempt < 2:
            assert proc.wait(60) == 2, text
            continue
        break
    try:
        assert "Switchboard dev is up" in text, text[-4000:]
        m = re.search(r"login\s+admin / (\S+)", text)
        assert m, text
        # It says which origins may use the session cookie: its own, never '*'.
        o = re.search(r"origins\s+CORS and /ws: any origin; the session cookie \(/auth/refresh, /auth/logout\): (.*) \(", text)
        assert o and o.group(1) == f"http://127.0.0.1:{port}, http://127.0.0.1:{port + 1}", text
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
            # Ctrl-C first: a failed assertion must not leave dev's replicas (each in its
            # own session) and its PostgreSQL running, and a SIGKILLed dev orphans them.
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


# Runs the CLI with testing.postgresql made unimportable (the shared environment
# has it, and setuptools' namespace .pth files defeat a PYTHONPATH shadow).
WITHOUT_DEV_EXTRA = """
import runpy, sys
class NoDevExtra:
    def find_spec(self, name, path=None, target=None):
        if name == "testing.postgresql" or name.startswith("testing.postgresql."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoDevExtra())
sys.argv = ["switchboard", *sys.argv[1:]]
if sys.argv[1] == "--imports":
    import switchboard.app, switchboard.cli, switchboard.services  # noqa
    sys.exit(0)
runpy.run_module("switchboard.cli", run_name="__main__")
"""


def test_dev_without_the_dev_extra_says_how_to_install_it() -> None:
    """testing.postgresql is a dev/test extra, not a runtime dependency: without it
    `switchboard dev` prints one line naming the extra and exits 2 (no traceback),
    and the server itself imports fine."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("testing.postgresql")]  # not in the image
    assert [d for d in project["optional-dependencies"]["dev"] if d.startswith("testing.postgresql")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SWITCHBOARD_"))}
    env["PYTHONPATH"] = str(ROOT / "server")
    p = subprocess.run([sys.executable, "-c", WITHOUT_DEV_EXTRA, "dev"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2, p
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "testing.postgresql" in lines[0] and "pip install -e '.[dev]'" in lines[0], p
    p = subprocess.run([sys.executable, "-c", WITHOUT_DEV_EXTRA, "--imports"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_dev_refuses_a_port_in_use_instead_of_reporting_someone_elses_server(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Someone already serves on the second replica's port: dev must not wait for *a*
    ready answer there (that server's) and print "up" for a replica that failed to bind."""
    import socket

    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "SWITCHBOARD_"))}
    env["PYTHONPATH"] = str(ROOT / "server")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "switchboard.cli", "dev", "--host", "127.0.0.1",
                            "--port", str(taken - 1)], env=env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert re.search(rf"port ({taken}|{taken - 1}) is in use", out), out   # ours, or its neighbour was busy too
    assert "Switchboard dev is up" not in out, out
    assert "Traceback" not in out and "switchboard dev: stopped" in out, out
