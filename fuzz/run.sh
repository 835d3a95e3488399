#!/usr/bin/env bash
# Build the fuzz targets and run each for a bounded time, starting from the
# committed corpus (new inputs go to a scratch copy, so the repository's
# corpus only changes when someone commits a minimised one).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 30, all)
#
# Runs as many targets at once as there are cores. Prints executions and
# crashes per target; exits 1 if any target crashed
# (the input is kept under fuzz/artifacts/<target>/).
#
# The targets are cargo-fuzz targets (`cargo fuzz run <target>` works too,
# on nightly or with RUSTC_BOOTSTRAP=1). This script builds them with plain
# cargo and the coverage instrumentation cargo-fuzz uses, minus the
# sanitizer, on driftless and the targets only: that needs no nightly flag
# and no cargo-fuzz install, and a panic in safe Rust -- the finding we look
# for -- needs no sanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(webhook_github webhook_gitea webhook_gitlab webhook_generic repo_url config)
fi
# The instrumentation goes only to driftless and the targets (see
# fuzz/rustc-wrapper.sh); everything else is the dev-profile build the tests
# already made, shared through the workspace's target directory.
export DRIFTLESS_FUZZ_FLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks \
-Copt-level=1"
export RUSTC_WRAPPER="$PWD/fuzz/rustc-wrapper.sh"
start=$(date +%s)
cargo build --locked -p driftless-fuzz --bins
echo "fuzz build: $(( $(date +%s) - start )) s"
bindir="target/debug"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
# As many targets at once as there are cores: each is one process.
jobs=$(nproc 2>/dev/null || echo 1)
run_one() { # run_one TARGET: writes $scratch/TARGET.log and .rc
    local t=$1
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    set +e
    "$bindir/$t" -max_total_time="$secs" -print_final_stats=1 \
        -artifact_prefix="fuzz/artifacts/$t/" "$scratch/$t" "fuzz/corpus/$t" >"$scratch/$t.log" 2>&1
    echo $? >"$scratch/$t.rc"
}
running=0
for t in "${targets[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n || true
        running=$((running - 1))
    fi
    run_one "$t" &
    running=$((running + 1))
done
wait
printf '%-16s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
    log="$scratch/$t.log"
    rc=$(cat "$scratch/$t.rc" 2>/dev/null || echo 1)
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    crashes=0
    if [ "$rc" -ne 0 ]; then
        crashes=1
        failed=1
        echo "---- $t crashed; its output:" >&2
        grep -v '^#' "$log" | tail -40 >&2
    fi
    printf '%-16s %12s %10s %8s\n' "$t" "${execs:-0}" "${rate:-0}" "$crashes"
done
exit $failed
