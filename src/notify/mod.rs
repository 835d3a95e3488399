//! Notifications: who is told what, when, and the outbox that delivers it.
//!
//! [`notification_for`] turns a finished run and the target's failure history into at
//! most one event (`failed`, `still_failing`, `recovered`, `changed`); the
//! tick writes the event into the outbox in the same transaction as the run.
//! The [`outbox::Sender`] delivers pending notifications with retries and
//! exponential backoff, apart from any tick: a notifier that fails is a WARN
//! naming the notifier — never its URL, token or password — and never
//! changes a run's result or delays a tick. One file per kind of notifier.

mod config;
mod discord;
mod email;
pub mod fingerprint;
pub mod forge;
pub mod limit;
mod matrix;
mod ntfy;
pub mod outbox;
mod slack;
mod webhook;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::ApplyResult;
use crate::secret::SecretRef;

pub use config::{
    DiscordConfig, EmailConfig, MatrixConfig, NotifierConfig, NotifierKind, NtfyConfig,
    SlackConfig, Tls, WebhookConfig, WebhookUrl, notifiers_schema,
};

/// What happened, as far as the owners are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Failed,
    /// A target did not run: one it depends on has not converged.
    Blocked,
    /// Applied, but its health checks did not pass.
    Unhealthy,
    /// The last healthy commit was applied again after the tip was found
    /// unhealthy.
    RolledBack,
    StillFailing,
    Recovered,
    Changed,
    /// A Nomad deployment waits for a person's approval.
    PendingApproval,
    /// A `detect` target's plan found the real world differs from git (a
    /// new or a different difference).
    DriftDetected,
    /// A `detect` target's plan found no difference any more.
    DriftResolved,
    /// A plan that waited for approval will never be applied: a newer
    /// commit came first.
    Superseded,
    /// Sent by `driftless notify test`.
    Test,
}

impl Event {
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Failed => "failed",
            Event::Blocked => "blocked",
            Event::Unhealthy => "unhealthy",
            Event::RolledBack => "rolled_back",
            Event::StillFailing => "still_failing",
            Event::Recovered => "recovered",
            Event::Changed => "changed",
            Event::PendingApproval => "pending_approval",
            Event::DriftDetected => "drift_detected",
            Event::DriftResolved => "drift_resolved",
            Event::Superseded => "superseded",
            Event::Test => "test",
        }
    }

    fn parse(s: &str) -> Option<Event> {
        Some(match s {
            "failed" => Event::Failed,
            "blocked" => Event::Blocked,
            "unhealthy" => Event::Unhealthy,
            "rolled_back" => Event::RolledBack,
            "still_failing" => Event::StillFailing,
            "recovered" => Event::Recovered,
            "changed" => Event::Changed,
            "pending_approval" => Event::PendingApproval,
            "drift_detected" => Event::DriftDetected,
            "drift_resolved" => Event::DriftResolved,
            "superseded" => Event::Superseded,
            _ => return None,
        })
    }
}

/// The event document: sent as-is by the `webhook` notifier, rendered as text
/// by the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventDoc {
    /// The notification's id: the same on every retry.
    pub id: String,
    pub event: Event,
    pub target: String,
    pub backend: String,
    pub sha: Option<String>,
    pub short_sha: Option<String>,
    pub commit_url: Option<String>,
    pub trigger: String,
    pub delivery_id: Option<String>,
    /// RFC 3339.
    pub started_at: String,
    pub duration_ms: i64,
    /// Redacted, at most [`MESSAGE_MAX`] bytes.
    pub message: String,
    pub consecutive_failures: i64,
    /// For `recovered`, `still_failing` and a changed failure: how long
    /// the target has been failing.
    pub failing_for_ms: Option<i64>,
    pub run_id: Option<i64>,
    pub run_url: Option<String>,
}

/// Messages in notifications are cut to this many bytes.
pub const MESSAGE_MAX: usize = 4000;

/// `s` in at most `max` characters (Unicode scalar values, as the forges'
/// validations count them), the marker ` […]` included when it is cut.
pub fn bounded_chars(s: &str, max: usize) -> String {
    const MARK: &str = " […]";
    if s.chars().count() <= max {
        return s.to_string();
    }
    let keep = max.saturating_sub(MARK.chars().count());
    let mut out: String = s.chars().take(keep).collect();
    out.push_str(MARK);
    out
}

/// Cut `s` to at most `max` bytes at a char boundary, marking the cut.
pub fn bounded(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} […]", &s[..end])
}

