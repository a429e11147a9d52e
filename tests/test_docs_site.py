"""The documentation site (mkdocs.yml, docs/): the generated reference pages are
current, the site builds with --strict, every relative link resolves, the
configuration reference is the only settings table, and the examples marked
in the pages run.

Examples: an HTML comment right before a fenced block marks it for this suite
(invisible in the built site):

    <!-- test: python -->                  run as a program (a subprocess, server/ on the path,
                                           DATABASE_URL a migrated database of its own)
    <!-- test: python prelude=NAME -->     the same after PRELUDES[NAME] (what the page leaves
                                           to the reader's app: a connection string, a table)
    <!-- test: psql -->                    the statements of a psql transcript (output lines
                                           skipped), run by psql; the errors it raises must be
                                           exactly the `ERROR:` lines the transcript shows
    <!-- test: psql session=NAME -->       the page's blocks of session NAME run in order in one
                                           psql session (later blocks use the variables earlier ones set)
    <!-- test: ts [prelude=NAME] -->       type-checked by tsc --strict against the client's src/
    <!-- test: excerpt of=PATH -->         the block's code lines (comments and indentation aside)
                                           are lines of PATH, in order: a quote that cannot drift
                                           from a file another test runs
    <!-- fragment: WHY -->                 not a complete program (a sketch, a config excerpt):
                                           said so, so no runnable block is left unmarked

Every python, ts, tsx and sql block, and every unlabelled block that holds a psql
statement, carries one of these (test_every_runnable_block_is_marked).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import psycopg
import pytest
import unicodedata

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "server"))

from switchboard.config_docs import SETTINGS, documented_names  # noqa: E402
from switchboard.pgtest import find_bindir  # noqa: E402


def gen_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# -- generated pages ---------------------------------------------------------------------------
def test_the_generated_reference_pages_are_current() -> None:
    gen = gen_docs()
    pages = gen.render([n for n in gen.ALL if n != "sql.md"])
    assert gen.stale(pages) == [], "run python scripts/gen_docs.py and commit docs/reference/"


def test_the_sql_reference_is_current(db: str) -> None:
    gen = gen_docs()
    assert gen.stale(gen.render(["sql.md"], db)) == [], "run python scripts/gen_docs.py and commit docs/reference/"


def test_an_edited_comment_makes_the_check_fail(db: str) -> None:
    """The check can fail: a COMMENT changed in the database is a stale sql.md, and the
    command line says which page (exit 1)."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute("COMMENT ON FUNCTION switchboard.cron_validate(text, text) IS 'edited'")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check", "--only", "sql.md",
                          "--database-url", db], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "docs/reference/sql.md is stale" in out.stderr


def test_the_check_names_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = gen_docs()
    for name in gen.ALL:
        if name != "sql.md":
            (tmp_path / name).write_text((gen.REFERENCE / name).read_text())
    (tmp_path / "metrics.md").write_text("old\n")
    monkeypatch.setattr(gen, "REFERENCE", tmp_path)
    assert gen.main(["--check", "--only", "metrics.md", "--only", "cli.md"]) == 1
    assert gen.stale(gen.render(["metrics.md", "cli.md"])) == ["metrics.md"]


# -- configuration: one source ------------------------------------------------------------------
def _config_rows(path: Path) -> list[str]:
    """Rows of a settings table: lines of a table, outside code fences, whose first cell names
    a setting (`DATABASE_URL`, `SWITCHBOARD_...`)."""
    return [line for line in _outside_fences(path.read_text())
            if re.match(r"^\|\s*`(DATABASE_URL|SWITCHBOARD_[A-Z0-9_]+)`", line)]


def test_readme_carries_no_configuration_table() -> None:
    """README's configuration table had to be checked against switchboard/config_docs.py row by
    row; since issue 36 the generated docs/reference/configuration.md (kept current by
    test_the_generated_reference_pages_are_current) is the table, and README links it. A
    hand-written copy back in README would drift unchecked: link the reference instead."""
    pages = [ROOT / "README.md", ROOT / "tests" / "README.md"]
    found = {str(p.relative_to(ROOT)): len(rows) for p in pages if (rows := _config_rows(p))}
    assert found == {}, f"settings tables outside docs/reference/configuration.md: {found}"


