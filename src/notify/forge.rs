//! Commit statuses on a forge: the `[[forges]]` configuration and the one
//! call each forge has for it. One status context per target,
//! `driftless/<target>`, on the commit a run applied; the forge keeps the
//! newest state it was sent for a context (the outbox, `store::statuses`,
//! makes sure that is the newest driftless has). The token is a secret
//! reference, read when sending, never in an error.
//!
//! The endpoints, from each forge's published API description:
//! - GitHub REST "Create a commit status": `POST
//!   /repos/{owner}/{repo}/statuses/{sha}`, JSON `state` (`error`,
//!   `failure`, `pending`, `success`), `target_url`, `description`,
//!   `context`; `Authorization: Bearer <token>`; 201. At most 1000 statuses
//!   per sha and context (then 422).
//! - Gitea and Forgejo (swagger `repoCreateStatus`): `POST
//!   /repos/{owner}/{repo}/statuses/{sha}` under `/api/v1`, the same four
//!   fields (`CreateStatusOption`; states also `warning`); `Authorization:
//!   token <token>`; 201.
//! - GitLab "Set the pipeline status of a commit": `POST
//!   /projects/{id}/statuses/{sha}` under `/api/v4`, `id` the URL-encoded
//!   project path; `state` one of `pending`, `running`, `success`, `failed`,
//!   `canceled`; `name` (the context), `target_url`, `description`;
//!   `PRIVATE-TOKEN: <token>`; 201. Posting the state a status already has
//!   is refused with 400 "Cannot transition status via :… from :…", which
//!   for a status sent again after a crash means it is already there.
//!
//! This module sends; it decides nothing about when.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{SendError, bounded};
use crate::secret::SecretRef;
pub use crate::store::statuses::State;

/// Which forge's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    GitHub,
    Gitea,
    Forgejo,
    GitLab,
}

impl Kind {
    pub const NAMES: &'static str = "github, gitea, forgejo, gitlab";

    pub fn parse(s: &str) -> Option<Kind> {
        match s {
            "github" => Some(Kind::GitHub),
            "gitea" => Some(Kind::Gitea),
            "forgejo" => Some(Kind::Forgejo),
            "gitlab" => Some(Kind::GitLab),
            _ => None,
        }
    }
}

/// A `[[forges]]` entry.
#[derive(Debug, Clone)]
pub struct ForgeConfig {
    pub name: String,
    pub kind: Kind,
    /// The API root: `https://api.github.com`, `https://gitea.example.net`
    /// (driftless adds `/api/v1`), `https://gitlab.example.net` (`/api/v4`).
    pub api_url: String,
    pub token: SecretRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawForge {
    name: String,
    kind: String,
    api_url: String,
    token_file: String,
}

impl ForgeConfig {
    /// Parse a `[[forges]]` table; errors are `(key, message)` pairs.
    pub fn from_value(v: Value, base: &Path) -> Result<ForgeConfig, Vec<(String, String)>> {
        let raw: RawForge = crate::schema::read(v)?;
        let kind = Kind::parse(&raw.kind).ok_or_else(|| {
            vec![(
                "kind".to_string(),
                format!("`{}` is not one of {}", raw.kind, Kind::NAMES),
            )]
        })?;
        let api_url = raw.api_url.trim_end_matches('/').to_string();
        if !(api_url.starts_with("https://") || api_url.starts_with("http://")) {
            return Err(vec![(
                "api_url".to_string(),
                format!("`{api_url}` is not an http(s) URL"),
            )]);
        }
        Ok(ForgeConfig {
            name: raw.name,
            kind,
            api_url,
            token: SecretRef::parse(&raw.token_file, base),
        })
    }
}

/// The forge's word for a state.
trait OnForge {
    fn on(self, kind: Kind) -> &'static str;
}

impl OnForge for State {
    fn on(self, kind: Kind) -> &'static str {
        match (self, kind) {
            (State::Pending, _) => "pending",
            (State::Success, _) => "success",
            (State::Failure, Kind::GitLab) | (State::Error, Kind::GitLab) => "failed",
            (State::Failure, _) => "failure",
            (State::Error, _) => "error",
        }
    }
}

/// One status to set.
#[derive(Debug, Clone)]
pub struct Status<'a> {
    /// `owner/name` (GitLab: the project path).
    pub repo: &'a str,
    pub sha: &'a str,
    pub context: &'a str,
    pub state: State,
    pub description: &'a str,
    pub target_url: Option<&'a str>,
}

