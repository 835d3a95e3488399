#!/usr/bin/env python3
"""A stand-in `pulumi` CLI for driftless's tests.

The Pulumi CLI cannot be installed here (its installers download from the
internet). This reproduces the documented behaviour of Pulumi CLI 3.x that
driftless's `pulumi` backend relies on:

  pulumi stack select --create [--secrets-provider P] [--non-interactive] --stack S
  pulumi up --yes --skip-preview [--refresh] --non-interactive --json --stack S
            [--config-file F]
  pulumi stack output --json --show-secrets=false --stack S
  pulumi destroy --yes --non-interactive [--skip-preview] --stack S
  pulumi version

- Login: the backend comes from PULUMI_BACKEND_URL (only file:// here) or
  ~/.pulumi/credentials.json; without either, a non-interactive command
  fails like the real CLI: "error: PULUMI_ACCESS_TOKEN must be set for login
  during non-interactive CLI sessions" (exit 255).
- The program is a Pulumi YAML program (Pulumi.yaml: `name`, `runtime: yaml`,
  `resources: {name: {type, properties}}`, `outputs`, with `${name.prop}` and
  `${pulumi.stack}` interpolation), of resources of one made-up type whose
  "cloud" is a JSON file next to the state (`<backend>/cloud.json`), so a test
  can change the world behind Pulumi's back (drift). A property
  `fail: message` makes the create/update fail.
- State lives where the filestate backend keeps it:
  <backend>/.pulumi/stacks/<project>/<stack>.json.
- `up --json` streams engine events, one JSON object per line, in the shape
  of sdk/go/common/apitype/events.go (`sequence`, `timestamp`, and one of
  `preludeEvent`, `resourcePreEvent`, `resOutputsEvent`, `diagnosticEvent`,
  `resOpFailedEvent`, `summaryEvent` whose `resourceChanges` counts steps by
  op: same, create, update, delete, replace). Without --refresh, changes made
  in the cloud are not noticed (as with the real CLI).
- Exit codes: 0 success, 255 failure (what the real CLI returns for
  `error:` results).

Every invocation is appended to $PULUMI_STANDIN_LOG (argv, cwd) if set.
"""

import json
import os
import re
import sys
import time

import yaml

seq = 0


def fail(msg, code=255):
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
        fail("PULUMI_ACCESS_TOKEN must be set for login during non-interactive CLI sessions")
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
                fail(f"flag needs an argument: {a}", 1)
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
        fail("no stack selected; pass --stack (non-interactive)")
    return s


def paths(proj, stack):
    b = backend_dir()
    return (os.path.join(b, ".pulumi", "stacks", proj["name"], f"{stack}.json"),
            os.path.join(b, "cloud.json"))


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


def cmd_stack_select(o):
    proj = project()
    stack = stack_name(o)
    state, _ = paths(proj, stack)
    if not os.path.exists(state):
        if not o.get("--create"):
            fail(f"no stack named '{stack}' found")
        save(state, {"stack": stack, "resources": {}, "outputs": {},
                     "secretsProvider": o.get("--secrets-provider", "passphrase")})
        print(f"Created stack '{stack}'")


def cmd_up(o):
    for need in ("--yes", "--skip-preview", "--non-interactive", "--json"):
        if need not in o:
            fail(f"the stand-in expects {need} (driftless always sends it)", 1)
    proj = project()
    stack = stack_name(o)
    state_path, cloud_path = paths(proj, stack)
    if not os.path.exists(state_path):
        fail(f"no stack named '{stack}' found")
    state = load(state_path, {})
    cloud = load(cloud_path, {})
    cfg = config(proj, stack, o)
    event("preludeEvent", {"config": {k: "[secret]" if isinstance(v, dict) else str(v)
                                      for k, v in cfg.items()}})
    res = state.get("resources", {})
    if o.get("--refresh") in (True, "true"):
        for name in list(res):
            u = urn(stack, proj, name, res[name]["type"])
            if u not in cloud:
                del res[name]
            else:
                res[name]["properties"] = cloud[u]
    env = {"pulumi.stack": stack, "pulumi.project": proj["name"]}
    env.update({k: v for k, v in cfg.items() if not isinstance(v, dict)})
    for k, v in cfg.items():
        if isinstance(v, dict) and "secure" in v:
            env[k] = v["secure"]
    desired = {}
    for name, r in (proj.get("resources") or {}).items():
        props = interpolate(r.get("properties") or {}, env)
        desired[name] = {"type": r.get("type", "test:index:Thing"), "properties": props}
        for k, v in props.items():
            env[f"{name}.{k}"] = v
    changes = {"same": 0, "create": 0, "update": 0, "delete": 0}
    failed = False
    for name, d in desired.items():
        u = urn(stack, proj, name, d["type"])
        old = res.get(name)
        op = "create" if old is None else "same" if old["properties"] == d["properties"] else "update"
        event("resourcePreEvent", {"metadata": {"op": op, "urn": u, "type": d["type"]}})
        if op != "same" and "fail" in d["properties"]:
            event("diagnosticEvent", {"urn": u, "prefix": "error: ", "color": "never",
                                      "severity": "error",
                                      "message": f"{name}: {d['properties']['fail']}\n"})
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
    if failed:
        sys.exit(255)


def cmd_output(o):
    if "--json" not in o:
        fail("the stand-in only implements `stack output --json`", 1)
    proj = project()
    stack = stack_name(o)
    state_path, _ = paths(proj, stack)
    if not os.path.exists(state_path):
        fail(f"no stack named '{stack}' found")
    state = load(state_path, {})
    show = o.get("--show-secrets") in (True, "true")
    out = {k: (v if show or k not in state.get("secretOutputs", []) else "[secret]")
           for k, v in state.get("outputs", {}).items()}
    print(json.dumps(out, indent=2))


def cmd_destroy(o):
    for need in ("--yes", "--non-interactive"):
        if need not in o:
            fail(f"the stand-in expects {need}", 1)
    proj = project()
    stack = stack_name(o)
    state_path, cloud_path = paths(proj, stack)
    state = load(state_path, {})
    cloud = load(cloud_path, {})
    n = 0
    for name, r in list(state.get("resources", {}).items()):
        cloud.pop(urn(stack, proj, name, r["type"]), None)
        n += 1
    state.update({"resources": {}, "outputs": {}})
    save(state_path, state)
    save(cloud_path, cloud)
    print(f"Resources:\n    - {n} deleted\n\nThe resources in the stack have been deleted")


def main():
    argv = sys.argv[1:]
    log = os.environ.get("PULUMI_STANDIN_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv, "cwd": os.getcwd()}) + "\n")
    if argv[:1] == ["version"]:
        print("v3.140.0")
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
    if pos[:1] == ["destroy"]:
        return cmd_destroy(o)
    fail(f"the stand-in does not implement `pulumi {' '.join(argv)}`", 1)


if __name__ == "__main__":
    main()
