//! GitHub: `X-Hub-Signature-256: sha256=<hex>` over the raw body (JSON or
//! form-encoded with the JSON in `payload`), `X-GitHub-Event`,
//! `X-GitHub-Delivery`; `ping` when a hook is created; `pull_request`
//! (`opened`, `synchronize`, `reopened`, `closed`).

use axum::http::HeaderMap;

use super::{
    Delivery, Event, HookError, form_payload, header, is_form, parse_json, parse_push, read_pull,
    read_push, verify_hub_signature,
};

pub(super) fn receive(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Delivery, HookError> {
    verify_hub_signature(secret, headers, body)?;

    let id = header(headers, &["x-github-delivery"]).map(str::to_string);
    let event_name = header(headers, &["x-github-event"])
        .ok_or_else(|| HookError::BadPayload("no X-GitHub-Event header".into()))?;
    let json = if is_form(headers) {
        form_payload(body)?
    } else {
        body.to_vec()
    };
    // A push is read for the few fields it needs; anything else whole.
    let v = if event_name == "push" {
        parse_push(&json)?
    } else {
        parse_json(&json)?
    };
    let event = match event_name {
        "ping" => Event::Ping,
        "push" => read_push(
            &v,
            &[
                "/repository/clone_url",
                "/repository/ssh_url",
                "/repository/html_url",
                "/repository/git_url",
            ],
        )?,
        "pull_request" => read_pull(
            &v,
            &["opened", "synchronize", "reopened"],
            &[
                "/repository/clone_url",
                "/repository/ssh_url",
                "/repository/html_url",
                "/repository/git_url",
            ],
        )?,
        other => Event::Ignored(format!("`{other}` event is not a push")),
    };
    Ok(Delivery { id, event })
}
