//! The command-line commands, as library functions the binary calls.
//!
//! Each returns what to print and the exit code; `main.rs` only parses
//! arguments and sets up logging. Reads go straight to the state database, so
//! `status` and `history` work whether or not the daemon runs.

use std::fmt::Write as _;
use std::path::Path;

use crate::app::App;
use crate::config;
use crate::model::Trigger;
use crate::store::{Operation, format_ms};
use crate::tick::{Planned, Reconciler, TickError, Ticked};

mod check;
mod deployments;
mod healthcheck;
mod logs;
mod notify;
mod policy;
mod rollout;

pub use check::{check, graph};
pub use deployments::{approve_or_reject, deployments, reconcile};
pub use healthcheck::healthcheck;
pub use logs::logs;
use notify::deliver_notifications;
pub use notify::{notify_pending, notify_test};
pub use policy::{policy_eval, policy_test};
pub use rollout::{rollout_decide, rollout_status};

/// `tick` exit code when a target's lock is held elsewhere (EX_TEMPFAIL).
pub const EXIT_BUSY: u8 = 75;
/// Exit code for failures (a failed run, a bad config).
pub const EXIT_FAILED: u8 = 1;

/// What a command produced.
pub struct Report {
    pub stdout: String,
    pub code: u8,
}

/// An error said, as a command's whole report.
fn failed(msg: String) -> Report {
    Report {
        stdout: format!("error: {msg}\n"),
        code: EXIT_FAILED,
    }
}

fn short(sha: &Option<String>) -> String {
    sha.as_deref()
        .map(|s| crate::model::short_sha(s).to_string())
        .unwrap_or_else(|| "-".into())
}

/// The configured target of this name, or the error naming it.
fn known(app: &App, name: &str) -> Result<crate::config::Target, TickError> {
    app.target(name)
        .ok_or_else(|| TickError::UnknownTarget(name.to_string()))
}

/// `target` is configured, or an orphaned set member, whose runs are
/// still there to read.
async fn readable(app: &App, target: &str) -> Result<(), TickError> {
    let orphan = app
        .store
        .set_members()
        .await?
        .iter()
        .any(|m| m.target == target);
    if !orphan {
        known(app, target)?;
    }
    Ok(())
}

/// `driftless tick <target>... | --all` (and `driftless retry <target>`:
/// the same one-shot tick, asked for with the `retry` trigger).
pub async fn tick(
    rec: &Reconciler,
    targets: &[String],
    all: bool,
    op: Operation,
    trigger: Trigger,
) -> Result<Report, TickError> {
    let app = rec.app();
    // `[[target_sets]]` members are what their branch holds now: a daemon
    // lists them by itself, a one-shot tick lists them first when it is
    // asked for every target or for one it does not know yet (and runs the
    // new ones itself: no job is queued for them).
    if op == Operation::Apply
        && !app.settings().target_sets.is_empty()
        && (all || targets.iter().any(|t| app.target(t).is_none()))
    {
        rec.refresh_sets(std::time::Instant::now(), false).await;
    }
    // Without a daemon, rollouts in waves move on when a one-shot tick
    // runs: before it (a new tip starts one, a wave through its pause
    // goes on) and after it (what it applied may end a wave).
    let rolls = op == Operation::Apply && !app.settings().rollout_units().is_empty();
    if rolls {
        rec.advance_rollouts().await;
    }
    let settings = app.settings();
    let mut names: Vec<String> = if all {
        settings.targets.iter().map(|t| t.name.clone()).collect()
    } else {
        targets.to_vec()
    };
    // Applied in dependency order (destroyed in the reverse): a target
    // after the targets it depends on.
    let order: Vec<&str> = config::graph::levels(&settings.targets)
        .into_iter()
        .flatten()
        .map(|t| t.name.as_str())
        .collect();
    names.sort_by_key(|n| {
        let at = order.iter().position(|o| o == n).unwrap_or(usize::MAX);
        match op {
            Operation::Apply => at,
            Operation::Destroy => usize::MAX - at,
        }
    });
    for n in &names {
        known(app, n)?;
    }
    let mut out = String::new();
    let (mut failed, mut busy) = (false, false);
    for name in &names {
        match rec.tick_now_as(name, op, trigger).await? {
            Ticked::Ran {
                run_id,
                result,
                sha,
                message,
            } => {
                failed |= result.is_failure();
                let _ = writeln!(
                    out,
                    "{name}: {} at {} (run {run_id}): {message}",
                    result.as_str(),
                    short(&sha)
                );
            }
            Ticked::Busy => {
                busy = true;
                let _ = writeln!(out, "{name}: busy: another tick holds the target's lock");
            }
            Ticked::Paused => {
                let _ = writeln!(
                    out,
                    "{name}: paused: skipped (resume it with `driftless resume {name}`)"
                );
            }
            Ticked::Unaffected { reason } => {
                let _ = writeln!(out, "{name}: unaffected: {reason}");
            }
            Ticked::Waiting { reason, .. } => {
                let _ = writeln!(
                    out,
                    "{name}: waiting: {reason}; nothing applied (`--override-window` applies now)"
                );
            }
        }
    }
    if rolls {
        rec.advance_rollouts().await;
    }
    deliver_notifications(app).await;
    prune_now_and_then(app).await;
    let code = if failed {
        EXIT_FAILED
    } else if busy {
        EXIT_BUSY
    } else {
        0
    };
    Ok(Report { stdout: out, code })
}

