//! The `nomad` backend: the job files in the target's path, reconciled to a
//! Nomad cluster through its HTTP API, under the invariants of
//! `seeds/nops-philosophy.md`:
//!
//! - Nomad parses the HCL (`/v1/jobs/parse`); driftless never does.
//! - Behaviour comes from the HCL in git (`meta { driftless_policy = … }`),
//!   never from the live job; invalid meta means policy `none` and an ERROR.
//! - Plan before every write; the diff and the plan's `JobModifyIndex` are
//!   persisted (through the [`Ledger`]) before anything is written to Nomad,
//!   and every register is a CAS on that index, so a manual change is never
//!   overwritten.
//! - Groups with an enabled `scaling` block keep their live count.
//! - One active deployment per job (a unique index behind the ledger).
//! - Nomad is never asked to stop or purge a job (but by `destroy` with
//!   `allow_destroy = true`); driftless never writes meta into a live job.
//! - Secrets are redacted from every diff before it is stored or shown.
//!
//! This module talks to Nomad and to the [`Ledger`] it is given; it never
//! imports the store, the queue, git or http.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Status};
pub use crate::ledger::{Change, Deployment, JobKey, Ledger, LedgerError, NewDeployment, Policy};
use crate::model::CommitId;
use crate::secret::SecretRef;

/// Meta keys driftless reads; any other `driftless_*` key is an error.
const KNOWN_META: &[&str] = &[
    "driftless_policy",
    "driftless_pre_hook",
    "driftless_post_hook",
    "driftless_hook_timeout",
];
/// The meta a hook's dispatch can carry. Nomad refuses a dispatch with any
/// key its parameterized job does not declare in `meta_required` or
/// `meta_optional` (nomad/job_endpoint.go, `validateDispatchRequest`), so
/// driftless sends only the ones the hook job declares.
pub const DISPATCH_META: &[&str] = &[
    "driftless_deployment",
    "driftless_job",
    "driftless_commit",
    "driftless_phase",
];
/// How long a hook may run unless `driftless_hook_timeout` says otherwise.
const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(300);
/// Deployment states in which a deployment is still active.
pub const ACTIVE_STATES: &[&str] = &[
    "detected",
    "pending_approval",
    "pre_hook",
    "applying",
    "pending_promotion",
    "promoting",
    "post_hook",
];

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// e.g. `https://nomad.lan:4646`
    pub address: String,
    /// A file holding the ACL token, or `env:NOMAD_TOKEN`.
    pub token_file: Option<String>,
    /// The namespace for jobs that don't name one.
    pub namespace: Option<String>,
    pub region: Option<String>,
    /// Extra CA roots (PEM) for Nomad's TLS certificate.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM) for mutual TLS.
    pub client_cert_file: Option<PathBuf>,
    pub client_key_file: Option<PathBuf>,
    /// Which files in the target's path are jobs (one job per file).
    #[serde(default = "default_jobs")]
    pub jobs: String,
    /// The policy of jobs whose meta doesn't set one.
    #[serde(default = "default_policy")]
    pub default_policy: String,
    /// `destroy` deregisters (never purges) the target's jobs only when set.
    #[serde(default)]
    pub allow_destroy: bool,
    /// How long a deployment may wait for a person to promote its canaries
    /// before its owners are told it is overdue (it is never failed for
    /// it: Nomad's progress deadline governs that). Default 1h.
    #[serde(default)]
    pub promotion_wait: Option<String>,
    #[serde(skip)]
    token: Option<SecretRef>,
}

fn default_jobs() -> String {
    "*.nomad.hcl".into()
}

fn default_policy() -> String {
    "auto".into()
}

/// How long a deployment waits for promotion before its owners hear it is
/// overdue, unless `promotion_wait` says otherwise.
const DEFAULT_PROMOTION_WAIT: Duration = Duration::from_secs(3600);

/// `promotion_wait`: a duration from 1s to 7d.
fn parse_promotion_wait(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw.trim())
        .map_err(|e| format!("`promotion_wait` `{raw}` is not a duration like 30m or 2h: {e}"))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(7 * 86400) {
        return Err(format!(
            "`promotion_wait` `{raw}` must be at least 1s and at most 7d"
        ));
    }
    Ok(d)
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        let a = self.address.trim();
        if !(a.starts_with("http://") || a.starts_with("https://")) {
            p.push((
                "address".into(),
                format!("`address` `{a}` must be an http:// or https:// URL, like https://nomad.lan:4646"),
            ));
        }
        if Policy::parse(&self.default_policy).is_none() {
            p.push((
                "default_policy".into(),
                format!(
                    "`default_policy` `{}` must be auto, approval or none",
                    self.default_policy
                ),
            ));
        }
        if self.jobs.is_empty() || self.jobs.contains('/') {
            p.push((
                "jobs".into(),
                format!(
                    "`jobs` `{}` must be a file name pattern like *.nomad.hcl",
                    self.jobs
                ),
            ));
        }
        if let Some(w) = &self.promotion_wait
            && let Err(why) = parse_promotion_wait(w)
        {
            p.push(("promotion_wait".into(), why));
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            let key = if self.client_cert_file.is_some() {
                "client_key_file"
            } else {
                "client_cert_file"
            };
            p.push((
                key.into(),
                "`client_cert_file` and `client_key_file` go together".into(),
            ));
        }
        p
    }

    /// It answers `plan` (for `driftless plan`); its policies are per job.
    fn can_plan(&self) -> bool {
        true
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Nomad::new(self.clone(), ctx)?))
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.token = self
            .token_file
            .as_deref()
            .map(|raw| SecretRef::parse(raw, base));
        for p in [
            &mut self.ca_file,
            &mut self.client_cert_file,
            &mut self.client_key_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// Files on the controller that must be readable, for `driftless check`.
    fn check_environment(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if let Some(t) = &self.token
            && let Err(e) = t.load()
        {
            p.push(("token_file".into(), e.to_string()));
        }
        for (key, f) in [
            ("ca_file", &self.ca_file),
            ("client_cert_file", &self.client_cert_file),
            ("client_key_file", &self.client_key_file),
        ] {
            if let Some(f) = f.as_ref().filter(|f| !f.is_file()) {
                p.push((
                    key.into(),
                    format!("{} is not a readable file", f.display()),
                ));
            }
        }
        p
    }
}

// ------------------------------------------------------------------ client

/// A failed call to Nomad: which call, and what Nomad said.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NomadError {
    #[error("cannot reach Nomad at {address} for {call}: {reason}")]
    Unreachable {
        address: String,
        call: String,
        reason: String,
    },
    #[error("Nomad answered {status} to {call}: {body}")]
    Status {
        call: String,
        status: u16,
        body: String,
    },
    #[error("Nomad's answer to {call} is not what its API documents: {reason}")]
    Invalid { call: String, reason: String },
}

impl NomadError {
    fn is_cas_conflict(&self) -> bool {
        matches!(self, NomadError::Status { status: 500, body, .. } if body.contains("Enforcing job modify index"))
    }
}

struct Client {
    http: reqwest::Client,
    address: String,
    token: Option<String>,
    region: Option<String>,
    redactor: crate::redact::Redactor,
}

impl Client {
    fn new(cfg: &Config, ctx: &mut Context) -> Result<Client, BackendError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60).min(ctx.timeout));
        if let Some(ca) = &cfg.ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                BackendError::Config(format!("backend.ca_file {}: {e}", ca.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                BackendError::Config(format!("backend.ca_file {}: {e}", ca.display()))
            })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&cfg.client_cert_file, &cfg.client_key_file) {
            let mut pem = std::fs::read(cert).map_err(|e| {
                BackendError::Config(format!("backend.client_cert_file {}: {e}", cert.display()))
            })?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|e| {
                BackendError::Config(format!("backend.client_key_file {}: {e}", key.display()))
            })?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                BackendError::Config(format!("backend.client_cert_file/client_key_file: {e}"))
            })?;
            b = b.identity(id);
        }
        let http = b
            .build()
            .map_err(|e| BackendError::Config(format!("cannot build Nomad's HTTP client: {e}")))?;
        let token = match &cfg.token {
            Some(r) => {
                let t = r
                    .load()
                    .map_err(|e| BackendError::Config(format!("backend.token_file: {e}")))?;
                ctx.redactor.add(t.clone());
                Some(t)
            }
            None => None,
        };
        Ok(Client {
            http,
            address: cfg.address.trim_end_matches('/').to_string(),
            token,
            region: cfg.region.clone(),
            redactor: ctx.redactor.clone(),
        })
    }

    /// One API call; `Ok(None)` for a 404 when `not_found_ok`.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        namespace: Option<&str>,
        query: &[(&str, &str)],
        body: Option<&Value>,
        not_found_ok: bool,
    ) -> Result<Option<Value>, NomadError> {
        let call = format!("{method} {path}");
        let mut q: Vec<(&str, &str)> = query.to_vec();
        if let Some(ns) = namespace {
            q.push(("namespace", ns));
        }
        if let Some(r) = &self.region {
            q.push(("region", r));
        }
        let mut url = format!("{}{path}", self.address);
        if !q.is_empty() {
            let qs = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(q)
                .finish();
            url.push('?');
            url.push_str(&qs);
        }
        let mut req = self.http.request(method, url);
        if let Some(t) = &self.token {
            req = req.header("X-Nomad-Token", t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| NomadError::Unreachable {
            address: self.address.clone(),
            call: call.clone(),
            reason: self.redactor.redact(&crate::error::chain(&e)),
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| NomadError::Unreachable {
            address: self.address.clone(),
            call: call.clone(),
            reason: self.redactor.redact(&crate::error::chain(&e)),
        })?;
        if status == 404 && not_found_ok {
            return Ok(None);
        }
        if !(200..300).contains(&status) {
            let mut body = self.redactor.redact(text.trim());
            if body.len() > 2000 {
                let mut cut = 2000;
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
                body.push('…');
            }
            return Err(NomadError::Status { call, status, body });
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| NomadError::Invalid {
                call,
                reason: format!("not JSON: {e}"),
            })
    }
}

impl Client {
    /// `GET path` in `namespace`; a 404 is an error.
    async fn get(&self, path: &str, namespace: &str) -> Result<Value, NomadError> {
        self.call(
            reqwest::Method::GET,
            path,
            Some(namespace),
            &[],
            None,
            false,
        )
        .await
        .map(|v| v.unwrap_or(Value::Null))
    }
}

// ------------------------------------------------------------------ backend

pub struct Nomad {
    cfg: Config,
    ctx: Context,
    client: Client,
    ledger: Arc<dyn Ledger>,
    cluster: String,
}

impl std::fmt::Debug for Nomad {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nomad")
            .field("address", &self.cfg.address)
            .finish()
    }
}

/// What happened to one job in one apply.
#[derive(Debug)]
struct JobReport {
    result: JobResult,
    line: String,
}

/// Ordered by severity: the worst of a tick's outcomes is its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum JobResult {
    NoChange,
    Changed,
    Failed,
}

