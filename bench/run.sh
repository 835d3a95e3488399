#!/usr/bin/env bash
# Prints, in one run (figures, not assertions; ratios against a baseline
# measured in the same run, because these machines are noisy):
#  1. a no-op `driftless tick` on a terraform target vs the bare
#     `git fetch` + `terraform apply` it wraps (ratio);
#  2. what a plan adds: a no-op tick of a `policy = "detect"` terraform
#     target (plan, never apply) and `driftless plan` against the no-op
#     `auto` tick (ratios), and the peak RSS of each;
#  3. a no-op exec tick whose digest is unchanged;
#  4. per backend that can plan here (exec with a `plan` argv, ansible-core,
#     the pulumi stand-in): a no-op tick under `policy = "approval"` (a
#     plan that finds nothing) against the same target's no-op `auto` tick
#     (ratio), and its peak RSS; and a Nomad target on the stand-in
#     (tests/nomad_standin.py): its auto tick, which plans every job
#     before any register anyway, against a `policy = "detect"` tick;
#     and, when moto's `moto_server` is on the PATH (tests/run.sh installs
#     it), a CloudFormation stack on it, `auto` against `approval`;
#     compose and pi need a dockerd or an sshd and are not measured here;
#  5. the daemon's idle RSS with 100 targets configured;
#  6. at rest (bench/rest.sh): a no-op exec tick against the bare git
#     commands it replaces and the processes it starts, 1,000 targets on
#     one repository at a 1-minute interval (share of a core, RSS), the
#     database after 10,000 no-op ticks, the binary's size.
#
#   bench/run.sh [ROUNDS]      (default 10)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10}
. bench/lib.sh
bench_needs bench/run.sh "tests/run.sh installs the rest; apt-get install sqlite3" \
  terraform ansible-playbook sqlite3 python3
bench_binary
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT

# A remote with a terraform_data target and an exec target.
git init -q --bare -b main "$work/remote.git"
git init -q -b main "$work/src"
mkdir -p "$work/src/tf" "$work/src/app"
cat > "$work/src/tf/main.tf" <<'TF'
resource "terraform_data" "x" {
  input = "bench"
}
TF
echo "v1" > "$work/src/app/config"
mkdir -p "$work/src/ans" "$work/src/pul" "$work/src/nomad"
for policy in auto approval; do
  mkdir -p "$work/src/cfn-$policy"
  cat > "$work/src/cfn-$policy/stack.json" <<JSON
{"Resources": {"Greeting": {"Type": "AWS::SSM::Parameter",
  "Properties": {"Name": "/bench/$policy", "Type": "String", "Value": "bench"}}}}
JSON
done
cat > "$work/src/nomad/bench.nomad.hcl" <<'HCL'
job "bench" {
  datacenters = ["dc1"]
  type        = "batch"
  group "run" {
    task "once" {
      driver = "docker"
      config {
        image = "busybox:1.36"
      }
    }
  }
}
HCL
cat > "$work/src/ans/site.yml" <<YML
- hosts: all
  gather_facts: false
  tasks:
    - name: write the file
      ansible.builtin.copy:
        content: "bench\n"
        dest: "$work/ansible-out.txt"
YML
echo "box ansible_connection=local ansible_python_interpreter=$(command -v python3)" > "$work/src/ans/inventory.ini"
cat > "$work/src/pul/Pulumi.yaml" <<'YML'
name: bench
runtime: yaml
resources:
  bucket:
    type: test:index:Bucket
    properties:
      name: bench
YML
git -C "$work/src" add -A && git -C "$work/src" commit -qm bench
git -C "$work/src" push -q "$work/remote.git" main

cat > "$work/driftless.toml" <<TOML
state_dir = "$work/state"
[[targets]]
name = "tf"
repo = "$work/remote.git"
path = "tf"
[targets.backend]
kind = "terraform"
[[targets]]
name = "tfd"
repo = "$work/remote.git"
path = "tf"
policy = "detect"
[targets.backend]
kind = "terraform"
[[targets]]
name = "app"
repo = "$work/remote.git"
path = "app"
[targets.backend]
kind = "exec"
apply = ["true"]
TOML
# The same backends twice: policy auto, and policy approval (plan first).
for policy in auto approval; do
  cat >> "$work/driftless.toml" <<TOML
[[targets]]
name = "exec-$policy"
repo = "$work/remote.git"
path = "app"
policy = "$policy"
[targets.backend]
kind = "exec"
apply = ["true"]
plan = ["true"]
[[targets]]
name = "ansible-$policy"
repo = "$work/remote.git"
path = "ans"
policy = "$policy"
[targets.backend]
kind = "ansible"
playbook = "site.yml"
inventory = "inventory.ini"
[[targets]]
name = "pulumi-$policy"
repo = "$work/remote.git"
path = "pul"
policy = "$policy"
[targets.backend]
kind = "pulumi"
stack = "prod"
binary = "$PWD/tests/pulumi_standin.py"
env = { PULUMI_BACKEND_URL = "file://$work/pulumi-$policy", PULUMI_CONFIG_PASSPHRASE = "bench", HOME = "$work" }
TOML
  mkdir -p "$work/pulumi-$policy"
