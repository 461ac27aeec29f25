#!/usr/bin/env bash
# Builds the Debian package (docs/install.md): the release binary, the man page and the
# completions it makes of itself, then cargo-deb. Prints the package's path.
#
#   packaging/build-deb.sh        # needs cargo-deb: cargo install cargo-deb --locked
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --locked --release
bin=target/release/fulcrum
mkdir -p target/assets
"$bin" manpage | gzip -9n >target/assets/fulcrum.8.gz
"$bin" completions bash >target/assets/fulcrum.bash
"$bin" completions zsh >target/assets/_fulcrum
"$bin" completions fish >target/assets/fulcrum.fish
cargo deb --no-build --strip | tail -1
