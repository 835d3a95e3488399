#!/usr/bin/env bash
# RUSTC_WORKSPACE_WRAPPER for tests/run.sh: driftless's own crates (the
# library, the binary, the tests, the fuzz targets) are compiled by
# clippy-driver with every warning an error, in the very pass that builds
# them for the tests. A separate `cargo clippy` would type-check every
# dependency a second time (three minutes on two cores); dependencies are
# built by plain rustc either way.
exec "${CLIPPY_DRIVER:?set by tests/run.sh}" "$@" -D warnings
