#!/usr/bin/env python3
"""A stand-in for Nomad's HTTP API, on 127.0.0.1, for driftless's tests.

    nomad_standin.py PORT JOURNAL [TOKEN [CERT KEY CLIENT_CA]]

No Nomad binary can be installed here. This serves the part of Nomad's HTTP
API that driftless's `nomad` backend uses, written from Nomad's own source
(hashicorp/nomad, main as of 2026-08; the files and functions are cited next
to each behaviour below) and its API documentation
(https://developer.hashicorp.com/nomad/api-docs), with Nomad's status codes
and text/plain error bodies. What it models, and what it leaves out, is in
the guide's stand-ins chapter (docs/stand-ins.md).

  POST /v1/jobs/parse              HCL -> job JSON (a jobspec subset, parsed
                                   with python-hcl2); authorised in ?namespace=
  GET  /v1/job/:id                 the job; 404 "job not found"
  POST /v1/job/:id/plan            {Job, Diff} -> {JobModifyIndex, Diff
                                   (contextual, as Nomad's), ...}
  POST /v1/jobs, /v1/job/:id       register with EnforceIndex CAS and
                                   PreserveCounts; creates an evaluation,
                                   which may create a deployment
  GET  /v1/job/:id/deployment      the latest deployment, or null
  GET  /v1/job/:id/deployments     the job's deployments
  GET  /v1/job/:id/allocations     the job's allocations (stubs)
  GET  /v1/job/:id/summary         per group: Complete, Failed, Running, ...
  GET  /v1/evaluation/:id          one evaluation
  PUT  /v1/deployment/promote/:id  promote a deployment's canaries
  POST /v1/job/:id/dispatch        dispatch a parameterized job
  DELETE /v1/job/:id               deregister (purge=true removes)

Every answer carries X-Nomad-Index but /v1/jobs/parse's: JobsParseRequest
(command/agent/job_endpoint.go) returns the job without setting an index.

Test controls (not Nomad's), under /_standin/:
  GET  journal                     every API request so far, in order
  GET  arrived                     {method, path} of every request as it
                                   arrives, before any delay
  GET  jobs                        every job, dispatched children included
  POST acl_token {SecretID, Namespaces: {ns: policy | [capabilities]}}
                                   a token limited to those namespaces
  POST edit {Namespace, ID, Path: [..], Value}  a manual change to a live job
  POST scale {Namespace, ID, Group, Count}      what an autoscaler does
  POST canaries {Namespace, ID, Healthy}
                                   the latest deployment's canaries: this
                                   many healthy per canary group (auto_promote
                                   groups are then promoted by Nomad)
  POST deployment {Namespace, ID, Status, Description}
                                   drive the latest deployment (Nomad's
                                   deployment watcher: success marks the
                                   version stable, failure auto-reverts)
  POST after_plan {Action: "edit"|"scale", ...} run that control right after
                                   answering the next plan (the CAS window)
  POST hook_outcome {ID, Status}   how instances dispatched from the
                                   parameterized job ID end: complete (the
                                   default), failed, failed_then_complete,
                                   or running (until a later hook_outcome)
  POST gc {}                       garbage-collect dead dispatched jobs
  POST eval_delay {Seconds}        evaluations stay pending this long (the
                                   scheduler is asynchronous): no deployment
                                   exists until the evaluation is processed
  POST eval_on_read {On}           evaluations are processed only when one is
                                   read (GET /v1/evaluation/:id): the
                                   scheduler writes the plan with its
                                   deployment, then marks the evaluation
                                   complete (scheduler/generic_sched.go,
                                   GenericScheduler.Process: the plan is
                                   submitted in `process`, then
                                   setStatus(EvalStatusComplete)), between
                                   a client's
                                   read of the deployments and of the
                                   evaluation
  POST delay {Path, Method, Seconds}  sleep before answering matching
                                   requests (the request still runs)
  POST fail {Path, Status, Body, Times}  answer the next Times requests whose
                                   path matches with Status/Body
"""

import copy
import json
import re
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

import hcl2

PORT, JOURNAL = int(sys.argv[1]), sys.argv[2]
TOKEN = sys.argv[3] if len(sys.argv) > 3 else None
TLS = sys.argv[4:7] if len(sys.argv) > 6 else None

lock = threading.Lock()
index = 10
jobs = {}          # (ns, id) -> job dict (with server fields)
versions = {}      # (ns, id) -> [job dicts], oldest first (Nomad keeps versions)
deployments = {}   # (ns, id) -> [deployment dicts], oldest first
evals = {}         # eval id -> evaluation dict (+ "_due")
allocs = {}        # (ns, job id) -> [allocation stubs]
after_plan = []    # controls to run after the next plan
failures = []      # {Path, Status, Body, Times}
delays = []        # {Path, Method, Seconds}: sleep before answering
hook_outcomes = {} # parameterized job ID -> complete | failed | failed_then_complete | running
eval_delay = [0.0]
# Evaluations processed only when one is read: the scheduler finishes an
# evaluation — its deployment first, then the evaluation marked complete —
# exactly between a client's read of the deployments and its read of the
# evaluation.
eval_on_read = [False]
journal = []
arrived = []       # {method, path} as requests arrive, before any delay
# ACL tokens: secret -> "management" | {namespace glob: set of capabilities}
tokens = {TOKEN: "management"} if TOKEN is not None else {}

SERVER_FIELDS = {"Version", "JobModifyIndex", "ModifyIndex", "CreateIndex",
                 "Status", "SubmitTime", "Stable", "Stop"}


def next_index():
    global index
    index += 1
    return index


# ---------------------------------------------------------------- ACLs

# acl/policy.go, expandNamespacePolicy: what `policy = "read" | "write"`
# grants in a namespace (the capabilities driftless's calls need).
READ_CAPS = {"list-jobs", "parse-job", "read-job", "read-job-scaling",
             "list-scaling-policies", "read-scaling-policy"}
WRITE_CAPS = READ_CAPS | {"scale-job", "submit-job", "dispatch-job", "read-logs",
                          "read-fs", "alloc-exec", "alloc-lifecycle"}


