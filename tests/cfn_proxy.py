#!/usr/bin/env python3
"""A proxy in front of moto's server that makes it answer the way AWS does
where moto does not, for driftless's CloudFormation tests.

    cfn_proxy.py PORT UPSTREAM_PORT

Forwards every request (CloudFormation, STS and S3 alike) to moto on
127.0.0.1:UPSTREAM_PORT. moto (getmoto/moto, moto/cloudformation) settles
every stack at once inside ExecuteChangeSet, enforces no template limits and
no capabilities, and its stack events carry no ClientRequestToken. AWS, per
its CloudFormation API reference:

- refuses a TemplateBody over 51,200 bytes (CreateStack, UpdateStack,
  CreateChangeSet): a ValidationError "Member must have length less than or
  equal to 51200" -- enforced here on every request;
- refuses a template with IAM resources unless the caller acknowledges
  CAPABILITY_IAM (or CAPABILITY_NAMED_IAM when they have custom names):
  InsufficientCapabilitiesException "Requires capabilities : [CAPABILITY_IAM]"
  -- enforced here for TemplateBody;
- runs a change set's execution asynchronously after ExecuteChangeSet has
  answered (the API reference: ExecuteChangeSet "updates a stack using the
  input information that was provided when the specified change set was
  created"; the stack then goes through its *_IN_PROGRESS statuses) and
  reports its progress as stack events, stamped by AWS's clock. Its first
  DescribeStacks answers after the execute can still show the previous
  operation's end state: that stale read is not a behaviour the API
  reference documents — it is a hostile case injected here so that a
  client that trusted the first answer after an execute would be caught;
- describes a stack with its `ChangeSetId` (the API reference's Stack data
  type: "The unique ID of the change set"), which moto leaves out: here the
  ARN of the last change set executed on the stack through this proxy;
- says of each `Modify` in DescribeChangeSet whether the resource is
  replaced: the API reference's ResourceChange data type, `Replacement`
  (True | False | Conditional: "For the Modify action, indicates whether
  CloudFormation will replace the resource by creating a new one and
  deleting the old one"), with `Scope` and per-property `Details`
  (`Target.RequiresRecreation` Always | Never | Conditionally). moto leaves
  all three out. Here a Modify is True when a property the CloudFormation
  resource reference marks "Update requires: Replacement" (REPLACED_BY,
  below) differs between the stack's template and the change set's
  (TemplateBody only), else False; Conditional is not modelled.

Test controls:

    POST /_proxy/status  {"stack": "web", "status": "UPDATE_IN_PROGRESS",
                          "times": 1000, "after_execute": false}
        the next `times` DescribeStacks answers for the stack report that
        status (with after_execute: only once the next ExecuteChangeSet
        for it has been forwarded -- a stale answer)
    POST /_proxy/execution {"stack": "web", "steps": [[event, ...], ...],
                            "statuses": ["UPDATE_COMPLETE", ...],
                            "clock_skew": -3600}
        the next ExecuteChangeSet for the stack is answered like AWS but not
        run by moto: each DescribeStackEvents reveals one more step of
        events (event = [LogicalResourceId, ResourceType, ResourceStatus,
        ResourceStatusReason]), newest first above moto's own, stamped with
        this machine's clock plus clock_skew seconds; each DescribeStacks
        reports the next of `statuses` (the last one repeats)
    GET  /_proxy/log     the actions seen so far, with a few of their
                         parameters (StackName, ChangeSetName — the name or
                         the ARN, as the CloudFormation API reference allows
                         for Describe/Execute/DeleteChangeSet —,
                         ClientRequestToken, TemplateURL)
"""

import json
import re
import sys
import threading
import urllib.error
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

PORT, UP = int(sys.argv[1]), int(sys.argv[2])
lock = threading.Lock()
rewrites = {}    # stack -> {status, times, after_execute}
executions = {}  # stack -> script (armed, then running)
made_by = {}     # stack -> ARN of the change set last executed on it
templates = {}   # (stack, change set name) -> the TemplateBody it was made from
current = {}     # stack -> the template of the change set last executed on it

