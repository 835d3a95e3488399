//! `[[target_sets]]` while the daemon runs: a set's directories listed at
//! its branch tip (`Git::dirs_at`) and its members made to match
//! (`refresh_set`). A directory found is a member from that commit on: its
//! row written (`store::sets`, with its `targets` row), the settings in
//! force swapped for ones that list it, the queue's dependency order
//! rewritten, and a job queued at that commit (trigger `directory`). A
//! member whose directory is gone is orphaned — taken out of the settings,
//! its runs and last applied state kept — unless the set says
//! `destroy_removed`: then it is destroyed first (the backend's destroy at
//! the commit it last applied, a run like any other) and stays a member
//! until that succeeds.
//!
//! A directory that makes no member (two directories making one name, a
//! name another set's member has, a name too long) is told to the set's
//! notifiers as a `failed` event about `target_sets[<prefix>]`, once per
//! list of refusals (in this process).
//!
//! Refreshes of every set take turns. This module must not apply anything
//! (destroys go through `tick_now_as`, the one path to a backend).

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use tracing::{info, warn};

use super::{Reconciler, TickError, Ticked};
use crate::backend::ApplyResult;
use crate::config::{Expansion, Found, Problem, Settings, Target, TargetSet};
use crate::model::Trigger;
use crate::queue::Request;
use crate::store::Operation;
use crate::store::sets::MembershipChange;

/// The refused directories each set's owners were last told of, by set:
/// told once, again only when the list changes (in this process).
pub(super) type Told = std::collections::HashMap<String, Vec<String>>;

/// What one refresh of a set found and did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SetRefresh {
    /// The branch tip its directories were listed at.
    pub sha: String,
    /// Members made (each has a job queued at `sha`).
    pub added: Vec<String>,
    /// Members whose directory is gone, now orphaned.
    pub orphaned: Vec<String>,
    /// Of those, the ones destroyed first (`destroy_removed`).
    pub destroyed: Vec<String>,
    /// Members whose directory is gone but whose destroy did not succeed:
    /// still members, tried again at the next refresh.
    pub destroy_pending: Vec<String>,
    /// Directories that make no member, with why.
    pub refused: Vec<Problem>,
}

/// What each of `settings`' sets makes at its branch tip, in order: the
/// tip and the expansion, or why the branch could not be listed. Fetched
/// into a throwaway cache (`driftless check`: nothing in `state_dir` is
/// touched); the error is making that cache.
pub async fn list_sets(
    settings: &Settings,
) -> Result<Vec<Result<(String, Expansion), crate::git::GitError>>, std::io::Error> {
    let cache = tempfile::tempdir()?;
    let git = crate::git::Git::new(cache.path());
    let mut taken = HashSet::new();
    let mut out = Vec::new();
    for set in &settings.target_sets {
        let t = &set.sample;
        let listed = match git.fetch(&t.repo, &t.branch, &t.git).await {
            Ok(tip) => git
                .dirs_at(&t.repo, &tip, &set.paths)
                .await
                .map(|d| (tip, d)),
            Err(e) => Err(e),
        };
        out.push(listed.map(|(tip, found)| {
            // `check` knows no members: what the tip makes on its own.
            let made = settings.expand(
                set,
                &Found {
                    dirs: &found.dirs,
                    links: &found.links,
                    taken: &taken,
                    members: &Default::default(),
                },
            );
            taken.extend(made.members.iter().map(|m| m.name.clone()));
            (tip, made)
        }));
    }
    Ok(out)
}