def test_the_configuration_table_check_sees_a_copy(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("| variable | default |\n|---|---|\n| `SWITCHBOARD_JWT_TTL` | `3600` |\n"
                                   "```\n| `DATABASE_URL` | in a fence |\n```\n")
    assert _config_rows(tmp_path / "a.md") == ["| `SWITCHBOARD_JWT_TTL` | `3600` |"]
    assert len(_config_rows(DOCS / "reference" / "configuration.md")) >= len(SETTINGS)


def test_every_variable_the_server_reads_is_documented() -> None:
    read = set()
    for path in (ROOT / "server" / "switchboard").rglob("*.py"):
        read |= set(re.findall(r"[\"'](SWITCHBOARD_[A-Z0-9_]*[A-Z0-9]|DATABASE_URL)[\"']", path.read_text()))
    assert read - documented_names() == set(), "add them to server/switchboard/config_docs.py"


# -- the site -------------------------------------------------------------------------------------
def test_mkdocs_builds_the_site_strictly(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs and mkdocs-material are missing (pip install -e '.[test]')", pytrace=False)
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "sql" / "index.html").exists()


LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _outside_fences(text: str) -> list[str]:
    lines, fence = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fence = not fence
            continue
        if not fence:
            lines.append(line)
    return lines


def slugify(heading: str) -> str:
    """Python-Markdown's toc slugify (what MkDocs uses for heading ids)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: like slugify, but runs of spaces and hyphens are kept
    ("claim + finish" -> "claim--finish")."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path, github: bool = True) -> set[str]:
    """A heading's id on the site, and (github) on GitHub too. A link between two pages of
    the site must use the site's id (mkdocs build --strict refuses GitHub's); a link from a
    file read on GitHub (README, BENCHMARKS.md) may use either."""
    headings = [re.sub(r"[`*]", "", m.group(2)).strip()
                for line in _outside_fences(path.read_text()) if (m := re.match(r"^(#{1,6}) (.+?)\s*#*$", line))]
    return {slugify(h) for h in headings} | ({github_slug(h) for h in headings} if github else set())


def _in_site(page: Path) -> bool:
    return DOCS.resolve() in page.resolve().parents


def _link_problems(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for line in _outside_fences(page.read_text()):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                problems.append(f"{page.relative_to(root)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest, github=not _in_site(page)):
                problems.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return problems


def test_every_relative_link_in_the_site_and_the_readmes_resolves() -> None:
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "clients" / "js" / "README.md", ROOT / "README.md",
                                          ROOT / "tests" / "README.md", ROOT / "BENCHMARKS.md"]
    assert len(pages) > 30
    problems = [p for page in pages for p in _link_problems(page)]
    assert problems == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## Here\n\n[ok](a.md#here) [bad](b.md) [anchor](a.md#there)\n")
    found = [p.split(": ", 1)[1] for p in _link_problems(tmp_path / "a.md", tmp_path)]
    assert found == ["b.md (no such file)", "a.md#there (no such heading)"]


# -- examples that run -------------------------------------------------------------------------
MARK = re.compile(r"^<!-- test: (python|psql|ts|excerpt)((?: \w+=\S+)*) -->$")
FRAGMENT = re.compile(r"^<!-- fragment: \S.* -->$")
PSQL_STATEMENT = re.compile(r"^(SELECT|INSERT|UPDATE|DELETE|CALL|WITH|BEGIN|COMMIT|ROLLBACK|SET|GRANT|CREATE|LISTEN|\\)")

PRELUDES = {
    # docs/how-to/publish-from-python.md: the reader's own table, user and connection string
    "publish": """
