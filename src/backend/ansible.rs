//! The `ansible` backend: `ansible-playbook`, with "no change" built from a
//! digest (ansible has no engine-level diff).
//!
//! In `digest` mode (the default) a run is skipped when the digest of the
//! target's files, the inventory, the vars files and the settings equals the
//! one stored at the last success; `check_drift = true` then runs `--check`
//! and applies only if it reports changes. The result comes from the PLAY
//! RECAP: any host failed or unreachable → `failed`, naming host and task;
//! any host changed → `changed`.
//!
//! It can plan: `--check` (never `--diff`, which prints file contents and
//! so values), one line per task that would change a host (`~ host: task`,
//! loop items counted, never shown), hashed with the inputs' digest.
//! Ansible cannot say whether a change deletes something, so every planned
//! change counts as destructive (under `approve_destructive` it waits). An
//! approved plan is checked again right before the real run and applied
//! only if the check finds the same changes. This module knows nothing
//! about git, triggers or the queue.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::tool;
use super::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use crate::process::{self, Spec};
use crate::secret::SecretRef;

/// Where the last recap is kept for `outputs` (ignored by nothing, tracked by
/// nothing: it lives in the checkout beside the playbook).
pub(super) const RECAP_FILE: &str = ".driftless-ansible-recap.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
/// When the playbook runs: `digest` (when the target's files changed) or
/// `always` (every tick).
pub enum Mode {
    #[default]
    Digest,
    Always,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "ansible"`: an Ansible playbook (ansible-core).
pub struct Config {
    /// The playbook, relative to the target's path.
    pub playbook: String,
    /// `-i`: an inventory file (relative to the target's path) or a host list.
    pub inventory: Option<String>,
    /// `--limit`: the hosts (a pattern) the playbook runs on.
    pub limit: Option<String>,
    /// `--tags`: only the tasks with these tags.
    #[serde(default)]
    pub tags: Vec<String>,
    /// `-e @file` for each, relative to the target's path.
    #[serde(default)]
    pub extra_vars_files: Vec<String>,
    /// The vault password: a file path or `env:NAME`.
    pub vault_password_file: Option<String>,
    /// `digest` (default): run when the target's files changed; `always`:
    /// every tick.
    #[serde(default)]
    pub mode: Mode,
    /// On an unchanged digest, run `--check` and apply only if it reports
    /// changes (drift). Default: false.
    #[serde(default)]
    pub check_drift: bool,
    /// The playbook `driftless destroy` runs; without one, destroy fails.
    pub destroy_playbook: Option<String>,
    /// `ansible-playbook` or a path to it. Default: ansible-playbook.
    #[serde(default = "default_binary")]
    pub binary: String,
    /// Extra environment (`ANSIBLE_*`, …); `env:NAME` values are masked.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

fn default_binary() -> String {
    "ansible-playbook".into()
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        for (key, f) in std::iter::once(("playbook", &self.playbook))
            .chain(
                self.destroy_playbook
                    .iter()
                    .map(|f| ("destroy_playbook", f)),
            )
            .chain(
                self.extra_vars_files
                    .iter()
                    .map(|f| ("extra_vars_files", f)),
            )
        {
            if f.trim().is_empty() || f.split('/').any(|c| c == "..") {
                p.push((
                    key.to_string(),
                    format!("`{key}` entry `{f}` must be a path inside the target's path"),
                ));
            }
        }
        p
    }

    fn repo_files(&self) -> Vec<(String, String)> {
        let mut v = vec![("playbook".to_string(), self.playbook.clone())];
        v.extend(
            self.inventory
                .iter()
                .map(|f| ("inventory".to_string(), f.clone())),
        );
        v.extend(super::keyed("extra_vars_files", &self.extra_vars_files));
        v.extend(
            self.destroy_playbook
                .iter()
                .map(|f| ("destroy_playbook".to_string(), f.clone())),
        );
        v.push(("(driftless's recap file)".into(), RECAP_FILE.into()));
        v
    }

    fn check_environment(&self) -> Vec<(String, String)> {
        super::binary_on_path(&self.binary)
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
        Ok(Box::new(Ansible::new(self.clone(), ctx)?))
    }

    fn can_plan(&self) -> bool {
        true
    }
}

/// One host's line of the PLAY RECAP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostStats {
    pub ok: u64,
    pub changed: u64,
    pub unreachable: u64,
    pub failed: u64,
    pub skipped: u64,
    pub rescued: u64,
    pub ignored: u64,
}

/// What one run printed that matters.
#[derive(Debug, Default, PartialEq, Eq)]
struct Report {
    recap: BTreeMap<String, HostStats>,
    /// (host, task, message) for every failed or unreachable task.
    failures: Vec<(String, String, String)>,
    /// (host, task) for every `changed:` line, in order (a loop's items
    /// each give one).
    changes: Vec<(String, String)>,
}

impl Report {
    fn parse(stdout: &str) -> Report {
        let mut r = Report::default();
        let mut task = String::new();
        let mut in_recap = false;
        for line in stdout.lines() {
            if let Some(rest) = line.strip_prefix("TASK [") {
                task = rest.split(']').next().unwrap_or("").to_string();
            } else if let Some(rest) = line.strip_prefix("changed: [") {
                let host = rest.split(']').next().unwrap_or("").to_string();
                r.changes.push((host, task.clone()));
            } else if line.starts_with("PLAY RECAP") {
                in_recap = true;
            } else if let Some(rest) = line
                .strip_prefix("fatal: [")
                .or_else(|| line.strip_prefix("failed: ["))
            {
                let host = rest.split(']').next().unwrap_or("").to_string();
                let msg = rest
                    .split_once("=> ")
                    .and_then(|(_, json)| serde_json::from_str::<serde_json::Value>(json).ok())
                    .and_then(|v| {
                        v["msg"].as_str().map(|m| {
                            let stderr = v["stderr"].as_str().unwrap_or("").trim();
                            if stderr.is_empty() {
                                m.to_string()
                            } else {
                                format!("{m}: {stderr}")
                            }
                        })
                    })
                    .unwrap_or_default();
                r.failures.push((host, task.clone(), msg));
            } else if in_recap && let Some((host, counts)) = line.split_once(" : ") {
                let mut s = HostStats::default();
                for kv in counts.split_whitespace() {
                    if let Some((k, v)) = kv.split_once('=') {
                        let v = v.parse().unwrap_or(0);
                        match k {
                            "ok" => s.ok = v,
                            "changed" => s.changed = v,
                            "unreachable" => s.unreachable = v,
                            "failed" => s.failed = v,
                            "skipped" => s.skipped = v,
                            "rescued" => s.rescued = v,
                            "ignored" => s.ignored = v,
                            _ => {}
                        }
                    }
                }
                r.recap.insert(host.trim().to_string(), s);
            }
        }
        r
    }
}

pub struct Ansible {
    cfg: Config,
    ctx: Context,
    /// The `env` table, resolved at build.
    env: std::collections::BTreeMap<String, String>,
    /// A vault password given as `env:NAME`, read at construction.
    vault_from_env: Option<String>,
}

impl Ansible {
    pub fn new(cfg: Config, mut ctx: Context) -> Result<Self, BackendError> {
        let env = tool::env(&cfg.env, &mut ctx)?;
        let vault_from_env = match cfg
            .vault_password_file
            .as_deref()
            .map(|v| SecretRef::parse(v, &ctx.workdir))
        {
            Some(r @ SecretRef::Env(_)) => {
                let pw = r.load().map_err(|e| BackendError::Config(e.to_string()))?;
                ctx.redactor.add(pw.clone());
                Some(pw)
            }
            _ => None,
        };
        Ok(Ansible {
            env,
            cfg,
            ctx,
            vault_from_env,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.ctx.workdir.join(rel)
    }

    /// Everything the run depends on.
    fn digest(&self) -> String {
        let mut h = Sha256::new();
        h.update(b"driftless-ansible-v1\0");
        h.update(self.ctx.source_digest.as_bytes());
        let settings = format!(
            "{:?}|{:?}|{:?}|{:?}|{:?}|{:?}|{:?}",
            self.cfg.playbook,
            self.cfg.inventory,
            self.cfg.limit,
            self.cfg.tags,
            self.cfg.extra_vars_files,
            self.cfg.env,
            self.cfg.binary
        );
        h.update(settings.as_bytes());
        // Files outside the target's path (absolute inventory, vars) count too.
        let files = self.cfg.inventory.iter().chain(&self.cfg.extra_vars_files);
        for f in files {
            if let Ok(bytes) = std::fs::read(self.path(f)) {
                h.update(b"\0file\0");
                h.update(f.as_bytes());
                h.update(&bytes);
            }
        }
        hex::encode(h.finalize())
    }

    fn argv(&self, playbook: &str, check: bool, vault: Option<&Path>) -> Vec<String> {
        let mut a = vec![self.cfg.binary.clone()];
        if let Some(i) = &self.cfg.inventory {
            a.push("-i".into());
            a.push(i.clone());
        }
        if let Some(l) = &self.cfg.limit {
            a.push("--limit".into());
            a.push(l.clone());
        }
        if !self.cfg.tags.is_empty() {
            a.push("--tags".into());
            a.push(self.cfg.tags.join(","));
        }
        for f in &self.cfg.extra_vars_files {
            a.push("-e".into());
            a.push(format!("@{f}"));
        }
        if let Some(v) = vault {
            a.push("--vault-password-file".into());
            a.push(v.display().to_string());
        }
        if check {
            a.push("--check".into());
        }
        a.push(playbook.to_string());
        a
    }

    /// Run a playbook and read its recap.
    async fn run(&self, playbook: &str, check: bool, deadline: Instant) -> (Status, Report) {
        // A vault password from env: is written to a private temp file for
        // the run; a file path is passed as is.
        let mut _vault_tmp = None;
        let vault = match (&self.vault_from_env, &self.cfg.vault_password_file) {
            (Some(pw), _) => match tempfile_lite::TempFile::new(pw) {
                Ok(t) => {
                    let p = t.path().to_path_buf();
                    _vault_tmp = Some(t);
                    Some(p)
                }
                Err(e) => {
                    return (
                        Status::failed(format!("cannot write the vault password file: {e}")),
                        Report::default(),
                    );
                }
            },
            (None, Some(raw)) => match SecretRef::parse(raw, &self.ctx.workdir) {
                SecretRef::File { path, .. } => Some(path),
                SecretRef::Env(_) => None,
            },
            (None, None) => None,
        };
        let mut env = self.env.clone();
        for (k, v) in [
            ("ANSIBLE_NOCOLOR", "1"),
            ("ANSIBLE_FORCE_COLOR", "0"),
            ("ANSIBLE_RETRY_FILES_ENABLED", "0"),
            ("ANSIBLE_STDOUT_CALLBACK", "default"),
            ("ANSIBLE_LOAD_CALLBACK_PLUGINS", "0"),
        ] {
            env.entry(k.into()).or_insert_with(|| v.into());
        }
        let mut spec = Spec::new(
            self.argv(playbook, check, vault.as_deref()),
            &self.ctx.workdir,
        );
        spec.env = env;
        spec.deadline = Some(deadline);
        spec.shown = true;
        let out = match tool::run(&spec, &self.ctx.redactor).await {
            Ok(o) => o,
            Err(e) => return (Status::failed(e), Report::default()),
        };
        let report = Report::parse(&out.stdout);
        let failed_hosts: Vec<&String> = report
            .recap
            .iter()
            .filter(|(_, s)| s.failed > 0 || s.unreachable > 0)
            .map(|(h, _)| h)
            .collect();
        let changed_hosts: Vec<&String> = report
            .recap
            .iter()
            .filter(|(_, s)| s.changed > 0)
            .map(|(h, _)| h)
            .collect();
        let (result, message) = if out.timed_out {
            (
                ApplyResult::Failed,
                process::describe_exit(&spec, &out, Some(self.ctx.timeout)),
            )
        } else if !failed_hosts.is_empty() || !out.success() {
            let detail: Vec<String> = report
                .failures
                .iter()
                .map(|(h, t, m)| format!("host {h}, task `{t}`: {m}"))
                .collect();
            let msg = if !detail.is_empty() {
                detail.join("; ")
            } else if !failed_hosts.is_empty() {
                format!("failed or unreachable: {}", join(&failed_hosts))
            } else {
                let why = out.stderr_summary(1);
                format!("{}: {why}", process::describe_exit(&spec, &out, None))
            };
            (ApplyResult::Failed, msg)
        } else if !changed_hosts.is_empty() {
            (
                ApplyResult::Changed,
                format!("changed on {}", join(&changed_hosts)),
            )
        } else {
            (
                ApplyResult::NoChange,
                format!(
                    "no change on {}",
                    join(&report.recap.keys().collect::<Vec<_>>())
                ),
            )
        };
        (
            Status {
                result,
                message: self.ctx.redactor.redact(&message),
                output_tail: out.tail,
                digest: None,
            },
            report,
        )
    }

    /// `--check`: what the playbook would change, by host and task.
    async fn plan(&self) -> Result<Plan, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let (status, report) = self.run(&self.cfg.playbook, true, deadline).await;
        if status.result == ApplyResult::Failed {
            return Err(format!("--check failed: {}", status.message));
        }
        // One line per (host, task), in the order ansible ran them.
        let mut grouped: Vec<((String, String), usize)> = Vec::new();
        for c in report.changes {
            match grouped.iter_mut().find(|(k, _)| *k == c) {
                Some((_, n)) => *n += 1,
                None => grouped.push((c, 1)),
            }
        }
        let lines: Vec<String> = grouped
            .iter()
            .map(|((host, task), n)| match n {
                1 => format!("~ {host}: {task}"),
                n => format!("~ {host}: {task} ({n} items)"),
            })
            .collect();
        let diff = self.ctx.redactor.redact(&lines.join("\n"));
        let hosts: std::collections::BTreeSet<&String> =
            grouped.iter().map(|((h, _), _)| h).collect();
        let mut h = Sha256::new();
        h.update(b"driftless-ansible-plan-v1\0");
        h.update(self.digest().as_bytes());
        h.update(b"\0");
        h.update(diff.as_bytes());
        Ok(Plan {
            changes: !lines.is_empty(),
            summary: format!(
                "{} task(s) would change {} host(s)",
                lines.len(),
                hosts.len()
            ),
            diff,
            // Ansible cannot tell a deletion from any other change.
            destructive: !lines.is_empty(),
            hash: hex::encode(h.finalize()),
            ..Plan::default()
        })
    }

    /// The real run (no digest check), its recap kept.
    async fn run_for_real(&self) -> Status {
        let deadline = Instant::now() + self.ctx.timeout;
        let (mut status, report) = self.run(&self.cfg.playbook, false, deadline).await;
        self.save_recap(&report);
        if status.result != ApplyResult::Failed {
            status.digest = Some(self.digest());
        }
        status
    }

    fn save_recap(&self, report: &Report) {
        if let Ok(json) = serde_json::to_string(&report.recap) {
            let _ = std::fs::write(self.path(RECAP_FILE), json);
        }
    }
}

fn join(hosts: &[&String]) -> String {
    hosts
        .iter()
        .map(|h| h.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A file readable only by us, removed on drop (for a vault password).
mod tempfile_lite {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::{Path, PathBuf};

    pub struct TempFile(PathBuf);

    impl TempFile {
        pub fn new(content: &str) -> std::io::Result<TempFile> {
            let path =
                std::env::temp_dir().join(format!("driftless-vault-{:016x}", fastrand::u64(..)));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            f.write_all(content.as_bytes())?;
            Ok(TempFile(path))
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

impl Backend for Ansible {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            let deadline = Instant::now() + self.ctx.timeout;
            let digest = self.digest();
            let unchanged = tool::unchanged(&self.ctx, &digest);
            if self.cfg.mode == Mode::Digest
                && let Some(same) = unchanged
            {
                if !self.cfg.check_drift {
                    return same;
                }
                let (check, report) = self.run(&self.cfg.playbook, true, deadline).await;
                match check.result {
                    ApplyResult::NoChange => {
                        self.save_recap(&report);
                        return Status {
                            digest: Some(digest),
                            message: format!(
                                "inputs unchanged and --check reports no drift ({})",
                                check.message
                            ),
                            ..check
                        };
                    }
                    ApplyResult::Changed => {} // drift: apply for real
                    _ => return check,
                }
            }
            let (mut status, report) = self.run(&self.cfg.playbook, false, deadline).await;
            self.save_recap(&report);
            if status.result != ApplyResult::Failed {
                status.digest = Some(digest);
            }
            status
        })
    }

    fn unchanged(&self) -> Option<Status> {
        if self.cfg.mode != Mode::Digest || self.cfg.check_drift {
            return None;
        }
        tool::unchanged(&self.ctx, &self.digest())
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        Some(Box::pin(Ansible::plan(self)))
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        Some(Box::pin(async move {
            let replanned = Ansible::plan(self).await;
            super::apply_if_unchanged(plan, replanned, self.run_for_real()).await
        }))
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            match &self.cfg.destroy_playbook {
                None => {
                    Status::failed("this ansible target has no `destroy_playbook`; nothing was run")
                }
                Some(p) => {
                    self.run(p, false, Instant::now() + self.ctx.timeout)
                        .await
                        .0
                }
            }
        })
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            let text = match std::fs::read_to_string(self.path(RECAP_FILE)) {
                Ok(t) => t,
                Err(_) => return Ok(Outputs::new()),
            };
            match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(serde_json::Value::Object(m)) => Ok(m),
                _ => Err(BackendError::Command(format!(
                    "{RECAP_FILE} is not a JSON object"
                ))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_recap_and_failures() {
        let out = "\
TASK [write the file] **********
changed: [web1]
TASK [maybe fail] **************
fatal: [web2]: FAILED! => {\"changed\": true, \"msg\": \"non-zero return code\", \"stderr\": \"disk full\"}
fatal: [db]: UNREACHABLE! => {\"changed\": false, \"msg\": \"ssh: connect refused\", \"unreachable\": true}

PLAY RECAP *********************
web1                       : ok=2    changed=1    unreachable=0    failed=0    skipped=0    rescued=0    ignored=0
web2                       : ok=1    changed=0    unreachable=0    failed=1    skipped=0    rescued=0    ignored=0
db                         : ok=0    changed=0    unreachable=1    failed=0    skipped=0    rescued=0    ignored=0
";
        let r = Report::parse(out);
        assert_eq!(r.changes, vec![("web1".into(), "write the file".into())]);
        assert_eq!(r.recap["web1"].changed, 1);
        assert_eq!(r.recap["web2"].failed, 1);
        assert_eq!(r.recap["db"].unreachable, 1);
        assert_eq!(
            r.failures,
            vec![
                (
                    "web2".into(),
                    "maybe fail".into(),
                    "non-zero return code: disk full".into()
                ),
                (
                    "db".into(),
                    "maybe fail".into(),
                    "ssh: connect refused".into()
                ),
            ]
        );
    }
}
