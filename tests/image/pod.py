"""Run what the chart renders, as a kubelet would, with podman.

There is no Kubernetes here, so this is the closest thing to `helm install`
the machine allows: the chart is rendered by the real Helm engine, and the
Deployment's (or the migration Job's) container is turned into one `podman
run` without interpretation beyond what a kubelet does:

- `command` -> the entrypoint, `args` -> the arguments, verbatim;
- `env` -> values, with `secretKeyRef` / `configMapKeyRef` resolved from the
  rendered Secret and ConfigMap or from a test Secret (an `optional` key that
  is absent leaves the variable unset; a required one that is absent is the
  kubelet's CreateContainerConfigError, here a test failure); `envFrom` likewise;
- the securityContext -> `--user uid:gid`, `--read-only`, `--cap-drop`,
  `no-new-privileges`; an emptyDir at /tmp -> a tmpfs;
- with a `PodVolumes` (tests/image/test_extension_points_image.py): an emptyDir
  shared by several containers of the pod -> one host directory bind-mounted
  into each; a `secret` / `configMap` volume -> its items written as files
  (with `defaultMode`) and bind-mounted; `readOnly` mounts -> `:ro`;
  `initContainers` -> run to completion, in order, before the main container
  (a non-zero exit is the kubelet's Init:Error, here a test failure);
- `sidecars` (the pod's other containers) -> `run_sidecar`: in their own image,
  in the main container's network namespace (a pod's containers share
  loopback), with their own securityContext and mounts;
- the container port named by the probes -> the port published on a free host
  port; probes -> HTTP GETs on their path with their timeout;
- deletion -> the preStop hook as declared (exec in the container, or the
  kubelet's sleep), then SIGTERM with what is left of
  terminationGracePeriodSeconds, SIGKILL after it.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

from kit import Container, Kit

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "chart"
RELEASE = "sb"
NAMESPACE = "apps"


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        raw = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [d for p, t in sorted(raw.items()) if not p.endswith("NOTES.txt")
            for d in yaml.safe_load_all(t) if d]


def objects_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = objects_of(objects, "Deployment")
    return dep


class ConfigError(AssertionError):
    """What the kubelet reports as CreateContainerConfigError."""


@dataclass
class PodRun:
    """One rendered pod template (Deployment or Job) made runnable."""

    pod: dict[str, Any]  # the pod spec
    container: dict[str, Any]
    env: dict[str, str]

    @property
    def entrypoint(self) -> list[str]:
        return list(self.container.get("command") or [])

    @property
    def args(self) -> list[str]:
        return [str(a) for a in self.container.get("args") or []]

    def port(self, name_or_number: str | int) -> int:
        if isinstance(name_or_number, int):
            return name_or_number
        for p in self.container.get("ports", []):
            if p.get("name") == name_or_number:
                return int(p["containerPort"])
        raise ConfigError(f"no container port named {name_or_number!r}")

    def security(self) -> tuple[int, int]:
        """(uid, gid) the kubelet would run the container as."""
        pod_sc = self.pod.get("securityContext") or {}
        sc = self.container.get("securityContext") or {}
        uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
        gid = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        if uid is None or gid is None:
            raise ConfigError("the chart leaves the uid/gid to the image; this test needs them set")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) and int(uid) == 0:
            raise ConfigError("runAsNonRoot with runAsUser 0")
        return int(uid), int(gid)

    def podman_flags(self, volumes: "PodVolumes | None" = None) -> list[str]:
        sc = self.container.get("securityContext") or {}
        uid, gid = self.security()
        flags = ["--user", f"{uid}:{gid}"]
        if sc.get("readOnlyRootFilesystem"):
            flags.append("--read-only")
        for cap in (sc.get("capabilities") or {}).get("drop", []):
            flags += ["--cap-drop", cap]
        if sc.get("allowPrivilegeEscalation") is False:
            flags += ["--security-opt", "no-new-privileges"]
        declared = {v["name"]: v for v in self.pod.get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            if volumes is not None:
                flags += volumes.flags(mount)
                continue
            vol = declared[mount["name"]]
            if "emptyDir" not in vol:
                raise ConfigError(f"volume {mount['name']}: only emptyDir can be emulated here")
            size = _tmpfs_size(vol["emptyDir"].get("sizeLimit"))
            flags += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777" + (f",size={size}" if size else "")]
        return flags


class PodVolumes:
    """The pod's volumes on the host, for containers that share them.

    An emptyDir mounted by one container only stays a sized tmpfs (as
    PodRun.podman_flags does without this); one mounted by several (an init
    container filling it for the main one) is a host directory, writable by
    every uid like an emptyDir with fsGroup. secret / configMap volumes are
    their items written as files with defaultMode, from the rendered objects or
    the test's Secrets."""

    def __init__(self, pod: dict[str, Any], store: dict[tuple[str, str], dict[str, str]],
                 base: Path) -> None:
        self.pod = pod
        self.base = base
        self.declared = {v["name"]: v for v in pod.get("volumes", [])}
        users: dict[str, int] = {}
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            for m in c.get("volumeMounts", []):
                users[m["name"]] = users.get(m["name"], 0) + 1
        self.shared = {n for n, count in users.items() if count > 1}
        self.dirs: dict[str, Path] = {}
        for name, vol in self.declared.items():
            if "emptyDir" in vol and name in self.shared:
                d = base / name
                d.mkdir(parents=True)
                d.chmod(0o1777)
                self.dirs[name] = d
            elif "secret" in vol or "configMap" in vol:
                kind, src = (("Secret", vol["secret"]) if "secret" in vol else ("ConfigMap", vol["configMap"]))
                ref = src.get("secretName") or src.get("name")
                data = store.get((kind, ref))
                if data is None:
                    raise ConfigError(f"volume {name}: {kind} {ref!r} does not exist")
                d = base / name
                d.mkdir(parents=True)
                d.chmod(0o755)
                items = src.get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    if item["key"] not in data:
                        raise ConfigError(f"volume {name}: {kind} {ref!r} has no key {item['key']!r}")
                    f = d / item["path"]
                    f.write_text(data[item["key"]])
                    f.chmod(int(item.get("mode", src.get("defaultMode", 0o644))))
                self.dirs[name] = d

    def flags(self, mount: dict[str, Any]) -> list[str]:
        name = mount["name"]
        vol = self.declared.get(name)
        if vol is None:
            raise ConfigError(f"volumeMount {name!r}: no such volume in the pod")
        ro = ":ro" if mount.get("readOnly") or "secret" in vol or "configMap" in vol else ""
        if name in self.dirs:
            return ["-v", f"{self.dirs[name]}:{mount['mountPath']}{ro or ':rw'}"]
        if "emptyDir" in vol:
            size = _tmpfs_size(vol["emptyDir"].get("sizeLimit"))
            return ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777" + (f",size={size}" if size else "")]
        raise ConfigError(f"volume {name}: {sorted(vol)} cannot be emulated here")


