#!/usr/bin/env bash
# Checkouts that scale: the disk N targets on one monorepo take with
# `checkout = "sparse"`, against one full checkout plus the shared cache.
# The repository has N directories (svc/NNNNN, one ~4 KB file each) and a
# README; each of N exec targets reads its own directory, sparse, and one
# more target reads the first directory from a full checkout. Once every
# target has applied, prints (figures, not assertions):
#  - the cache (the repository's objects, shared by every checkout);
#  - the full checkout;
#  - all N sparse checkouts together, and one of them;
#  - the ratio of the N sparse checkouts plus the cache to one full
#    checkout plus the cache (issue 50's goal: under 10x for 10,000);
#  - how long the first convergence of all of them took.
# Disk is `du -sk`: what the blocks take, not the files' sizes.
#
#   bench/sparse.sh [N]            (default 10000)
#   DRIFTLESS_BIN=/path/to/driftless bench/sparse.sh 1000
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-10000}
. bench/lib.sh
bench_needs bench/sparse.sh "apt-get install it" python3 curl
bench_binary
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

git init -q --bare -b main "$work/remote.git"
git init -q -b main "$work/src"
echo "a monorepo" > "$work/src/README"
python3 - "$work/src" "$n" <<'PY'
import base64, os, sys
root, n = sys.argv[1], int(sys.argv[2])
for i in range(1, n + 1):
    d = os.path.join(root, "svc", f"{i:05d}")
    os.makedirs(d)
    with open(os.path.join(d, "main.tf"), "w") as f:
        f.write(base64.encodebytes(os.urandom(3000)).decode())
PY
git -C "$work/src" add -A && git -C "$work/src" commit -qm monorepo
git -C "$work/src" push -q "$work/remote.git" main

port=$(free_port)
{
  echo "state_dir = \"$work/state\""
  printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = 4\n' "$port"
  target() { # name path checkout
    printf '[[targets]]\nname = "%s"\nrepo = "file://%s"\npath = "%s"\ninterval = "1h"\ncheckout = "%s"\n[targets.backend]\nkind = "exec"\napply = ["true"]\n' \
      "$1" "$work/remote.git" "$2" "$3"
  }
  target full svc/00001 full
  for i in $(seq "$n"); do target "$(printf 's%05d' "$i")" "$(printf 'svc/%05d' "$i")" sparse; done
} > "$work/sparse.toml"
start=$(date +%s)
"$bin" --config "$work/sparse.toml" serve 2>"$work/serve.log" &
pid=$!
applied() {
  { curl -sf "http://127.0.0.1:$port/metrics" || true; } |
    awk '/^driftless_ticks_total\{.*result="changed"/ { n += $2 } END { print n + 0 }'
}
until [ "$(applied)" -ge $((n + 1)) ]; do
  kill -0 "$pid" 2>/dev/null || { echo "serve stopped; its log:" >&2; tail -5 "$work/serve.log" >&2; exit 1; }
  [ $(($(date +%s) - start)) -lt 7200 ] || { echo "not converged in two hours" >&2; exit 1; }
  sleep 1
done
converged=$(($(date +%s) - start))
kill "$pid"; wait "$pid" 2>/dev/null || true

kib() { du -sk "$@" | awk '{ n += $1 } END { print n }'; }
cache=$(kib "$work"/state/git/*)
full=$(kib "$work/state/checkouts/full")
sparse=$(kib $(find "$work/state/checkouts" -mindepth 1 -maxdepth 1 -name 's*'))
one=$(kib "$work/state/checkouts/s00001")
echo "== $n sparse checkouts of one monorepo ($n directories, one ~4 KB file each)"
printf '%-52s %10s KiB\n' "the cache (shared objects)" "$cache"
printf '%-52s %10s KiB\n' "one full checkout" "$full"
printf '%-52s %10s KiB\n' "$n sparse checkouts" "$sparse"
printf '%-52s %10s KiB\n' "  one of them" "$one"
awk -v s="$sparse" -v c="$cache" -v f="$full" \
  'BEGIN { printf "%-52s %10.2f x\n", "sparse checkouts + cache / (full checkout + cache)", (s + c) / (f + c) }'
printf '%-52s %10s s\n' "first convergence of all $((n + 1)) targets" "$converged"