/// How often one-shot ticks prune the history (with no daemon, as under
/// systemd timers, nothing else does).
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// Prune the history older than `[history] keep` when the last prune is
/// more than [`PRUNE_EVERY`] ago (noted by the time of the file
/// `history.pruned` in the state directory: one `stat` for a tick that
/// does not prune). A failure is said, never the tick's.
async fn prune_now_and_then(app: &App) {
    let mark = app.settings().state_dir.join("history.pruned");
    let due = std::fs::metadata(&mark)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_none_or(|age| age >= PRUNE_EVERY);
    if !due {
        return;
    }
    match app.store.prune_history(app.settings().history.keep).await {
        Ok(pruned) => {
            if let Err(e) = std::fs::write(&mark, b"") {
                tracing::warn!(file = %mark.display(), error = %e, "cannot note the history's pruning");
            }
            if pruned != Default::default() {
                tracing::info!(
                    runs = pruned.runs,
                    jobs = pruned.jobs,
                    notifications = pruned.notifications,
                    statuses = pruned.statuses,
                    "pruned history older than [history] keep"
                );
            }
        }
        Err(e) => tracing::error!(error = %e, "cannot prune the history"),
    }
}

/// `driftless status [--json]`
pub async fn status(app: &App, as_json: bool) -> Result<Report, TickError> {
    let rows = crate::status::targets(app).await?;
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
        let state = if r.destroyed_at.is_some() {
            "destroyed (directory removed)".to_string()
        } else if r.orphaned_since.is_some() {
            format!(
                "orphaned (directory removed{})",
                r.orphaned_at_sha
                    .as_deref()
                    .map(|s| format!(" at {}", crate::model::short_sha(s)))
                    .unwrap_or_default()
            )
        } else if r.running {
            "running".to_string()
        } else if r.paused {
            format!("paused by {}", r.paused_by.as_deref().unwrap_or("?"))
        } else if let Some(w) = r.window.as_ref().filter(|w| w.waiting) {
            format!("queued, waiting for its window ({})", w.state)
        } else if r.queued && !r.waiting_on.is_empty() {
            format!("queued, waiting on {}", r.waiting_on.join(", "))
        } else if r.queued {
            "queued".to_string()
        } else if let Some(h) = &r.hold {
            h.clone()
        } else if r.last_result.as_deref() == Some("blocked") {
            format!("blocked ×{}", r.consecutive_failures)
        } else if r.consecutive_failures > 0 {
            format!("failing ×{}", r.consecutive_failures)
        } else {
            "idle".to_string()
        };
        let mut after = if r.depends_on.is_empty() {
            String::new()
        } else {
            format!(" (after {})", r.depends_on.join(", "))
        };
        if let Some(w) = r.window.as_ref().filter(|w| !w.waiting) {
            let _ = write!(after, " [window {}]", w.state);
        }
        let _ = writeln!(
            out,
            "{:<24} {:<10} {:<12} {:<10} {:<21} {state}{after}",
            r.name,
            r.backend,
            short(&r.last_applied_sha),
            r.last_result.as_deref().unwrap_or("-"),
            r.last_run_at.as_deref().unwrap_or("-"),
        );
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}

