#!/usr/bin/env python3
"""A stand-in `pulumi` CLI for driftless's tests.

The Pulumi CLI cannot be installed here (its installers download from the
internet). This reproduces what driftless's `pulumi` backend relies on from
Pulumi CLI 3.x as of v3.259 (pulumi/pulumi, August 2026), each behaviour
written from the file cited beside it:

  pulumi stack select --create [--secrets-provider P] [--non-interactive] --stack S
  pulumi up --yes --skip-preview [--refresh] --non-interactive --json --stack S
            [--config-file F]
  pulumi preview [--refresh] --non-interactive --json --stack S [--config-file F]
  pulumi stack output --json --show-secrets=false --stack S
  pulumi destroy --yes --non-interactive [--skip-preview] --stack S
  pulumi cancel --yes --non-interactive --stack S
  pulumi version

- Login: the backend comes from PULUMI_BACKEND_URL (only file:// here) or
  ~/.pulumi/credentials.json; without either, a non-interactive command
  fails like the real CLI: "error: PULUMI_ACCESS_TOKEN must be set for login
  during non-interactive CLI sessions" (backenderr.MissingEnvVarForNon-
  InteractiveError, exit 3).
- Exit codes (pkg/cmd/pulumi/cmd/exit_codes.go, ExitCodeFor, since v3.227):
  1 for a failed operation and anything unclassified, 2 for bad flags, 3
  for a missing login, 6 for a stack that does not exist.
- The program is a Pulumi YAML program (Pulumi.yaml: `name`, `runtime: yaml`,
  `resources: {name: {type, properties}}`, `outputs`, with `${name.prop}` and
  `${pulumi.stack}` interpolation), of resources of one made-up type whose
  "cloud" is a JSON file next to the state (`<backend>/cloud.json`), so a test
  can change the world behind Pulumi's back (drift). A property
  `fail: message` makes the create/update fail; `sleep: seconds` makes it
  take that long (so a test can kill an `up` mid-update).
- State lives where the DIY (filestate) backend keeps it:
  <backend>/.pulumi/stacks/<project>/<stack>.json. An `up` or `destroy`
  takes the stack's lock first (pkg/backend/diy/lock.go, Lock: a file
  <backend>/.pulumi/locks/organization/<project>/<stack>/<uuid>.json
  holding pid, username, hostname, timestamp) and removes it when it ends;
  a killed one leaves it, and every later update fails with checkForLock's
  message until `pulumi cancel` deletes the lock files
  (diy/backend.go, CancelCurrentUpdate).
- Secrets: a stack created without --secrets-provider uses the passphrase
  provider; creating one, and every `up`, `destroy` or `stack output` of
  one, needs PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE
  (pkg/secrets/passphrase/manager.go, readPassphrase: "passphrase must be
  set with PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE
  environment variables"), and a wrong one is "incorrect passphrase".
- `up --json` streams engine events, one JSON object per line, in the shape
  of sdk/go/common/apitype/events.go (`sequence`, `timestamp`, and one of
  `preludeEvent`, `resourcePreEvent`, `resOutputsEvent`, `diagnosticEvent`,
  `resOpFailedEvent`, `summaryEvent` whose `resourceChanges` counts steps by
  op: same, create, update, delete, replace). Diagnostic messages keep the
  engine's colour markup (`<{%reset%}>`, `<{%fg 1%}>`;
  pkg/backend/display/events.go, ConvertEngineEvent strips only ANSI
  codes). Without --refresh, changes made in the cloud are not noticed (as
  with the real CLI).
- `preview --json` prints one JSON document, not an event stream, unless
  PULUMI_ENABLE_STREAMING_JSON_PREVIEW is set (pkg/backend/display/
  display.go; ShowPreviewDigest in pkg/backend/display/json.go): the
  PreviewDigest of pkg/display/json.go — `config` (secrets blinded),
  `steps` [{op, urn, provider, oldState, newState, diffReasons,
  replaceReasons, detailedDiff}], `changeSummary` (count per op),
  `duration` (nanoseconds). Secret values show as "[secret]". It changes
  nothing and takes no lock. Like the real CLI's, the document is not
  byte-stable: the root `pulumi:pulumi:Stack` step comes first, every new
  state carries `created`/`modified` set at preview time, and the steps of
  independent resources come in a random order (the parallel step
  executor), dependents after what they name.
- A resource's `options: {replaceOnChanges: [prop, ...]}` (Pulumi YAML's
  resource option; the engine's applyReplaceOnChanges in
  pkg/resource/deploy/step_generator.go turns a diff of one of those
  properties into a replacement) makes that change a `replace` (a delete
  and a create) instead of an `update`, in preview and up alike.
- `preview --save-plan` and `up --plan` (update plans) are not modelled:
  in v3.259 `--save-plan` is marked [PREVIEW] and `up --plan`
  [EXPERIMENTAL], hidden unless PULUMI_EXPERIMENTAL is set
  (pkg/cmd/pulumi/operations/preview.go, up.go), so driftless does not
  use them.

Every invocation is appended to $PULUMI_STANDIN_LOG (argv, cwd) if set.
"""

