//! The notification outbox: rows written with the run that caused them,
//! delivered by a [`Sender`] with retries and exponential backoff.
//!
//! A row is claimed before it is sent (so the daemon and a one-shot `tick`
//! never both send it), then marked sent, or rescheduled, or — after
//! [`MAX_ATTEMPTS`] — given up with an ERROR. A process that dies mid-send
//! leaves the claim to expire and the row is sent again (Matrix dedupes by
//! transaction id; the webhook carries the same `X-Driftless-Delivery`).
//!
//! The same sender delivers commit statuses (`store::statuses`): a row is
//! claimed, its newest state sent to its forge, and the version sent
//! recorded; a failure is a WARN naming the forge and retried with the same
//! backoff, and never changes a run. And the pull requests' preview
//! comments (`store::previews`), the same way: the newest body, created
//! once and then edited in place.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use super::forge::ForgeConfig;
use crate::store::outbox::Outbox;

/// Whether a destination may be sent to now.
enum Gate {
    /// Yes; `limited`: a limit was recorded for it (now over), which a
    /// success clears.
    Open { limited: bool },
    /// No: rate-limited until `until` (Unix ms), for `why`.
    Paused { until: i64, why: String },
}
use super::{EventDoc, NotifierConfig, Retry, SendError};
use crate::store::{Store, StoreError, format_ms, now_ms};

/// Attempts before a notification is given up (a notifier's `attempts`).
pub const MAX_ATTEMPTS: i64 = 10;
/// The first wait after a failure (a notifier's `retry_after`).
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between attempts.
pub const MAX_RETRY: Duration = Duration::from_secs(600);
/// How long a claimed row is left alone by other senders.
const CLAIM: Duration = Duration::from_secs(120);
/// How often the sender looks when nothing wakes it.
const POLL: Duration = Duration::from_secs(2);

/// The wait before attempt `n + 1` after `n` failures: `first`, then
/// doubling, at most ten minutes (2 s, 4 s, 8 s, … by default).
pub fn backoff(first: Duration, failures: i64) -> Duration {
    let exp = failures.clamp(1, 20) as u32 - 1;
    first.saturating_mul(1 << exp).min(MAX_RETRY)
}

pub use crate::store::outbox::Notification;

/// Pending (and given-up) notifications, oldest first.
pub async fn list(store: &Store, include_given_up: bool) -> Result<Vec<Notification>, StoreError> {
    store.notifications(include_given_up).await
}

/// Every notification of a target, oldest first (for tests and audits).
pub async fn for_target(store: &Store, target: &str) -> Result<Vec<Notification>, StoreError> {
    store.notifications_of(target).await
}

/// Delivers the outbox.
#[derive(Clone)]
pub struct Sender {
    store: Store,
    notifiers: Arc<HashMap<String, NotifierConfig>>,
    forges: Arc<HashMap<String, ForgeConfig>>,
    /// Built on first use: it loads the system's root certificates, which
    /// is most of what a one-shot tick with nothing to send would cost.
    http: Arc<std::sync::OnceLock<reqwest::Client>>,
}

impl Sender {
    pub fn new(
        notifiers: &[NotifierConfig],
        forges: &[ForgeConfig],
        store: Store,
    ) -> Result<Sender, SendError> {
        let http = Arc::default();
        Ok(Sender {
            store,
            notifiers: Arc::new(
                notifiers
                    .iter()
                    .map(|n| (n.name.clone(), n.clone()))
                    .collect(),
            ),
            forges: Arc::new(forges.iter().map(|f| (f.name.clone(), f.clone())).collect()),
            http,
        })
    }

