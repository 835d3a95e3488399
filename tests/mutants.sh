#!/usr/bin/env bash
# Mutation testing of the modules the README's guarantees rest on, with
# cargo-mutants (crates.io): each mutant is a small change to the code (a
# function's body replaced, an operator flipped); a test run that still
# passes with it is a test that would not notice that bug. Not part of
# tests/run.sh or CI: it builds and tests once per mutant, hours in all.
#
#   tests/mutants.sh                 # every module below
#   tests/mutants.sh redact queue    # some of them
#
# Results go to target/mutants/<module>/mutants.out (caught.txt,
# missed.txt, unviable.txt, timeout.txt); a summary line per module is
# printed at the end. The guarantees chapter of the guide (docs/guarantees.md) gives the last
# figures and explains each surviving mutant.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null 2>&1 || cargo install --locked cargo-mutants
export TF_CLI_CONFIG_FILE=/dev/null
out=target/mutants
mkdir -p "$out"

# module: file, cargo-mutants options, then the tests that cover it.
run() {
  local name=$1 file=$2
  shift 2
  echo "== $name ($file)"
  cargo mutants --no-shuffle -j 1 -f "$file" -o "$out/$name" "$@" || true
}

wanted() { [ $# -eq 0 ] && return 0; local m; for m in "${ARGS[@]}"; do [ "$m" = "$1" ] && return 0; done; return 1; }
ARGS=("$@")
pick() { [ ${#ARGS[@]} -eq 0 ] || wanted "$1"; }

pick redact  && run redact  src/redact.rs -- --lib
# process is mostly exercised through the exec backend's integration tests.
pick process && run process src/process.rs -- --lib --test it -- process:: exec::
# The claim, requeue, recovery and finish paths of the queue.
pick queue   && run queue   src/store/jobs/mod.rs -F 'claim|requeue|recover|finish|interruptions|start_now|heartbeat' -- --lib queue::
pick write   && run write   src/store/write.rs -- --lib store::
pick group   && run group   src/store/group.rs -- --lib store::
pick direct  && run direct  src/store/direct.rs -- --lib store::
pick lock    && run lock    src/lock.rs -- --lib lock::
pick verify  && run verify  src/git/verify.rs -- --lib --test it -- verify:: tags::
pick decrypt && run decrypt src/decrypt.rs -- --lib --test it -- decrypt:: canaries::
# tick's record and finish steps, and one run's steps (tick::converge):
# the tests of what those steps refuse (tags, signatures, a checkout
# already at the tip) run with them.
pick tick    && run tick    src/tick/record.rs -f src/tick/converge.rs -- --lib --test it -- tick:: daemon:: dependencies:: tags:: verify:: git_sync:: unwritable:: forge_status::

echo "== summary (caught / missed / timeout / unviable)"
for d in "$out"/*/mutants.out; do
  [ -d "$d" ] || continue
  n() { [ -f "$d/$1" ] && wc -l < "$d/$1" || echo 0; }
  echo "$(basename "$(dirname "$d")"): $(n caught.txt) / $(n missed.txt) / $(n timeout.txt) / $(n unviable.txt)"
done