import getpass
import hashlib
import json
import random
import os
import re
import socket
import sys
import time
import uuid
from datetime import datetime, timezone

import yaml

seq = 0


EXIT_ERROR, EXIT_CONFIG, EXIT_AUTH, EXIT_NO_STACK = 1, 2, 3, 6


def fail(msg, code=EXIT_ERROR):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def event(kind, body):
    global seq
    seq += 1
    print(json.dumps({"sequence": seq, "timestamp": int(time.time()), kind: body}), flush=True)


def backend_dir():
    url = os.environ.get("PULUMI_BACKEND_URL")
    if not url:
        creds = os.path.join(os.path.expanduser("~"), ".pulumi", "credentials.json")
        if os.path.exists(creds):
            with open(creds) as f:
                url = json.load(f).get("current")
    if not url:
        fail("PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions", EXIT_AUTH)
    if not url.startswith("file://"):
        fail(f"this stand-in only supports file:// backends, not {url}")
    return url[len("file://"):]


def opts(argv):
    """Flags as a dict; `--flag value`, `--flag=value` and bare `--flag`."""
    out, pos, i = {}, [], 0
    takes_value = {"--stack", "-s", "--config-file", "--secrets-provider", "--cwd", "-C"}
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif a in takes_value:
            if i + 1 >= len(argv):
                fail(f"flag needs an argument: {a}", EXIT_CONFIG)
            out[a] = argv[i + 1]
            i += 1
        elif a.startswith("-"):
            out[a] = True
        else:
            pos.append(a)
        i += 1
    return out, pos


def project():
    if not os.path.exists("Pulumi.yaml"):
        fail("no Pulumi.yaml project file found (searching upwards from "
             f"{os.getcwd()}). If you have not created a project yet, use `pulumi new` to do so")
    with open("Pulumi.yaml") as f:
        return yaml.safe_load(f) or {}


def stack_name(o):
    s = o.get("--stack") or o.get("-s")
    if not s:
        fail("no stack selected; specify a stack name with --stack", EXIT_NO_STACK)
    return s


def paths(proj, stack):
    b = backend_dir()
    return (os.path.join(b, ".pulumi", "stacks", proj["name"], f"{stack}.json"),
            os.path.join(b, "cloud.json"))


def lock_dir(proj, stack):
    # diy/lock.go, stackLockDir: .pulumi/locks/<fully qualified name>; a DIY
    # backend's stacks are organization/<project>/<stack>.
    return os.path.join(backend_dir(), ".pulumi", "locks", "organization", proj["name"], stack)


