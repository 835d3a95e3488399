//! The command-line commands, as library functions the binary calls.
//!
//! Each returns what to print and the exit code; `main.rs` only parses
//! arguments and sets up logging. Reads go straight to the state database, so
//! `status` and `history` work whether or not the daemon runs.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::json;

use crate::backend::ApplyResult;
use crate::config;
use crate::store::{Operation, format_ms};
use crate::tick::{Engine, Outcome, TickError};

/// `tick` exit code when a target's lock is held elsewhere (EX_TEMPFAIL).
pub const EXIT_BUSY: u8 = 75;
/// Exit code for failures (a failed run, a bad config).
pub const EXIT_FAILED: u8 = 1;

/// What a command produced.
pub struct Report {
    pub stdout: String,
    pub code: u8,
}

fn short(sha: &Option<String>) -> String {
    sha.as_deref()
        .map(|s| s[..s.len().min(12)].to_string())
        .unwrap_or_else(|| "-".into())
}

/// `driftless tick <target>... | --all`
pub async fn tick(
    engine: &Engine,
    targets: &[String],
    all: bool,
    op: Operation,
) -> Result<Report, TickError> {
    let names: Vec<String> = if all {
        engine
            .settings
            .targets
            .iter()
            .map(|t| t.name.clone())
            .collect()
    } else {
        targets.to_vec()
    };
    for n in &names {
        engine.target(n)?;
    }
    let mut out = String::new();
    let (mut failed, mut busy) = (false, false);
    for name in &names {
        match engine.tick_now(name, op).await? {
            Outcome::Ran {
                run_id,
                result,
                sha,
                message,
            } => {
                failed |= result == ApplyResult::Failed;
                let _ = writeln!(
                    out,
                    "{name}: {} at {} (run {run_id}): {message}",
                    result.as_str(),
                    short(&sha)
                );
            }
            Outcome::Busy => {
                busy = true;
                let _ = writeln!(out, "{name}: busy: another tick holds the target's lock");
            }
        }
    }
    let code = if failed {
        EXIT_FAILED
    } else if busy {
        EXIT_BUSY
    } else {
        0
    };
    Ok(Report { stdout: out, code })
}

/// `driftless status [--json]`
pub async fn status(engine: &Engine, as_json: bool) -> Result<Report, TickError> {
    let states = engine.store.target_states().await?;
    let activity = engine.queue.activity().await?;
    let mut rows = Vec::new();
    for t in &engine.settings.targets {
        let s = states.iter().find(|s| s.name == t.name);
        let a = activity.iter().find(|a| a.target == t.name);
        rows.push(json!({
            "name": t.name,
            "backend": t.backend.kind(),
            "repo": engine.git_redacted_repo(&t.repo),
            "branch": t.branch,
            "path": t.path.to_string_lossy(),
            "last_applied_sha": s.and_then(|s| s.last_applied_sha.clone()),
            "last_result": s.and_then(|s| s.last_result.clone()),
            "last_message": s.and_then(|s| s.last_message.clone()),
            "last_run_id": s.and_then(|s| s.last_run_id),
            "last_run_at": s.and_then(|s| s.last_run_at).map(format_ms),
            "consecutive_failures": s.map(|s| s.consecutive_failures).unwrap_or(0),
            "queued": a.is_some_and(|a| a.queued > 0),
            "running": a.is_some_and(|a| a.running > 0),
        }));
    }
    if as_json {
        let text = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        return Ok(Report {
            stdout: text + "\n",
            code: 0,
        });
    }
    let mut out = format!(
        "{:<24} {:<10} {:<12} {:<10} {:<21} {}\n",
        "TARGET", "BACKEND", "APPLIED", "LAST", "LAST RUN", "STATE"
    );
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
        let state = match (r["running"].as_bool(), r["queued"].as_bool()) {
            (Some(true), _) => "running".to_string(),
            (_, Some(true)) => "queued".to_string(),
            _ => match r["consecutive_failures"].as_i64() {
                Some(n) if n > 0 => format!("failing ×{n}"),
                _ => "idle".to_string(),
            },
        };
        let applied = r["last_applied_sha"]
            .as_str()
            .map(|x| x[..x.len().min(12)].to_string())
            .unwrap_or_else(|| "-".into());
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:<12} {:<10} {:<21} {}",
            s("name"),
            s("backend"),
            applied,
            s("last_result"),
            s("last_run_at"),
            state
        );
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}

/// `driftless history <target> [--json] [--limit N]`
pub async fn history(
    engine: &Engine,
    target: &str,
    as_json: bool,
    limit: i64,
) -> Result<Report, TickError> {
    engine.target(target)?;
    let runs = engine.store.history(target, limit.clamp(1, 10_000)).await?;
    if as_json {
        let rows: Vec<_> = runs
            .iter()
            .map(|r| {
                json!({
                    "id": r.id,
                    "target": r.target,
                    "operation": r.operation,
                    "trigger": r.trigger,
                    "delivery_id": r.delivery_id,
                    "requested_sha": r.requested_sha,
                    "sha": r.sha,
                    "started_at": format_ms(r.started_at),
                    "finished_at": r.finished_at.map(format_ms),
                    "duration_ms": r.duration_ms,
                    "result": r.result,
                    "message": r.message,
                    "output_tail": r.output_tail,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into());
        return Ok(Report {
            stdout: text + "\n",
            code: 0,
        });
    }
    let mut out = format!(
        "{:<6} {:<21} {:<9} {:<16} {:<12} {:<11} {:>8}  {}\n",
        "RUN", "STARTED", "OP", "TRIGGER", "SHA", "RESULT", "MS", "MESSAGE"
    );
    for r in &runs {
        let _ = writeln!(
            out,
            "{:<6} {:<21} {:<9} {:<16} {:<12} {:<11} {:>8}  {}",
            r.id,
            format_ms(r.started_at),
            r.operation,
            r.trigger,
            short(&r.sha),
            r.result.as_deref().unwrap_or("running"),
            r.duration_ms
                .map(|d| d.to_string())
                .unwrap_or_else(|| "-".into()),
            r.message
                .as_deref()
                .unwrap_or("")
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}

/// `driftless outputs <target> [--json]`
pub async fn outputs(engine: &Engine, target: &str, as_json: bool) -> Result<Report, TickError> {
    let outs = engine.outputs(target).await?;
    let stdout = if as_json {
        serde_json::to_string_pretty(&outs).unwrap_or_else(|_| "{}".into()) + "\n"
    } else {
        let mut s = String::new();
        for (k, v) in &outs {
            let v = match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let _ = writeln!(s, "{k} = {v}");
        }
        s
    };
    Ok(Report { stdout, code: 0 })
}

/// `driftless check`: every problem, or a one-line summary.
pub fn check(path: &Path) -> Report {
    match config::check(path) {
        Ok(s) => Report {
            stdout: format!(
                "{}: ok ({} target(s), state in {})\n",
                path.display(),
                s.targets.len(),
                s.state_dir.display()
            ),
            code: 0,
        },
        Err(e) => Report {
            stdout: format!("{e}\n"),
            code: EXIT_FAILED,
        },
    }
}

impl Engine {
    /// The repo as shown to people: URL credentials masked.
    pub fn git_redacted_repo(&self, repo: &str) -> String {
        crate::redact::Redactor::new().redact(repo)
    }
}
