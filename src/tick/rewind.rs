//! Where verified commits meet force pushes: may a branch tip that does
//! not descend from the commit last applied be applied?
//!
//! A force push can move a branch back to any earlier commit, or to a
//! history of its own. Signatures do not stop it: an older commit still
//! carries its good signature, so under `[targets.verify]` anyone holding a
//! forge token could move the infrastructure back to any earlier signed
//! state (a rollback attack). This module is the one place that decides:
//! under `verify` such a tip is refused, naming both commits, until a
//! person accepts that very tip (`driftless retry --accept-rewind`, or the
//! API's `retry?accept_rewind=1` with an `approve` scope; noted on the
//! target's row and cleared by the next successful apply) or the target
//! says `verify.allow_rewind = true`; without `verify` it is applied as
//! before, with a WARN and the run's message saying "rewound from X to Y".
//! Followed tags have their own rule (a tag never goes backwards) and are
//! not asked here. It must not move a checkout or call a backend.

use tracing::warn;

use super::Reconciler;
use crate::config::Target;
use crate::model::short_sha;
use crate::store::TargetState;

/// What a refused run's message carries, for `retry --accept-rewind` to
/// know the run it accepts.
pub const REWIND_REFUSED: &str = "does not descend from the commit last applied";

impl Reconciler {
    /// Whether `tip` may be applied to `target` whose state is `state`:
    /// `Ok(None)` when it descends from the commit last applied (or nothing
    /// was applied yet), `Ok(Some(note))` when it does not and may be
    /// applied all the same (the note goes on the run), `Err(why)` when it
    /// is refused.
    pub(super) async fn rewind(
        &self,
        target: &Target,
        tip: &str,
        state: Option<&TargetState>,
    ) -> Result<Option<String>, String> {
        let Some(last) = state.and_then(|s| s.last_applied_sha.as_deref()) else {
            return Ok(None);
        };
        if last == tip {
            return Ok(None);
        }
        let guarded = target.verify.as_ref().is_some_and(|v| !v.allow_rewind);
        let (from, to) = (short_sha(last), short_sha(tip));
        let what = match self.git.merge_base(&target.repo, last, tip).await {
            Ok(Some(base)) if base == last => return Ok(None),
            Ok(Some(base)) if base == tip => format!("rewound from {from} to {to}"),
            Ok(_) => format!("history rewritten from {from} to {to}"),
            Err(e) if guarded => {
                return Err(format!(
                    "commit {tip} refused: cannot tell whether it descends from {last}, the \
                     commit last applied ({e}); under [targets.verify] a tip that may be a \
                     rewind is not applied until a person accepts it: `driftless retry \
                     --accept-rewind {name}`",
                    name = target.name
                ));
            }
            Err(e) => {
                warn!(target = %target.name, from = %from, to = %to, error = %e,
                      "cannot tell whether the branch tip descends from the commit last applied; applying it");
                return Ok(None);
            }
        };
        let accepted = state.and_then(|s| s.rewind_accepted.as_deref()) == Some(tip);
        if guarded && !accepted {
            return Err(format!(
                "commit {tip} refused: it {REWIND_REFUSED}, {last} ({what}: a force push); \
                 under [targets.verify] applying it would roll the target back to an older \
                 signed state, so a person accepts it first: `driftless retry --accept-rewind \
                 {name}` (or POST /api/v1/targets/{name}/retry?accept_rewind=1 with \
                 `approve:{name}`), or set verify.allow_rewind = true",
                name = target.name
            ));
        }
        let note = if guarded {
            format!("{what} (accepted by a person)")
        } else {
            what
        };
        warn!(target = %target.name, from = %last, to = %tip,
              "{note}: the branch tip does not descend from the commit last applied");
        Ok(Some(note))
    }
}

/// `driftless retry --accept-rewind` and the API's `retry?accept_rewind=1`:
/// note that `target` may apply the tip its newest run refused as not
/// descending from the commit last applied — that very commit, not
/// whatever the branch holds by the time the retry runs (a tip moved again
/// is refused again). `Ok(Err(why))` when the newest run is no such
/// refusal. `by` is who accepts, for the log.
pub async fn accept(
    app: &crate::app::App,
    target: &str,
    by: &str,
) -> Result<Result<String, String>, crate::store::StoreError> {
    let runs = app.store.history(target, 1).await?;
    let refused = runs.first().filter(|r| {
        r.message
            .as_deref()
            .is_some_and(|m| m.contains(REWIND_REFUSED))
    });
    let Some(sha) = refused.and_then(|r| r.sha.clone()) else {
        return Ok(Err(format!(
            "nothing to accept: the newest run of `{target}` was not refused for a branch tip \
             that {REWIND_REFUSED}"
        )));
    };
    if !app.store.accept_rewind(target, &sha).await? {
        return Ok(Err(format!("target `{target}` has no recorded state")));
    }
    tracing::info!(target = %target, commit = %sha, by = %by,
                   "a person accepted a branch tip that does not descend from the commit last applied");
    Ok(Ok(sha))
}
