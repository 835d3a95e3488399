#!/usr/bin/env bash
# RUSTC_WRAPPER for fuzz/run.sh: coverage instrumentation (what cargo-fuzz
# adds) only for the crates under test -- driftless and the fuzz targets --
# so the dependencies build as usual, in a fraction of the time.
rustc=$1
shift
crate=""
prev=""
for a in "$@"; do
    [ "$prev" = "--crate-name" ] && crate=$a
    prev=$a
done
case "$crate" in
    driftless|driftless_fuzz|webhook_*|repo_url|config)
        exec "$rustc" "$@" $DRIFTLESS_FUZZ_FLAGS ;;
    *)
        exec "$rustc" "$@" ;;
esac