def take_lock(proj, stack):
    """diy/lock.go, Lock: refuse while another lock file exists."""
    d = lock_dir(proj, stack)
    others = sorted(os.listdir(d)) if os.path.isdir(d) else []
    if others:
        lines = [f"the stack is currently locked by {len(others)} lock(s). Either wait for the other "
                 "process(es) to end or delete the lock file with `pulumi cancel`."]
        for name in others:
            with open(os.path.join(d, name)) as f:
                l = json.load(f)
            url = "file://" + os.path.join(d, name)
            lines.append(f"  {url}: created by {l['username']}@{l['hostname']} (pid {l['pid']}) at {l['timestamp']}")
        fail("\n".join(lines))
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{uuid.uuid4()}.json")
    with open(path, "w") as f:
        json.dump({"pid": os.getpid(), "username": getpass.getuser(), "hostname": socket.gethostname(),
                   # Go's time.RFC3339 of a UTC time
                   "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}, f)
    return path


def passphrase(state):
    """passphrase/manager.go, readPassphrase (non-interactive)."""
    if state.get("secretsProvider", "passphrase") != "passphrase":
        return
    phrase = os.environ.get("PULUMI_CONFIG_PASSPHRASE")
    if phrase is None and os.environ.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
        try:
            with open(os.environ["PULUMI_CONFIG_PASSPHRASE_FILE"]) as f:
                phrase = f.read().strip()
        except OSError as e:
            fail(f"unable to read PULUMI_CONFIG_PASSPHRASE_FILE: {e}")
    if phrase is None:
        fail("passphrase must be set with PULUMI_CONFIG_PASSPHRASE or "
             "PULUMI_CONFIG_PASSPHRASE_FILE environment variables")
    digest = hashlib.sha256(phrase.encode()).hexdigest()
    if state.setdefault("encryptionsalt", digest) != digest:
        fail("incorrect passphrase")


def load(path, default):
    if not os.path.exists(path):
        return default
    with open(path) as f:
        return json.load(f)


def save(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def config(proj, stack, o):
    path = o.get("--config-file") or f"Pulumi.{stack}.yaml"
    data = {}
    if os.path.exists(path):
        with open(path) as f:
            data = (yaml.safe_load(f) or {}).get("config", {}) or {}
    return {k.split(":", 1)[-1]: v for k, v in data.items()}


def interpolate(v, env):
    if isinstance(v, str):
        return re.sub(r"\$\{([^}]+)\}", lambda m: str(env.get(m.group(1), m.group(0))), v)
    if isinstance(v, dict):
        return {k: interpolate(x, env) for k, x in v.items()}
    if isinstance(v, list):
        return [interpolate(x, env) for x in v]
    return v


def urn(stack, proj, name, typ):
    return f"urn:pulumi:{stack}::{proj['name']}::{typ}::{name}"


def open_stack(o, needs=(), why=" (driftless always sends it)"):
    """The flags a command insists on, then the stack's state, unlocked by
    its passphrase: (project, stack, state path, cloud path, state)."""
    for need in needs:
        if need not in o:
            fail(f"the stand-in expects {need}{why}", EXIT_CONFIG)
    proj = project()
    stack = stack_name(o)
    state_path, cloud_path = paths(proj, stack)
    if not os.path.exists(state_path):
        fail(f"no stack named '{stack}' found", EXIT_NO_STACK)
    state = load(state_path, {})
    passphrase(state)
    return proj, stack, state_path, cloud_path, state


def cmd_stack_select(o):
    proj = project()
    stack = stack_name(o)
    state, _ = paths(proj, stack)
    if not os.path.exists(state):
        if not o.get("--create"):
            fail(f"no stack named '{stack}' found", EXIT_NO_STACK)
        new = {"stack": stack, "resources": {}, "outputs": {},
               "secretsProvider": o.get("--secrets-provider", "passphrase")}
        passphrase(new)
        save(state, new)
        print(f"Created stack '{stack}'")


def cmd_up(o):
    proj, stack, state_path, cloud_path, state = open_stack(
        o, ("--yes", "--skip-preview", "--non-interactive", "--json"))
    lock = take_lock(proj, stack)
    cloud = load(cloud_path, {})
    cfg = config(proj, stack, o)
    event("preludeEvent", {"config": {k: "[secret]" if isinstance(v, dict) else str(v)
                                      for k, v in cfg.items()}})
    res = state.get("resources", {})
    if o.get("--refresh") in (True, "true"):
        refresh(res, cloud, stack, proj)
    env, _ = program_env(stack, proj, cfg)
    desired = desired_resources(proj, env)
    changes = {"same": 0, "create": 0, "update": 0, "delete": 0, "replace": 0}
    failed = False
    for name, d in desired.items():
        u = urn(stack, proj, name, d["type"])
        old = res.get(name)
        op = step_op(proj, name, old, d)
        event("resourcePreEvent", {"metadata": {"op": op, "urn": u, "type": d["type"]}})
        if op != "same" and "sleep" in d["properties"]:
            time.sleep(float(d["properties"]["sleep"]))
        if op != "same" and "fail" in d["properties"]:
            # The engine's diagnostics carry its colour markup (diag/colors).
            event("diagnosticEvent", {"urn": u, "prefix": "<{%fg 1%}>error: <{%reset%}>", "color": "raw",
                                      "severity": "error",
                                      "message": f"<{{%reset%}}>{name}: <{{%fg 1%}}>{d['properties']['fail']}<{{%reset%}}>\n"})
            event("resOpFailedEvent", {"metadata": {"op": op, "urn": u, "type": d["type"]},
                                       "status": 1, "steps": 1})
            failed = True
            continue
        if op != "same":
            cloud[u] = d["properties"]
            res[name] = d
        changes[op] += 1
        event("resOutputsEvent", {"metadata": {"op": op, "urn": u, "type": d["type"]}})
    for name in [n for n in res if n not in desired]:
        u = urn(stack, proj, name, res[name]["type"])
        cloud.pop(u, None)
        del res[name]
        changes["delete"] += 1
        event("resOutputsEvent", {"metadata": {"op": "delete", "urn": u}})
    outputs = interpolate(proj.get("outputs") or {}, env)
    secret_outputs = [k for k, v in (proj.get("outputs") or {}).items()
                      if isinstance(v, str) and any(f"${{{s}}}" in v for s in cfg if isinstance(cfg[s], dict))]
    state.update({"resources": res, "outputs": outputs, "secretOutputs": secret_outputs})
    save(state_path, state)
    save(cloud_path, cloud)
    event("summaryEvent", {"maybeCorrupt": False, "durationSeconds": 0,
                           "resourceChanges": {k: v for k, v in changes.items() if v},
                           "policyPacks": {}})
    os.remove(lock)
    if failed:
        sys.exit(EXIT_ERROR)


def refresh(res, cloud, stack, proj):
    """What the cloud has now replaces the state's view (`--refresh`)."""
    for name in list(res):
        u = urn(stack, proj, name, res[name]["type"])
        if u not in cloud:
            del res[name]
        else:
            res[name]["properties"] = cloud[u]


def program_env(stack, proj, cfg):
    """The values a program's `${...}` see, and the secret ones among them."""
    env = {"pulumi.stack": stack, "pulumi.project": proj["name"]}
    env.update({k: v for k, v in cfg.items() if not isinstance(v, dict)})
    secrets = []
    for k, v in cfg.items():
        if isinstance(v, dict) and "secure" in v:
            env[k] = v["secure"]
            secrets.append(str(v["secure"]))
    return env, secrets


def desired_resources(proj, env):
    desired = {}
    for name, r in (proj.get("resources") or {}).items():
        props = interpolate(r.get("properties") or {}, env)
        desired[name] = {"type": r.get("type", "test:index:Thing"), "properties": props}
        for k, v in props.items():
            env[f"{name}.{k}"] = v
    return desired


def changed_keys(old, new):
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def step_op(proj, name, old, d):
    if old is None:
        return "create"
    if old["properties"] == d["properties"]:
        return "same"
    opts_ = ((proj.get("resources") or {}).get(name) or {}).get("options") or {}
    forcing = set(opts_.get("replaceOnChanges") or [])
    if forcing & set(changed_keys(old["properties"], d["properties"])):
        return "replace"
    return "update"


def cmd_preview(o):
    proj, stack, state_path, cloud_path, state = open_stack(o, ("--non-interactive", "--json"))
    cloud = load(cloud_path, {})
    cfg = config(proj, stack, o)
    res = json.loads(json.dumps(state.get("resources", {})))
    if o.get("--refresh") in (True, "true"):
        refresh(res, cloud, stack, proj)
    env, secrets = program_env(stack, proj, cfg)
    desired = desired_resources(proj, env)
    steps, summary = [], {}

    # The time of this preview, as the new states carry it: `created` and
    # `modified` of a resource state are written by stack.SerializeResource
    # (pkg/backend/display/json.go, stateForJSONOutput passes s.Created and
    # s.Modified), and a step's new state gets them when the preview runs.
    now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9:09d}Z"

    def resource_v3(u, typ, props, stamp=None):
        r = {"urn": u, "custom": True, "type": typ, "inputs": props, "outputs": props}
        if stamp:
            r["created"] = stamp
            r["modified"] = stamp
        return r

    # The root stack resource comes first (the program registers it before
    # anything else): created by the first update, the same after.
    root = urn(stack, proj, f"{proj['name']}-{stack}", "pulumi:pulumi:Stack")
    root_op = "same" if state.get("resources") else "create"
    summary[root_op] = 1
    steps.append({"op": root_op, "urn": root, "provider": "", "detailedDiff": None,
                  "newState": resource_v3(root, "pulumi:pulumi:Stack", {}, now)})

    changes = []
    for name, d in desired.items():
        u = urn(stack, proj, name, d["type"])
        old = res.get(name)
        op = step_op(proj, name, old, d)
        summary[op] = summary.get(op, 0) + 1
        step = {"op": op, "urn": u, "provider": "", "detailedDiff": None,
                "newState": resource_v3(u, d["type"], d["properties"], now)}
        if old is not None:
            step["oldState"] = resource_v3(u, old["type"], old["properties"])
        if op == "update":
            step["diffReasons"] = changed_keys(old["properties"], d["properties"])
        if op == "replace":
            step["replaceReasons"] = changed_keys(old["properties"], d["properties"])
        changes.append((name, step))
    # The engine's step executor runs the steps of resources that do not
    # depend on each other in parallel, and ShowPreviewDigest appends each
    # as its ResourcePreEvent arrives: in no fixed order, but never before
    # the resources it depends on (pkg/resource/deploy/step_executor.go).
    # So: a random order that keeps each resource after those its
    # properties name (`${other.prop}`).
    raw = proj.get("resources") or {}

    def needs(name):
        text = json.dumps(raw.get(name, {}).get("properties") or {})
        return {n for n in desired if n != name and "${" + n + "." in text}

    pending = dict(changes)
    while pending:
        ready = [n for n in pending if not (needs(n) & set(pending))]
        pick = random.choice(ready or list(pending))
        steps.append(pending.pop(pick))
    deletes = [n for n in res if n not in desired]
    random.shuffle(deletes)
    for name in deletes:
        u = urn(stack, proj, name, res[name]["type"])
        summary["delete"] = summary.get("delete", 0) + 1
        steps.append({"op": "delete", "urn": u, "provider": "", "detailedDiff": None,
                      "oldState": resource_v3(u, res[name]["type"], res[name]["properties"])})
    digest = {"config": {k: "[secret]" if isinstance(v, dict) else str(v) for k, v in cfg.items()},
              "steps": steps, "duration": int(time.time() * 1e9) % 1000000007,
              "changeSummary": summary}
    text = json.dumps(digest, indent=4)
    for secret in secrets:
        text = text.replace(secret, "[secret]")
    print(text)


def cmd_output(o):
    if "--json" not in o:
        fail("the stand-in only implements `stack output --json`", EXIT_CONFIG)
    _, _, _, _, state = open_stack(o)
    show = o.get("--show-secrets") in (True, "true")
    out = {k: (v if show or k not in state.get("secretOutputs", []) else "[secret]")
           for k, v in state.get("outputs", {}).items()}
    print(json.dumps(out, indent=2))


def cmd_destroy(o):
    proj, stack, state_path, cloud_path, state = open_stack(o, ("--yes", "--non-interactive"), "")
    lock = take_lock(proj, stack)
    cloud = load(cloud_path, {})
    n = 0
    for name, r in list(state.get("resources", {}).items()):
        cloud.pop(urn(stack, proj, name, r["type"]), None)
        n += 1
    state.update({"resources": {}, "outputs": {}})
    save(state_path, state)
    save(cloud_path, cloud)
    os.remove(lock)
    print(f"Resources:\n    - {n} deleted\n\nThe resources in the stack have been deleted")


def cmd_cancel(o):
    """diy/backend.go, CancelCurrentUpdate: delete every lock file."""
    proj = project()
    stack = stack_name(o)
    d = lock_dir(proj, stack)
    for name in (os.listdir(d) if os.path.isdir(d) else []):
        os.remove(os.path.join(d, name))
    print(f"The currently running update for '{stack}' has been canceled!")


def main():
    argv = sys.argv[1:]
    log = os.environ.get("PULUMI_STANDIN_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv, "cwd": os.getcwd()}) + "\n")
    if argv[:1] == ["version"]:
        print("v3.259.0")
        return
    o, pos = opts(argv)
    if "--cwd" in o or "-C" in o:
        os.chdir(o.get("--cwd") or o.get("-C"))
    if pos[:2] == ["stack", "select"]:
        return cmd_stack_select(o)
    if pos[:2] == ["stack", "output"]:
        return cmd_output(o)
    if pos[:1] == ["up"]:
        return cmd_up(o)
    if pos[:1] == ["preview"]:
        return cmd_preview(o)
    if pos[:1] == ["destroy"]:
        return cmd_destroy(o)
    if pos[:1] == ["cancel"]:
        return cmd_cancel(o)
    fail(f"the stand-in does not implement `pulumi {' '.join(argv)}`", EXIT_CONFIG)


if __name__ == "__main__":
    main()
