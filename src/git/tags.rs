//! Tags as a target's source (`tag = "v*"`): the remote's tags matching the
//! pattern are fetched, the highest version among them (semver order, a
//! leading `v` allowed) is the one to apply, and the commit it names is
//! peeled from the cache. A matching tag that is not a version is left out,
//! said once per process. This module must not move a checkout.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Instant;

use super::{Git, GitAuth, GitError};

/// The tag a target follows, as fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagTip {
    /// The tag's name (without `refs/tags/`).
    pub name: String,
    /// The commit it names.
    pub commit: String,
    /// The object the tag ref points at (the tag object, or the commit
    /// for a lightweight tag).
    pub object: String,
    /// An annotated tag (a tag object, which can carry a signature), not a
    /// lightweight one.
    pub annotated: bool,
}

/// Tag names already said not to be versions.
static NOT_VERSIONS: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// A tag name's version: `1.2.3` or `v1.2.3` (any pre-release or build
/// part as semver reads it).
pub fn version(name: &str) -> Option<semver::Version> {
    let bare = name
        .rsplit('/')
        .next()
        .unwrap_or(name)
        .trim_start_matches(['v', 'V']);
    semver::Version::parse(bare).ok()
}

/// Among `(ref name, id)` pairs the remote offered, the `refs/tags/…` one
/// matching `pattern` with the highest version, as `(name, id)`.
pub(super) fn newest<'a>(
    refs: impl Iterator<Item = (&'a [u8], Option<String>)>,
    pattern: &str,
    remote: &str,
) -> Option<(String, String)> {
    let mut best: Option<(semver::Version, String, String)> = None;
    for (full, id) in refs {
        let Some(id) = id else { continue };
        let Some(name) = std::str::from_utf8(full)
            .ok()
            .and_then(|n| n.strip_prefix("refs/tags/"))
        else {
            continue;
        };
        if !crate::glob::glob_match(pattern, name) {
            continue;
        }
        let Some(v) = version(name) else {
            let mut said = NOT_VERSIONS.lock().unwrap_or_else(|e| e.into_inner());
            if said
                .get_or_insert_with(HashSet::new)
                .insert(format!("{remote} {name}"))
            {
                tracing::warn!(%remote, tag = %name, %pattern,
                    "a tag matching the pattern is not a version (semver, a leading v allowed): left out");
            }
            continue;
        };
        if best.as_ref().is_none_or(|(b, _, _)| v > *b) {
            best = Some((v, name.to_string(), id));
        }
    }
    best.map(|(_, name, id)| (name, id))
}

impl Git {
    /// Fetch the tags of `remote` matching `pattern` and return the
    /// highest version among them, with the commit it names.
    pub async fn fetch_tag(
        &self,
        remote: &str,
        pattern: &str,
        auth: &GitAuth,
        since: Instant,
    ) -> Result<TagTip, GitError> {
        let found = self
            .fetch_wanted(remote, pattern, format!("refs/tags/{pattern}"), auth, since)
            .await?;
        let (name, id) = found.split_once(' ').ok_or_else(|| GitError::NoTag {
            remote: remote.to_string(),
            pattern: pattern.to_string(),
        })?;
        let cache = self.cache_dir(remote);
        let (name, id) = (name.to_string(), id.to_string());
        let peeled = tokio::task::spawn_blocking({
            let id = id.clone();
            move || -> Option<(String, bool)> {
                let repo = gix::open_opts(&cache, gix::open::Options::isolated()).ok()?;
                let oid = gix::ObjectId::from_hex(id.as_bytes()).ok()?;
                let object = repo.find_object(oid).ok()?;
                let annotated = object.kind == gix::object::Kind::Tag;
                let commit = object.peel_to_commit().ok()?;
                Some((commit.id.to_hex().to_string(), annotated))
            }
        })
        .await
        .ok()
        .flatten();
        let (commit, annotated) = peeled.ok_or_else(|| GitError::Fetch {
            remote: remote.to_string(),
            branch: pattern.to_string(),
            reason: format!("tag {name} ({id}) does not lead to a commit in the cache"),
        })?;
        Ok(TagTip {
            name,
            commit,
            object: id,
            annotated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_highest_version_matching_wins_and_others_are_left_out() {
        let refs: Vec<(&[u8], Option<String>)> = vec![
            (b"refs/tags/v1.2.0", Some("a".into())),
            (b"refs/tags/v1.10.0", Some("b".into())),
            (b"refs/tags/v1.9.9", Some("c".into())),
            (b"refs/tags/latest", Some("d".into())),
            (b"refs/tags/v2.0.0-rc.1", Some("e".into())),
            (b"refs/tags/release-9.0.0", Some("f".into())),
            (b"refs/heads/v9.9.9", Some("g".into())),
        ];
        let pick = |pattern: &str| newest(refs.iter().map(|(n, i)| (*n, i.clone())), pattern, "r");
        // Semver order: 2.0.0-rc.1 is above 1.10.0; 1.10.0 above 1.9.9.
        assert_eq!(pick("v*"), Some(("v2.0.0-rc.1".into(), "e".into())));
        assert_eq!(pick("v1.*"), Some(("v1.10.0".into(), "b".into())));
        assert_eq!(pick("latest"), None, "not a version");
        assert_eq!(pick("nothing*"), None);
        assert_eq!(version("v1.2.3").map(|v| v.minor), Some(2));
        assert_eq!(version("1.2.3"), semver::Version::parse("1.2.3").ok());
        assert!(version("v1.2").is_none());
    }
}