impl Reconciler {
    /// List `prefix`'s directories at its branch tip (a fetch started at or
    /// after `since` serves) and make its members match them. With
    /// `queue_new`, each new member gets a job (a daemon); without, the
    /// caller runs them itself (a one-shot `tick`).
    pub async fn refresh_set(
        &self,
        prefix: &str,
        since: Instant,
        queue_new: bool,
    ) -> Result<SetRefresh, TickError> {
        let mut told = self.sets_turn.lock().await;
        let settings = self.app.settings();
        let set: TargetSet = settings
            .target_set(prefix)
            .cloned()
            .ok_or_else(|| TickError::UnknownTarget(format!("target set `{prefix}`")))?;
        let s = &set.sample;
        let git_err = |source| TickError::Set {
            set: set.label(),
            source,
        };
        let tip = self
            .git
            .fetch_since(&s.repo, &s.branch, &s.git, since)
            .await
            .map_err(git_err)?;
        let listed = self
            .git
            .dirs_at(&s.repo, &tip, &set.paths)
            .await
            .map_err(git_err)?;
        let ours = |t: &&Target| t.set.as_deref() == Some(prefix);
        let taken: HashSet<String> = settings
            .targets
            .iter()
            .filter(|t| t.set.is_some() && !ours(t))
            .map(|t| t.name.clone())
            .collect();
        let before: Vec<&Target> = settings.targets.iter().filter(ours).collect();
        let dir_of = |t: &Target| t.path.to_string_lossy().into_owned();
        let current: BTreeMap<String, String> =
            before.iter().map(|t| (t.name.clone(), dir_of(t))).collect();
        let made = settings.expand(
            &set,
            &Found {
                dirs: &listed.dirs,
                links: &listed.links,
                taken: &taken,
                members: &current,
            },
        );
        let mut out = SetRefresh {
            sha: tip.clone(),
            refused: made.refused,
            ..Default::default()
        };
        for p in &out.refused {
            warn!(set = %set.label(), problem = %p, "a directory of a target set makes no target");
        }
        self.tell_refused(&set, &tip, &out.refused, &mut told)
            .await?;
        let added: Vec<&Target> = made
            .members
            .iter()
            .filter(|m| !before.iter().any(|b| b.name == m.name))
            .collect();
        // A member is gone when its directory is gone from the tip, and
        // for no other reason: one the set no longer makes although its
        // directory is there (its keys fail now, say; refused above) stays
        // a member as it was.
        let (gone, kept): (Vec<&Target>, Vec<&Target>) = before
            .iter()
            .copied()
            .filter(|b| !made.members.iter().any(|m| m.name == b.name))
            .partition(|b| !listed.dirs.contains(&dir_of(b)));
        let mut members: Vec<Target> = made.members.clone();
        for t in kept {
            warn!(set = %set.label(), target = %t.name,
                  "a target set's member is no longer made from its directory (see the problems above); it stays a member as it was");
            members.push(t.clone());
        }
        self.retire_gone(&set, &gone, &mut out, &mut members)
            .await?;
        out.added = added.iter().map(|t| t.name.clone()).collect();
        let changed = !added.is_empty() || !out.orphaned.is_empty();
        // A member made again keeps its row's dir up to date too.
        let renewed: Vec<&Target> = made
            .members
            .iter()
            .filter(|m| before.iter().any(|b| b.name == m.name && b.path != m.path))
            .collect();
        if changed || !renewed.is_empty() {
            let made_again: Vec<&Target> = added.iter().chain(&renewed).copied().collect();
            self.record_membership(prefix, &tip, &made_again, &out, members, &settings)
                .await?;
        }
        for name in out.added.iter().filter(|_| queue_new) {
            self.app
                .queue
                .enqueue(&Request {
                    target: name.clone(),
                    trigger: Trigger::Directory,
                    sha: Some(tip.clone()),
                    delivery_id: None,
                    receiver: None,
                })
                .await?;
        }
        if changed {
            info!(set = %set.label(), commit = %crate::model::short_sha(&tip),
                  added = ?out.added, orphaned = ?out.orphaned, destroyed = ?out.destroyed,
                  "target set's members changed");
        }
        Ok(out)
    }

    /// Members whose directory is gone from the tip: orphaned (nothing
    /// applied, or the set does not destroy), destroyed now, or kept as
    /// members with their destroy pending (paused, or a destroy that did
    /// not succeed: tried again at the set's next refresh).
    async fn retire_gone(
        &self,
        set: &TargetSet,
        gone: &[&Target],
        out: &mut SetRefresh,
        members: &mut Vec<Target>,
    ) -> Result<(), TickError> {
        for t in gone {
            // Nothing applied, nothing to destroy.
            let state = self.app.store.target_state(&t.name).await?;
            let applied = state.as_ref().is_some_and(|s| s.last_applied_sha.is_some());
            if !set.destroy_removed || !applied {
                out.orphaned.push(t.name.clone());
                continue;
            }
            // A paused target runs nothing, its destroy included: it stays
            // a member, paused, until `resume`; the next listing destroys it.
            if state.as_ref().is_some_and(|s| s.paused_at.is_some()) {
                warn!(target = %t.name, set = %set.label(),
                      "a paused member's directory is gone: its destroy waits for `driftless resume`");
                out.destroy_pending.push(t.name.clone());
                members.push((*t).clone());
                continue;
            }
            match self
                .tick_now_as(&t.name, Operation::Destroy, Trigger::Directory)
                .await
            {
                Ok(Ticked::Ran {
                    result: ApplyResult::Changed | ApplyResult::NoChange,
                    ..
                }) => {
                    out.orphaned.push(t.name.clone());
                    out.destroyed.push(t.name.clone());
                }
                other => {
                    warn!(target = %t.name, outcome = ?other,
                          "a target set's member whose directory is gone was not destroyed: tried again at the set's next refresh");
                    out.destroy_pending.push(t.name.clone());
                    members.push((*t).clone());
                }
            }
        }
        Ok(())
    }

