#!/usr/bin/env bash
# Builds the Debian package (docs/install.md) with cargo-deb, the binary stripped; prints
# the package's path. `cargo deb` alone works too (unstripped: the release profile keeps
# line tables).
#
#   packaging/build-deb.sh        # needs cargo-deb: cargo install cargo-deb --locked
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --release
cargo deb --no-build --strip | tail -1
