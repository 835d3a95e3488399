//! Slack: an incoming-webhook POST with `text` and a section block (its
//! text kept under the section limit of 3000 characters). The URL is the
//! secret; it never appears in an error. A 400 (`invalid_payload`,
//! `no_text`, `invalid_blocks`) is not retried; a 429 waits for its
//! `Retry-After` (`limit`).

use serde_json::json;

use super::{EventDoc, SendError};

pub(super) async fn send(
    http: &reqwest::Client,
    url: &str,
    doc: &EventDoc,
) -> Result<(), SendError> {
    let text = doc.text();
    let body = json!({
        "text": format!("driftless: {}", doc.headline()),
        "blocks": [
            { "type": "section", "text": { "type": "mrkdwn", "text": format!("*driftless: {}*", doc.headline()) } },
            { "type": "section", "text": { "type": "mrkdwn", "text": format!("```{}```", super::bounded(&text, 2800)) } }
        ]
    });
    let resp = http
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(SendError::http)?;
    // Slack answers a payload it cannot take with 400 and a word
    // (`invalid_payload`, `no_text`, `invalid_blocks`: "Handling errors"
    // of its incoming webhooks): the same message would get the same
    // answer, so it is not sent again.
    let refused = resp.status() == reqwest::StatusCode::BAD_REQUEST;
    match SendError::status(resp).await {
        Err(e) if refused => Err(SendError::permanent(e.message)),
        other => other,
    }
}
