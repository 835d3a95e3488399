#!/usr/bin/env python3
"""A real SMTP server (aiosmtpd) that requires AUTH, for driftless's tests.

    smtp_auth_server.py PORT MAILDIR USER PASSWORD

Accepts mail only after AUTH PLAIN or LOGIN with USER / PASSWORD (without
TLS: loopback only), stores it in MAILDIR, and logs each AUTH attempt
("auth ok MECHANISM" / "auth refused MECHANISM") to MAILDIR/../auth.log.
"""

import mailbox
import os
import sys
import time

from aiosmtpd.controller import Controller
from aiosmtpd.handlers import Mailbox
from aiosmtpd.smtp import AuthResult, LoginPassword

PORT, MAILDIR, USER, PASSWORD = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
LOG = os.path.join(os.path.dirname(MAILDIR.rstrip("/")), "auth.log")


def authenticator(server, session, envelope, mechanism, auth_data):
    ok = (isinstance(auth_data, LoginPassword)
          and auth_data.login.decode() == USER
          and auth_data.password.decode() == PASSWORD)
    with open(LOG, "a") as f:
        f.write(f"auth {'ok' if ok else 'refused'} {mechanism}\n")
    return AuthResult(success=ok)


mailbox.Maildir(MAILDIR, create=True)
controller = Controller(Mailbox(MAILDIR), hostname="127.0.0.1", port=PORT,
                        authenticator=authenticator, auth_required=True,
                        auth_require_tls=False)
controller.start()
while True:
    time.sleep(3600)
