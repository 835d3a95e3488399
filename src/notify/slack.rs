//! Slack: an incoming-webhook POST with `text` and a section block. The URL
//! is the secret; it never appears in an error.

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
    SendError::status(resp).await
}
