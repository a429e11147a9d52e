"""Function versioning that cannot be forgotten, and the sqitch project's drift.

- db/functions/ must hash to what db/functions.lock records for the newest
  migration version (scripts/stamp_functions.py), else the edit would never
  reach an installed database (pgmigrate's afterAll runs only with a new version);
- db/sqitch.plan and db/deploy|revert|verify must be what scripts/sqitch_gen.py
  generates from db/migrations + db/functions;
- no function overload may remain in the schema that no db/functions file defines.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import psycopg

from dbtools import ROOT, orphan_overloads, sqitch_gen

sys.path.insert(0, str(ROOT / "scripts"))
import stamp_functions  # noqa: E402


def test_db_functions_are_stamped_for_the_newest_version() -> None:
    problems = stamp_functions.check()
    assert problems == [], "\n".join(problems)


def test_sqitch_project_is_generated_from_the_sources() -> None:
    problems = sqitch_gen.problems()
    assert problems == [], "\n".join(problems) + "\nrun `python scripts/sqitch_gen.py`"


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=tmp, capture_output=True, text=True, timeout=60)


def test_release_procedure_in_a_copy_of_the_repo(tmp_path: Path) -> None:
    """The five-line release procedure of the README, on a copy of db/ and scripts/,
    including each mistake it must catch."""
    shutil.copytree(ROOT / "db", tmp_path / "db", symlinks=True)
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    stamp, gen = "scripts/stamp_functions.py", "scripts/sqitch_gen.py"
    newest = max(int(p.name[1:5]) for p in (tmp_path / "db/migrations").glob("V*.sql"))
    assert _run(tmp_path, stamp, "--check").returncode == 0
    assert _run(tmp_path, gen, "--check").returncode == 0
    # Right after a release the newest version is frozen: the procedure starts, as a
    # developer's would, with a new (unreleased) version.
    lock = (tmp_path / "db/functions.lock").read_text().split()
    if lock[-1].startswith("v"):
        newest += 1
        (tmp_path / f"db/migrations/V{newest:04d}__work.sql").write_text("-- the next release's work\n")
        assert _run(tmp_path, stamp).returncode == 0
    nxt = f"V{newest + 1:04d}"

    # 1. a function edit without a new version is caught
    f = tmp_path / "db/functions/30_tickets.sql"
    f.write_text(f.read_text() + "\n-- an edit\n")
    r = _run(tmp_path, stamp, "--check")
    assert r.returncode == 1 and f"db/migrations/{nxt}__" in r.stderr, r.stderr
    # ... an unreleased version may be re-stamped; releasing it freezes its functions
    assert _run(tmp_path, stamp, "--release", "v9.0.0").returncode == 0
    assert (tmp_path / "db/deploy/functions@v9.0.0.sql").exists()
    assert _run(tmp_path, stamp, "--check").returncode == 0
    # 2. a released version is immutable
    f.write_text(f.read_text() + "\n-- another edit\n")
    r = _run(tmp_path, stamp)
    assert r.returncode == 1 and "released versions are immutable" in r.stderr, r.stderr
    # 3. the fix: a new version, stamped
    (tmp_path / f"db/migrations/{nxt}__next.sql").write_text("-- ships the function edit\n")
    assert _run(tmp_path, stamp).returncode == 0
    assert _run(tmp_path, stamp, "--check").returncode == 0
    # 4. the sqitch project is stale until regenerated
    r = _run(tmp_path, gen, "--check")
    assert r.returncode == 1 and "db/sqitch.plan" in r.stderr and "sqitch_gen.py" in r.stderr
    assert _run(tmp_path, gen).returncode == 0
    assert _run(tmp_path, gen, "--check").returncode == 0
    plan = (tmp_path / "db/sqitch.plan").read_text()
    assert "@v9.0.0 " in plan and f"functions [functions@v9.0.0 {nxt}__next]" in plan
    # the stock sqitch parses the generated plan (tags, the reworked change)
    r = subprocess.run(["sqitch", "plan", "--format", "oneline", "--no-headers"], cwd=tmp_path / "db",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"{nxt}__next" in r.stdout and r.stdout.count("functions") >= 3
    # 5. a new function file changes the generated deploy script: drift is caught
    (tmp_path / "db/functions/99_new.sql").write_text("-- new\n")
    r = _run(tmp_path, gen, "--check")
    assert r.returncode == 1 and "stale db/deploy/functions.sql" in r.stderr


def test_no_function_overload_outside_db_functions(db: str) -> None:
    assert orphan_overloads(db) == []
    # what a signature change without DROP FUNCTION in its migration leaves behind
    with psycopg.connect(db) as c:
        c.execute("CREATE FUNCTION switchboard.create_task(name text) RETURNS void LANGUAGE sql AS ''")
    assert orphan_overloads(db) == ["switchboard.create_task(text)"]


def test_release_metadata_agree() -> None:
    """One version, written once (switchboard.__version__, which the wheel, `switchboard
    --version` and the OpenAPI document read), and the places a release must also touch:
    the chart's appVersion (the image tag it deploys) and a CHANGELOG section."""
    import re

    import yaml

    sys.path.insert(0, str(ROOT / "server"))
    from switchboard import __version__

    chart = yaml.safe_load((ROOT / "chart" / "Chart.yaml").read_text())
    assert str(chart["appVersion"]) == __version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert re.search(rf"^## \[{re.escape(__version__)}\] - ", changelog, re.MULTILINE), __version__
    # every release tag of db/functions.lock has its CHANGELOG section
    for _, tag in sqitch_gen.releases(sqitch_gen.read_lock()):
        assert re.search(rf"^## \[{re.escape(tag.lstrip('v'))}\]", changelog, re.MULTILINE), tag
