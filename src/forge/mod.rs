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
    /// A pull (merge) request opened, given new commits, reopened or
    /// closed.
    PullRequest(PullRequest),
    /// Verified, but nothing to do: why.
    Ignored(String),
}

/// A branch push, as far as driftless cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Push {
    /// Every URL the payload gives for the repository.
    pub repo_urls: Vec<String>,
    /// The branch name (without `refs/heads/`); empty for a tag push.
    pub branch: String,
    /// A tag push: the tag's name (without `refs/tags/`).
    pub tag: Option<String>,
    /// The pushed commit (`after`).
    pub after: String,
    /// The branch was deleted (`after` is all zeros).
    pub deleted: bool,
    // No file lists: which targets a push affects is decided by git after
    // the fetch (the lists miss force pushes, renames, truncated and empty
    // lists; see `tick::Reconciler::unaffected`).
}

/// A pull request (GitLab: merge request) event, as far as previews care.
/// Which targets it concerns is decided like a push's (the base repository
/// and branch); whether it changes their path is git's call, from the merge
/// base to the head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    /// Every URL the payload gives for the base repository.
    pub repo_urls: Vec<String>,
    /// The branch it would merge into.
    pub base_branch: String,
    /// The forge's number for it (GitLab: the `iid`).
    pub number: u64,
    /// The head commit to plan.
    pub head_sha: String,
    /// The ref the forge keeps for the head in the base repository
    /// (`refs/pull/<n>/head`, GitLab `refs/merge-requests/<iid>/head`):
    /// fetched from the base repository, also for a fork's pull request.
    pub head_ref: String,
    /// The head is in another repository than the base (a fork).
    pub from_fork: bool,
    pub action: PullAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullAction {
    /// Opened, reopened, or new commits: preview the head.
    Preview,
    /// Closed or merged: no more previews.
    Close,
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

/// The fields of a push's repository (GitHub, Gitea: `repository`; GitLab:
/// `project` and `repository`) that can name it.
#[derive(serde::Deserialize)]
struct PushUrls {
    clone_url: Option<Value>,
    ssh_url: Option<Value>,
    html_url: Option<Value>,
    git_url: Option<Value>,
    git_http_url: Option<Value>,
    git_ssh_url: Option<Value>,
    web_url: Option<Value>,
    url: Option<Value>,
}

/// What [`read_push`] reads of a push, and nothing else: the commit lists,
/// the sender and the rest are skipped while parsing, never built (they
/// are most of a push's bytes, and intake parses thousands a second).
#[derive(serde::Deserialize)]
struct PushDoc {
    #[serde(rename = "ref")]
    git_ref: Option<Value>,
    after: Option<Value>,
    repo: Option<Value>,
    repository: Option<PushUrls>,
    project: Option<PushUrls>,
}

/// A push body as a JSON value holding only what [`read_push`] reads.
fn parse_push(bytes: &[u8]) -> Result<Value, HookError> {
    let doc: PushDoc = serde_json::from_slice(bytes).map_err(|e| {
        HookError::BadPayload(if e.is_data() {
            format!("push is not what this forge sends: {e}")
        } else {
            format!("body is not JSON: {e}")
        })
    })?;
    let urls = |u: Option<PushUrls>| -> Value {
        let mut m = serde_json::Map::new();
        if let Some(u) = u {
            for (k, v) in [
                ("clone_url", u.clone_url),
                ("ssh_url", u.ssh_url),
                ("html_url", u.html_url),
                ("git_url", u.git_url),
                ("git_http_url", u.git_http_url),
                ("git_ssh_url", u.git_ssh_url),
                ("web_url", u.web_url),
                ("url", u.url),
            ] {
                if let Some(v) = v {
                    m.insert(k.into(), v);
                }
            }
        }
        Value::Object(m)
    };
    let mut v = serde_json::Map::new();
    for (k, x) in [
        ("ref", doc.git_ref),
        ("after", doc.after),
        ("repo", doc.repo),
    ] {
        if let Some(x) = x {
            v.insert(k.into(), x);
        }
    }
    v.insert("repository".into(), urls(doc.repository));
    v.insert("project".into(), urls(doc.project));
    Ok(Value::Object(v))
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
    let (branch, tag) = match (
        git_ref.strip_prefix("refs/heads/"),
        git_ref.strip_prefix("refs/tags/"),
    ) {
        (Some(b), _) => (b, None),
        (None, Some(t)) if !t.is_empty() => ("", Some(t.to_string())),
        _ => return Ok(Event::Ignored(format!("not a branch or a tag ({git_ref})"))),
    };
    if branch.is_empty() && tag.is_none() {
        return Err(HookError::BadPayload(
            "push `ref` is `refs/heads/` with no branch name".into(),
        ));
    }
    if !(4..=64).contains(&after.len()) || !after.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HookError::BadPayload(
            "push `after` is not a commit id (4 to 64 hex digits)".into(),
        ));
    }
    let repo_urls = repo_urls(v, url_keys);
    if repo_urls.is_empty() {
        return Err(HookError::BadPayload("push names no repository URL".into()));
    }
    Ok(Event::Push(Push {
        repo_urls,
        branch: branch.to_string(),
        tag,
        after: after.to_string(),
        deleted: is_zero_sha(after),
    }))
}

