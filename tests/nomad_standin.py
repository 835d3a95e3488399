#!/usr/bin/env python3
"""A stand-in for Nomad's HTTP API, on 127.0.0.1, for driftless's tests.

    nomad_standin.py PORT JOURNAL [TOKEN [CERT KEY CLIENT_CA]]

No Nomad binary can be installed here. This serves the part of Nomad's
published HTTP API (https://developer.hashicorp.com/nomad/api-docs, Nomad
1.7-1.9) that driftless's `nomad` backend uses, with Nomad's status codes and
text/plain error bodies:

  POST /v1/jobs/parse            HCL -> job JSON (a jobspec subset, parsed with
                                 python-hcl2); 400 "Failed to parse job: ..."
                                 Namespace is null unless the file names one
                                 or Canonicalize is true
  GET  /v1/job/:id               the job; 404 "job not found"
  POST /v1/job/:id/plan          {Job, Diff} -> {JobModifyIndex, Diff, ...}
  POST /v1/jobs, /v1/job/:id     register; EnforceIndex/JobModifyIndex CAS:
                                 500 "Enforcing job modify index N: job exists
                                 with conflicting job modify index: M";
                                 PreserveCounts
  GET  /v1/job/:id/deployment    the latest deployment, or `null`
  POST /v1/job/:id/dispatch      dispatch a parameterized job ({Meta,
                                 IdempotencyToken}: one instance per token)
  GET  /v1/job/:id/summary       per group: Complete, Failed, Running, …
  DELETE /v1/job/:id             deregister (Stop = true; purge=true removes)

Every answer carries X-Nomad-Index. JobModifyIndex and Version move only when
the spec changes. Diffs have Nomad's shape: Type None/Added/Edited/Deleted,
Fields (maps as `Meta[k]`, `Env[k]`), Objects (Config, Template, Scaling),
TaskGroups[].Tasks[]. With TOKEN, requests need X-Nomad-Token (else 403
"Permission denied").

Test controls (not Nomad's), under /_standin/:
  GET  journal                   every API request so far, in order
  GET  arrived                   {method, path} of every request as it
                                 arrives, before any delay (what is in flight)
  POST edit {Namespace, ID, Path: [..], Value}  a manual change to a live job
  POST scale {Namespace, ID, Group, Count}      what an autoscaler does
  POST deployment {Namespace, ID, Status}       drive the latest deployment
  POST after_plan {Action: "edit"|"scale", ...} run that control right after
                                 answering the next plan (the CAS window)
  POST hook_outcome {ID, Status}                 how instances dispatched from
                                 the parameterized job ID end: complete (the
                                 default), failed, or running (until a later
                                 hook_outcome ends the running ones)
  POST delay {Path, Method, Seconds}             sleep before answering
                                 matching requests (the request still runs)
  POST fail {Path, Status, Body, Times}         answer the next Times
                                 requests whose path matches with Status/Body
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
deployments = {}   # (ns, id) -> [deployment dicts]
after_plan = []    # controls to run after the next plan
failures = []      # {Path, Status, Body, Times}
delays = []        # {Path, Method, Seconds}: sleep before answering
hook_outcomes = {} # parameterized job ID -> complete | failed | running
journal = []
arrived = []       # {method, path} as requests arrive, before any delay

SERVER_FIELDS = {"Version", "JobModifyIndex", "ModifyIndex", "CreateIndex",
                 "Status", "SubmitTime", "Stable", "Stop"}


def next_index():
    global index
    index += 1
    return index


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


def parse_job(hcl, vars_text, canonicalize=True):
    variables = {}
    if vars_text:
        try:
            for k, v in hcl2.loads(vars_text).items():
                variables[k] = unq(v, {})
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
            tasks.append({
                "Name": tname,
                "Driver": unq(t.get("driver", ""), variables),
                "Config": one(t, "config", variables) or {},
                "Env": one(t, "env", variables),
                "Meta": one(t, "meta", variables),
                "Templates": templates or None,
            })
        groups.append({
            "Name": gname,
            "Count": unq(g.get("count", 1), variables),
            "Meta": one(g, "meta", variables),
            "Scaling": None if scaling is None else {
                "Enabled": scaling.get("enabled", True),
                "Min": scaling.get("min", unq(g.get("count", 1), variables)),
                "Max": scaling.get("max"),
                "Type": "horizontal",
            },
            "Tasks": tasks,
        })
    param = one(body, "parameterized", variables)
    return {
        "ID": jid,
        "Name": jid,
        # Canonicalize fills in the default namespace; without it a file
        # that names none gives null (the other defaults are always filled
        # in here: driftless reads only Namespace from such a parse).
        "Namespace": unq(body["namespace"], variables) if "namespace" in body
        else ("default" if canonicalize else None),
        "Region": unq(body.get("region", "global"), variables),
        "Type": unq(body.get("type", "service"), variables),
        "Priority": unq(body.get("priority", 50), variables),
        "Datacenters": unq(body.get("datacenters", ["*"]), variables),
        "Meta": one(body, "meta", variables),
        "ParameterizedJob": None if param is None else {
            "Payload": param.get("payload", "optional"),
            "MetaRequired": param.get("meta_required"),
            "MetaOptional": param.get("meta_optional"),
        },
        "TaskGroups": groups,
    }


# ---------------------------------------------------------------- diffs

def spec(job):
    return {k: v for k, v in job.items() if k not in SERVER_FIELDS}


def s(v):
    return "" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else str(v).lower() if isinstance(v, bool) else str(v))


def field_diffs(old, new, skip=()):
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
                    if mo != mn:
                        out.append(fd(f"{k}[{mk}]", mo, mn))
            continue
        if isinstance(o, list) or isinstance(n, list):
            if o != n:
                out.append(fd(k, o, n))
            continue
        if o != n:
            out.append(fd(k, o, n))
    return out


def fd(name, o, n):
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    return {"Type": t, "Name": name, "Old": s(o), "New": s(n), "Annotations": None}


def object_diff(name, o, n):
    if o == n:
        return None
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    return {"Type": t, "Name": name, "Fields": field_diffs(o, n), "Objects": None}


def named(items):
    return {i["Name"]: i for i in (items or [])}


def task_diff(o, n):
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    fields = field_diffs(o, n, skip=("Name", "Config", "Templates"))
    objects = []
    c = object_diff("Config", (o or {}).get("Config"), (n or {}).get("Config"))
    if c:
        objects.append(c)
    ot, nt = (o or {}).get("Templates") or [], (n or {}).get("Templates") or []
    for i in range(max(len(ot), len(nt))):
        d = object_diff("Template", ot[i] if i < len(ot) else None, nt[i] if i < len(nt) else None)
        if d:
            objects.append(d)
    if t == "Edited" and not fields and not objects:
        return None
    return {"Type": t, "Name": (n or o)["Name"], "Fields": fields, "Objects": objects or None,
            "Annotations": None}


def group_diff(o, n):
    t = "Added" if o is None else "Deleted" if n is None else "Edited"
    fields = field_diffs(o, n, skip=("Name", "Tasks", "Scaling"))
    objects = []
    sc = object_diff("Scaling", (o or {}).get("Scaling"), (n or {}).get("Scaling"))
    if sc:
        objects.append(sc)
    ot, nt = named((o or {}).get("Tasks")), named((n or {}).get("Tasks"))
    tasks = [d for d in (task_diff(ot.get(k), nt.get(k)) for k in sorted(set(ot) | set(nt))) if d]
    if t == "Edited" and not fields and not objects and not tasks:
        return None
    return {"Type": t, "Name": (n or o)["Name"], "Fields": fields, "Objects": objects or None,
            "Tasks": tasks, "Updates": None}


def job_diff(old, new):
    o = spec(old) if old and not old.get("Stop") else None
    n = spec(new)
    if o == n:
        return {"Type": "None", "ID": new["ID"], "Fields": None, "Objects": None, "TaskGroups": None}
    fields = field_diffs(o, n, skip=("TaskGroups", "ParameterizedJob"))
    objects = []
    p = object_diff("ParameterizedJob", (o or {}).get("ParameterizedJob"), n.get("ParameterizedJob"))
    if p:
        objects.append(p)
    og, ng = named((o or {}).get("TaskGroups")), named(n.get("TaskGroups"))
    groups = [d for d in (group_diff(og.get(k), ng.get(k)) for k in sorted(set(og) | set(ng))) if d]
    return {"Type": "Added" if o is None else "Edited", "ID": new["ID"], "Fields": fields,
            "Objects": objects or None, "TaskGroups": groups}


# ---------------------------------------------------------------- controls

def ns_of(q, job=None):
    return (q.get("namespace") or [None])[0] or (job or {}).get("Namespace") or "default"


def control(action, body):
    key = (body.get("Namespace") or "default", body["ID"])
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
        return 200, {"JobModifyIndex": i}
    if action == "deployment":
        ds = deployments.get(key) or []
        if not ds:
            return 404, "deployment not found"
        ds[-1]["Status"] = body["Status"]
        ds[-1]["StatusDescription"] = body.get("Description", "set by the test")
        ds[-1]["ModifyIndex"] = next_index()
        return 200, ds[-1]
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
            if url.path.startswith("/_standin/"):
                return self.standin(url.path[len("/_standin/"):], body)
            journal.append({"method": self.command, "path": url.path, "query": url.query,
                            "body": body, "token": self.headers.get("X-Nomad-Token"),
                            "index": index})
            with open(JOURNAL, "a") as f:
                f.write(json.dumps(journal[-1]) + "\n")
            if TOKEN is not None and self.headers.get("X-Nomad-Token") != TOKEN:
                return self.reply(403, "Permission denied")
            for fl in failures:
                if fl["Times"] > 0 and re.fullmatch(fl["Path"], url.path) and fl.get("Method", self.command) == self.command:
                    fl["Times"] -= 1
                    return self.reply(fl["Status"], fl["Body"])
            code, out = self.api(url.path, q, body)
            if url.path.endswith("/plan") and isinstance(out, dict):
                # for tests: the CAS value a correct client must send next
                journal[-1]["live_job_modify_index"] = out["JobModifyIndex"]
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
        if what == "after_plan":
            after_plan.append(body)
            return self.reply(200, {})
        if what == "fail":
            failures.append(body)
            return self.reply(200, {})
        if what == "delay":
            delays.append(body)
            return self.reply(200, {})
        if what == "hook_outcome":
            hook_outcomes[body["ID"]] = body["Status"]
            # instances still running end that way too
            for child in jobs.values():
                if child.get("ParentID") == body["ID"] and child["Status"] == "running" \
                        and body["Status"] != "running":
                    group = next(iter(child["_summary"]))
                    child["_summary"][group]["Running"] = 0
                    child["_summary"][group]["Complete" if body["Status"] == "complete" else "Failed"] = 1
                    child["Status"] = "dead"
            return self.reply(200, {})
        code, out = control(what, body)
        return self.reply(code, out)

    def api(self, path, q, body):
        if path == "/v1/jobs/parse" and self.command == "POST":
            try:
                job = parse_job(body.get("JobHCL") or "", body.get("Variables") or "",
                                body.get("Canonicalize", False) is True)
            except ParseError as e:
                return 400, f"Failed to parse job: {e}"
            return 200, job
        if path in ("/v1/jobs",) and self.command == "POST":
            return self.register(body)
        m = re.fullmatch(r"/v1/job/([^/]+)(/plan|/deployment|/dispatch|/summary)?", path)
        if not m:
            return 404, "Invalid URL path"
        jid, sub = unquote(m.group(1)), m.group(2)
        if sub == "/dispatch" and self.command in ("POST", "PUT"):
            return self.dispatch(jid, q, body)
        if sub == "/summary" and self.command == "GET":
            key = (ns_of(q), jid)
            job = jobs.get(key)
            if job is None:
                return 404, "job not found"
            return 200, {"JobID": jid, "Namespace": key[0], "Summary": job.get("_summary", {})}
        key = (ns_of(q, body.get("Job")), jid)
        job = jobs.get(key)
        if sub is None and self.command == "GET":
            return (404, "job not found") if job is None else (200, job)
        if sub is None and self.command == "POST":
            return self.register(body)
        if sub is None and self.command == "DELETE":
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
        if sub == "/plan" and self.command == "POST":
            new = body.get("Job")
            if not new or new.get("ID") != jid:
                return 400, "Job ID does not match"
            return 200, {
                "JobModifyIndex": job["JobModifyIndex"] if job else 0,
                "Diff": job_diff(job, new) if body.get("Diff") else None,
                "Annotations": None, "FailedTGAllocs": None, "CreatedEvals": None,
                "NextPeriodicLaunch": "0001-01-01T00:00:00Z", "Warnings": "", "Index": index,
            }
        if sub == "/deployment" and self.command == "GET":
            ds = deployments.get(key) or []
            return 200, (ds[-1] if ds else None)
        return 405, "Invalid method"

    def dispatch(self, jid, q, body):
        key = (ns_of(q), jid)
        parent = jobs.get(key)
        if parent is None:
            return 404, "job not found"
        if not parent.get("ParameterizedJob"):
            return 400, "Specified job is not a parameterized job"
        token = body.get("IdempotencyToken") or (q.get("idempotency_token") or [None])[0]
        if token:
            for child in jobs.values():
                if child.get("ParentID") == jid and child.get("DispatchIdempotencyToken") == token:
                    # Nomad dispatches at most one instance per token.
                    return 200, {"DispatchedJobID": child["ID"], "EvalID": "", "Index": index,
                                 "JobCreateIndex": child["CreateIndex"], "EvalCreateIndex": 0}
        i = next_index()
        child_id = f"{jid}/dispatch-{i}-{uuid.uuid4().hex[:8]}"
        outcome = hook_outcomes.get(jid, "complete")
        group = (parent.get("TaskGroups") or [{"Name": "hook"}])[0]["Name"]
        counts = {"Queued": 0, "Complete": 0, "Failed": 0, "Running": 0, "Starting": 0, "Lost": 0}
        if outcome == "complete":
            counts["Complete"] = 1
        elif outcome == "failed":
            counts["Failed"] = 1
        else:
            counts["Running"] = 1
        child = copy.deepcopy(spec(parent))
        child.update({"ID": child_id, "Name": child_id, "ParentID": jid, "Dispatched": True,
                      "DispatchIdempotencyToken": token, "Meta": {**(parent.get("Meta") or {}), **(body.get("Meta") or {})},
                      "Version": 0, "JobModifyIndex": i, "ModifyIndex": i, "CreateIndex": i,
                      "Status": "running" if outcome == "running" else "dead", "Stop": False,
                      "_summary": {group: counts}})
        jobs[(key[0], child_id)] = child
        return 200, {"DispatchedJobID": child_id, "EvalID": str(uuid.uuid4()), "EvalCreateIndex": i,
                     "JobCreateIndex": i, "Index": i}

    def register(self, body):
        new = body.get("Job")
        if not new or not new.get("ID"):
            return 400, "Job ID hasn't been provided"
        key = (new.get("Namespace") or "default", new["ID"])
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
        if body.get("PreserveCounts") and job is not None:
            live = named(job["TaskGroups"])
            for g in new["TaskGroups"]:
                if g["Name"] in live:
                    g["Count"] = live[g["Name"]]["Count"]
        i = next_index()
        if job is not None and spec(job) == new and not job.get("Stop"):
            job["ModifyIndex"] = i
            return 200, {"EvalID": str(uuid.uuid4()), "EvalCreateIndex": i,
                         "JobModifyIndex": job["JobModifyIndex"], "Warnings": "", "Index": i}
        version = 0 if job is None else job["Version"] + 1
        new.update({"Version": version, "JobModifyIndex": i, "ModifyIndex": i,
                    "CreateIndex": i if job is None else job["CreateIndex"],
                    "Status": "pending", "Stop": False, "Stable": False,
                    "SubmitTime": i * 1000})
        jobs[key] = new
        if new["Type"] == "service":
            deployments.setdefault(key, []).append({
                "ID": str(uuid.uuid4()), "Namespace": key[0], "JobID": key[1],
                "JobVersion": version, "JobModifyIndex": i, "JobCreateIndex": new["CreateIndex"],
                "Status": "running", "StatusDescription": "Deployment is running",
                "CreateIndex": i, "ModifyIndex": i,
            })
        return 200, {"EvalID": str(uuid.uuid4()), "EvalCreateIndex": i,
                     "JobModifyIndex": i, "Warnings": "", "Index": i}

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
