#!/bin/sh
# Installs what tests/browser needs, idempotently (a no-op when both are present):
#   - Debian's chromium at /usr/bin/chromium (apt; as root, or through sudo)
#   - the `playwright` Python package, used only as a driver for that chromium.
# Playwright's own browser download is never used: no `playwright install`.
#
# Usage: sh tests/browser/install.sh        (PYTHON=/path/to/python to choose the interpreter)
set -eu

PYTHON="${PYTHON:-python3}"
CHROMIUM=/usr/bin/chromium
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1

if [ -x "$CHROMIUM" ]; then
    echo "install.sh: $CHROMIUM present"
else
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "install.sh: $CHROMIUM is missing and this is not root (no sudo): install Debian's chromium" >&2
        exit 1
    fi
    echo "install.sh: installing Debian's chromium"
    $SUDO apt-get update
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium
    [ -x "$CHROMIUM" ] || { echo "install.sh: apt-get did not install $CHROMIUM" >&2; exit 1; }
fi

if "$PYTHON" -c "import playwright.sync_api" >/dev/null 2>&1; then
    echo "install.sh: playwright present ($("$PYTHON" -m pip show playwright 2>/dev/null | sed -n 's/^Version: //p'))"
else
    echo "install.sh: installing the playwright package (driver only)"
    "$PYTHON" -m pip install --quiet "playwright>=1.40"
fi

# Fail here, not in the test, if the pair cannot start a page.
"$PYTHON" - "$CHROMIUM" <<'PY'
import sys
from playwright.sync_api import sync_playwright
args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
with sync_playwright() as p:
    b = p.chromium.launch(executable_path=sys.argv[1], args=args, timeout=60_000)
    print("install.sh: chromium", b.version, "launches under playwright")
    b.close()
PY