/// The repository URLs at `keys` (JSON pointers), non-empty, each once.
fn repo_urls(v: &Value, keys: &[&str]) -> Vec<String> {
    let mut urls: Vec<String> = Vec::new();
    for u in keys
        .iter()
        .filter_map(|k| v.pointer(k).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
    {
        if !urls.iter().any(|x| x == u) {
            urls.push(u.to_string());
        }
    }
    urls
}

/// A string at `key` (a JSON pointer) of a pull request payload, or a
/// `BadPayload` naming the key.
fn pull_str<'a>(v: &'a Value, key: &str) -> Result<&'a str, HookError> {
    v.pointer(key)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| HookError::BadPayload(format!("pull request event has no `{key}`")))
}

/// What a pull request event needs besides its action, checked: a commit
/// id, a branch, a number, a repository URL.
struct PullParts<'a> {
    repo_urls: Vec<String>,
    base_branch: &'a str,
    number: Option<u64>,
    head_sha: &'a str,
    head_ref: fn(u64) -> String,
    from_fork: bool,
    action: PullAction,
}

fn pull_request(p: PullParts<'_>) -> Result<Event, HookError> {
    let number = p
        .number
        .ok_or_else(|| HookError::BadPayload("pull request event has no number".into()))?;
    let sha = p.head_sha;
    if !(4..=64).contains(&sha.len()) || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(HookError::BadPayload(
            "pull request head is not a commit id (4 to 64 hex digits)".into(),
        ));
    }
    if p.repo_urls.is_empty() {
        return Err(HookError::BadPayload(
            "pull request event names no repository URL".into(),
        ));
    }
    let branch = p
        .base_branch
        .strip_prefix("refs/heads/")
        .unwrap_or(p.base_branch);
    Ok(Event::PullRequest(PullRequest {
        repo_urls: p.repo_urls,
        base_branch: branch.to_string(),
        number,
        head_sha: sha.to_string(),
        head_ref: (p.head_ref)(number),
        from_fork: p.from_fork,
        action: p.action,
    }))
}

