#!/usr/bin/env python3
"""A fault-injecting proxy in front of moto's server, for driftless's
CloudFormation tests.

    cfn_proxy.py PORT UPSTREAM_PORT

Forwards every request to moto on 127.0.0.1:UPSTREAM_PORT unchanged. A test
can make the next N DescribeStacks answers for one stack report another
StackStatus -- moto settles every stack at once, so this is how a test sees
a stack stuck IN_PROGRESS (the timeout path) or one a failed create left in
ROLLBACK_COMPLETE:

    POST /_proxy/status  {"stack": "web", "status": "UPDATE_IN_PROGRESS", "times": 1000}
"""

import json
import re
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

PORT, UP = int(sys.argv[1]), int(sys.argv[2])
lock = threading.Lock()
rewrites = {}  # stack -> [status, times]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        if self.path == "/_proxy/status":
            c = json.loads(body)
            with lock:
                rewrites[c["stack"]] = [c["status"], c.get("times", 1)]
            return self.answer(200, b"{}", {"Content-Type": "application/json"})
        self.forward(body)

    def do_GET(self):
        self.forward(b"")

    def forward(self, body):
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        req = urllib.request.Request(f"http://127.0.0.1:{UP}{self.path}", data=body or None,
                                     headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                code, data, rh = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            code, data, rh = e.code, e.read(), dict(e.headers)
        action = (parse_qs(body.decode("utf-8", "replace")).get("Action") or [""])[0]
        target = self.headers.get("X-Amz-Target", "")
        if action == "DescribeStacks" or target.endswith("DescribeStacks"):
            data = self.rewrite(body, data)
        rh = {k: v for k, v in rh.items() if k.lower() not in ("content-length", "transfer-encoding", "connection")}
        self.answer(code, data, rh)

    def rewrite(self, body, data):
        text = data.decode("utf-8", "replace")
        with lock:
            for stack, rule in rewrites.items():
                if rule[1] <= 0 or stack not in text:
                    continue
                new = re.sub(r"<StackStatus>[A-Z_]+</StackStatus>", f"<StackStatus>{rule[0]}</StackStatus>", text)
                new = re.sub(r'"StackStatus"\s*:\s*"[A-Z_]+"', f'"StackStatus":"{rule[0]}"', new)
                if new != text:
                    rule[1] -= 1
                    text = new
        return text.encode()

    def answer(self, code, data, headers):
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
