#!/usr/bin/env bash
# Drives signed GitHub push deliveries at `driftless serve` on 127.0.0.1 with
# wrk, and — in the same run, with the same body, signature and load — at
# adnanh/webhook (Debian package `webhook`) configured with an equivalent
# payload-hmac-sha256 rule that runs `true`. Prints requests/s and p50/p99
# for both, and the ratio. Figures, not assertions.
#
#   bench/webhooks.sh [DURATION] [CONNECTIONS]     (default 10s, 16)
#   DRIFTLESS_BIN=/path/to/driftless bench/webhooks.sh   (another build)
#   BENCH_PG_STATEMENTS=1 bench/webhooks.sh   (PostgreSQL with pg_stat_statements,
#                                              its busiest statements printed)
#
# Every delivery has its own id, so driftless records each one durably
# (SQLite, synchronous=FULL) and queues a job before answering 202; the
# target is an exec target on a local repository, so the jobs also run.
# Then the same flood with a wrong signature: its rate, and that nothing
# was written. Then the signed flood again at a driftless whose state is in
# PostgreSQL (`[database]`: a throwaway cluster from Debian's postgresql,
# fsync and synchronous_commit at their safe defaults, on a Unix socket),
# with its ratios to SQLite's and webhook's rates; skipped, saying so,
# without PostgreSQL or root.
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-10s}
conns=${2:-16}
for tool in wrk webhook; do
  command -v "$tool" >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk webhook >/dev/null; }
done
. bench/lib.sh
bench_binary
work=$(mktemp -d)
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  if [ -f "$work/pg/postmaster.pid" ]; then
    su postgres -s /bin/sh -c "'$pgbin/pg_ctl' -D '$work/pg' -m immediate stop" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

git init -q --bare -b main "$work/remote.git"
git init -q -b main "$work/src"
mkdir -p "$work/src/pipeline" && echo v1 > "$work/src/pipeline/config"
git -C "$work/src" add -A && git -C "$work/src" commit -qm bench
git -C "$work/src" push -q "$work/remote.git" main

secret="bench-secret-$(date +%s)"
printf '%s' "$secret" > "$work/secret"
# GitHub's own push payload, pointed at the local repository.
sig=$(bench_github_push "$work" "$secret")

port_d=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
port_w=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/driftless.toml" <<TOML
state_dir = "$work/state"
[server]
listen = "127.0.0.1:$port_d"
workers = 2
[[receivers]]
name = "github"
forge = "github"
secret_file = "$work/secret"
[[targets]]
name = "pipeline"
repo = "file://$work/remote.git"
path = "pipeline"
interval = "1h"
[targets.backend]
kind = "exec"
apply = ["true"]
always = true
TOML
cat > "$work/hooks.json" <<JSON
[{
  "id": "github",
  "execute-command": "/bin/true",
  "command-working-directory": "$work",
  "trigger-rule": {
    "match": {
      "type": "payload-hmac-sha256",
      "secret": "$secret",
      "parameter": { "source": "header", "name": "X-Hub-Signature-256" }
    }
  }
}]
JSON
bench_push_lua "$work" "$sig"

"$bin" --config "$work/driftless.toml" serve 2>"$work/driftless.log" &
webhook -hooks "$work/hooks.json" -ip 127.0.0.1 -port "$port_w" >"$work/webhook.log" 2>&1 &
for p in "$port_d" "$port_w"; do
  for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$p) 2>/dev/null && break; sleep 0.1; done
done
# One delivery each, checked, before measuring.
curl_code() { python3 - "$@" <<'PY'
import sys, urllib.request
url, sig, body = sys.argv[1], sys.argv[2], open(sys.argv[3], "rb").read()
req = urllib.request.Request(url, data=body, method="POST", headers={
    "Content-Type": "application/json", "X-GitHub-Event": "push",
    "X-GitHub-Delivery": "warmup", "X-Hub-Signature-256": sig})
print(urllib.request.urlopen(req).status)
PY
}
echo "warm-up: driftless $(curl_code "http://127.0.0.1:$port_d/hooks/github" "$sig" "$work/body.json"), webhook $(curl_code "http://127.0.0.1:$port_w/hooks/github" "$sig" "$work/body.json")"

run() { # run NAME URL
  wrk -t2 -c"$conns" -d"$duration" --latency -s "$work/push.lua" "$2" > "$work/$1.wrk" 2>"$work/$1.err"
  local rps p50 p99 errors
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/$1.wrk")
  p50=$(awk '$1 == "50%" { print $2 }' "$work/$1.wrk")
  p99=$(awk '$1 == "99%" { print $2 }' "$work/$1.wrk")
  errors=$(grep -c unexpected "$work/$1.err" || true)
  printf '%-30s %10s req/s   p50 %8s   p99 %8s   non-2xx %s\n' "$1" "$rps" "$p50" "$p99" "$errors"
  echo "$rps" > "$work/$1.rps"
}
echo "== signed GitHub pushes, wrk -t2 -c$conns -d$duration, 127.0.0.1"
run driftless "http://127.0.0.1:$port_d/hooks/github"
run adnanh-webhook "http://127.0.0.1:$port_w/hooks/github"
awk -v a="$(cat "$work/driftless.rps")" -v b="$(cat "$work/adnanh-webhook.rps")" \
  'BEGIN { printf "%-30s %10.2f x (driftless / webhook, requests per second)\n", "ratio", a / b }'
