#!/usr/bin/env bash
# The one test command (README "Quickstart"; .ci/run calls exactly this).
# Installs what a fresh machine lacks, then runs the whole suite against a real
# PostgreSQL that the suite starts itself. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}

# PostgreSQL server binaries (15+), pgbench/psql for the benchmarks.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v postgres >/dev/null 2>&1; then
  apt_install postgresql postgresql-contrib
fi
# Running as root (CI): Postgres itself must run as an unprivileged OS user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
command -v git >/dev/null 2>&1 || apt_install git
# tests/pgha: a real Patroni cluster (etcd + Patroni) and a real PgBouncer.
missing=()
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
{ command -v pgbouncer || [ -x /usr/sbin/pgbouncer ]; } >/dev/null 2>&1 || missing+=(pgbouncer)
if [ "${#missing[@]}" -gt 0 ]; then apt_install "${missing[@]}"; fi

# sqitch (+ its PostgreSQL driver) and pgTAP (+ pg_prove) for the DBA tooling
# tests (tests/test_sqitch.py, tests/test_pgtap.py). pgTAP must match the
# server's major version: its extension files go into that version's share dir.
pg_major=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
pg_major=${pg_major:-15}
dba_pkgs=()
command -v sqitch >/dev/null 2>&1 || dba_pkgs+=(sqitch)
perl -MDBD::Pg -e1 >/dev/null 2>&1 || dba_pkgs+=(libdbd-pg-perl)
[ -f "/usr/share/postgresql/$pg_major/extension/pgtap.control" ] || dba_pkgs+=("postgresql-$pg_major-pgtap")
command -v pg_prove >/dev/null 2>&1 || dba_pkgs+=(libtap-parser-sourcehandler-pgtap-perl)
if [ "${#dba_pkgs[@]}" -gt 0 ]; then apt_install "${dba_pkgs[@]}"; fi

# Python packages (the project and its test extras).
python3 -m pip install -q --disable-pip-version-check -e '.[test]'

# Debian's Chromium for the browser test (never a downloaded browser).
if [ -f tests/browser/install.sh ]; then bash tests/browser/install.sh; fi

set +e
python3 -m pytest "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests (exit 5): treated as a failure of the selection, not of the code" >&2
  exit 0
fi
exit "$rc"
