//! Forges: verify a webhook delivery, then turn it into a [`Delivery`].
//!
//! One submodule per forge knows its headers, how it signs and what its push
//! looks like. The signature is checked over the exact signed bytes *before*
//! anything is parsed, MACs are compared in constant time, and a failed check
//! is one opaque [`HookError::Unauthorized`] (the response must not say which
//! check failed). This module only reads bytes and headers: it never touches
//! the queue, git or a backend.

mod generic;
mod gitea;
mod github;
mod gitlab;

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;

use crate::config::ForgeKind;

/// A verified delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// The forge's delivery id (GitHub `X-GitHub-Delivery`, …), if it sent one.
    pub id: Option<String>,
    pub event: Event,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// GitHub's `ping` when a hook is created.
    Ping,
    /// A push to a branch (possibly deleting it).
    Push(Push),
    /// Verified, but nothing to do: why.
    Ignored(String),
}

/// A branch push, as far as driftless cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// Every URL the payload gives for the repository.
    pub repo_urls: Vec<String>,
    /// The branch name (without `refs/heads/`).
    pub branch: String,
    /// The pushed commit (`after`).
    pub after: String,
    /// The branch was deleted (`after` is all zeros).
    pub deleted: bool,
    // No file lists: which targets a push affects is decided by git after
    // the fetch (the lists miss force pushes, renames, truncated and empty
    // lists; see `tick::Reconciler::unaffected`).
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    /// Missing, malformed or wrong signature/token. Deliberately vague.
    #[error("unauthorized")]
    Unauthorized,
    /// Verified, but the body is not what this forge sends.
    #[error("{0}")]
    BadPayload(String),
}

/// Verify `body` with `secret` as `forge` signs it, then parse it.
pub fn receive(
    forge: ForgeKind,
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Delivery, HookError> {
    match forge {
        ForgeKind::Github => github::receive(secret, headers, body),
        ForgeKind::Gitea | ForgeKind::Forgejo => gitea::receive(secret, headers, body),
        ForgeKind::Gitlab => gitlab::receive(secret, headers, body),
        ForgeKind::Generic => generic::receive(secret, headers, body),
    }
}

/// The first of `names` present with a non-empty value (header names are
/// case-insensitive). Gitea sends signature headers with empty values when
/// no secret is set: an empty header counts as absent.
fn header<'a>(headers: &'a HeaderMap, names: &[&str]) -> Option<&'a str> {
    names.iter().find_map(|n| {
        headers
            .get(*n)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    })
}

/// Check a hex HMAC-SHA256 of `signed` in constant time.
fn verify_hex_hmac(secret: &[u8], signed: &[u8], hex_sig: &str) -> Result<(), HookError> {
    let sig = hex::decode(hex_sig.trim()).map_err(|_| HookError::Unauthorized)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| HookError::Unauthorized)?;
    mac.update(signed);
    mac.verify_slice(&sig).map_err(|_| HookError::Unauthorized)
}

/// Check `X-Hub-Signature-256: sha256=<hex>` over `signed`.
fn verify_hub_signature(
    secret: &[u8],
    headers: &HeaderMap,
    signed: &[u8],
) -> Result<(), HookError> {
    let sig = header(headers, &["x-hub-signature-256"]).ok_or(HookError::Unauthorized)?;
    let hex_sig = sig.strip_prefix("sha256=").ok_or(HookError::Unauthorized)?;
    verify_hex_hmac(secret, signed, hex_sig)
}

/// Compare a shared secret sent in clear (GitLab) in constant time.
fn verify_token(secret: &[u8], given: &str) -> Result<(), HookError> {
    use subtle::ConstantTimeEq;
    if secret.ct_eq(given.as_bytes()).into() {
        Ok(())
    } else {
        Err(HookError::Unauthorized)
    }
}

fn is_form(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim().starts_with("application/x-www-form-urlencoded"))
}

/// The JSON in a form-encoded body's `payload` field.
fn form_payload(body: &[u8]) -> Result<Vec<u8>, HookError> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned().into_bytes())
        .ok_or_else(|| HookError::BadPayload("form body has no `payload` field".into()))
}

