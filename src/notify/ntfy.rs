//! ntfy: one message per event, published as JSON to the server's root
//! (ntfy's "publish as JSON": `topic`, `title`, `message`, `priority` 1–5,
//! `tags`, `click`), so titles and messages may be any UTF-8. The topic URL
//! can be the credential on a public server, and an access token goes in
//! `Authorization: Bearer`; neither ever appears in an error.
//!
//! Facts from ntfy's own source (binwiederhier/ntfy): a message is at most
//! 4096 bytes (`server/config.go`, `DefaultMessageSizeLimit`; a longer body
//! would become an attachment, which a server may refuse), so the message
//! is cut below that; errors are JSON `{code, http, error, link}`
//! (`server/errors.go`: 40007 invalid priority, 40101 unauthorized, 40301
//! forbidden, 42901 too many requests).

use serde_json::json;

use super::{Event, EventDoc, SendError, bounded};

/// The longest message ntfy takes as a message, not an attachment.
const MESSAGE_MAX: usize = 4000;

/// A priority by name or number (ntfy's `min`=1 … `max`/`urgent`=5).
pub fn priority(s: &str) -> Option<u8> {
    Some(match s {
        "1" | "min" => 1,
        "2" | "low" => 2,
        "3" | "default" => 3,
        "4" | "high" => 4,
        "5" | "max" | "urgent" => 5,
        _ => return None,
    })
}

/// What an event is sent with unless `priority` says otherwise.
pub fn default_priority(e: Event) -> u8 {
    match e {
        Event::Failed
        | Event::Blocked
        | Event::StillFailing
        | Event::PendingApproval
        | Event::DriftDetected => 4,
        _ => 3,
    }
}

/// `https://host[:port]/topic` → (`https://host[:port]`, `topic`).
pub fn split_topic_url(url: &str) -> Option<(String, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (host, topic) = rest.trim_end_matches('/').split_once('/')?;
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    (!host.is_empty() && !topic.is_empty() && topic.len() <= 64 && topic.chars().all(ok))
        .then(|| (format!("{scheme}://{host}"), topic.to_string()))
}

pub(super) async fn send(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    priority: u8,
    tags: &[String],
    doc: &EventDoc,
) -> Result<(), SendError> {
    let (base, topic) = split_topic_url(url)
        .ok_or_else(|| SendError::new("the topic URL is not https://host/topic"))?;
    let mut body = json!({
        "topic": topic,
        "title": format!("driftless: {}", doc.headline()),
        "message": bounded(&doc.text(), MESSAGE_MAX),
        "priority": priority,
        "tags": tags,
    });
    if let Some(u) = doc.run_url.as_ref().or(doc.commit_url.as_ref()) {
        body["click"] = u.clone().into();
    }
    let mut req = http.post(format!("{base}/")).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.map_err(SendError::http)?;
    SendError::status(resp).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_urls_and_priorities() {
        assert_eq!(
            split_topic_url("https://ntfy.sh/driftless-ops"),
            Some(("https://ntfy.sh".into(), "driftless-ops".into()))
        );
        assert_eq!(
            split_topic_url("http://127.0.0.1:8080/t_1/"),
            Some(("http://127.0.0.1:8080".into(), "t_1".into()))
        );
        assert_eq!(split_topic_url("https://ntfy.sh/"), None);
        assert_eq!(split_topic_url("https://ntfy.sh/a/b"), None);
        assert_eq!(priority("urgent"), Some(5));
        assert_eq!(priority("6"), None);
    }
}
