//! Change windows at run time: whether a job may start now, and how long
//! it waits before it looks again. A job held back stays queued (its
//! pushes fold into it), so when the window opens the newest commit is
//! applied once. What a window means is `window`'s.
//!
//! Not held back: a job a person marked `override` (the scope
//! `override:<target>`, `tick --override-window`), and a `rollback` a
//! health gate queued (it finishes an apply that began inside the window:
//! the unhealthy commit does not stay until Monday). A `detect` target's
//! ticks, previews, `driftless plan` and `outputs` change nothing and are
//! never held back.

use super::*;
use crate::window::{Windows, now};

/// How long a held-back job waits at most before it looks again: a window
/// changed by a configuration reload is seen within this.
const LOOK_AGAIN: Duration = Duration::from_secs(60);

/// Why a job may not start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shut {
    /// "outside its change window; opens Mon 08:00 CET".
    pub words: String,
    /// How long until it looks again.
    pub again: Duration,
}

/// Whether `target`'s windows hold back a job asked for by `triggers`. A
/// `detect` target's ticks only plan: never held back.
pub(super) fn shut(target: &Target, triggers: &[Trigger]) -> Option<Shut> {
    if target.policy == Policy::Detect
        || triggers
            .iter()
            .any(|t| matches!(t, Trigger::Override | Trigger::Rollback))
    {
        return None;
    }
    shut_at(&target.windows, now())
}

/// Whether `target`'s fallback interval waits for its window: it is shut,
/// and the target's interval ticks would do more than plan (`detect`) or
/// recheck its health (`rechecks_only`). The scheduler's question.
pub fn interval_waits(target: &Target) -> bool {
    !target.windows.is_empty()
        && target.policy != Policy::Detect
        && !target.health.as_ref().is_some_and(|h| h.recheck)
        && !target.windows.at(now()).open
}

/// Whether `job` only rechecks `target`'s health: an interval tick of a
/// target with `recheck = true` while its window is shut. It applies
/// nothing and is not held back.
pub(super) fn rechecks_only(target: &Target, job: &Job) -> bool {
    job.interval_only()
        && target.health.as_ref().is_some_and(|h| h.recheck)
        && shut(target, &job.triggers).is_some()
}

fn shut_at(windows: &Windows, at: jiff::Timestamp) -> Option<Shut> {
    let state = windows.at(at);
    if state.open {
        return None;
    }
    let most = if crate::window::debug_clock() {
        Duration::from_secs(1)
    } else {
        LOOK_AGAIN
    };
    let until = state
        .next_change
        .and_then(|t| t.duration_since(at).try_into().ok())
        .unwrap_or(most);
    Some(Shut {
        words: format!(
            "outside its change window; {}",
            windows.state_words(at).replacen("closed; ", "", 1)
        ),
        again: until.clamp(Duration::from_millis(200), most),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_window_looks_again_by_the_opening_or_a_minute() {
        let w = Windows {
            entries: vec![
                crate::window::Entry::parse(false, "Fri 16:00 - Mon 08:00 UTC").expect("entry"),
            ],
        };
        let sat: jiff::Timestamp = "2026-12-05T12:00:00Z".parse().expect("ts");
        let s = shut_at(&w, sat).expect("shut on a Saturday");
        assert_eq!(s.words, "outside its change window; opens Mon 08:00 UTC");
        assert!(s.again <= LOOK_AGAIN);
        let mon: jiff::Timestamp = "2026-12-07T07:59:30Z".parse().expect("ts");
        assert_eq!(
            shut_at(&w, mon).expect("shut").again,
            Duration::from_secs(30)
        );
        assert!(shut_at(&w, "2026-12-07T08:00:00Z".parse().expect("ts")).is_none());
    }
}
