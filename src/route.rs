//! Routing a verified push (or pull request) to the targets that track it.
//!
//! A push concerns every target whose repository is the pushed one (compared
//! after normalising the URL: scheme, user, port, scp form, `.git`, trailing
//! slash and case don't matter) and whose branch is the pushed branch; a
//! tag push, the targets whose `tag` pattern the tag matches. A target's
//! URL is normalised once, when the configuration is read
//! (`Target::repo_key`); a payload's, at every delivery.
//! Whether it changed anything under a target's `path` is not read from the
//! payload's file lists (they miss force pushes, renames, truncated and
//! empty lists): git decides it after the fetch (`tick`).
//!
//! [`asks`] is what a whole delivery asks for: the requests to queue, the
//! pull request's previews, the `pending` commit statuses, the target sets
//! to list again, and what to say of it. `http::webhook` writes that and
//! answers. Pure functions: no I/O, no queue.

pub use crate::config::normalize_repo;
use crate::config::{Previews, Settings, Target};
use crate::forge::{Delivery, Event, PullAction, PullRequest, Push};
use crate::model::Trigger;
use crate::queue::Request;
use crate::store::previews::{PullEvent, PullKey};
use crate::store::statuses::{NewStatus, State};

/// The targets that track the pushed repository and branch, or, for a
/// tag push, the targets following a tag pattern the tag matches (whether
/// it is the highest version is the tick's call).
pub fn route<'a>(settings: &'a Settings, push: &Push) -> Vec<&'a Target> {
    match &push.tag {
        None => tracking(settings, &push.repo_urls, &push.branch),
        Some(tag) => {
            let given = normalized(&push.repo_urls);
            settings
                .targets
                .iter()
                .filter(|t| {
                    t.tag
                        .as_deref()
                        .is_some_and(|p| crate::glob::glob_match(p, tag))
                        && given.contains(&t.repo_key)
                })
                .collect()
        }
    }
}

/// The `[[target_sets]]` whose repository and branch a (branch) push is
/// to: their directories may have changed.
pub fn route_sets<'a>(settings: &'a Settings, push: &Push) -> Vec<&'a crate::config::TargetSet> {
    // Without sets, the payload's URLs are not normalised a second time.
    if push.tag.is_some() || settings.target_sets.is_empty() {
        return Vec::new();
    }
    let given = normalized(&push.repo_urls);
    settings
        .target_sets
        .iter()
        .filter(|s| s.sample.branch == push.branch && given.contains(&s.sample.repo_key))
        .collect()
}

/// The targets that track the branch a pull request would merge into, in
/// its base repository (previews on or not: the caller decides).
pub fn route_pull<'a>(settings: &'a Settings, pr: &PullRequest) -> Vec<&'a Target> {
    tracking(settings, &pr.repo_urls, &pr.base_branch)
}

fn tracking<'a>(settings: &'a Settings, urls: &[String], branch: &str) -> Vec<&'a Target> {
    let given = normalized(urls);
    settings
        .targets
        .iter()
        .filter(|t| t.tag.is_none() && t.branch == branch && given.contains(&t.repo_key))
        .collect()
}

/// A payload's repository URLs, normalised as every target's `repo_key` is
/// (once, when the configuration is read).
fn normalized(urls: &[String]) -> Vec<String> {
    urls.iter().map(|u| normalize_repo(u)).collect()
}

/// What a delivery asks for ([`asks`]).
#[derive(Debug, Default)]
pub struct Asks {
    /// One job request per target that tracks a pushed branch or tag.
    pub requests: Vec<Request>,
    /// A pull request's previews, per forge repository.
    pub pulls: Vec<PullEvent>,
    /// The pushed commit `pending` on the forge of each target that sends
    /// statuses.
    pub statuses: Vec<NewStatus>,
    /// The target sets that follow the pushed branch: their directories
    /// are listed again.
    pub sets_follow: Vec<String>,
    /// What became of it, for the delivery log.
    pub outcome: String,
    /// Why nothing was queued, when nothing was.
    pub ignored: Option<String>,
    /// The targets whose tracked branch the push deleted (nothing applied).
    pub deleted_branch: Vec<String>,
}

