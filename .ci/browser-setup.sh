#!/usr/bin/env bash
# What the dashboard's browser test (tests/dashboard.rs) needs: Debian's Chromium and the
# test script's npm packages (playwright-core, which drives the system browser and never
# downloads one of its own). Safe to run again: Chromium is installed only when missing,
# and npm ci puts back exactly what package-lock.json says.
set -euo pipefail
cd "$(dirname "$0")/.."

CHROMIUM="${FULCRUM_CHROMIUM:-/usr/bin/chromium}"
if [ ! -x "$CHROMIUM" ]; then
    echo "browser-setup: installing Debian's chromium"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq chromium >/dev/null
fi
# (Debian's launcher script may print a harmless shell warning on stderr.)
"$CHROMIUM" --version 2>/dev/null

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "browser-setup: Node.js (>= 20) and npm are needed" >&2
    exit 1
fi
echo "browser-setup: node $(node --version), npm $(npm --version)"

cd tests/browser
npm ci --no-audit --no-fund
