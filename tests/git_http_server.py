#!/usr/bin/env python3
"""A git smart-HTTP server for the tests: real `git http-backend` (CGI)
behind HTTP Basic authentication, on 127.0.0.1.

    git_http_server.py ROOT PORT USER TOKEN [CERT KEY]

With CERT and KEY (PEM) it serves https.

Every request must carry `Authorization: Basic base64(USER:TOKEN)`, like a
forge accepting a personal access token as the password; otherwise 401 with
`WWW-Authenticate`, which is what makes a git client ask for credentials.
Each request is logged to stderr as `METHOD PATH STATUS AUTH`, where AUTH is
`ok`, `none` or `bad` (never the credentials themselves).

A file `ROOT/.fail-next-request`, while it exists, makes the next request
fail with 502 Bad Gateway and is removed: one blip of a proxy in front of
a forge, after which the server answers again.
"""

import base64
import os
import ssl
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

ROOT, PORT, USER, TOKEN = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
EXPECTED = "Basic " + base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()
EXEC_PATH = subprocess.run(
    ["git", "--exec-path"], capture_output=True, text=True, check=True
).stdout.strip()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def note(self, status, auth):
        sys.stderr.write(f"{self.command} {self.path} {status} {auth}\n")
        sys.stderr.flush()

    def handle_any(self):
        try:
            os.remove(os.path.join(ROOT, ".fail-next-request"))
        except FileNotFoundError:
            pass
        else:
            body = b"upstream connect error\n"
            self.send_response(502)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.note(502, "blip")
            return
        given = self.headers.get("Authorization")
        if given != EXPECTED:
            body = b"authentication required\n"
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="git"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.note(401, "none" if given is None else "bad")
            return
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        env = dict(os.environ)
        env.update(
            {
                "GIT_PROJECT_ROOT": ROOT,
                "GIT_HTTP_EXPORT_ALL": "1",
                "REQUEST_METHOD": self.command,
                "PATH_INFO": url.path,
                "QUERY_STRING": url.query,
                "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                "CONTENT_LENGTH": str(len(body)),
                "REMOTE_USER": USER,
                "REMOTE_ADDR": "127.0.0.1",
                "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
            }
        )
        out = subprocess.run(
            [os.path.join(EXEC_PATH, "git-http-backend")],
            input=body,
            capture_output=True,
            env=env,
        ).stdout
        head, _, payload = out.partition(b"\r\n\r\n")
        if not _:
            head, _, payload = out.partition(b"\n\n")
        status = 200
        headers = []
        for line in head.decode("latin-1").splitlines():
            name, _, value = line.partition(":")
            if name.lower() == "status":
                status = int(value.strip().split()[0])
            elif name:
                headers.append((name, value.strip()))
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)
        self.note(status, "ok")

    do_GET = handle_any
    do_POST = handle_any


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    if len(sys.argv) > 6:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(sys.argv[5], sys.argv[6])
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    sys.stderr.write(f"listening on {PORT}\n")
    sys.stderr.flush()
    server.serve_forever()
