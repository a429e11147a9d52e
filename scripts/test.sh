#!/usr/bin/env bash
# The one test command (README "Quickstart"; .ci/run calls exactly this).
# Installs what a fresh machine lacks, then runs the whole suite against a real
# PostgreSQL that the suite starts itself. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
# sudo only when it works without a password prompt, or when a person can answer one.
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1 && { sudo -n true 2>/dev/null || [ -t 0 ]; }; then SUDO="sudo"; fi
apt_updated=0
cannot_install=()
apt_install() {
  # Neither root nor sudo: remember what is missing and say so once, below,
  # instead of failing inside apt-get ("Permission denied" on the lock file).
  if [ "$(id -u)" != 0 ] && [ -z "$SUDO" ]; then
    for pkg in "$@"; do case "$pkg" in -*) ;; *) cannot_install+=("$pkg") ;; esac; done
    return 0
  fi
  if [ "$apt_updated" = 0 ]; then $SUDO apt-get update -qq; apt_updated=1; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@"
}
# A command, also where a non-root PATH lacks the sbin directories.
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }

# PostgreSQL server binaries (15+), pgbench/psql for the benchmarks.
if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 && ! command -v postgres >/dev/null 2>&1; then
  apt_install postgresql postgresql-contrib
fi
# Running as root (CI): Postgres itself must run as an unprivileged OS user.
if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
  useradd --system --no-create-home --shell /usr/sbin/nologin postgres
fi
command -v git >/dev/null 2>&1 || apt_install git
# tests/faults: network namespaces, veth pairs and partitions (ip, iptables).
# (/usr/sbin is not on an ordinary user's PATH, so look there too.)
have_sbin() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/sbin/$1" ]; }
have_sbin ip || apt_install iproute2
have_sbin iptables || apt_install iptables
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
# (postgresql-15-pgtap for the PostgreSQL 15 that Debian 12 ships)
[ -f "/usr/share/postgresql/$pg_major/extension/pgtap.control" ] || dba_pkgs+=("postgresql-$pg_major-pgtap")
command -v pg_prove >/dev/null 2>&1 || dba_pkgs+=(libtap-parser-sourcehandler-pgtap-perl)
if [ "${#dba_pkgs[@]}" -gt 0 ]; then apt_install "${dba_pkgs[@]}"; fi

# The image tests (tests/image): a debootstrapped base, the Dockerfile built
# with buildah and run with podman + runc in a slirp4netns network; promtool
# (Debian package prometheus) checks and unit-tests the alert rules.
image_pkgs=()
for tool in debootstrap buildah podman runc slirp4netns; do have "$tool" || image_pkgs+=("$tool"); done
have promtool || image_pkgs+=(prometheus)
if [ "${#image_pkgs[@]}" -gt 0 ]; then apt_install --no-install-recommends "${image_pkgs[@]}"; fi

if [ "${#cannot_install[@]}" -gt 0 ]; then
  {
    echo "scripts/test.sh: this machine lacks Debian packages the suite needs, and"
    echo "$(id -un) can neither install them (not root) nor use sudo. Ask an administrator for:"
    echo
    echo "    apt-get install ${cannot_install[*]}"
    echo
    echo "then run scripts/test.sh again (or run it as root, as CI does)."
  } >&2
  exit 2
fi
if [ "$(id -u)" != 0 ]; then
  echo "scripts/test.sh: note: tests/image builds and runs containers as root (buildah, podman);" \
       "as $(id -un) they fail with that reason. Deselect them with: scripts/test.sh -m 'not image'" >&2
fi

# Python packages (the project and its test extras). A Debian python3 outside a
# virtualenv refuses pip installs (PEP 668, externally-managed-environment).
if [ "$(id -u)" != 0 ] && python3 -c 'import sys, sysconfig, os; sys.exit(not (sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))'; then
  {
    echo "scripts/test.sh: python3 is Debian's system Python, which refuses pip installs (PEP 668)."
    echo "Create and activate a virtualenv first, then run this script again:"
    echo
    echo "    python3 -m venv .venv && . .venv/bin/activate"
  } >&2
  exit 2
fi
# The project with its dev extra (testing.postgresql: the suite's throwaway
# PostgreSQL and `switchboard dev`) and its test extra.
python3 -m pip install -q --disable-pip-version-check -e '.[dev,test]'