# The worker runs the target's jobs meanwhile: deliveries fold into the one
# queued job, and a job that finds its commit applied already is a no-op
# (the history keeps such a streak as one row, so the jobs are counted).
jobs=$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM jobs WHERE state = '"'done'"'").fetchone()[0])' "$work/state/driftless.db")
echo "driftless recorded every delivery durably; meanwhile its worker ran $jobs job(s) of the target (each delivery folds into the queued job)"

# The same flood with a wrong signature: refused (401) before anything is
# parsed or written. The deliveries table is counted before and after.
count_deliveries() { python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("SELECT count(*) FROM deliveries").fetchone()[0])' "$work/state/driftless.db"; }
before=$(count_deliveries)
sed "s/$sig/sha256=$(printf '0%.0s' $(seq 64))/" "$work/push.lua" > "$work/unsigned.lua"
wrk -t2 -c"$conns" -d"$duration" --latency -s "$work/unsigned.lua" "http://127.0.0.1:$port_d/hooks/github" > "$work/unsigned.wrk" 2>"$work/unsigned.err"
rps=$(awk '/^Requests\/sec:/ { print $2 }' "$work/unsigned.wrk")
p99=$(awk '$1 == "99%" { print $2 }' "$work/unsigned.wrk")
refused=$(grep -c "unexpected status 401" "$work/unsigned.err" || true)
after=$(count_deliveries)
echo "== the same flood with a wrong signature"
printf '%-30s %10s req/s   p99 %8s   refused (401) %s   deliveries written %s\n' "driftless unsigned" "$rps" "$p99" "$refused" "$((after - before))"

# The signed flood at a driftless on PostgreSQL.
if [ -z "$pgbin" ] || [ "$(id -u)" -ne 0 ]; then
  echo "== PostgreSQL: skipped (needs Debian's postgresql and root to run initdb as postgres)"
  exit 0
fi
chmod 711 "$work"
mkdir -p "$work/pg" "$work/pgsock"
chown postgres "$work/pg" "$work/pgsock"
su postgres -s /bin/sh -c "'$pgbin/initdb' -D '$work/pg' -A trust -U postgres" >/dev/null
statements=${BENCH_PG_STATEMENTS:-0}
pgopts="-k '$work/pgsock' -c listen_addresses=''"
[ "$statements" = 1 ] && pgopts="$pgopts -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all"
su postgres -s /bin/sh -c "'$pgbin/pg_ctl' -D '$work/pg' -o \"$pgopts\" -l '$work/pgsock/server.log' -w start" >/dev/null
[ "$statements" = 1 ] && "$pgbin/psql" -h "$work/pgsock" -U postgres -qc "CREATE EXTENSION pg_stat_statements" postgres
port_p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed -e "s|^state_dir = .*|state_dir = \"$work/state-pg\"|" -e "s|127.0.0.1:$port_d|127.0.0.1:$port_p|" \
  "$work/driftless.toml" > "$work/driftless-pg.toml"
printf '[database]\nurl = "postgres://postgres@localhost/postgres?host=%s"\n' "$work/pgsock" >> "$work/driftless-pg.toml"
"$bin" --config "$work/driftless-pg.toml" serve 2>"$work/driftless-pg.log" &
for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/$port_p) 2>/dev/null && break; sleep 0.1; done
echo "warm-up: driftless on PostgreSQL $(curl_code "http://127.0.0.1:$port_p/hooks/github" "$sig" "$work/body.json")"
echo "== signed GitHub pushes at driftless on PostgreSQL $("$pgbin/postgres" --version | awk '{ print $3 }'), wrk -t2 -c$conns -d$duration"
run driftless-postgres "http://127.0.0.1:$port_p/hooks/github"
awk -v p="$(cat "$work/driftless-postgres.rps")" -v s="$(cat "$work/driftless.rps")" -v w="$(cat "$work/adnanh-webhook.rps")" \
  'BEGIN { printf "%-30s %10.2f x SQLite   %.2f x webhook (requests per second)\n", "ratio (PostgreSQL)", p / s, p / w }'
if [ "$statements" = 1 ]; then
  echo "== the busiest statements on PostgreSQL during the flood (pg_stat_statements, nested ones too)"
  "$pgbin/psql" -h "$work/pgsock" -U postgres -c "SELECT calls, round(total_exec_time::numeric, 1) AS total_ms,
      round(mean_exec_time::numeric, 3) AS mean_ms, left(regexp_replace(query, '\s+', ' ', 'g'), 72) AS statement
    FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25" postgres
fi
