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

# bench_github_push WORK SECRET: GitHub's own push payload, pointed at
# WORK/remote.git, in WORK/body.json; prints its X-Hub-Signature-256.
bench_github_push() {
  python3 - "$1" <<'PY'
import json, sys
work = sys.argv[1]
v = json.load(open("tests/fixtures/webhooks/github/push-branch.json"))
v["repository"]["clone_url"] = f"file://{work}/remote.git"
open(f"{work}/body.json", "w").write(json.dumps(v))
PY
  echo "sha256=$(openssl dgst -sha256 -hmac "$2" -r < "$1/body.json" | cut -d' ' -f1)"
}

# bench_push_lua WORK SIG: WORK/push.lua, a wrk script posting WORK/body.json
# signed SIG, each request with a delivery id of its own; a status other
# than 200/202 is written to stderr as `unexpected status N`.
bench_push_lua() {
  cat > "$1/push.lua" <<LUA
local f = assert(io.open("$1/body.json", "rb"))
local body = f:read("*a")
f:close()
local n = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
function init(args)
  wrk.method = "POST"
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
  wrk.headers["X-GitHub-Event"] = "push"
  wrk.headers["X-Hub-Signature-256"] = "$2"
end
function request()
  n = n + 1
  wrk.headers["X-GitHub-Delivery"] = string.format("bench-%s-%d-%d", tostring(tid), n, os.time())
  return wrk.format(nil, wrk.path)
end
function response(status, headers, body)
  if status ~= 202 and status ~= 200 then
    io.stderr:write("unexpected status " .. status .. "\n")
  end
end
LUA
}

# bench_exec_remote WORK: WORK/remote.git (pushed from WORK/src), holding an
# exec target's directory `app` (app/config) and 50 other files.
bench_exec_remote() {
  git init -q --bare -b main "$1/remote.git"
  git init -q -b main "$1/src"
  mkdir -p "$1/src/app" "$1/src/other"
  echo v1 > "$1/src/app/config"
  for i in $(seq 50); do head -c 2000 /dev/urandom | base64 > "$1/src/other/file$i.txt"; done
  git -C "$1/src" add -A && git -C "$1/src" commit -qm bench
  git -C "$1/src" push -q "$1/remote.git" main
}

# free_port: a TCP port on 127.0.0.1 nobody listens on now.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
