#!/usr/bin/env python3
"""A stand-in for the commit-status endpoints of GitHub, Gitea/Forgejo and
GitLab, on 127.0.0.1, for driftless's tests.

    forge_standin.py PORT TOKEN

No forge server can be installed here. Each endpoint is written from the
forge's published API description (facts only, cited per route below), with
its status codes and the behaviour that hurts a client:

  POST [/api/v3]/repos/{owner}/{repo}/statuses/{sha} GitHub REST, "Create a
      commit status" (github/rest-api-description, repos/create-commit-
      status): body state (error|failure|pending|success), target_url,
      description, context (default "default"); `Authorization: Bearer` or
      `token`; 201 with the status; 422 for another state; at most 1000
      statuses per sha and context (422 after that). A description over
      140 characters is 422 "description is too long (maximum is 140
      characters)" (GitHub's validation answer; it counts characters, not
      bytes). A token without write access to statuses is 403 "Resource
      not accessible by personal access token" (GitHub REST
      "Troubleshooting": 403 for insufficient permissions).
  POST /api/v1/repos/{owner}/{repo}/statuses/{sha}   Gitea and Forgejo
      (swagger `repoCreateStatus`, `CreateStatusOption`): the same fields,
      states pending|success|error|failure|warning; `Authorization: token`;
      201. The description is a TEXT column (models/git/commit_status.go):
      no length limit. A token without the write:repository scope is 403.
  POST /api/v4/projects/{id}/statuses/{sha}          GitLab "Set the pipeline
      status of a commit" (doc/api/commits.md): `id` the project id or its
      URL-encoded path; state pending|running|success|failed|canceled
      (else 400); `name` (or `context`) the status name, default
      "default"; `PRIVATE-TOKEN`; 201. A status is found again to update
      only while it is pending or running
      (app/services/ci/create_commit_status_service.rb,
      `external_commit_status_scope`: `running_or_pending`), so posting
      pending or running to a status already in that state answers 400
      {"message": "Cannot transition status via :<event> from :<state>
      ..."} (gitlab-foss#25807), while success, failed or canceled again
      make a new status. A description over 255 characters is 400 with the
      model's validation errors (lib/api/commit_statuses.rb: "Must be 255
      characters or fewer"; the service's `bad_request(commit_status.errors
      .messages)`). A token without the api scope is 403 "403 Forbidden".

Pull request comments (every pull request is an issue on GitHub and
Gitea; GitLab calls them notes on a merge request):

  GET|POST /repos/{owner}/{repo}/issues/{n}/comments      GitHub REST "List
      issue comments" (`per_page` default 30, at most 100; `page`, from 1)
      and "Create an issue comment" (body `body`; 201 with the comment and
      its numeric `id`; a body over 65,536 characters is 422 "body is too
      long (maximum is 65536 characters)").
  PATCH /repos/{owner}/{repo}/issues/comments/{id}         "Update an issue
      comment" (200; 404 for a comment that is gone).
  GET|POST|PATCH the same under /api/v1                    Gitea and Forgejo
      (swagger issueGetComments: the whole list in one answer;
      issueCreateComment 201; issueEditComment 200, 404).
  GET|POST /api/v4/projects/{id}/merge_requests/{iid}/notes  GitLab "List
      all merge request notes" (`per_page` default 20, at most 100; `page`;
      `sort`) and "Create new merge request note" (201; over 1,000,000
      characters is 400); PUT …/notes/{note_id} "Modify existing merge
      request note" (200; 404).

Comment ids are large numbers, as on the real forges, and every listing
starts with a comment a person wrote.

GitHub's routes are served at the root (api.github.com) and under /api/v3
(GitHub Enterprise Server, whose API root that is; a stand-in on
127.0.0.1 is such a server to driftless). A wrong or missing token is 401
on every forge; TOKEN followed by "-ro"
is a valid token that may only read (403 on every status and comment); a sha that is not 40 hex
digits is 422. Test controls (not any forge's), under /_standin/:
  GET  journal      every API request in order: method, path, the auth
                    header's scheme and whether it matched, body
  GET  statuses     the current state per (path prefix, sha, context)
  GET  comments     every comment: forge, repo, number, id, body, edits
  POST down {"down": true|false}   answer every API request 503 while down
  POST delete {"id": N}            delete a comment, as a person would
  POST ratelimit {"shape": "primary"|"secondary"|"gitlab", "seconds": N,
                  "retry_after": S}
                                   every API request answers the forge's
                                   rate-limit shape for N seconds (see
                                   `limited` for the shapes and sources)
  POST orphan {"sha": S}           a commit no branch contains: GitLab
                                   answers 404 "References for commit Not
                                   Found" for it unless `ref` is given
                                   (Ci::CreateCommitStatusService#validate)
"""

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

