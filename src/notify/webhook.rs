//! Webhook: POST the event document as JSON, with extra headers, and — when a
//! secret is set — `X-Driftless-Signature-256: sha256=<hex HMAC-SHA256 of the
//! body>`, so receivers can verify it the way forge receivers do.

use std::collections::BTreeMap;

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{EventDoc, SendError};

pub(super) async fn send(
    http: &reqwest::Client,
    url: &str,
    headers: &BTreeMap<String, String>,
    secret: Option<String>,
    doc: &EventDoc,
) -> Result<(), SendError> {
    let body = serde_json::to_vec(doc).map_err(|e| SendError::new(e.to_string()))?;
    let mut req = http
        .post(url)
        .header("Content-Type", "application/json")
        .header(
            "User-Agent",
            concat!("driftless/", env!("CARGO_PKG_VERSION")),
        )
        .header("X-Driftless-Event", doc.event.as_str())
        .header("X-Driftless-Delivery", &doc.id);
    for (k, v) in headers {
        req = req.header(k, v);
    }
    if let Some(secret) = secret {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
            .map_err(|e| SendError::new(format!("cannot use secret_file: {e}")))?;
        mac.update(&body);
        req = req.header(
            "X-Driftless-Signature-256",
            format!("sha256={}", hex::encode(mac.finalize().into_bytes())),
        );
    }
    let resp = req.body(body).send().await.map_err(SendError::http)?;
    SendError::status(resp).await
}