    /// The HTTP client, built the first time something is sent.
    fn http(&self) -> Result<&reqwest::Client, SendError> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let built = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("driftless/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                SendError::new(format!(
                    "cannot build the HTTP client: {}",
                    crate::error::chain(&e)
                ))
            })?;
        Ok(self.http.get_or_init(|| built))
    }

    /// Whether a destination may be sent to now. `dest` is what
    /// [`ForgeConfig::destination`] or [`NotifierConfig::destination`]
    /// said (an error there is the send's to report).
    async fn gate(&self, dest: &Result<(String, String), SendError>) -> Result<Gate, StoreError> {
        let Ok((key, label)) = dest else {
            return Ok(Gate::Open { limited: false });
        };
        Ok(match self.store.limit_of(key).await? {
            Some(l) if l.paused_until > now_ms() => {
                let until = crate::store::format_ms(l.paused_until);
                info!(destination = %label, until = %until, "rate-limited: this send waits until then");
                Gate::Paused {
                    until: l.paused_until,
                    why: format!("{label} is rate-limited until {until}: {}", l.reason),
                }
            }
            Some(_) => Gate::Open { limited: true },
            None => Gate::Open { limited: false },
        })
    }

    /// After a send to `dest`: a rate limit pauses the destination (for
    /// every instance) and returns until when, with why; a success ends a
    /// limit recorded before.
    async fn settle(
        &self,
        dest: &Result<(String, String), SendError>,
        was_limited: bool,
        result: &Result<(), &SendError>,
    ) -> Result<Option<(i64, String)>, StoreError> {
        let Ok((key, label)) = dest else {
            return Ok(None);
        };
        match result {
            Ok(()) if was_limited => {
                self.store.unlimit(key).await?;
                info!(destination = %label, "rate limit over");
                Ok(None)
            }
            Err(e) => {
                let Retry::Limited(wait) = e.retry else {
                    return Ok(None);
                };
                let l = self
                    .store
                    .limit(
                        key,
                        label,
                        wait.map(|w| w.as_millis() as i64),
                        (
                            super::limit::FIRST.as_millis() as i64,
                            super::limit::MOST.as_millis() as i64,
                        ),
                        &e.message,
                    )
                    .await?;
                let until = crate::store::format_ms(l.paused_until);
                warn!(destination = %label, until = %until, error = %e,
                      "rate-limited: nothing is sent there until then");
                Ok(Some((
                    l.paused_until,
                    format!("{label} is rate-limited until {until}: {}", e.message),
                )))
            }
            _ => Ok(None),
        }
    }

    /// The notifier a row names; an error naming it when it is no longer
    /// configured.
    fn notifier(&self, name: &str) -> Result<&NotifierConfig, SendError> {
        self.notifiers
            .get(name)
            .ok_or_else(|| SendError::new(format!("notifier `{name}` is no longer configured")))
    }

    /// The forge a row names; an error naming it when it is no longer
    /// configured.
    fn forge(&self, name: &str) -> Result<&ForgeConfig, SendError> {
        self.forges
            .get(name)
            .ok_or_else(|| SendError::new(format!("forge `{name}` is no longer configured")))
    }

    /// One row of any outbox (`outbox`, row `id`) through the steps they
    /// share: a destination paused by a rate limit defers the row unsent;
    /// otherwise `send` runs, and a rate limit in its answer pauses the
    /// destination and defers the row, no attempt spent. `None` when the
    /// row was deferred; else the send's result, for the row's own record.
    async fn through<T>(
        &self,
        outbox: Outbox,
        id: i64,
        dest: Result<(String, String), SendError>,
        send: impl std::future::Future<Output = Result<T, SendError>>,
    ) -> Result<Option<Result<T, SendError>>, StoreError> {
        let limited = match self.gate(&dest).await? {
            Gate::Paused { until, why } => {
                self.store.defer(outbox, id, until, &why).await?;
                return Ok(None);
            }
            Gate::Open { limited } => limited,
        };
        let result = send.await;
        if let Some((until, why)) = self
            .settle(&dest, limited, &result.as_ref().map(|_| ()))
            .await?
        {
            self.store.defer(outbox, id, until, &why).await?;
            return Ok(None);
        }
        Ok(Some(result))
    }

    /// Send one event now, outside the outbox (`driftless notify test`).
    pub async fn send_now(&self, notifier: &str, doc: &EventDoc) -> Result<(), SendError> {
        let n = self
            .notifiers
            .get(notifier)
            .ok_or_else(|| SendError::new(format!("no notifier named `{notifier}`")))?;
        n.send(self.http()?, doc).await
    }

    /// One pass over the due notifications, then the commit statuses and
    /// the pull request comments. Returns how many were sent or failed (a
    /// row deferred past a rate limit is not counted).
    pub async fn deliver_due(&self) -> Result<usize, StoreError> {
        let mut attempted = 0;
        for due in self.store.due_notifications().await? {
            let claimed = self
                .store
                .claim_notification(due, CLAIM.as_millis() as i64)
                .await?;
            let Some(n) = claimed else { continue };
            let dest = self.notifier(&n.notifier).and_then(|c| c.destination());
            let send = async {
                let cfg = self.notifier(&n.notifier)?;
                let doc = serde_json::from_str::<EventDoc>(&n.document)
                    .map_err(|e| SendError::new(format!("unreadable event document: {e}")))?;
                cfg.send(self.http()?, &doc).await
            };
            let Some(result) = self.through(Outbox::Notification, n.id, dest, send).await? else {
                continue;
            };
            attempted += 1;
            self.record(&n, result).await?;
        }
        Ok(attempted + self.deliver_statuses().await? + self.deliver_comments().await?)
    }

    /// One pass over the pull request comments whose newest body a forge
    /// does not have yet: each is created once, then edited in place.
    /// Returns how many were attempted.
    pub async fn deliver_comments(&self) -> Result<usize, StoreError> {
        let rows = self.store.claim_comments(CLAIM.as_millis() as i64).await?;
        for r in &rows {
            let Some(body) = &r.body else { continue };
            let dest = self.forge(&r.forge).and_then(|f| f.destination());
            let send = async {
                let f = self.forge(&r.forge)?;
                let http = self.http()?;
                f.upsert_comment(http, &r.repo, r.number, r.comment_id.as_deref(), body)
                    .await
            };
            let Some(result) = self.through(Outbox::Comment, r.id, dest, send).await? else {
                continue;
            };
            match result {
                Ok(id) => {
                    info!(forge = %r.forge, repo = %r.repo, number = r.number, comment = %id,
                          "pull request comment sent");
                    self.store.comment_sent(r.id, r.version, &id).await?;
                }
                Err(e) => {
                    let attempts = r.attempts + 1;
                    let next = (attempts < MAX_ATTEMPTS && e.retry == Retry::Later)
                        .then(|| now_ms() + backoff(FIRST_RETRY, attempts).as_millis() as i64);
                    if next.is_none() {
                        error!(forge = %r.forge, repo = %r.repo, number = r.number, attempts,
                               error = %e, "pull request comment given up");
                    } else {
                        warn!(forge = %r.forge, repo = %r.repo, number = r.number, attempts,
                              error = %e, "pull request comment failed; will retry");
                    }
                    self.store
                        .comment_failed(r.id, r.version, &e.message, next)
                        .await?;
                }
            }
        }
        Ok(rows.len())
    }

    /// One pass over the commit statuses whose newest state a forge does
    /// not have yet. Returns how many were attempted.
    pub async fn deliver_statuses(&self) -> Result<usize, StoreError> {
        let rows = self.store.claim_statuses(CLAIM.as_millis() as i64).await?;
        for r in &rows {
            let dest = self.forge(&r.forge).and_then(|f| f.destination());
            let send = async {
                let f = self.forge(&r.forge)?;
                let s = super::forge::Status {
                    repo: &r.repo,
                    sha: &r.sha,
                    context: &r.context,
                    state: r.state,
                    description: &r.description,
                    target_url: r.target_url.as_deref(),
                    git_ref: r.git_ref.as_deref(),
                };
                f.send(self.http()?, &s).await
            };
            let Some(result) = self.through(Outbox::Status, r.id, dest, send).await? else {
                continue;
            };
            match result {
                Ok(()) => {
                    info!(forge = %r.forge, target = %r.target, sha = %r.sha, state = ?r.state,
                          "commit status sent");
                    self.store.status_sent(r.id, r.version).await?;
                }
                Err(e) => {
                    let attempts = r.attempts + 1;
                    if e.retry == Retry::Never {
                        // The forge would refuse it again: say so now,
                        // instead of after ten refusals.
                        error!(forge = %r.forge, target = %r.target, sha = %r.sha, attempts,
                               error = %e, "commit status refused by the forge; given up");
                        self.store
                            .status_failed(r.id, r.version, &e.message, None)
                            .await?;
                    } else if attempts >= MAX_ATTEMPTS {
                        error!(forge = %r.forge, target = %r.target, sha = %r.sha, attempts,
                               error = %e, "commit status given up");
                        self.store
                            .status_failed(r.id, r.version, &e.message, None)
                            .await?;
                    } else {
                        let wait = backoff(FIRST_RETRY, attempts);
                        warn!(forge = %r.forge, target = %r.target, sha = %r.sha, attempts,
                              retry_in = %humantime::format_duration(wait), error = %e,
                              "commit status failed; will retry");
                        let next = now_ms() + wait.as_millis() as i64;
                        self.store
                            .status_failed(r.id, r.version, &e.message, Some(next))
                            .await?;
                    }
                }
            }
        }
        Ok(rows.len())
    }

    async fn record(
        &self,
        n: &Notification,
        result: Result<(), SendError>,
    ) -> Result<(), StoreError> {
        match result {
            Ok(()) => {
                info!(notifier = %n.notifier, target = %n.target, event = %n.event, id = n.id, "notification sent");
                self.store.notification_sent(n.id).await
            }
            Err(e) => {
                let attempts = n.attempts + 1;
                let (max, first) = self
                    .notifiers
                    .get(&n.notifier)
                    .map_or((MAX_ATTEMPTS, FIRST_RETRY), |c| (c.attempts, c.retry_after));
                let next = if attempts >= max || e.retry == Retry::Never {
                    error!(notifier = %n.notifier, target = %n.target, event = %n.event, id = n.id,
                           attempts, error = %e, "notification given up");
                    None
                } else {
                    let wait = backoff(first, attempts);
                    warn!(notifier = %n.notifier, target = %n.target, event = %n.event, id = n.id,
                          attempts, retry_in = %humantime::format_duration(wait), error = %e,
                          "notification failed; will retry");
                    Some(now_ms() + wait.as_millis() as i64)
                };
                self.store
                    .notification_failed(n.id, attempts, &e.message, next)
                    .await
            }
        }
    }

    /// Deliver until `shutdown`; `wake` says something new is in the outbox.
    pub async fn run(self, wake: Arc<Notify>, mut shutdown: watch::Receiver<bool>) {
        loop {
            let notified = wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Err(e) = self.deliver_due().await {
                error!(error = %e, "cannot read or update the notification outbox");
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.changed() => {}
            }
            if *shutdown.borrow() {
                return;
            }
        }
    }
}