/// The longest description every forge takes (GitHub cuts at 140).
const DESCRIPTION_MAX: usize = 140;

impl ForgeConfig {
    /// Set `s` on the forge. A failure names the forge and the answer,
    /// never the token.
    pub async fn send(&self, http: &reqwest::Client, s: &Status<'_>) -> Result<(), SendError> {
        let token = self
            .token
            .load()
            .map_err(|e| SendError(format!("forge `{}`: {e}", self.name)))?;
        let description = bounded(s.description, DESCRIPTION_MAX);
        let mut body = json!({
            "state": s.state.on(self.kind),
            "description": description,
        });
        if let Some(u) = s.target_url {
            body["target_url"] = u.into();
        }
        let enc = |p: &str| -> String { form_urlencoded::byte_serialize(p.as_bytes()).collect() };
        let sha = enc(s.sha);
        let req = match self.kind {
            Kind::GitHub => {
                body["context"] = s.context.into();
                http.post(format!("{}/repos/{}/statuses/{sha}", self.api_url, s.repo))
                    .bearer_auth(&token)
                    .header("Accept", "application/vnd.github+json")
            }
            Kind::Gitea | Kind::Forgejo => {
                body["context"] = s.context.into();
                http.post(format!(
                    "{}/api/v1/repos/{}/statuses/{sha}",
                    self.api_url, s.repo
                ))
                .header("Authorization", format!("token {token}"))
            }
            Kind::GitLab => {
                body["name"] = s.context.into();
                http.post(format!(
                    "{}/api/v4/projects/{}/statuses/{sha}",
                    self.api_url,
                    enc(s.repo)
                ))
                .header("PRIVATE-TOKEN", &token)
            }
        };
        let resp =
            req.json(&body).send().await.map_err(|e| {
                SendError(format!("forge `{}`: {}", self.name, SendError::http(e).0))
            })?;
        let code = resp.status();
        if code.is_success() {
            return Ok(());
        }
        let answer = resp.text().await.unwrap_or_default();
        if self.kind == Kind::GitLab
            && code == reqwest::StatusCode::BAD_REQUEST
            && answer.contains("Cannot transition status")
        {
            // Already in this state: a status sent again after a crash.
            return Ok(());
        }
        Err(SendError(format!(
            "forge `{}` answered {code}: {}",
            self.name,
            bounded(answer.trim(), 300)
        )))
    }
}

/// The `owner/name` (GitLab: the whole project path) of a repository URL:
/// `https://host/owner/name(.git)`, `ssh://git@host(:port)/owner/name.git`
/// or `git@host:owner/name.git`. `None` for anything else (a local path).
pub fn repo_of(url: &str) -> Option<String> {
    let rest = if let Some(r) = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .or_else(|| url.strip_prefix("ssh://"))
    {
        let (_, path) = r.split_once('/')?;
        path.to_string()
    } else {
        let (host, path) = url.split_once(':')?;
        if host.contains('/') || !host.contains('@') {
            return None;
        }
        path.to_string()
    };
    let path = rest.trim_end_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path);
    (path.split('/').filter(|s| !s.is_empty()).count() >= 2
        && !path.starts_with('/')
        && !path.contains(".."))
    .then(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repository_paths_from_urls() {
        for (url, want) in [
            ("https://github.com/me/infra.git", Some("me/infra")),
            (
                "https://gitlab.example.net/group/sub/live",
                Some("group/sub/live"),
            ),
            (
                "ssh://git@gitea.example.net:2222/me/infra.git",
                Some("me/infra"),
            ),
            ("git@github.com:me/infra.git", Some("me/infra")),
            ("https://user:tok@github.com/me/infra", Some("me/infra")),
            ("/srv/git/infra.git", None),
            ("file:///srv/git/infra.git", None),
            ("https://github.com/infra", None),
        ] {
            assert_eq!(repo_of(url).as_deref(), want, "{url}");
        }
    }

    #[test]
    fn states_per_forge() {
        assert_eq!(State::Failure.on(Kind::GitLab), "failed");
        assert_eq!(State::Error.on(Kind::GitLab), "failed");
        assert_eq!(State::Error.on(Kind::GitHub), "error");
        assert_eq!(State::Failure.on(Kind::Forgejo), "failure");
    }
}