fn parse_json(bytes: &[u8]) -> Result<Value, HookError> {
    serde_json::from_slice(bytes)
        .map_err(|e| HookError::BadPayload(format!("body is not JSON: {e}")))
}

/// `after` made only of zeros (40 for SHA-1, 64 for SHA-256 repositories).
pub fn is_zero_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|c| c == b'0')
}

/// Read a push in the shape GitHub, Gitea, Forgejo and GitLab share: `ref`
/// and `after`, with the repository URLs at `url_keys` (JSON pointers).
/// Only what git cannot tell is taken from the payload: which repository
/// and branch, and the pushed commit.
fn read_push(v: &Value, url_keys: &[&str]) -> Result<Event, HookError> {
    let git_ref = v["ref"]
        .as_str()
        .ok_or_else(|| HookError::BadPayload("push has no `ref`".into()))?;
    let after = v["after"]
        .as_str()
        .ok_or_else(|| HookError::BadPayload("push has no `after`".into()))?;
    let Some(branch) = git_ref.strip_prefix("refs/heads/") else {
        return Ok(Event::Ignored(if git_ref.starts_with("refs/tags/") {
            format!("tag push ({git_ref})")
        } else {
            format!("not a branch ({git_ref})")
        }));
    };
    if branch.is_empty() {
        return Err(HookError::BadPayload(
            "push `ref` is `refs/heads/` with no branch name".into(),
        ));
    }
    if !(4..=64).contains(&after.len()) || !after.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HookError::BadPayload(
            "push `after` is not a commit id (4 to 64 hex digits)".into(),
        ));
    }
    let mut repo_urls: Vec<String> = url_keys
        .iter()
        .filter_map(|k| v.pointer(k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    repo_urls.dedup();
    if repo_urls.is_empty() {
        return Err(HookError::BadPayload("push names no repository URL".into()));
    }
    Ok(Event::Push(Push {
        repo_urls,
        branch: branch.to_string(),
        after: after.to_string(),
        deleted: is_zero_sha(after),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn githubs_published_vector_verifies() {
        // docs.github.com: validating webhook deliveries
        verify_hex_hmac(
            b"It's a Secret to Everybody",
            b"Hello, World!",
            "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17",
        )
        .expect("published vector");
        assert_eq!(
            verify_hex_hmac(
                b"It's a Secret to Everybody",
                b"Hello, World?",
                "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
            ),
            Err(HookError::Unauthorized)
        );
        assert_eq!(
            verify_hex_hmac(b"k", b"x", "not hex"),
            Err(HookError::Unauthorized)
        );
    }

    #[test]
    fn a_push_needs_a_branch_name_and_a_commit_id() {
        let push = |r: &str, after: &str| {
            read_push(
                &serde_json::json!({ "repo": "https://git.example.net/a/b", "ref": r, "after": after }),
                &["/repo"],
            )
        };
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert!(matches!(push("refs/heads/main", sha), Ok(Event::Push(_))));
        for (r, after) in [
            ("refs/heads/", sha),
            ("refs/heads/main", ""),
            ("refs/heads/main", "0000*00000"),
            ("refs/heads/main", "abc"),
            ("refs/heads/main", &"a".repeat(65)),
        ] {
            assert!(
                matches!(push(r, after), Err(HookError::BadPayload(_))),
                "{r} {after}"
            );
        }
    }

    #[test]
    fn zero_shas() {
        assert!(is_zero_sha(&"0".repeat(40)));
        assert!(is_zero_sha(&"0".repeat(64)));
        assert!(!is_zero_sha(&"0".repeat(39)));
        assert!(!is_zero_sha(&format!("1{}", "0".repeat(39))));
    }

    #[test]
    fn empty_headers_count_as_absent() {
        let mut h = HeaderMap::new();
        h.insert("x-gitea-signature", "".parse().expect("value"));
        h.insert("x-hub-signature-256", "sha256=ab".parse().expect("value"));
        assert_eq!(header(&h, &["X-Gitea-Signature"]), None);
        assert_eq!(
            header(&h, &["X-Gitea-Signature", "X-Hub-Signature-256"]),
            Some("sha256=ab")
        );
    }
}
