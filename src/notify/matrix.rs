//! Matrix: `PUT /_matrix/client/v3/rooms/{room}/send/m.room.message/{txn}`.
//! The transaction id is the notification's id, so a retry of the same
//! notification is recognised by the homeserver and never posts twice.

use serde_json::json;

use super::{EventDoc, MatrixConfig, SendError};

/// Percent-encode a path segment (room ids hold `!` and `:`).
fn segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(super) async fn send(
    http: &reqwest::Client,
    cfg: &MatrixConfig,
    token: &str,
    doc: &EventDoc,
) -> Result<(), SendError> {
    let url = format!(
        "{}/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
        cfg.homeserver.trim_end_matches('/'),
        segment(&cfg.room_id),
        segment(&format!("driftless-{}", doc.id))
    );
    let body = json!({ "msgtype": "m.text", "body": doc.text() });
    let resp = http
        .put(url)
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .map_err(SendError::http)?;
    SendError::status(resp).await
}

#[cfg(test)]
mod tests {
    #[test]
    fn room_ids_are_encoded() {
        assert_eq!(super::segment("!abc:example.net"), "%21abc%3Aexample.net");
        assert_eq!(super::segment("!abc"), "%21abc");
    }
}
