//! GitLab: `X-Gitlab-Token` carries the shared secret in clear (compared in
//! constant time), `X-Gitlab-Event: Push Hook`, `total_commits_count` (GitLab
//! lists at most 20 commits), and a delivery id in `X-Gitlab-Event-UUID`
//! (or `Idempotency-Key` on newer versions); `Merge Request Hook` for
//! previews.

use axum::http::HeaderMap;

use serde_json::Value;

use super::{
    Delivery, Event, HookError, PullAction, PullParts, header, parse_json, parse_push,
    pull_request, pull_str, read_push, repo_urls, verify_token,
};

pub(super) fn receive(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Delivery, HookError> {
    let token = header(headers, &["x-gitlab-token"]).ok_or(HookError::Unauthorized)?;
    verify_token(secret, token)?;

    let id = header(headers, &["idempotency-key", "x-gitlab-event-uuid"]).map(str::to_string);
    let event_name = header(headers, &["x-gitlab-event"])
        .ok_or_else(|| HookError::BadPayload("no X-Gitlab-Event header".into()))?;
    // A push is read for the few fields it needs; anything else whole.
    let v = if matches!(event_name, "Push Hook" | "Tag Push Hook") {
        parse_push(body)?
    } else {
        parse_json(body)?
    };
    let event = match event_name {
        // A tag push has a push's shape (`ref` under refs/tags/).
        "Push Hook" | "Tag Push Hook" => read_push(
            &v,
            &[
                "/project/git_http_url",
                "/project/git_ssh_url",
                "/project/web_url",
                "/repository/git_http_url",
                "/repository/git_ssh_url",
                "/repository/url",
            ],
        )?,
        "Merge Request Hook" => read_merge_request(&v)?,
        other => Event::Ignored(format!("`{other}` is not a push")),
    };
    Ok(Delivery { id, event })
}

/// A `Merge Request Hook`: `open` and `reopen` preview the head
/// (`object_attributes.last_commit.id`); `update` only when it brought
/// commits (`oldrev` is set: an edit of the title or a label has none);
/// `close` and `merge` end the previews. A fork when the source project is
/// not the target one. GitLab sends no base commit: git finds the merge
/// base.
fn read_merge_request(v: &Value) -> Result<Event, HookError> {
    let o = &v["object_attributes"];
    let action = pull_str(v, "/object_attributes/action")?;
    let new_commits = o["oldrev"].as_str().is_some_and(|s| !s.is_empty());
    let action = match action {
        "open" | "reopen" => PullAction::Preview,
        "update" if new_commits => PullAction::Preview,
        "update" => {
            return Ok(Event::Ignored(
                "merge request update without new commits".into(),
            ));
        }
        "close" | "merge" => PullAction::Close,
        other => return Ok(Event::Ignored(format!("merge request `{other}`"))),
    };
    let from_fork = match (
        o["source_project_id"].as_i64(),
        o["target_project_id"].as_i64(),
    ) {
        (Some(s), Some(t)) => s != t,
        _ => true,
    };
    pull_request(PullParts {
        repo_urls: repo_urls(
            v,
            &[
                "/project/git_http_url",
                "/project/git_ssh_url",
                "/project/web_url",
                "/object_attributes/target/git_http_url",
                "/object_attributes/target/git_ssh_url",
            ],
        ),
        base_branch: pull_str(v, "/object_attributes/target_branch")?,
        number: o["iid"].as_u64(),
        head_sha: pull_str(v, "/object_attributes/last_commit/id")?,
        head_ref: |n| format!("refs/merge-requests/{n}/head"),
        from_fork,
        action,
    })
}
