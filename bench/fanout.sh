#!/usr/bin/env bash
# One push, many targets: how long a push that changes a file every target
# shares takes to reach the last of them. For each count N (default 100,
# 1000 and 10000), N exec targets on one repository, all with `path =
# "app"`, an interval of an hour (only the push moves them) and `workers =
# 4`; once every target has applied the first commit, a commit changing
# app/config is pushed and announced by one signed GitHub push delivery.
# Prints, per N (figures, not assertions):
#  - start-up: from `driftless serve` to /readyz answering;
#  - the first convergence: from start-up to every target applied;
#  - fan-out: from the delivery's answer to the last target applied at the
#    new commit, each applied target's run and the jobs per second;
#  - beside it, Flux's published figure for the same question (1,000
#    Kustomizations reconciled in 4 min 16 s on a 16-core GitHub runner,
#    fluxcd/flux-benchmark's README), and the ratio to it.
#
#   bench/fanout.sh [N...]              (default 100 1000 10000)
#   DRIFTLESS_BIN=/path/to/driftless bench/fanout.sh 1000
#   FANOUT_CHECKOUT=sparse bench/fanout.sh   (the targets' checkout key)
set -euo pipefail
cd "$(dirname "$0")/.."
counts=("$@")
[ ${#counts[@]} -gt 0 ] || counts=(100 1000 10000)
. bench/lib.sh
bench_needs bench/fanout.sh "apt-get install it" python3 curl openssl
bench_binary
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
checkout=${FANOUT_CHECKOUT:-full}
flux_s=256 # 4 min 16 s

bench_exec_remote "$work"
secret="bench-secret-$(date +%s)"
printf '%s' "$secret" > "$work/secret"
sig=$(bench_github_push "$work" "$secret")

now_ms() { date +%s%3N; }
# Runs that applied something, summed over the targets (/metrics).
changed() {
  { curl -sf "http://127.0.0.1:$port/metrics" || true; } |
    awk '/^driftless_ticks_total\{.*result="changed"/ { n += $2 } END { print n + 0 }'
}
wait_changed() { # count seconds: 0 once /metrics says count, 1 at the deadline
  for _ in $(seq $(($2 * 10))); do
    [ "$(changed)" -ge "$1" ] && return 0
    sleep 0.1
  done
  return 1
}

printf '%-10s %10s %14s %14s %8s  %s\n' targets "start-up" "first converge" "fan-out" "jobs/s" "fan-out / Flux's 256 s for 1,000"
for n in "${counts[@]}"; do
  port=$(free_port)
  state="$work/state-$n"
  {
    echo "state_dir = \"$state\""
    printf '[server]\nlisten = "127.0.0.1:%s"\nworkers = 4\n' "$port"
    printf '[[receivers]]\nname = "github"\nforge = "github"\nsecret_file = "%s"\n' "$work/secret"
    for i in $(seq "$n"); do
      printf '[[targets]]\nname = "t%05d"\nrepo = "file://%s"\npath = "app"\ninterval = "1h"\ncheckout = "%s"\n[targets.backend]\nkind = "exec"\napply = ["true"]\n' \
        "$i" "$work/remote.git" "$checkout"
    done
  } > "$work/fanout.toml"
  t0=$(now_ms)
  "$bin" --config "$work/fanout.toml" serve 2>"$work/serve-$n.log" &
  pid=$!
  until curl -sf "http://127.0.0.1:$port/readyz" >/dev/null; do
    kill -0 "$pid" 2>/dev/null || { echo "serve stopped; its log:" >&2; tail -5 "$work/serve-$n.log" >&2; exit 1; }
    sleep 0.02
  done
  t1=$(now_ms)
  wait_changed "$n" 3600 || { echo "$n targets did not converge within an hour" >&2; exit 1; }
  t2=$(now_ms)
  # The push: a commit every target's directory holds, then its delivery.
  echo "v2 $n" > "$work/src/app/config"
  git -C "$work/src" commit -qam "fan-out $n"
  git -C "$work/src" push -q "$work/remote.git" main
  code=$(curl -s -o /dev/null -w '%{http_code}' -X POST \
    -H 'Content-Type: application/json' -H 'X-GitHub-Event: push' \
    -H "X-GitHub-Delivery: fanout-$n-$(date +%s%N)" -H "X-Hub-Signature-256: $sig" \
    --data-binary "@$work/body.json" "http://127.0.0.1:$port/hooks/github")
  t3=$(now_ms)
  [ "$code" = 202 ] || { echo "the push delivery was answered $code" >&2; exit 1; }
  wait_changed $((2 * n)) 3600 || { echo "the push did not reach $n targets within an hour" >&2; exit 1; }
  t4=$(now_ms)
  kill "$pid"; wait "$pid" 2>/dev/null || true
  awk -v n="$n" -v s=$((t1 - t0)) -v c=$((t2 - t1)) -v f=$((t4 - t3)) -v flux="$flux_s" 'BEGIN {
    printf "%-10d %8.2f s %12.1f s %12.1f s %8.0f  %.3fx\n",
      n, s / 1000, c / 1000, f / 1000, n / (f / 1000), (f / 1000) / flux
  }'
  rm -rf "$state"
done
echo "checkout = \"$checkout\"; Flux: 1,000 Kustomizations in 4 min 16 s on 16 cores (fluxcd/flux-benchmark); this machine: $(nproc) cores"
