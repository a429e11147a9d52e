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