class Denied(Exception):
    """structs/errors.go: errPermissionDenied / errTokenNotFound, both 403
    (command/agent/http.go, errCodeFromHandler)."""


def allow(secret, namespace, *any_of):
    """acl.ACL.AllowNsOpAnyOf: does the token hold one of `any_of` in
    `namespace`? ACLs are off when the stand-in was started without TOKEN."""
    if TOKEN is None:
        return
    if secret is None or secret not in tokens:
        # An unknown secret is resolved to no token at all.
        raise Denied("ACL token not found" if secret else "Permission denied")
    policy = tokens[secret]
    if policy == "management":
        return
    for pattern, caps in policy.items():
        if re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), namespace) and caps & set(any_of):
            return
    raise Denied("Permission denied")


def expand(policy):
    if isinstance(policy, list):
        return set(policy)
    return {"read": READ_CAPS, "write": WRITE_CAPS}.get(policy, set())


# ---------------------------------------------------------------- parsing

class ParseError(Exception):
    pass


def unq(v, variables):
    """python-hcl2 keeps string quotes; strip them and expand ${var.x}."""
    if isinstance(v, str):
        if len(v) >= 2 and v[0] == '"' and v[-1] == '"':
            v = v[1:-1]
        def sub(m):
            name = m.group(1)
            if name not in variables:
                raise ParseError(f'Unknown variable: There is no variable named "{name}".')
            return str(variables[name])
        v = re.sub(r"\$\{var\.([A-Za-z0-9_-]+)\}", sub, v)
        return v
    if isinstance(v, list):
        return [unq(x, variables) for x in v]
    if isinstance(v, dict):
        return {k: unq(x, variables) for k, x in v.items() if k != "__is_block__"}
    return v


def blocks(body, name):
    """Labeled blocks as [(label, body)]; unlabeled as [(None, body)]."""
    out = []
    for b in body.get(name, []) or []:
        keys = [k for k in b if k != "__is_block__"]
        if len(keys) == 1 and isinstance(b[keys[0]], dict) and keys[0].startswith('"'):
            out.append((keys[0].strip('"'), b[keys[0]]))
        else:
            out.append((None, b))
    return out


def one(body, name, variables):
    bs = blocks(body, name)
    return unq(bs[0][1], variables) if bs else None


def update_strategy(u):
    """An `update` block as api.UpdateStrategy, with UpdateStrategy.Canonicalize's
    defaults (api/jobs.go, DefaultUpdateStrategy)."""
    if u is None:
        return None
    return {
        "Stagger": 30000000000, "MaxParallel": int(u.get("max_parallel", 1)),
        "HealthCheck": u.get("health_check", "checks"),
        "MinHealthyTime": 10000000000, "HealthyDeadline": 300000000000,
        "ProgressDeadline": 600000000000,
        "AutoRevert": bool(u.get("auto_revert", False)),
        "AutoPromote": bool(u.get("auto_promote", False)),
        "Canary": int(u.get("canary", 0)),
    }


