#!/usr/bin/env python3
"""Record which db/functions/ each migration version ships (db/functions.lock).

    python scripts/stamp_functions.py                  # stamp the newest version
    python scripts/stamp_functions.py --release v0.2.0 # ... and cut a release (sqitch tag)
    python scripts/stamp_functions.py --check          # exit 1 if db/functions/ is unstamped

Why: pgmigrate re-applies db/functions/ only when a new version applies
(afterAll). An edit to a function file without a new migration version never
reaches an installed database. The lock holds, per version, the sha256 of
db/functions/*.sql it was stamped with; tests/test_release.py fails when the
files differ from the newest version's hash. A released version (one with a
tag) is immutable: re-stamping it is refused, the fix is a new version.

--release also freezes db/{deploy,verify,revert}/functions@<tag>.sql, the
function set of that release, which sqitch needs once a later release reworks
the `functions` change (see scripts/sqitch_gen.py). Run sqitch_gen.py after.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sqitch_gen as gen  # noqa: E402

HEAD = ("# db/functions.lock: written by scripts/stamp_functions.py, do not edit by hand.\n"
        "# <migration version> <sha256 of db/functions/*.sql> [<release tag>]\n")


def write_lock(lock: dict[int, tuple[str, str | None]]) -> None:
    lines = [f"V{v:04d} {h}" + (f" {t}" if t else "") for v, (h, t) in sorted(lock.items())]
    gen.LOCK_FILE.write_text(HEAD + "\n".join(lines) + "\n")


def files_at(rev: str | None) -> dict[str, bytes]:
    if rev is None:
        return {p.name: p.read_bytes() for p in gen.function_files()}
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{rev}:db/functions"], cwd=gen.ROOT,
                           check=True, capture_output=True, text=True).stdout.split()
    return {n: subprocess.run(["git", "show", f"{rev}:db/functions/{n}"], cwd=gen.ROOT, check=True,
                              capture_output=True).stdout for n in names if n.endswith(".sql")}


def check() -> list[str]:
    migs = gen.migrations()
    newest = migs[-1][0]
    lock = gen.read_lock()
    fix = (f"add a migration version db/migrations/V{newest + 1:04d}__<name>.sql (a comment is "
           "enough) and run `python scripts/stamp_functions.py`, then `python scripts/sqitch_gen.py`")
    if newest not in lock:
        return [f"V{newest:04d} is not stamped in db/functions.lock: run "
                "`python scripts/stamp_functions.py`"]
    h, tag = lock[newest]
    if h != gen.functions_hash():
        if tag:
            return [f"db/functions/ differs from what V{newest:04d} was released with ({tag}): {fix}"]
        return [f"db/functions/ differs from the hash stamped for V{newest:04d}: {fix} "
                f"(V{newest:04d} is unreleased: re-stamping it is also allowed)"]
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--release", metavar="TAG", help="mark the version released with this sqitch tag")
    ap.add_argument("--version", type=int, help="stamp this version instead of the newest")
    ap.add_argument("--from-git", metavar="REV", help="hash db/functions as of this git revision")
    args = ap.parse_args(argv)
    if args.check:
        probs = check()
        for p in probs:
            print(p, file=sys.stderr)
        return 1 if probs else 0

    versions = [v for v, _ in gen.migrations()]
    version = args.version or versions[-1]
    if version not in versions:
        print(f"no migration file for V{version:04d}", file=sys.stderr)
        return 1
    files = files_at(args.from_git)
    digest = gen.functions_hash(files)
    lock = gen.read_lock()
    old_hash, old_tag = lock.get(version, (None, None))
    if old_tag and old_hash != digest:
        print(f"V{version:04d} was released as {old_tag} with other function files; released "
              f"versions are immutable. Add db/migrations/V{versions[-1] + 1:04d}__<name>.sql "
              "and stamp that.", file=sys.stderr)
        return 1
    tag = args.release or old_tag
    if args.release:
        if not gen.re.fullmatch(r"v\d+\.\d+\.\d+", args.release):
            print("a release tag looks like v1.2.3", file=sys.stderr)
            return 1
        other = [v for v, (_, t) in lock.items() if t == args.release and v != version]
        if other:
            print(f"{args.release} already tags V{other[0]:04d}", file=sys.stderr)
            return 1
        for rel, text in gen.frozen_functions({n: b.decode() for n, b in files.items()},
                                              args.release).items():
            p = gen.DB / rel
            if rel.startswith("deploy/") and p.exists() and p.read_text() != text:
                print(f"db/{rel} exists with other content: a released deploy script is never "
                      "rewritten (databases recorded its hash)", file=sys.stderr)
                return 1
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
            print(f"froze db/{rel}")
    lock[version] = (digest, tag)
    write_lock(lock)
    print(f"V{version:04d} {digest}" + (f" {tag}" if tag else ""))
    print("now run: python scripts/sqitch_gen.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
