//! Routing a verified push to the targets it affects.
//!
//! A target is affected when its repository is the pushed one (compared after
//! normalising the URL: scheme, user, port, scp form, `.git`, trailing slash
//! and case don't matter), its branch is the pushed branch, and — when the
//! push's list of changed paths can be trusted — one of those paths is at or
//! under the target's `path`. Pure functions: no I/O, no queue.

use std::path::Path;

use crate::config::{Settings, Target};
use crate::forge::Push;

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

/// Does a change to `changed` (a repository-relative file path) touch a
/// target whose path is `target_path` ("" = the whole repository)?
pub fn touches(target_path: &Path, changed: &str) -> bool {
    let tp = target_path.to_string_lossy();
    let tp = tp.trim_matches('/');
    if tp.is_empty() {
        return true;
    }
    let changed = changed.trim_start_matches('/');
    changed == tp
        || changed
            .strip_prefix(tp)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// What a push means for the configured targets.
#[derive(Debug, Default)]
pub struct Routing<'a> {
    /// Targets to tick.
    pub affected: Vec<&'a Target>,
    /// Targets on the pushed repository and branch that the push's paths
    /// did not touch.
    pub untouched: Vec<&'a Target>,
}

impl Routing<'_> {
    /// Why nothing is affected, for the response.
    pub fn reason(&self, push: &Push) -> String {
        if self.untouched.is_empty() {
            format!(
                "no target tracks branch `{}` of {}",
                push.branch,
                push.repo_urls.join(", ")
            )
        } else {
            "the push changed no file under any target's path".to_string()
        }
    }
}

/// The targets `push` affects.
pub fn route<'a>(settings: &'a Settings, push: &Push) -> Routing<'a> {
    let pushed: Vec<String> = push.repo_urls.iter().map(|u| normalize_repo(u)).collect();
    let mut r = Routing::default();
    for t in &settings.targets {
        if t.branch != push.branch || !pushed.contains(&normalize_repo(&t.repo)) {
            continue;
        }
        let hit = match &push.changed_paths {
            None => true,
            Some(paths) => paths.iter().any(|p| touches(&t.path, p)),
        };
        if hit {
            r.affected.push(t);
        } else {
            r.untouched.push(t);
        }
    }
    r
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

    #[test]
    fn paths_touch_targets_at_or_under_them() {
        let p = Path::new("network");
        assert!(touches(p, "network/main.tf"));
        assert!(touches(p, "network"));
        assert!(!touches(p, "networking/main.tf"));
        assert!(!touches(p, "dns/zone"));
        assert!(touches(Path::new(""), "anything"));
        assert!(touches(Path::new("a/b"), "a/b/c/d"));
        assert!(!touches(Path::new("a/b"), "a/bc"));
    }
}
