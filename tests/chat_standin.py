#!/usr/bin/env python3
"""A stand-in for an ntfy server's JSON publish and a Discord execute
webhook, on 127.0.0.1, for driftless's tests.

    chat_standin.py PORT NTFY_TOKEN DISCORD_WEBHOOK_PATH

Neither service can be reached from here. Each route is written from the
service's own source or published API documentation (facts only):

  POST /            ntfy "publish as JSON" (binwiederhier/ntfy
      docs/publish.md; server/server.go handlePublish; server/errors.go):
      JSON `topic` (`^[-_A-Za-z0-9]{1,64}$`, else 400 code 40009),
      `message`, `title`, `priority` 1-5 (else 400 code 40007), `tags`,
      `click`; an access-controlled topic wants `Authorization: Bearer
      <token>` (missing: 401 code 40101, wrong: 403 code 40301); a message
      over 4096 bytes (server/config.go DefaultMessageSizeLimit) would turn
      into an attachment, which this server refuses (400 code 40014, as
      with attachments disabled); success 200 with the message JSON
      (`id`, `time`, `event`: "message", ...). Errors are JSON
      `{code, http, error, link}`.
  POST /api/webhooks/{id}/{token}   Discord "Execute Webhook"
      (discord/discord-api-docs resources/webhook.md, resources/message.md
      "Embed Limits"): `content` <= 2000 characters, at most 10 `embeds`,
      an embed's title <= 256, description <= 4096, field name <= 256 and
      value <= 1024, all its text <= 6000 (else 400 {"code": 50035,
      "message": "Invalid Form Body"}); neither content nor embeds: 400 code
      50006 "Cannot send an empty message"; another token: 401 code 50027
      "Invalid Webhook Token"; success 204 (no `?wait=true`).

  POST /services/{T}/{B}/{token}   Slack incoming webhook (api.slack.com
      "Sending messages using incoming webhooks", "Handling errors";
      "Rate limits"; Block Kit "Section block": text at most 3000
      characters): a body that is not JSON is 400 `invalid_payload`; no
      `text` and no `blocks` is 400 `no_text`; a section whose text is over
      3000 characters is 400 `invalid_blocks`; a token `disabled` is 404
      `no_service`; rate-limited: 429 with Retry-After (seconds); success
      200 `ok`. Answers are plain text, not JSON.

Test controls (no service's), under /_standin/:
  GET  journal     every request in order: route, auth header, JSON body,
                   the status answered
  POST limit {"count": N}   the next N publishes/executes answer 429 (ntfy:
                   code 42901; Discord: "You are being rate limited." with
                   `retry_after` and a Retry-After header)
"""

import json
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
NTFY_TOKEN = sys.argv[2]
DISCORD_PATH = sys.argv[3]
LOCK = threading.Lock()
JOURNAL = []
LIMIT = {"count": 0}
TOPIC = re.compile(r"^[-_A-Za-z0-9]{1,64}$")


def ntfy_error(code, http, error):
    return http, {"code": code, "http": http, "error": error,
                  "link": "https://ntfy.sh/docs/publish/"}


def embed_chars(e):
    n = len(e.get("title") or "") + len(e.get("description") or "")
    for f in e.get("fields") or []:
        n += len(f.get("name") or "") + len(f.get("value") or "")
    return n


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, code, body, headers=()):
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_standin/journal":
            with LOCK:
                return self.answer(200, JOURNAL)
        self.answer(404, {"message": "404: Not Found", "code": 0})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        if self.path == "/_standin/limit":
            LIMIT["count"] = int((body or {}).get("count", 0))
            return self.answer(200, LIMIT)
        with LOCK:
            route = "ntfy" if self.path == "/" else (
                "discord" if self.path.startswith("/api/webhooks/") else (
                    "slack" if self.path.startswith("/services/") else None))
            if route is None:
                return self.answer(404, {"message": "404: Not Found", "code": 0})
            limited = LIMIT["count"] > 0
            if limited:
                LIMIT["count"] -= 1
            entry = {"route": route, "path": self.path, "body": body,
                     "authorization": self.headers.get("Authorization"),
                     "limited": limited}
            JOURNAL.append(entry)
            headers = ()
            if route == "ntfy":
                code, answer = self.ntfy(body, limited)
            elif route == "slack":
                code, answer, headers = self.slack(body, limited)
            else:
                code, answer, headers = self.discord(body, limited)
            entry["answered"] = code
            if route == "slack":
                return self.answer_text(code, answer, headers)
            self.answer(code, answer, headers)

    def answer_text(self, code, text, headers=()):
        data = text.encode()
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def slack(self, body, limited):
        if self.path.rstrip("/").endswith("/disabled"):
            return 404, "no_service", ()
        if limited:
            return 429, "rate_limited", [("Retry-After", "1")]
        if not isinstance(body, dict):
            return 400, "invalid_payload", ()
        if not body.get("text") and not body.get("blocks"):
            return 400, "no_text", ()
        for b in body.get("blocks") or []:
            if b.get("type") == "section" and len((b.get("text") or {}).get("text") or "") > 3000:
                return 400, "invalid_blocks", ()
        return 200, "ok", ()

    def ntfy(self, body, limited):
        if not isinstance(body, dict):
            return ntfy_error(40017, 400, "invalid request: request body must be message JSON")
        if not TOPIC.match(str(body.get("topic", ""))):
            return ntfy_error(40009, 400, "invalid request: topic invalid")
        auth = self.headers.get("Authorization")
        if auth is None:
            return ntfy_error(40101, 401, "unauthorized")
        if auth != f"Bearer {NTFY_TOKEN}":
            return ntfy_error(40301, 403, "forbidden")
        if limited:
            return ntfy_error(42901, 429, "limit reached: too many requests")
        p = body.get("priority", 3)
        if not isinstance(p, int) or not 1 <= p <= 5:
            return ntfy_error(40007, 400, "invalid priority parameter")
        if len(str(body.get("message", "")).encode()) > 4096:
            return ntfy_error(40014, 400, "invalid request: attachments not allowed")
        return 200, {"id": f"m{len(JOURNAL)}", "time": 0, "event": "message",
                     "topic": body["topic"], "message": body.get("message", ""),
                     "title": body.get("title"), "priority": p,
                     "tags": body.get("tags"), "click": body.get("click")}

    def discord(self, body, limited):
        if self.path.split("?", 1)[0] != DISCORD_PATH:
            return 401, {"message": "Invalid Webhook Token", "code": 50027}, ()
        if limited:
            return 429, {"message": "You are being rate limited.",
                         "retry_after": 0.5, "global": False}, [("Retry-After", "1")]
        if not isinstance(body, dict) or not (body.get("content") or body.get("embeds")):
            return 400, {"message": "Cannot send an empty message", "code": 50006}, ()
        embeds = body.get("embeds") or []
        bad = len(str(body.get("content") or "")) > 2000 or len(embeds) > 10
        for e in embeds:
            bad |= len(e.get("title") or "") > 256
            bad |= len(e.get("description") or "") > 4096
            bad |= embed_chars(e) > 6000
            for f in e.get("fields") or []:
                bad |= len(f.get("name") or "") > 256 or len(f.get("value") or "") > 1024
        if bad:
            return 400, {"message": "Invalid Form Body", "code": 50035}, ()
        return 204, None, ()


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
