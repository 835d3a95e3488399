#!/usr/bin/env bash
# driftless at rest: what ticks that have nothing to do cost. Prints, in one
# run (figures, not assertions; ratios against baselines measured in the
# same run):
#  1. a no-op one-shot `tick` of an exec target (digest unchanged) against
#     a bare `git fetch` of the same remote in a clone (issue 50's
#     baseline; the two alternated, medians and means), and against the bare git commands it would otherwise run
#     (fetch, reset --hard, rev-parse of the path's tree), and how many
#     processes the tick starts (strace: execve);
#  2. 1,000 exec targets on one repository at a 1-minute interval under
#     `driftless serve`: how long it takes from its start to answering,
#     the share of one core it takes over an interval (at least a minute)
#     once every target has ticked twice (applied, then a first no-op),
#     children included (utime + stime + cutime + cstime from
#     /proc/<pid>/stat), its RSS, the ticks it ran in that time and the
#     CPU each took, and the disk each target's checkout takes;
#  3. the database after 10,000 no-op ticks (200 targets at a 1 s interval:
#     runs kept, database size after a checkpoint);
#  4. the release binary's size.
#
#   bench/rest.sh [TARGETS] [INTERVAL]   (default 1000 1m; issue 50's
#                                         figure is 10000 5m)
#   DRIFTLESS_BIN=/path/to/driftless bench/rest.sh   (measure another build)
set -euo pipefail
cd "$(dirname "$0")/.."
many=${1:-1000}
interval=${2:-1m}
. bench/lib.sh
bench_needs bench/rest.sh "apt-get install it" strace sqlite3 python3 curl
bench_binary
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT

# A remote with an exec target's directory and 50 other files.
bench_exec_remote "$work"

target_toml() { # name interval
  printf '[[targets]]\nname = "%s"\nrepo = "%s"\npath = "app"\ninterval = "%s"\n[targets.backend]\nkind = "exec"\napply = ["true"]\n' \
    "$1" "$work/remote.git" "$2"
}
now_ms() { date +%s%3N; }
mean_ms() { # rounds command...: mean wall time of the command, in ms
  local rounds=$1 start end
  shift
  start=$(now_ms)
  for _ in $(seq "$rounds"); do "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; done
  end=$(now_ms)
  awk -v t=$((end - start)) -v n="$rounds" 'BEGIN { printf "%.1f", t / n }'
}
# Ticks a database records: rows, or rows times their repeats where a
# streak of no_change runs is one row.
ticks_in() {
  sqlite3 "$1" "SELECT SUM(repeats) FROM runs" 2>/dev/null || sqlite3 "$1" "SELECT COUNT(*) FROM runs"
}

# 1. The no-op tick, and the bare commands it replaces.
{ echo "state_dir = \"$work/one\""; target_toml app 1h; } > "$work/one.toml"
"$bin" --config "$work/one.toml" tick app >/dev/null 2>&1
"$bin" --config "$work/one.toml" tick app >/dev/null 2>&1
git clone -q "$work/remote.git" "$work/clone"
# The tick and the bare fetch alternate, in blocks of eleven runs each
# (the first of each block dropped), so that both see the machine in the
# same state: the median of each, and the mean (which counts the tick
# that folds SQLite's log into the database, about every seventh).
read -r tick_ms tick_mean fetch_ms fetch_mean < <(python3 - "$bin" "$work" <<'PY'
import statistics, subprocess, sys, time
bin, work = sys.argv[1], sys.argv[2]
cmds = [[bin, "--config", f"{work}/one.toml", "tick", "app"],
        ["git", "-C", f"{work}/clone", "fetch", "-q", "origin", "main"]]
times = [[], []]
for _ in range(8):
    for i, cmd in enumerate(cmds):
        for k in range(11):
            t = time.perf_counter()
            subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
            if k:
                times[i].append((time.perf_counter() - t) * 1000)
print(" ".join(f"{f(t):.1f}" for t in times for f in (statistics.median, statistics.mean)))
PY
)
bare() {
  git -C "$work/clone" fetch -q origin main &&
    git -C "$work/clone" reset -q --hard origin/main &&
    git -C "$work/clone" rev-parse -q --verify HEAD:app >/dev/null
}
bare_ms=$(mean_ms 20 bare)
strace -f -qq -e trace=execve,execveat -o "$work/trace" "$bin" --config "$work/one.toml" tick app >/dev/null 2>&1
# every program started, driftless itself aside
started=$(( $(grep -c ' = 0$' "$work/trace" || true) - 1 ))

# 2. Many targets on one repository, one minute apart.
port=$(free_port)
{
  echo "state_dir = \"$work/many\""
  printf '[server]\nlisten = "127.0.0.1:%s"\n' "$port"
  for i in $(seq "$many"); do target_toml "$(printf 't%05d' "$i")" "$interval"; done
} > "$work/many.toml"
started_ms=$(now_ms)
"$bin" --config "$work/many.toml" serve 2>"$work/many.log" &
pid=$!
for _ in $(seq 600); do
  curl -sf -o /dev/null "http://127.0.0.1:$port/metrics" && break
  sleep 0.01