# Properties whose change replaces the resource, per the CloudFormation
# resource type reference ("Update requires: Replacement").
REPLACED_BY = {
    "AWS::SSM::Parameter": ("Name",),
    "AWS::S3::Bucket": ("BucketName",),
    "AWS::SQS::Queue": ("QueueName", "FifoQueue"),
    "AWS::SNS::Topic": ("TopicName", "FifoTopic"),
    "AWS::IAM::Role": ("RoleName", "Path"),
}
log = []

TEMPLATE_BODY_LIMIT = 51200
IAM_NAMES = ("RoleName", "UserName", "GroupName", "ManagedPolicyName", "InstanceProfileName")


def aws_error(code, message, status=400):
    """The awsQuery error document AWS answers with."""
    body = ('<ErrorResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">'
            f'<Error><Type>Sender</Type><Code>{code}</Code><Message>{message}</Message></Error>'
            f'<RequestId>{uuid.uuid4()}</RequestId></ErrorResponse>').encode()
    return status, body, {"Content-Type": "text/xml"}


def capabilities_needed(template, given):
    """AWS: IAM resources need CAPABILITY_IAM, IAM resources with custom
    names CAPABILITY_NAMED_IAM (which covers both)."""
    try:
        t = json.loads(template)
    except ValueError:
        return None
    iam = [r for r in (t.get("Resources") or {}).values()
           if isinstance(r, dict) and str(r.get("Type", "")).startswith("AWS::IAM::")]
    if not iam:
        return None
    named = any(k in (r.get("Properties") or {}) for r in iam for k in IAM_NAMES)
    need = "CAPABILITY_NAMED_IAM" if named else "CAPABILITY_IAM"
    if "CAPABILITY_NAMED_IAM" in given or (need == "CAPABILITY_IAM" and "CAPABILITY_IAM" in given):
        return None
    return need


def change_set_name(name_or_arn):
    """A change set's name from its name or its ARN (.../changeSet/NAME/id)."""
    m = re.search(r":changeSet/([^/]+)/", name_or_arn)
    return m.group(1) if m else name_or_arn


def resources(template):
    try:
        return (json.loads(template).get("Resources") or {}) if template else {}
    except ValueError:
        return {}


def with_replacement(text, old, new):
    """DescribeChangeSet's XML with Replacement, Scope and Details added to
    each Modify that has none, from the two templates' properties."""
    old_r, new_r = resources(old), resources(new)

    def one(m):
        block = m.group(0)
        if "<Action>Modify</Action>" not in block or "<Replacement>" in block:
            return block
        lid = re.search(r"<LogicalResourceId>([^<]+)</LogicalResourceId>", block)
        lid = lid.group(1) if lid else ""
        a = (old_r.get(lid) or {}).get("Properties") or {}
        b = (new_r.get(lid) or {}).get("Properties") or {}
        rtype = (new_r.get(lid) or {}).get("Type", "")
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        replaced = [k for k in changed if k in REPLACED_BY.get(rtype, ())]
        details = "".join(
            "<member><Target><Attribute>Properties</Attribute>"
            f"<Name>{k}</Name><RequiresRecreation>{'Always' if k in replaced else 'Never'}"
            "</RequiresRecreation></Target><Evaluation>Static</Evaluation>"
            "<ChangeSource>DirectModification</ChangeSource></member>" for k in changed)
        extra = (f"<Replacement>{'True' if replaced else 'False'}</Replacement>"
                 "<Scope><member>Properties</member></Scope>"
                 f"<Details>{details}</Details>" if changed else
                 "<Replacement>False</Replacement><Scope><member>Properties</member></Scope>")
        return block.replace("<Action>Modify</Action>", "<Action>Modify</Action>" + extra, 1)

    return re.sub(r"<ResourceChange>.*?</ResourceChange>", one, text, flags=re.S)


