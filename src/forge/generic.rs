//! Generic senders (scripts, other CI): `X-Hub-Signature-256: sha256=<hex>`
//! over the raw body, a body `{"repo": ..., "ref": ..., "after": ...}` and an
//! optional `X-Delivery-Id`. No commit list: every target on the branch ticks.

use axum::http::HeaderMap;

use super::{Delivery, HookError, header, parse_push, read_push, verify_hub_signature};

pub(super) fn receive(
    secret: &[u8],
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Delivery, HookError> {
    verify_hub_signature(secret, headers, body)?;

    let id = header(headers, &["x-delivery-id", "x-github-delivery"]).map(str::to_string);
    let v = parse_push(body)?;
    if !v["after"].is_string() {
        return Err(HookError::BadPayload(
            "body needs \"repo\", \"ref\" and \"after\" strings".into(),
        ));
    }
    let event = read_push(&v, &["/repo"])?;
    Ok(Delivery { id, event })
}
