#!/usr/bin/env bash
# RUSTC_WRAPPER for fuzz/run.sh: coverage instrumentation (what cargo-fuzz
# adds) and opt-level 1 only for the crates under test -- driftless and the
# fuzz targets -- so the dependencies are the very artifacts the test build
# already made (same profile, same target directory) and are not rebuilt.
# The targets are told apart by their source file: one of them is called
# `config`, like the config crate.
rustc=$1
shift
crate=""
prev=""
target_source=0
for a in "$@"; do
    [ "$prev" = "--crate-name" ] && crate=$a
    case "$a" in */fuzz/fuzz_targets/*.rs | fuzz/fuzz_targets/*.rs) target_source=1 ;; esac
    prev=$a
done
if [ "$crate" = driftless ] || [ "$crate" = driftless_fuzz ] || [ "$target_source" = 1 ]; then
    exec "$rustc" "$@" $DRIFTLESS_FUZZ_FLAGS
fi
exec "$rustc" "$@"
