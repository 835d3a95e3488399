#!/usr/bin/env python3
"""Drive headless Chromium over the Chrome DevTools Protocol for the page
tests: load a page, press a button, take screenshots, read the DOM.

    cdp.py PROFILE_DIR STEPS_JSON

STEPS_JSON is a list of steps, run in order in one tab:

    {"headers": {"Authorization": "Basic ..."}}   every later request carries them
    {"goto": "http://127.0.0.1:PORT/"}           navigate, wait for the load event
    {"click": "CSS selector"}                    click it, wait for the next load
    {"wait_url": "part"}                         wait until the tab has loaded a URL with it
    {"screenshot": "/path/file.png"}             the viewport as PNG
    {"html": "/path/file.html"}                  document.documentElement.outerHTML
    {"eval": "JS expression"}                    its value, printed
    {"media": "dark"}                            prefers-color-scheme emulated
    {"viewport": [390, 844]}                     a phone's viewport (mobile)
    {"wait_js": "JS expression"}                 poll until it is truthy; its value, printed
    {"request": {"url": ..., "method": "POST", "headers": {...}}}
                                                 an HTTP request from this script (not
                                                 the tab), its status printed

Prints one JSON line per step (the URL after a navigation or a click).
Exit 1 with a message on a protocol error, a missing element or a timeout.

The protocol calls used (Page.enable, Page.navigate, Page.loadEventFired,
Page.captureScreenshot, Network.enable, Network.setExtraHTTPHeaders,
Runtime.evaluate, Emulation.setEmulatedMedia,
Emulation.setDeviceMetricsOverride) and the DevToolsActivePort file in the profile directory
are as the Chrome DevTools Protocol documents them
(https://chromedevtools.github.io/devtools-protocol/); the tab is made with
PUT /json/new, which Chromium requires since version 111.
"""

import base64
import json
import os
import subprocess
import sys
import time
import urllib.request

import websocket  # PyPI: websocket-client

TIMEOUT = 30


class Tab:
    def __init__(self, ws_url):
        self.ws = websocket.create_connection(ws_url, timeout=TIMEOUT)
        self.next_id = 0
        self.events = []

    def call(self, method, **params):
        self.next_id += 1
        mine = self.next_id
        self.ws.send(json.dumps({"id": mine, "method": method, "params": params}))
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)
        raise RuntimeError(f"{method}: no answer in {TIMEOUT}s")

    def wait_event(self, name):
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            for i, e in enumerate(self.events):
                if e["method"] == name:
                    del self.events[: i + 1]
                    return e
            msg = json.loads(self.ws.recv())
            if "method" in msg:
                self.events.append(msg)
        raise RuntimeError(f"no {name} in {TIMEOUT}s")

    def evaluate(self, expression):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r.get("result", {}).get("value")


def main():
    profile, steps = sys.argv[1], json.loads(sys.argv[2])
    os.makedirs(profile, exist_ok=True)
    port_file = os.path.join(profile, "DevToolsActivePort")
    if os.path.exists(port_file):
        os.remove(port_file)
    chromium = subprocess.Popen(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1200,1000",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + TIMEOUT
        port = None
        while time.time() < deadline and port is None:
            try:
                with open(port_file) as f:
                    port = int(f.readline().strip())
            except (OSError, ValueError):
                time.sleep(0.1)
        if port is None:
            raise RuntimeError("chromium wrote no DevToolsActivePort")
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/json/new?about:blank", method="PUT"
        )
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            tab = Tab(json.load(r)["webSocketDebuggerUrl"])
        tab.call("Page.enable")
        tab.call("Network.enable")
        for step in steps:
            if "headers" in step:
                tab.call("Network.setExtraHTTPHeaders", headers=step["headers"])
                print(json.dumps({"headers": sorted(step["headers"])}))
            elif "goto" in step:
                tab.events.clear()
                tab.call("Page.navigate", url=step["goto"])
                tab.wait_event("Page.loadEventFired")
                print(json.dumps({"goto": tab.evaluate("location.href")}))
            elif "click" in step:
                sel = json.dumps(step["click"])
                tab.events.clear()
                found = tab.evaluate(
                    f"(() => {{ const e = document.querySelector({sel}); "
                    f"if (!e) return false; e.click(); return true; }})()"
                )
                if not found:
                    raise RuntimeError(f"no element matches {step['click']}")
                tab.wait_event("Page.loadEventFired")
                print(json.dumps({"click": step["click"], "now": tab.evaluate("location.href")}))
            elif "wait_url" in step:
                # A page that navigates by itself (a form it submits): poll
                # until the tab shows a URL with this in it, fully loaded.
                deadline = time.time() + TIMEOUT
                while True:
                    try:
                        now = tab.evaluate("[location.href, document.readyState]")
                    except RuntimeError:
                        now = None  # the document went away mid-call
                    if now and step["wait_url"] in now[0] and now[1] == "complete":
                        break
                    if time.time() > deadline:
                        raise RuntimeError(f"the tab never reached {step['wait_url']}: {now}")
                    time.sleep(0.1)
                print(json.dumps({"waited": now[0]}))
            elif "media" in step:
                tab.call("Emulation.setEmulatedMedia",
                         features=[{"name": "prefers-color-scheme", "value": step["media"]}])
                print(json.dumps({"media": step["media"]}))
            elif "viewport" in step:
                w, h = step["viewport"]
                tab.call("Emulation.setDeviceMetricsOverride",
                         width=w, height=h, deviceScaleFactor=1, mobile=True)
                print(json.dumps({"viewport": step["viewport"]}))
            elif "eval" in step:
                print(json.dumps({"eval": tab.evaluate(step["eval"])}))
            elif "wait_js" in step:
                deadline = time.time() + TIMEOUT
                while True:
                    value = tab.evaluate(step["wait_js"])
                    if value:
                        break
                    if time.time() > deadline:
                        raise RuntimeError(f"never true: {step['wait_js']}")
                    time.sleep(0.1)
                print(json.dumps({"wait_js": value}))
            elif "request" in step:
                r = step["request"]
                req = urllib.request.Request(
                    r["url"], method=r.get("method", "GET"), headers=r.get("headers", {}),
                    data=b"" if r.get("method", "GET") == "POST" else None,
                )
                with urllib.request.urlopen(req, timeout=TIMEOUT) as answer:
                    print(json.dumps({"request": r["url"], "status": answer.status}))
            elif "screenshot" in step:
                shot = tab.call("Page.captureScreenshot", format="png")
                with open(step["screenshot"], "wb") as f:
                    f.write(base64.b64decode(shot["data"]))
                print(json.dumps({"screenshot": step["screenshot"]}))
            elif "html" in step:
                with open(step["html"], "w") as f:
                    f.write(tab.evaluate("document.documentElement.outerHTML"))
                print(json.dumps({"html": step["html"]}))
            else:
                raise RuntimeError(f"unknown step {step}")
    except Exception as e:  # noqa: BLE001 — reported to the test, exit 1
        print(f"cdp: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        chromium.kill()
        chromium.wait()


if __name__ == "__main__":
    main()
