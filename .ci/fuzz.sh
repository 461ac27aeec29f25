#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 60) on the stable toolchain, without a
# sanitizer, starting from its committed corpus (fuzz/corpus/TARGET, read only) and the
# inputs that once failed (fuzz/regressions/TARGET). New inputs go to a scratch corpus.
# A crash fails the run and prints the input to add to fuzz/regressions/TARGET, where
# the unit test `fuzzing::tests` replays it on every `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo fuzz build --sanitizer none
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
for target in $(cargo fuzz list); do
    mkdir -p "$scratch/$target" "fuzz/regressions/$target"
    echo "fuzz: $target for ${seconds}s"
    if ! cargo fuzz run --sanitizer none "$target" "$scratch/$target" \
        "fuzz/corpus/$target" "fuzz/regressions/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 2>"$scratch/$target.log"; then
        tail -n 40 "$scratch/$target.log"
        echo "fuzz: $target found a failing input (fuzz/artifacts/$target/); add it to fuzz/regressions/$target/" >&2
        exit 1
    fi
    grep -E '^stat::number_of_executed_units|^Done' "$scratch/$target.log" || true
done
