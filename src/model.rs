//! Plain types shared across layers: what an apply reports, what asked for
//! a reconcile, and the boxed future the backend and ledger traits return. No I/O, no dependencies on
//! any other driftless module: everything may import this, it imports
//! nothing.

use std::future::Future;
use std::pin::Pin;

use serde::{Deserialize, Serialize};

/// The outcome class of an apply or destroy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyResult {
    NoChange,
    Changed,
    Failed,
    /// The backend was not started: a target this one depends on has not
    /// converged (failed, blocked, or waiting for a person).
    Blocked,
    /// Applied, but its health checks did not pass (`[targets.health]`).
    Unhealthy,
    /// The last commit that was applied and healthy, applied again after
    /// a newer one was found unhealthy (`on_unhealthy = "rollback"`).
    RolledBack,
    /// A tick while the tip is quarantined: it was found unhealthy and is
    /// not applied until a newer commit arrives or a person retries. The
    /// target is held at its last healthy commit (`rollback`), or at the
    /// unhealthy one as it was applied (`report`).
    Held,
}

impl ApplyResult {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyResult::NoChange => "no_change",
            ApplyResult::Changed => "changed",
            ApplyResult::Failed => "failed",
            ApplyResult::Blocked => "blocked",
            ApplyResult::Unhealthy => "unhealthy",
            ApplyResult::RolledBack => "rolled_back",
            ApplyResult::Held => "held",
        }
    }

    /// The target is not where git says it should be, or not well there:
    /// told to its owners, counted as a failure, and red in a commit
    /// status.
    pub fn is_failure(self) -> bool {
        !matches!(self, ApplyResult::NoChange | ApplyResult::Changed)
    }
}

/// What an apply or destroy reports.
#[derive(Debug, Clone)]
pub struct Status {
    pub result: ApplyResult,
    /// One or a few lines for people: what changed, or why it failed.
    pub message: String,
    /// The end of the commands' output (already redacted).
    pub output_tail: String,
    /// Backends that build "no change" from a digest of their inputs return
    /// the digest they applied; it is stored after a successful apply and
    /// handed back in [`Context::last_digest`] next time.
    pub digest: Option<String>,
}

impl Status {
    pub fn failed(message: impl Into<String>) -> Self {
        Status {
            result: ApplyResult::Failed,
            message: message.into(),
            output_tail: String::new(),
            digest: None,
        }
    }
}

/// What asked for a reconcile. Stored in a job's `triggers` (a JSON list)
/// and, comma-joined, in a run's `trigger`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trigger {
    Interval,
    Manual,
    Webhook,
    Cli,
    /// A paused target was resumed: it runs if its branch moved meanwhile.
    Resume,
    /// A person asked to try again what failed or was rejected at this
    /// commit (`driftless retry`), without a new push.
    Retry,
    /// A target this one depends on converged again after blocking it.
    Dependency,
    /// A `[[target_sets]]` directory appeared (the member's first run) or
    /// went (its destroy, under `destroy_removed`).
    Directory,
    /// The tip was found unhealthy: the last healthy commit is applied
    /// again (`on_unhealthy = "rollback"`).
    Rollback,
    /// A person started it outside the target's change window
    /// (`override:<target>`, `tick --override-window`).
    Override,
    /// A wave of a rollout reached the target.
    Rollout,
}

impl Trigger {
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Interval => "interval",
            Trigger::Manual => "manual",
            Trigger::Webhook => "webhook",
            Trigger::Cli => "cli",
            Trigger::Resume => "resume",
            Trigger::Retry => "retry",
            Trigger::Dependency => "dependency",
            Trigger::Directory => "directory",
            Trigger::Rollback => "rollback",
            Trigger::Override => "override",
            Trigger::Rollout => "rollout",
        }
    }
}

/// A boxed, sendable future: what trait methods with async bodies return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A full commit id, as git names the commit a tick checked out (never
/// empty: where there is no commit, there is no `CommitId`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CommitId(String);

impl CommitId {
    pub fn new(id: impl Into<String>) -> CommitId {
        CommitId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Its first 12 characters, as people read it.
    pub fn short(&self) -> &str {
        short_sha(&self.0)
    }
}

impl std::fmt::Display for CommitId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A commit id as people read it: its first 12 characters (all of it when
/// shorter). Safe on any string: it never splits a character.
pub fn short_sha(sha: &str) -> &str {
    sha.char_indices().nth(12).map_or(sha, |(i, _)| &sha[..i])
}

#[cfg(test)]
mod tests {
    use super::short_sha;

    #[test]
    fn short_sha_is_twelve_characters_or_all_of_a_shorter_one() {
        assert_eq!(short_sha("0123456789abcdef0123"), "0123456789ab");
        assert_eq!(short_sha("abc"), "abc");
        assert_eq!(short_sha(""), "");
        assert_eq!(short_sha("ééééééééééééé"), "éééééééééééé");
    }
}