/// Where following an active deployment left it.
#[derive(Debug)]
enum Followed {
    /// Still active: waiting for Nomad, a hook or a person.
    Waiting(JobReport),
    /// Completed or failed.
    Settled(JobReport),
    /// Given up for a newer spec.
    Superseded(JobReport),
}

impl Followed {
    fn report(self) -> JobReport {
        match self {
            Followed::Waiting(o) | Followed::Settled(o) | Followed::Superseded(o) => o,
        }
    }
}

/// A job file, parsed by Nomad.
struct Parsed {
    file: String,
    key: JobKey,
    job: Value,
    policy: Policy,
    pre_hook: Option<String>,
    post_hook: Option<String>,
    hook_timeout: Duration,
}

/// A hook job as this apply reconciled it (parameterized jobs go first):
/// where it lives, whether its reconcile went well, and the meta keys its
/// `parameterized` block lets a dispatch carry.
#[derive(Debug, Clone)]
struct HookJob {
    key: JobKey,
    ok: bool,
    meta_required: Vec<String>,
    meta_optional: Vec<String>,
    /// Its `parameterized` block says `payload = "required"`: a dispatch
    /// without one is refused, and driftless sends none.
    payload_required: bool,
}

/// The hook jobs in the target's path, by job ID.
type HookJobs = BTreeMap<String, HookJob>;

/// One deployment's hook dispatch: its idempotency token comes from the
/// deployment's random nonce, and a child recorded by an earlier tick is
/// waited for instead of dispatching again.
struct HookRun<'a> {
    id: i64,
    nonce: Option<&'a str>,
    child: Option<&'a str>,
    /// The state the deployment is in while the hook runs.
    state: &'a str,
}

impl Nomad {
    /// The commit this apply converges to (empty when there is none, as
    /// for `outputs`, which records no deployment).
    fn commit(&self) -> &str {
        self.ctx.commit.as_ref().map_or("", CommitId::as_str)
    }

