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
# Fuzzes target $1 for $seconds on one core; fails with the input to keep.
fuzz_one() {
    local target=$1
    mkdir -p "$scratch/$target" "fuzz/regressions/$target"
    if ! cargo fuzz run --sanitizer none "$target" "$scratch/$target" \
        "fuzz/corpus/$target" "fuzz/regressions/$target" -- \
        -max_total_time="$seconds" -print_final_stats=1 2>"$scratch/$target.log"; then
        tail -n 40 "$scratch/$target.log"
        echo "fuzz: $target found a failing input (fuzz/artifacts/$target/); add it to fuzz/regressions/$target/" >&2
        return 1
    fi
    echo "fuzz: $target for ${seconds}s: $(grep -E '^Done' "$scratch/$target.log" || true)"
}
# One lane per core, each taking every lanes-th target in turn: a fuzzer runs on one
# core, so each target still gets its whole time while the run takes a lane's share.
lanes=$(nproc)
mapfile -t targets < <(cargo fuzz list)
if [ "${#targets[@]}" -eq 0 ]; then
    echo "fuzz: cargo fuzz list named no target" >&2
    exit 1
fi
pids=()
for ((lane = 0; lane < lanes; lane++)); do
    (
        for ((i = lane; i < ${#targets[@]}; i += lanes)); do
            fuzz_one "${targets[$i]}" || exit 1
        done
    ) &
    pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
exit "$failed"