PORT = int(sys.argv[1])
TOKEN = sys.argv[2]
LOCK = threading.Lock()
JOURNAL = []
STATUSES = {}  # (forge, repo, sha, context) -> list of states, in order
DOWN = {"down": False}
# Commits no branch contains (a force-pushed head, a fork's merge request):
# GitLab needs `ref` for them.
ORPHANS = set()
# A rate limit in force: {"shape": "primary"|"secondary"|"gitlab", "until":
# epoch seconds, "retry_after": seconds or None}.
RATE = {}

GITHUB = re.compile(r"^(?:/api/v3)?/repos/([^/]+)/([^/]+)/statuses/([^/]+)$")
GITEA = re.compile(r"^/api/v1/repos/([^/]+)/([^/]+)/statuses/([^/]+)$")
GITLAB = re.compile(r"^/api/v4/projects/([^/]+)/statuses/([^/]+)$")
GITHUB_COMMENTS = re.compile(r"^(?:/api/v3)?/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")
GITHUB_COMMENT = re.compile(r"^(?:/api/v3)?/repos/([^/]+)/([^/]+)/issues/comments/(\d+)$")
GITEA_COMMENTS = re.compile(r"^/api/v1/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")
GITEA_COMMENT = re.compile(r"^/api/v1/repos/([^/]+)/([^/]+)/issues/comments/(\d+)$")
GITLAB_NOTES = re.compile(r"^/api/v4/projects/([^/]+)/merge_requests/(\d+)/notes$")
GITLAB_NOTE = re.compile(r"^/api/v4/projects/([^/]+)/merge_requests/(\d+)/notes/(\d+)$")
COMMENTS = []  # dicts: forge, repo, number, id, body, edits
NEXT_ID = [1_874_000_000]
LIMIT = {"github": 65536, "gitea": 65536, "gitlab": 1000000}
SHA = re.compile(r"^[0-9a-f]{40}$")
GITLAB_EVENT = {"pending": "enqueue", "running": "run", "success": "success",
                "failed": "drop", "canceled": "cancel"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with LOCK:
            if self.path == "/_standin/journal":
                return self.answer(200, JOURNAL)
            if self.path == "/_standin/comments":
                return self.answer(200, COMMENTS)
            if self.path == "/_standin/statuses":
                return self.answer(200, [
                    {"forge": k[0], "repo": k[1], "sha": k[2], "context": k[3], "states": v}
                    for k, v in STATUSES.items()
                ])
            if self.comments("GET", None):
                return
        self.answer(404, {"message": "Not Found"})

    def read_body(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return None

    def do_PATCH(self):
        self.edit("PATCH")

    def do_PUT(self):
        self.edit("PUT")

    def edit(self, method):
        body = self.read_body()
        if body is None:
            return self.answer(400, {"message": "Problems parsing JSON"})
        with LOCK:
            if not self.comments(method, body):
                self.answer(404, {"message": "Not Found"})

    def comments(self, method, body):
        """The comment routes; False when the path is none of them."""
        path, _, query = self.path.partition("?")
        params = dict(p.split("=", 1) for p in query.split("&") if "=" in p)
        route = None
        for forge, rx, kind in [
                ("github", GITHUB_COMMENTS, "list"), ("github", GITHUB_COMMENT, "one"),
                ("gitea", GITEA_COMMENTS, "list"), ("gitea", GITEA_COMMENT, "one"),
                ("gitlab", GITLAB_NOTES, "list"), ("gitlab", GITLAB_NOTE, "one")]:
            m = rx.match(path)
            if m:
                route = (forge, m, kind)
                break
        if route is None:
            return False
        forge, m, kind = route
        if forge == "gitlab":
            repo, number = unquote(m[1]), int(m[2])
            cid = int(m[3]) if kind == "one" else None
        elif kind == "list":
            repo, number, cid = f"{m[1]}/{m[2]}", int(m[3]), None
        else:
            repo, number, cid = f"{m[1]}/{m[2]}", None, int(m[3])
        scheme, ok, readonly = self.auth(forge)
        JOURNAL.append({"method": method, "path": path, "forge": forge, "repo": repo,
                        "number": number, "comment": cid, "auth": scheme, "auth_ok": ok,
                        "body": body, "down": DOWN["down"],
                        "limited": bool(RATE) and time.time() < RATE["until"]})
        if DOWN["down"]:
            self.answer(503, {"message": "Service Unavailable"})
            return True
        if self.limited(forge):
            return True
        if not ok:
            self.answer(401, {"message": "401 Unauthorized"})
            return True
        if readonly and method != "GET":
            self.forbidden(forge)
            return True
        edit_method = "PUT" if forge == "gitlab" else "PATCH"
        if kind == "list" and method == "GET":
            mine = [c for c in COMMENTS
                    if c["forge"] == forge and c["repo"] == repo and c["number"] == number]
            person = {"id": 17, "body": "Looks good to me, but let us see the plan."}
            listing = [person] + [{"id": c["id"], "body": c["body"]} for c in mine]
            if forge != "gitea":
                per = min(int(params.get("per_page", "30" if forge == "github" else "20")), 100)
                page = int(params.get("page", "1"))
                listing = listing[(page - 1) * per: page * per]
            self.answer(200, listing)
        elif kind == "list" and method == "POST":
            text = (body or {}).get("body")
            if not isinstance(text, str) or not text:
                self.answer(422 if forge != "gitlab" else 400, {"message": "body is missing"})
            elif len(text) > LIMIT[forge]:
                self.answer(422 if forge != "gitlab" else 400, {"message":
                    f"body is too long (maximum is {LIMIT[forge]} characters)"})
            else:
                NEXT_ID[0] += 7
                c = {"forge": forge, "repo": repo, "number": number, "id": NEXT_ID[0],
                     "body": text, "edits": 0}
                COMMENTS.append(c)
                self.answer(201, {"id": c["id"], "body": text})
        elif kind == "one" and method == edit_method:
            found = [c for c in COMMENTS if c["forge"] == forge and c["id"] == cid
                     and c["repo"] == repo and (number is None or c["number"] == number)]
            text = (body or {}).get("body")
            if not found:
                self.answer(404, {"message": "Not Found"})
            elif not isinstance(text, str) or len(text) > LIMIT[forge]:
                self.answer(422, {"message": "body is too long or missing"})
            else:
                found[0]["body"] = text
                found[0]["edits"] += 1
                self.answer(200, {"id": cid, "body": text})
        else:
            self.answer(405, {"message": "Method Not Allowed"})
        return True

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
        if self.path == "/_standin/ratelimit":
            with LOCK:
                RATE.clear()
                RATE.update({"shape": body.get("shape", "primary"),
                              "until": time.time() + float(body.get("seconds", 0)),
                              "retry_after": body.get("retry_after")})
            return self.answer(200, {})
        if self.path == "/_standin/orphan":
            with LOCK:
                ORPHANS.add(body.get("sha"))
            return self.answer(200, {})
        if self.path == "/_standin/delete":
            with LOCK:
                COMMENTS[:] = [c for c in COMMENTS if c["id"] != body.get("id")]
            return self.answer(200, {})
        with LOCK:
            if not self.comments("POST", body):
                self.api(body)

    def auth(self, forge):
        """(the auth header's scheme, valid, read-only)"""
        if forge == "gitlab":
            given = self.headers.get("PRIVATE-TOKEN")
            return "PRIVATE-TOKEN", given in (TOKEN, TOKEN + "-ro"), given == TOKEN + "-ro"
        h = self.headers.get("Authorization") or ""
        scheme, _, value = h.partition(" ")
        ok = value in (TOKEN, TOKEN + "-ro") and (
            scheme in ("Bearer", "token") if forge == "github" else scheme == "token")
        return scheme or "-", ok, value == TOKEN + "-ro"

    def limited(self, forge):
        """The answer of a spent rate limit, in the forge's shape, while one
        is in force; False otherwise.
        - GitHub REST "Rate limits for the REST API": the primary limit is
          403 with x-ratelimit-limit/-remaining (0)/-used/-reset (epoch
          seconds)/-resource and "API rate limit exceeded for ..."; a
          secondary limit is 403 "You have exceeded a secondary rate
          limit...", with retry-after when GitHub gives one.
        - GitLab "Rate limits": 429 "Retry later" with RateLimit-Limit,
          -Observed, -Remaining, -Reset (epoch seconds), -ResetTime and
          Retry-After.
        - Gitea/Forgejo: 429."""
        if not RATE or time.time() >= RATE["until"]:
            return False
        reset = str(int(RATE["until"]) + 1)
        wait = str(max(1, int(RATE["until"] - time.time()) + 1))
        if forge == "github" and RATE["shape"] == "primary":
            self.answer(403, {"message": "API rate limit exceeded for user ID 1.",
                              "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
                              "status": "403"},
                        [("x-ratelimit-limit", "5000"), ("x-ratelimit-remaining", "0"),
                         ("x-ratelimit-used", "5000"), ("x-ratelimit-reset", reset),
                         ("x-ratelimit-resource", "core")])
        elif forge == "github":
            extra = [("retry-after", str(RATE["retry_after"]))] if RATE.get("retry_after") else []
            self.answer(403, {"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                              "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
                              "status": "403"}, extra)
        elif forge == "gitlab":
            self.answer(429, {"message": "Retry later"},
                        [("RateLimit-Limit", "600"), ("RateLimit-Observed", "601"),
                         ("RateLimit-Remaining", "0"), ("RateLimit-Reset", reset),
                         ("Retry-After", wait)])
        else:
            self.answer(429, {"message": "rate limit exceeded"})
        return True

    def forbidden(self, forge):
        """The forge's answer to a token that may only read."""
        if forge == "github":
            return self.answer(403, {
                "message": "Resource not accessible by personal access token",
                "documentation_url": "https://docs.github.com/rest/commits/statuses#create-a-commit-status",
                "status": "403"})
        if forge == "gitlab":
            return self.answer(403, {"message": "403 Forbidden"})
        return self.answer(403, {"message":
            "token does not have at least one of required scope(s): [write:repository]"})

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
        scheme, ok, readonly = self.auth(forge)
        JOURNAL.append({"method": "POST", "path": path, "forge": forge, "repo": repo,
                        "sha": sha, "auth": scheme, "auth_ok": ok, "body": body,
                        "down": DOWN["down"],
                        "limited": bool(RATE) and time.time() < RATE["until"]})
        if DOWN["down"]:
            return self.answer(503, {"message": "Service Unavailable"})
        if self.limited(forge):
            return
        if not ok:
            return self.answer(401, {"message": "Bad credentials" if forge == "github"
                                     else "401 Unauthorized"})
        if readonly:
            return self.forbidden(forge)
        description = body.get("description") or ""
        if forge == "github" and len(description) > 140:
            return self.answer(422, {
                "message": "Validation Failed",
                "errors": [{"resource": "Status", "code": "custom", "field": "description",
                            "message": "description is too long (maximum is 140 characters)"}],
                "documentation_url": "https://docs.github.com/rest/commits/statuses#create-a-commit-status",
                "status": "422"})
        if forge == "gitlab" and len(description) > 255:
            return self.answer(400, {"message": {
                "description": ["is too long (maximum is 255 characters)"]}})
        if not SHA.match(sha):
            return self.answer(422, {"message": "sha must be 40 hex digits"})
        state = body.get("state")
        if forge == "gitlab" and not body.get("ref") and sha in ORPHANS:
            return self.answer(404, {"message": "404 References for commit Not Found"})
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
        if forge == "gitlab" and states and states[-1] == state and state in ("pending", "running"):
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