    fn commit_short(&self) -> &str {
        self.ctx.commit.as_ref().map_or("", CommitId::short)
    }

    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        let ledger = ctx.ledger.clone().ok_or_else(|| {
            BackendError::Config("the nomad backend needs the state database".into())
        })?;
        let client = Client::new(&cfg, &mut ctx)?;
        let cluster = match &cfg.region {
            Some(r) => format!("{}#{r}", client.address),
            None => client.address.clone(),
        };
        Ok(Nomad {
            cfg,
            ctx,
            client,
            ledger,
            cluster,
        })
    }

    /// The job files, sorted, relative to the target's path.
    fn job_files(&self) -> Result<Vec<String>, String> {
        let dir = &self.ctx.workdir;
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot list the job files in {}: {e}", dir.display()))?;
        let mut files: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::glob::glob_match(&self.cfg.jobs, n))
            .filter(|n| !n.ends_with(".vars.hcl"))
            .collect();
        files.sort();
        Ok(files)
    }

    fn job_error(&self, file: &str, job: Option<&str>, msg: impl std::fmt::Display) -> JobReport {
        let what = match job {
            Some(j) => format!("{file} (job {j})"),
            None => file.to_string(),
        };
        let line = self.ctx.redactor.redact(&format!("{what}: {msg}"));
        tracing::error!(target_name = %self.ctx.name, "{line}");
        JobReport {
            result: JobResult::Failed,
            line,
        }
    }

    /// `POST /v1/jobs/parse`: Nomad turns the HCL (with its variables) into
    /// a job; a 400 is Nomad's parse error.
    async fn parse_hcl(
        &self,
        hcl: &str,
        vars: Option<&str>,
        canonicalize: bool,
    ) -> Result<Value, String> {
        let mut body = json!({ "JobHCL": hcl, "Canonicalize": canonicalize });
        if let Some(v) = vars {
            body["Variables"] = Value::String(v.to_string());
        }
        Ok(self
            .client
            .call(
                reqwest::Method::POST,
                "/v1/jobs/parse",
                // Nomad authorises a parse in `?namespace=` (default
                // `default`): a token limited to the target's namespace
                // must be asked there.
                Some(self.cfg.namespace.as_deref().unwrap_or("default")),
                &[],
                Some(&body),
                false,
            )
            .await
            .map_err(|e| match e {
                NomadError::Status {
                    status: 400, body, ..
                } => {
                    format!("Nomad could not parse it: {body}")
                }
                other => other.to_string(),
            })?
            .unwrap_or(Value::Null))
    }

    /// The variables a job file is parsed with: its `.vars.hcl`, then the
    /// target's `inputs` as assignments (`name = "value"`). Nomad's parse
    /// takes one variables text (`JobsParseRequest.Variables`, parsed as a
    /// var file: command/agent/job_endpoint.go `JobsParseRequest`,
    /// jobspec2/types.variables.go), where a variable the job does not
    /// declare is only a warning — so every input can go to every job —
    /// and an input the `.vars.hcl` sets too is HCL's "Attribute
    /// redefined" error, which fails the job naming it.
    fn variables(&self, file: Option<String>) -> Option<String> {
        if self.ctx.inputs.is_empty() {
            return file;
        }
        let mut text = file.unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for (name, value) in &self.ctx.inputs {
            text.push_str(&format!("{name} = {}\n", hcl_string(value)));
        }
        Some(text)
    }

    /// Nomad parses the file (and its `.vars.hcl`); the policy comes from
    /// the parsed job's meta.
    async fn parse(&self, file: &str) -> Result<Parsed, String> {
        let path = self.ctx.inside("jobs", file)?;
        let hcl = std::fs::read_to_string(&path).map_err(|e| format!("cannot read it: {e}"))?;
        let stem = file.strip_suffix(".nomad.hcl").unwrap_or(file);
        let stem = stem.strip_suffix(".hcl").unwrap_or(stem);
        let vars_path = self
            .ctx
            .inside("(its variables file)", &format!("{stem}.vars.hcl"))?;
        let vars = match std::fs::read_to_string(&vars_path) {
            Ok(v) => Some(v),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {stem}.vars.hcl: {e}")),
        };
        let vars = self.variables(vars);
        let mut job = self.parse_hcl(&hcl, vars.as_deref(), true).await?;
        let id = job["ID"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("Nomad's parse returned a job without an ID")?
            .to_string();
        // The target's `namespace` is for jobs whose file names none.
        // Canonicalize writes `default` into those, so when it says
        // `default` and the target has a namespace, a parse without
        // Canonicalize tells a file that names `default` from one that names
        // nothing.
        let parsed_ns = job["Namespace"].as_str().unwrap_or("").to_string();
        let namespace = match (&self.cfg.namespace, parsed_ns.as_str()) {
            (Some(ns), "") => ns.clone(),
            (Some(ns), "default") => {
                let raw = self.parse_hcl(&hcl, vars.as_deref(), false).await?;
                match raw["Namespace"].as_str() {
                    Some(named) if !named.is_empty() => named.to_string(),
                    _ => ns.clone(),
                }
            }
            (None, "") => "default".into(),
            (_, ns) => ns.to_string(),
        };
        job["Namespace"] = Value::String(namespace.clone());
        let policy = self.policy(file, &job);
        let meta = |k: &str| {
            job["Meta"][k]
                .as_str()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let pre_hook = meta("driftless_pre_hook");
        let post_hook = meta("driftless_post_hook");
        let hook_timeout = meta("driftless_hook_timeout")
            .and_then(|t| humantime::parse_duration(&t).ok())
            .unwrap_or(DEFAULT_HOOK_TIMEOUT);
        Ok(Parsed {
            file: file.to_string(),
            key: JobKey {
                cluster: self.cluster.clone(),
                namespace,
                job: id,
            },
            job,
            policy,
            pre_hook,
            post_hook,
            hook_timeout,
        })
    }

    /// The policy from the job's own meta; anything invalid is `none` and
    /// an ERROR naming the file and key.
    fn policy(&self, file: &str, job: &Value) -> Policy {
        let meta = job["Meta"].as_object();
        let mut invalid = Vec::new();
        let mut policy = Policy::parse(&self.cfg.default_policy).unwrap_or(Policy::None);
        if let Some(meta) = meta {
            for (k, v) in meta {
                if !k.starts_with("driftless_") {
                    continue;
                }
                if !KNOWN_META.contains(&k.as_str()) {
                    invalid.push(format!(
                        "unknown meta key `{k}` (known: {})",
                        KNOWN_META.join(", ")
                    ));
                    continue;
                }
                if k == "driftless_policy" {
                    match v.as_str().and_then(Policy::parse) {
                        Some(p) => policy = p,
                        None => invalid.push(format!(
                            "meta `driftless_policy` = {v} must be \"auto\", \"approval\" or \"none\""
                        )),
                    }
                }
                if (k == "driftless_pre_hook" || k == "driftless_post_hook")
                    && v.as_str().is_none_or(|s| s.trim().is_empty())
                {
                    invalid.push(format!("meta `{k}` must name a parameterized job"));
                }
                if k == "driftless_hook_timeout"
                    && v.as_str()
                        .is_none_or(|s| humantime::parse_duration(s.trim()).is_err())
                {
                    invalid.push(format!(
                        "meta `driftless_hook_timeout` = {v} must be a duration like \"5m\""
                    ));
                }
            }
        }
        if invalid.is_empty() {
            policy
        } else {
            for why in &invalid {
                tracing::error!(
                    target_name = %self.ctx.name,
                    file,
                    "{file}: {why}; the job's policy is `none` until this is fixed"
                );
            }
            Policy::None
        }
    }

    async fn live(&self, key: &JobKey) -> Result<Option<Value>, NomadError> {
        self.client
            .call(
                reqwest::Method::GET,
                &format!("/v1/job/{}", seg(&key.job)),
                Some(&key.namespace),
                &[],
                None,
                true,
            )
            .await
    }

    async fn plan(&self, key: &JobKey, job: &Value) -> Result<Plan, NomadError> {
        let call = format!("POST /v1/job/{}/plan", key.job);
        let v = self
            .client
            .call(
                reqwest::Method::POST,
                &format!("/v1/job/{}/plan", seg(&key.job)),
                Some(&key.namespace),
                &[],
                Some(&json!({ "Job": job, "Diff": true, "PolicyOverride": false })),
                false,
            )
            .await?
            .unwrap_or(Value::Null);
        let index = v["JobModifyIndex"].as_i64().ok_or(NomadError::Invalid {
            call: call.clone(),
            reason: "no JobModifyIndex".into(),
        })?;
        let diff = v["Diff"].clone();
        let kind = diff["Type"]
            .as_str()
            .ok_or(NomadError::Invalid {
                call,
                reason: "no Diff.Type (was Diff: true sent?)".into(),
            })?
            .to_string();
        Ok(Plan { index, diff, kind })
    }

    async fn register(&self, key: &JobKey, job: &Value, index: i64) -> Result<Value, NomadError> {
        self.client
            .call(
                reqwest::Method::POST,
                "/v1/jobs",
                Some(&key.namespace),
                &[],
                Some(&json!({
                    "Job": job,
                    "EnforceIndex": true,
                    "JobModifyIndex": index,
                    "PolicyOverride": false,
                })),
                false,
            )
            .await
            .map(|v| v.unwrap_or(Value::Null))
    }

    /// The job's deployments (`GET /v1/job/:id/deployments`: those of the
    /// job's current incarnation).
    async fn nomad_deployments(&self, key: &JobKey) -> Result<Vec<Value>, NomadError> {
        let call = format!("GET /v1/job/{}/deployments", key.job);
        match self
            .client
            .get(
                &format!("/v1/job/{}/deployments", seg(&key.job)),
                &key.namespace,
            )
            .await?
        {
            Value::Array(a) => Ok(a),
            Value::Null => Ok(Vec::new()),
            _ => Err(NomadError::Invalid {
                call,
                reason: "not a list of deployments".into(),
            }),
        }
    }

    /// The spec driftless would register: the parsed job with the live
    /// count of every group whose scaling block is enabled.
    fn with_live_counts(job: &Value, live: Option<&Value>) -> Value {
        let mut job = job.clone();
        let Some(live) = live else { return job };
        let live_counts: BTreeMap<&str, &Value> = live["TaskGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| Some((g["Name"].as_str()?, &g["Count"])))
            .collect();
        if let Some(groups) = job["TaskGroups"].as_array_mut() {
            for g in groups {
                let scaled = g["Scaling"]["Enabled"].as_bool() == Some(true);
                let name = g["Name"].as_str().unwrap_or("").to_string();
                if scaled && let Some(c) = live_counts.get(name.as_str()) {
                    g["Count"] = (*c).clone();
                }
            }
        }
        job
    }

    /// Move deployment `id` from `from` to `to` (with a message): durable
    /// when this returns; a ledger error stops the apply.
    async fn set_state(
        &self,
        p: &Parsed,
        id: i64,
        from: &str,
        to: &str,
        message: Option<String>,
    ) -> Result<(), JobReport> {
        self.ledger
            .transition(
                id,
                from,
                to,
                Change {
                    message,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))
    }

    fn ledger_err(&self, p: &Parsed, e: LedgerError) -> JobReport {
        self.job_error(
            &p.file,
            Some(&p.key.job),
            format!("cannot record its deployment, so nothing was sent to Nomad: {e}"),
        )
    }

    /// Reconcile one job. Errors from the ledger stop the whole apply
    /// (`Err`): the state could not be persisted.
    async fn reconcile(&self, p: &Parsed, hooks: &HookJobs) -> Result<JobReport, JobReport> {
        let key = &p.key;
        let fail = |msg: String| Ok(self.job_error(&p.file, Some(&key.job), msg));

        // An active deployment first: follow it, or let a newer spec
        // supersede it.
        let mut active = self
            .ledger
            .active(key)
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        let mut live = match self.live(key).await {
            Ok(l) => l,
            Err(e) => return fail(e.to_string()),
        };
        let mut spec = Self::with_live_counts(&p.job, live.as_ref());
        let mut hash = spec_hash(&spec);
        // Only this target's deployments are ours to continue: the target's
        // lock says no other tick of it is running, so an `applying` one of
        // ours was left by a tick that died. Another target's may be
        // mid-register right now.
        if let Some(d) = active.as_ref().filter(|d| d.target != self.ctx.name) {
            return fail(format!(
                "not registered: target `{}` has an active deployment ({}, {}) of this job; one job must be managed by one target",
                d.target, d.id, d.state
            ));
        }
        // What happened this tick to a deployment of an older spec, before
        // the current commit is planned.
        let mut earlier = None;
        if let Some(d) = active.clone() {
            match d.state.as_str() {
                "applying" | "pre_hook" | "post_hook" | "pending_promotion" | "promoting" => {
                    let newer = d.spec_hash != hash;
                    match self.follow(p, &d, live.as_ref(), hooks, newer).await? {
                        Followed::Waiting(o) => return Ok(o),
                        Followed::Settled(o) if !newer => return Ok(o),
                        // The older deployment is done with: plan the
                        // current commit in this same tick, against the
                        // live job as it is now (an auto-revert moves it).
                        Followed::Settled(o) | Followed::Superseded(o) => {
                            earlier = Some(o);
                            active = None;
                            live = match self.live(key).await {
                                Ok(l) => l,
                                Err(e) => return fail(e.to_string()),
                            };
                            spec = Self::with_live_counts(&p.job, live.as_ref());
                            hash = spec_hash(&spec);
                        }
                    }
                }
                "detected" | "pending_approval" if d.spec_hash == hash => {
                    // Same spec still waiting (approval), or a tick that died
                    // between recording and registering: handled below after
                    // a fresh plan.
                }
                "detected" | "pending_approval" => {
                    self.ledger
                        .transition(
                            d.id,
                            &d.state,
                            "superseded",
                            Change {
                                message: Some(self.superseded_by(&d)),
                                ..Change::default()
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    active = None;
                }
                other => {
                    return fail(format!(
                        "deployment {} is in state `{other}`, which this version of driftless cannot continue",
                        d.id
                    ));
                }
            }
        }
        let o = self
            .plan_and_register(p, hooks, active.as_ref(), &spec, &hash)
            .await?;
        Ok(match earlier {
            Some(e) => JobReport {
                result: e.result.max(o.result),
                line: format!("{}; {}", e.line, o.line),
            },
            None => o,
        })
    }

    /// Plan `spec` (git's job with the live scaled counts); when it differs
    /// and the policy allows, record the deployment, then run the pre hook
    /// and register. `reuse` is an active deployment of this very spec.
    async fn plan_and_register(
        &self,
        p: &Parsed,
        hooks: &HookJobs,
        reuse: Option<&Deployment>,
        spec: &Value,
        hash: &str,
    ) -> Result<JobReport, JobReport> {
        let key = &p.key;
        let fail = |msg: String| Ok(self.job_error(&p.file, Some(&key.job), msg));
        let reuse = reuse.filter(|d| d.spec_hash == hash);
        // Plan before every write.
        let plan = match self.plan(key, spec).await {
            Ok(pl) => pl,
            Err(e) => return fail(e.to_string()),
        };
        if plan.kind == "None" {
            if let Some(d) = reuse {
                self.set_state(
                    p,
                    d.id,
                    &d.state,
                    "superseded",
                    Some("the live job already matches git".into()),
                )
                .await?;
            }
            return Ok(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: no change", key.job),
            });
        }
        let diff = redact_diff(&plan.diff, &self.ctx.redactor);
        let summary = diff_summary(&plan.diff);

        if self
            .ledger
            .is_paused(&self.ctx.name, &key.job)
            .await
            .map_err(|e| self.ledger_err(p, e))?
        {
            let line = format!(
                "{}: paused by a person; drift not registered: {summary}",
                key.job
            );
            return Ok(JobReport {
                result: JobResult::NoChange,
                line,
            });
        }
        if p.policy == Policy::None {
            let line = format!("{}: drift not applied (policy none): {summary}", key.job);
            tracing::warn!(target_name = %self.ctx.name, job = %key.job, "{line}");
            return Ok(JobReport {
                result: JobResult::NoChange,
                line,
            });
        }

        // No apply loop: a spec that failed at this live index (after an
        // auto-revert, the revert's) waits for a new commit or a change to
        // the live job.
        if let Some(last) = self
            .ledger
            .latest(key)
            .await
            .map_err(|e| self.ledger_err(p, e))?
            && last.state == "failed"
            && last.spec_hash == hash
            && last.failed_at_index.unwrap_or(last.job_modify_index) == plan.index
            && !self.ctx.retry
        {
            return fail(format!(
                "not retried: this spec failed at JobModifyIndex {} (deployment {}: {}); push a new commit, change the live job or run `driftless retry {}` to try again",
                plan.index,
                last.id,
                last.message.as_deref().unwrap_or("failed"),
                self.ctx.name
            ));
        }

        // Persist before acting.
        let (id, nonce) = match reuse {
            Some(d) => (d.id, d.hook_nonce.clone()),
            None => {
                let nonce = random_hex(8);
                let new = NewDeployment {
                    target: self.ctx.name.clone(),
                    key: key.clone(),
                    file: p.file.clone(),
                    commit_sha: self.commit().to_string(),
                    spec_hash: hash.to_string(),
                    policy: p.policy,
                    state: if p.policy == Policy::Approval {
                        "pending_approval"
                    } else {
                        "detected"
                    },
                    job_modify_index: plan.index,
                    diff: diff.to_string(),
                    diff_summary: summary.clone(),
                    pre_hook: p.pre_hook.clone(),
                    post_hook: p.post_hook.clone(),
                    hook_timeout_ms: Some(p.hook_timeout.as_millis() as i64),
                    hook_nonce: nonce.clone(),
                };
                match self.ledger.insert(&new).await {
                    Ok(id) => (id, Some(nonce)),
                    Err(LedgerError::Conflict(why)) => {
                        return fail(format!("not registered: {why}"));
                    }
                    Err(e) => return Err(self.ledger_err(p, e)),
                }
            }
        };
        let state = if p.policy == Policy::Approval {
            "pending_approval"
        } else {
            "detected"
        };
        // A hook Nomad would refuse to dispatch fails the deployment before
        // anything is registered (or anyone is asked to approve it).
        if let Err(why) = self.check_hooks(p, hooks) {
            return Ok(self
                .fail_from(p, id, state, None, format!("{why}; nothing registered"))
                .await?
                .report());
        }
        if p.policy == Policy::Approval {
            let line = format!(
                "{}: waiting for approval (deployment {id}): {summary}",
                key.job
            );
            return Ok(JobReport {
                result: JobResult::NoChange,
                line,
            });
        }
        // Each state is on disk before the action it leads to.
        if let Some(hook) = &p.pre_hook {
            self.set_state(p, id, "detected", "pre_hook", None).await?;
            let run = HookRun {
                id,
                nonce: nonce.as_deref(),
                child: None,
                state: "pre_hook",
            };
            if let Err(why) = self
                .run_hook(p, &run, hook, "pre", p.hook_timeout, hooks)
                .await
            {
                return Ok(self
                    .fail_from(
                        p,
                        id,
                        "pre_hook",
                        None,
                        format!("pre hook failed; nothing registered: {why}"),
                    )
                    .await?
                    .report());
            }
            self.set_state(p, id, "pre_hook", "applying", None).await?;
        } else {
            self.set_state(p, id, "detected", "applying", None).await?;
        }
        Ok(self
            .apply_registered(p, id, spec, plan, &summary, hooks)
            .await?
            .report())
    }

    /// The hooks `p` names must be parameterized jobs of this target's path,
    /// reconciled this tick, whose dispatch driftless can make: Nomad
    /// refuses meta keys the job does not declare, requires the ones in
    /// `meta_required`, and a payload when `payload = "required"`
    /// (nomad/job_endpoint.go, `validateDispatchRequest`); driftless sends
    /// none. Checked before anything is registered.
    fn check_hooks(&self, p: &Parsed, hooks: &HookJobs) -> Result<(), String> {
        for (phase, hook) in [("pre", &p.pre_hook), ("post", &p.post_hook)] {
            let Some(hook) = hook else { continue };
            let Some(h) = hooks.get(hook) else {
                return Err(format!(
                    "{phase} hook `{hook}` is not a parameterized job in this target's path (files matching `{}`); a named hook is never skipped",
                    self.cfg.jobs
                ));
            };
            if !h.ok {
                return Err(format!(
                    "{phase} hook job `{hook}` could not be registered this tick (see its own line)"
                ));
            }
            if let Some(k) = h
                .meta_required
                .iter()
                .find(|k| !DISPATCH_META.contains(&k.as_str()))
            {
                return Err(format!(
                    "{phase} hook `{hook}` requires the dispatch meta key `{k}` (its parameterized block's meta_required), which driftless cannot fill: it can send {}",
                    DISPATCH_META.join(", ")
                ));
            }
            // validateDispatchRequest: "Payload is not provided but required
            // by parameterized job".
            if h.payload_required {
                return Err(format!(
                    "{phase} hook `{hook}` requires a dispatch payload (its parameterized block's payload = \"required\"), which driftless does not send: make it \"optional\" or \"forbidden\""
                ));
            }
        }
        Ok(())
    }

    /// Register `spec` with CAS on `plan.index` (state `applying` is on
    /// disk). A CAS conflict is retried once at the new index only when a
    /// fresh plan shows the same diff.
    async fn apply_registered(
        &self,
        p: &Parsed,
        id: i64,
        spec: &Value,
        plan: Plan,
        summary: &str,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let mut index = plan.index;
        let mut spec = spec.clone();
        let mut retried = false;
        loop {
            match self.register(key, &spec, index).await {
                Ok(resp) => {
                    let registered = resp["JobModifyIndex"].as_i64();
                    self.ledger
                        .transition(
                            id,
                            "applying",
                            "applying",
                            Change {
                                registered_index: registered,
                                eval_id: resp["EvalID"]
                                    .as_str()
                                    .filter(|s| !s.is_empty())
                                    .map(str::to_string),
                                job_modify_index: Some(index),
                                message: Some("registered; following Nomad's deployment".into()),
                                ..Change::default()
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    let line = format!("{}: registered ({summary})", key.job);
                    // Nomad starts no deployment for some jobs: settle those
                    // at once, saying why.
                    if let Some(reason) = no_deployment_reason(&spec) {
                        let d = self.reload(p, id).await?;
                        let msg = format!("registered; Nomad runs no deployment for it: {reason}");
                        let o = self.succeed(p, &d, msg, None, hooks).await?;
                        return Ok(Followed::Settled(JobReport {
                            result: if o.result == JobResult::Failed {
                                JobResult::Failed
                            } else {
                                JobResult::Changed
                            },
                            line: format!("{line}; {}", o.line),
                        }));
                    }
                    return Ok(Followed::Waiting(JobReport {
                        result: JobResult::Changed,
                        line,
                    }));
                }
                Err(e) if e.is_cas_conflict() && !retried => {
                    retried = true;
                    // The live job moved between the plan and the register.
                    let live = match self.live(key).await {
                        Ok(l) => l,
                        Err(e2) => return self.fail_deployment(p, id, index, e2.to_string()).await,
                    };
                    let fresh_spec = Self::with_live_counts(&p.job, live.as_ref());
                    let fresh = match self.plan(key, &fresh_spec).await {
                        Ok(f) => f,
                        Err(e2) => return self.fail_deployment(p, id, index, e2.to_string()).await,
                    };
                    if fresh.diff == plan.diff {
                        tracing::info!(
                            target_name = %self.ctx.name,
                            job = %key.job,
                            from = index,
                            to = fresh.index,
                            "the live job moved but a fresh plan shows the same diff; registering at the new index"
                        );
                        index = fresh.index;
                        spec = fresh_spec;
                        continue;
                    }
                    return self
                        .fail_deployment(
                            p,
                            id,
                            index,
                            format!("job modified outside driftless (Nomad refused the register: {e}); the manual change stands"),
                        )
                        .await;
                }
                Err(e) if e.is_cas_conflict() => {
                    return self
                        .fail_deployment(
                            p,
                            id,
                            index,
                            format!("job modified outside driftless (Nomad refused the register: {e}); the manual change stands"),
                        )
                        .await;
                }
                Err(e) => return self.fail_deployment(p, id, index, e.to_string()).await,
            }
        }
    }

    /// The deployment as the ledger has it now.
    async fn reload(&self, p: &Parsed, id: i64) -> Result<Deployment, JobReport> {
        match self.ledger.active(&p.key).await {
            Ok(Some(d)) if d.id == id => Ok(d),
            Ok(_) => Err(self.job_error(
                &p.file,
                Some(&p.key.job),
                format!("deployment {id} is no longer active (another process moved it)"),
            )),
            Err(e) => Err(self.ledger_err(p, e)),
        }
    }

    /// A registered deployment that Nomad finished (or runs none for):
    /// `applied`, after its post hook if it has one (state `post_hook` is
    /// on disk before the hook is dispatched).
    async fn succeed(
        &self,
        p: &Parsed,
        d: &Deployment,
        msg: String,
        nomad_deployment_id: Option<String>,
        hooks: &HookJobs,
    ) -> Result<JobReport, JobReport> {
        let to = if d.post_hook.is_some() {
            "post_hook"
        } else {
            "applied"
        };
        self.ledger
            .transition(
                d.id,
                &d.state,
                to,
                Change {
                    message: Some(msg.clone()),
                    nomad_deployment_id,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        match &d.post_hook {
            Some(hook) => {
                let d = Deployment {
                    state: "post_hook".into(),
                    ..d.clone()
                };
                self.finish_post_hook(p, &d, hook, hooks).await
            }
            None => Ok(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: {msg}", p.key.job),
            }),
        }
    }

    /// Run the post hook of a registered, deployed job (state `post_hook`
    /// is on disk): `applied`, or `failed` (the run fails and notifies).
    async fn finish_post_hook(
        &self,
        p: &Parsed,
        d: &Deployment,
        hook: &str,
        hooks: &HookJobs,
    ) -> Result<JobReport, JobReport> {
        let run = HookRun {
            id: d.id,
            nonce: d.hook_nonce.as_deref(),
            child: d.post_hook_child.as_deref(),
            state: "post_hook",
        };
        match self
            .run_hook(p, &run, hook, "post", hook_timeout(d), hooks)
            .await
        {
            Ok(how) => {
                self.set_state(
                    p,
                    d.id,
                    "post_hook",
                    "applied",
                    Some(format!("post hook `{hook}` {how}")),
                )
                .await?;
                Ok(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: deployed; post hook `{hook}` {how}", p.key.job),
                })
            }
            Err(why) => Ok(self
                .fail_from(
                    p,
                    d.id,
                    "post_hook",
                    None,
                    format!("post hook failed after the register: {why}"),
                )
                .await?
                .report()),
        }
    }

    /// Dispatch the parameterized job `hook` (reconciled this tick, from
    /// this target's path) for deployment `run.id` and wait for the child
    /// job's final outcome. The idempotency token makes a repeated dispatch
    /// (after a crash) find the instance already running instead of
    /// starting another, as long as Nomad has not garbage-collected it; the
    /// child is recorded as soon as it exists, so a resumed tick waits for
    /// exactly that instance and says so when it is gone.
    /// `Ok` says how it succeeded.
    async fn run_hook(
        &self,
        p: &Parsed,
        run: &HookRun<'_>,
        hook: &str,
        phase: &str,
        timeout: Duration,
        hooks: &HookJobs,
    ) -> Result<String, String> {
        let Some(h) = hooks.get(hook) else {
            return Err(format!(
                "hook `{hook}` is not a parameterized job in this target's path (files matching `{}`); a named hook is never skipped",
                self.cfg.jobs
            ));
        };
        if !h.ok {
            return Err(format!(
                "hook job `{hook}` could not be registered this tick (see its own line)"
            ));
        }
        let ns = &h.key.namespace;
        let child = match run.child {
            Some(child) => {
                let found = self
                    .client
                    .call(
                        reqwest::Method::GET,
                        &format!("/v1/job/{}", seg(child)),
                        Some(ns),
                        &[],
                        None,
                        true,
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                if found.is_none() {
                    let msg = format!(
                        "hook `{hook}` instance {child}, dispatched before driftless was interrupted, is gone (Nomad garbage-collected it), so whether it succeeded is unknown; it is not dispatched again"
                    );
                    tracing::warn!(target_name = %self.ctx.name, job = %p.key.job, hook, phase, "{msg}");
                    return Err(msg);
                }
                child.to_string()
            }
            None => self.dispatch(p, run, h, hook, phase).await?,
        };
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(200);
        loop {
            let job = self
                .client
                .get(&format!("/v1/job/{}", seg(&child)), ns)
                .await
                .map_err(|e| e.to_string())?;
            let status = job["Status"].as_str().unwrap_or("unknown").to_string();
            if status == "dead" {
                return self.hook_outcome(hook, &child, ns).await;
            }
            if Instant::now() + pause > deadline {
                return Err(format!(
                    "hook `{hook}` ({child}) did not finish within {}; it is {status}",
                    humantime::format_duration(timeout)
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    /// Dispatch the hook with the meta keys its job declares, and record the
    /// child before waiting for it.
    async fn dispatch(
        &self,
        p: &Parsed,
        run: &HookRun<'_>,
        h: &HookJob,
        hook: &str,
        phase: &str,
    ) -> Result<String, String> {
        let token = match run.nonce {
            Some(n) => format!("driftless-{n}-{}-{phase}", run.id),
            None => format!("driftless-{}-{phase}", run.id),
        };
        let values = [
            ("driftless_deployment", run.id.to_string()),
            ("driftless_job", p.key.job.clone()),
            ("driftless_commit", self.commit().to_string()),
            ("driftless_phase", phase.to_string()),
        ];
        let meta: serde_json::Map<String, Value> = values
            .into_iter()
            .filter(|(k, _)| {
                h.meta_required
                    .iter()
                    .chain(&h.meta_optional)
                    .any(|m| m == k)
            })
            .map(|(k, v)| (k.to_string(), Value::String(v)))
            .collect();
        let body = json!({ "Meta": meta, "IdempotencyToken": token });
        let resp = self
            .client
            .call(
                reqwest::Method::POST,
                &format!("/v1/job/{}/dispatch", seg(hook)),
                Some(&h.key.namespace),
                &[("idempotency_token", &token)],
                Some(&body),
                false,
            )
            .await
            .map_err(|e| e.to_string())?
            .unwrap_or(Value::Null);
        let child = resp["DispatchedJobID"]
            .as_str()
            .ok_or_else(|| format!("Nomad's dispatch of `{hook}` returned no DispatchedJobID"))?
            .to_string();
        tracing::info!(target_name = %self.ctx.name, job = %p.key.job, hook, phase, dispatched = %child, "hook dispatched");
        let (pre, post) = if phase == "pre" {
            (Some(child.clone()), None)
        } else {
            (None, Some(child.clone()))
        };
        self.ledger
            .transition(
                run.id,
                run.state,
                run.state,
                Change {
                    message: Some(format!("{phase} hook `{hook}` dispatched: {child}")),
                    pre_hook_child: pre,
                    post_hook_child: post,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| format!("cannot record the dispatch of {child}: {e}"))?;
        Ok(child)
    }

    /// A dead child job, judged by its final allocations: Nomad reschedules
    /// a failed allocation of a batch job, linking the new one through
    /// `NextAllocation`, so only allocations nothing replaced say how it
    /// ended.
    async fn hook_outcome(&self, hook: &str, child: &str, ns: &str) -> Result<String, String> {
        let allocs = self
            .client
            .get(&format!("/v1/job/{}/allocations", seg(child)), ns)
            .await
            .map_err(|e| e.to_string())?;
        let allocs = allocs.as_array().cloned().unwrap_or_default();
        let replaced = |a: &Value| a["NextAllocation"].as_str().is_some_and(|n| !n.is_empty());
        let status = |a: &Value| a["ClientStatus"].as_str().unwrap_or("unknown").to_string();
        let finals: Vec<&Value> = allocs.iter().filter(|a| !replaced(a)).collect();
        let retried = allocs
            .iter()
            .filter(|a| replaced(a) && matches!(status(a).as_str(), "failed" | "lost"))
            .count();
        if finals.is_empty() {
            return Err(format!(
                "hook `{hook}` ({child}) ended without running an allocation"
            ));
        }
        let bad: Vec<String> = finals
            .iter()
            .map(|a| status(a))
            .filter(|s| s != "complete")
            .collect();
        let after = match retried {
            0 => String::new(),
            1 => " after 1 failed allocation Nomad rescheduled".into(),
            n => format!(" after {n} failed allocations Nomad rescheduled"),
        };
        if !bad.is_empty() {
            return Err(format!(
                "hook `{hook}` ({child}) ended without success: {} of its {} final allocations {}{after}",
                bad.len(),
                finals.len(),
                bad.join(", ")
            ));
        }
        Ok(format!("succeeded{after}"))
    }

    async fn fail_deployment(
        &self,
        p: &Parsed,
        id: i64,
        at_index: i64,
        msg: String,
    ) -> Result<Followed, JobReport> {
        self.fail_from(p, id, "applying", Some(at_index), msg).await
    }

    /// Move a deployment to `failed`; `at_index` is the live JobModifyIndex
    /// the same spec must not be registered again at (default: the one it
    /// was planned against).
    async fn fail_from(
        &self,
        p: &Parsed,
        id: i64,
        from: &str,
        at_index: Option<i64>,
        msg: String,
    ) -> Result<Followed, JobReport> {
        let msg = self.ctx.redactor.redact(&msg);
        self.ledger
            .transition(
                id,
                from,
                "failed",
                Change {
                    message: Some(msg.clone()),
                    failed_at_index: at_index,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        Ok(Followed::Settled(self.job_error(
            &p.file,
            Some(&p.key.job),
            msg,
        )))
    }

    /// Give up on an active deployment for a newer spec.
    async fn supersede(
        &self,
        p: &Parsed,
        d: &Deployment,
        why: String,
    ) -> Result<Followed, JobReport> {
        self.set_state(p, d.id, &d.state, "superseded", Some(why.clone()))
            .await?;
        Ok(Followed::Superseded(JobReport {
            result: JobResult::NoChange,
            line: format!("{}: deployment {} {why}", p.key.job, d.id),
        }))
    }

    /// Why a newer spec replaces deployment `d`: a newer commit, or, at
    /// the same commit, what else goes into the spec (the target's inputs,
    /// the job's variables file as it resolves, a scaled group's live count).
    fn superseded_by(&self, d: &Deployment) -> String {
        let now = self.commit();
        if !now.is_empty() && d.commit_sha != now {
            format!("superseded by commit {}", self.commit_short())
        } else {
            format!(
                "superseded at the same commit {}: the job's spec changed (the target's inputs, or a scaled group's live count)",
                self.commit_short()
            )
        }
    }

    /// How long a deployment may wait for promotion before its owners hear
    /// it is overdue.
    fn promotion_wait(&self) -> Duration {
        self.cfg
            .promotion_wait
            .as_deref()
            .and_then(|w| parse_promotion_wait(w).ok())
            .unwrap_or(DEFAULT_PROMOTION_WAIT)
    }

    /// Our Nomad deployment of the registered version is `running`: when
    /// its canaries wait for a manual promotion, the deployment record says
    /// so (`pending_promotion`) and waits for a person; a person's
    /// promotion (`promoting`) is sent to Nomad here, in the tick, never in
    /// the API call. Nomad's own rules (nomad/structs/deployment.go,
    /// `RequiresPromotion` and `HasAutoPromote`): a group with
    /// `DesiredCanaries > 0` and not `Promoted` holds the rollout; when
    /// every such group has `auto_promote`, Nomad promotes it itself once
    /// the canaries are healthy, and nobody is asked. Waiting past
    /// `promotion_wait` tells the owners once; it never fails the
    /// deployment (the progress deadline is Nomad's: the deployment watcher
    /// fails a canary deployment at its deadline only when its canaries are
    /// not healthy, `deploymentWatcher.shouldFail`).
    async fn canaries(
        &self,
        p: &Parsed,
        d: &Deployment,
        dep: &Value,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let dep_id = dep["ID"].as_str().unwrap_or("?").to_string();
        let waiting = canary_groups(dep);
        let needs = !waiting.is_empty();
        let auto = needs && waiting.iter().all(|g| g.auto_promote);
        let shown = waiting
            .iter()
            .map(|g| {
                format!(
                    "{}: {} of {} canaries healthy",
                    g.name, g.healthy, g.desired
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let running = |line: String| {
            Ok(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!("{}: {line}", key.job),
            }))
        };
        let change = |message: String| Change {
            message: Some(message),
            nomad_deployment_id: Some(dep_id.clone()),
            ..Change::default()
        };
        match d.state.as_str() {
            "applying" if needs && !auto => {
                let msg = format!(
                    "Nomad deployment {dep_id} runs its canaries ({shown}) and requires promotion"
                );
                self.ledger
                    .transition(d.id, "applying", "pending_promotion", change(msg.clone()))
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                running(format!(
                    "{msg}: deployment {} waits for a person (driftless approve {})",
                    d.id, d.id
                ))
            }
            "applying" if auto => running(format!(
                "Nomad deployment {dep_id} running, pending automatic promotion ({shown})"
            )),
            "pending_promotion" | "promoting" if !needs => {
                // Promoted in Nomad (its UI or CLI, or by us before a tick
                // died): the rollout goes on.
                let msg = format!("Nomad deployment {dep_id} was promoted; rolling out the rest");
                self.ledger
                    .transition(d.id, &d.state, "applying", change(msg.clone()))
                    .await
                    .map_err(|e| self.ledger_err(p, e))?;
                running(msg)
            }
            "pending_promotion" => {
                let since = d.waiting_since.unwrap_or(d.created_at);
                let waited = Duration::from_millis((now_ms() - since).max(0) as u64);
                let bound = self.promotion_wait();
                let waited_s = humantime::format_duration(Duration::from_secs(waited.as_secs()));
                if waited > bound && d.overdue_at.is_none() {
                    let msg = format!(
                        "Nomad deployment {dep_id} has waited for promotion for {waited_s}, past \
                         promotion_wait ({}); canaries: {shown}",
                        humantime::format_duration(bound)
                    );
                    self.ledger
                        .transition(
                            d.id,
                            "pending_promotion",
                            "pending_promotion",
                            Change {
                                overdue: true,
                                ..change(msg)
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                }
                running(format!(
                    "waiting for promotion for {waited_s}: Nomad deployment {dep_id} ({shown}); \
                     promote it: driftless approve {}",
                    d.id
                ))
            }
            "promoting" => match self.promote(key, &dep_id).await {
                Ok(()) => {
                    let msg = format!(
                        "Nomad deployment {dep_id} promoted ({shown}); rolling out the rest"
                    );
                    self.ledger
                        .transition(d.id, "promoting", "applying", change(msg.clone()))
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    running(msg)
                }
                Err(e @ NomadError::Unreachable { .. }) => {
                    // Asked again next tick.
                    Ok(Followed::Waiting(self.job_error(
                        &p.file,
                        Some(&key.job),
                        format!("promoting deployment {}: {e}", d.id),
                    )))
                }
                Err(e) => {
                    let why = match &e {
                        NomadError::Status { status: 403, .. } => format!(
                            "Nomad refused to promote deployment {dep_id}: driftless's token needs \
                             the `submit-job` or `promote-deployment` capability in namespace `{}` ({e})",
                            key.namespace
                        ),
                        _ => format!("Nomad refused to promote deployment {dep_id}: {e}"),
                    };
                    let why = self.ctx.redactor.redact(&why);
                    self.ledger
                        .transition(d.id, "promoting", "pending_promotion", change(why.clone()))
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    Ok(Followed::Waiting(self.job_error(
                        &p.file,
                        Some(&key.job),
                        format!("{why}; deployment {} waits for promotion again", d.id),
                    )))
                }
            },
            _ => running(format!("Nomad deployment {dep_id} running")),
        }
    }

    /// `PUT /v1/deployment/promote/:id` with `All` (api/deployments.go,
    /// `PromoteAll`; command/agent/deployment_endpoint.go,
    /// `deploymentPromote`): Nomad promotes every group's canaries, or
    /// answers why not (500 with "Task group … has 0/1 healthy
    /// allocations", state_store.go `UpdateDeploymentPromotion`; 403
    /// without `submit-job` or `promote-deployment`).
    async fn promote(&self, key: &JobKey, dep_id: &str) -> Result<(), NomadError> {
        self.client
            .call(
                reqwest::Method::PUT,
                &format!("/v1/deployment/promote/{}", seg(dep_id)),
                Some(&key.namespace),
                &[],
                Some(&json!({ "DeploymentID": dep_id, "All": true })),
                false,
            )
            .await
            .map(|_| ())
    }

    /// An active deployment past `detected`: finish what it started (its
    /// pre hook, its register), then follow Nomad's deployment of exactly
    /// the version it registered. With `newer` (git now gives another
    /// spec), whatever is still waiting — its hooks, its register, Nomad —
    /// is superseded instead of waited for; one Nomad already finished is
    /// settled first.
    async fn follow(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        hooks: &HookJobs,
        newer: bool,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        let rolling = matches!(
            d.state.as_str(),
            "applying" | "pending_promotion" | "promoting"
        );
        if newer && (!rolling || d.registered_index.is_none()) {
            let why = match d.state.as_str() {
                "pre_hook" => {
                    "before its pre hook finished (nothing was registered for it)".to_string()
                }
                "post_hook" => {
                    "while its post hook ran (the instance already dispatched is not waited for)"
                        .to_string()
                }
                _ => "before it was registered".to_string(),
            };
            return self
                .supersede(p, d, format!("{} {why}", self.superseded_by(d)))
                .await;
        }
        if d.state == "post_hook" {
            // A tick died while the post hook ran: wait for the instance it
            // dispatched (recorded), or find it by its idempotency token.
            let Some(hook) = d.post_hook.clone() else {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "post_hook",
                        None,
                        "post_hook state without a post hook".into(),
                    )
                    .await;
            };
            return Ok(Followed::Settled(
                self.finish_post_hook(p, d, &hook, hooks).await?,
            ));
        }
        let mut d = d.clone();
        if d.state == "pre_hook" {
            // Approved with a pre hook, or a tick died while it ran: the spec
            // is the recorded one (`newer` is false); make sure the live job
            // has not moved, then run (or find) the hook, then register.
            if self
                .ledger
                .is_paused(&self.ctx.name, &key.job)
                .await
                .map_err(|e| self.ledger_err(p, e))?
            {
                return Ok(Followed::Waiting(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: paused by a person; deployment {} waits", key.job, d.id),
                }));
            }
            let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64()).unwrap_or(0);
            if live_index != d.job_modify_index {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "pre_hook",
                        None,
                        "job modified outside driftless since its plan; the live job stands".into(),
                    )
                    .await;
            }
            if let Err(why) = self.check_hooks(p, hooks) {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "pre_hook",
                        None,
                        format!("{why}; nothing registered"),
                    )
                    .await;
            }
            let Some(hook) = d.pre_hook.clone() else {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "pre_hook",
                        None,
                        "pre_hook state without a pre hook".into(),
                    )
                    .await;
            };
            let run = HookRun {
                id: d.id,
                nonce: d.hook_nonce.as_deref(),
                child: d.pre_hook_child.as_deref(),
                state: "pre_hook",
            };
            if let Err(why) = self
                .run_hook(p, &run, &hook, "pre", hook_timeout(&d), hooks)
                .await
            {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "pre_hook",
                        None,
                        format!("pre hook failed; nothing registered: {why}"),
                    )
                    .await;
            }
            self.set_state(p, d.id, "pre_hook", "applying", None)
                .await?;
            d.state = "applying".into();
        }
        let d = &d;
        let Some(registered) = d.registered_index else {
            return self.settle_unregistered(p, d, live, hooks).await;
        };
        let deployments = match self.nomad_deployments(key).await {
            Ok(v) => v,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        // Ours is the one for the job version we registered: Nomad's
        // `JobSpecModifyIndex` (its `JobModifyIndex` is the job's
        // ModifyIndex, which moves without a new spec). After an
        // auto-revert, the latest deployment is the revert's, not ours.
        let ours = deployments
            .iter()
            .find(|x| x["JobSpecModifyIndex"].as_i64() == Some(registered));
        if let Some(dep) = ours {
            let status = dep["Status"].as_str().unwrap_or("");
            let why = dep["StatusDescription"].as_str().unwrap_or("");
            let dep_id = dep["ID"].as_str().unwrap_or("?").to_string();
            return match status {
                "successful" => Ok(Followed::Settled(
                    self.succeed(
                        p,
                        d,
                        format!("Nomad deployment {dep_id} successful"),
                        Some(dep_id),
                        hooks,
                    )
                    .await?,
                )),
                "failed" | "cancelled" => {
                    // The live index now: after an auto-revert it is the
                    // revert's, where this spec must not be registered again.
                    let at = match self.live(key).await {
                        Ok(l) => l.and_then(|l| l["JobModifyIndex"].as_i64()),
                        Err(_) => None,
                    };
                    let msg = self.ctx.redactor.redact(&format!(
                        "Nomad deployment {dep_id} {status}: {why}"
                    ));
                    self.ledger
                        .transition(
                            d.id,
                            &d.state,
                            "failed",
                            Change {
                                message: Some(msg.clone()),
                                nomad_deployment_id: Some(dep_id),
                                failed_at_index: Some(at.unwrap_or(registered)),
                                ..Change::default()
                            },
                        )
                        .await
                        .map_err(|e| self.ledger_err(p, e))?;
                    Ok(Followed::Settled(self.job_error(
                        &p.file,
                        Some(&key.job),
                        msg,
                    )))
                }
                other if newer => {
                    self.supersede(
                        p,
                        d,
                        format!(
                            "{} while Nomad deployment {dep_id} was {other} (Nomad cancels it for the newer version)",
                            self.superseded_by(d)
                        ),
                    )
                    .await
                }
                "running" => self.canaries(p, d, dep).await,
                other => Ok(Followed::Waiting(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: Nomad deployment {dep_id} {other}", key.job),
                })),
            };
        }
        // No deployment for our version (yet).
        let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64());
        if live_index != Some(registered) {
            let now = match live_index {
                Some(i) => format!("its JobModifyIndex is {i}, ours was {registered}"),
                None => "it is no longer registered".into(),
            };
            return self
                .fail_from(
                    p,
                    d.id,
                    &d.state,
                    live_index,
                    format!("job modified outside driftless after the register, before Nomad started a deployment for it ({now}); the live job stands"),
                )
                .await;
        }
        if let Some(reason) = live.and_then(no_deployment_reason) {
            let msg = format!("registered; Nomad runs no deployment for it: {reason}");
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        }
        let Some(eval_id) = d.eval_id.as_deref() else {
            let msg =
                "registered; Nomad created no evaluation and no deployment for it".to_string();
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        };
        let eval = match self
            .client
            .call(
                reqwest::Method::GET,
                &format!("/v1/evaluation/{}", seg(eval_id)),
                Some(&key.namespace),
                &[],
                None,
                true,
            )
            .await
        {
            Ok(e) => e,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        let Some(eval) = eval else {
            let msg = format!(
                "registered; Nomad started no deployment and no longer has its evaluation {eval_id}"
            );
            return Ok(Followed::Settled(
                self.succeed(p, d, msg, None, hooks).await?,
            ));
        };
        let status = eval["Status"].as_str().unwrap_or("unknown");
        match status {
            "complete" => {
                // The scheduler submits the plan, with its deployment, before
                // it marks the evaluation complete (scheduler/generic_sched.go,
                // GenericScheduler.Process: `process` submits the plan, then
                // `setStatus(.., EvalStatusComplete, ..)` updates the eval):
                // the deployments read before the evaluation may have missed
                // one made in between. Read after it, they cannot.
                match self.nomad_deployments(key).await {
                    Ok(v) => {
                        if let Some(dep) = v
                            .iter()
                            .find(|x| x["JobSpecModifyIndex"].as_i64() == Some(registered))
                        {
                            let dep_id = dep["ID"].as_str().unwrap_or("?");
                            let status = dep["Status"].as_str().unwrap_or("");
                            return Ok(Followed::Waiting(JobReport {
                                result: JobResult::NoChange,
                                line: format!("{}: Nomad deployment {dep_id} {status}", key.job),
                            }));
                        }
                    }
                    Err(e) => {
                        return Ok(Followed::Waiting(self.job_error(
                            &p.file,
                            Some(&key.job),
                            e,
                        )));
                    }
                }
                let msg = format!(
                    "registered; Nomad's evaluation {eval_id} completed without a deployment (nothing to roll out)"
                );
                Ok(Followed::Settled(
                    self.succeed(p, d, msg, None, hooks).await?,
                ))
            }
            "failed" | "canceled" | "cancelled" => {
                let why = eval["StatusDescription"].as_str().unwrap_or("");
                self.fail_from(
                    p,
                    d.id,
                    &d.state,
                    Some(registered),
                    format!("Nomad's evaluation {eval_id} {status}: {why}"),
                )
                .await
            }
            other => {
                let waited = d
                    .registered_at
                    .map(|at| Duration::from_millis((now_ms() - at).max(0) as u64))
                    .unwrap_or_default();
                if waited > self.ctx.timeout {
                    return self
                        .fail_from(
                            p,
                            d.id,
                            &d.state,
                            Some(registered),
                            format!(
                                "Nomad started no deployment within {} of the register; its evaluation {eval_id} is {other}",
                                humantime::format_duration(self.ctx.timeout)
                            ),
                        )
                        .await;
                }
                if newer {
                    return self
                        .supersede(
                            p,
                            d,
                            format!(
                                "{} while Nomad's evaluation {eval_id} was {other}",
                                self.superseded_by(d)
                            ),
                        )
                        .await;
                }
                Ok(Followed::Waiting(JobReport {
                    result: JobResult::NoChange,
                    line: format!(
                        "{}: registered, waiting for Nomad: evaluation {eval_id} is {other}",
                        key.job
                    ),
                }))
            }
        }
    }

    /// An `applying` deployment whose register is not known to have
    /// happened: approved by a person and not registered yet, or a tick
    /// died between recording `applying` and the register's answer. CAS
    /// makes this safe to settle: if the live index is still the one we
    /// planned against, the register never happened (re-plan and register
    /// exactly the recorded spec); otherwise, if the live job is ours, it
    /// did.
    async fn settle_unregistered(
        &self,
        p: &Parsed,
        d: &Deployment,
        live: Option<&Value>,
        hooks: &HookJobs,
    ) -> Result<Followed, JobReport> {
        let key = &p.key;
        if self
            .ledger
            .is_paused(&self.ctx.name, &key.job)
            .await
            .map_err(|e| self.ledger_err(p, e))?
        {
            return Ok(Followed::Waiting(JobReport {
                result: JobResult::NoChange,
                line: format!(
                    "{}: paused by a person; deployment {} waits, not registered",
                    key.job, d.id
                ),
            }));
        }
        let live_index = live.and_then(|l| l["JobModifyIndex"].as_i64()).unwrap_or(0);
        let spec = Self::with_live_counts(&p.job, live);
        if live_index == d.job_modify_index {
            if let Err(why) = self.check_hooks(p, hooks) {
                return self
                    .fail_from(
                        p,
                        d.id,
                        "applying",
                        None,
                        format!("{why}; nothing registered"),
                    )
                    .await;
            }
            let plan = match self.plan(key, &spec).await {
                Ok(pl) => pl,
                Err(e) => {
                    return Ok(Followed::Waiting(self.job_error(
                        &p.file,
                        Some(&key.job),
                        e,
                    )));
                }
            };
            if plan.kind == "None" {
                self.set_state(
                    p,
                    d.id,
                    "applying",
                    "applied",
                    Some("the live job already matches".into()),
                )
                .await?;
                return Ok(Followed::Settled(JobReport {
                    result: JobResult::NoChange,
                    line: format!("{}: no change", key.job),
                }));
            }
            let summary = diff_summary(&plan.diff);
            return self
                .apply_registered(p, d.id, &spec, plan, &summary, hooks)
                .await;
        }
        let plan = match self.plan(key, &spec).await {
            Ok(pl) => pl,
            Err(e) => {
                return Ok(Followed::Waiting(self.job_error(
                    &p.file,
                    Some(&key.job),
                    e,
                )));
            }
        };
        if plan.kind == "None" {
            self.ledger
                .transition(
                    d.id,
                    "applying",
                    "applying",
                    Change {
                        registered_index: Some(live_index),
                        message: Some(
                            "registered (confirmed after a restart); following Nomad's deployment"
                                .into(),
                        ),
                        ..Change::default()
                    },
                )
                .await
                .map_err(|e| self.ledger_err(p, e))?;
            return Ok(Followed::Waiting(JobReport {
                result: JobResult::Changed,
                line: format!("{}: registered (confirmed after a restart)", key.job),
            }));
        }
        self.fail_deployment(
            p,
            d.id,
            live_index,
            "job modified outside driftless since its plan; the live job stands".into(),
        )
        .await
    }

    /// What registering git's jobs now would change, changing nothing
    /// (`driftless plan`): Nomad's parse and its plan dry-run with `Diff`
    /// per job file, against the live job's scaled counts, as `converge`
    /// plans before every register. Nothing is recorded in the ledger.
    async fn preview(&self) -> Result<super::Plan, String> {
        let files = self.job_files()?;
        if files.is_empty() {
            return Err(format!(
                "no job files matching `{}` in {}",
                self.cfg.jobs,
                self.ctx.workdir.display()
            ));
        }
        let mut lines = Vec::new();
        let mut destructive = false;
        let (mut add, mut change) = (0, 0);
        let mut h = Sha256::new();
        h.update(b"driftless-nomad-plan-v1");
        for file in &files {
            let p = self.parse(file).await.map_err(|e| format!("{file}: {e}"))?;
            let key = &p.key;
            let live = self
                .live(key)
                .await
                .map_err(|e| format!("{file} (job {}): {e}", key.job))?;
            let spec = Self::with_live_counts(&p.job, live.as_ref());
            let plan = self
                .plan(key, &spec)
                .await
                .map_err(|e| format!("{file} (job {}): {e}", key.job))?;
            if plan.kind == "None" {
                continue;
            }
            let diff = redact_diff(&plan.diff, &self.ctx.redactor);
            // A task group removed from the job stops its allocations.
            let drops_group = diff["TaskGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|g| g["Type"] == "Deleted");
            destructive |= drops_group;
            let sign = match plan.kind.as_str() {
                "Added" => {
                    add += 1;
                    "+"
                }
                _ => {
                    change += 1;
                    if drops_group { "-/+" } else { "~" }
                }
            };
            lines.push(format!(
                "{sign} job {}/{} ({file}, policy {}): {}",
                key.namespace,
                key.job,
                p.policy.as_str(),
                diff_summary(&plan.diff)
            ));
            h.update(format!("\0{}/{}\0{}\0", key.namespace, key.job, spec_hash(&spec)).as_bytes());
            h.update(diff.to_string().as_bytes());
        }
        Ok(super::Plan {
            changes: !lines.is_empty(),
            summary: format!("{add} job(s) to add, {change} to change"),
            diff: self.ctx.redactor.redact(&lines.join("\n")),
            destructive,
            hash: hex::encode(h.finalize()),
            artifact: None,
        })
    }

    async fn converge(&self) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let files = match self.job_files() {
            Ok(f) => f,
            Err(e) => return Status::failed(e),
        };
        if files.is_empty() {
            return Status::failed(format!(
                "no job files matching `{}` in {}",
                self.cfg.jobs,
                self.ctx.workdir.display()
            ));
        }
        let mut outcomes = Vec::new();
        let mut seen = BTreeSet::new();
        let mut parsed = Vec::new();
        for file in &files {
            match self.parse(file).await {
                Ok(p) => {
                    seen.insert(p.key.clone());
                    parsed.push(p);
                }
                Err(e) => outcomes.push(self.job_error(file, None, e)),
            }
        }
        // Parameterized jobs (hooks) first: a job's pre hook must be
        // registered before it is dispatched.
        parsed.sort_by_key(|p| p.job["ParameterizedJob"].is_null());
        let mut hooks = HookJobs::new();
        for p in &parsed {
            if Instant::now() > deadline {
                outcomes.push(self.job_error(
                    &p.file,
                    Some(&p.key.job),
                    "not reached before the target's timeout",
                ));
                continue;
            }
            match self.reconcile(p, &hooks).await {
                Ok(o) => {
                    if !p.job["ParameterizedJob"].is_null() {
                        let keys = |k: &str| -> Vec<String> {
                            p.job["ParameterizedJob"][k]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .filter_map(|v| v.as_str().map(str::to_string))
                                .collect()
                        };
                        hooks.insert(
                            p.key.job.clone(),
                            HookJob {
                                key: p.key.clone(),
                                ok: o.result != JobResult::Failed,
                                meta_required: keys("MetaRequired"),
                                meta_optional: keys("MetaOptional"),
                                payload_required: p.job["ParameterizedJob"]["Payload"]
                                    == "required",
                            },
                        );
                    }
                    outcomes.push(o);
                }
                Err(o) => {
                    // The state could not be persisted: stop here.
                    outcomes.push(o);
                    break;
                }
            }
        }
        // Orphans: jobs this target deployed that git no longer has.
        match self.ledger.jobs_of(&self.ctx.name).await {
            Ok(known) => {
                let orphans: Vec<String> = known
                    .iter()
                    .filter(|d| d.key.cluster == self.cluster && !seen.contains(&d.key))
                    .map(|d| format!("{}/{}", d.key.namespace, d.key.job))
                    .collect();
                if !orphans.is_empty() {
                    outcomes.push(JobReport {
                        result: JobResult::NoChange,
                        line: format!(
                            "orphaned (removed from git, left running; driftless never stops jobs): {}",
                            orphans.join(", ")
                        ),
                    });
                }
            }
            Err(e) => outcomes.push(JobReport {
                result: JobResult::Failed,
                line: format!("cannot list this target's deployments: {e}"),
            }),
        }
        let result = if outcomes.iter().any(|o| o.result == JobResult::Failed) {
            ApplyResult::Failed
        } else if outcomes.iter().any(|o| o.result == JobResult::Changed) {
            ApplyResult::Changed
        } else {
            ApplyResult::NoChange
        };
        let lines: Vec<&str> = outcomes.iter().map(|o| o.line.as_str()).collect();
        Status {
            result,
            message: self.ctx.redactor.redact(&lines.join("; ")),
            output_tail: self.ctx.redactor.redact(&lines.join("\n")),
            digest: None,
        }
    }

    async fn outputs_inner(&self) -> Result<Outputs, BackendError> {
        let mut out = Outputs::new();
        let mut jobs = serde_json::Map::new();
        let mut seen = BTreeSet::new();
        for file in self.job_files().map_err(BackendError::Command)? {
            let parsed = match self.parse(&file).await {
                Ok(p) => p,
                Err(e) => {
                    jobs.insert(
                        file.clone(),
                        json!({ "error": self.ctx.redactor.redact(&e) }),
                    );
                    continue;
                }
            };
            seen.insert(parsed.key.clone());
            let key = &parsed.key;
            let live = self
                .live(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let active = self
                .ledger
                .active(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let latest = self
                .ledger
                .latest(key)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let spec = Self::with_live_counts(&parsed.job, live.as_ref());
            let plan = self
                .plan(key, &spec)
                .await
                .map_err(|e| BackendError::Command(e.to_string()))?;
            let dep = |d: &Deployment| {
                json!({
                    "id": d.id,
                    "state": d.state,
                    "commit": d.commit_sha,
                    "spec_hash": d.spec_hash,
                    "job_modify_index": d.job_modify_index,
                    "summary": d.diff_summary,
                    "diff": serde_json::from_str::<Value>(&d.diff).unwrap_or(Value::Null),
                    "message": d.message,
                })
            };
            jobs.insert(
                key.job.clone(),
                json!({
                    "file": parsed.file,
                    "namespace": key.namespace,
                    "policy": parsed.policy.as_str(),
                    "live_version": live.as_ref().map(|l| l["Version"].clone()),
                    "job_modify_index": live.as_ref().map(|l| l["JobModifyIndex"].clone()),
                    "drift": if plan.kind == "None" { Value::Null } else {
                        json!({ "summary": diff_summary(&plan.diff), "diff": redact_diff(&plan.diff, &self.ctx.redactor) })
                    },
                    "active_deployment": active.as_ref().map(dep),
                    "last_deployment": latest.as_ref().map(dep),
                }),
            );
        }
        let orphans: Vec<Value> = self
            .ledger
            .jobs_of(&self.ctx.name)
            .await
            .map_err(|e| BackendError::Command(e.to_string()))?
            .into_iter()
            .filter(|d| d.key.cluster == self.cluster && !seen.contains(&d.key))
            .map(|d| json!(format!("{}/{}", d.key.namespace, d.key.job)))
            .collect();
        out.insert("jobs".into(), Value::Object(jobs));
        out.insert("orphans".into(), Value::Array(orphans));
        Ok(out)
    }

    async fn destroy_inner(&self) -> Status {
        if !self.cfg.allow_destroy {
            return Status::failed(
                "refused: driftless never stops Nomad jobs (set `allow_destroy = true` in the target's backend to let `destroy` deregister them, without purge)",
            );
        }
        let files = match self.job_files() {
            Ok(f) => f,
            Err(e) => return Status::failed(e),
        };
        let mut lines = Vec::new();
        let mut failed = false;
        for file in files {
            let parsed = match self.parse(&file).await {
                Ok(p) => p,
                Err(e) => {
                    failed = true;
                    lines.push(format!("{file}: {e}"));
                    continue;
                }
            };
            let key = &parsed.key;
            match self
                .client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/job/{}", seg(&key.job)),
                    Some(&key.namespace),
                    &[("purge", "false")],
                    None,
                    true,
                )
                .await
            {
                Ok(Some(_)) => lines.push(format!("{}: deregistered (not purged)", key.job)),
                Ok(None) => lines.push(format!("{}: not registered", key.job)),
                Err(e) => {
                    failed = true;
                    lines.push(format!("{}: {e}", key.job));
                }
            }
        }
        Status {
            result: if failed {
                ApplyResult::Failed
            } else {
                ApplyResult::Changed
            },
            message: self.ctx.redactor.redact(&lines.join("; ")),
            output_tail: String::new(),
            digest: None,
        }
    }
}

impl Backend for Nomad {
    /// Read-only, for `driftless plan`: Nomad's policies and approvals are
    /// per job (`meta { driftless_policy }`) and stay in its own ledger, so
    /// there is no `apply_plan`.
    fn plan(&self) -> Option<BoxFuture<'_, Result<super::Plan, String>>> {
        Some(Box::pin(self.preview()))
    }

    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.converge())
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(self.destroy_inner())
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(self.outputs_inner())
    }
}

struct Plan {
    index: i64,
    diff: Value,
    kind: String,
}

/// Why Nomad starts no deployment for a registered job, if it never will
/// (scheduler/reconciler/reconcile_cluster.go, `createDeployment`: only
/// service jobs, only groups with a non-empty update strategy and a count
/// above 0; parameterized and periodic jobs run nothing themselves). System
/// jobs are left to the evaluation: Nomad 1.11 gives them deployments.
fn no_deployment_reason(job: &Value) -> Option<String> {
    if !job["ParameterizedJob"].is_null() {
        return Some("a parameterized job runs only when dispatched".into());
    }
    if !job["Periodic"].is_null() {
        return Some("a periodic job runs on its schedule".into());
    }
    let kind = job["Type"].as_str().unwrap_or("service");
    if kind == "batch" || kind == "sysbatch" {
        return Some(format!("Nomad runs no deployments for {kind} jobs"));
    }
    if kind != "service" {
        return None;
    }
    let groups: Vec<&Value> = job["TaskGroups"].as_array().into_iter().flatten().collect();
    let count = |g: &Value| g["Count"].as_i64().unwrap_or(1);
    if groups.iter().all(|g| count(g) == 0) {
        return Some("every group's count is 0".into());
    }
    let updates = |g: &Value| g["Update"]["MaxParallel"].as_i64().unwrap_or(0) > 0;
    if !groups.iter().any(|g| count(g) > 0 && updates(g)) {
        return Some(
            "no group has an update strategy (no `update` block, or max_parallel = 0)".into(),
        );
    }
    None
}

/// A task group of a Nomad deployment whose canaries hold the rollout.
struct CanaryGroup {
    name: String,
    desired: i64,
    healthy: i64,
    auto_promote: bool,
}

/// The groups of a running Nomad deployment that wait for promotion
/// (nomad/structs/deployment.go, `RequiresPromotion`: `DesiredCanaries > 0`
/// and not `Promoted`); none when the deployment is not running.
fn canary_groups(dep: &Value) -> Vec<CanaryGroup> {
    if dep["Status"] != "running" {
        return Vec::new();
    }
    let mut out: Vec<CanaryGroup> = dep["TaskGroups"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(_, g)| {
            g["DesiredCanaries"].as_i64().unwrap_or(0) > 0 && g["Promoted"] != Value::Bool(true)
        })
        .map(|(name, g)| CanaryGroup {
            name: name.clone(),
            desired: g["DesiredCanaries"].as_i64().unwrap_or(0),
            // Before promotion every healthy allocation of the deployment
            // is a canary (only canaries are placed).
            healthy: g["HealthyAllocs"].as_i64().unwrap_or(0),
            auto_promote: g["AutoPromote"] == Value::Bool(true),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn hook_timeout(d: &Deployment) -> Duration {
    d.hook_timeout_ms
        .map(|ms| Duration::from_millis(ms.max(0) as u64))
        .unwrap_or(DEFAULT_HOOK_TIMEOUT)
}

/// `n` random bytes as hex.
fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    // getrandom fails only without an OS entropy source; a time-based
    // value still keeps tokens apart across state databases.
    if getrandom::fill(&mut b).is_err() {
        let t = now_ms().to_le_bytes();
        for (i, x) in b.iter_mut().enumerate() {
            *x = t[i % t.len()] ^ (i as u8);
        }
    }
    hex::encode(b)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A path segment, percent-encoded.
fn seg(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// SHA-256 of the job JSON (serde_json's maps are sorted: stable).
pub fn spec_hash(job: &Value) -> String {
    hex::encode(Sha256::digest(job.to_string().as_bytes()))
}

const SECRET_WORDS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "token",
    "credential",
    "api_key",
    "apikey",
    "private_key",
    "access_key",
];

fn secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with("env[") || SECRET_WORDS.iter().any(|w| n.contains(w))
}

/// The diff with every secret value replaced by `[REDACTED]`: the values of
/// unchanged (Type "None") fields, `Env[...]` fields, template contents,
/// fields whose name looks like a secret, credentials in any URL, and
/// anything the target's redactor knows.
pub fn redact_diff(diff: &Value, redactor: &crate::redact::Redactor) -> Value {
    fn walk(v: &mut Value, in_template: bool) {
        match v {
            Value::Object(m) => {
                let is_template = m
                    .get("Name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n == "Template" || n == "Templates");
                let is_field = m.contains_key("Old") || m.contains_key("New");
                if is_field {
                    let name = m.get("Name").and_then(Value::as_str).unwrap_or("");
                    // Nomad's plan diff is contextual: inside a changed
                    // object every field is listed, the unchanged ones with
                    // Type "None" and their values (structs/diff.go,
                    // fieldDiff). An unchanged value is nothing to review,
                    // and it is where driver config and artifact secrets
                    // sit: it is never kept.
                    let unchanged = m.get("Type").and_then(Value::as_str) == Some("None");
                    if unchanged || in_template || secret_name(name) {
                        for k in ["Old", "New"] {
                            if let Some(x) = m.get_mut(k)
                                && x.as_str().is_some_and(|s| !s.is_empty())
                            {
                                *x = Value::String("[REDACTED]".into());
                            }
                        }
                    }
                }
                for (_, x) in m.iter_mut() {
                    walk(x, in_template || is_template);
                }
            }
            Value::Array(a) => {
                for x in a {
                    walk(x, in_template);
                }
            }
            _ => {}
        }
    }
    let mut d = diff.clone();
    walk(&mut d, false);
    // Known secret values (the token, env: secrets) wherever they appear.
    let text = redactor.redact(&d.to_string());
    serde_json::from_str(&text).unwrap_or(d)
}

/// "2 groups, 3 fields edited; 1 added" — a one-line account of a diff.
pub fn diff_summary(diff: &Value) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    fn walk(v: &Value, path: &str, counts: &mut BTreeMap<String, usize>) {
        let Some(m) = v.as_object() else { return };
        for f in m
            .get("Fields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let t = f["Type"].as_str().unwrap_or("Edited").to_lowercase();
            if t != "none" {
                let name = f["Name"].as_str().unwrap_or("?");
                *counts.entry(format!("{path}{name} {t}")).or_default() += 1;
            }
        }
        for (key, label) in [
            ("Objects", ""),
            ("TaskGroups", "group "),
            ("Tasks", "task "),
        ] {
            for o in m.get(key).and_then(Value::as_array).into_iter().flatten() {
                let name = o["Name"].as_str().unwrap_or("?");
                let t = o["Type"].as_str().unwrap_or("Edited");
                if t == "Added" || t == "Deleted" {
                    *counts
                        .entry(format!("{path}{label}{name} {}", t.to_lowercase()))
                        .or_default() += 1;
                } else {
                    walk(o, &format!("{path}{label}{name}: "), counts);
                }
            }
        }
    }
    let t = diff["Type"].as_str().unwrap_or("Edited");
    if t == "Added" {
        return "new job".into();
    }
    walk(diff, "", &mut counts);
    if counts.is_empty() {
        return t.to_lowercase();
    }
    let mut parts: Vec<String> = counts.into_keys().collect();
    if parts.len() > 8 {
        let more = parts.len() - 8;
        parts.truncate(8);
        parts.push(format!("and {more} more"));
    }
    parts.join(", ")
}

/// `value` as an HCL quoted string: its escapes (`\\`, `\"`, `\n`, `\r`,
/// `\t`, `\uNNNN` for other control characters) and template sequences
/// doubled (`$${`, `%%{`), so Nomad reads back exactly `value`
/// (hashicorp/hcl hclsyntax/spec.md, "Template Literals" and escapes).
fn hcl_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '$' | '%' if chars.peek() == Some(&'{') => {
                out.push(c);
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_becomes_an_hcl_string_nomad_reads_back_as_it_was() {
        assert_eq!(hcl_string("nginx:1.27"), r#""nginx:1.27""#);
        assert_eq!(
            hcl_string("a \"b\" \\ c\nd ${e} %{f} $g\u{1}"),
            r#""a \"b\" \\ c\nd $${e} %%{f} $g\u0001""#
        );
    }

    #[test]
    fn env_templates_and_secret_names_are_redacted() {
        let diff = json!({
            "Type": "Edited",
            "TaskGroups": [{ "Name": "web", "Type": "Edited", "Fields": [], "Tasks": [{
                "Name": "server", "Type": "Edited",
                "Fields": [
                    { "Type": "Edited", "Name": "Env[DB_URL]", "Old": "postgres://u:pw@db", "New": "postgres://u:pw2@db" },
                    { "Type": "Edited", "Name": "Meta[api_key]", "Old": "k1", "New": "k2" },
                    { "Type": "Edited", "Name": "Driver", "Old": "docker", "New": "exec" }
                ],
                "Objects": [{ "Name": "Template", "Type": "Edited", "Fields": [
                    { "Type": "Edited", "Name": "EmbeddedTmpl", "Old": "a", "New": "b" }
                ]}, { "Name": "Config", "Type": "Edited", "Fields": [
                    { "Type": "Edited", "Name": "image", "Old": "nginx:1", "New": "nginx:2" },
                    { "Type": "None", "Name": "args[1]", "Old": "s3cr3t-arg", "New": "s3cr3t-arg" },
                    { "Type": "Added", "Name": "auth_token", "Old": "", "New": "tok-123" }
                ]}]
            }]}]
        });
        let r = redact_diff(&diff, &crate::redact::Redactor::new().with("nginx:2"));
        let text = r.to_string();
        for secret in [
            "pw@db",
            "pw2",
            "k1",
            "k2",
            "\"a\"",
            "\"b\"",
            "tok-123",
            "nginx:2",
            "s3cr3t-arg",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("docker") && text.contains("nginx:1"),
            "{text}"
        );
        // An empty Old (an added field) stays empty.
        assert!(text.contains(r#""Old":"""#), "{text}");
        assert_eq!(
            diff_summary(&diff),
            "group web: task server: Config: auth_token added, group web: task server: Config: image edited, group web: task server: Driver edited, group web: task server: Env[DB_URL] edited, group web: task server: Meta[api_key] edited, group web: task server: Template: EmbeddedTmpl edited"
        );
    }

    #[test]
    fn promotion_wait_is_a_bounded_duration_named_in_its_error() {
        assert_eq!(
            super::parse_promotion_wait("90m"),
            Ok(Duration::from_secs(5400))
        );
        for bad in ["10ms", "8d", "soon"] {
            let e = super::parse_promotion_wait(bad).expect_err(bad);
            assert!(e.contains("`promotion_wait`") && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn policies_parse() {
        assert_eq!(Policy::parse("auto"), Some(Policy::Auto));
        assert_eq!(Policy::parse("approval"), Some(Policy::Approval));
        assert_eq!(Policy::parse("none"), Some(Policy::None));
        assert_eq!(Policy::parse("Auto"), None);
    }

    #[test]
    fn live_counts_are_kept_only_for_enabled_scaling_groups() {
        let job = json!({ "TaskGroups": [
            { "Name": "a", "Count": 2, "Scaling": { "Enabled": true } },
            { "Name": "b", "Count": 2, "Scaling": { "Enabled": false } },
            { "Name": "c", "Count": 2, "Scaling": null }
        ]});
        let live = json!({ "TaskGroups": [
            { "Name": "a", "Count": 7 }, { "Name": "b", "Count": 7 }, { "Name": "c", "Count": 7 }
        ]});
        let spec = Nomad::with_live_counts(&job, Some(&live));
        let counts: Vec<i64> = spec["TaskGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["Count"].as_i64())
            .collect();
        assert_eq!(counts, [7, 2, 2]);
    }
}
