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
//! empty lists): git decides it after the fetch (`tick`). Pure functions: no
//! I/O, no queue.

pub use crate::config::normalize_repo;
use crate::config::{Settings, Target};
use crate::forge::{PullRequest, Push};

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