done
serving_ms=$(( $(now_ms) - started_ms ))
metric_ticks() { # finished runs so far, 0 while the daemon is not up
  { curl -sf "http://127.0.0.1:$port/metrics" || true; } |
    awk '/^driftless_ticks_total/ { n += $2 } END { print n + 0 }'
}
# Every target ticked twice — its first apply, then the first no-op tick
# after it, which settles its checkout's racily clean files by their
# content (once after each reset) — so that what is measured is the steady
# state: no-op ticks that trust the files' stat data.
for _ in $(seq 14400); do
  [ "$(metric_ticks)" -ge $((2 * many)) ] && break
  sleep 0.5
done
# Measured over a whole interval (at least a minute): every target ticks
# about once in it, however the first round's ticks bunched.
interval_s=$(python3 -c 'import sys; v = sys.argv[1]; print(int(v[:-1]) * {"s": 1, "m": 60, "h": 3600}[v[-1]])' "$interval")
window_s=$((interval_s > 60 ? interval_s : 60))
cpu() { awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
c0=$(cpu); t0=$(metric_ticks); s0=$(now_ms)
sleep "$window_s"
c1=$(cpu); t1=$(metric_ticks); s1=$(now_ms)
rss_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$pid/status")
kill "$pid"; wait "$pid" 2>/dev/null || true
share=$(awk -v c=$((c1 - c0)) -v hz="$hz" -v ms=$((s1 - s0)) 'BEGIN { printf "%.1f", 100 * c / hz / (ms / 1000) }')
per_target_kb=$(( $(du -sk "$work/many/checkouts" | cut -f1) / many ))

# 3. The database after 10,000 no-op ticks.
port=$(free_port)
{
  echo "state_dir = \"$work/ten\""
  printf '[server]\nlisten = "127.0.0.1:%s"\n' "$port"
  for i in $(seq 200); do target_toml "$(printf 'n%03d' "$i")" 1s; done
} > "$work/ten.toml"
"$bin" --config "$work/ten.toml" serve 2>"$work/ten.log" &
pid=$!
for _ in $(seq 3600); do
  sleep 1
  [ "$(ticks_in "$work/ten/driftless.db" 2>/dev/null)" -ge 10100 ] 2>/dev/null && break
done
kill "$pid"; wait "$pid" 2>/dev/null || true
ten_ticks=$(ticks_in "$work/ten/driftless.db")
ten_rows=$(sqlite3 "$work/ten/driftless.db" "SELECT COUNT(*) FROM runs")
ten_jobs=$(sqlite3 "$work/ten/driftless.db" "SELECT COUNT(*) FROM jobs")
sqlite3 "$work/ten/driftless.db" "PRAGMA wal_checkpoint(TRUNCATE)" >/dev/null
ten_kb=$(( $(stat -c %s "$work/ten/driftless.db") / 1024 ))

echo "== driftless at rest"
printf '%-56s %8s ms (mean %s)\n' "no-op one-shot tick, exec target (digest unchanged)" "$tick_ms" "$tick_mean"
printf '%-56s %8s ms (mean %s)\n' "git fetch, nothing new (baseline, alternated)" "$fetch_ms" "$fetch_mean"
awk -v a="$tick_ms" -v b="$fetch_ms" -v m="$tick_mean" -v n="$fetch_mean" 'BEGIN { printf "%-56s %8.2f x (means %.2f x)\n", "  ratio tick / git fetch (medians)", a / b, m / n }'
printf '%-56s %8s ms\n' "git fetch + reset --hard + rev-parse (baseline)" "$bare_ms"
awk -v a="$tick_ms" -v b="$bare_ms" 'BEGIN { printf "%-56s %8.2f x\n", "  ratio tick / fetch + reset + rev-parse", a / b }'
printf '%-56s %8s\n' "  processes the no-op tick starts (strace)" "$started"
printf '%-56s %8s ms\n' "$many targets, $interval interval: start to serving" "$serving_ms"
printf '%-56s %8s %%\n' "  share of one core over ${window_s} s, once converged" "$share"
printf '%-56s %8s MiB\n' "  RSS" "$((rss_kb / 1024))"
printf '%-56s %8s\n' "  ticks in that time" "$((t1 - t0))"
# Per tick, which does not depend on how many ticks the minute held.
awk -v c=$((c1 - c0)) -v hz="$hz" -v n=$((t1 - t0)) 'BEGIN { printf "%-56s %8.2f ms\n", "  CPU per tick", 1000 * c / hz / (n > 0 ? n : 1) }'
printf '%-56s %8s KiB\n' "  checkout disk use per target" "$per_target_kb"
printf '%-56s %8s ticks: %s run rows, %s job rows, %s KiB\n' "database after 10,000 no-op ticks" "$ten_ticks" "$ten_rows" "$ten_jobs" "$ten_kb"
printf '%-56s %8s MB\n' "binary size" "$(awk -v b="$(stat -c %s "$bin")" 'BEGIN { printf "%.1f", b / 1e6 }')"
