#!/usr/bin/env bash
# The Debian package, from a binary already built: completions, man pages and
# the configuration's JSON Schema made by that binary, then cargo-deb with Cargo.toml's [package.metadata.deb].
#
#   cargo build --release --locked && packaging/deb.sh          # target/debian/driftless_<version>_amd64.deb
#   packaging/deb.sh --profile dev --deb-version 0.0.9-1 -o DIR  # extra arguments go to cargo deb
#
# Needs cargo-deb (`cargo install cargo-deb --locked`). The binary is the
# one of the profile given to cargo deb (release unless --profile says).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --profile) profile=${args[$((i + 1))]} ;;
    --profile=*) profile=${args[$i]#--profile=} ;;
  esac
done
case "$profile" in
  dev) dir=debug ;;
  *) dir=$profile ;;
esac
target_dir=${CARGO_TARGET_DIR:-target}
bin="$target_dir/$dir/driftless"
[ -x "$bin" ] || { echo "error: no $bin: build it first (cargo build --locked, profile $profile)" >&2; exit 1; }

out=target/packaging
rm -rf "$out"
mkdir -p "$out/completions" "$out/man"
"$bin" completions bash > "$out/completions/driftless"
"$bin" completions zsh > "$out/completions/_driftless"
"$bin" completions fish > "$out/completions/driftless.fish"
"$bin" man --dir "$out/man"
"$bin" config schema > "$out/driftless.schema.json"
gzip -9n "$out"/man/*.1

exec cargo deb --no-build --locked "$@"
