#!/usr/bin/env bash
# The Debian package (docs/install.md): built with cargo-deb, installed with dpkg on this
# machine, its unit checked by systemd-analyze, and the installed fulcrum's `check` run on
# the installed configuration. Needs root (dpkg).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --quiet
if ! command -v systemd-analyze >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq systemd >/dev/null
fi
deb=$(bash packaging/build-deb.sh)
echo "package: $deb"
dpkg -i "$deb" >/dev/null
/usr/bin/fulcrum check --config /etc/fulcrum/fulcrum.toml
systemd-analyze verify /usr/lib/systemd/system/fulcrum.service
man -w fulcrum >/dev/null
test -s /usr/share/bash-completion/completions/fulcrum
id fulcrum >/dev/null
echo "package: installed, its unit verified, its configuration checked"
