//! Gitea and Forgejo: `X-Forgejo-*` / `X-Gitea-*` headers (they also send
//! Gogs and GitHub ones: the most specific wins), a bare-hex HMAC-SHA256
//! signature — over the JSON *inside* `payload` when the delivery is
//! form-encoded — and `total_commits`, which says when the listed commits
//! (5 by default) are not all of them.

use axum::http::HeaderMap;

use super::{
    Delivery, Event, HookError, form_payload, header, is_form, parse_json, parse_push, read_pull,
    read_push, verify_hex_hmac, verify_hub_signature,
};

pub(super) fn receive(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Delivery, HookError> {
    // What is signed: the JSON document, whichever way it was sent.
    let signed = if is_form(headers) {
        form_payload(body).map_err(|_| HookError::Unauthorized)?
    } else {
        body.to_vec()
    };
    let bare = header(
        headers,
        &[
            "x-forgejo-signature",
            "x-gitea-signature",
            "x-gogs-signature",
        ],
    );
    match bare {
        Some(hex_sig) => verify_hex_hmac(secret, &signed, hex_sig)?,
        None => verify_hub_signature(secret, headers, &signed)?,
    }

    let id = header(
        headers,
        &[
            "x-forgejo-delivery",
            "x-gitea-delivery",
            "x-gogs-delivery",
            "x-github-delivery",
        ],
    )
    .map(str::to_string);
    let event_name = header(
        headers,
        &[
            "x-forgejo-event",
            "x-gitea-event",
            "x-gogs-event",
            "x-github-event",
        ],
    )
    .ok_or_else(|| HookError::BadPayload("no X-Forgejo-Event or X-Gitea-Event header".into()))?;
    // A push is read for the few fields it needs; anything else whole.
    let v = if event_name == "push" {
        parse_push(&signed)?
    } else {
        parse_json(&signed)?
    };
    let event = match event_name {
        "push" => read_push(
            &v,
            &[
                "/repository/clone_url",
                "/repository/ssh_url",
                "/repository/html_url",
            ],
        )?,
        // Gitea spells it `synchronized`.
        "pull_request" => read_pull(
            &v,
            &["opened", "synchronized", "reopened"],
            &[
                "/repository/clone_url",
                "/repository/ssh_url",
                "/repository/html_url",
            ],
        )?,
        other => Event::Ignored(format!("`{other}` event is not a push")),
    };
    Ok(Delivery { id, event })
}
