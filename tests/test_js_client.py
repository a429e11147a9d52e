"""The JS client package (clients/js): build, generated types, tsc --strict, node --test suites.

The node suites (clients/js/test/*.test.mjs) start their own throwaway
PostgreSQL and real replicas through clients/js/test/replicas.py, so this
wrapper only installs (npm ci, from the lockfile), builds and runs them, and
shows their output when they fail. Node >= 20 is required: scripts/test.sh
installs it; a missing node fails here, it never skips.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ROOT

JS = ROOT / "clients" / "js"
STATIC_COPY = ROOT / "server" / "switchboard" / "static" / "switchboard-client.js"


def run(*cmd: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=JS, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHON": sys.executable, **(env or {})})


def show(out: subprocess.CompletedProcess) -> str:
    return f"exit {out.returncode}\n--- stdout ---\n{out.stdout[-12000:]}\n--- stderr ---\n{out.stderr[-6000:]}"


@pytest.fixture(scope="module")
def built() -> dict[str, str]:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail("node/npm are not installed; scripts/test.sh installs nodejs (Node >= 20)", pytrace=False)
    stamp = JS / "node_modules" / ".package-lock.json"
    if not stamp.exists() or stamp.stat().st_mtime < (JS / "package-lock.json").stat().st_mtime:
        out = run("npm", "ci", "--no-audit", "--no-fund")
        assert out.returncode == 0, show(out)
    committed = STATIC_COPY.read_text()
    out = run("npm", "run", "build")   # writes only clients/js/dist (npm run copy:static updates the served copy)
    assert out.returncode == 0, show(out)
    return {"static_before_build": committed}


def test_build_outputs_and_the_served_copy(built: dict[str, str]) -> None:
    assert (JS / "dist" / "index.js").stat().st_size > 0
    assert "export declare class SwitchboardClient" in (JS / "dist" / "client.d.ts").read_text()
    assert "SwitchboardClient" in (JS / "dist" / "index.d.ts").read_text()
    # The page at / loads the package from the server: the committed copy is this build.
    assert built["static_before_build"] == (JS / "dist" / "index.js").read_text(), \
        "server/switchboard/static/switchboard-client.js is stale: run `npm run build && npm run copy:static` " \
        "in clients/js and commit it"
    # zero runtime dependencies
    import json

    pkg = json.loads((JS / "package.json").read_text())
    assert not pkg.get("dependencies"), pkg.get("dependencies")
    assert not re.search(r"^\s*import[\s{*]", (JS / "dist" / "index.js").read_text(), re.M), "a runtime import"


def test_rest_types_are_generated_from_the_current_openapi(built: dict[str, str]) -> None:
    before = (JS / "src" / "rest.ts").read_text()
    out = run("npm", "run", "gen:rest")
    assert out.returncode == 0, show(out)
    assert (JS / "src" / "rest.ts").read_text() == before, "src/rest.ts was stale: commit the regenerated file"


def test_typed_usage_compiles_under_tsc_strict(built: dict[str, str]) -> None:
    out = run("npm", "run", "typecheck")
    assert out.returncode == 0, show(out)


def test_node_unit_suite(built: dict[str, str]) -> None:
    """The client's decisions against a scripted WebSocket: close codes, backoff, dedupe, ping, tools."""
    out = run("node", "--experimental-websocket", "--test", "test/unit.test.mjs", timeout=300)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_node_errors_rooms_urls_unit_suite(built: dict[str, str]) -> None:
    """Error classes on the events that carry codes, room handles, several URLs: against a scripted WebSocket."""
    out = run("node", "--experimental-websocket", "--test", "test/errors-rooms-urls.test.mjs", timeout=300)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_the_api_lists_in_the_docs_match_the_dts(built: dict[str, str]) -> None:
    """clients/js/README.md's and docs/how-to/frontend.md's member, event, option, room member and error class
    tables against dist/*.d.ts, both ways (test/readme-api.test.mjs)."""
    out = run("node", "--test", "test/readme-api.test.mjs", timeout=120)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_node_failover_suite_on_real_replicas(built: dict[str, str]) -> None:
    """options.urls with two real replicas and no proxy: the first SIGKILLed mid-session, the client
    goes on at the second and every event arrives once, in order (resume); a room handle and a
    ForbiddenError on a real server."""
    out = run("node", "--experimental-websocket", "--test", "--test-concurrency=1", "test/failover.test.mjs",
              timeout=600)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_node_suite_on_real_replicas(built: dict[str, str]) -> None:
    out = run("node", "--experimental-websocket", "--test", "--test-concurrency=1", "test/client.test.mjs",
              timeout=900)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_node_session_suite_on_real_replicas(built: dict[str, str]) -> None:
    """Refresh, reload and logout-closes-the-socket: needs the sessions endpoints (COORD contract)."""
    out = run("node", "--experimental-websocket", "--test", "--test-concurrency=1", "test/session.test.mjs",
              timeout=600)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_node_stream_suite_on_real_replicas(built: dict[str, str]) -> None:
    """sb.stream()/sb.streams() with examples/ai_chat's handler on one replica and the client on
    another: every chunk once and in order, across a SIGKILL of the client's replica; stop();
    another user's stream refused."""
    out = run("node", "--experimental-websocket", "--test", "--test-concurrency=1", "test/stream.test.mjs",
              timeout=600)
    assert out.returncode == 0, show(out)
    assert "# fail 0" in out.stdout, show(out)


