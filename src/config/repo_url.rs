//! Repository URLs reduced to one spelling, so that a push's repository
//! and a target's `repo` compare equal however each is written. Pure
//! functions: no I/O.

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