# The checks contributors rely on, before any test runs (seconds, not minutes):
# ruff with the configured rules, and mypy (strict on server/switchboard; the
# configuration and its few per-module exceptions are in pyproject.toml).
echo "scripts/test.sh: ruff check server tests bench scripts" >&2
python3 -m ruff check --quiet server tests bench scripts || { echo "ruff found problems (above): fix them first" >&2; exit 1; }
echo "scripts/test.sh: mypy (pyproject.toml [tool.mypy])" >&2
python3 -m mypy || { echo "mypy found problems (above): fix them first" >&2; exit 1; }
# The documentation site (mkdocs.yml, docs/): built with --strict into a temporary
# directory, so a broken link or a page missing from the nav fails here in seconds
# (tests/test_docs_site.py also checks that the generated reference pages are current).
echo "scripts/test.sh: mkdocs build --strict" >&2
docs_site=$(mktemp -d /tmp/switchboard-site.XXXXXX)
NO_MKDOCS_2_WARNING=1 python3 -m mkdocs build --strict --site-dir "$docs_site" \
  || { rm -rf "$docs_site"; echo "mkdocs build --strict failed (above): fix the docs first" >&2; exit 1; }
rm -rf "$docs_site"

# Debian's Chromium for the browser test (never a downloaded browser).
if [ -f tests/browser/install.sh ]; then bash tests/browser/install.sh; fi

# Node >= 20 for the JS client (clients/js: tests/test_js_client.py builds it and runs its
# node --test suites against real replicas). Installed from the lockfile, never resolved anew.
if ! command -v node >/dev/null 2>&1; then apt_install nodejs npm; fi
if command -v node >/dev/null 2>&1; then
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$node_major" -lt 20 ]; then
    echo "scripts/test.sh: clients/js needs Node >= 20 (found $(node --version)); tests/test_js_client.py will fail" >&2
  fi
  (cd clients/js && npm ci --no-audit --no-fund --loglevel=error)
fi

# pytest exit code 5 (no tests collected) means the selection matched nothing:
# reported, and not counted as a failure of the code.
pytest_rc() {
  if [ "$1" = 5 ]; then
    echo "pytest collected no tests (exit 5): treated as a failure of the selection, not of the code" >&2
    echo 0
  else
    echo "$1"
  fi
}

set +e
if [ "$#" -gt 0 ]; then
  # A selection given by the caller: one pytest, exactly as asked.
  python3 -m pytest "$@"
  rc=$(pytest_rc $?)
else
  # The whole suite in three lanes at once, so it stays well under 15 minutes on
  # 2 cores: the suite mostly waits (on servers starting, sockets closing, leases
  # expiring, images building) and uses about one core on average, so a third
  # lane costs little and shortens the wall time.
  # - lane 2: the suites that wait on real outside machinery (image builds with
  #   debootstrap/buildah/podman, a Patroni cluster failing over, network
  #   namespaces with injected faults), and, since it finished minutes before the
  #   others, the session-hardening, private-live-path and hostile-input suites
  #   (they wait out grace windows and floods), the SSE streams and the read
  #   replica (a streaming standby of its own);
  # - lane 3: the longest multi-replica and tool suites (sessions on two
  #   replicas, the JS client's node suites, sqitch, the browser, the event-bus
  #   proof and the live path's relay tests, the wheel install, the HA trio), listed here by name;
  # - lane 1: everything else, so a new test file lands there by default.
  # Each lane starts its own PostgreSQL, ports are always free ones, and names
  # carry the pid, so the lanes share nothing. Lanes 2 and 3 print after lane 1.
  lane2=(tests/image tests/pgha tests/faults tests/test_sessions_hardening.py tests/test_live_private.py
         tests/test_hostile_input.py tests/test_sse.py tests/test_read_replica.py)
  lane3=(tests/test_sessions.py tests/test_js_client.py tests/test_sqitch.py tests/browser
         tests/test_trust_boundary.py tests/test_event_bus_proof.py tests/test_live_relay.py
         tests/test_wheel_install.py tests/test_server_limits.py tests/test_relay_hear.py
         tests/ha/test_ha_trio.py tests/test_relay_isolation.py)
  lane2_log=$(mktemp /tmp/switchboard-lane2.XXXXXX)
  lane3_log=$(mktemp /tmp/switchboard-lane3.XXXXXX)
  python3 -m pytest -p no:cacheprovider --durations=8 "${lane2[@]}" >"$lane2_log" 2>&1 &
  lane2_pid=$!
  python3 -m pytest -p no:cacheprovider --durations=8 "${lane3[@]}" >"$lane3_log" 2>&1 &
  lane3_pid=$!
  ignore=()
  for d in "${lane2[@]}" "${lane3[@]}"; do ignore+=("--ignore=$d"); done
  python3 -m pytest --durations=8 "${ignore[@]}"
  rc1=$(pytest_rc $?)
  wait "$lane2_pid"
  rc2=$(pytest_rc $?)
  wait "$lane3_pid"
  rc3=$(pytest_rc $?)
  echo
  echo "======================= lane 2: ${lane2[*]} ======================="
  cat "$lane2_log"
  echo
  echo "======================= lane 3: ${lane3[*]} ======================="
  cat "$lane3_log"
  rm -f "$lane2_log" "$lane3_log"
  rc=$(( rc1 != 0 ? rc1 : (rc2 != 0 ? rc2 : rc3) ))
fi
set -e
exit "$rc"