import os, uuid
import psycopg
dsn = os.environ["DATABASE_URL"]
with psycopg.connect(dsn, autocommit=True) as _c:
    _c.execute("CREATE SCHEMA IF NOT EXISTS shop")
    _c.execute("CREATE TABLE IF NOT EXISTS shop.orders (id bigint GENERATED ALWAYS AS IDENTITY, user_id uuid)")
    user_id = _c.execute("SELECT switchboard.create_user('ada', %s, 'member')",
                         ("$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",)).fetchone()[0]
""",
    # docs/how-to/streams.md: the user an answer is for
    "admin": """
import os
import psycopg
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as _c:
    ADMIN_ID = str(_c.execute("SELECT switchboard.create_user('admin', %s, 'admin')",
                              ("$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",)).fetchone()[0])
""",
    # a page's free names in a browser app: what the reader's own code provides
    "browser": """
export {};
declare global {
  const username: string, password: string;
  function showLogin(reason?: string): void;
  function backToLogin(reason?: string): void;
  function render(e: unknown): void;
  function showTyping(room: string, from: string): void;
  function warn(message: string): void;
  function ask(message: unknown): Promise<boolean>;
  function discover(): Promise<string[]>;
  const answer: { append(text: string): void }, stopButton: HTMLButtonElement;
  interface ImportMeta { readonly env: Record<string, string> }
}
""",
    # docs/how-to/streams.md: the Next.js route's own helpers
    "next": """
export {};
declare global {
  const SWITCHBOARD: string;
  function openStreamOfChat(chatId: string): Promise<string | null>;
  function tokenFor(req: Request): Promise<string>;
}
""",
}
# psql: what the page assumes its reader already has (a user, a hash; the roles it grants to)
PSQL_PRELUDES = {
    "alice": """SELECT switchboard.create_user('alice', :'argon2_hash', 'member') AS alice_id \\gset
""",
    "admin": """SELECT switchboard.create_user('admin', :'argon2_hash', 'admin') AS admin_id \\gset
""",
    "roles": "CREATE ROLE grafana;\nCREATE ROLE alice;\n",
}
ARGON2 = "$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA"

EPILOGUES = {
    "admin": """
with psycopg.connect(os.environ["DATABASE_URL"]) as _c:
    assert _c.execute("SELECT string_agg(c.data, '') FROM switchboard.stream_chunks c").fetchone()[0] == "Hello"
""",
    "publish": """
with psycopg.connect(dsn) as _c:
    assert _c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'order.saved'").fetchone()[0] == 1
    assert _c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'invoice.send'").fetchone()[0] == 1
""",
}


class Block:
    """A fenced block of a page and the marker line above it (None when there is none)."""

    def __init__(self, page: Path, line: int, lang: str, body: str, marker: str | None) -> None:
        self.page, self.line, self.lang, self.body, self.marker = page, line, lang, body, marker

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(DOCS)}:{self.line}"

    def test(self) -> tuple[str, dict[str, str]] | None:
        m = MARK.match(self.marker or "")
        return (m.group(1), dict(o.split("=", 1) for o in m.group(2).split())) if m else None


def page_blocks(page: Path) -> list[Block]:
    lines, out, i = page.read_text().splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            above = lines[i - 1] if i and lines[i - 1].startswith("<!--") else None
            out.append(Block(page, i + 1, lines[i][3:].strip(), "\n".join(lines[i + 1:end]) + "\n", above))
            i = end + 1
        else:
            i += 1
    return out


def site_blocks() -> list[Block]:
    return [b for page in sorted(DOCS.rglob("*.md")) if "reference" not in page.parts for b in page_blocks(page)]


def runnable(b: Block) -> bool:
    """A block a reader could paste and run: code, or a psql transcript."""
    if b.lang in ("python", "ts", "tsx", "sql"):
        return True
    return b.lang == "" and any(re.match(r"^SELECT switchboard\.", line) for line in b.body.splitlines())


def test_every_runnable_block_is_marked() -> None:
    unmarked = [b.where for b in site_blocks()
                if runnable(b) and b.test() is None and not FRAGMENT.match(b.marker or "")]
    assert unmarked == [], "mark each with <!-- test: ... --> or <!-- fragment: why -->"


def test_the_key_examples_are_marked() -> None:
    where = {(b.where.split(":")[0], t[0]) for b in site_blocks() if (t := b.test())}
    assert {("how-to/publish-from-python.md", "python"), ("how-to/write-a-handler.md", "python"),
            ("how-to/test-a-handler.md", "python"), ("tutorials/psql-walkthrough.md", "psql"),
            ("how-to/frontend.md", "ts")} <= where


def cases() -> list[tuple[str, str, dict[str, str], list[Block]]]:
    """One case per marked block, except a page's psql blocks of one session: one case for them all."""
    out: list[tuple[str, str, dict[str, str], list[Block]]] = []
    sessions: dict[tuple[Path, str], list[Block]] = {}
    for b in site_blocks():
        if (t := b.test()) is None:
            continue
        kind, opts = t
        if kind == "psql" and "session" in opts:
            key = (b.page, opts["session"])
            if key not in sessions:
                sessions[key] = []
                out.append((b.where, kind, opts, sessions[key]))
            sessions[key].append(b)
        else:
            out.append((b.where, kind, opts, [b]))
    return out


