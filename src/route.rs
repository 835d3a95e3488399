//! Routing a verified push (or pull request) to the targets that track it.
//!
//! A push concerns every target whose repository is the pushed one (compared
//! after normalising the URL: scheme, user, port, scp form, `.git`, trailing
//! slash and case don't matter) and whose branch is the pushed branch; a
//! tag push, the targets whose `tag` pattern the tag matches.
//! Whether it changed anything under a target's `path` is not read from the
//! payload's file lists (they miss force pushes, renames, truncated and
//! empty lists): git decides it after the fetch (`tick`). Pure functions: no
//! I/O, no queue.

use crate::config::{Settings, Target};
use crate::forge::{PullRequest, Push};

/// A repository URL reduced to `host/path` (or `file:/path` for local
/// repositories), lowercase, without `.git` or a trailing slash.
///
/// `https://host/o/r.git`, `git@host:o/r.git` and `ssh://git@host:22/o/r`
/// all become `host/o/r`.
pub fn normalize_repo(url: &str) -> String {
    let url = url.trim();
    let (host, path) = if let Some((scheme, rest)) = url.split_once("://") {
        if scheme.eq_ignore_ascii_case("file") {
            return local(rest);
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let host = authority.rsplit('@').next().unwrap_or(authority);
        // drop the port; IPv6 literals keep their brackets
        let host = match host.rfind(':') {
            Some(i) if !host[i..].contains(']') => &host[..i],
            _ => host,
        };
        (host.to_string(), path.to_string())
    } else if url.starts_with('/') || url.starts_with('.') {
        return local(url);
    } else if let Some((authority, path)) = url.split_once(':')
        && !authority.contains('/')
    {
        // scp form: [user@]host:path (as git reads it: only when no slash
        // comes before the first colon; `a/b:c` is a local path)
        let host = authority.rsplit('@').next().unwrap_or(authority);
        (host.to_string(), path.to_string())
    } else {
        return local(url);
    };
    format!("{}/{}", host.to_ascii_lowercase(), trim_path(&path))
}

fn local(path: &str) -> String {
    format!("file:/{}", trim_path(path))
}

fn trim_path(p: &str) -> String {
    let p = p.trim_matches('/');
    let p = p.strip_suffix(".git").unwrap_or(p);
    p.trim_end_matches('/').to_ascii_lowercase()
}

/// The targets that track the pushed repository and branch, or, for a
/// tag push, the targets following a tag pattern the tag matches (whether
/// it is the highest version is the tick's call).
pub fn route<'a>(settings: &'a Settings, push: &Push) -> Vec<&'a Target> {
    match &push.tag {
        None => tracking(settings, &push.repo_urls, &push.branch),
        Some(tag) => {
            let given: Vec<String> = push.repo_urls.iter().map(|u| normalize_repo(u)).collect();
            settings
                .targets
                .iter()
                .filter(|t| {
                    t.tag
                        .as_deref()
                        .is_some_and(|p| crate::glob::glob_match(p, tag))
                        && given.contains(&normalize_repo(&t.repo))
                })
                .collect()
        }
    }
}

/// The `[[target_sets]]` whose repository and branch a (branch) push is
/// to: their directories may have changed.
pub fn route_sets<'a>(settings: &'a Settings, push: &Push) -> Vec<&'a crate::config::TargetSet> {
    if push.tag.is_some() {
        return Vec::new();
    }
    let given: Vec<String> = push.repo_urls.iter().map(|u| normalize_repo(u)).collect();
    settings
        .target_sets
        .iter()
        .filter(|s| {
            s.sample.branch == push.branch && given.contains(&normalize_repo(&s.sample.repo))
        })
        .collect()
}

/// The targets that track the branch a pull request would merge into, in
/// its base repository (previews on or not: the caller decides).
pub fn route_pull<'a>(settings: &'a Settings, pr: &PullRequest) -> Vec<&'a Target> {
    tracking(settings, &pr.repo_urls, &pr.base_branch)
}

fn tracking<'a>(settings: &'a Settings, urls: &[String], branch: &str) -> Vec<&'a Target> {
    let given: Vec<String> = urls.iter().map(|u| normalize_repo(u)).collect();
    settings
        .targets
        .iter()
        .filter(|t| {
            t.tag.is_none() && t.branch == branch && given.contains(&normalize_repo(&t.repo))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_spellings_of_one_repository_match() {
        let want = "git.example.net/ops/infra";
        for url in [
            "https://git.example.net/ops/infra.git",
            "git@git.example.net:ops/infra.git",
            "ssh://git@git.example.net/ops/infra",
            "ssh://git@Git.Example.NET:2222/ops/infra/",
            "http://git.example.net:3000/ops/infra",
            "https://token@git.example.net/Ops/Infra.git",
            "git://git.example.net/ops/infra.git",
        ] {
            assert_eq!(normalize_repo(url), want, "{url}");
        }
        assert_ne!(
            normalize_repo("https://git.example.net/ops/other.git"),
            want
        );
        assert_ne!(
            normalize_repo("https://other.example.net/ops/infra.git"),
            want
        );
    }

    #[test]
    fn local_paths_match_file_urls() {
        assert_eq!(normalize_repo("/srv/git/infra.git"), "file:/srv/git/infra");
        assert_eq!(
            normalize_repo("file:///srv/git/infra.git"),
            "file:/srv/git/infra"
        );
        assert_eq!(normalize_repo("/srv/git/infra/"), "file:/srv/git/infra");
        // git reads `a/b:c` as a local path, not scp form (found by the
        // repo_url fuzz target).
        assert_eq!(normalize_repo("srv/git:infra"), "file:/srv/git:infra");
    }
}
