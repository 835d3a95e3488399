# What every bench script starts with (sourced, from the repository's root):
# git isolated from the host's configuration and a fixed committer, the
# tools the script names checked, and `bin`: the release build, made now,
# or DRIFTLESS_BIN to measure another build.
#
#   . bench/lib.sh; bench_needs NAME "apt hint" tool...; bench_binary

export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@example.net
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@example.net
export TF_CLI_CONFIG_FILE=/dev/null

# bench_needs SCRIPT HINT TOOL...: exit 1 naming the first missing tool.
bench_needs() {
  local script=$1 hint=$2 tool
  shift 2
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$script needs $tool ($hint)" >&2; exit 1; }
  done
}

# bench_binary: set `bin` to DRIFTLESS_BIN, or build the release binary.
bench_binary() {
  if [ -z "${DRIFTLESS_BIN:-}" ]; then
    cargo build --release --locked -q
    bin=$PWD/target/release/driftless
  else
    bin=$DRIFTLESS_BIN
  fi
}
