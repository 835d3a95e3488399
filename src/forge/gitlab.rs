//! GitLab: `X-Gitlab-Token` carries the shared secret in clear (compared in
//! constant time), `X-Gitlab-Event: Push Hook`, `total_commits_count` (GitLab
//! lists at most 20 commits), and a delivery id in `X-Gitlab-Event-UUID`
//! (or `Idempotency-Key` on newer versions).

use axum::http::HeaderMap;

use super::{Delivery, Event, HookError, header, parse_json, read_push, verify_token};

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
    let v = parse_json(body)?;
    let event = match event_name {
        "Push Hook" => read_push(
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
        "Tag Push Hook" => Event::Ignored("tag push".into()),
        other => Event::Ignored(format!("`{other}` is not a push")),
    };
    Ok(Delivery { id, event })
}