def psql_statements(transcript: str) -> str:
    """The input of a psql transcript: statements and meta-commands, not the output."""
    out, current = [], []
    for line in transcript.splitlines():
        if not current and not PSQL_STATEMENT.match(line):
            continue  # output
        current.append(line)
        code = line.split("--")[0].rstrip()
        if code.endswith(";") or "\\gset" in code or code.startswith("\\"):
            out.append("\n".join(current))
            current = []
    return "\n".join(out) + "\n"


def shown_errors(transcript: str) -> list[str]:
    return [line.split(":", 1)[1].strip() for line in transcript.splitlines() if line.startswith("ERROR:")]


def test_the_psql_check_compares_the_errors_shown() -> None:
    t = "SELECT 1;\n ?column?\nSELECT x;\nERROR:  column \"x\" does not exist\n"
    assert psql_statements(t) == "SELECT 1;\nSELECT x;\n"
    assert shown_errors(t) == ['column "x" does not exist']


def run_psql(db: str, blocks: list[Block], opts: dict[str, str], env: dict[str, str]) -> None:
    """rollback=yes: the whole session in one transaction rolled back (a page that creates roles,
    which are cluster-wide, leaves nothing behind)."""
    script = f"\\set argon2_hash '{ARGON2}'\n" + PSQL_PRELUDES.get(opts.get("prelude", ""), "")
    script += "".join(psql_statements(b.body) for b in blocks)
    if opts.get("rollback") == "yes":
        script = "BEGIN;\n" + script + "ROLLBACK;\n"
    psql = shutil.which("psql") or os.path.join(find_bindir(), "psql")
    out = subprocess.run([psql, "-X", "-v", "ON_ERROR_STOP=0", "-d", db, "-f", "-"],
                         input=script, capture_output=True, text=True, timeout=120, env=env)
    raised = [m.group(1).strip() for m in re.finditer(r"ERROR:  (.*)", out.stderr)]
    shown = [e for b in blocks for e in shown_errors(b.body)]
    assert out.returncode == 0 and raised == shown, f"{blocks[0].where}:\n{out.stdout}\n{out.stderr}"


def code_lines(text: str) -> list[str]:
    """Python lines without comments and indentation (a naive cut at '  #', enough for quotes)."""
    out = []
    for line in text.splitlines():
        code = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
        if code:
            out.append(code)
    return out


def excerpt_problems(block: str, source: str) -> list[str]:
    """The lines of block not found, in order, among the lines of source."""
    lines, i, missing = code_lines(source), 0, []
    for line in code_lines(block):
        if line in lines[i:]:
            i = lines.index(line, i) + 1
        else:
            missing.append(line)
    return missing


