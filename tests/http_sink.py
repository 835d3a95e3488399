#!/usr/bin/env python3
"""An HTTP receiver for the notification tests, on 127.0.0.1.

    http_sink.py PORT LOG [FAIL_FIRST]

Records every request as one JSON line in LOG: method, path, headers, body.
Answers the first FAIL_FIRST requests with 500 (to exercise retries), then 200.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, LOG = int(sys.argv[1]), sys.argv[2]
FAIL_FIRST = int(sys.argv[3]) if len(sys.argv) > 3 else 0
lock = threading.Lock()
seen = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def handle_any(self):
        global seen
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
        with lock:
            seen += 1
            failing = seen <= FAIL_FIRST
            with open(LOG, "a") as f:
                f.write(json.dumps({
                    "method": self.command,
                    "path": self.path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                    "answered": 500 if failing else 200,
                }) + "\n")
        reply = b"failing on purpose\n" if failing else b"ok\n"
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_POST = handle_any
    do_PUT = handle_any


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
