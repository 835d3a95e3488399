#!/usr/bin/env bash
# What followers of live output cost (issue 48): signed GitHub push
# deliveries driven at `driftless serve` with wrk while nobody follows a
# run, then while 20 readers follow a run that prints 20 lines a second
# (`GET /api/v1/runs/{id}/output?follow=1`, curl -N), in the order none,
# 20, 20, none;
# the ratio of the rates. Then 100 followers of a run that prints nothing:
# the daemon's memory (RSS) and CPU with them against without. Figures,
# not assertions.
#
#   bench/followers.sh [DURATION] [CONNECTIONS]      (default 10s, 16)
#   DRIFTLESS_BIN=/path/to/driftless bench/followers.sh  (another build)
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
conns=${2:-16}
command -v wrk >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; }
. bench/lib.sh
bench_needs followers.sh "apt-get install curl openssl" curl openssl python3
bench_binary
work=$(mktemp -d)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

git init -q --bare -b main "$work/remote.git"
git init -q -b main "$work/src"
mkdir -p "$work/src/pipeline" "$work/src/printer" "$work/src/sleeper"
echo v1 | tee "$work/src/pipeline/config" "$work/src/printer/config" "$work/src/sleeper/config" >/dev/null
git -C "$work/src" add -A && git -C "$work/src" commit -qm bench
git -C "$work/src" push -q "$work/remote.git" main

secret="bench-secret-$(date +%s)"
printf '%s' "$secret" > "$work/secret"
token="bench-reader-$(date +%s)"
digest=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
sig=$(bench_github_push "$work" "$secret")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/driftless.toml" <<TOML
state_dir = "$work/state"
[server]
listen = "127.0.0.1:$port"
workers = 3
[[receivers]]
name = "github"
forge = "github"
secret_file = "$work/secret"
[[tokens]]
name = "reader"
sha256 = "$digest"
scopes = ["read"]
[[targets]]
name = "pipeline"
repo = "file://$work/remote.git"
path = "pipeline"
interval = "1h"
[targets.backend]
kind = "exec"
apply = ["true"]
always = true
[[targets]]
name = "printer"
repo = "file://$work/remote.git"
path = "printer"
interval = "1h"
timeout = "1h"
[targets.backend]
kind = "exec"
apply = ["sh", "-c", "i=0; while [ \$i -lt 1000000 ]; do echo printed line \$i; i=\$((i+1)); sleep 0.05; done"]
[[targets]]
name = "sleeper"
repo = "file://$work/remote.git"
path = "sleeper"
interval = "1h"
timeout = "1h"
[targets.backend]
kind = "exec"
apply = ["sleep", "3600"]
TOML
bench_push_lua "$work" "$sig"

"$bin" --config "$work/driftless.toml" serve 2>"$work/driftless.log" &
pid=$!
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
# The run of a target, once it has begun.
running_run() {
  for _ in $(seq 300); do
    id=$(curl -s -H "Authorization: Bearer $token" "http://127.0.0.1:$port/api/v1/targets/$1/runs?limit=1" |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["id"] if r and r[0]["result"] is None else "")')
    [ -n "$id" ] && { echo "$id"; return; }
    sleep 0.1
  done
  echo "no running run of $1" >&2; exit 1
}
printer=$(running_run printer)
sleeper=$(running_run sleeper)
follow() { # follow RUN N: N readers of run RUN's output
  for _ in $(seq "$2"); do
    curl -sN -H "Authorization: Bearer $token" \
      "http://127.0.0.1:$port/api/v1/runs/$1/output?follow=1" > /dev/null &
    echo $! >> "$work/followers"
  done
}
unfollow() {
  [ -f "$work/followers" ] && kill $(cat "$work/followers") 2>/dev/null || true
  rm -f "$work/followers"
  sleep 0.5
}
run() { # run NAME
  wrk -t2 -c"$conns" -d"$duration" --latency -s "$work/push.lua" "http://127.0.0.1:$port/hooks/github" > "$work/$1.wrk" 2>"$work/$1.err"
  local rps p99 errors
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/$1.wrk")
  p99=$(awk '$1 == "99%" { print $2 }' "$work/$1.wrk")
  errors=$(grep -c unexpected "$work/$1.err" || true)
  printf '%-30s %10s req/s   p99 %8s   non-2xx %s\n' "$1" "$rps" "$p99" "$errors"
  echo "$rps" >> "$work/$2.rps"
}

echo "== signed GitHub pushes, wrk -t2 -c$conns -d$duration, while run $printer prints 20 lines/s"
# none, 20, 20, none: a rate that drifts as the database grows weighs on
# both sides alike.
run "no followers (1)" none
follow "$printer" 20
sleep 1
run "20 followers (1)" twenty
run "20 followers (2)" twenty
unfollow
run "no followers (2)" none
sum() { awk '{ s += $1 } END { print s }' "$1"; }
awk -v a="$(sum "$work/twenty.rps")" -v b="$(sum "$work/none.rps")" \
  'BEGIN { printf "%-30s %10.3f x (requests per second, 20 followers / none; goal >= 0.95)\n", "ratio", a / b }'

rss() { awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status"; }
cpu() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
measure() { # measure NAME: RSS now, CPU over 10 s
  local before after
  before=$(cpu); sleep 10; after=$(cpu)
  printf '%-30s RSS %6d KiB   CPU %5.2f %% of a core over 10 s\n' "$1" "$(rss)" \
    "$(awk -v a="$after" -v b="$before" -v hz="$hz" 'BEGIN { print (a - b) * 100 / hz / 10 }')"
  rss > "$work/$2.rss"
}
echo "== 100 followers of run $sleeper, which prints nothing"
measure "no followers" idle0
follow "$sleeper" 100
sleep 2
measure "100 idle followers" idle100
awk -v a="$(cat "$work/idle100.rss")" -v b="$(cat "$work/idle0.rss")" \
  'BEGIN { printf "%-30s %10.1f KiB each (%d KiB for 100)\n", "memory per follower", (a - b) / 100, a - b }'
unfollow
