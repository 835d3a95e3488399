//! The `pulumi` backend.
//!
//! `apply` selects (creating if missing) the stack, then runs
//! `pulumi up --yes --skip-preview --refresh --non-interactive --json`:
//! refresh is part of the apply, or Pulumi never notices out-of-band drift.
//! The result comes from the streamed engine events (one JSON object per
//! line): the `summaryEvent`'s resource-change counts decide `changed` or
//! `no_change`, and error `diagnosticEvent`s become the failure message.
//! `outputs` is `stack output --json --show-secrets=false`; `destroy` is
//! `destroy --yes`.
//!
//! It can plan: `preview --json` (with `--refresh` as `up` has it), whose
//! document's steps become one line per resource and operation (name and
//! type, never a value; deletes and replaces are destructive; the root
//! stack resource is none), hashed over a normal form of the steps
//! ([`normal_form`]: the real CLI's document is not byte-stable). Pulumi's update plans (`preview
//! --save-plan`, `up --plan`) are [PREVIEW]/[EXPERIMENTAL] and hidden in
//! the CLI (pulumi/pulumi v3.259 pkg/cmd/pulumi/operations/up.go), so an
//! approved plan is applied by previewing again and running `up` only if
//! the hash is the same. This module knows nothing about git, triggers or
//! the queue.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::tool::{self, Tool};
use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use crate::process::{self, Spec};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "pulumi"`: a Pulumi stack.
pub struct Config {
    /// The stack to converge (`org/project/stack` or just `stack`).
    pub stack: String,
    /// The project directory, relative to the target's path (default: the
    /// target's path).
    pub work_dir: Option<String>,
    /// `pulumi` or a path to it. Default: pulumi.
    #[serde(default = "default_binary")]
    pub binary: String,
    /// `--config-file`, relative to the work dir.
    pub config_file: Option<String>,
    /// `--refresh` on every `up` (default true: without it Pulumi never
    /// notices drift made outside it).
    #[serde(default = "default_true")]
    pub refresh: bool,
    /// Extra environment (`PULUMI_BACKEND_URL`, `PULUMI_CONFIG_PASSPHRASE_FILE`,
    /// …); values `env:NAME` are read from driftless's environment and
    /// masked in output.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `--secrets-provider` when the stack is created.
    pub secrets_provider: Option<String>,
}

fn default_binary() -> String {
    "pulumi".into()
}

fn default_true() -> bool {
    true
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        if self.stack.trim().is_empty()
            || !self
                .stack
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        {
            p.push((
                "stack".into(),
                format!(
                    "`stack` `{}` must be a stack name like `prod` or `org/project/prod`",
                    self.stack
                ),
            ));
        }
        for (key, f) in [
            ("work_dir", &self.work_dir),
            ("config_file", &self.config_file),
        ] {
            if let Some(f) = f
                && (f.starts_with('/') || f.split('/').any(|c| c == ".."))
            {
                p.push((
                    key.into(),
                    format!("`{key}` `{f}` must be relative to the target's path, without `..`"),
                ));
            }
        }
        if self.binary.trim().is_empty() {
            p.push((
                "binary".into(),
                "`binary` must name the pulumi program".into(),
            ));
        }
        p
    }

    fn repo_files(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        v.extend(
            self.work_dir
                .iter()
                .map(|f| ("work_dir".to_string(), f.clone())),
        );
        if let Some(f) = &self.config_file {
            let base = self.work_dir.clone().unwrap_or_default();
            v.push((
                "config_file".to_string(),
                format!("{base}/{f}").trim_start_matches('/').to_string(),
            ));
        }
        v
    }

    fn check_environment(&self) -> Vec<(String, String)> {
        super::binary_on_path(&self.binary)
    }

    fn can_plan(&self) -> bool {
        true
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Pulumi::new(self.clone(), ctx)?))
    }
}

pub struct Pulumi {
    cfg: Config,
    ctx: Context,
    tool: Tool,
}

/// What `up --json` reported.
#[derive(Debug, Default)]
struct Events {
    /// `summaryEvent.resourceChanges`.
    changes: Option<BTreeMap<String, u64>>,
    /// Error diagnostics, in order.
    errors: Vec<String>,
}

/// Steps that change the world (everything but `same`, `read`, `refresh`).
const CHANGING_OPS: &[&str] = &[
    "create",
    "update",
    "delete",
    "replace",
    "create-replacement",
    "delete-replaced",
    "import",
    "import-replacement",
    "discard",
    "discard-replaced",
    "remove-pending-replace",
];

impl Events {
    fn parse(stdout: &str) -> Events {
        let mut e = Events::default();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if let Some(s) = v.get("summaryEvent") {
                let counts = s["resourceChanges"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, n)| (k.clone(), n.as_u64().unwrap_or(0)))
                            .collect()
                    })
                    .unwrap_or_default();
                e.changes = Some(counts);
            }
            if let Some(d) = v.get("diagnosticEvent")
                && d["severity"] == "error"
            {
                let msg = strip_colors(d["message"].as_str().unwrap_or(""));
                let msg = msg.trim();
                if !msg.is_empty() {
                    e.errors.push(msg.to_string());
                }
            }
        }
        e
    }

    fn changed(&self) -> u64 {
        self.changes
            .iter()
            .flatten()
            .filter(|(k, _)| CHANGING_OPS.contains(&k.as_str()))
            .map(|(_, n)| n)
            .sum()
    }

    fn summary(&self) -> String {
        match &self.changes {
            None => "no summary event".into(),
            Some(c) if c.is_empty() => "no resources".into(),
            Some(c) => c
                .iter()
                .map(|(k, n)| format!("{n} {k}"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

impl Pulumi {
    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        let mut env = tool::env(&cfg.env, &mut ctx)?;
        env.insert("PULUMI_SKIP_UPDATE_CHECK".into(), "true".into());
        env.insert(
            "PULUMI_AUTOMATION_API_SKIP_VERSION_CHECK".into(),
            "true".into(),
        );
        let tool = Tool {
            argv0: vec![cfg.binary.clone()],
            dir: match &cfg.work_dir {
                Some(w) => ctx.workdir.join(w),
                None => ctx.workdir.clone(),
            },
            env,
        };
        Ok(Pulumi { cfg, ctx, tool })
    }

    fn spec(&self, args: &[&str], deadline: Instant) -> Spec {
        self.tool.spec(args, deadline)
    }

    async fn run(&self, spec: &Spec) -> Result<process::Output, String> {
        tool::run(spec, &self.ctx.redactor).await
    }

    /// A failed command, in words: a stack lock, a missing passphrase or a
    /// missing backend login said plainly.
    fn why(&self, spec: &Spec, out: &process::Output, errors: &[String]) -> String {
        if let Some(lock) = lock_message(&out.stderr, &self.cfg.stack) {
            return self.ctx.redactor.redact(&lock);
        }
        let detail = if errors.is_empty() {
            strip_colors(&out.stderr_summary(5))
        } else {
            errors.join("; ")
        };
        let mut msg = format!(
            "{}: {detail}",
            process::describe_exit(spec, out, Some(self.ctx.timeout))
        );
        let text = format!("{detail} {}", out.stderr);
        if text.contains("PULUMI_ACCESS_TOKEN") || text.contains("pulumi login") {
            msg.push_str(
                " (Pulumi has no backend login: set PULUMI_BACKEND_URL, e.g. s3://… or file://…, \
                 or PULUMI_ACCESS_TOKEN in the target's backend `env`)",
            );
        }
        if text.contains("passphrase must be set with PULUMI_CONFIG_PASSPHRASE") {
            msg.push_str(&format!(
                " (stack `{}` keeps its secrets with a passphrase: set PULUMI_CONFIG_PASSPHRASE_FILE \
                 = \"/path/to/a/file\" or PULUMI_CONFIG_PASSPHRASE = \"env:NAME\" in the target's \
                 backend `env`)",
                self.cfg.stack
            ));
        } else if text.contains("incorrect passphrase") {
            msg.push_str(&format!(
                " (the passphrase given in PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE \
                 is not the one stack `{}` was created with)",
                self.cfg.stack
            ));
        }
        self.ctx.redactor.redact(&msg)
    }

    async fn select_stack(&self, deadline: Instant, tail: &mut String) -> Result<(), String> {
        let mut args = vec![
            "stack",
            "select",
            "--create",
            "--non-interactive",
            "--stack",
            &self.cfg.stack,
        ];
        if let Some(p) = &self.cfg.secrets_provider {
            args.push("--secrets-provider");
            args.push(p);
        }
        let spec = self.spec(&args, deadline).shown();
        let out = self.run(&spec).await?;
        tail.push_str(&out.tail);
        if out.success() {
            Ok(())
        } else {
            Err(format!(
                "cannot select stack `{}`: {}",
                self.cfg.stack,
                self.why(&spec, &out, &[])
            ))
        }
    }

    async fn up(&self) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        let failed = |message: String, tail: &str| Status {
            result: ApplyResult::Failed,
            message,
            output_tail: crate::redact::tail(tail, process::TAIL_BYTES),
            digest: None,
        };
        if let Err(e) = self.select_stack(deadline, &mut tail).await {
            return failed(e, &tail);
        }
        let args = self.update_args(&["up", "--yes", "--skip-preview"]);
        let spec = self.spec(&args, deadline).shown();
        let out = match self.run(&spec).await {
            Ok(o) => o,
            Err(e) => return failed(e, &tail),
        };
        tail.push_str(&out.tail);
        let events = Events::parse(&out.stdout);
        if !out.success() {
            return failed(self.why(&spec, &out, &events.errors), &tail);
        }
        if events.changes.is_none() {
            return failed(
                format!(
                    "`{}` succeeded but streamed no summary event; is `{}` the Pulumi CLI (3.x)?",
                    spec.display(),
                    self.cfg.binary
                ),
                &tail,
            );
        }
        let n = events.changed();
        Status {
            result: if n > 0 {
                ApplyResult::Changed
            } else {
                ApplyResult::NoChange
            },
            message: format!("pulumi up: {}", events.summary()),
            output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
            digest: None,
        }
    }

    /// `first` (`up …` or `preview`) with what both share: non-interactive
    /// JSON for the stack, `--refresh` if configured, the config file.
    fn update_args<'a>(&'a self, first: &[&'a str]) -> Vec<&'a str> {
        let mut args = first.to_vec();
        args.extend(["--non-interactive", "--json", "--stack", &self.cfg.stack]);
        if self.cfg.refresh {
            args.push("--refresh");
        }
        if let Some(c) = &self.cfg.config_file {
            args.push("--config-file");
            args.push(c);
        }
        args
    }

    /// `pulumi preview --json`: what `up` would do, by resource.
    async fn preview(&self) -> Result<Plan, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        self.select_stack(deadline, &mut tail).await?;
        let args = self.update_args(&["preview"]);
        let mut spec = self.spec(&args, deadline);
        // One document, not an event stream (display.go).
        spec.env.insert(
            "PULUMI_ENABLE_STREAMING_JSON_PREVIEW".into(),
            "false".into(),
        );
        let out = self.run(&spec).await?;
        let doc: Option<Value> = serde_json::from_str(out.stdout.trim()).ok();
        if !out.success() {
            let errors: Vec<String> = doc
                .as_ref()
                .and_then(|d| d["diagnostics"].as_array())
                .into_iter()
                .flatten()
                .filter(|d| d["severity"] == "error")
                .filter_map(|d| d["message"].as_str())
                .map(|m| strip_colors(m).trim().to_string())
                .collect();
            return Err(self.why(&spec, &out, &errors));
        }
        let Some(doc) = doc else {
            return Err(format!(
                "`{}` printed something that is not a JSON document; is `{}` the Pulumi CLI (3.x)?",
                spec.display(),
                self.cfg.binary
            ));
        };
        Ok(self.summarise_preview(&doc))
    }

    fn summarise_preview(&self, doc: &Value) -> Plan {
        let (mut add, mut change, mut destroy) = (0u64, 0u64, 0u64);
        let mut lines: Vec<String> = Vec::new();
        let mut items = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for step in doc["steps"].as_array().into_iter().flatten() {
            let op = step["op"].as_str().unwrap_or("?");
            let urn = step["urn"].as_str().unwrap_or("?");
            let ty = step["newState"]["type"]
                .as_str()
                .or_else(|| step["oldState"]["type"].as_str())
                .unwrap_or("?");
            // The root stack resource holds the stack's outputs, not a
            // resource of the cloud: its step is no change to show.
            if ty == ROOT_STACK_TYPE {
                continue;
            }
            let name = urn.rsplit("::").next().unwrap_or(urn);
            let sign = match op {
                "create" | "import" => "+",
                "update" => "~",
                "delete" | "discard" => "-",
                "replace" | "create-replacement" | "delete-replaced" | "import-replacement"
                | "discard-replaced" => "-/+",
                _ => continue, // same, read, refresh
            };
            // A replacement is several steps of one resource: one line.
            if !seen.insert((sign, urn.to_string())) {
                continue;
            }
            match sign {
                "+" => add += 1,
                "~" => change += 1,
                "-" => destroy += 1,
                _ => {
                    add += 1;
                    destroy += 1;
                }
            }
            lines.push(format!("{sign} {name} ({ty}, {op})"));
            let mut item = crate::plan::Change::new(
                urn,
                ty,
                crate::plan::Action::of_sign(sign).unwrap_or(crate::plan::Action::Update),
            );
            // Pulumi's preview prints a secret as `[secret]`;
            // the redactor masks the values it knows.
            item.before = step["oldState"]["inputs"].clone();
            item.after = step["newState"]["inputs"].clone();
            crate::plan::redact_json(&mut item.before, &self.ctx.redactor);
            crate::plan::redact_json(&mut item.after, &self.ctx.redactor);
            items.push(item);
        }
        let mut h = Sha256::new();
        h.update(b"driftless-pulumi-plan-v2\0");
        h.update(normal_form(doc).to_string().as_bytes());
        Plan {
            items,
            ..Plan::of_lines(
                &lines,
                (add, change, destroy),
                destroy > 0,
                hex::encode(h.finalize()),
                &self.ctx.redactor,
            )
        }
    }

    async fn destroy_inner(&self) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        if let Err(e) = self.select_stack(deadline, &mut tail).await {
            return Status::failed(e);
        }
        let spec = self
            .spec(
                &[
                    "destroy",
                    "--yes",
                    "--skip-preview",
                    "--non-interactive",
                    "--stack",
                    &self.cfg.stack,
                ],
                deadline,
            )
            .shown();
        let out = match self.run(&spec).await {
            Ok(o) => o,
            Err(e) => return Status::failed(e),
        };
        tail.push_str(&out.tail);
        Status {
            result: if out.success() {
                ApplyResult::Changed
            } else {
                ApplyResult::Failed
            },
            message: if out.success() {
                format!("stack `{}` destroyed", self.cfg.stack)
            } else {
                self.why(&spec, &out, &[])
            },
            output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
            digest: None,
        }
    }

    async fn outputs_inner(&self) -> Result<Outputs, BackendError> {
        let deadline = Instant::now() + self.ctx.timeout;
        let spec = self.spec(
            &[
                "stack",
                "output",
                "--json",
                "--show-secrets=false",
                "--non-interactive",
                "--stack",
                &self.cfg.stack,
            ],
            deadline,
        );
        let out = self.run(&spec).await.map_err(BackendError::Command)?;
        if !out.success() {
            return Err(BackendError::Command(self.why(&spec, &out, &[])));
        }
        match serde_json::from_str::<Value>(&out.stdout) {
            Ok(Value::Object(m)) => Ok(m),
            _ => Err(BackendError::Command(format!(
                "`{}` did not print a JSON object",
                spec.display()
            ))),
        }
    }
}

/// The engine's colour markup (`<{%reset%}>`, `<{%fg 1%}>`), which
/// `--json` diagnostics keep (pulumi's diag/colors; display/events.go
/// strips only ANSI codes), removed.
/// The type of the stack's root resource (`resource.RootStackType` in
/// pulumi/pulumi sdk/go/common/resource/stack.go).
const ROOT_STACK_TYPE: &str = "pulumi:pulumi:Stack";

/// What an approval holds a preview to: per resource step, sorted by URN
/// then op — `urn`, `op`, `diffReasons` and `replaceReasons` (sorted),
/// `detailedDiff`'s keys with their kind and whether it is an input diff,
/// and the `inputs` of the new state and of the old one (what the state,
/// refreshed, holds now: a change made in the cloud since the approval
/// changes the plan). From pulumi/pulumi pkg/backend/display/json.go
/// (`ShowPreviewDigest`) and pkg/display/json.go (`PreviewDigest`,
/// `PreviewStep`), what is left out and why:
/// - the order of `steps`: appended as `ResourcePreEvent`s arrive, which
///   the engine's parallel step executor emits in no fixed order for
///   resources that do not depend on each other;
/// - `oldState`/`newState` but their inputs: `stack.SerializeResource`
///   writes the state's `created` and `modified` times (set for the new
///   state at preview time) and its outputs, which a preview only guesses;
/// - `provider`: a provider reference, whose id is made when the provider
///   is first created;
/// - `duration`, `changeSummary` (a count of the steps kept), `config`
///   (what the program makes of it is in the inputs), `diagnostics` (what
///   the program printed, timestamps and all) and `maybeCorrupt`;
/// - the root stack resource's step (its outputs, not a cloud resource).
fn normal_form(doc: &Value) -> Value {
    let sorted = |v: &Value| {
        let mut keys: Vec<String> = v
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|k| k.as_str().map(str::to_string))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    };
    let mut steps: Vec<Value> = doc["steps"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|step| {
            let ty = step["newState"]["type"]
                .as_str()
                .or_else(|| step["oldState"]["type"].as_str());
            ty != Some(ROOT_STACK_TYPE)
        })
        .map(|step| {
            serde_json::json!({
                "urn": step["urn"],
                "op": step["op"],
                "diffReasons": sorted(&step["diffReasons"]),
                "replaceReasons": sorted(&step["replaceReasons"]),
                // Maps: serialized with their keys sorted.
                "detailedDiff": step["detailedDiff"],
                "inputs": step["newState"]["inputs"],
                "oldInputs": step["oldState"]["inputs"],
            })
        })
        .collect();
    steps.sort_by(|a, b| {
        (a["urn"].as_str(), a["op"].as_str()).cmp(&(b["urn"].as_str(), b["op"].as_str()))
    });
    Value::Array(steps)
}

fn strip_colors(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("<{%") {
        out.push_str(&rest[..i]);
        match rest[i..].find("%}>") {
            Some(j) => rest = &rest[i + j + 3..],
            None => {
                rest = &rest[i..];
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A DIY backend's "the stack is currently locked" error (pulumi's
/// pkg/backend/diy/lock.go, checkForLock: one line per lock file, "<url>:
/// created by <user>@<host> (pid N) at <RFC 3339 time>"), rewritten to say
/// who holds it, since when, and how a person clears it. driftless never
/// deletes a lock: its holder may be a live update.
fn lock_message(stderr: &str, stack: &str) -> Option<String> {
    let text = strip_colors(stderr);
    let head = text.find("the stack is currently locked by")?;
    let holders: Vec<String> = text[head..]
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (url, who) = l.trim().rsplit_once(": created by ")?;
            let (holder, at) = who.rsplit_once(" at ").unwrap_or((who, ""));
            let age = humantime::parse_rfc3339_weak(at.trim_end_matches('Z'))
                .ok()
                .and_then(|t| std::time::SystemTime::now().duration_since(t).ok())
                .map(|d| {
                    format!(
                        " ({} ago)",
                        humantime::format_duration(std::time::Duration::from_secs(d.as_secs()))
                    )
                })
                .unwrap_or_default();
            Some(format!("{holder} since {at}{age}, lock file {url}"))
        })
        .collect();
    let who = if holders.is_empty() {
        "another Pulumi process".to_string()
    } else {
        holders.join("; ")
    };
    Some(format!(
        "stack `{stack}` is locked by another Pulumi update ({who}). driftless does not break stack \
         locks. If no other pulumi is working on this stack (one killed mid-update leaves its lock \
         behind), run `pulumi cancel --yes --stack {stack}` with the same backend \
         (PULUMI_BACKEND_URL) and the next tick goes on"
    ))
}

impl Backend for Pulumi {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.up())
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        Some(Box::pin(self.preview()))
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        Some(Box::pin(async move {
            super::apply_if_unchanged(plan, self.preview().await, self.up()).await
        }))
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.destroy_inner())
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(self.outputs_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_decides_changed() {
        let stdout = r#"{"sequence":1,"timestamp":1,"preludeEvent":{"config":{}}}
{"sequence":2,"timestamp":1,"summaryEvent":{"maybeCorrupt":false,"durationSeconds":1,"resourceChanges":{"same":3},"policyPacks":{}}}"#;
        let e = Events::parse(stdout);
        assert_eq!(e.changed(), 0);
        assert_eq!(e.summary(), "3 same");
        let e = Events::parse(
            r#"{"summaryEvent":{"resourceChanges":{"same":1,"update":2,"delete":1}}}
{"diagnosticEvent":{"severity":"error","message":"boom\n"}}
{"diagnosticEvent":{"severity":"warning","message":"meh"}}
not json"#,
        );
        assert_eq!(e.changed(), 3);
        assert_eq!(e.errors, ["boom"]);
        let e = Events::parse(
            r#"{"diagnosticEvent":{"severity":"error","color":"raw","message":"<{%reset%}>bucket: <{%fg 1%}>quota<{%reset%}>\n"}}"#,
        );
        assert_eq!(e.errors, ["bucket: quota"]);
        assert_eq!(strip_colors("a<{%fg 1"), "a<{%fg 1");
    }

    #[test]
    fn a_stack_lock_is_reported_with_its_holder_and_the_cancel_line() {
        let stderr = "error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) to end or delete the lock file with `pulumi cancel`.\n  file:///s/.pulumi/locks/organization/site/prod/1b2c.json: created by ci@build-1 (pid 4242) at 2026-11-30T10:00:00Z\n";
        let m = lock_message(stderr, "prod").expect("a lock");
        for want in [
            "stack `prod` is locked",
            "ci@build-1 (pid 4242) since 2026-11-30T10:00:00Z (",
            " ago), lock file file:///s/.pulumi/locks/organization/site/prod/1b2c.json",
            "`pulumi cancel --yes --stack prod`",
        ] {
            assert!(m.contains(want), "{want:?} in {m}");
        }
        assert!(lock_message("error: something else", "prod").is_none());
    }
}
