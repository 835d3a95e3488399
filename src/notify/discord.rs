//! Discord: an execute-webhook POST with one embed (target, commit,
//! result and message). The webhook URL is the credential; it never appears
//! in an error.
//!
//! Facts from Discord's API documentation (discord/discord-api-docs,
//! resources/webhook "Execute Webhook" and resources/message "Embed
//! Limits"): the JSON body takes `content`, `embeds` (up to 10) and
//! `allowed_mentions`; an embed's `title` is at most 256 characters, its
//! `description` 4096, a field's `name` 256 and `value` 1024, all of an
//! embed's text 6000; the answer is 204 without `?wait=true`; a rate limit
//! is 429 with `retry_after` (seconds) in the JSON body.

use serde_json::json;

use super::{Event, EventDoc, SendError};

/// Cut to at most `max` characters (Discord counts characters, not bytes).
fn chars(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let cut: String = s.chars().take(max.saturating_sub(4)).collect();
    format!("{cut} […]")
}

fn color(e: Event) -> u32 {
    match e {
        Event::Failed
        | Event::Blocked
        | Event::StillFailing
        | Event::Unhealthy
        | Event::RolledBack => 0xd03030,
        Event::Recovered | Event::DriftResolved => 0x2ea043,
        Event::PendingApproval | Event::DriftDetected | Event::Superseded => 0xd29922,
        Event::Changed | Event::Test => 0x3b82f6,
    }
}

pub(super) async fn send(
    http: &reqwest::Client,
    url: &str,
    doc: &EventDoc,
) -> Result<(), SendError> {
    let mut fields = vec![
        json!({ "name": "target", "value": chars(&format!("{} ({})", doc.target, doc.backend), 1024), "inline": true }),
        json!({ "name": "event", "value": doc.event.as_str(), "inline": true }),
    ];
    if let Some(sha) = &doc.short_sha {
        let value = match &doc.commit_url {
            Some(u) => format!("[{sha}]({u})"),
            None => sha.clone(),
        };
        fields.push(json!({ "name": "commit", "value": chars(&value, 1024), "inline": true }));
    }
    let mut embed = json!({
        "title": chars(&doc.headline(), 256),
        // Title, fields and description together stay under 6000.
        "description": chars(&doc.message, 3500),
        "color": color(doc.event),
        "fields": fields,
        "timestamp": doc.started_at,
    });
    if let Some(u) = &doc.run_url {
        embed["url"] = u.clone().into();
    }
    let body = json!({
        "content": chars(&format!("driftless: {}", doc.headline()), 2000),
        "embeds": [embed],
        // Nothing in a message may ping anyone.
        "allowed_mentions": { "parse": [] },
    });
    let resp = http
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(SendError::http)?;
    SendError::status(resp).await
}

#[cfg(test)]
mod tests {
    use super::chars;

    #[test]
    fn cut_by_characters() {
        assert_eq!(chars("héllo", 5), "héllo");
        assert_eq!(chars(&"é".repeat(300), 256).chars().count(), 256);
    }
}