impl EventDoc {
    /// One line for subjects and chat: `web: failed at 1a2b3c4d5e6f`.
    pub fn headline(&self) -> String {
        let at = self
            .short_sha
            .as_deref()
            .map(|s| format!(" at {s}"))
            .unwrap_or_default();
        match self.event {
            Event::Failed => format!("{}: failed{at}", self.target),
            Event::Blocked => format!(
                "{}: blocked{at} (a target it depends on has not converged)",
                self.target
            ),
            Event::Unhealthy => format!("{}: applied but unhealthy{at}", self.target),
            Event::RolledBack => format!(
                "{}: rolled back{at} (the last healthy commit; the tip was unhealthy)",
                self.target
            ),
            Event::StillFailing => match self.failing_for_ms {
                Some(ms) => format!(
                    "{}: still failing{at} ({} failures in a row, for {})",
                    self.target,
                    self.consecutive_failures,
                    humantime::format_duration(Duration::from_secs((ms / 1000).max(0) as u64))
                ),
                None => format!(
                    "{}: still failing{at} ({} failures in a row)",
                    self.target, self.consecutive_failures
                ),
            },
            Event::Recovered => match self.failing_for_ms {
                Some(ms) => format!(
                    "{}: recovered{at} after failing for {}",
                    self.target,
                    humantime::format_duration(Duration::from_secs((ms / 1000).max(0) as u64))
                ),
                None => format!("{}: recovered{at}", self.target),
            },
            Event::Changed => format!("{}: changed{at}", self.target),
            Event::PendingApproval => {
                format!("{}: a deployment waits for approval{at}", self.target)
            }
            Event::DriftDetected => format!("{}: drift detected{at}", self.target),
            Event::DriftResolved => format!("{}: drift resolved{at}", self.target),
            Event::Superseded => format!(
                "{}: a deployment that waited for approval was superseded{at}",
                self.target
            ),
            Event::Test => format!("{}: test notification", self.target),
        }
    }

    /// The plain-text body shared by email, Slack and Matrix.
    pub fn text(&self) -> String {
        let mut t = format!("driftless: {}\n\n", self.headline());
        if !self.message.is_empty() {
            t.push_str(&self.message);
            t.push_str("\n\n");
        }
        t.push_str(&format!("target: {} ({})\n", self.target, self.backend));
        if let Some(sha) = &self.sha {
            t.push_str(&format!("commit: {sha}\n"));
        }
        if let Some(u) = &self.commit_url {
            t.push_str(&format!("commit page: {u}\n"));
        }
        t.push_str(&format!("trigger: {}", self.trigger));
        if let Some(d) = &self.delivery_id {
            t.push_str(&format!(" (delivery {d})"));
        }
        t.push('\n');
        t.push_str(&format!(
            "started: {}, took {} ms\n",
            self.started_at, self.duration_ms
        ));
        if self.consecutive_failures > 0 {
            t.push_str(&format!(
                "consecutive failures: {}\n",
                self.consecutive_failures
            ));
        }
        if let Some(u) = &self.run_url {
            t.push_str(&format!("run: {u}\n"));
        }
        t
    }
}

/// What is remembered per target to decide the next notification.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailureState {
    pub consecutive_failures: i64,
    pub failing_since: Option<i64>,
    pub last_notified_at: Option<i64>,
    pub last_notified_message: Option<String>,
}

/// The outcome of [`notification_for`]: the event to send, if any, and the new state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub event: Option<Event>,
    pub state: FailureState,
    /// How long the target has been failing, for any but a first failure.
    pub failing_for_ms: Option<i64>,
}

/// Decide what a finished run means for the owners.
///
/// - first failure after a success (or ever): `failed`;
/// - another failure: nothing — unless the message changed (`failed` again;
///   timestamps, durations and ids aside, see [`fingerprint`]) or
///   `repeat_after` passed since the last notification (`still_failing`);
/// - first success after failures: `recovered`;
/// - a success that changed something: `changed` (only notifiers that opt in).
pub fn notification_for(
    prev: &FailureState,
    result: ApplyResult,
    message: &str,
    now_ms: i64,
    repeat_after: Duration,
) -> Decision {
    let failing = prev.consecutive_failures > 0;
    // A blocked, unhealthy or rolled-back run is a failure to converge,
    // told by its own name.
    let first = match result {
        ApplyResult::Blocked => Event::Blocked,
        ApplyResult::Unhealthy | ApplyResult::Held => Event::Unhealthy,
        ApplyResult::RolledBack => Event::RolledBack,
        _ => Event::Failed,
    };
    match (result, failing) {
        (r, false) if r.is_failure() => Decision {
            event: Some(first),
            state: FailureState {
                consecutive_failures: 1,
                failing_since: Some(now_ms),
                last_notified_at: Some(now_ms),
                last_notified_message: Some(message.to_string()),
            },
            failing_for_ms: None,
        },
        (r, true) if r.is_failure() => {
            let mut state = FailureState {
                consecutive_failures: prev.consecutive_failures + 1,
                failing_since: prev.failing_since.or(Some(now_ms)),
                ..prev.clone()
            };
            // A tick held at the healthy commit says what the rollback
            // before it said: only ever a reminder.
            let same = r == ApplyResult::Held
                || prev
                    .last_notified_message
                    .as_deref()
                    .is_some_and(|m| fingerprint::same_failure(m, message));
            let event = if !same {
                Some(first)
            } else if prev
                .last_notified_at
                .is_none_or(|t| now_ms - t >= repeat_after.as_millis() as i64)
            {
                Some(Event::StillFailing)
            } else {
                None
            };
            if event.is_some() {
                state.last_notified_at = Some(now_ms);
                state.last_notified_message = Some(message.to_string());
            }
            let failing_for_ms = state.failing_since.map(|s| now_ms - s);
            Decision {
                event,
                state,
                failing_for_ms,
            }
        }
        (_, true) => Decision {
            event: Some(Event::Recovered),
            state: FailureState::default(),
            failing_for_ms: prev.failing_since.map(|s| now_ms - s),
        },
        (ApplyResult::Changed, false) => Decision {
            event: Some(Event::Changed),
            state: FailureState::default(),
            failing_for_ms: None,
        },
        (_, false) => Decision {
            event: None,
            state: FailureState::default(),
            failing_for_ms: None,
        },
    }
}

