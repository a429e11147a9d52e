"""A replica in its own network namespace, PostgreSQL reachable only over a veth pair.

    host                                     namespace sbf-<pid>-<n>
    ----                                     ----------------------
    PostgreSQL 127.0.0.1:<pg>                switchboard serve --host 10.a.b.(c+2)
      ^                                        |
    FaultProxy 10.a.b.(c+1):<pool>  <--veth--  DATABASE_URL=...@10.a.b.(c+1):<pool>
    FaultProxy 10.a.b.(c+1):<listen> <-veth--  SWITCHBOARD_LISTEN_DATABASE_URL=...:<listen>

The namespace has only its loopback and its end of the veth pair, so the
replica reaches PostgreSQL only through the proxies on the host-side address
(testing.postgresql listens on loopback only; the proxy is the bridge, and
the place where delay, loss, stalls and half-open connections are injected).
Hard partitions are iptables rules *inside the namespace* (the host's rules
are never touched): DROP (packets vanish: timeouts) or REJECT (tcp-reset:
fast errors), for the whole Postgres path or for the LISTEN proxy's port only;
or the link is taken down. The test process reaches the replica's HTTP and
WebSocket port over the same veth, so readiness can be watched while
Postgres is cut off.

Addresses are private 10.x.y.z/30 pairs chosen at random (and checked against
the host's addresses); interface and namespace names carry the pid, so
parallel runs never collide. Where the kernel refuses namespaces (no root, no
CONFIG_NET_NS, a container without CAP_NET_ADMIN) ``NetNS.create`` raises
``NamespaceRefused`` with the command and the kernel's answer, and the
fixture fails the test with that message.
"""

from __future__ import annotations

import itertools
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

from harness import ROOT, Server

_counter = itertools.count()
HERE = Path(__file__).resolve().parent


class NamespaceRefused(RuntimeError):
    """The kernel (or the lack of privileges) refused a network namespace or veth pair."""


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise subprocess.CalledProcessError(r.returncode, list(cmd), r.stdout, r.stderr)
    return r


def _used_prefixes() -> set[str]:
    out = _sh("ip", "-4", "-o", "addr", "show", check=False).stdout
    return {w.split("/")[0].rsplit(".", 1)[0] for line in out.splitlines()
            for w in line.split() if w.count(".") == 3 and "/" in w}


class NetNS:
    """One network namespace joined to the host by a veth pair with a /30."""

    def __init__(self) -> None:
        k = next(_counter)
        pid = os.getpid()
        self.name = f"sbf-{pid}-{k}"
        self.host_if = f"sbf{pid % 10**7}{k}h"[:15]
        self.ns_if = f"sbf{pid % 10**7}{k}n"[:15]
        rng = random.Random(pid * 1000 + k)
        used = _used_prefixes()
        while True:
            a, b, c = rng.randint(100, 250), rng.randint(0, 255), rng.randrange(0, 256, 4)
            if f"10.{a}.{b}" not in used:
                break
        self.host_ip = f"10.{a}.{b}.{c + 1}"
        self.ns_ip = f"10.{a}.{b}.{c + 2}"
        self.created = False
        self.rules: list[list[str]] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def create(self) -> "NetNS":
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                raise NamespaceRefused(f"{tool} is not installed (scripts/test.sh installs iproute2 and "
                                       "iptables on a fresh machine)")
        try:
            _sh("ip", "netns", "add", self.name)
        except subprocess.CalledProcessError as exc:
            raise NamespaceRefused(
                f"the kernel refused a network namespace: `ip netns add {self.name}` -> "
                f"{exc.stderr.strip() or exc.returncode}. tests/faults need root (CAP_SYS_ADMIN, "
                "CAP_NET_ADMIN) and a kernel with CONFIG_NET_NS") from exc
        self.created = True
        try:
            _sh("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
            _sh("ip", "link", "set", self.ns_if, "netns", self.name)
            _sh("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _sh("ip", "link", "set", self.host_if, "up")
            self.exec("ip", "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
            self.exec("ip", "link", "set", self.ns_if, "up")
            self.exec("ip", "link", "set", "lo", "up")
            self.exec("iptables", "-S")         # iptables works inside the namespace
        except subprocess.CalledProcessError as exc:
            self.destroy()
            raise NamespaceRefused(f"setting up {self.name} failed: {' '.join(exc.cmd)} -> "
                                   f"{(exc.stderr or '').strip()}") from exc
        return self

    def destroy(self) -> None:
        _sh("ip", "link", "del", self.host_if, check=False)   # takes the peer with it
        if self.created:
            _sh("ip", "netns", "del", self.name, check=False)
        self.created = False

    def exec(self, *cmd: str) -> subprocess.CompletedProcess:
        return _sh("ip", "netns", "exec", self.name, *cmd)

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    # -- faults ---------------------------------------------------------------------------------
    def partition(self, port: int | None = None, mode: str = "drop") -> None:
        """Cut the namespace off from the host side (all of it, or one host port).

        mode "drop": packets vanish both ways (connections hang, then time out);
        mode "reject": outgoing packets are answered with a TCP reset (fast errors)."""
        if mode not in ("drop", "reject"):
            raise ValueError(f"mode must be drop or reject, not {mode!r}")
        out = ["-A", "OUTPUT", "-d", self.host_ip, "-p", "tcp"]
        inp = ["-A", "INPUT", "-s", self.host_ip, "-p", "tcp"]
        if port is not None:
            out += ["--dport", str(port)]
            inp += ["--sport", str(port)]
        if mode == "drop":
            rules = [out + ["-j", "DROP"], inp + ["-j", "DROP"]]
        else:
            rules = [out + ["-j", "REJECT", "--reject-with", "tcp-reset"], inp + ["-j", "DROP"]]
        for r in rules:
            self.exec("iptables", *r)
            self.rules.append(r)

    def heal(self) -> None:
        """Remove every rule added by partition() (in reverse order)."""
        while self.rules:
            r = self.rules.pop()
            self.exec("iptables", "-D", *r[1:])

    def link(self, up: bool) -> None:
        self.exec("ip", "link", "set", self.ns_if, "up" if up else "down")

    def dropped_packets(self) -> int:
        out = self.exec("iptables", "-L", "-v", "-n", "-x").stdout
        return sum(int(line.split()[0]) for line in out.splitlines()
                   if line.strip() and line.split()[0].isdigit() and ("DROP" in line or "REJECT" in line))


def via(url: str, host: str, port: int) -> str:
    """The same database URL, pointed at host:port (a proxy)."""
    u = urlsplit(url)
    netloc = (f"{u.username}@" if u.username else "") + f"{host}:{port}"
    return u._replace(netloc=netloc).geturl()


class NsServer(Server):
    """`switchboard serve` inside a namespace, listening on the namespace's veth address."""

    def __init__(self, ns: NetNS, db_url: str, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(db_url, **kw)
        self.ns = ns
        self.base = f"http://{ns.ns_ip}:{self.port}"
        self.ws_base = f"ws://{ns.ns_ip}:{self.port}"
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "server"), str(HERE)])

    def start(self, wait: bool = True, timeout: float = 30) -> "NsServer":
        cmd = self.ns.prefix() + [sys.executable, "-m", "switchboard.cli", "serve",
                                  "--host", self.ns.ns_ip, "--port", str(self.port)]
        if not self.migrate:
            cmd.append("--no-migrate")
        self._log = open(self.log_path, "ab")
        # `ip netns exec` execs the command: the Popen pid is the replica's pid
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=self._log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_ready(timeout)
        return self
