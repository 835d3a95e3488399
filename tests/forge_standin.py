#!/usr/bin/env python3
"""A stand-in for the commit-status endpoints of GitHub, Gitea/Forgejo and
GitLab, on 127.0.0.1, for driftless's tests.

    forge_standin.py PORT TOKEN

No forge server can be installed here. Each endpoint is written from the
forge's published API description (facts only, cited per route below), with
its status codes and the behaviour that hurts a client:

  POST /repos/{owner}/{repo}/statuses/{sha}          GitHub REST, "Create a
      commit status" (github/rest-api-description, repos/create-commit-
      status): body state (error|failure|pending|success), target_url,
      description, context (default "default"); `Authorization: Bearer` or
      `token`; 201 with the status; 422 for another state; at most 1000
      statuses per sha and context (422 after that).
  POST /api/v1/repos/{owner}/{repo}/statuses/{sha}   Gitea and Forgejo
      (swagger `repoCreateStatus`, `CreateStatusOption`): the same fields,
      states pending|success|error|failure|warning; `Authorization: token`;
      201.
  POST /api/v4/projects/{id}/statuses/{sha}          GitLab "Set the pipeline
      status of a commit" (doc/api/commits.md): `id` the project id or its
      URL-encoded path; state pending|running|success|failed|canceled
      (else 400); `name` (or `context`) the status name, default
      "default"; `PRIVATE-TOKEN`; 201. Posting the state the status already
      has answers 400 {"message": "Cannot transition status via :<event>
      from :<state> ..."} (a known GitLab behaviour, gitlab-foss#25807).

A wrong or missing token is 401 on every forge; a sha that is not 40 hex
digits is 422. Test controls (not any forge's), under /_standin/:
  GET  journal      every API request in order: method, path, the auth
                    header's scheme and whether it matched, body
  GET  statuses     the current state per (path prefix, sha, context)
  POST down {"down": true|false}   answer every API request 503 while down
"""

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

PORT = int(sys.argv[1])
TOKEN = sys.argv[2]
LOCK = threading.Lock()
JOURNAL = []
STATUSES = {}  # (forge, repo, sha, context) -> list of states, in order
DOWN = {"down": False}

GITHUB = re.compile(r"^/repos/([^/]+)/([^/]+)/statuses/([^/]+)$")
GITEA = re.compile(r"^/api/v1/repos/([^/]+)/([^/]+)/statuses/([^/]+)$")
GITLAB = re.compile(r"^/api/v4/projects/([^/]+)/statuses/([^/]+)$")
SHA = re.compile(r"^[0-9a-f]{40}$")
GITLAB_EVENT = {"pending": "enqueue", "running": "run", "success": "success",
                "failed": "drop", "canceled": "cancel"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            if self.path == "/_standin/journal":
                return self.answer(200, JOURNAL)
            if self.path == "/_standin/statuses":
                return self.answer(200, [
                    {"forge": k[0], "repo": k[1], "sha": k[2], "context": k[3], "states": v}
                    for k, v in STATUSES.items()
                ])
        self.answer(404, {"message": "Not Found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return self.answer(400, {"message": "Problems parsing JSON"})
        if self.path == "/_standin/down":
            DOWN["down"] = bool(body.get("down"))
            return self.answer(200, DOWN)
        with LOCK:
            self.api(body)

    def auth(self, forge):
        if forge == "gitlab":
            given = self.headers.get("PRIVATE-TOKEN")
            return "PRIVATE-TOKEN", given == TOKEN
        h = self.headers.get("Authorization") or ""
        scheme, _, value = h.partition(" ")
        ok = value == TOKEN and (
            scheme in ("Bearer", "token") if forge == "github" else scheme == "token")
        return scheme or "-", ok

    def api(self, body):
        path = self.path.split("?", 1)[0]
        m = GITHUB.match(path)
        if m:
            forge, repo, sha = "github", f"{m[1]}/{m[2]}", m[3]
        elif GITEA.match(path):
            m = GITEA.match(path)
            forge, repo, sha = "gitea", f"{m[1]}/{m[2]}", m[3]
        elif GITLAB.match(path):
            m = GITLAB.match(path)
            forge, repo, sha = "gitlab", unquote(m[1]), m[2]
        else:
            return self.answer(404, {"message": "Not Found"})
        scheme, ok = self.auth(forge)
        JOURNAL.append({"method": "POST", "path": path, "forge": forge, "repo": repo,
                        "sha": sha, "auth": scheme, "auth_ok": ok, "body": body,
                        "down": DOWN["down"]})
        if DOWN["down"]:
            return self.answer(503, {"message": "Service Unavailable"})
        if not ok:
            return self.answer(401, {"message": "Bad credentials" if forge == "github"
                                     else "401 Unauthorized"})
        if not SHA.match(sha):
            return self.answer(422, {"message": "sha must be 40 hex digits"})
        state = body.get("state")
        if forge == "gitlab":
            context = body.get("name") or body.get("context") or "default"
            if state not in GITLAB_EVENT:
                return self.answer(400, {"message": "state does not have a valid value"})
        else:
            context = body.get("context") or "default"
            allowed = ["error", "failure", "pending", "success"]
            if forge == "gitea":
                allowed.append("warning")
            if state not in allowed:
                return self.answer(422, {"message": "Validation Failed",
                                         "errors": [{"field": "state", "code": "invalid"}]})
        key = (forge, repo, sha, context)
        states = STATUSES.setdefault(key, [])
        if forge == "gitlab" and states and states[-1] == state:
            return self.answer(400, {"message":
                f"Cannot transition status via :{GITLAB_EVENT[state]} from :{state} "
                f"(Reason(s): Status cannot transition via \"{GITLAB_EVENT[state]}\")"})
        if forge == "github" and len(states) >= 1000:
            return self.answer(422, {"message": "This SHA and context has reached the maximum number of statuses."})
        states.append(state)
        self.answer(201, {"id": len(JOURNAL), "state": state, "context": context,
                          "description": body.get("description"),
                          "target_url": body.get("target_url")})


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
