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
                                           skipped), run by psql with ON_ERROR_STOP
"""

from __future__ import annotations

import importlib.util
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


def _anchors(path: Path) -> set[str]:
    return {slugify(re.sub(r"[`*]", "", m.group(2)).strip())
            for line in _outside_fences(path.read_text()) if (m := re.match(r"^(#{1,6}) (.+?)\s*#*$", line))}


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
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                problems.append(f"{page.relative_to(root)}: {target} (no such heading)")
    return problems


def test_every_relative_link_in_the_site_and_the_readmes_resolves() -> None:
    pages = sorted(DOCS.rglob("*.md")) + [ROOT / "clients" / "js" / "README.md", ROOT / "README.md",
                                          ROOT / "tests" / "README.md"]
    assert len(pages) > 30
    problems = [p for page in pages for p in _link_problems(page)]
    assert problems == []


def test_the_link_check_sees_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n\n## Here\n\n[ok](a.md#here) [bad](b.md) [anchor](a.md#there)\n")
    found = [p.split(": ", 1)[1] for p in _link_problems(tmp_path / "a.md", tmp_path)]
    assert found == ["b.md (no such file)", "a.md#there (no such heading)"]


# -- examples that run -------------------------------------------------------------------------
MARK = re.compile(r"^<!-- test: (python|psql)((?: \w+=\S+)*) -->\n```(\w*)\n(.*?)^```", re.M | re.S)

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
}
EPILOGUES = {
    "publish": """
with psycopg.connect(dsn) as _c:
    assert _c.execute("SELECT count(*) FROM switchboard.events WHERE event = 'order.saved'").fetchone()[0] == 1
    assert _c.execute("SELECT count(*) FROM switchboard.task_runs WHERE handler = 'invoice.send'").fetchone()[0] == 1
""",
}


def marked_blocks() -> list[tuple[str, str, dict[str, str], str]]:
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        for m in MARK.finditer(page.read_text()):
            opts = dict(o.split("=", 1) for o in m.group(2).split())
            line = page.read_text()[: m.start()].count("\n") + 1
            out.append((f"{page.relative_to(DOCS)}:{line}", m.group(1), opts, m.group(4)))
    return out


def test_the_key_examples_are_marked() -> None:
    where = {(w.split(":")[0], kind) for w, kind, _, _ in marked_blocks()}
    assert {("how-to/publish-from-python.md", "python"), ("how-to/write-a-handler.md", "python"),
            ("how-to/test-a-handler.md", "python"), ("tutorials/psql-walkthrough.md", "psql")} <= where


def psql_statements(transcript: str) -> str:
    """The input of a psql transcript: statements and meta-commands, not the output."""
    out, current = [], []
    for line in transcript.splitlines():
        if not current and not re.match(r"^(SELECT|INSERT|UPDATE|DELETE|CALL|WITH|BEGIN|COMMIT|ROLLBACK|\\)",
                                        line):
            continue  # output
        current.append(line)
        code = line.split("--")[0].rstrip()
        if code.endswith(";") or "\\gset" in code or code.startswith("\\"):
            out.append("\n".join(current))
            current = []
    return "\n".join(out) + "\n"


@pytest.mark.parametrize(("where", "kind", "opts", "block"), marked_blocks(), ids=[b[0] for b in marked_blocks()])
def test_a_marked_example_runs(db: str, tmp_path: Path, where: str, kind: str, opts: dict[str, str],
                               block: str) -> None:
    env = {**os.environ, "DATABASE_URL": db, "PYTHONPATH": str(ROOT / "server")}
    if kind == "python":
        prelude = opts.get("prelude")
        program = PRELUDES.get(prelude or "", "") + block + EPILOGUES.get(prelude or "", "")
        (tmp_path / "example.py").write_text(program)
        out = subprocess.run([sys.executable, str(tmp_path / "example.py")], capture_output=True, text=True,
                             timeout=300, env=env, cwd=tmp_path)
    else:
        psql = shutil.which("psql") or os.path.join(find_bindir(), "psql")
        out = subprocess.run([psql, "-X", "-v", "ON_ERROR_STOP=1", "-d", db, "-f", "-"],
                             input=psql_statements(block), capture_output=True, text=True, timeout=120, env=env)
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