def test_the_excerpt_check_sees_a_changed_line() -> None:
    source = "def f(x):\n    y = x + 1   # one more\n    return y\n"
    assert excerpt_problems("y = x + 1\nreturn y   # the answer\n", source) == []
    assert excerpt_problems("return y\ny = x + 1\n", source) == ["y = x + 1"]
    assert excerpt_problems("y = x + 2\n", source) == ["y = x + 2"]


def run_ts(tmp_path: Path, block: Block, opts: dict[str, str]) -> None:
    js = ROOT / "clients" / "js"
    tsc = js / "node_modules" / "typescript" / "bin" / "tsc"
    if not tsc.exists():
        pytest.fail("clients/js/node_modules is missing: scripts/test.sh runs npm ci there", pytrace=False)
    name = "example.tsx" if block.lang == "tsx" else "example.ts"
    body = block.body if re.search(r"^(import|export) ", block.body, re.M) else block.body + "export {};\n"
    (tmp_path / name).write_text(body)
    files = [name]
    if "prelude" in opts:
        (tmp_path / "prelude.ts").write_text(PRELUDES[opts["prelude"]])
        files.append("prelude.ts")
    (tmp_path / "tsconfig.json").write_text(json.dumps({
        "compilerOptions": {
            "target": "ES2022", "module": "ESNext", "moduleResolution": "bundler", "lib": ["ES2022", "DOM"],
            "strict": True, "noEmit": True, "skipLibCheck": True, "jsx": "react-jsx",
            "typeRoots": [str(js / "node_modules" / "@types")], "types": [],
            "paths": {"@switchboard/client": [str(js / "src" / "index.ts")],
                      "react": [str(js / "node_modules" / "@types" / "react" / "index.d.ts")],
                      "react/jsx-runtime": [str(js / "node_modules" / "@types" / "react" / "jsx-runtime.d.ts")]},
        },
        "files": files,
    }))
    out = subprocess.run(["node", str(tsc), "-p", "tsconfig.json"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    assert out.returncode == 0, f"{block.where}:\n{out.stdout}\n{out.stderr}"


@pytest.mark.parametrize(("where", "kind", "opts", "blocks"), cases(), ids=[c[0] for c in cases()])
def test_a_marked_example_runs(db: str, tmp_path: Path, where: str, kind: str, opts: dict[str, str],
                               blocks: list[Block]) -> None:
    env = {**os.environ, "DATABASE_URL": db, "PYTHONPATH": str(ROOT / "server")}
    if kind == "psql":
        run_psql(db, blocks, opts, env)
        return
    if kind == "ts":
        run_ts(tmp_path, blocks[0], opts)
        return
    if kind == "excerpt":
        assert excerpt_problems(blocks[0].body, (ROOT / opts["of"]).read_text()) == [], f"{where} vs {opts['of']}"
        return
    prelude = opts.get("prelude")
    program = PRELUDES.get(prelude or "", "") + blocks[0].body + EPILOGUES.get(prelude or "", "")
    (tmp_path / "example.py").write_text(program)
    out = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                         timeout=300, env=env, cwd=tmp_path)
    assert out.returncode == 0, f"{where}:\n{out.stdout}\n{out.stderr}"


# -- switchboard docs ---------------------------------------------------------------------------
def test_switchboard_docs_says_what_to_install_without_mkdocs(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from switchboard.cli import docs, main

    real = importlib.util.find_spec
    monkeypatch.setattr(docs.importlib.util, "find_spec", lambda name, *a: None if name == "mkdocs" else real(name, *a))
    with pytest.raises(SystemExit) as exc:
        main(["docs"])
    assert exc.value.code == 2
    assert "mkdocs is not installed: pip install 'mkdocs>=1.6'" in capsys.readouterr().err


def test_switchboard_docs_serves_the_site(tmp_path: Path) -> None:
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "switchboard.cli", "docs", "--addr", f"127.0.0.1:{port}"],
                            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT / "server")},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, body = time.monotonic() + 120, ""
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/reference/cli/", timeout=5) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.5)
        assert "switchboard docs" in body, proc.stdout.read() if proc.poll() is not None else "no answer"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