def test_bundle_is_small(built: dict[str, str]) -> None:
    import json

    out = run("node", "scripts/build.mjs", "--size")
    assert out.returncode == 0, show(out)
    size = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"@switchboard/client: {size['minified_bytes']} B minified, {size['min_gzip_bytes']} B min+gzip")
    assert size["min_gzip_bytes"] < 10_000, size
    assert Path(JS / "dist" / "index.js").exists()


def _docs_block(path: Path, heading: str, lang: str) -> str:
    """The first ```<lang> block after ``heading`` in a Markdown file."""
    text = path.read_text()
    start = text.index(heading)
    m = re.compile(rf"^```{lang}\n(.*?)^```", re.M | re.S).search(text, start)
    assert m, f"no ```{lang} block after {heading!r} in {path}"
    return m.group(1)


# What docs/how-to/frontend.md's first example leaves to the reader's app.
EXAMPLE_PRELUDE = """declare const username: string;
declare const password: string;
declare function showLogin(reason?: string): void;
"""


# What docs/how-to/frontend.md's compact example (README's "Frontend" until issue 36) leaves
# to the reader's app.
COMPACT_PRELUDE = EXAMPLE_PRELUDE + """declare function render(e: unknown): void;
declare function showTyping(room: string | undefined, from: string | undefined): void;
declare function warn(message: string): void;
declare function backToLogin(reason?: string): void;
declare function ask(message: unknown): Promise<boolean>;
"""


# What the package README's example leaves to the reader's app.
PACKAGE_README_PRELUDE = EXAMPLE_PRELUDE + """declare function render(from: string, text: string): void;
"""


@pytest.mark.parametrize(("doc", "heading", "lang"), [("docs/how-to/frontend.md", "## Example", "ts"),
                                                      ("docs/how-to/frontend.md", "## Typed events and rooms", "ts"),
                                                      ("docs/how-to/frontend.md", "## React", "tsx"),
                                                      ("docs/how-to/frontend.md", "## Streams", "ts"),
                                                      ("docs/how-to/frontend.md", "## Presence", "ts"),
                                                      ("docs/how-to/frontend.md", "## A compact example", "ts"),
                                                      ("clients/js/README.md", "## Example", "ts")])
def test_the_examples_in_the_frontend_docs_compile(built: dict[str, str], tmp_path: Path, doc: str, heading: str,
                                                   lang: str) -> None:
    """docs/how-to/frontend.md's examples and the package README's, type-checked with the package's own
    TypeScript (strict) against the client's sources and, for React, a minimal ambient
    react (test/docs-check/react.d.ts): no npm dependency, and a doc that drifts from
    the client's API fails here."""
    prelude = {"docs/how-to/frontend.md": EXAMPLE_PRELUDE if lang == "ts" else "",
               "clients/js/README.md": PACKAGE_README_PRELUDE}[doc]
    if heading == "## A compact example":
        prelude = COMPACT_PRELUDE
    # A module (top-level await in the examples): export nothing.
    (tmp_path / "example.tsx").write_text(prelude + _docs_block(ROOT / doc, heading, lang) + "\nexport {};\n")
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {
            "target": "ES2022", "module": "ES2022", "moduleResolution": "bundler", "lib": ["ES2022", "DOM"],
            "jsx": "react-jsx", "strict": True, "noEmit": True, "skipLibCheck": False, "types": [],
            "isolatedModules": True, "verbatimModuleSyntax": True,
            "paths": {"@switchboard/client": [str(JS / "src" / "index.ts")]},
        },
        "files": [str(tmp_path / "example.tsx"), str(JS / "test" / "docs-check" / "react.d.ts")],
    }))
    out = run("node", str(JS / "node_modules" / "typescript" / "bin" / "tsc"), "-p", str(tmp_path / "tsconfig.json"))
    assert out.returncode == 0, show(out)