def hcl_literal(v):
    """A quoted HCL string from a var file as the value it stands for:
    python-hcl2 keeps the quotes and the escapes, Nomad's HCL reads them
    (hashicorp/hcl hclsyntax/spec.md: \\n \\r \\t \\" \\\\ \\uNNNN, and
    $${ / %%{ for a literal ${ / %{)."""
    if not (isinstance(v, str) and len(v) >= 2 and v[0] == '"' and v[-1] == '"'):
        return unq(v, {})
    v, out, i = v[1:-1], [], 0
    while i < len(v):
        c = v[i]
        if c == "\\" and i + 1 < len(v):
            n = v[i + 1]
            if n == "u" and i + 5 < len(v):
                out.append(chr(int(v[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append({"n": "\n", "r": "\r", "t": "\t"}.get(n, n))
            i += 2
        elif c in "$%" and v[i + 1:i + 3] == c + "{":
            out.append(c + "{")
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def duplicate_attribute(text):
    """The first top-level attribute a var file sets twice: HCL refuses it
    (hashicorp/hcl hclsyntax/parser.go, "Attribute redefined")."""
    seen = set()
    for line in text.splitlines():
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_-]*)\s*=(?!=)", line)
        if m:
            if m.group(1) in seen:
                return m.group(1)
            seen.add(m.group(1))
    return None


def parse_job(hcl, vars_text, canonicalize=True):
    variables = {}
    if vars_text:
        dup = duplicate_attribute(vars_text)
        if dup:
            raise ParseError(
                f'input.hcl: Attribute redefined; The argument "{dup}" was already set. '
                "Each argument may be set only once.")
        try:
            # A variable the job does not declare is a warning only: the
            # parse endpoint is not Strict (jobspec2/types.variables.go).
            for k, v in hcl2.loads(vars_text).items():
                variables[k] = hcl_literal(v)
        except Exception as e:  # noqa: BLE001 - any parser error is a 400
            raise ParseError(f"variables: {e}")
    try:
        doc = hcl2.loads(hcl)
    except Exception as e:  # noqa: BLE001
        raise ParseError(str(e).splitlines()[0] if str(e) else "invalid HCL")
    for label, body in blocks(doc, "variable"):
        if label not in variables:
            d = body.get("default")
            if d is None:
                raise ParseError(f'No value for required variable "{label}"')
            variables[label] = unq(d, {})
    js = blocks(doc, "job")
    if len(js) != 1 or js[0][0] is None:
        raise ParseError("exactly one labeled job block is required")
    jid, body = js[0]
    jtype = unq(body.get("type", "service"), variables)
    job_update = update_strategy(one(body, "update", variables))
    # api/jobs.go, Job.Canonicalize: service and system jobs without an
    # `update` block get DefaultUpdateStrategy (MaxParallel 1).
    if canonicalize and job_update is None and jtype in ("service", "system"):
        job_update = update_strategy({})
    groups = []
    for gname, g in blocks(body, "group"):
        if gname is None:
            raise ParseError("group block needs a name")
        scaling = one(g, "scaling", variables)
        tasks = []
        for tname, t in blocks(g, "task"):
            templates = [{
                "EmbeddedTmpl": unq(tb.get("data", ""), variables),
                "DestPath": unq(tb.get("destination", ""), variables),
                "ChangeMode": unq(tb.get("change_mode", "restart"), variables),
            } for _, tb in blocks(t, "template")]
            artifacts = [{
                "GetterSource": unq(ab.get("source", ""), variables),
                "RelativeDest": unq(ab.get("destination", "local/"), variables),
                "GetterOptions": one(ab, "options", variables),
            } for _, ab in blocks(t, "artifact")]
            tasks.append({
                "Name": tname,
                "Driver": unq(t.get("driver", ""), variables),
                "Config": one(t, "config", variables) or {},
                "Env": one(t, "env", variables),
                "Meta": one(t, "meta", variables),
                "Templates": templates or None,
                "Artifacts": artifacts or None,
            })
        # api/tasks.go, TaskGroup.Canonicalize: the job's update strategy is
        # merged into each group's (the group's own keys win).
        group_block = one(g, "update", variables)
        group_update = update_strategy(group_block)
        if job_update is not None:
            group_update = dict(job_update)
            for hcl_key, field in (("max_parallel", "MaxParallel"), ("auto_revert", "AutoRevert"),
                                   ("canary", "Canary"), ("auto_promote", "AutoPromote")):
                if group_block and hcl_key in group_block:
                    group_update[field] = update_strategy(group_block)[field]
        groups.append({
            "Name": gname,
            "Count": unq(g.get("count", 1), variables),
            "Meta": one(g, "meta", variables),
            "Update": group_update,
            "Scaling": None if scaling is None else {
                "Enabled": scaling.get("enabled", True),
                "Min": scaling.get("min", unq(g.get("count", 1), variables)),
                "Max": scaling.get("max"),
                "Type": "horizontal",
            },
            "Tasks": tasks,
        })
    param = one(body, "parameterized", variables)
    periodic = one(body, "periodic", variables)
    return {
        "ID": jid,
        "Name": jid,
        # Canonicalize fills in the default namespace; without it a file
        # that names none gives null (the other defaults are always filled
        # in here: driftless reads only Namespace from such a parse).
        "Namespace": unq(body["namespace"], variables) if "namespace" in body
        else ("default" if canonicalize else None),
        "Region": unq(body.get("region", "global"), variables),
        "Type": jtype,
        "Priority": unq(body.get("priority", 50), variables),
        "Datacenters": unq(body.get("datacenters", ["*"]), variables),
        "Meta": one(body, "meta", variables),
        "Update": job_update,
        "Periodic": None if periodic is None else {
            "Enabled": periodic.get("enabled", True), "Spec": periodic.get("crons", periodic.get("cron")),
        },
        "ParameterizedJob": None if param is None else {
            "Payload": param.get("payload", "optional"),
            "MetaRequired": param.get("meta_required"),
            "MetaOptional": param.get("meta_optional"),
        },
        "TaskGroups": groups,
    }


# ---------------------------------------------------------------- diffs
#
# nomad/structs/diff.go, Job.Diff(other, contextual=true) as Job.Plan calls
# it (nomad/job_endpoint.go, Plan): job, group and task primitive fields are
# listed only when they changed, but inside an object that changed
# (configDiff, templateDiff, primitiveObjectDiff ...) every field is listed,
# the unchanged ones with Type "None" and their values (fieldDiff with
# contextual = true). Maps are flattened as `Meta[k]`, `Env[k]`, lists as
# `args[0]`, nested maps as `auth[0][password]` (helper/flatmap).

def spec(job):
    return {k: v for k, v in job.items() if k not in SERVER_FIELDS}


def s(v):
    return "" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(v).lower() if isinstance(v, bool) else str(v))


def flatten(v, prefix=""):
    """helper/flatmap.Flatten for driver config: lists as [i], maps as [k]."""
    out = {}
    if isinstance(v, dict):
        for k, x in v.items():
            name = f"{prefix}[{k}]" if prefix else k
            out.update(flatten(x, name))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            out.update(flatten(x, f"{prefix}[{i}]"))
    else:
        out[prefix] = s(v)
    return out


def field_diffs(old, new, skip=(), contextual=False):
    """Primitive fields and flattened maps (Meta[k], Env[k])."""
    out = []
    old, new = old or {}, new or {}
    for k in sorted(set(old) | set(new)):
        if k in skip:
            continue
        o, n = old.get(k), new.get(k)
        if isinstance(o, dict) or isinstance(n, dict):
            if k in ("Meta", "Env"):
                for mk in sorted(set(o or {}) | set(n or {})):
                    mo, mn = (o or {}).get(mk), (n or {}).get(mk)
                    d = fd(f"{k}[{mk}]", mo, mn, contextual)
                    if d:
                        out.append(d)
            continue
        d = fd(k, o, n, contextual)
        if d:
            out.append(d)
    return out


def fd(name, o, n, contextual=False):
    """structs/diff.go, fieldDiff."""
    so, sn = s(o), s(n)
    if so == sn:
        if not contextual:
            return None
        return {"Type": "None", "Name": name, "Old": so, "New": sn, "Annotations": None}
    t = "Added" if so == "" else "Deleted" if sn == "" else "Edited"
    return {"Type": t, "Name": name, "Old": so, "New": sn, "Annotations": None}


def object_diff(name, o, n, flat=False):
    """structs/diff.go, primitiveObjectDiff / configDiff: contextual."""
    if o == n:
        return None
    t = "Added" if not o else "Deleted" if not n else "Edited"
    if flat:
        fo, fn = flatten(o or {}), flatten(n or {})
        fields = [d for d in (fd(k, fo.get(k), fn.get(k), True) for k in sorted(set(fo) | set(fn))) if d]
    else:
        fields = field_diffs(o, n, contextual=True)
    return {"Type": t, "Name": name, "Fields": fields, "Objects": None}


def named(items):
    return {i["Name"]: i for i in (items or [])}


def task_diff(o, n):
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    fields = field_diffs(o, n, skip=("Name", "Config", "Templates", "Artifacts"))
    objects = []
    c = object_diff("Config", (o or {}).get("Config"), (n or {}).get("Config"), flat=True)
    if c:
        objects.append(c)
    ot, nt = (o or {}).get("Templates") or [], (n or {}).get("Templates") or []
    for i in range(max(len(ot), len(nt))):
        d = object_diff("Template", ot[i] if i < len(ot) else None, nt[i] if i < len(nt) else None, flat=True)
        if d:
            objects.append(d)
    # primitiveObjectSetDiff: artifacts are a set; a changed one is the old
    # one Deleted and the new one Added, each with every field.
    oa = [json.dumps(a, sort_keys=True) for a in ((o or {}).get("Artifacts") or [])]
    na = [json.dumps(a, sort_keys=True) for a in ((n or {}).get("Artifacts") or [])]
    for a in oa:
        if a not in na:
            objects.append(object_diff("Artifact", json.loads(a), None, flat=True))
    for a in na:
        if a not in oa:
            objects.append(object_diff("Artifact", None, json.loads(a), flat=True))
    if t == "Edited" and not fields and not objects:
        return None
    return {"Type": t, "Name": (n or o)["Name"], "Fields": fields, "Objects": objects or None,
            "Annotations": None}


def group_diff(o, n):
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    fields = field_diffs(o, n, skip=("Name", "Tasks", "Scaling", "Update"))
    objects = []
    sc = object_diff("Scaling", (o or {}).get("Scaling"), (n or {}).get("Scaling"))
    if sc:
        objects.append(sc)
    up = object_diff("Update", (o or {}).get("Update"), (n or {}).get("Update"))
    if up:
        objects.append(up)
    ot, nt = named((o or {}).get("Tasks")), named((n or {}).get("Tasks"))
    tasks = [d for d in (task_diff(ot.get(k), nt.get(k)) for k in sorted(set(ot) | set(nt))) if d]
    if t == "Edited" and not fields and not objects and not tasks:
        return None
    return {"Type": t, "Name": (n or o)["Name"], "Fields": fields, "Objects": objects or None,
            "Tasks": tasks, "Updates": None}


def job_diff(old, new):
    o = spec(old) if old else None
    n = spec(new)
    if old and old.get("Stop"):
        # nomad/structs/diff.go, Job.Diff: Stop is not among the fields it
        # filters out, and the plan diffs against the stored job, stopped or
        # not (job_endpoint.go, Plan): registering a stopped job again is an
        # edit of it, Stop true -> false, not an addition.
        o, n = dict(o, Stop=True), dict(n, Stop=False)
    if o == n:
        return {"Type": "None", "ID": new["ID"], "Fields": None, "Objects": None, "TaskGroups": None}
    # Job.Diff filters Update (a default for the groups) out of the job's fields.
    fields = field_diffs(o, n, skip=("TaskGroups", "ParameterizedJob", "Update", "Periodic"))
    objects = []
    p = object_diff("ParameterizedJob", (o or {}).get("ParameterizedJob"), n.get("ParameterizedJob"))
    if p:
        objects.append(p)
    og, ng = named((o or {}).get("TaskGroups")), named(n.get("TaskGroups"))
    groups = [d for d in (group_diff(og.get(k), ng.get(k)) for k in sorted(set(og) | set(ng))) if d]
    return {"Type": "Added" if o is None else "Edited", "ID": new["ID"], "Fields": fields,
            "Objects": objects or None, "TaskGroups": groups}


# ---------------------------------------------------------------- the scheduler

def wants_deployment(job):
    """scheduler/reconciler/reconcile_cluster.go, createDeployment: only
    service jobs get deployments, and only for groups with a non-empty
    update strategy (structs.UpdateStrategy.IsEmpty: MaxParallel == 0) and a
    count above 0. Parameterized and periodic jobs never run allocations
    themselves. (System jobs get deployments from Nomad 1.11 on,
    reconcile_node.go; this stand-in models the service case only.)"""
    if job["Type"] != "service" or job.get("ParameterizedJob") or job.get("Periodic"):
        return False
    return any((g.get("Count") or 0) > 0 and (g.get("Update") or {}).get("MaxParallel", 0) > 0
               for g in job.get("TaskGroups") or [])


def process_evals():
    """Evaluations are processed by the scheduler after the register has
    answered (nomad/job_endpoint.go, Register creates the eval; a worker
    dequeues it). Until then no deployment exists."""
    now = time.time()
    for ev in evals.values():
        if ev["Status"] != "pending" or ev["_due"] > now:
            continue
        key = (ev["Namespace"], ev["JobID"])
        job = jobs.get(key)
        ev["Status"] = "complete"
        ev["ModifyIndex"] = next_index()
        if job is None or job.get("Stop") or job["JobModifyIndex"] != ev["JobModifyIndex"]:
            continue
        if not ev["_updating"] or not wants_deployment(job):
            continue
        ds = deployments.setdefault(key, [])
        for old in ds:
            if old["Status"] in ("running", "paused", "pending"):
                # structs.DeploymentStatusDescriptionNewerJob
                old["Status"] = "cancelled"
                old["StatusDescription"] = "Cancelled due to newer version of job"
        i = next_index()
        groups = {g["Name"]: group_state(g, previous_group(key, job, g["Name"]))
                  for g in job["TaskGroups"]}
        # structs.NewDeployment: JobModifyIndex is the job's ModifyIndex,
        # JobSpecModifyIndex its JobModifyIndex.
        ds.append({
            "ID": str(uuid.uuid4()), "Namespace": key[0], "JobID": key[1],
            "JobVersion": job["Version"], "JobModifyIndex": job["ModifyIndex"],
            "JobSpecModifyIndex": job["JobModifyIndex"], "JobCreateIndex": job["CreateIndex"],
            "Status": "running", "StatusDescription": running_description(groups),
            "TaskGroups": groups,
            "CreateIndex": i, "ModifyIndex": i,
        })


def previous_group(key, job, name):
    """The group as the version before this one had it, if that version
    ran (not stopped): its allocations are what a destructive update
    replaces."""
    older = [v for v in versions.get(key, []) if v["Version"] < job["Version"]]
    if not older or older[-1].get("Stop"):
        return None
    return named(older[-1]["TaskGroups"]).get(name)


def group_state(g, before):
    """structs.DeploymentState as the reconciler fills it
    (scheduler/reconciler/reconcile_cluster.go): AutoRevert, AutoPromote and
    ProgressDeadline from the group's update block; canaries only for a
    destructive update of allocations that exist (`requiresCanaries`:
    destructive updates and `Update.Canary` > 0), so a new job or a new
    group gets none; `computeCanaries` sets DesiredCanaries and places them.
    Before promotion only the canaries are placed."""
    u = g.get("Update") or {}
    canary = int(u.get("Canary") or 0)
    destructive = before is not None and spec_of_group(before) != spec_of_group(g)
    desired = canary if destructive else 0
    return {"AutoRevert": u.get("AutoRevert", False), "AutoPromote": u.get("AutoPromote", False),
            "ProgressDeadline": u.get("ProgressDeadline", 0), "Promoted": False,
            "PlacedCanaries": [str(uuid.uuid4()) for _ in range(desired)],
            "DesiredCanaries": desired, "DesiredTotal": g.get("Count") or 0,
            "PlacedAllocs": desired if desired else (g.get("Count") or 0),
            "HealthyAllocs": 0, "UnhealthyAllocs": 0}


def spec_of_group(g):
    return {k: v for k, v in g.items() if k != "Count"}


def running_description(groups):
    """structs.DeploymentStatusDescriptionRunning*: a deployment whose
    canaries wait says whether Nomad promotes them itself (every canary
    group has auto_promote, Deployment.HasAutoPromote) or a person must."""
    waiting = [s for s in groups.values() if s["DesiredCanaries"] > 0 and not s["Promoted"]]
    if not waiting:
        return "Deployment is running"
    if all(s["AutoPromote"] for s in waiting):
        return "Deployment is running pending automatic promotion"
    return "Deployment is running but requires manual promotion"


def promote(d, groups=None):
    """nomad/state/state_store.go, UpdateDeploymentPromotion: only an active
    deployment; every promoted group needs DesiredCanaries healthy canaries
    (else a multierror listing each short group, which the HTTP layer
    answers as a 500, command/agent/http.go errCodeFromHandler); the groups
    become Promoted, and the description goes back to running."""
    if d["Status"] not in ("running", "paused", "pending", "blocked", "unblocking", "initializing"):
        return 500, f'Deployment "{d["ID"]}" has terminal status "{d["Status"]}":'
    short = []
    for name, st in sorted(d["TaskGroups"].items()):
        if groups is not None and name not in groups:
            continue
        if st["DesiredCanaries"] and st["HealthyAllocs"] < st["DesiredCanaries"]:
            short.append(f'Task group "{name}" has {st["HealthyAllocs"]}/{st["DesiredCanaries"]} healthy allocations')
    if short:
        # hashicorp/go-multierror's ListFormatFunc
        head = "1 error occurred:" if len(short) == 1 else f"{len(short)} errors occurred:"
        return 500, head + "".join(f"\n\t* {e}" for e in short) + "\n\n"
    for name, st in d["TaskGroups"].items():
        if groups is None or name in groups:
            st["Promoted"] = True
            # the rest of the group is placed after promotion
            st["PlacedAllocs"] = max(st["PlacedAllocs"], st["DesiredTotal"])
    d["StatusDescription"] = running_description(d["TaskGroups"])
    d["ModifyIndex"] = next_index()
    return 200, {"EvalID": str(uuid.uuid4()), "EvalCreateIndex": d["ModifyIndex"],
                 "DeploymentModifyIndex": d["ModifyIndex"], "RevertedJobVersion": None,
                 "Index": d["ModifyIndex"]}


def new_eval(key, job, updating):
    i = next_index()
    ev = {"ID": str(uuid.uuid4()), "Namespace": key[0], "JobID": key[1], "Type": job["Type"],
          "TriggeredBy": "job-register", "Status": "pending", "JobModifyIndex": job["JobModifyIndex"],
          "CreateIndex": i, "ModifyIndex": i, "_due": time.time() + eval_delay[0],
          "_updating": updating}
    evals[ev["ID"]] = ev
    if not eval_on_read[0]:
        process_evals()
    return ev


def put_job(key, new, version):
    i = next_index()
    prev = jobs.get(key)
    new.update({"Version": version, "JobModifyIndex": i, "ModifyIndex": i,
                "CreateIndex": i if prev is None else prev["CreateIndex"],
                "Status": "pending", "Stop": False, "Stable": False, "SubmitTime": i * 1000})
    jobs[key] = new
    versions.setdefault(key, []).append(copy.deepcopy(new))
    return new


def drive_deployment(key, status, description):
    """nomad/deploymentwatcher/deployment_watcher.go: a successful deployment
    marks its job version stable (the job's ModifyIndex moves, its
    JobModifyIndex does not); a failed one whose groups have auto_revert
    rolls the job back to the latest stable version with another spec
    (handleRollbackValidity), registered as a new version, in the same
    update that marks the deployment failed."""
    ds = deployments.get(key) or []
    if not ds:
        return 404, "deployment not found"
    d = ds[-1]
    d["Status"] = status
    d["StatusDescription"] = description
    d["ModifyIndex"] = next_index()
    job = jobs.get(key)
    if status == "successful" and job is not None:
        for v in versions.get(key, []):
            if v["Version"] == d["JobVersion"]:
                v["Stable"] = True
        if job["Version"] == d["JobVersion"]:
            job["Stable"] = True
            job["ModifyIndex"] = next_index()
    if status == "failed" and job is not None and any(
            tg.get("AutoRevert") for tg in d.get("TaskGroups", {}).values()):
        stable = next((v for v in reversed(versions.get(key, []))
                       if v["Stable"] and v["Version"] < d["JobVersion"]), None)
        if stable is None:
            d["StatusDescription"] = f"{description} - no stable job version to auto revert to"
        elif spec(stable) == spec(job):
            d["StatusDescription"] = (f"{description} - not rolling back to stable job version "
                                      f"{stable['Version']} as current job has same specification")
        else:
            d["StatusDescription"] = f"{description} - rolling back to job version {stable['Version']}"
            reverted = put_job(key, copy.deepcopy(spec(stable)), job["Version"] + 1)
            new_eval(key, reverted, True)
    return 200, d


# ---------------------------------------------------------------- dispatched jobs

def alloc(key, child, group, status, previous=None):
    a = {"ID": str(uuid.uuid4()), "Namespace": key[0], "JobID": child["ID"],
         "JobVersion": child["Version"], "TaskGroup": group, "DesiredStatus": "run",
         "ClientStatus": status, "NextAllocation": "", "PreviousAllocation": previous or "",
         "CreateIndex": next_index()}
    a["ModifyIndex"] = a["CreateIndex"]
    allocs.setdefault((key[0], child["ID"]), []).append(a)
    return a


def settle_child(ns, child, outcome):
    """A dispatched batch job's allocations: a failed allocation is
    rescheduled (a batch job's default `reschedule` is 1 attempt,
    structs.DefaultBatchJobReschedulePolicy), the new one linked through
    NextAllocation / PreviousAllocation; the job is dead once every
    allocation is terminal (state_store.go, getJobStatus)."""
    group = child["TaskGroups"][0]["Name"] if child.get("TaskGroups") else "hook"
    key = (ns, child["ID"])
    mine = allocs.get(key, [])
    running = [a for a in mine if a["ClientStatus"] == "running"]
    first = running[0] if running else alloc(key, child, group, "pending")
    if outcome == "running":
        first["ClientStatus"] = "running"
        child["Status"] = "running"
    else:
        seq = {"complete": ["complete"], "failed": ["failed", "failed"],
               "failed_then_complete": ["failed", "complete"]}[outcome]
        cur = first
        for i, st in enumerate(seq):
            cur["ClientStatus"] = st
            if i + 1 < len(seq):
                nxt = alloc(key, child, group, "pending", previous=cur["ID"])
                cur["NextAllocation"] = nxt["ID"]
                cur = nxt
        child["Status"] = "dead"
    counts = {"Queued": 0, "Complete": 0, "Failed": 0, "Running": 0, "Starting": 0, "Lost": 0}
    for a in allocs.get(key, []):
        counts[{"complete": "Complete", "failed": "Failed", "running": "Running",
                "pending": "Starting", "lost": "Lost"}[a["ClientStatus"]]] += 1
    child["_summary"] = {group: counts}


# ---------------------------------------------------------------- controls

def ns_of(q, job=None):
    return (q.get("namespace") or [None])[0] or (job or {}).get("Namespace") or "default"


def control(action, body):
    key = (body.get("Namespace") or "default", body.get("ID"))
    job = jobs.get(key)
    if action == "edit":
        if job is None:
            return 404, "job not found"
        target = job
        path = body["Path"]
        for p in path[:-1]:
            target = target[p]
        target[path[-1]] = body["Value"]
        i = next_index()
        job["Version"] += 1
        job["JobModifyIndex"] = i
        job["ModifyIndex"] = i
        versions.setdefault(key, []).append(copy.deepcopy(job))
        return 200, {"JobModifyIndex": i}
    if action == "scale":
        if job is None:
            return 404, "job not found"
        for g in job["TaskGroups"]:
            if g["Name"] == body["Group"]:
                g["Count"] = body["Count"]
        i = next_index()
        job["Version"] += 1
        job["JobModifyIndex"] = i
        job["ModifyIndex"] = i
        versions.setdefault(key, []).append(copy.deepcopy(job))
        return 200, {"JobModifyIndex": i}
    if action == "deployment":
        return drive_deployment(key, body["Status"], body.get("Description", "set by the test"))
    if action == "canaries":
        # Canary allocations turn healthy (the client's health checks, which
        # the deployment watcher counts in HealthyAllocs); when every canary
        # group has auto_promote and enough healthy canaries, the watcher
        # promotes the deployment itself (deploymentWatcher.autoPromoteDeployment).
        ds = deployments.get(key) or []
        if not ds:
            return 404, "deployment not found"
        d = ds[-1]
        for st in d["TaskGroups"].values():
            if st["DesiredCanaries"]:
                st["HealthyAllocs"] = int(body["Healthy"])
        d["ModifyIndex"] = next_index()
        waiting = [s for s in d["TaskGroups"].values() if s["DesiredCanaries"] and not s["Promoted"]]
        if waiting and all(s["AutoPromote"] and s["HealthyAllocs"] >= s["DesiredCanaries"] for s in waiting):
            promote(d)
        return 200, d
    return 400, f"unknown control {action}"


# ---------------------------------------------------------------- server

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def reply(self, code, body):
        if isinstance(body, str):
            data, ctype = (body + ("" if body.endswith("\n") else "\n")).encode(), "text/plain; charset=utf-8"
        else:
            data, ctype = json.dumps(body).encode(), "application/json"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if urlparse(self.path).path != "/v1/jobs/parse":
            self.send_header("X-Nomad-Index", str(index))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def handle_any(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        url = urlparse(self.path)
        q = parse_qs(url.query)
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            return self.reply(400, "Unable to parse request body")
        if not url.path.startswith("/_standin/"):
            with lock:
                arrived.append({"method": self.command, "path": url.path})
        for d in list(delays):
            if re.fullmatch(d["Path"], url.path) and d.get("Method", self.command) == self.command:
                time.sleep(d["Seconds"])
        with lock:
            if not eval_on_read[0] or (self.command == "GET" and url.path.startswith("/v1/evaluation/")):
                process_evals()
            if url.path.startswith("/_standin/"):
                return self.standin(url.path[len("/_standin/"):], body)
            journal.append({"method": self.command, "path": url.path, "query": url.query,
                            "body": body, "token": self.headers.get("X-Nomad-Token"),
                            "index": index})
            with open(JOURNAL, "a") as f:
                f.write(json.dumps(journal[-1]) + "\n")
            for fl in failures:
                if fl["Times"] > 0 and re.fullmatch(fl["Path"], url.path) and fl.get("Method", self.command) == self.command:
                    fl["Times"] -= 1
                    return self.reply(fl["Status"], fl["Body"])
            try:
                code, out = self.api(url.path, q, body)
            except Denied as e:
                code, out = 403, str(e)
            if url.path.endswith("/plan") and isinstance(out, dict):
                # for tests: the CAS value a correct client must send next
                journal[-1]["live_job_modify_index"] = out["JobModifyIndex"]
            journal[-1]["status"] = code
            self.reply(code, out)
            if url.path.endswith("/plan") and after_plan:
                c = after_plan.pop(0)
                control(c["Action"], c)

    def standin(self, what, body):
        if what == "journal":
            return self.reply(200, journal)
        if what == "arrived":
            return self.reply(200, arrived)
        if what == "jobs":
            return self.reply(200, [j for j in jobs.values()])
        if what == "acl_token":
            tokens[body["SecretID"]] = {ns: expand(p) for ns, p in body["Namespaces"].items()}
            return self.reply(200, {})
        if what == "after_plan":
            after_plan.append(body)
            return self.reply(200, {})
        if what == "fail":
            failures.append(body)
            return self.reply(200, {})
        if what == "delay":
            delays.append(body)
            return self.reply(200, {})
        if what == "eval_delay":
            eval_delay[0] = float(body["Seconds"])
            return self.reply(200, {})
        if what == "eval_on_read":
            eval_on_read[0] = bool(body.get("On"))
            return self.reply(200, {})
        if what == "gc":
            # nomad/core_sched.go, jobGC: dead jobs (dispatched children
            # included) are removed with their allocations once past
            # job_gc_threshold; the idempotency token goes with them.
            gone = [k for k, j in jobs.items() if j.get("Dispatched") and j["Status"] == "dead"]
            for k in gone:
                del jobs[k]
                allocs.pop(k, None)
            return self.reply(200, {"collected": [k[1] for k in gone]})
        if what == "hook_outcome":
            hook_outcomes[body["ID"]] = body["Status"]
            # instances still running end that way too
            if body["Status"] != "running":
                for (ns, _), child in list(jobs.items()):
                    if child.get("ParentID") == body["ID"] and child["Status"] == "running":
                        settle_child(ns, child, body["Status"])
            return self.reply(200, {})
        code, out = control(what, body)
        return self.reply(code, out)

    def api(self, path, q, body):
        token = self.headers.get("X-Nomad-Token")
        if path == "/v1/jobs/parse" and self.command in ("POST", "PUT"):
            # command/agent/job_endpoint.go, JobsParseRequest: parse-job or
            # submit-job in ?namespace= (default "default").
            allow(token, ns_of(q), "parse-job", "submit-job")
            if not body.get("JobHCL"):
                return 400, "Job spec is empty"
            try:
                job = parse_job(body.get("JobHCL") or "", body.get("Variables") or "",
                                body.get("Canonicalize", False) is True)
            except ParseError as e:
                return 400, f"Failed to parse job: {e}"
            return 200, job
        if path == "/v1/jobs" and self.command in ("POST", "PUT"):
            return self.register(body, q, token)
        m = re.fullmatch(r"/v1/evaluation/([^/]+)", path)
        if m and self.command == "GET":
            ev = evals.get(m.group(1))
            if ev is None:
                return 404, "eval not found"
            allow(token, ev["Namespace"], "read-job")
            return 200, {k: v for k, v in ev.items() if not k.startswith("_")}
        m = re.fullmatch(r"/v1/deployment/promote/([^/]+)", path)
        if m:
            # command/agent/deployment_endpoint.go, deploymentPromote: PUT or
            # POST; the body's DeploymentID must be the path's.
            if self.command not in ("PUT", "POST"):
                return 405, "Invalid method"
            if not body.get("DeploymentID"):
                return 400, "DeploymentID must be specified"
            if body["DeploymentID"] != unquote(m.group(1)):
                return 400, "Deployment ID does not match"
            d = next((d for ds in deployments.values() for d in ds if d["ID"] == body["DeploymentID"]), None)
            if d is None:
                return 500, "deployment not found"
            # nomad/deployment_endpoint.go, Promote: submit-job or
            # promote-deployment in the deployment's namespace.
            allow(token, d["Namespace"], "submit-job", "promote-deployment")
            return promote(d, None if body.get("All") else set(body.get("Groups") or []))
        m = re.fullmatch(r"/v1/job/([^/]+)(/plan|/deployments?|/dispatch|/summary|/allocations)?", path)
        if not m:
            return 404, "Invalid URL path"
        jid, sub = unquote(m.group(1)), m.group(2)
        if sub == "/dispatch" and self.command in ("POST", "PUT"):
            return self.dispatch(jid, q, body, token)
        ns = ns_of(q)
        key = (ns, jid)
        job = jobs.get(key)
        if sub in ("/summary", "/allocations", "/deployment", "/deployments") and self.command == "GET":
            allow(token, ns, "read-job")
            if sub == "/summary":
                if job is None:
                    return 404, "job not found"
                return 200, {"JobID": jid, "Namespace": ns, "Summary": job.get("_summary", {})}
            if sub == "/allocations":
                return 200, list(allocs.get(key, []))
            # nomad/state: DeploymentsByJobID without `all` keeps those of
            # the job's current incarnation (JobCreateIndex).
            ds = [d for d in deployments.get(key, [])
                  if job is None or d["JobCreateIndex"] == job["CreateIndex"]]
            ds = sorted(ds, key=lambda d: d["CreateIndex"], reverse=True)
            if sub == "/deployments":
                return 200, ds
            return 200, (ds[0] if ds else None)
        if sub is None and self.command == "GET":
            allow(token, ns, "read-job")
            return (404, "job not found") if job is None else (200, job)
        if sub is None and self.command in ("POST", "PUT"):
            return self.register(body, q, token)
        if sub is None and self.command == "DELETE":
            allow(token, ns, "submit-job", "purge-job", "deregister-job")
            if job is None:
                return 404, "job not found"
            i = next_index()
            if (q.get("purge") or ["false"])[0] == "true":
                del jobs[key]
            else:
                job["Stop"] = True
                job["Version"] += 1
                job["JobModifyIndex"] = i
            return 200, {"EvalID": str(uuid.uuid4()), "JobModifyIndex": i, "Index": i}
        if sub == "/plan" and self.command in ("POST", "PUT"):
            new = body.get("Job")
            if not new or new.get("ID") != jid:
                return 400, "Job ID does not match"
            # apiJobAndRequestToStructs: ?namespace= wins over the job's.
            ns = ns_of(q, new)
            # nomad/job_endpoint.go, Plan: submit-job or plan-job.
            allow(token, ns, "submit-job", "plan-job")
            job = jobs.get((ns, jid))
            return 200, {
                "JobModifyIndex": job["JobModifyIndex"] if job else 0,
                "Diff": job_diff(job, new) if body.get("Diff") else None,
                "Annotations": None, "FailedTGAllocs": None, "CreatedEvals": None,
                "NextPeriodicLaunch": "0001-01-01T00:00:00Z", "Warnings": "", "Index": index,
            }
        return 405, "Invalid method"

    def dispatch(self, jid, q, body, token):
        """nomad/job_endpoint.go, Dispatch and validateDispatchRequest."""
        ns = ns_of(q)
        allow(token, ns, "dispatch-job")
        parent = jobs.get((ns, jid))
        if parent is None:
            return 500, "parameterized job not found"
        pj = parent.get("ParameterizedJob")
        if not pj or parent.get("Dispatched"):
            return 500, f'Specified job "{jid}" is not a parameterized job'
        if parent.get("Stop"):
            return 500, f'Specified job "{jid}" is stopped'
        meta = body.get("Meta") or {}
        required, optional = set(pj.get("MetaRequired") or []), set(pj.get("MetaOptional") or [])
        unpermitted = [k for k in meta if k not in required and k not in optional]
        if unpermitted:
            # Go's %v of a []string: [a b]
            return 500, f"Dispatch request included unpermitted metadata keys: [{' '.join(unpermitted)}]"
        missing = [k for k in sorted(required) if k not in meta]
        if missing:
            return 500, f"Dispatch did not provide required meta keys: [{' '.join(missing)}]"
        # validateDispatchRequest: the payload rule of the parameterized block.
        payload = body.get("Payload") or ""
        if pj.get("Payload") == "forbidden" and payload:
            return 500, "Payload is not permitted by parameterized job"
        if pj.get("Payload") == "required" and not payload:
            return 500, "Payload is not provided but required by parameterized job"
        token_ = body.get("IdempotencyToken") or (q.get("idempotency_token") or [None])[0]
        if token_:
            for child in jobs.values():
                if child.get("ParentID") == jid and child.get("DispatchIdempotencyToken") == token_:
                    # Only a child Nomad has not garbage-collected matches.
                    return 200, {"DispatchedJobID": child["ID"], "EvalID": "", "Index": child["ModifyIndex"],
                                 "JobCreateIndex": child["CreateIndex"], "EvalCreateIndex": 0}
        i = next_index()
        # structs.DispatchedID: <parent>/dispatch-<unix time>-<8 hex>
        child_id = f"{jid}/dispatch-{int(time.time())}-{uuid.uuid4().hex[:8]}"
        child = copy.deepcopy(spec(parent))
        child.update({"ID": child_id, "Name": child_id, "ParentID": jid, "Dispatched": True,
                      "DispatchIdempotencyToken": token_, "Meta": {**(parent.get("Meta") or {}), **meta},
                      "Version": 0, "JobModifyIndex": i, "ModifyIndex": i, "CreateIndex": i,
                      "Status": "pending", "Stop": False})
        jobs[(ns, child_id)] = child
        settle_child(ns, child, hook_outcomes.get(jid, "complete"))
        return 200, {"DispatchedJobID": child_id, "EvalID": str(uuid.uuid4()), "EvalCreateIndex": i,
                     "JobCreateIndex": i, "Index": i}

    def register(self, body, q, token):
        new = body.get("Job")
        if not new:
            return 400, "Job must be specified"
        if not new.get("ID"):
            return 400, "Job ID hasn't been provided"
        # command/agent/job_endpoint.go, namespaceForJob: the query's
        # namespace, else the job's.
        ns = ns_of(q, new)
        # nomad/job_endpoint.go, doRegister: submit-job (or register-job).
        allow(token, ns, "submit-job", "register-job")
        key = (ns, new["ID"])
        job = jobs.get(key)
        if body.get("EnforceIndex"):
            want = body.get("JobModifyIndex", 0)
            if want == 0 and job is not None and not job.get("Stop"):
                return 500, "Enforcing job modify index 0: job already exists"
            if want != 0 and job is None:
                return 500, f"Enforcing job modify index {want}: job does not exist"
            if job is not None and want != 0 and job["JobModifyIndex"] != want:
                return 500, (f"Enforcing job modify index {want}: job exists with "
                             f"conflicting job modify index: {job['JobModifyIndex']}")
        new = copy.deepcopy(spec(new))
        new["Namespace"] = ns
        if body.get("PreserveCounts") and job is not None:
            live = named(job["TaskGroups"])
            for g in new["TaskGroups"]:
                if g["Name"] in live:
                    g["Count"] = live[g["Name"]]["Count"]
        if job is not None and spec(job) == new and not job.get("Stop"):
            # The same spec: no new version, and an evaluation that finds
            # nothing to update creates no deployment.
            job["ModifyIndex"] = next_index()
            ev = new_eval(key, job, False)
            return 200, {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"],
                         "JobModifyIndex": job["JobModifyIndex"], "Warnings": "", "Index": ev["CreateIndex"]}
        version = 0 if job is None else job["Version"] + 1
        new = put_job(key, new, version)
        if new.get("ParameterizedJob") or new.get("Periodic"):
            # Parameterized and periodic jobs get no evaluation (Register).
            return 200, {"EvalID": "", "EvalCreateIndex": 0, "JobModifyIndex": new["JobModifyIndex"],
                         "Warnings": "", "Index": new["JobModifyIndex"]}
        ev = new_eval(key, new, True)
        return 200, {"EvalID": ev["ID"], "EvalCreateIndex": ev["CreateIndex"],
                     "JobModifyIndex": new["JobModifyIndex"], "Warnings": "", "Index": ev["CreateIndex"]}

    do_GET = handle_any
    do_POST = handle_any
    do_PUT = handle_any
    do_DELETE = handle_any


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    if TLS:
        # https, and a client certificate from CLIENT_CA required (mTLS),
        # as a Nomad agent with verify_https_client = true does.
        import ssl
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(TLS[0], TLS[1])
        ctx.load_verify_locations(TLS[2])
        ctx.verify_mode = ssl.CERT_REQUIRED
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.serve_forever()
