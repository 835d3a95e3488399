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
//!   per sha and context (then 422); a description of at most 140
//!   characters (then 422; see [`Kind::description_limit`] for each forge).
//!   A refusal the forge would repeat is a [`SendError::permanent`].
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
//! And one comment per pull request for its previews, created once and then
//! edited in place; it starts with a hidden marker ([`COMMENT_MARKER`]) that
//! finds it again when its id is not known (a crash between creating it and
//! recording the id, a comment deleted by hand):
//! - GitHub REST "Issue comments" (every pull request is an issue): list
//!   `GET /repos/{owner}/{repo}/issues/{n}/comments` (`per_page` at most
//!   100, `page`), create `POST` there with `body` (201, the comment with
//!   its `id`), edit `PATCH /repos/{owner}/{repo}/issues/comments/{id}`
//!   (200; 404 once deleted). A body is at most 65,536 characters (422).
//! - Gitea and Forgejo (swagger `issueGetComments`, `issueCreateComment`,
//!   `issueEditComment`): the same three under `/api/v1`, the list in one
//!   answer, the edit 200.
//! - GitLab "Notes" on merge requests: list `GET
//!   /projects/{id}/merge_requests/{iid}/notes` (`per_page`, `page`,
//!   `sort`), create `POST` there with `body`, edit `PUT
//!   …/notes/{note_id}`; a note is at most 1,000,000 characters.
//!
//! This module sends; it decides nothing about when.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Value, json};

use super::{SendError, bounded, bounded_chars};
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

    /// The longest comment body the forge takes, in characters.
    pub fn comment_limit(self) -> usize {
        match self {
            Kind::GitLab => 1_000_000,
            // GitHub's documented limit; Gitea and Forgejo store a longer
            // text, but the same bound keeps a comment readable.
            Kind::GitHub | Kind::Gitea | Kind::Forgejo => 65_536,
        }
    }

    /// The longest status description the forge takes, in characters:
    /// - GitHub refuses a longer one with 422 "description is too long
    ///   (maximum is 140 characters)" (the validation error of "Create a
    ///   commit status"), so the status is never set;
    /// - GitLab: 255 ("Short description of the status. Must be 255
    ///   characters or fewer.", `lib/api/commit_statuses.rb` and
    ///   doc/api/commits.md "Set the pipeline status of a commit"; the
    ///   model's validation error is a 400 from
    ///   `Ci::CreateCommitStatusService#unsafe_execute`);
    /// - Gitea and Forgejo keep it in a TEXT column (`models/git/
    ///   commit_status.go`, `Description string \`xorm:"TEXT"\``): no limit.
    pub fn description_limit(self) -> Option<usize> {
        match self {
            Kind::GitHub => Some(140),
            Kind::GitLab => Some(255),
            Kind::Gitea | Kind::Forgejo => None,
        }
    }

    /// The forge's name, as people write it.
    pub fn label(self) -> &'static str {
        match self {
            Kind::GitHub => "GitHub",
            Kind::Gitea => "Gitea",
            Kind::Forgejo => "Forgejo",
            Kind::GitLab => "GitLab",
        }
    }

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
    /// The API root: `https://api.github.com`, a GitHub Enterprise server
    /// `https://github.example.net` (driftless adds `/api/v3`, unless the
    /// URL has a path of its own), `https://gitea.example.net` (driftless
    /// adds `/api/v1`), `https://gitlab.example.net` (`/api/v4`).
    pub api_url: String,
    pub token: SecretRef,
}

/// A `[[forges]]` entry: a forge API commit statuses and pull-request
/// previews go to (docs/forges.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawForge {
    /// The forge's name, as targets' `forge` names it.
    name: String,
    /// Which API it speaks.
    #[schemars(extend("enum" = ["github", "gitea", "forgejo", "gitlab"]))]
    kind: String,
    /// The API root: `https://api.github.com`, a GitHub Enterprise server,
    /// or a Gitea, Forgejo or GitLab server's URL.
    api_url: String,
    /// The API token: a file or `env:NAME`.
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
        let mut api_url = raw.api_url.trim_end_matches('/').to_string();
        let Some((_, rest)) = api_url
            .split_once("://")
            .filter(|(scheme, _)| matches!(*scheme, "https" | "http"))
        else {
            return Err(vec![(
                "api_url".to_string(),
                format!("`{api_url}` is not an http(s) URL"),
            )]);
        };
        // GitHub Enterprise Server serves its REST API under /api/v3 of the
        // server ("REST API endpoints": `http(s)://HOSTNAME/api/v3`); github.com
        // at api.github.com. A server's bare URL gets the prefix, as Gitea's
        // and GitLab's get theirs.
        if kind == Kind::GitHub && !rest.contains('/') && rest != "api.github.com" {
            api_url.push_str("/api/v3");
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
    /// The branch or head ref the commit is on (sent to GitLab as `ref`).
    pub git_ref: Option<&'a str>,
}