    /// The set's membership on record (`made_again`: members added, or
    /// made again from a moved directory), and the dependency graph and the
    /// live configuration made from the new `members` and the other sets'
    /// members in `settings` (as the refresh read them).
    async fn record_membership(
        &self,
        prefix: &str,
        tip: &str,
        made_again: &[&Target],
        out: &SetRefresh,
        members: Vec<Target>,
        settings: &crate::config::Settings,
    ) -> Result<(), TickError> {
        let dirs: Vec<(String, String)> = made_again
            .iter()
            .map(|t| (t.name.clone(), t.path.to_string_lossy().into_owned()))
            .collect();
        let change = MembershipChange {
            added: made_again
                .iter()
                .zip(&dirs)
                .map(|(t, (_, d))| (t.name.as_str(), d.as_str(), t.backend.kind()))
                .collect(),
            orphaned: out.orphaned.iter().map(String::as_str).collect(),
            destroyed: out.destroyed.iter().map(String::as_str).collect(),
        };
        self.app.store.record_members(prefix, tip, &change).await?;
        let others: Vec<Target> = settings
            .targets
            .iter()
            .filter(|t| t.set.is_some() && t.set.as_deref() != Some(prefix))
            .cloned()
            .collect();
        let next = settings.with_members(others.into_iter().chain(members).collect());
        self.app
            .queue
            .set_dependencies(&crate::config::graph::ancestors(&next.targets))
            .await?;
        self.app.live.replace(next);
        Ok(())
    }

    /// Tell the set's notifiers (those that want `failed`) which of its
    /// directories make no target and why, once per list of refusals; an
    /// empty list forgets the last one.
    async fn tell_refused(
        &self,
        set: &TargetSet,
        tip: &str,
        refused: &[Problem],
        told: &mut Told,
    ) -> Result<(), TickError> {
        let lines: Vec<String> = refused.iter().map(|p| p.message.clone()).collect();
        if lines.is_empty() {
            told.remove(&set.name_prefix);
            return Ok(());
        }
        if told.get(&set.name_prefix) == Some(&lines) {
            return Ok(());
        }
        let message = format!("refused: {}", lines.join("; "));
        self.tell_about(&set.label(), &set.sample, tip, Trigger::Directory, &message)
            .await?;
        told.insert(set.name_prefix.clone(), lines);
        Ok(())
    }

    /// Tell the notifiers of `sample` (a set's, a rollout's first member)
    /// that want `failed` about `about` — a set or a rollout, not a run —
    /// at commit `sha`: `message`, bounded.
    pub(super) async fn tell_about(
        &self,
        about: &str,
        sample: &Target,
        sha: &str,
        trigger: Trigger,
        message: &str,
    ) -> Result<(), TickError> {
        let settings = self.app.settings();
        let message = crate::notify::bounded(message, crate::notify::MESSAGE_MAX);
        let event = crate::notify::Event::Failed;
        let mut outbox = Vec::new();
        for name in &sample.notify {
            let Some(cfg) = settings.notifiers.iter().find(|n| &n.name == name) else {
                continue;
            };
            if !cfg.wants(event) {
                continue;
            }
            let uid = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
            let doc = crate::notify::EventDoc {
                id: uid.clone(),
                event,
                target: about.to_string(),
                backend: sample.backend.kind().to_string(),
                sha: Some(sha.to_string()),
                short_sha: Some(crate::model::short_sha(sha).to_string()),
                commit_url: sample.commit_url(sha),
                trigger: trigger.as_str().to_string(),
                delivery_id: None,
                started_at: crate::store::format_ms(crate::store::now_ms()),
                duration_ms: 0,
                message: message.clone(),
                consecutive_failures: 0,
                failing_for_ms: None,
                run_id: None,
                run_url: None,
            };
            match serde_json::to_string(&doc) {
                Ok(document) => outbox.push(crate::store::NewNotification {
                    uid,
                    notifier: name.clone(),
                    event: event.as_str().to_string(),
                    document,
                }),
                Err(e) => warn!(notifier = %name, error = %e, "cannot encode a notification"),
            }
        }
        if !outbox.is_empty() {
            self.app.store.record_notifications(about, &outbox).await?;
            self.app.outbox_wake.notify_waiters();
        }
        Ok(())
    }

    /// [`Reconciler::refresh_set`] for every set, each on its own: one
    /// set's failure (a fetch, say) is logged and the others go on.
    /// Returns how many members were added.
    pub async fn refresh_sets(&self, since: Instant, queue_new: bool) -> usize {
        let settings = self.app.settings();
        let mut added = 0;
        for set in &settings.target_sets {
            match self.refresh_set(&set.name_prefix, since, queue_new).await {
                Ok(r) => added += r.added.len(),
                Err(e) => {
                    warn!(set = %set.label(), error = %e, "cannot list a target set's directories; its members stay as they were")
                }
            }
        }
        added
    }

    /// For a set's member about to run: its set and why it has nothing
    /// to apply, when its directory is gone at the branch tip (a fetch
    /// started at or after `since` serves). A failed fetch is the tick's
    /// to report: `None`.
    pub(super) async fn member_gone(
        &self,
        target: &Target,
        since: Instant,
    ) -> Option<(String, String)> {
        let prefix = target.set.as_ref()?;
        let tip = self
            .git
            .fetch_since(&target.repo, &target.branch, &target.git, since)
            .await
            .ok()?;
        if self
            .git
            .tree_at(&target.repo, &tip, &target.path)
            .await
            .is_some()
        {
            return None;
        }
        Some((
            prefix.clone(),
            format!(
                "directory `{}` is gone at {}: its target set is listed again",
                target.path.display(),
                crate::model::short_sha(&tip)
            ),
        ))
    }
}