done

# The Nomad stand-in, on a free loopback port.
nport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo bench-nomad-token > "$work/nomad-token"
python3 tests/nomad_standin.py "$nport" "$work/nomad-journal.jsonl" bench-nomad-token 2>"$work/nomad.err" &
for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$nport") 2>/dev/null && break; sleep 0.1; done
for policy in auto detect; do
  cat >> "$work/driftless.toml" <<TOML
[[targets]]
name = "nomad-$policy"
repo = "$work/remote.git"
path = "nomad"
policy = "$policy"
[targets.backend]
kind = "nomad"
address = "http://127.0.0.1:$nport"
token_file = "$work/nomad-token"
TOML
done

# moto, when it is there: one stack per policy.
cfn=""
if command -v moto_server >/dev/null; then
  cfn=yes
  mport=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  moto_server -H 127.0.0.1 -p "$mport" >"$work/moto.log" 2>&1 &
  for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$mport") 2>/dev/null && break; sleep 0.1; done
  export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_EC2_METADATA_DISABLED=true
  for policy in auto approval; do
    cat >> "$work/driftless.toml" <<TOML
[[targets]]
name = "cfn-$policy"
repo = "$work/remote.git"
path = "cfn-$policy"
policy = "$policy"
[targets.backend]
kind = "cloudformation"
stack_name = "bench-$policy"
template = "stack.json"
region = "us-east-1"
endpoint_url = "http://127.0.0.1:$mport"
TOML
  done
fi

now_ms() { date +%s%3N; }
# mean wall time in ms of running "$@" $rounds times
time_it() {
  local start end
  start=$(now_ms)
  for _ in $(seq "$rounds"); do "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; done
  end=$(now_ms)
  echo $(( (end - start) / rounds ))
}

"$bin" --config "$work/driftless.toml" tick tf app >/dev/null 2>&1   # converge once
tick_tf=$(time_it "$bin" --config "$work/driftless.toml" tick tf)

# The baseline: what the tick wraps, by hand, in a clone.
git clone -q "$work/remote.git" "$work/clone"
(cd "$work/clone/tf" && terraform init -input=false >/dev/null && terraform apply -auto-approve -input=false >/dev/null)
bare() {
  git -C "$work/clone" fetch -q origin main &&
  (cd "$work/clone/tf" && terraform apply -auto-approve -input=false -json >/dev/null)
}
base_tf=$(time_it bare)

# What a plan adds. The detect target's own checkout holds its (local)
# state: applied once by hand there, so its plans find no drift.
"$bin" --config "$work/driftless.toml" tick tfd >/dev/null 2>&1
(cd "$work/state/checkouts/tfd/tf" && terraform apply -auto-approve -input=false >/dev/null)
tick_detect=$(time_it "$bin" --config "$work/driftless.toml" tick tfd)
plan_tf=$(time_it "$bin" --config "$work/driftless.toml" plan tf)
peak_kib() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
rss_auto=$(peak_kib "$bin" --config "$work/driftless.toml" tick tf)
rss_detect=$(peak_kib "$bin" --config "$work/driftless.toml" tick tfd)
tick_app=$(time_it "$bin" --config "$work/driftless.toml" tick app)
# Per backend: converge both once (the approval one through its plan,
# approved in the database as a person would through the API), then time
# the no-op ticks.
declare -A plan_auto plan_review plan_rss_auto plan_rss_review
backends="exec ansible pulumi${cfn:+ cfn}"
# A setup tick whose failure stops the bench, saying why.
setup_tick() {
  "$bin" --config "$work/driftless.toml" tick "$1" >"$work/tick.log" 2>&1 ||
    { echo "bench: the setup tick of $1 failed:" >&2; tail -20 "$work/tick.log" >&2; exit 1; }
}
for b in $backends; do
  setup_tick "$b-auto"
  setup_tick "$b-approval"
  sqlite3 "$work/state/driftless.db" \
    "UPDATE deployments SET state = 'approved', decided_by = 'token:bench' WHERE target = '$b-approval' AND state = 'pending_approval'"
  setup_tick "$b-approval"
  plan_auto[$b]=$(time_it "$bin" --config "$work/driftless.toml" tick "$b-auto")
  plan_review[$b]=$(time_it "$bin" --config "$work/driftless.toml" tick "$b-approval")
  plan_rss_auto[$b]=$(peak_kib "$bin" --config "$work/driftless.toml" tick "$b-auto")
  plan_rss_review[$b]=$(peak_kib "$bin" --config "$work/driftless.toml" tick "$b-approval")