/// The first line of driftless's comment on a pull request: hidden when
/// rendered, and how the comment is found again.
pub const COMMENT_MARKER: &str = "<!-- driftless:preview -->";

/// Pages of comments read when looking for the marker (100 a page).
const COMMENT_PAGES: u32 = 20;

fn enc(p: &str) -> String {
    form_urlencoded::byte_serialize(p.as_bytes()).collect()
}

impl ForgeConfig {
    /// The destination a rate limit is counted against: the API host and
    /// the token ([`super::limit::destination`]), and its name in words.
    pub fn destination(&self) -> Result<(String, String), SendError> {
        let token = self
            .token
            .load()
            .map_err(|e| SendError::new(format!("forge `{}`: {e}", self.name)))?;
        let key = super::limit::destination(&self.api_url, &token);
        let host = key.split('/').next().unwrap_or("").to_string();
        Ok((key, format!("forge `{}` ({host})", self.name)))
    }

    /// Set `s` on the forge. A failure names the forge and the answer,
    /// never the token.
    pub async fn send(&self, http: &reqwest::Client, s: &Status<'_>) -> Result<(), SendError> {
        let token = self
            .token
            .load()
            .map_err(|e| SendError::new(format!("forge `{}`: {e}", self.name)))?;
        let description = match self.kind.description_limit() {
            Some(max) => bounded_chars(s.description, max),
            None => s.description.to_string(),
        };
        let mut body = json!({
            "state": s.state.on(self.kind),
            "description": description,
        });
        if let Some(u) = s.target_url {
            body["target_url"] = u.into();
        }
        let sha = enc(s.sha);
        let url = match self.kind {
            Kind::GitHub => {
                body["context"] = s.context.into();
                format!("{}/repos/{}/statuses/{sha}", self.api_url, s.repo)
            }
            Kind::Gitea | Kind::Forgejo => {
                body["context"] = s.context.into();
                format!("{}/api/v1/repos/{}/statuses/{sha}", self.api_url, s.repo)
            }
            Kind::GitLab => {
                body["name"] = s.context.into();
                // Without it GitLab refuses a commit no branch contains
                // (404 "References for commit Not Found": a fork's merge
                // request, a force-pushed head) and finds the pending
                // status to update by name and ref
                // (Ci::CreateCommitStatusService#ref, #external_commit_status_scope).
                if let Some(r) = s.git_ref {
                    body["ref"] = r.into();
                }
                format!(
                    "{}/api/v4/projects/{}/statuses/{sha}",
                    self.api_url,
                    enc(s.repo)
                )
            }
        };
        let resp = self.call(http.post(url), &token, Some(&body)).await?;
        let code = resp.status();
        if code.is_success() {
            return Ok(());
        }
        let spent = ratelimit_spent(&resp);
        let headers = resp.headers().clone();
        let answer = resp.text().await.unwrap_or_default();
        if let Some(wait) = super::limit::of_answer(code.as_u16(), &headers, &answer) {
            return Err(SendError::limited(
                format!(
                    "forge `{}` answered {code}: {}",
                    self.name,
                    bounded(answer.trim(), 300)
                ),
                wait,
            ));
        }
        if self.kind == Kind::GitLab
            && code == reqwest::StatusCode::BAD_REQUEST
            && answer.contains("Cannot transition status")
        {
            // Already in this state: a status sent again after a crash.
            return Ok(());
        }
        let message = format!(
            "forge `{}` answered {code}: {}",
            self.name,
            bounded(answer.trim(), 300)
        );
        Err(if refused_for_good(self.kind, code, spent, &answer) {
            SendError::permanent(message)
        } else {
            SendError::new(message)
        })
    }
}