impl NotifierConfig {
    /// The destination a rate limit is counted against: the service's host
    /// and the credential used there ([`limit::destination`]; the URL
    /// itself where it is the credential), and its name in words.
    pub fn destination(&self) -> Result<(String, String), SendError> {
        let (url, credential) = match &self.kind {
            NotifierKind::Email { config, .. } => (
                format!("smtp://{}:{}", config.host, config.port.unwrap_or(0)),
                config.username.clone().unwrap_or_default(),
            ),
            NotifierKind::Slack { url } | NotifierKind::Discord { url } => {
                let u = read_secret("url_file", url)?;
                (u.clone(), u)
            }
            NotifierKind::Matrix {
                config,
                access_token,
            } => (
                config.homeserver.clone(),
                read_secret("access_token_file", access_token)?,
            ),
            NotifierKind::Webhook { url, .. } => {
                let u = url.resolve()?;
                (u.clone(), u)
            }
            NotifierKind::Ntfy { url, token, .. } => {
                let u = url.resolve()?;
                let t = token
                    .as_ref()
                    .map(|t| read_secret("token_file", t))
                    .transpose()?;
                let credential = t.unwrap_or_else(|| u.clone());
                (u, credential)
            }
        };
        let key = limit::destination(&url, &credential);
        let host = key.split('/').next().unwrap_or("").to_string();
        Ok((key, format!("notifier `{}` ({host})", self.name)))
    }

    /// Deliver one event. The error never contains a secret.
    pub async fn send(&self, http: &reqwest::Client, doc: &EventDoc) -> Result<(), SendError> {
        match &self.kind {
            NotifierKind::Email { config, password } => {
                let password = password
                    .as_ref()
                    .map(|p| read_secret("password_file", p))
                    .transpose()?;
                email::send(config, password, doc).await
            }
            NotifierKind::Slack { url } => {
                slack::send(http, &read_secret("url_file", url)?, doc).await
            }
            NotifierKind::Matrix {
                config,
                access_token,
            } => {
                let token = read_secret("access_token_file", access_token)?;
                matrix::send(http, config, &token, doc).await
            }
            NotifierKind::Webhook {
                config,
                url,
                signing_secret,
            } => {
                let url = url.resolve()?;
                let signing = signing_secret
                    .as_ref()
                    .map(|s| read_secret("secret_file", s))
                    .transpose()?;
                webhook::send(http, &url, &config.headers, signing, doc).await
            }
            NotifierKind::Ntfy { config, url, token } => {
                let url = url.resolve()?;
                let token = token
                    .as_ref()
                    .map(|t| read_secret("token_file", t))
                    .transpose()?;
                let event = doc.event.as_str();
                let priority = config
                    .priority
                    .get(event)
                    .and_then(|p| ntfy::priority(p))
                    .unwrap_or_else(|| ntfy::default_priority(doc.event));
                let tags = config
                    .tags
                    .get(event)
                    .cloned()
                    .unwrap_or_else(|| vec!["driftless".to_string(), event.to_string()]);
                ntfy::send(http, &url, token.as_deref(), priority, &tags, doc).await
            }
            NotifierKind::Discord { url } => {
                discord::send(http, &read_secret("url_file", url)?, doc).await
            }
        }
    }
}

/// Read a notifier's secret `r` (its config key is `key`) for one send.
fn read_secret(key: &str, r: &SecretRef) -> Result<String, SendError> {
    r.load()
        .map_err(|e| SendError::new(format!("cannot read `{key}`: {}", e.reason)))
}