/// A row for `driftless notify pending`.
pub fn describe(n: &Notification) -> String {
    format!(
        "{:<6} {:<14} {:<20} {:<14} {:<9} {:>3}  next {}  {}",
        n.id,
        n.notifier,
        n.target,
        n.event,
        n.state,
        n.attempts,
        format_ms(n.next_attempt_at),
        n.last_error.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(FIRST_RETRY, 1), Duration::from_secs(2));
        assert_eq!(backoff(FIRST_RETRY, 2), Duration::from_secs(4));
        assert_eq!(backoff(FIRST_RETRY, 5), Duration::from_secs(32));
        assert_eq!(backoff(FIRST_RETRY, 30), Duration::from_secs(600));
        assert_eq!(backoff(Duration::from_secs(1), 3), Duration::from_secs(4));
    }

    /// Two senders — two instances, each with its own connections — look
    /// at the same due notifications at once: each is attempted once.
    #[tokio::test]
    async fn two_senders_attempt_each_notification_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            store
                .register_targets(&[("web", "exec")])
                .await
                .expect("register");
            let outbox: Vec<crate::store::NewNotification> = (0..40)
                .map(|i| crate::store::NewNotification {
                    uid: format!("n{i}"),
                    notifier: "gone".into(),
                    event: "failed".into(),
                    document: "{}".into(),
                })
                .collect();
            store
                .record_notifications("web", &outbox)
                .await
                .expect("insert");
            let other = match store.kind() {
                crate::store::Kind::Sqlite => Store::open(store.path()).await,
                crate::store::Kind::Postgres => {
                    Store::open_postgres(&store.path().display().to_string()).await
                }
            }
            .expect("a second store");
            let a = Sender::new(&[], &[], store.clone()).expect("sender");
            let b = Sender::new(&[], &[], other).expect("sender");
            let (x, y) = tokio::join!(a.deliver_due(), b.deliver_due());
            let (x, y) = (x.expect("a"), y.expect("b"));
            assert_eq!(x + y, 40, "{:?}: {x} + {y}", store.kind());
        }
    }
}