/// GitHub's sign that its primary rate limit is spent.
fn ratelimit_spent(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get("x-ratelimit-remaining")
        .is_some_and(|v| v.as_bytes() == b"0")
}

/// Whether the forge refused this request in a way it would repeat: a
/// validation error (GitHub and Gitea/Forgejo 422; GitLab 400, its
/// validation answer — the repeated-state 400 is handled before) or a
/// GitHub 403 that is not a rate limit (GitHub REST "Rate limits": a spent
/// primary limit is 403 or 429 with `x-ratelimit-remaining: 0`, a
/// secondary one names "secondary rate limit" in its message; both pass
/// with time). Anything else — 5xx, 408, 409 (GitLab's "Another update to
/// this commit status is in progress"), 429, a token that may be fixed
/// (401, 404) — is worth trying again.
fn refused_for_good(kind: Kind, code: reqwest::StatusCode, spent: bool, answer: &str) -> bool {
    match code.as_u16() {
        422 => true,
        400 => kind == Kind::GitLab,
        403 => {
            kind == Kind::GitHub && !spent && !answer.to_ascii_lowercase().contains("rate limit")
        }
        _ => false,
    }
}

impl ForgeConfig {
    /// `req` with this forge's auth header (and `body` as JSON), sent; a
    /// failure to reach the forge names it, never the token.
    async fn call(
        &self,
        req: reqwest::RequestBuilder,
        token: &str,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, SendError> {
        let req = match self.kind {
            Kind::GitHub => req
                .bearer_auth(token)
                .header("Accept", "application/vnd.github+json"),
            Kind::Gitea | Kind::Forgejo => req.header("Authorization", format!("token {token}")),
            Kind::GitLab => req.header("PRIVATE-TOKEN", token),
        };
        let req = match body {
            Some(b) => req.json(b),
            None => req,
        };
        req.send().await.map_err(|e| {
            SendError::new(format!(
                "forge `{}`: {}",
                self.name,
                SendError::http(e).message
            ))
        })
    }

    /// A refusal, in words that name the forge and what it said.
    async fn refused(&self, what: &str, resp: reqwest::Response) -> SendError {
        let code = resp.status();
        let spent = ratelimit_spent(&resp);
        let headers = resp.headers().clone();
        let answer = resp.text().await.unwrap_or_default();
        let message = format!(
            "forge `{}` answered {code} to {what}: {}",
            self.name,
            bounded(answer.trim(), 300)
        );
        if let Some(wait) = super::limit::of_answer(code.as_u16(), &headers, &answer) {
            SendError::limited(message, wait)
        } else if refused_for_good(self.kind, code, spent, &answer) {
            SendError::permanent(message)
        } else {
            SendError::new(message)
        }
    }

    /// The API path of pull request `number`'s comments (GitLab: notes).
    fn comments_url(&self, repo: &str, number: i64) -> String {
        match self.kind {
            Kind::GitHub => format!("{}/repos/{repo}/issues/{number}/comments", self.api_url),
            Kind::Gitea | Kind::Forgejo => {
                format!(
                    "{}/api/v1/repos/{repo}/issues/{number}/comments",
                    self.api_url
                )
            }
            Kind::GitLab => format!(
                "{}/api/v4/projects/{}/merge_requests/{number}/notes",
                self.api_url,
                enc(repo)
            ),
        }
    }

    /// The API path of one comment, to edit it.
    fn comment_url(&self, repo: &str, number: i64, id: &str) -> String {
        let id = enc(id);
        match self.kind {
            Kind::GitHub => format!("{}/repos/{repo}/issues/comments/{id}", self.api_url),
            Kind::Gitea | Kind::Forgejo => {
                format!("{}/api/v1/repos/{repo}/issues/comments/{id}", self.api_url)
            }
            Kind::GitLab => format!("{}/{id}", self.comments_url(repo, number)),
        }
    }

    /// The id of the comment on pull request `number` that starts with
    /// [`COMMENT_MARKER`], if there is one.
    async fn find_comment(
        &self,
        http: &reqwest::Client,
        token: &str,
        repo: &str,
        number: i64,
    ) -> Result<Option<String>, SendError> {
        let url = self.comments_url(repo, number);
        let paged = self.kind != Kind::Gitea && self.kind != Kind::Forgejo;
        for page in 1..=COMMENT_PAGES {
            let req = match self.kind {
                Kind::GitHub => http.get(format!("{url}?per_page=100&page={page}")),
                Kind::GitLab => http.get(format!("{url}?per_page=100&page={page}&sort=asc")),
                Kind::Gitea | Kind::Forgejo => http.get(&url),
            };
            let resp = self.call(req, token, None).await?;
            if !resp.status().is_success() {
                return Err(self
                    .refused("listing the pull request's comments", resp)
                    .await);
            }
            let list: Vec<Value> = resp.json().await.map_err(|e| {
                SendError::new(format!(
                    "forge `{}` sent a comment list that is not JSON: {e}",
                    self.name
                ))
            })?;
            if let Some(c) = list.iter().find(|c| {
                c["body"]
                    .as_str()
                    .is_some_and(|b| b.starts_with(COMMENT_MARKER))
            }) {
                return Ok(comment_id(c));
            }
            if !paged || list.len() < 100 {
                break;
            }
        }
        Ok(None)
    }

    /// Put `body` on pull request `number` of `repo` as driftless's one
    /// comment: edit comment `known` if it is still there, else the one
    /// the marker finds, else create it. Returns the comment's id.
    pub async fn upsert_comment(
        &self,
        http: &reqwest::Client,
        repo: &str,
        number: i64,
        known: Option<&str>,
        body: &str,
    ) -> Result<String, SendError> {
        let token = self
            .token
            .load()
            .map_err(|e| SendError::new(format!("forge `{}`: {e}", self.name)))?;
        let doc = json!({ "body": body });
        let existing = match known {
            Some(id) => Some(id.to_string()),
            None => self.find_comment(http, &token, repo, number).await?,
        };
        if let Some(id) = existing {
            let url = self.comment_url(repo, number, &id);
            let req = match self.kind {
                Kind::GitLab => http.put(url),
                _ => http.patch(url),
            };
            let resp = self.call(req, &token, Some(&doc)).await?;
            if resp.status().is_success() {
                return Ok(id);
            }
            if resp.status() != reqwest::StatusCode::NOT_FOUND {
                return Err(self.refused("editing the preview comment", resp).await);
            }
            // Deleted by hand: look again (a known id), else write a new one.
            if known.is_some()
                && let Some(found) = self.find_comment(http, &token, repo, number).await?
                && found != id
            {
                return Box::pin(self.upsert_comment(http, repo, number, Some(&found), body)).await;
            }
        }
        let resp = self
            .call(
                http.post(self.comments_url(repo, number)),
                &token,
                Some(&doc),
            )
            .await?;
        if !resp.status().is_success() {
            return Err(self.refused("creating the preview comment", resp).await);
        }
        let created: Value = resp.json().await.map_err(|e| {
            SendError::new(format!(
                "forge `{}` created the comment but its answer is not JSON: {e}",
                self.name
            ))
        })?;
        comment_id(&created).ok_or_else(|| {
            SendError::new(format!(
                "forge `{}` created the comment but gave no `id`",
                self.name
            ))
        })
    }
}

/// A comment's `id` (a number on every forge), as text.
fn comment_id(c: &Value) -> Option<String> {
    match &c["id"] {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
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
    fn a_github_enterprise_server_url_gets_its_api_root() {
        let parse = |url: &str| {
            let v = serde_json::json!({
                "name": "f", "kind": "github", "api_url": url, "token_file": "env:T"
            });
            ForgeConfig::from_value(v, Path::new("/")).map(|f| f.api_url)
        };
        assert_eq!(
            parse("https://api.github.com/").as_deref(),
            Ok("https://api.github.com")
        );
        assert_eq!(
            parse("https://github.example.net").as_deref(),
            Ok("https://github.example.net/api/v3")
        );
        assert_eq!(
            parse("https://github.example.net/api/v3/").as_deref(),
            Ok("https://github.example.net/api/v3")
        );
        assert!(parse("ftp://github.example.net").is_err());
    }

    #[test]
    fn states_per_forge() {
        assert_eq!(State::Failure.on(Kind::GitLab), "failed");
        assert_eq!(State::Error.on(Kind::GitLab), "failed");
        assert_eq!(State::Error.on(Kind::GitHub), "error");
        assert_eq!(State::Failure.on(Kind::Forgejo), "failure");
    }
}
