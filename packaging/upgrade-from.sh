#!/usr/bin/env bash
# A real upgrade: the package built from an earlier revision (the last tag
# by default) installed, configured and started under systemd, then
# upgraded to the package of this checkout — the suite's Debian-package
# test with its "previous" package from REV instead of this binary at a
# lower version. Outside CI: it builds REV from scratch (minutes).
#
#   packaging/upgrade-from.sh            # from the last tag
#   packaging/upgrade-from.sh HEAD~3     # from any revision that has packaging/deb.sh
#
# Needs what tests/run.sh installs (cargo-deb, lintian, dockerd, debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

rev=${1:-$(git describe --tags --abbrev=0 2>/dev/null || true)}
if [ -z "$rev" ]; then
  echo "error: no tag yet: name a revision, e.g. packaging/upgrade-from.sh HEAD~3" >&2
  exit 2
fi
sha=$(git rev-parse --short=10 "$rev^{commit}")
git cat-file -e "$sha:packaging/deb.sh" 2>/dev/null || {
  echo "error: $rev ($sha) has no packaging/deb.sh: it predates the package" >&2
  exit 2
}

work=$(mktemp -d)
trap 'git worktree remove --force "$work/src" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git worktree add --detach "$work/src" "$sha" >/dev/null
echo "== building $rev ($sha) in $work/src"
(
  cd "$work/src"
  cargo build --locked
  # 0~<sha> sorts below every release, so the tip's package is an upgrade.
  packaging/deb.sh --profile dev --fast --deb-version "0~g$sha-1" -o "$work"
)
old=$(ls "$work"/driftless_0~g"$sha"-1_*.deb)
echo "== upgrading from $old"
cargo build --locked
DRIFTLESS_UPGRADE_FROM_DEB="$old" TF_CLI_CONFIG_FILE=/dev/null \
  cargo test --locked --test it -- --exact \
  packaging::the_debian_package_installs_starts_upgrades_and_purges_like_a_debian_service