def _tmpfs_size(quantity: str | None) -> str | None:
    """A Kubernetes quantity (64Mi) as a tmpfs size (64m)."""
    if not quantity:
        return None
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if str(quantity).endswith(suffix):
            return str(quantity)[: -len(suffix)] + unit
    if str(quantity).isdigit():
        return str(quantity)
    raise ConfigError(f"sizeLimit {quantity!r}: unsupported quantity here")


def object_store(objects: list[dict[str, Any]],
                 secrets: dict[str, dict[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    """{(kind, name): data} of the rendered Secrets and ConfigMaps and the test's Secrets."""
    store: dict[tuple[str, str], dict[str, str]] = {}
    for s in objects_of(objects, "Secret"):
        store[("Secret", s["metadata"]["name"])] = {
            k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
    for name, data in secrets.items():
        store[("Secret", name)] = dict(data)
    for cm in objects_of(objects, "ConfigMap"):
        store[("ConfigMap", cm["metadata"]["name"])] = dict(cm.get("data") or {})
    return store


def resolve_init(pod_template: dict[str, Any], objects: list[dict[str, Any]],
                 secrets: dict[str, dict[str, str]]) -> list[PodRun]:
    """The pod's init containers, in order, resolved like the main container."""
    return [resolve(pod_template, objects, secrets, container=c)
            for c in pod_template["spec"].get("initContainers", [])]


def resolve(pod_template: dict[str, Any], objects: list[dict[str, Any]],
            secrets: dict[str, dict[str, str]], container: dict[str, Any] | None = None) -> PodRun:
    """Resolve a pod template's container (the single one, or the one named
    switchboard beside sidecars, or `container`) against rendered objects + test Secrets."""
    pod = pod_template["spec"]
    if container is None:
        if len(pod["containers"]) == 1:
            (container,) = pod["containers"]
        else:
            (container,) = [c for c in pod["containers"] if c["name"] == "switchboard"]
    store = object_store(objects, secrets)

    def lookup(kind: str, ref: dict[str, Any]) -> str | None:
        data = store.get((kind, ref["name"]))
        if data is None or ref["key"] not in data:
            if ref.get("optional"):
                return None
            raise ConfigError(f"{kind} {ref['name']!r} has no key {ref['key']!r}")
        return data[ref["key"]]

    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            kind, ref = "ConfigMap", source["configMapRef"]
        else:
            kind, ref = "Secret", source["secretRef"]
        data = store.get((kind, ref["name"]))
        if data is None:
            if ref.get("optional"):
                continue
            raise ConfigError(f"{kind} {ref['name']!r} does not exist")
        env.update({source.get("prefix", "") + k: v for k, v in data.items()})
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        vf = entry["valueFrom"]
        if "secretKeyRef" in vf:
            value = lookup("Secret", vf["secretKeyRef"])
        elif "configMapKeyRef" in vf:
            value = lookup("ConfigMap", vf["configMapKeyRef"])
        else:
            raise ConfigError(f"env {entry['name']}: {sorted(vf)} cannot be resolved here")
        if value is not None:
            env[entry["name"]] = value
    return PodRun(pod=pod, container=container, env=env)


def http_probe(run: PodRun, kind: str) -> tuple[str, int, float, int, int]:
    """(path, container port, timeout, period, failureThreshold) of a probe."""
    probe = run.container[kind]
    get = probe["httpGet"]
    return (get["path"], run.port(get["port"]), float(probe.get("timeoutSeconds", 1)),
            int(probe.get("periodSeconds", 10)), int(probe.get("failureThreshold", 3)))


def start(kit: Kit, run: PodRun, what: str) -> Container:
    path, port, _, _, _ = http_probe(run, "readinessProbe")
    del path
    return kit.start(run.args, env=run.env, publish=port, flags=run.podman_flags(),
                     entrypoint=run.entrypoint, what=what)


def wait_probes(c: Container, run: PodRun) -> dict[str, float]:
    """The startup probe within its budget, then readiness and liveness: seconds each took."""
    took = {}
    path, _, timeout, period, failures = http_probe(run, "startupProbe")
    took["startup"] = c.wait_status(path, 200, timeout=period * failures, probe_timeout=timeout)
    for kind in ("readinessProbe", "livenessProbe"):
        path, _, timeout, _, _ = http_probe(run, kind)
        took[kind] = c.wait_status(path, 200, timeout=60, probe_timeout=timeout)
    return took


def delete(c: Container, run: PodRun) -> tuple[int, float, bool]:
    """Pod deletion: preStop, then SIGTERM with the rest of the grace period.
    Returns (exit code, seconds from deletion to exit, served throughout preStop)."""
    grace = int(run.pod.get("terminationGracePeriodSeconds", 30))
    t0 = time.monotonic()
    pre = (run.container.get("lifecycle") or {}).get("preStop")
    served = True
    path, _, timeout, _, _ = http_probe(run, "readinessProbe")
    if pre and "exec" in pre:
        proc = c.kit.podman_cmd("exec", c.name, *pre["exec"]["command"])
        import subprocess

        hook = subprocess.Popen(proc, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while hook.poll() is None:
            # Kubernetes has already taken the pod out of the endpoints; the
            # process itself must keep answering whoever still routes to it.
            try:
                served &= c.get(path, timeout=timeout).status_code == 200
            except Exception:
                served = False
            time.sleep(0.5)
        out = hook.stdout.read() if hook.stdout else ""
        if hook.returncode != 0:
            raise AssertionError(f"preStop {pre['exec']['command']} failed ({hook.returncode}): {out}")
    elif pre and "sleep" in pre:
        time.sleep(int(pre["sleep"]["seconds"]))
    left = grace - (time.monotonic() - t0)
    assert left > 0, "the preStop hook used the whole grace period"
    c.kit.podman("stop", "-t", str(int(left)), c.name, timeout=int(left) + 30, what="podman stop")
    return int(c.state()["ExitCode"]), time.monotonic() - t0, served


def _run_to_completion(kit: Kit, run: PodRun, volumes: PodVolumes, timeout: float,
                       network: list[str], what: str) -> str:
    """One container of the pod, in its own image, until it exits; its output. A
    non-zero exit is a test failure (what it is to a kubelet is up to `what`)."""
    import json
    import subprocess

    from kit import RUN_FLAGS, _env_flags

    flags = list(RUN_FLAGS)
    if network:
        i = flags.index("--network")
        flags[i:i + 2] = network
    cmd = kit.podman_cmd("run", "--rm", *flags, *run.podman_flags(volumes),
                         *(["--entrypoint", json.dumps(run.entrypoint)] if run.entrypoint else []),
                         *_env_flags(run.env), run.container["image"], *run.args)
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(f"{what} {run.container['name']} exited {out.returncode}:\n"
                             f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def run_init(kit: Kit, run: PodRun, volumes: PodVolumes, timeout: float = 120) -> str:
    """One init container, to completion, in its own image; its output (a non-zero exit
    is the kubelet's Init:Error)."""
    return _run_to_completion(kit, run, volumes, timeout, [], "init container (Init:Error)")


def sidecars(pod_template: dict[str, Any], objects: list[dict[str, Any]],
             secrets: dict[str, dict[str, str]]) -> list[PodRun]:
    """The pod's containers other than switchboard, resolved like it."""
    return [resolve(pod_template, objects, secrets, container=c)
            for c in pod_template["spec"]["containers"] if c["name"] != "switchboard"]


def run_sidecar(kit: Kit, run: PodRun, main: Container, volumes: PodVolumes, timeout: float = 120) -> str:
    """A sidecar, to completion, beside the running main container: its own image,
    securityContext and mounts, the main container's network namespace (a pod's
    containers share loopback). Its output."""
    return _run_to_completion(kit, run, volumes, timeout, ["--network", f"container:{main.name}"], "sidecar")


def start_with(kit: Kit, run: PodRun, volumes: PodVolumes, what: str) -> Container:
    """The main container with the pod's volumes (after its init containers ran)."""
    _, port, _, _, _ = http_probe(run, "readinessProbe")
    return kit.start(run.args, env=run.env, publish=port, flags=run.podman_flags(volumes),
                     entrypoint=run.entrypoint, what=what)