/// `driftless history <target> [--json] [--limit N]`
pub async fn history(
    app: &App,
    target: &str,
    as_json: bool,
    limit: i64,
) -> Result<Report, TickError> {
    readable(app, target).await?;
    let runs = app.store.history(target, limit.clamp(1, 10_000)).await?;
    if as_json {
        let rows: Vec<_> = runs.iter().map(crate::status::RunView::from).collect();
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
        // A streak of identical no_change runs is one row.
        let repeated = match (r.repeats, r.finished_at) {
            (n, Some(last)) if n > 1 => format!("({n} runs, the last at {}) ", format_ms(last)),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "{:<6} {:<21} {:<9} {:<16} {:<12} {:<11} {:>8}  {repeated}{}",
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

/// `driftless retry --accept-rewind <target>`: the tip its newest run
/// refused as a rewind may be applied (the retry that follows applies it).
pub async fn accept_rewind(app: &App, target: &str) -> Result<(), TickError> {
    known(app, target)?;
    let who = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    match crate::tick::accept_rewind(app, target, &who).await? {
        Ok(sha) => {
            eprintln!(
                "accepted: `{target}` may apply {sha}, which does not descend from the commit it last applied"
            );
            Ok(())
        }
        Err(why) => Err(TickError::Refused {
            target: target.to_string(),
            why,
        }),
    }
}

/// `driftless forget <target>`: start it clean (see `Reconciler::forget`).
pub async fn forget(rec: &Reconciler, target: &str) -> Result<Report, TickError> {
    let removed = rec.forget(target).await?;
    let mut stdout = format!(
        "{target}: forgotten: its next tick starts from a fresh checkout, as if it never applied
"
    );
    for p in removed {
        let _ = writeln!(stdout, "  removed {}", p.display());
    }
    Ok(Report { stdout, code: 0 })
}

/// `driftless pause|resume <target>`
pub async fn pause(
    app: &App,
    target: &str,
    job: Option<&str>,
    pause: bool,
) -> Result<Report, TickError> {
    known(app, target)?;
    let who = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    let by = pause.then_some(who.as_str());
    let (what, changed, paused_means) = match job {
        None => {
            let changed = app.store.set_paused(target, by).await?;
            if changed && !pause {
                // Apply what the branch got meanwhile (the daemon, or the
                // next `driftless tick`, runs it).
                app.queue.resumed(target).await?;
            }
            (
                target.to_string(),
                changed,
                "webhooks and intervals will not tick it; pushes wait in the queue",
            )
        }
        Some(j) => (
            format!("{target}/{j}"),
            app.store.set_unit_paused(target, j, by).await?,
            "it is still planned, never registered or approved",
        ),
    };
    let stdout = match (pause, changed) {
        (true, true) => format!("{what}: paused; {paused_means}\n"),
        (true, false) => format!("{what}: already paused\n"),
        (false, true) => format!("{what}: resumed\n"),
        (false, false) => format!("{what}: was not paused\n"),
    };
    Ok(Report { stdout, code: 0 })
}

/// `driftless token new NAME`
pub fn token_new(name: &str) -> Report {
    if !config::valid_name(name) {
        return Report {
            stdout: format!("`{name}` is not a usable token name (a-z, 0-9, '_', '.', '-')\n"),
            code: EXIT_FAILED,
        };
    }
    match crate::auth::new_token() {
        Ok((token, digest)) => Report {
            stdout: format!(
                "# The token (shown once; give it to the client, keep it secret):\n{token}\n\n\
                 # Add this to the configuration and adjust the scopes:\n\
                 [[tokens]]\nname = \"{name}\"\nsha256 = \"{digest}\"\nscopes = [\"read\"]\n"
            ),
            code: 0,
        },
        Err(e) => Report {
            stdout: format!("cannot get random bytes from the operating system: {e}\n"),
            code: EXIT_FAILED,
        },
    }
}

/// Exit code of `plan` when applying would change something.
pub const EXIT_CHANGES: u8 = 2;

/// `driftless plan <target>`: what applying the branch tip would change.
pub async fn plan(rec: &Reconciler, target: &str, as_json: bool) -> Result<Report, TickError> {
    known(rec.app(), target)?;
    let (commit, plan, document, policies) = match rec.plan_now(target).await? {
        Planned::Plan {
            commit,
            plan,
            document,
            policies,
        } => (commit, plan, document, policies),
        Planned::CannotPlan { backend } => {
            return Ok(failed(format!(
                "target `{target}` ({backend}) cannot plan: give it a `plan` command"
            )));
        }
        Planned::Busy => {
            return Ok(Report {
                stdout: format!("{target}: busy: another tick holds the target's lock\n"),
                code: EXIT_BUSY,
            });
        }
    };
    let code = if plan.changes { EXIT_CHANGES } else { 0 };
    let judged = policy::judged_lines(policies.as_ref());
    let stdout = if as_json {
        let v = serde_json::json!({
            "target": target,
            "commit": commit,
            "changes": plan.changes,
            "destructive": plan.destructive,
            "plan_hash": plan.hash,
            "summary": plan.summary,
            "diff": plan.diff,
            "document": document,
            "policies": policy::judged_json(policies.as_ref()),
        });
        format!("{v:#}\n")
    } else if plan.changes {
        format!(
            "{target} at {}: {}{}\n{}\nplan {}\n",
            commit.short(),
            plan.summary,
            if plan.destructive {
                " (destructive: deletes or replaces)"
            } else {
                ""
            },
            plan.diff,
            plan.hash
        ) + &judged
    } else {
        format!("{target} at {}: no changes\n", commit.short())
    };
    Ok(Report { stdout, code })
}

/// `driftless outputs <target> [--json]`
pub async fn outputs(rec: &Reconciler, target: &str, as_json: bool) -> Result<Report, TickError> {
    let outs = rec.outputs(target).await?;
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

/// `driftless events <target>`
pub async fn events(app: &App, target: &str, as_json: bool) -> Result<Report, TickError> {
    known(app, target)?;
    let rows = app.store.deployment_events(target).await?;
    if as_json {
        return Ok(Report {
            stdout: serde_json::to_string_pretty(&rows).unwrap_or_else(|_| "[]".into()) + "\n",
            code: 0,
        });
    }
    let mut out = format!(
        "{:<6} {:<21} {:<11} {:<22} {:<17} {:<17} {}\n",
        "EVENT", "AT", "DEPLOYMENT", "WHO", "FROM", "TO", "MESSAGE"
    );
    for r in &rows {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_string();
        let _ = writeln!(
            out,
            "{:<6} {:<21} {:<11} {:<22} {:<17} {:<17} {}",
            r["id"],
            s("at"),
            r["deployment"],
            s("actor"),
            s("from"),
            s("to"),
            s("message")
        );
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}

#[cfg(test)]
mod tests {
    /// What `driftless check` says of a CloudFormation target: fine with
    /// the feature, refused by name without it (run by tests/run.sh both
    /// ways).
    #[tokio::test]
    async fn check_of_a_cloudformation_target_depends_on_the_feature() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("driftless.toml");
        std::fs::write(
            &path,
            "state_dir = \"state\"\n[[targets]]\nname = \"stack\"\nrepo = \"https://git.example.net/o/r\"\n\
             [targets.backend]\nkind = \"cloudformation\"\nstack_name = \"site\"\ntemplate = \"t.json\"\n\
             region = \"us-east-1\"\n",
        )
        .expect("write");
        let report = super::check(&path).await;
        if cfg!(feature = "cloudformation") {
            assert_eq!(report.code, 0, "{}", report.stdout);
            assert!(
                report.stdout.contains("stack: cloudformation from"),
                "{}",
                report.stdout
            );
        } else {
            assert_eq!(report.code, 1, "{}", report.stdout);
            assert!(
                report.stdout.contains("targets[stack]")
                    && report
                        .stdout
                        .contains("built without the `cloudformation` feature"),
                "{}",
                report.stdout
            );
        }
    }
}
