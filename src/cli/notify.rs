//! `driftless notify test|pending` and the outbox a one-shot command
//! delivers: the notifications and forge calls its runs queued.

use super::*;

/// The outbox's sender for this configuration's notifiers and forges.
pub(super) fn sender(app: &App) -> Result<crate::notify::outbox::Sender, crate::notify::SendError> {
    crate::notify::outbox::Sender::new(
        &app.settings().notifiers,
        &app.settings().forges,
        app.store.clone(),
    )
}

/// A one-shot tick has no sender running beside it: deliver what its runs
/// put in the outbox now (bounded), leaving failures for the next attempt.
pub(super) async fn deliver_notifications(app: &App) {
    let sender = match sender(app) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "notifications cannot be sent");
            return;
        }
    };
    match tokio::time::timeout(std::time::Duration::from_secs(60), sender.deliver_due()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "cannot read the notification outbox"),
        Err(_) => tracing::warn!(
            "notifications still pending after 60s; the next tick or the daemon retries them"
        ),
    }
}

/// `driftless notify test <notifier>`: send a test event now.
pub async fn notify_test(app: &App, notifier: &str) -> Result<Report, TickError> {
    let sender = match sender(app) {
        Ok(s) => s,
        Err(e) => {
            return Ok(Report {
                stdout: format!("{notifier}: {e}\n"),
                code: EXIT_FAILED,
            });
        }
    };
    let settings = app.settings();
    let target = settings
        .targets
        .iter()
        .find(|t| t.notify.iter().any(|n| n == notifier))
        .or(settings.targets.first());
    let doc = crate::notify::EventDoc {
        id: format!("test-{:016x}", fastrand::u64(..)),
        event: crate::notify::Event::Test,
        target: target
            .map(|t| t.name.clone())
            .unwrap_or_else(|| "test".into()),
        backend: target
            .map(|t| t.backend.kind().to_string())
            .unwrap_or_default(),
        sha: None,
        short_sha: None,
        commit_url: None,
        trigger: "cli".into(),
        delivery_id: None,
        started_at: format_ms(crate::store::now_ms()),
        duration_ms: 0,
        message: "This is a test notification from `driftless notify test`.".into(),
        consecutive_failures: 0,
        failing_for_ms: None,
        run_id: None,
        run_url: None,
    };
    Ok(match sender.send_now(notifier, &doc).await {
        Ok(()) => Report {
            stdout: format!("{notifier}: sent\n"),
            code: 0,
        },
        Err(e) => Report {
            stdout: format!("{notifier}: failed: {e}\n"),
            code: EXIT_FAILED,
        },
    })
}

/// `driftless notify pending [--all]`
pub async fn notify_pending(app: &App, all: bool) -> Result<Report, TickError> {
    let rows = crate::notify::outbox::list(&app.store, all).await?;
    let mut out = format!(
        "{:<6} {:<14} {:<20} {:<14} {:<9} {:>3}  {}\n",
        "ID", "NOTIFIER", "TARGET", "EVENT", "STATE", "TRY", "NEXT / LAST ERROR"
    );
    for n in &rows {
        out.push_str(&crate::notify::outbox::describe(n));
        out.push('\n');
    }
    if rows.is_empty() {
        out = "no notifications pending\n".into();
    }
    let statuses = app.store.unsent_statuses(all).await?;
    if !statuses.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<6} {:<10} {:<20} {:<12} {:<28} {:<8} {:>3}  LAST ERROR",
            "STATUS", "FORGE", "REPO", "COMMIT", "CONTEXT", "STATE", "TRY"
        );
        for r in &statuses {
            let state = format!("{:?}", r.state).to_lowercase();
            let _ = writeln!(
                out,
                "{:<6} {:<10} {:<20} {:<12} {:<28} {:<8} {:>3}  {}",
                r.id,
                r.forge,
                r.repo,
                crate::model::short_sha(&r.sha),
                r.context,
                if r.given_up {
                    "given up"
                } else {
                    state.as_str()
                },
                r.attempts,
                r.last_error.as_deref().unwrap_or("-")
            );
        }
    }
    let now = crate::store::now_ms();
    let limits: Vec<_> = app
        .store
        .limits()
        .await?
        .into_iter()
        .filter(|l| all || l.paused_until > now)
        .collect();
    if !limits.is_empty() {
        let _ = writeln!(
            out,
            "\nRATE-LIMITED DESTINATION          UNTIL                 WHY"
        );
        for l in &limits {
            let _ = writeln!(
                out,
                "{:<33} {:<21} {}",
                l.label,
                if l.paused_until > now {
                    crate::store::format_ms(l.paused_until)
                } else {
                    "over".to_string()
                },
                l.reason
            );
        }
    }
    let comments = app.store.unsent_comments(all).await?;
    if !comments.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<6} {:<10} {:<20} {:<8} {:<12} {:>3}  LAST ERROR",
            "PR", "FORGE", "REPO", "NUMBER", "HEAD", "TRY"
        );
        for r in &comments {
            let _ = writeln!(
                out,
                "{:<6} {:<10} {:<20} {:<8} {:<12} {:>3}  {}",
                r.id,
                r.forge,
                r.repo,
                format!("#{}", r.number),
                crate::model::short_sha(&r.head_sha),
                r.attempts,
                if r.given_up {
                    format!("given up: {}", r.last_error.as_deref().unwrap_or("-"))
                } else {
                    r.last_error.as_deref().unwrap_or("-").to_string()
                }
            );
        }
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}