def event_xml(stack, stack_id, ev, at):
    logical, rtype, status, reason = ev
    physical = stack_id if rtype == "AWS::CloudFormation::Stack" else f"{logical}-physical"
    reason_xml = f"<ResourceStatusReason>{reason}</ResourceStatusReason>" if reason else ""
    return (f"<member><StackId>{stack_id}</StackId><EventId>{uuid.uuid4()}</EventId>"
            f"<StackName>{stack}</StackName><LogicalResourceId>{logical}</LogicalResourceId>"
            f"<PhysicalResourceId>{physical}</PhysicalResourceId><ResourceType>{rtype}</ResourceType>"
            f"<Timestamp>{at.strftime('%Y-%m-%dT%H:%M:%S.%f')[:-3]}Z</Timestamp>"
            f"<ResourceStatus>{status}</ResourceStatus>{reason_xml}</member>")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def do_POST(self):
        body = self.body()
        if self.path == "/_proxy/status":
            c = json.loads(body)
            with lock:
                rewrites[c["stack"]] = {"status": c["status"], "times": c.get("times", 1),
                                        "after_execute": c.get("after_execute", False)}
            return self.answer(200, b"{}", {"Content-Type": "application/json"})
        if self.path == "/_proxy/execution":
            c = json.loads(body)
            with lock:
                executions[c["stack"]] = {"steps": c["steps"], "statuses": c["statuses"],
                                          "skew": c.get("clock_skew", 0), "running": False,
                                          "revealed": [], "step": 0, "status_i": 0}
            return self.answer(200, b"{}", {"Content-Type": "application/json"})
        self.forward(body)

    def do_GET(self):
        if self.path == "/_proxy/log":
            with lock:
                data = json.dumps(log).encode()
            return self.answer(200, data, {"Content-Type": "application/json"})
        self.forward(b"")

    def do_PUT(self):
        self.forward(self.body())

    def do_HEAD(self):
        self.forward(b"")

    def do_DELETE(self):
        self.forward(self.body())

    def forward(self, body):
        params = {}
        if self.command == "POST" and "form-urlencoded" in (self.headers.get("Content-Type") or ""):
            params = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        action = params.get("Action", "")
        stack = params.get("StackName", "")
        with lock:
            log.append({"method": self.command, "path": self.path.split("?")[0], "action": action,
                        "length": len(body),
                        "decoded_length": int(self.headers.get("x-amz-decoded-content-length") or len(body)),
                        "stack": stack, "has_template_body": "TemplateBody" in params,
                        "template_url": params.get("TemplateURL"),
                        "client_request_token": params.get("ClientRequestToken"),
                        "change_set_name": params.get("ChangeSetName")})
        refused = self.refuse(action, params)
        if refused:
            return self.answer(*refused)
        if action == "CreateChangeSet" and "TemplateBody" in params:
            with lock:
                templates[(stack, params.get("ChangeSetName", ""))] = params["TemplateBody"]
        if action == "ExecuteChangeSet":
            with lock:
                name = change_set_name(params.get("ChangeSetName", ""))
                # The stack name may be left out when the change set is named by its ARN.
                for (s, n), t in templates.items():
                    if n == name and (not stack or s == stack):
                        current[s] = t
        if action == "ExecuteChangeSet":
            # The API reference's Stack data type: `ChangeSetId`, the change
            # set the stack was last created or updated from (moto leaves it
            # out of DescribeStacks; added in rewrite_status).
            name = params.get("ChangeSetName", "")
            with lock:
                made_by[stack] = name if name.startswith("arn:") else (
                    f"arn:aws:cloudformation:us-east-1:123456789012:changeSet/{name}/{uuid.uuid4()}")
        if action == "ExecuteChangeSet":
            with lock:
                script = executions.get(stack)
                if script is not None and not script["running"]:
                    script["running"] = True
                    doc = ('<ExecuteChangeSetResponse xmlns="http://cloudformation.amazonaws.com/doc/2010-05-15/">'
                           f'<ExecuteChangeSetResult/><ResponseMetadata><RequestId>{uuid.uuid4()}</RequestId>'
                           '</ResponseMetadata></ExecuteChangeSetResponse>').encode()
                    return self.answer(200, doc, {"Content-Type": "text/xml"})
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        req = urllib.request.Request(f"http://127.0.0.1:{UP}{self.path}", data=body or None,
                                     headers=headers, method=self.command)
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                code, data, rh = r.status, r.read(), dict(r.headers)
        except urllib.error.HTTPError as e:
            code, data, rh = e.code, e.read(), dict(e.headers)
        if action == "ExecuteChangeSet":
            with lock:
                for s, rule in rewrites.items():
                    if s == stack and rule["after_execute"]:
                        rule["after_execute"] = False
        if action == "DescribeStacks":
            data = self.rewrite_status(data)
        if action == "DescribeChangeSet" and code == 200:
            name = change_set_name(params.get("ChangeSetName", ""))
            with lock:
                found = [(s, t) for (s, n), t in templates.items()
                         if n == name and (not stack or s == stack)]
                old = current.get(found[0][0]) if found else None
            if found:
                data = with_replacement(data.decode("utf-8", "replace"), old, found[0][1]).encode()
        if action == "DescribeStackEvents":
            data = self.add_events(stack, data)
        rh = {k: v for k, v in rh.items() if k.lower() not in ("content-length", "transfer-encoding", "connection")}
        self.answer(code, data, rh)

    def refuse(self, action, params):
        """What AWS refuses and moto does not."""
        if action not in ("CreateStack", "UpdateStack", "CreateChangeSet"):
            return None
        # A stack in a state AWS updates nothing from (made by the status
        # control, as moto has none of them): the API reference's
        # UpdateStack/CreateChangeSet ValidationError "Stack:<arn> is in
        # <STATE> state and can not be updated." UPDATE_ROLLBACK_FAILED
        # needs ContinueUpdateRollback first; ROLLBACK_FAILED and
        # DELETE_FAILED can only be deleted.
        stack = params.get("StackName", "")
        with lock:
            rule = rewrites.get(stack)
            stuck = rule["status"] if rule and rule["times"] > 0 and not rule["after_execute"] else None
        if stuck in ("UPDATE_ROLLBACK_FAILED", "ROLLBACK_FAILED", "DELETE_FAILED"):
            return aws_error("ValidationError",
                             f"Stack:arn:aws:cloudformation:us-east-1:123456789012:stack/{stack}/0 "
                             f"is in {stuck} state and can not be updated.")
        template = params.get("TemplateBody")
        if template is None:
            return None
        if len(template.encode()) > TEMPLATE_BODY_LIMIT:
            return aws_error("ValidationError",
                             "1 validation error detected: Value at 'templateBody' failed to satisfy "
                             f"constraint: Member must have length less than or equal to {TEMPLATE_BODY_LIMIT}")
        given = [v for k, v in params.items() if k.startswith("Capabilities.member.")]
        need = capabilities_needed(template, given)
        if need:
            return aws_error("InsufficientCapabilitiesException", f"Requires capabilities : [{need}]")
        return None

    def rewrite_status(self, data):
        text = data.decode("utf-8", "replace")
        with lock:
            for stack, arn in made_by.items():
                if "<ChangeSetId>" not in text:
                    text = text.replace(f"<StackName>{stack}</StackName>",
                                        f"<StackName>{stack}</StackName><ChangeSetId>{arn}</ChangeSetId>", 1)
            for stack, script in executions.items():
                if script["running"] and f"<StackName>{stack}</StackName>" in text:
                    statuses = script["statuses"]
                    status = statuses[min(script["status_i"], len(statuses) - 1)]
                    script["status_i"] += 1
                    text = re.sub(r"<StackStatus>[A-Z_]+</StackStatus>", f"<StackStatus>{status}</StackStatus>", text)
            for stack, rule in rewrites.items():
                if rule["times"] <= 0 or rule["after_execute"] or stack not in text:
                    continue
                new = re.sub(r"<StackStatus>[A-Z_]+</StackStatus>", f"<StackStatus>{rule['status']}</StackStatus>", text)
                if new != text:
                    rule["times"] -= 1
                    text = new
        return text.encode()

    def add_events(self, stack, data):
        text = data.decode("utf-8", "replace")
        with lock:
            script = executions.get(stack)
            if script is None or not script["running"]:
                return data
            m = re.search(r"<StackId>([^<]+)</StackId>", text)
            stack_id = m.group(1) if m else f"arn:aws:cloudformation:us-east-1:123456789012:stack/{stack}/x"
            if script["step"] < len(script["steps"]):
                at = datetime.now(timezone.utc) + timedelta(seconds=script["skew"])
                for i, ev in enumerate(script["steps"][script["step"]]):
                    # each event a millisecond after the one before
                    script["revealed"].insert(0, event_xml(stack, stack_id, ev, at + timedelta(milliseconds=i)))
                script["step"] += 1
            injected = "".join(script["revealed"])
        if "<StackEvents>" in text:
            text = text.replace("<StackEvents>", "<StackEvents>" + injected, 1)
        else:
            text = text.replace("<StackEvents/>", f"<StackEvents>{injected}</StackEvents>", 1)
        return text.encode()

    def answer(self, code, data, headers):
        self.send_response(code)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
