"""What the sqitch / pgTAP / release tests compare: normalized pg_dump, catalog
snapshots, left-over function overloads, and the real sqitch and pg_prove CLIs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

ROOT = Path(__file__).resolve().parents[1]
DB = ROOT / "db"
sys.path.insert(0, str(ROOT / "scripts"))

import sqitch_gen  # noqa: E402

ROLES = sqitch_gen.ROLES                    # the one list of role names
SCHEMA = sqitch_gen.SCHEMA
BOOKKEEPING = sqitch_gen.PGMIGRATE_BOOKKEEPING  # pgmigrate's, inside the schema


def sqitch(*args: str, url: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the stock sqitch CLI from db/ against url (a postgresql:// URL)."""
    return subprocess.run(["sqitch", *args, "db:" + url], cwd=DB, capture_output=True, text=True,
                          timeout=timeout)


def sqitch_popen(*args: str, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["sqitch", *args, "db:" + url], cwd=DB, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _conn_args(url: str) -> list[str]:
    u = urlsplit(url)
    return ["-h", u.hostname or "127.0.0.1", "-p", str(u.port or 5432), "-U", u.username or "postgres",
            "-d", u.path.lstrip("/")]


def pg_prove(url: str, *paths: str, verbose: bool = True) -> subprocess.CompletedProcess[str]:
    args = ["pg_prove", "--ext", ".sql", *(["--verbose"] if verbose else []), *_conn_args(url),
            *(paths or ["db/tests/"])]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


def psql_file(url: str, path: Path) -> None:
    p = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(path), url],
                       cwd=path.parent, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def normalized_dump(url: str) -> list[str]:
    """`pg_dump --schema-only --schema=switchboard` as a list of TOC entries, without
    pgmigrate's bookkeeping and pg_dump's random \\restrict key."""
    u = urlsplit(url)
    out = subprocess.run(["pg_dump", "--schema-only", f"--schema={SCHEMA}", *_conn_args(url)[:-2],
                          u.path.lstrip("/")], capture_output=True, text=True, timeout=120, check=True).stdout
    out = "\n".join(line for line in out.splitlines() if not line.startswith(("\\restrict", "\\unrestrict")))
    out = out.split("\n--\n-- PostgreSQL database dump complete")[0]
    entries = re.split(r"\n--\n-- (?=Name: )", out)
    keep = [e.strip() for e in entries[1:]
            if not any(re.search(rf"\b{b}\b", e.split("\n", 1)[0]) for b in BOOKKEEPING)]
    assert len(keep) > 50, "pg_dump returned suspiciously little"
    return keep


def catalog(url: str) -> dict[str, list[tuple]]:
    """Functions (body md5, owner, ACL, settings, comment), relations (ACL, owner,
    persistence), column ACLs, the schema ACL and the roles' memberships."""
    excl = list(BOOKKEEPING)
    with psycopg.connect(url) as c:
        return {
            "functions": c.execute(
                """SELECT p.oid::regprocedure::text, md5(p.prosrc), pg_get_function_result(p.oid),
                          p.prosecdef, p.provolatile, p.proconfig, pg_get_userbyid(p.proowner),
                          p.proacl::text, obj_description(p.oid, 'pg_proc')
                     FROM pg_proc p WHERE p.pronamespace = %s::regnamespace ORDER BY 1""",
                (SCHEMA,)).fetchall(),
            "relations": c.execute(
                """SELECT c.relname, c.relkind, c.relpersistence, pg_get_userbyid(c.relowner),
                          c.relacl::text, obj_description(c.oid, 'pg_class')
                     FROM pg_class c WHERE c.relnamespace = %s::regnamespace
                      AND c.relname <> ALL(%s) AND c.relname NOT LIKE 'schema_version%%'
                    ORDER BY 1""", (SCHEMA, excl)).fetchall(),
            "columns": c.execute(
                """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                          pg_get_expr(d.adbin, d.adrelid), a.attacl::text
                     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                    WHERE c.relnamespace = %s::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
                      AND c.relname <> ALL(%s) AND c.relname NOT LIKE 'schema_version%%'
                    ORDER BY 1, 2""", (SCHEMA, excl)).fetchall(),
            "schema": c.execute(
                "SELECT nspname, pg_get_userbyid(nspowner), nspacl::text FROM pg_namespace WHERE nspname = %s",
                (SCHEMA,)).fetchall(),
            "types": c.execute(
                """SELECT t.typname, t.typtype FROM pg_type t WHERE t.typnamespace = %s::regnamespace
                      AND t.typname NOT LIKE '%%schema_version%%' ORDER BY 1""", (SCHEMA,)).fetchall(),
            "memberships": c.execute(
                """SELECT r.rolname, m.rolname FROM pg_auth_members a JOIN pg_roles r ON r.oid = a.roleid
                     JOIN pg_roles m ON m.oid = a.member WHERE r.rolname = ANY(%s) ORDER BY 1, 2""",
                (list(ROLES),)).fetchall(),
        }


def orphan_overloads(url: str) -> list[str]:
    """Functions in the schema that no db/functions file (re)defines.

    Runs every function file inside one transaction and lists the functions whose
    pg_proc row that transaction did not write (xmin), then rolls back. A
    signature changed without `DROP FUNCTION` of the old one in its migration
    shows up here, with its old grants."""
    with psycopg.connect(url) as c:
        for p in sqitch_gen.function_files():
            c.execute(p.read_text())
        rows = c.execute(
            """SELECT p.oid::regprocedure::text FROM pg_proc p
                WHERE p.pronamespace = %s::regnamespace
                  AND p.xmin::text::bigint <> txid_current() %% 4294967296 ORDER BY 1""",
            (SCHEMA,)).fetchall()
        c.rollback()
    return [r[0] for r in rows]
