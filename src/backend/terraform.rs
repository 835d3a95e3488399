//! The `terraform` backend (also OpenTofu: `binary = "tofu"`).
//!
//! `apply` runs `init -input=false` when the working directory is new or the
//! dependency lock file / backend configuration changed since the last init
//! (or when terraform itself says init is required), then
//! `apply -auto-approve -input=false -json`, and reads the result from the
//! machine-readable `change_summary` (and planned output changes). Refresh is
//! part of terraform's apply. `plan` (for `driftless plan`) is `plan -out`
//! into the target's plans directory and `show -json` of that file,
//! summarised by address and action, never by value (no `show` when the
//! plan's own report says nothing changes). `outputs` is
//! `output -json` with sensitive values masked. This module knows nothing
//! about git, triggers or the queue.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::tool::{self, Tool};
use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use crate::process::{self, Spec};

/// Written into `.terraform/` after a successful init: what init saw.
pub(super) const INIT_MARKER: &str = ".terraform/driftless-init.sha256";

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "terraform"`: Terraform or OpenTofu in the target's path.
pub struct Config {
    /// `terraform` or `tofu` (or a path to either). Default: terraform.
    #[serde(default = "default_binary")]
    pub binary: String,
    /// `-var-file` arguments, relative to the target's path.
    #[serde(default)]
    pub var_files: Vec<String>,
    /// `-var name=value` arguments; non-string values are passed as JSON.
    #[serde(default)]
    pub vars: BTreeMap<String, Value>,
    /// The workspace selected (and created if missing) before every apply.
    pub workspace: Option<String>,
    /// Extra environment; values `env:NAME` are read from driftless's own
    /// environment and masked in output.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Extra arguments for `terraform init` (e.g.
    /// `-backend-config=prod.hcl`).
    #[serde(default)]
    pub init_args: Vec<String>,
    /// How long apply/destroy wait for terraform's own state lock
    /// (`-lock-timeout`), e.g. "30s". Unset: terraform's default (fail at
    /// once).
    pub lock_timeout: Option<String>,
}

fn default_binary() -> String {
    "terraform".into()
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        if self.binary.trim().is_empty() {
            p.push((
                "binary".into(),
                "`binary` must name the terraform or tofu program".into(),
            ));
        }
        for f in &self.var_files {
            if Path::new(f).is_absolute() || f.split('/').any(|c| c == "..") {
                p.push((
                    "var_files".into(),
                    format!("`var_files` entry `{f}` must be relative to the target's path, without `..`"),
                ));
            }
        }
        if let Some(t) = &self.lock_timeout
            && (t.is_empty()
                || !t.chars().all(|c| c.is_ascii_digit() || "smh".contains(c))
                || !t.starts_with(|c: char| c.is_ascii_digit()))
        {
            p.push((
                "lock_timeout".into(),
                format!(
                    "`lock_timeout` `{t}` must be a duration terraform understands, like \"30s\" or \"5m\""
                ),
            ));
        }
        if let Some(w) = &self.workspace
            && (w.is_empty()
                || !w
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_".contains(c)))
        {
            p.push((
                "workspace".into(),
                format!("`workspace` `{w}` must be letters, digits, '-' or '_'"),
            ));
        }
        p
    }

    fn repo_files(&self) -> Vec<(String, String)> {
        let mut v = super::keyed("var_files", &self.var_files);
        v.push((
            "(terraform's working directory)".into(),
            ".terraform".into(),
        ));
        v.push(("(driftless's init marker)".into(), INIT_MARKER.into()));
        v
    }

    fn check_environment(&self) -> Vec<(String, String)> {
        super::binary_on_path(&self.binary)
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Terraform::new(self.clone(), ctx)?))
    }

    fn can_plan(&self) -> bool {
        true
    }
}

pub struct Terraform {
    cfg: Config,
    ctx: Context,
    tool: Tool,
}

/// A line of terraform's `-json` output as a person reads it: its
/// `@message` (the line as it is when it is not terraform's JSON).
fn ui_message(line: &str) -> String {
    serde_json::from_str::<Value>(line)
        .ok()
        .and_then(|v| v["@message"].as_str().map(str::to_string))
        .unwrap_or_else(|| line.to_string())
}

/// What one `-json` run reported.
#[derive(Debug, Default)]
struct Report {
    /// From the final `change_summary` (operation apply/destroy).
    summary: Option<(u64, String)>,
    /// Planned output changes (actions other than `noop`).
    output_changes: u64,
    /// Error diagnostics: "summary: detail (file:line)".
    errors: Vec<String>,
}

impl Report {
    fn parse(stdout: &str) -> Report {
        let mut r = Report::default();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            match v.get("type").and_then(Value::as_str) {
                Some("change_summary") => {
                    let changes = &v["changes"];
                    let op = changes["operation"].as_str().unwrap_or("");
                    if op == "apply" || op == "destroy" || op == "plan" {
                        let n: u64 = ["add", "change", "remove", "import", "forget"]
                            .iter()
                            .map(|k| changes[*k].as_u64().unwrap_or(0))
                            .sum();
                        let msg = v["@message"].as_str().unwrap_or("").to_string();
                        r.summary = Some((n, msg));
                    }
                }
                Some("outputs") => {
                    if let Some(outs) = v["outputs"].as_object() {
                        r.output_changes += outs
                            .values()
                            .filter(|o| o["action"].as_str().is_some_and(|a| a != "noop"))
                            .count() as u64;
                    }
                }
                Some("diagnostic") if v["@level"] == "error" => {
                    let d = &v["diagnostic"];
                    let mut s = d["summary"].as_str().unwrap_or("error").to_string();
                    if let Some(detail) = d["detail"].as_str().filter(|s| !s.is_empty()) {
                        s.push_str(": ");
                        s.push_str(detail);
                    }
                    if let (Some(file), Some(line)) = (
                        d["range"]["filename"].as_str(),
                        d["range"]["start"]["line"].as_u64(),
                    ) {
                        s.push_str(&format!(" ({file}:{line})"));
                    }
                    r.errors.push(s);
                }
                _ => {}
            }
        }
        r
    }

    /// Terraform's "Error acquiring the state lock" diagnostic, rewritten
    /// to say what holds the lock and how a person can clear it. driftless
    /// never force-unlocks: the holder may be a live apply.
    fn state_lock_message(&self, stdout: &str, workdir: &Path, binary: &str) -> Option<String> {
        if !self
            .errors
            .iter()
            .any(|e| e.starts_with("Error acquiring the state lock"))
        {
            return None;
        }
        let mut info: BTreeMap<&str, String> = BTreeMap::new();
        for line in stdout.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(detail) = v["diagnostic"]["detail"].as_str() else {
                continue;
            };
            for l in detail.lines() {
                let l = l.trim();
                for key in ["ID", "Path", "Operation", "Who", "Created"] {
                    if let Some(rest) = l.strip_prefix(key).and_then(|r| r.strip_prefix(':')) {
                        info.entry(key).or_insert_with(|| rest.trim().to_string());
                    }
                }
            }
        }
        let get = |k: &str| info.get(k).cloned().unwrap_or_else(|| "?".into());
        let id = get("ID");
        Some(format!(
            "terraform's state is locked by someone else (lock ID {id}: {} by {} since {}, state {}). \
             driftless does not break state locks. If no other terraform is working on this state \
             (one killed mid-apply leaves its lock behind on remote backends), run \
             `{binary} force-unlock {id}` in {}; or set `lock_timeout` to wait for it",
            get("Operation"),
            get("Who"),
            get("Created"),
            get("Path"),
            workdir.display()
        ))
    }

    fn wants_init(&self) -> bool {
        self.errors.iter().any(|e| {
            e.contains("terraform init")
                || e.contains("tofu init")
                || e.contains("Backend initialization required")
                || e.contains("Module not installed")
        })
    }
}

impl Terraform {
    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        let mut env = tool::env(&cfg.env, &mut ctx)?;
        // An input with a lowercase name is a terraform variable.
        for (name, value) in &ctx.inputs {
            if *name == name.to_lowercase() {
                env.remove(name);
                env.insert(format!("TF_VAR_{name}"), value.clone());
            }
        }
        env.insert("TF_IN_AUTOMATION".into(), "1".into());
        env.insert("TF_INPUT".into(), "0".into());
        let tool = Tool {
            argv0: vec![cfg.binary.clone()],
            dir: ctx.workdir.clone(),
            env,
        };
        Ok(Terraform { cfg, ctx, tool })
    }

    fn spec(&self, args: &[&str], deadline: Instant) -> Spec {
        self.tool.spec(args, deadline)
    }

    /// `terraform output -json` as terraform prints it: name → `value`,
    /// `type`, `sensitive`. Its output never reaches a log or a record.
    async fn terraform_outputs(&self) -> Result<serde_json::Map<String, Value>, BackendError> {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        self.select_workspace(deadline, &mut tail)
            .await
            .map_err(BackendError::Command)?;
        let spec = self.spec(&["output", "-json"], deadline);
        let out = self.run(&spec).await.map_err(BackendError::Command)?;
        if !out.success() {
            return Err(BackendError::Command(format!(
                "{}: {}",
                process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
                out.stderr.trim()
            )));
        }
        serde_json::from_str(&out.stdout).map_err(|e| {
            BackendError::Command(format!("`{}` printed invalid JSON: {e}", spec.display()))
        })
    }

    fn var_args(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .cfg
            .var_files
            .iter()
            .map(|f| format!("-var-file={f}"))
            .collect();
        for (k, v) in &self.cfg.vars {
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            args.push("-var".into());
            args.push(format!("{k}={v}"));
        }
        args
    }

    /// What init depends on: the lock file, the init arguments, and every
    /// file that configures a backend.
    fn init_digest(&self) -> String {
        let dir = &self.ctx.workdir;
        let mut h = Sha256::new();
        h.update(b"driftless-tf-init-v1\0");
        h.update(self.cfg.binary.as_bytes());
        for a in &self.cfg.init_args {
            h.update(b"\0");
            h.update(a.as_bytes());
        }
        if let Ok(lock) = std::fs::read(dir.join(".terraform.lock.hcl")) {
            h.update(b"\0lock\0");
            h.update(&lock);
        }
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "tf" || e == "json" || e == "hcl")
            })
            .collect();
        files.sort();
        for f in files {
            if let Ok(text) = std::fs::read_to_string(&f) {
                // backend blocks, and module sources (init installs modules)
                if text.contains("backend") || text.contains("module") {
                    h.update(b"\0file\0");
                    h.update(f.file_name().map(|n| n.as_encoded_bytes()).unwrap_or(b""));
                    h.update(text.as_bytes());
                }
            }
        }
        hex::encode(h.finalize())
    }

    async fn run(&self, spec: &Spec) -> Result<process::Output, String> {
        tool::run(spec, &self.ctx.redactor).await
    }

    async fn init(&self, deadline: Instant, tail: &mut String) -> Result<(), String> {
        let mut args = vec!["init", "-input=false", "-no-color"];
        args.extend(self.cfg.init_args.iter().map(String::as_str));
        let spec = self.spec(&args, deadline).shown();
        let out = self.run(&spec).await?;
        tail.push_str(&out.tail);
        if !out.success() {
            let why = out.stderr.trim();
            return Err(format!(
                "{}{}{}",
                process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
                if why.is_empty() { "" } else { ": " },
                why
            ));
        }
        let marker = self.ctx.workdir.join(INIT_MARKER);
        // init with only built-in providers creates no .terraform directory
        std::fs::create_dir_all(self.ctx.workdir.join(".terraform"))
            .and_then(|()| std::fs::write(&marker, self.init_digest()))
            .map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
        Ok(())
    }

    fn needs_init(&self) -> bool {
        let marker = self.ctx.workdir.join(INIT_MARKER);
        match std::fs::read_to_string(marker) {
            Ok(saved) => saved.trim() != self.init_digest(),
            Err(_) => true,
        }
    }

    async fn select_workspace(&self, deadline: Instant, tail: &mut String) -> Result<(), String> {
        let Some(ws) = &self.cfg.workspace else {
            return Ok(());
        };
        // A preview creates nothing: a workspace never applied has no
        // state to plan against yet.
        let create = if self.ctx.preview.is_some() {
            "-or-create=false"
        } else {
            "-or-create=true"
        };
        let spec = self
            .spec(&["workspace", "select", create, ws], deadline)
            .shown();
        let out = self.run(&spec).await?;
        tail.push_str(&out.tail);
        if out.success() {
            Ok(())
        } else {
            Err(format!(
                "{}: {}",
                process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
                out.stderr.trim()
            ))
        }
    }

    /// init if needed and select the workspace.
    async fn prepare(&self, deadline: Instant, tail: &mut String) -> Result<(), String> {
        if self.needs_init() {
            self.init(deadline, tail)
                .await
                .map_err(|e| format!("terraform init failed: {e}"))?;
        }
        self.select_workspace(deadline, tail)
            .await
            .map_err(|e| format!("cannot select workspace: {e}"))
    }

    /// Run terraform with `args` (a `-json` command), running init again
    /// once if terraform says it is needed; its report, or why it failed
    /// (redacted, the state lock explained).
    /// Run terraform with `args`; `shown`: its output is part of the run's
    /// (apply, destroy, plan — never `show -json`, which holds values).
    async fn run_json(
        &self,
        args: &[String],
        deadline: Instant,
        tail: &mut String,
        shown: bool,
    ) -> Result<(process::Output, Report), String> {
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut retried_init = false;
        loop {
            let mut spec = self.spec(&arg_refs, deadline);
            spec.shown = shown;
            spec.view = Some(ui_message);
            let out = self.run(&spec).await?;
            tail.push_str(&out.tail);
            let report = Report::parse(&out.stdout);
            if out.timed_out {
                return Err(process::describe_exit(&spec, &out, Some(self.ctx.timeout)));
            }
            if out.success() {
                return Ok((out, report));
            }
            if report.wants_init() && !retried_init {
                retried_init = true;
                self.init(deadline, tail)
                    .await
                    .map_err(|e| format!("terraform init failed: {e}"))?;
                continue;
            }
            if let Some(msg) =
                report.state_lock_message(&out.stdout, &self.ctx.workdir, &self.cfg.binary)
            {
                return Err(self.ctx.redactor.redact(&msg));
            }
            let why = if report.errors.is_empty() {
                out.stderr.trim().to_string()
            } else {
                report.errors.join("; ")
            };
            return Err(format!(
                "{}: {}",
                process::describe_exit(&spec, &out, None),
                self.ctx.redactor.redact(&why)
            ));
        }
    }

    /// `op` (`apply`/`destroy`, or `plan` with `extra` such as `-out=FILE`)
    /// with the lock timeout and variables.
    fn op_args(&self, op: &str, extra: &[String]) -> Vec<String> {
        let mut args = vec![op.to_string()];
        if op != "plan" {
            args.push("-auto-approve".into());
        }
        args.push("-input=false".into());
        args.push("-json".into());
        if op == "plan" && self.ctx.preview.is_some() {
            // A preview never takes the state lock an apply needs (and
            // terraform's plan writes no state).
            args.push("-lock=false".into());
        } else if let Some(t) = &self.cfg.lock_timeout {
            args.push(format!("-lock-timeout={t}"));
        }
        args.extend(extra.iter().cloned());
        args.extend(self.var_args());
        args
    }

    /// init if needed, select the workspace, then run `op` (`apply`/`destroy`).
    async fn converge(&self, op: &str) -> Status {
        self.converge_with(op, self.op_args(op, &[])).await
    }

    /// `apply` of a saved plan file: exactly what it says, without
    /// variables (they are in the plan); terraform itself refuses a plan
    /// made against a state that has moved since.
    async fn apply_saved(&self, plan: &PlanToApply) -> Status {
        let Some(file) = &plan.artifact else {
            return Status::failed("the approved plan has no plan file to apply");
        };
        if !file.exists() {
            return Status::failed(format!(
                "the approved plan's file {} is gone; nothing applied (a new plan is needed)",
                file.display()
            ));
        }
        let mut args: Vec<String> = vec!["apply".into(), "-input=false".into(), "-json".into()];
        if let Some(t) = &self.cfg.lock_timeout {
            args.push(format!("-lock-timeout={t}"));
        }
        args.push(file.display().to_string());
        let mut status = self.converge_with("apply", args).await;
        if status.result == ApplyResult::Failed && status.message.contains("Saved plan is stale") {
            status.message = format!(
                "the approved plan is stale: terraform's state changed since it was made, so \
                 terraform refused it and nothing was applied; a new plan waits for approval \
                 after `driftless retry` or the next push ({})",
                status.message
            );
        }
        status
    }

    async fn converge_with(&self, op: &str, args: Vec<String>) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        let failed = |msg: String, tail: &str| Status {
            result: ApplyResult::Failed,
            message: msg,
            output_tail: crate::redact::tail(tail, process::TAIL_BYTES),
            digest: None,
        };
        if let Err(e) = self.prepare(deadline, &mut tail).await {
            return failed(e, &tail);
        }
        let report = match self.run_json(&args, deadline, &mut tail, true).await {
            Ok((_, r)) => r,
            Err(e) => return failed(e, &tail),
        };
        let (changes, msg) = report
            .summary
            .clone()
            .unwrap_or((0, format!("{op} finished (no change summary reported)")));
        let changed = changes > 0 || (op == "apply" && report.output_changes > 0);
        let message = if changes == 0 && report.output_changes > 0 && op == "apply" {
            format!("{msg} {} output(s) changed.", report.output_changes)
        } else {
            msg
        };
        Status {
            result: if changed {
                ApplyResult::Changed
            } else {
                ApplyResult::NoChange
            },
            message,
            output_tail: crate::redact::tail(&tail, process::TAIL_BYTES),
            digest: None,
        }
    }

    /// `plan -out` into the plans directory, then `show -json` of that
    /// file: what would change, summarised without a single value (so no
    /// sensitive one can show), and hashed.
    async fn plan(&self) -> Result<Plan, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let mut tail = String::new();
        if let Some(live) = &self.ctx.preview {
            copy_local_state(live, &self.ctx.workdir)?;
        }
        self.prepare(deadline, &mut tail).await?;
        let dir = &self.ctx.plans_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the plans directory {}: {e}", dir.display()))?;
        let mut nonce = [0u8; 8];
        getrandom::fill(&mut nonce)
            .map_err(|e| format!("no randomness for a plan file name: {e}"))?;
        let file = dir.join(format!("{}.tfplan", hex::encode(nonce)));
        let out_arg = format!("-out={}", file.display());
        let planned = self
            .run_json(&self.op_args("plan", &[out_arg]), deadline, &mut tail, true)
            .await;
        let shown = match planned {
            // The plan's own report says nothing changes (resources,
            // imports, outputs): no `show -json` (a third of a no-op tick
            // under a policy, bench/policy.sh), nothing to keep.
            Ok((_, report))
                if report.summary.as_ref().is_some_and(|(n, _)| *n == 0)
                    && report.output_changes == 0 =>
            {
                let _ = std::fs::remove_file(&file);
                return Ok(Plan {
                    changes: false,
                    summary: "0 to add, 0 to change, 0 to destroy".into(),
                    hash: hex::encode(Sha256::digest(b"no changes")),
                    ..Plan::default()
                });
            }
            Ok(_) => {
                let args = [
                    "show".to_string(),
                    "-json".into(),
                    file.display().to_string(),
                ];
                self.run_json(&args, deadline, &mut tail, false).await
            }
            Err(e) => Err(e),
        };
        let out = match shown {
            Ok((out, _)) => out,
            Err(e) => {
                let _ = std::fs::remove_file(&file);
                return Err(e);
            }
        };
        let json: Value = serde_json::from_str(out.stdout.trim()).map_err(|e| {
            let _ = std::fs::remove_file(&file);
            format!(
                "`{} show -json` printed something that is not JSON: {e}",
                self.cfg.binary
            )
        })?;
        let mut plan = summarise_plan(&json);
        plan.diff = self.ctx.redactor.redact(&plan.diff);
        crate::plan::redact_json(&mut plan.raw, &self.ctx.redactor);
        for c in &mut plan.items {
            crate::plan::redact_json(&mut c.before, &self.ctx.redactor);
            crate::plan::redact_json(&mut c.after, &self.ctx.redactor);
        }
        plan.artifact = Some(file);
        Ok(plan)
    }
}

/// Terraform's JSON plan (`show -json`, see terraform's
/// internal/command/jsonplan) as a [`Plan`]: `resource_changes[].change.actions`
/// and `output_changes`, addresses only. The hash covers the whole document
/// but its `timestamp`.
fn summarise_plan(json: &Value) -> Plan {
    let (mut add, mut change, mut destroy) = (0u64, 0u64, 0u64);
    let mut lines = Vec::new();
    let mut destructive = false;
    let acts = |v: &Value| -> Vec<String> {
        v["change"]["actions"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    for rc in json["resource_changes"].as_array().into_iter().flatten() {
        let actions = acts(rc);
        let address = rc["address"].as_str().unwrap_or("?");
        let has = |a: &str| actions.iter().any(|x| x == a);
        let sign = match (has("create"), has("delete"), has("update")) {
            (true, true, _) => "-/+",
            (true, false, _) => "+",
            (false, true, _) => "-",
            (false, false, true) => "~",
            _ => continue, // no-op, read
        };
        if has("create") {
            add += 1;
        }
        if has("delete") {
            destroy += 1;
            destructive = true;
        }
        if has("update") {
            change += 1;
        }
        lines.push(format!("{sign} {address} ({})", actions.join(", ")));
    }
    let mut outputs = 0;
    if let Some(oc) = json["output_changes"].as_object() {
        for (name, c) in oc {
            let actions = acts(&serde_json::json!({ "change": c }));
            if actions.iter().all(|a| a == "no-op") {
                continue;
            }
            outputs += 1;
            lines.push(format!("~ output.{name} ({})", actions.join(", ")));
        }
    }
    let mut summary = format!("{add} to add, {change} to change, {destroy} to destroy");
    if outputs > 0 {
        summary.push_str(&format!(", {outputs} output(s) to change"));
    }
    let mut doc = json.clone();
    if let Some(o) = doc.as_object_mut() {
        o.remove("timestamp");
    }
    let hash = hex::encode(Sha256::digest(doc.to_string().as_bytes()));
    let raw = masked(doc);
    let items = raw["resource_changes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|rc| {
            let actions: Vec<&str> = rc["change"]["actions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let mut c = crate::plan::Change::new(
                rc["address"].as_str().unwrap_or("?"),
                rc["type"].as_str().unwrap_or(""),
                crate::plan::Action::of_terraform(&actions),
            );
            c.before = rc["change"]["before"].clone();
            c.after = rc["change"]["after"].clone();
            c
        })
        .collect();
    Plan {
        changes: !lines.is_empty(),
        summary,
        diff: lines.join("\n"),
        destructive,
        hash,
        artifact: None,
        items,
        raw,
    }
}

/// Terraform's JSON plan as a policy may read it: every value terraform
/// marks sensitive (`before_sensitive`, `after_sensitive`) masked in
/// `resource_changes`, `resource_drift` and `output_changes`, and the
/// parts that carry values without those marks left out (`planned_values`,
/// `prior_state`, `variables`).
fn masked(mut doc: Value) -> Value {
    use crate::plan::mask_sensitive;
    // Every value terraform marks sensitive anywhere (a sensitive variable,
    // an attribute) is masked everywhere: terraform does not mark what is
    // derived from it (`terraform_data`'s `output` of a sensitive `input`).
    let mut known = crate::redact::Redactor::new();
    sensitive_values(&doc, &mut known);
    let Some(o) = doc.as_object_mut() else {
        return Value::Null;
    };
    for part in ["planned_values", "prior_state", "variables"] {
        o.remove(part);
    }
    let mask = |c: &mut Value| {
        for (v, s) in [("before", "before_sensitive"), ("after", "after_sensitive")] {
            let sens = c[s].clone();
            if let Some(val) = c.get_mut(v) {
                mask_sensitive(val, &sens);
            }
        }
    };
    for part in ["resource_changes", "resource_drift"] {
        if let Some(list) = o.get_mut(part).and_then(Value::as_array_mut) {
            for rc in list {
                if let Some(c) = rc.get_mut("change") {
                    mask(c);
                }
            }
        }
    }
    if let Some(outs) = o.get_mut("output_changes").and_then(Value::as_object_mut) {
        for c in outs.values_mut() {
            mask(c);
        }
    }
    crate::plan::redact_json(&mut doc, &known);
    doc
}

/// The values terraform's plan marks sensitive: a sensitive variable's
/// value, and every value under a `true` of a `*_sensitive` companion.
fn sensitive_values(doc: &Value, out: &mut crate::redact::Redactor) {
    fn under(v: &Value, sens: &Value, out: &mut crate::redact::Redactor) {
        match (v, sens) {
            (_, Value::Bool(true)) => strings(v, out),
            (Value::Object(m), Value::Object(s)) => {
                for (k, x) in m {
                    if let Some(sx) = s.get(k) {
                        under(x, sx, out);
                    }
                }
            }
            (Value::Array(a), Value::Array(s)) => {
                for (x, sx) in a.iter().zip(s) {
                    under(x, sx, out);
                }
            }
            _ => {}
        }
    }
    fn strings(v: &Value, out: &mut crate::redact::Redactor) {
        match v {
            Value::String(s) => out.add(s.clone()),
            Value::Number(n) => out.add(n.to_string()),
            Value::Array(a) => a.iter().for_each(|x| strings(x, out)),
            Value::Object(m) => m.values().for_each(|x| strings(x, out)),
            _ => {}
        }
    }
    let declared = &doc["configuration"]["root_module"]["variables"];
    if let Some(vars) = doc["variables"].as_object() {
        for (name, v) in vars {
            if declared[name]["sensitive"] == Value::Bool(true) {
                strings(&v["value"], out);
            }
        }
    }
    for part in ["resource_changes", "resource_drift"] {
        for rc in doc[part].as_array().into_iter().flatten() {
            let c = &rc["change"];
            under(&c["before"], &c["before_sensitive"], out);
            under(&c["after"], &c["after_sensitive"], out);
        }
    }
    if let Some(outs) = doc["output_changes"].as_object() {
        for c in outs.values() {
            under(&c["before"], &c["before_sensitive"], out);
            under(&c["after"], &c["after_sensitive"], out);
        }
    }
}

impl Backend for Terraform {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.converge("apply"))
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.converge("destroy"))
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        Some(Box::pin(Terraform::plan(self)))
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        Some(Box::pin(self.apply_saved(plan)))
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            Ok(self
                .terraform_outputs()
                .await?
                .into_iter()
                .map(|(k, v)| {
                    let value = if v["sensitive"].as_bool() == Some(true) {
                        Value::String("(sensitive)".into())
                    } else {
                        v.get("value").cloned().unwrap_or(Value::Null)
                    };
                    (k, value)
                })
                .collect())
        })
    }

    fn revealed_outputs(&self) -> BoxFuture<'_, Result<(Outputs, Vec<String>), BackendError>> {
        Box::pin(async move {
            let mut sensitive = Vec::new();
            let values = self
                .terraform_outputs()
                .await?
                .into_iter()
                .map(|(k, v)| {
                    if v["sensitive"].as_bool() == Some(true) {
                        sensitive.push(k.clone());
                    }
                    (k, v.get("value").cloned().unwrap_or(Value::Null))
                })
                .collect();
            Ok((values, sensitive))
        })
    }
}

/// A preview plans against the target's real local state: copy
/// `terraform.tfstate` and the workspaces' `terraform.tfstate.d/` from the
/// live working directory into the preview's (a copy: the live files are
/// only read), and remove what an earlier preview copied that the live
/// directory no longer has. Remote backends need nothing: the preview's
/// init reaches the same backend, and its plan reads without locking.
fn copy_local_state(live: &Path, here: &Path) -> Result<(), String> {
    fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(from)? {
            let e = e?;
            let (src, dst) = (e.path(), to.join(e.file_name()));
            let kind = e.file_type()?;
            if kind.is_dir() {
                copy_tree(&src, &dst)?;
            } else if kind.is_file() {
                std::fs::copy(&src, &dst)?;
            }
        }
        Ok(())
    }
    let fail = |what: &Path, e: std::io::Error| {
        format!(
            "cannot copy the target's state {} for the preview: {e}",
            what.display()
        )
    };
    for name in ["terraform.tfstate", "terraform.tfstate.d"] {
        let (src, dst) = (live.join(name), here.join(name));
        let gone = if dst.is_dir() {
            std::fs::remove_dir_all(&dst)
        } else {
            std::fs::remove_file(&dst)
        };
        if let Err(e) = gone
            && e.kind() != std::io::ErrorKind::NotFound
        {
            return Err(fail(&dst, e));
        }
        if src.is_dir() {
            copy_tree(&src, &dst).map_err(|e| fail(&src, e))?;
        } else if src.is_file() {
            std::fs::copy(&src, &dst).map_err(|e| fail(&src, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_real_terraform_json() {
        let out = concat!(
            r#"{"@level":"info","@message":"Plan: 1 to add","type":"change_summary","changes":{"add":1,"change":0,"import":0,"remove":0,"operation":"plan"}}"#,
            "\n",
            r#"{"@level":"info","@message":"Outputs: 1","type":"outputs","outputs":{"g":{"sensitive":false,"action":"noop"}}}"#,
            "\n",
            r#"{"@level":"info","@message":"Apply complete! Resources: 1 added, 0 changed, 0 destroyed.","type":"change_summary","changes":{"add":1,"change":0,"import":0,"remove":0,"operation":"apply"}}"#,
            "\n"
        );
        let r = Report::parse(out);
        assert_eq!(
            r.summary,
            Some((
                1,
                "Apply complete! Resources: 1 added, 0 changed, 0 destroyed.".into()
            ))
        );
        assert_eq!(r.output_changes, 0);
        let err = r#"{"@level":"error","@message":"Error: Unclosed configuration block","type":"diagnostic","diagnostic":{"severity":"error","summary":"Unclosed configuration block","detail":"There is no closing brace.","range":{"filename":"main.tf","start":{"line":15,"column":14,"byte":259}}}}"#;
        let r = Report::parse(err);
        assert_eq!(
            r.errors,
            vec![
                "Unclosed configuration block: There is no closing brace. (main.tf:15)".to_string()
            ]
        );
        assert!(!r.wants_init());
    }
}
