#!/usr/bin/env bash
# Build the fuzz targets and run each for a bounded time, starting from the
# committed corpus (new inputs go to a scratch copy, so the repository's
# corpus only changes when someone commits a minimised one).
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 30, all)
#
# Prints executions and crashes per target; exits 1 if any target crashed
# (the input is kept under fuzz/artifacts/<target>/).
#
# cargo-fuzz needs nightly-only rustc flags; this machine has only a stable
# toolchain, so the build runs with RUSTC_BOOTSTRAP=1 and without a
# sanitizer (`-s none`: the code under test is safe Rust, where a panic — the
# finding we look for — needs no sanitizer to be caught).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-30}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(webhook_github webhook_gitea webhook_gitlab webhook_generic repo_url config)
fi
if ! command -v cargo-fuzz >/dev/null; then
    cargo install cargo-fuzz --locked --version 0.13.2
fi
export RUSTC_BOOTSTRAP=1
start=$(date +%s)
cargo fuzz build -s none
echo "fuzz build: $(( $(date +%s) - start )) s"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
failed=0
printf '%-16s %12s %10s %8s\n' target executions exec/s crashes
for t in "${targets[@]}"; do
    mkdir -p "$scratch/$t" "fuzz/artifacts/$t"
    log="$scratch/$t.log"
    set +e
    cargo fuzz run -s none "$t" "$scratch/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    crashes=0
    if [ $rc -ne 0 ]; then
        crashes=1
        failed=1
        echo "---- $t crashed; its output:" >&2
        grep -v '^#' "$log" | tail -40 >&2
    fi
    printf '%-16s %12s %10s %8s\n' "$t" "${execs:-0}" "${rate:-0}" "$crashes"
done
exit $failed
