#!/usr/bin/env bash
# The Debian package (docs/install.md): built with cargo-deb, installed with dpkg on this
# machine, its unit checked by systemd-analyze, and the installed fulcrum's `check` run on
# the installed configuration; then purged and installed again (the maintainer scripts
# run twice). Needs root (dpkg).
set -euo pipefail
cd "$(dirname "$0")/.."
apt_install() {
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
}
command -v cargo-deb >/dev/null || cargo install cargo-deb --locked --quiet
# systemd-analyze, and the package's own dependencies (dpkg -i installs none).
command -v systemd-analyze >/dev/null || apt_install systemd
[ -x /bin/kill ] || apt_install procps
deb=$(bash packaging/build-deb.sh)
echo "package: $deb"
for round in install reinstall; do
  dpkg -i "$deb" >/dev/null
  /usr/bin/fulcrum check --config /etc/fulcrum/fulcrum.toml
  systemd-analyze verify /usr/lib/systemd/system/fulcrum.service
  man -w fulcrum >/dev/null
  test -s /usr/share/bash-completion/completions/fulcrum
  id fulcrum >/dev/null
  test -d /var/log/fulcrum
  echo "package: $round: installed, its unit verified, its configuration checked"
  if [ "$round" = install ]; then dpkg --purge fulcrum >/dev/null; fi
done