/// GitHub's and Gitea's (Forgejo's) `pull_request` event: `action`,
/// `number`, `pull_request.head.sha`, `pull_request.base.ref`; a fork when
/// the head repository is not the base one (Gitea's trimmed payloads say it
/// only with `repo_id`; a head repository that is gone counts as a fork).
fn read_pull(v: &Value, preview: &[&str], url_keys: &[&str]) -> Result<Event, HookError> {
    let action = pull_str(v, "/action")?;
    let action = if preview.contains(&action) {
        PullAction::Preview
    } else if action == "closed" {
        PullAction::Close
    } else {
        return Ok(Event::Ignored(format!("pull request `{action}`")));
    };
    let pr = &v["pull_request"];
    let (head, base) = (&pr["head"], &pr["base"]);
    let from_fork = match (head["repo_id"].as_i64(), base["repo_id"].as_i64()) {
        (Some(h), Some(b)) => h != b,
        _ => match (
            head.pointer("/repo/full_name").and_then(Value::as_str),
            base.pointer("/repo/full_name").and_then(Value::as_str),
        ) {
            (Some(h), Some(b)) => !h.eq_ignore_ascii_case(b),
            _ => true,
        },
    };
    pull_request(PullParts {
        repo_urls: repo_urls(v, url_keys),
        base_branch: pull_str(v, "/pull_request/base/ref")?,
        number: v["number"].as_u64().or_else(|| pr["number"].as_u64()),
        head_sha: pull_str(v, "/pull_request/head/sha")?,
        head_ref: |n| format!("refs/pull/{n}/head"),
        from_fork,
        action,
    })
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
        match push("refs/tags/v1.2.0", sha) {
            Ok(Event::Push(p)) => {
                assert_eq!((p.tag.as_deref(), p.branch.as_str()), (Some("v1.2.0"), ""))
            }
            other => panic!("a tag push: {other:?}"),
        }
        assert!(matches!(push("refs/notes/x", sha), Ok(Event::Ignored(_))));
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

    /// Each forge's real pull request payloads (tests/fixtures/webhooks,
    /// see SOURCES.md), through the forge's own receiver with a signature
    /// made here: the base branch, the number, the head and the ref the
    /// forge keeps for it, fork or not, and what the action means.
    #[test]
    fn pull_request_events_of_every_forge() {
        use axum::http::HeaderValue;
        let secret = b"s3cret";
        let fixture = |f: &str| {
            std::fs::read(format!(
                "{}/tests/fixtures/webhooks/{f}",
                env!("CARGO_MANIFEST_DIR")
            ))
            .expect("fixture")
        };
        let receive_as = |forge: ForgeKind, f: &str| {
            let body = fixture(f);
            let mut h = HeaderMap::new();
            let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("key");
            mac.update(&body);
            let sig = hex::encode(mac.finalize().into_bytes());
            let set = |h: &mut HeaderMap, k: &'static str, v: &str| {
                h.insert(k, HeaderValue::from_str(v).expect("header"));
            };
            match forge {
                ForgeKind::Github => {
                    set(&mut h, "x-github-event", "pull_request");
                    set(&mut h, "x-hub-signature-256", &format!("sha256={sig}"));
                }
                ForgeKind::Gitlab => {
                    set(&mut h, "x-gitlab-event", "Merge Request Hook");
                    set(&mut h, "x-gitlab-token", "s3cret");
                }
                _ => {
                    set(&mut h, "x-gitea-event", "pull_request");
                    set(&mut h, "x-gitea-signature", &sig);
                }
            }
            receive(forge, secret, &h, &body).map(|d| d.event)
        };
        let pr = |forge, f: &str| match receive_as(forge, f) {
            Ok(Event::PullRequest(p)) => p,
            other => panic!("{f}: {other:?}"),
        };
        use ForgeKind::*;
        use PullAction::*;
        for (forge, f, number, head, base, fork, action, url) in [
            (
                Github,
                "github/pull-request-opened.json",
                2,
                "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                "master",
                false,
                Preview,
                "https://github.com/Codertocat/Hello-World.git",
            ),
            (
                Github,
                "github/pull-request-reopened.json",
                2,
                "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
                "master",
                false,
                Preview,
                "https://github.com/Codertocat/Hello-World.git",
            ),
            (
                Github,
                "github/pull-request-synchronize-fork.json",
                305,
                "76bd109bca7ca50ccc1839846b788d3f709ae84e",
                "main",
                true,
                Preview,
                "https://github.com/FerretDB/FerretDB.git",
            ),
            (
                Github,
                "github/pull-request-closed-merged.json",
                62,
                "",
                "main",
                false,
                Close,
                "",
            ),
            (
                Github,
                "github/pull-request-closed.json",
                2,
                "",
                "master",
                false,
                Close,
                "",
            ),
            (
                Gitea,
                "gitea/pull-request-opened.json",
                2,
                "48e773f892a831faa47c0a160d1b7f0cd369ae2a",
                "master",
                true,
                Preview,
                "http://localhost:3000/example/example.git",
            ),
            (
                Gitea,
                "gitea/pull-request-synchronized.json",
                2,
                "788ed8d02d3b7fcfcf6386dbcbca696aa1d4dc25",
                "main",
                false,
                Preview,
                "http://127.0.0.1:3000/Test-CI/multi-line-secrets.git",
            ),
            (
                Gitea,
                "gitea/pull-request-closed-merged.json",
                1,
                "d555a5dd07f4d0148a58d4686ec381502ae6a2d4",
                "main",
                false,
                Close,
                "https://gitea.com/anbraten/test-repo.git",
            ),
            (
                Forgejo,
                "forgejo/pull-request-reopened-codeberg.json",
                1,
                "36b5813240a9d2daa29b05046d56a53e18f39a3e",
                "main",
                false,
                Preview,
                "https://codeberg.org/test_it/test_ci_thing.git",
            ),
            (
                Gitlab,
                "gitlab/merge-request-open.json",
                3,
                "2f7670508b771e7e77839402be8b34b13787aba8",
                "main",
                false,
                Preview,
                "https://gitlab.com/demoaccount2-commits-group/test_ci_tmp.git",
            ),
            (
                Gitlab,
                "gitlab/merge-request-update.json",
                3,
                "c136499ec574e1034b24c5d306de9acda3005367",
                "main",
                false,
                Preview,
                "https://gitlab.com/anbraten/woodpecker.git",
            ),
            (
                Gitlab,
                "gitlab/merge-request-merge.json",
                4,
                "3e4db3586b65dd401de8c77b3ac343fd24cbf89b",
                "main",
                false,
                Close,
                "https://gitlab.com/anbraten/woodpecker-test.git",
            ),
        ] {
            let p = pr(forge, f);
            assert_eq!(
                (p.number, p.base_branch.as_str(), p.from_fork, p.action),
                (number, base, fork, action),
                "{f}"
            );
            if !head.is_empty() {
                assert_eq!(p.head_sha, head, "{f}");
            }
            if !url.is_empty() {
                assert_eq!(p.repo_urls[0], url, "{f}");
            }
            let want_ref = if forge == Gitlab {
                format!("refs/merge-requests/{number}/head")
            } else {
                format!("refs/pull/{number}/head")
            };
            assert_eq!(p.head_ref, want_ref, "{f}");
        }
        // A title edit is an `update` without commits: nothing to preview.
        assert!(matches!(
            receive_as(Gitlab, "gitlab/merge-request-update-edited.json"),
            Ok(Event::Ignored(why)) if why.contains("without new commits")
        ));
        // A payload without the head names the key.
        let mut v: Value =
            serde_json::from_slice(&fixture("github/pull-request-opened.json")).expect("json");
        v["pull_request"]["head"]["sha"] = Value::Null;
        let read = read_pull(&v, &["opened"], &["/repository/clone_url"]);
        assert_eq!(
            read,
            Err(HookError::BadPayload(
                "pull request event has no `/pull_request/head/sha`".into()
            ))
        );
    }
}