/// A failed delivery, safe to log: it names no URL, token or password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SendError {
    pub message: String,
    pub retry: Retry,
}

/// Whether sending the same thing again could succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The service or the way to it failed: try again after the backoff.
    Later,
    /// The service refused this request and would refuse it again (a
    /// validation error): retrying only repeats the refusal.
    Never,
    /// The service is rate-limiting this destination: nothing goes to it
    /// for the wait it named (none: [`limit::FIRST`], doubling), and the
    /// attempt does not count.
    Limited(Option<std::time::Duration>),
}

impl SendError {
    /// A failure worth retrying.
    pub fn new(message: impl Into<String>) -> SendError {
        SendError {
            message: message.into(),
            retry: Retry::Later,
        }
    }

    /// A refusal that the same request would get again.
    pub fn permanent(message: impl Into<String>) -> SendError {
        SendError {
            message: message.into(),
            retry: Retry::Never,
        }
    }

    /// A rate limit, with the wait the service named.
    pub fn limited(message: impl Into<String>, wait: Option<std::time::Duration>) -> SendError {
        SendError {
            message: message.into(),
            retry: Retry::Limited(wait),
        }
    }

    /// From an HTTP client error, without the URL (it may hold a secret).
    fn http(e: reqwest::Error) -> SendError {
        SendError::new(crate::error::chain(&e.without_url()))
    }

    /// An HTTP answer that was not a success.
    async fn status(resp: reqwest::Response) -> Result<(), SendError> {
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let headers = resp.headers().clone();
        let body = resp.text().await.unwrap_or_default();
        let message = format!("answered {status}: {}", bounded(body.trim(), 300));
        Err(match limit::of_answer(status.as_u16(), &headers, &body) {
            Some(wait) => SendError::limited(message, wait),
            None => SendError::new(message),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    /// An ntfy notifier names its bad keys: a URL that is not a topic, a
    /// priority for no event or of no level, tags for no event.
    #[test]
    fn ntfy_settings_are_checked() {
        let v = serde_json::json!({
            "name": "phone", "kind": "ntfy", "url": "https://ntfy.sh/",
            "priority": { "failed": "loud", "sometimes": "low" },
            "tags": { "never": ["x"] },
        });
        let errs = NotifierConfig::from_value(v, Path::new("/")).expect_err("problems");
        let keys: Vec<&str> = errs.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["url", "priority", "priority", "tags"], "{errs:?}");
        assert!(errs[1].1.contains("`loud` (for failed)"), "{errs:?}");
        let ok = serde_json::json!({
            "name": "phone", "kind": "ntfy", "url": "https://ntfy.sh/ops",
            "priority": { "failed": "urgent" },
        });
        assert!(NotifierConfig::from_value(ok, Path::new("/")).is_ok());
    }

    #[test]
    fn the_transitions() {
        let ok = FailureState::default();
        // success → fail: failed
        let d = notification_for(&ok, ApplyResult::Failed, "boom", 1_000, 6 * H);
        assert_eq!(d.event, Some(Event::Failed));
        // fail → fail, same message: nothing
        let d2 = notification_for(&d.state, ApplyResult::Failed, "boom", 2_000, 6 * H);
        assert_eq!(d2.event, None);
        assert_eq!(d2.state.consecutive_failures, 2);
        // fail → fail, new message: failed again
        let d3 = notification_for(&d2.state, ApplyResult::Failed, "bang", 3_000, 6 * H);
        assert_eq!(d3.event, Some(Event::Failed));
        // the same message after repeat_after: still_failing
        let later = 3_000 + (6 * H).as_millis() as i64;
        let d4 = notification_for(&d3.state, ApplyResult::Failed, "bang", later, 6 * H);
        assert_eq!(d4.event, Some(Event::StillFailing));
        let d5 = notification_for(&d4.state, ApplyResult::Failed, "bang", later + 1, 6 * H);
        assert_eq!(d5.event, None);
        // → success: recovered, with how long
        let d6 = notification_for(&d5.state, ApplyResult::NoChange, "", later + 10, 6 * H);
        assert_eq!(d6.event, Some(Event::Recovered));
        assert_eq!(d6.failing_for_ms, Some(later + 10 - 1_000));
        assert_eq!(d6.state, FailureState::default());
        // success → success: nothing, or `changed`
        assert_eq!(
            notification_for(&ok, ApplyResult::NoChange, "", 1, H).event,
            None
        );
        assert_eq!(
            notification_for(&ok, ApplyResult::Changed, "", 1, H).event,
            Some(Event::Changed)
        );
    }

    #[test]
    fn messages_are_bounded_at_char_boundaries() {
        assert_eq!(bounded("short", 10), "short");
        let b = bounded(&"é".repeat(10), 5);
        assert!(b.starts_with("éé") && b.ends_with("[…]"), "{b}");
    }
}
