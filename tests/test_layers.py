"""The package's structure, checked: imports point one way, and the composition
root builds every component fully.

The import graph is read from the source with ast (every import statement,
including those under ``if TYPE_CHECKING:`` and inside functions), so a cycle
hidden from the interpreter by a type-only import still fails here.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "server" / "switchboard"
sys.path.insert(0, str(ROOT / "server"))

# Entry points and the composition root may import anything; nothing imports them.
TOP = {"switchboard.app", "switchboard.asgi", "switchboard.cli", "switchboard.gunicorn_worker"}
ROOT_MODULES = {"switchboard.app", "switchboard.services"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        rel = p.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


def _resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(mod, is_pkg, node)
                # "from . import errors" / "from .http import tasks" name submodules
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods and "." in t:
                    t = t.rsplit(".", 1)[0]
                if t in mods and t != mod:
                    graph[mod].add(t)
    # importing a.b.c first imports packages a.b (their __init__ is part of the edge)
    for mod in list(graph):
        for t in list(graph[mod]):
            parts = t.split(".")
            for i in range(1, len(parts)):
                parent = ".".join(parts[:i])
                if parent in graph and parent != mod and not mod.startswith(parent + "."):
                    graph[mod].add(parent)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_walker_sees_type_checking_imports_and_finds_a_planted_cycle() -> None:
    g = import_graph()
    assert "switchboard.db" in g["switchboard.scheduler"]
    assert "switchboard.http.common" in g["switchboard.http.tasks"]
    assert "switchboard.http.tasks" in g["switchboard.app"]
    # A cycle through a type-only import is still a cycle.
    src = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .app import Services\n"
    node = ast.parse(src).body[1].body[0]  # type: ignore[attr-defined]
    assert _resolve("switchboard.relay", False, node) == "switchboard.app"
    planted = {k: set(v) for k, v in g.items()}
    planted["switchboard.db"].add("switchboard.app")
    assert find_cycle(planted) is not None


def test_import_graph_has_no_cycle() -> None:
    assert find_cycle(import_graph()) is None


def _top(mod: str) -> bool:
    """An entry point, or a module of one (switchboard.cli is a package)."""
    return any(mod == t or mod.startswith(t + ".") for t in TOP)


def test_nothing_imports_the_composition_root_or_an_entry_point() -> None:
    g = import_graph()
    offenders = sorted((m, t) for m, ts in g.items() for t in ts
                       if (_top(t) or t in ROOT_MODULES) and not _top(m))
    assert offenders == []


def test_components_do_not_take_the_service_locator() -> None:
    """No module but the composition root and app.py names Services."""
    for mod, path in _modules().items():
        if mod in ROOT_MODULES:
            continue
        assert "Services" not in path.read_text(), mod


def test_build_services_constructs_every_field() -> None:
    from switchboard.config import Config
    from switchboard.services import Services, build_services

    svc = build_services(Config(database_url="postgresql://nobody@127.0.0.1:1/none",
                                jwt_secret="x" * 40))
    names = [f.name for f in dataclasses.fields(Services)]
    assert len(names) >= 12
    assert [n for n in names if getattr(svc, n) is None] == []
    # the relay's callbacks are the scheduler's and the tool bridge's, wired at construction
    assert svc.relay.on_run_wake == svc.scheduler.wake
    assert svc.relay.announce.on_tool_result == svc.tools.resolve
    assert {"noop", "sleep", "fail", "sql", "notify", "maintenance"} <= set(svc.handlers.names())
    with pytest.raises(dataclasses.FrozenInstanceError):
        svc.relay = None  # type: ignore[misc]


def test_the_handler_context_exposes_no_internals() -> None:
    from switchboard.handlers import HandlerContext

    public = {n for n in dir(HandlerContext) if not n.startswith("_")}
    assert public == {"run_id", "attempt", "max_attempts", "args", "task_id", "handler", "trigger",
                      "scheduled_for", "logger", "lease_lost", "cancelled", "deadline", "seconds_left",
                      "wait_lease_lost", "notify_user", "notify_room", "enqueue", "stream", "sync"}


def test_load_handlers_merges_builtins_entry_points_and_modules(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from switchboard.handlers import HandlerLoadError, HandlerRegistry, load_handlers

    (tmp_path / "sb_test_handlers_mod.py").write_text(
        "from switchboard.handlers import registry\n"
        "@registry.register('mod.one')\n"
        "async def one(ctx):\n    return 1\n"
        "@registry.register('noop')\n"
        "async def my_noop(ctx):\n    return 'mine'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    builtins = HandlerRegistry()

    @builtins.register("noop")
    async def noop(ctx):  # type: ignore[no-untyped-def]
        return None

    reg = load_handlers(["sb_test_handlers_mod"], builtins)
    assert {"mod.one", "noop"} <= set(reg.names())
    assert reg.get("noop").__name__ == "my_noop"  # type: ignore[union-attr]  # later source wins
    with pytest.raises(HandlerLoadError, match="SWITCHBOARD_HANDLERS: cannot import 'sb_no_such_module_here'"):
        load_handlers(["sb_no_such_module_here"], builtins)


# docs/explanation/architecture.md's layer diagram: each module's row; imports go to the same row or below.
LAYERS = [
    {"switchboard.asgi", "switchboard.cli", "switchboard.gunicorn_worker"},
    {"switchboard.app"},
    {"switchboard.services"},
    {"switchboard.http", "switchboard.ws", "switchboard.ws_actions", "switchboard.sse", "switchboard.sse_actions",
     "switchboard.errors", "switchboard.openapi"},
    {"switchboard.relay", "switchboard.resume", "switchboard.scheduler", "switchboard.heartbeat",
     "switchboard.catalog", "switchboard.tools", "switchboard.ratelimit", "switchboard.builtin_handlers",
     "switchboard.failover", "switchboard.sessions", "switchboard.runfeed", "switchboard.streams.runtime",
     "switchboard.presence",
     "switchboard.testing"},
    {"switchboard.handlers", "switchboard.handler_context", "switchboard.registry"},
    {"switchboard", "switchboard.db", "switchboard.data", "switchboard.auth", "switchboard.metrics",
     "switchboard.replica", "switchboard.sockets", "switchboard.hints", "switchboard.bounded", "switchboard.cursor",
     "switchboard.config", "switchboard.config_docs", "switchboard.migrate", "switchboard.pgtest",
     "switchboard.domain_errors", "switchboard.rows", "switchboard.latency_trace", "switchboard.memory",
     "switchboard.streams", "switchboard.api", "switchboard.origins", "switchboard.handler_options",
     "switchboard.jobargs", "switchboard.jobargs_nodes", "switchboard.jobargs_bounds"},
]
HTTP_ROW = 3  # http/, ws, errors, openapi: the only modules that speak HTTP


def _layer(mod: str) -> int:
    for i, names in enumerate(LAYERS):
        if mod in names or any(mod.startswith(n + ".") for n in names if n != "switchboard"):
            return i
    raise AssertionError(f"{mod} is in no layer: add it to LAYERS and to the layer diagram of docs/explanation/architecture.md")


def test_imports_only_point_down_the_layers() -> None:
    g = import_graph()
    upward = sorted((m, t) for m, ts in g.items() for t in ts if _layer(t) < _layer(m))
    assert upward == []


def _imports_of(path: Path) -> set[str]:
    """Top-level names of every module an import statement in ``path`` names."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_nothing_below_http_imports_falcon() -> None:
    """Components and foundations raise domain errors (switchboard.domain_errors); only the
    HTTP row maps them to responses (errors.DOMAIN_STATUS), so the relay, the scheduler,
    auth, tools and ratelimit never depend on Falcon."""
    below = {mod: path for mod, path in _modules().items() if _layer(mod) > HTTP_ROW}
    assert {"switchboard.auth", "switchboard.tools", "switchboard.ratelimit", "switchboard.relay"} <= set(below)
    offenders = sorted(mod for mod, path in below.items() if "falcon" in _imports_of(path))
    assert offenders == [], f"{offenders} import falcon: raise a switchboard.domain_errors error instead"


def test_the_falcon_check_sees_a_planted_import(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text("def f():\n    import falcon.asgi\n    from falcon import HTTPError\n")
    assert "falcon" in _imports_of(planted)


# Size: a module past ~400 lines or a class past ~300 does more than one job. The
# exceptions are named here with the reason; anything else that grows is split in
# the change that grows it.
MODULE_MAX = 400
CLASS_MAX = 300
SIZE_EXCEPTIONS: dict[str, str] = {}


def test_no_module_or_class_outgrows_one_job() -> None:
    too_big = []
    for mod, path in _modules().items():
        text = path.read_text()
        if mod not in SIZE_EXCEPTIONS and text.count("\n") > MODULE_MAX:
            too_big.append(f"{mod}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and (node.end_lineno or 0) - node.lineno + 1 > CLASS_MAX:
                too_big.append(f"{mod}.{node.name}: {(node.end_lineno or 0) - node.lineno + 1} lines")
    assert too_big == [], too_big
