#!/usr/bin/env bash
# What a policy costs a terraform target. Prints, in one run (figures, not
# assertions; ratios against baselines measured in the same run):
#  1. a no-op one-shot `tick` of a terraform target (20 `terraform_data`
#     resources, applied once) with no policy: `terraform apply`, which
#     plans inside;
#  2. the same target under two policies (tests/fixtures/policies'
#     no_deletes.rego and an allow-list of types): `plan -out`, whose own
#     report says nothing changes (no `show -json`, nothing to evaluate);
#     and its ratio to 1;
#  3. a plan with a change (one resource more): `driftless plan` under the
#     policies, and the evaluation alone as it logs it ("policies
#     evaluated", `micros`), in microseconds and as a share of that plan.
#     A no-op tick evaluates nothing (a plan without changes applies
#     nothing), so 2 is what a policy costs at rest.
#
#   bench/policy.sh [ROUNDS]                         (default 10)
#   DRIFTLESS_BIN=/path/to/driftless bench/policy.sh (measure another build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
. bench/lib.sh
bench_needs bench/policy.sh "tests/run.sh installs it" terraform
bench_binary
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

git init -q --bare -b main "$work/remote.git"
git init -q -b main "$work/src"
mkdir -p "$work/src/net"
for i in $(seq 20); do
  printf 'resource "terraform_data" "r%02d" {\n  input = "v%s"\n}\n\n' "$i" "$i"
done > "$work/src/net/main.tf"
git -C "$work/src" add -A && git -C "$work/src" commit -qm bench
git -C "$work/src" push -q "$work/remote.git" main

mkdir -p "$work/policy"
cp tests/fixtures/policies/no_deletes.rego "$work/policy/"
cat > "$work/policy/types.rego" <<'EOF'
package types

import rego.v1

allowed := {"terraform_data"}

deny contains msg if {
	some rc in input.resource_changes
	not allowed[rc.type]
	msg := sprintf("%s: type %s is not allowed", [rc.address, rc.type])
}
EOF

config() { # name with-policies
  echo "state_dir = \"$work/$1\""
  printf '[[targets]]\nname = "net"\nrepo = "%s"\npath = "net"\ntimeout = "2m"\n' "$work/remote.git"
  printf '[targets.backend]\nkind = "terraform"\nenv = { TF_CLI_CONFIG_FILE = "/dev/null" }\n\n'
  if [ "$2" = yes ]; then
    printf '[[policies]]\nname = "no-deletes"\nfiles = ["%s/no_deletes.rego"]\n\n' "$work/policy"
    printf '[[policies]]\nname = "types"\nfiles = ["%s/types.rego"]\npackage = "types"\n' "$work/policy"
  fi
}
config plain no > "$work/plain.toml"
config guarded yes > "$work/guarded.toml"

now_ms() { date +%s%3N; }
# rounds no-op ticks of config $1: mean wall ms; the log in $work/$1.log
ticks() {
  "$bin" --config "$work/$1.toml" tick net >/dev/null 2>&1
  : > "$work/$1.log"
  local start end
  start=$(now_ms)
  for _ in $(seq "$rounds"); do
    RUST_LOG=info "$bin" --config "$work/$1.toml" tick net >>"$work/$1.log" 2>&1 ||
      { echo "tick failed:" >&2; tail -5 "$work/$1.log" >&2; exit 1; }
  done
  end=$(now_ms)
  awk -v t=$((end - start)) -v n="$rounds" 'BEGIN { printf "%.1f", t / n }'
}
plain_ms=$(ticks plain)
guarded_ms=$(ticks guarded)
# 3. A change, planned under the policies.
for i in 21; do
  printf 'resource "terraform_data" "r%02d" {\n  input = "v%s"\n}\n' "$i" "$i"
done >> "$work/src/net/main.tf"
git -C "$work/src" commit -qam more && git -C "$work/src" push -q "$work/remote.git" main
: > "$work/plan.log"
start=$(now_ms)
for _ in $(seq "$rounds"); do
  RUST_LOG=info "$bin" --config "$work/guarded.toml" plan net >>"$work/plan.log" 2>&1 || [ $? -eq 2 ]
done
end=$(now_ms)
plan_ms=$(awk -v t=$((end - start)) -v n="$rounds" 'BEGIN { printf "%.1f", t / n }')
eval_us=$(grep 'policies evaluated' "$work/plan.log" | grep -o 'micros=[0-9]*' | cut -d= -f2 |
  awk '{ s += $1; n++ } END { if (n) printf "%.0f", s / n; else print "none" }')
evaluated=$(grep -c 'policies evaluated' "$work/plan.log" || true)

echo "terraform, 20 resources, no-op one-shot tick (mean of $rounds):"
echo "  no policy (terraform apply):        ${plain_ms} ms"
echo "  under 2 policies (plan -out):       ${guarded_ms} ms  ($(awk -v a="$guarded_ms" -v b="$plain_ms" 'BEGIN { printf "%.2f", a / b }')x)"
echo "a change planned under 2 policies (driftless plan, mean of $rounds):"
echo "  the plan:                           ${plan_ms} ms"
echo "  the evaluation ($evaluated logged):          ${eval_us} us  ($(awk -v e="$eval_us" -v t="$plan_ms" 'BEGIN { if (e == "none") print "-"; else printf "%.2f %%", 100 * e / 1000 / t }') of the plan)"