/// What `delivery`, received by `receiver`, asks for under `settings`.
pub fn asks(settings: &Settings, receiver: &str, delivery: &Delivery) -> Asks {
    let mut a = Asks::default();
    let (outcome, ignored) = match &delivery.event {
        Event::Ping => ("ping".into(), None),
        Event::PullRequest(pr) => {
            a.pulls = pull_events(settings, pr);
            let previewing: usize = a.pulls.iter().map(|p| p.targets.len()).sum();
            match pr.action {
                PullAction::Close => (format!("pull request #{} closed", pr.number), None),
                PullAction::Preview if previewing > 0 => (
                    format!(
                        "pull request #{}: {previewing} preview(s) queued",
                        pr.number
                    ),
                    None,
                ),
                PullAction::Preview => {
                    let why = no_preview_reason(settings, pr);
                    (format!("ignored: {why}"), Some(why))
                }
            }
        }
        Event::Ignored(why) => (format!("ignored: {why}"), Some(why.clone())),
        Event::Push(push) => push_asks(settings, receiver, delivery, push, &mut a),
    };
    a.outcome = outcome;
    a.ignored = ignored;
    // The push is durable with its commit `pending` on the forge of every
    // target that sends statuses (unless it has a result there already: a
    // delivery sent again).
    a.statuses = a
        .requests
        .iter()
        .filter_map(|r| {
            settings.target(&r.target)?.commit_status(
                r.sha.as_deref()?,
                State::Pending,
                "queued".into(),
            )
        })
        .collect();
    a
}

/// A push's requests and sets, into `a`; its outcome and why it was
/// ignored, if it was.
fn push_asks(
    settings: &Settings,
    receiver: &str,
    delivery: &Delivery,
    push: &Push,
    a: &mut Asks,
) -> (String, Option<String>) {
    let tracking = route(settings, push);
    if !push.deleted {
        a.sets_follow = route_sets(settings, push)
            .iter()
            .map(|set| set.label())
            .collect();
    }
    if push.deleted && push.tag.is_none() {
        a.deleted_branch = tracking.iter().map(|t| t.name.clone()).collect();
        let why = format!("branch `{}` was deleted", push.branch);
        return (format!("ignored: {why}"), Some(why));
    }
    // Every target tracking the branch gets a job; git decides after the
    // fetch whether the push changed its path. A paused target's job waits
    // in the queue until it resumes. A tag push names the tag, not a commit
    // (`after` is the tag object, or zeros for a deleted tag): the tick
    // finds the highest tag and refuses one lower than the last.
    let sha = push.tag.is_none().then(|| push.after.clone());
    a.requests = tracking
        .iter()
        .map(|t| Request {
            target: t.name.clone(),
            trigger: Trigger::Webhook,
            sha: sha.clone(),
            delivery_id: delivery.id.clone(),
            receiver: Some(receiver.to_string()),
        })
        .collect();
    if !a.requests.is_empty() {
        (format!("queued {} job(s)", a.requests.len()), None)
    } else if !a.sets_follow.is_empty() {
        (
            format!("directories of {} listed again", a.sets_follow.join(", ")),
            None,
        )
    } else {
        let what = match &push.tag {
            Some(tag) => format!("tag `{tag}`"),
            None => format!("branch `{}`", push.branch),
        };
        let why = format!("no target follows {what} of {}", push.repo_urls.join(", "));
        (format!("ignored: {why}"), Some(why))
    }
}

/// A pull request's previews, per forge repository of the targets that
/// track its base branch and preview it: for a close, every such target's
/// (fork or not); otherwise only those whose `previews` plan a pull request
/// from where its head is.
fn pull_events(settings: &Settings, pr: &PullRequest) -> Vec<PullEvent> {
    let close = pr.action == PullAction::Close;
    let mut out: Vec<PullEvent> = Vec::new();
    for t in route_pull(settings, pr) {
        let Some(to) = &t.statuses else { continue };
        if t.previews == Previews::Off {
            continue;
        }
        let plans = !close && t.previews.plans(pr.from_fork);
        if !close && !plans {
            continue;
        }
        let key = PullKey {
            forge: to.forge.clone(),
            repo: to.repo.clone(),
            number: pr.number as i64,
        };
        let event = match out.iter_mut().find(|e| e.key == key) {
            Some(e) => e,
            None => {
                out.push(PullEvent {
                    key,
                    head_sha: pr.head_sha.clone(),
                    head_ref: pr.head_ref.clone(),
                    targets: Vec::new(),
                    close,
                });
                out.last_mut().expect("just pushed")
            }
        };
        if plans {
            event.targets.push(t.name.clone());
        }
    }
    out
}

/// Why a pull request to preview queued nothing.
fn no_preview_reason(settings: &Settings, pr: &PullRequest) -> String {
    let tracking = route_pull(settings, pr);
    let with_previews: Vec<&&Target> = tracking
        .iter()
        .filter(|t| t.previews != Previews::Off && t.statuses.is_some())
        .collect();
    if with_previews.is_empty() {
        format!(
            "no target tracking branch `{}` of {} has previews",
            pr.base_branch,
            pr.repo_urls.join(", ")
        )
    } else {
        format!(
            "pull request #{} comes from a fork; previews = \"forks\" plans those (it runs the pull request's code)",
            pr.number
        )
    }
}
