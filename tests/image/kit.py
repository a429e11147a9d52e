"""Build the repository's image and run it, with Debian's own tools only.

No registry is reachable from CI, so the base image is made here:
`debootstrap --variant=minbase` (bookworm, from the Debian mirror apt already
uses) with python3 + venv + CA certificates, imported with `buildah from
scratch` + `copy` + `commit`. The repository's Dockerfile is then built on it
with `buildah bud --isolation chroot --build-arg PYTHON_IMAGE=<base>`; pip in
the build reaches PyPI with the host's CA bundle mounted read-only (`-v`), so
no certificate is baked into a layer. Containers run with `podman --runtime
runc` (crun fails on this kind of host's cgroups) in their own network
namespace (slirp4netns): the container keeps the port the chart declares
(8000) while the host side is a free port, and the host's loopback (where the
suite's PostgreSQL listens) is reachable as 10.0.2.2.

All storage (layers, images, containers, podman's database) lives in one
temporary directory per test session, removed at the end: nothing is shared
with other users of the machine and nothing is cached between sessions (CI
starts from a fresh machine, so the figures reported are the real cost).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
SUITE = "bookworm"
BASE_PACKAGES = "python3,python3-venv,python-is-python3,ca-certificates"
TOOLS = ["debootstrap", "buildah", "podman", "runc", "slirp4netns"]
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
# The host's loopback as seen from a slirp4netns container (allow_host_loopback).
HOST_FROM_CONTAINER = "10.0.2.2"
# runc refuses podman's default rlimits on this kind of host; set them explicitly.
RUN_FLAGS = [
    "--runtime", "runc",
    "--network", "slirp4netns:allow_host_loopback=true",
    "--ulimit", "nofile=4096:4096",
    "--ulimit", "nproc=4096:4096",
]


class ImageToolError(AssertionError):
    """A step of building or running the image could not run on this machine."""


def missing_tools() -> list[str]:
    return [t for t in TOOLS if shutil.which(t) is None]


def apt_mirror() -> str:
    """The Debian mirror apt already uses (deb822 .sources or sources.list)."""
    candidates: list[str] = []
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                (k.strip().lower(), v.strip())
                for k, _, v in (line.partition(":") for line in stanza.splitlines())
                if not k.startswith("#") and v
            )
            suites = fields.get("suites", "").split()
            if SUITE in suites and "deb" in fields.get("types", "").split():
                candidates += fields.get("uris", "").split()
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            m = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+" + SUITE + r"\s", line)
            if m:
                candidates.append(m.group(1))
    for uri in candidates:
        if "security" not in uri:
            return uri.rstrip("/")
    return "http://deb.debian.org/debian"


def _run(cmd: list[str], timeout: float, what: str, **kw: Any) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        raise ImageToolError(f"{what}: timed out after {timeout}s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        raise ImageToolError(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


@dataclass
class Figures:
    debootstrap_s: float = 0.0
    base_import_s: float = 0.0
    build_s: float = 0.0
    base_bytes: int = 0
    image_bytes: int = 0
    smoke: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [
            f"debootstrap (minbase {SUITE} + python3): {self.debootstrap_s:.1f} s",
            f"base import (buildah from scratch/copy/commit): {self.base_import_s:.1f} s",
            f"image build (buildah bud, Dockerfile): {self.build_s:.1f} s",
            f"base image size: {self.base_bytes / 1e6:.0f} MB",
            f"image size: {self.image_bytes / 1e6:.0f} MB",
        ]
        out += [f"{k}: {v}" for k, v in self.smoke.items()]
        return out


class Kit:
    """One session's private container storage, base image and built image."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"sb-image-{os.getpid()}-"))
        self.storage = [
            "--root", str(self.dir / "storage"),
            "--runroot", str(self.dir / "run"),
            "--storage-driver", "overlay",
        ]
        self.tag = f"{os.getpid()}"
        self.base_ref = f"localhost/sb-base:{self.tag}"
        self.image_ref = f"localhost/switchboard:{self.tag}"
        self.figures = Figures()
        self._names = 0
        self._lock = threading.Lock()

    # -- tools -------------------------------------------------------------------
    def buildah(self, *args: str, timeout: float = 120, what: str = "buildah") -> str:
        return _run(["buildah", *self.storage, *args], timeout, what).stdout

    def podman_cmd(self, *args: str) -> list[str]:
        return ["podman", *self.storage, "--tmpdir", str(self.dir / "libpod"), *args]

    def podman(self, *args: str, timeout: float = 60, what: str = "podman",
               check: bool = True) -> subprocess.CompletedProcess:
        cmd = self.podman_cmd(*args)
        if check:
            return _run(cmd, timeout, what)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def name(self, what: str) -> str:
        with self._lock:
            self._names += 1
            return f"sb-{what}-{os.getpid()}-{self._names}"

    # -- build -------------------------------------------------------------------
    def make_base(self) -> None:
        rootfs = self.dir / "rootfs"
        t0 = time.monotonic()
        _run(
            ["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE,
             str(rootfs), apt_mirror()],
            600, "debootstrap",
        )
        self.figures.debootstrap_s = time.monotonic() - t0
        # What python:*-slim leaves out too: package caches, docs, man pages, locales.
        for pattern in ("var/cache/apt/archives/*.deb", "var/lib/apt/lists/*",
                        "usr/share/doc/*", "usr/share/man/*", "usr/share/locale/*"):
            for p in rootfs.glob(pattern):
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        t0 = time.monotonic()
        try:
            ctr = self.buildah("from", "scratch", what="buildah from scratch").strip()
        except ImageToolError as overlay_error:
            # Kernel overlay is unavailable where /tmp itself is an overlay (some
            # container-based CI): vfs always works as root, at the cost of disk.
            self.storage = ["--root", str(self.dir / "storage-vfs"), "--runroot",
                            str(self.dir / "run-vfs"), "--storage-driver", "vfs"]
            try:
                ctr = self.buildah("from", "scratch", what="buildah from scratch (vfs)").strip()
            except ImageToolError as vfs_error:
                raise ImageToolError(f"{overlay_error}\n--- and with vfs ---\n{vfs_error}") from None
            self.figures.smoke["storage driver"] = "vfs (overlay failed)"
        try:
            self.buildah("copy", ctr, str(rootfs), "/", what="buildah copy")
            self.buildah(
                "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8", "--cmd", "python3", ctr, what="buildah config",
            )
            self.buildah("commit", "-q", ctr, self.base_ref, what="buildah commit")
        finally:
            self.buildah("rm", ctr, what="buildah rm")
        self.figures.base_import_s = time.monotonic() - t0
        shutil.rmtree(rootfs, ignore_errors=True)
        self.figures.base_bytes = self.image_size(self.base_ref)

    def build(self) -> None:
        t0 = time.monotonic()
        self.buildah(
            "bud", "--isolation", "chroot", "--layers=false",
            "--build-arg", f"PYTHON_IMAGE={self.base_ref}",
            "-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro",
            "-f", str(ROOT / "Dockerfile"), "-t", self.image_ref, str(ROOT),
            timeout=600, what="buildah bud (the repository's Dockerfile)",
        )
        self.figures.build_s = time.monotonic() - t0
        self.figures.image_bytes = self.image_size(self.image_ref)

    def image_size(self, ref: str) -> int:
        out = self.podman("image", "inspect", ref, what="podman image inspect").stdout
        return int(json.loads(out)[0]["Size"])

    def image_config(self) -> dict[str, Any]:
        out = self.podman("image", "inspect", self.image_ref, what="podman image inspect").stdout
        return json.loads(out)[0]["Config"]

    # -- run ---------------------------------------------------------------------
    def run_once(self, args: list[str], *, env: dict[str, str] | None = None,
                 entrypoint: str | None = None, extra: list[str] | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
        """Run a container to completion (read-only root, /tmp a tmpfs)."""
        cmd = self.podman_cmd(
            "run", "--rm", *RUN_FLAGS, "--read-only", "--tmpfs", "/tmp",
            *(["--entrypoint", entrypoint] if entrypoint else []),
            *_env_flags(env or {}), *(extra or []), self.image_ref, *args,
        )
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def start(self, args: list[str], *, env: dict[str, str] | None = None,
              publish: int = 8000, flags: list[str] | None = None,
              entrypoint: list[str] | None = None, what: str = "replica") -> "Container":
        """Start a detached container; `publish` (container port) goes to a free host port."""
        name = self.name(what)
        host_port = free_port()
        cmd = self.podman_cmd(
            "run", "-d", "--name", name, *RUN_FLAGS,
            "-p", f"127.0.0.1:{host_port}:{publish}",
            *(flags if flags is not None else ["--read-only", "--tmpfs", "/tmp"]),
            *(["--entrypoint", json.dumps(entrypoint)] if entrypoint is not None else []),
            *_env_flags(env or {}), self.image_ref, *args,
        )
        _run(cmd, 60, f"podman run {name}")
        return Container(self, name, host_port)

    def cleanup(self) -> None:
        self.podman("rm", "-a", "-f", "-t", "0", check=False, timeout=120)
        subprocess.run(["buildah", *self.storage, "rm", "--all"], capture_output=True, timeout=60)
        self.podman("rmi", "-a", "-f", check=False, timeout=120)
        # Anything still mounted under the storage root (an interrupted run) first.
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.dir))]
        for m in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def _env_flags(env: dict[str, str]) -> list[str]:
    out: list[str] = []
    # The suite's databases share one cluster and trust each other: pass on its opt-in
    # to sharing the cluster-wide roles (tests/conftest.py, docs/explanation/security.md), or a
    # container's `switchboard migrate` into a second database is refused.
    if "PGOPTIONS" in os.environ and "PGOPTIONS" not in env:
        env = {**env, "PGOPTIONS": os.environ["PGOPTIONS"]}
    for k, v in env.items():
        out += ["-e", f"{k}={v}"]
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Container:
    def __init__(self, kit: Kit, name: str, host_port: int) -> None:
        self.kit = kit
        self.name = name
        self.port = host_port
        self.base = f"http://127.0.0.1:{host_port}"

    def state(self) -> dict[str, Any]:
        out = self.kit.podman("inspect", self.name, what="podman inspect").stdout
        return json.loads(out)[0]["State"]

    def logs(self) -> str:
        p = self.kit.podman("logs", self.name, check=False)
        return (p.stdout + p.stderr)[-6000:]

    def get(self, path: str, timeout: float = 3) -> httpx.Response:
        return httpx.get(self.base + path, timeout=timeout)

    def wait_status(self, path: str, status: int = 200, timeout: float = 90,
                    probe_timeout: float = 3) -> float:
        """Poll until `path` answers `status`; returns the seconds it took."""
        t0 = time.monotonic()
        last = "no answer"
        while time.monotonic() - t0 < timeout:
            st = self.state()
            if not st.get("Running"):
                raise AssertionError(
                    f"{self.name} exited with {st.get('ExitCode')} before {path} answered "
                    f"{status}:\n{self.logs()}"
                )
            try:
                r = self.get(path, timeout=probe_timeout)
                if r.status_code == status:
                    return time.monotonic() - t0
                last = f"{r.status_code} {r.text[:200]}"
            except httpx.HTTPError as exc:
                last = repr(exc)
            time.sleep(0.25)
        raise AssertionError(f"{self.name}: {path} not {status} after {timeout}s ({last}):\n"
                             f"{self.logs()}")

    def exec(self, *cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return self.kit.podman("exec", self.name, *cmd, timeout=timeout, check=False)

    def stop(self, grace: int) -> tuple[int, float]:
        """`podman stop -t grace` (SIGTERM, SIGKILL after grace); (exit code, seconds)."""
        t0 = time.monotonic()
        self.kit.podman("stop", "-t", str(grace), self.name, timeout=grace + 30, what="podman stop")
        elapsed = time.monotonic() - t0
        return int(self.state()["ExitCode"]), elapsed

    def remove(self) -> None:
        self.kit.podman("rm", "-f", "-t", "0", self.name, check=False)


def container_url(url: str) -> str:
    """A host-loopback PostgreSQL URL as the container reaches it."""
    return url.replace("@127.0.0.1:", f"@{HOST_FROM_CONTAINER}:", 1)