done
# Nomad: the auto target registers the job once; the detect target then
# plans it (no drift) on every tick.
"$bin" --config "$work/driftless.toml" tick nomad-auto >/dev/null
"$bin" --config "$work/driftless.toml" tick nomad-detect >/dev/null
nomad_auto=$(time_it "$bin" --config "$work/driftless.toml" tick nomad-auto)
nomad_detect=$(time_it "$bin" --config "$work/driftless.toml" tick nomad-detect)
nomad_rss_auto=$(peak_kib "$bin" --config "$work/driftless.toml" tick nomad-auto)
nomad_rss_detect=$(peak_kib "$bin" --config "$work/driftless.toml" tick nomad-detect)
base_git=$(time_it git -C "$work/clone" fetch -q origin main)

echo "== driftless bench ($rounds rounds each, mean wall time)"
printf '%-52s %6s ms\n' "no-op tick, terraform target" "$tick_tf"
printf '%-52s %6s ms\n' "git fetch + terraform apply (baseline)" "$base_tf"
awk -v a="$tick_tf" -v b="$base_tf" 'BEGIN { printf "%-52s %6.2f x\n", "  ratio tick / baseline", a / b }'
printf '%-52s %6s ms\n' "no-op tick, terraform target, policy detect (plan)" "$tick_detect"
awk -v a="$tick_detect" -v b="$tick_tf" 'BEGIN { printf "%-52s %6.2f x\n", "  ratio detect / auto tick", a / b }'
printf '%-52s %6s ms\n' "driftless plan, terraform target, no changes" "$plan_tf"
awk -v a="$plan_tf" -v b="$tick_tf" 'BEGIN { printf "%-52s %6.2f x\n", "  ratio plan / auto tick", a / b }'
printf '%-52s %6s KiB / %s KiB\n' "peak RSS (largest process), auto / detect tick" "$rss_auto" "$rss_detect"
printf '%-52s %6s ms\n' "no-op tick, exec target (digest unchanged)" "$tick_app"
printf '%-52s %6s ms\n' "git fetch alone (for scale)" "$base_git"
for b in $backends; do
  printf '%-52s %6s ms\n' "no-op tick, $b, policy auto" "${plan_auto[$b]}"
  printf '%-52s %6s ms\n' "no-op tick, $b, policy approval (plan, no changes)" "${plan_review[$b]}"
  awk -v a="${plan_review[$b]}" -v b="${plan_auto[$b]}" -v n="$b" 'BEGIN { printf "%-52s %6.2f x\n", "  ratio approval / auto tick", a / b }'
  printf '%-52s %6s KiB / %s KiB\n' "  peak RSS, auto / approval tick" "${plan_rss_auto[$b]}" "${plan_rss_review[$b]}"
done

printf '%-52s %6s ms\n' "no-op tick, nomad (stand-in), policy auto" "$nomad_auto"
printf '%-52s %6s ms\n' "no-op tick, nomad (stand-in), policy detect" "$nomad_detect"
awk -v a="$nomad_detect" -v b="$nomad_auto" 'BEGIN { printf "%-52s %6.2f x\n", "  ratio detect / auto tick", a / b }'
printf '%-52s %6s KiB / %s KiB\n' "  peak RSS, auto / detect tick" "$nomad_rss_auto" "$nomad_rss_detect"

# Idle RSS with 100 targets (exec, one repo, 1h interval).
{
  echo "state_dir = \"$work/state100\""
  echo "[server]"
  echo "listen = \"127.0.0.1:0\""
  for i in $(seq 100); do
    printf '[[targets]]\nname = "t%03d"\nrepo = "%s"\npath = "app"\ninterval = "1h"\n[targets.backend]\nkind = "exec"\napply = ["true"]\n' "$i" "$work/remote.git"
  done
} > "$work/hundred.toml"
"$bin" --config "$work/hundred.toml" serve 2>"$work/serve.log" &
pid=$!
# wait until all 100 first ticks are recorded
for _ in $(seq 600); do
  done_n=$("$bin" --config "$work/hundred.toml" status --json 2>/dev/null | grep -c '"last_result": "changed"' || true)
  [ "$done_n" -ge 100 ] && break
  sleep 0.2
done
sleep 3
rss_kb=$(awk '/VmRSS/ { print $2 }' "/proc/$pid/status")
threads=$(awk '/Threads/ { print $2 }' "/proc/$pid/status")
printf '%-52s %6s MiB (%s threads, %s/100 targets applied)\n' "daemon idle RSS, 100 targets" "$(( rss_kb / 1024 ))" "$threads" "$done_n"
kill "$pid"; wait "$pid" 2>/dev/null || true

# 6. At rest: the no-op tick against the bare git commands it replaces,
#    the processes it starts, 1,000 targets on one repository, the
#    database after 10,000 no-op ticks, the binary's size (bench/rest.sh).
DRIFTLESS_BIN=$bin bench/rest.sh
