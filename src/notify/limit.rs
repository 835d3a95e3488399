//! Rate limits as each service answers them, and what a destination is.
//!
//! A destination is an API host and the credential used there: what a
//! service counts a rate limit against. Its name here is the host and a
//! digest of the credential (never the credential). A rate-limited answer
//! pauses every send to its destination until the time the service named
//! (`store::limits`); this module only reads answers and names
//! destinations, it pauses nothing.
//!
//! The answers, from each service's documentation:
//! - GitHub REST ("Rate limits for the REST API"): a spent primary limit is
//!   403 or 429 with `x-ratelimit-remaining: 0` and `x-ratelimit-reset`
//!   (epoch seconds); a secondary limit is 403 or 429 whose message names
//!   a "secondary rate limit", with `retry-after` (seconds) when GitHub
//!   gives one — without it, wait at least a minute, longer each time.
//! - GitLab ("Rate limits"): 429 with `Retry-After` (seconds) and
//!   `RateLimit-Reset` (epoch seconds).
//! - Gitea and Forgejo: 429 (`Retry-After` when set).
//! - Slack incoming webhooks ("Rate limits"): 429 with `Retry-After`.
//! - Discord ("Rate Limits"): 429 with `Retry-After` (seconds; the body's
//!   `retry_after` has been milliseconds on unversioned webhook URLs, so
//!   the header is what counts).
//! - ntfy: 429 (error 42901..42909), no time.
//! - Matrix client-server API: 429 `M_LIMIT_EXCEEDED` with
//!   `retry_after_ms` in the body.

use std::time::Duration;

/// A limit that names no time pauses this long, doubling per limit in a
/// row.
pub const FIRST: Duration = Duration::from_secs(60);
/// No pause is longer (GitHub's primary limit resets within the hour).
pub const MOST: Duration = Duration::from_secs(3600);

/// Whether an answer is a rate limit: `None` if not, `Some(None)` for one
/// that names no time, `Some(Some(wait))` for one that does.
pub fn of_answer(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    body: &str,
) -> Option<Option<Duration>> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let spent = header("x-ratelimit-remaining") == Some("0");
    let secondary = body.to_ascii_lowercase().contains("secondary rate limit");
    let matrix: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let matrix_limit = matrix
        .as_ref()
        .is_some_and(|v| v["errcode"] == "M_LIMIT_EXCEEDED");
    let limited = status == 429 || (status == 403 && (spent || secondary)) || matrix_limit;
    if !limited {
        return None;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let until_epoch = |v: Option<&str>| {
        v.and_then(|s| s.parse::<u64>().ok())
            .map(|at| Duration::from_secs(at.saturating_sub(now)))
    };
    let wait = header("retry-after")
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs)
        .or_else(|| {
            matrix
                .as_ref()
                .and_then(|v| v["retry_after_ms"].as_u64())
                .map(Duration::from_millis)
        })
        .or_else(|| {
            spent
                .then(|| until_epoch(header("x-ratelimit-reset")))
                .flatten()
        })
        .or_else(|| until_epoch(header("ratelimit-reset")));
    Some(wait)
}

/// The destination `url`'s host and `credential` make: `host/digest`.
pub fn destination(url: &str, credential: &str) -> String {
    use sha2::{Digest, Sha256};
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?', '#'])
        .next()
        .unwrap_or("")
        .rsplit('@')
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    let digest = hex::encode(Sha256::digest(credential.as_bytes()));
    format!("{host}/{}", &digest[..16])
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::{HeaderMap, HeaderValue};

    fn headers(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    fn now() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs()
    }

    /// Each service's shape of "come back later", and what is not one.
    #[test]
    fn each_services_rate_limit_answer() {
        let reset = now() + 1800;
        // GitHub's primary limit: 403 (or 429), remaining 0, a reset time.
        let h = headers(&[
            ("x-ratelimit-remaining", "0".into()),
            ("x-ratelimit-reset", reset.to_string()),
        ]);
        let w = of_answer(403, &h, r#"{"message":"API rate limit exceeded"}"#);
        assert!(
            matches!(w, Some(Some(d)) if (1790..=1800).contains(&d.as_secs())),
            "{w:?}"
        );
        assert!(matches!(of_answer(429, &h, ""), Some(Some(_))));
        // GitHub's secondary limit, with and without retry-after.
        let body = r#"{"message":"You have exceeded a secondary rate limit"}"#;
        let h = headers(&[("retry-after", "90".into())]);
        assert_eq!(
            of_answer(403, &h, body),
            Some(Some(Duration::from_secs(90)))
        );
        assert_eq!(of_answer(403, &HeaderMap::new(), body), Some(None));
        // Any other 403 is not a limit (a token without the permission).
        let h = headers(&[("x-ratelimit-remaining", "4999".into())]);
        assert_eq!(
            of_answer(403, &h, r#"{"message":"Resource not accessible"}"#),
            None
        );
        // GitLab: 429 with RateLimit-Reset (and Retry-After first).
        let h = headers(&[("ratelimit-reset", (now() + 60).to_string())]);
        assert!(matches!(of_answer(429, &h, ""), Some(Some(d)) if d.as_secs() <= 60));
        // Slack, Discord: Retry-After.
        let h = headers(&[("retry-after", "7".into())]);
        assert_eq!(
            of_answer(429, &h, r#"{"retry_after": 7000}"#),
            Some(Some(Duration::from_secs(7)))
        );
        // ntfy: 429, no time.
        assert_eq!(
            of_answer(429, &HeaderMap::new(), r#"{"code":42901}"#),
            Some(None)
        );
        // Matrix: M_LIMIT_EXCEEDED with retry_after_ms.
        assert_eq!(
            of_answer(
                429,
                &HeaderMap::new(),
                r#"{"errcode":"M_LIMIT_EXCEEDED","error":"Too Many Requests","retry_after_ms":2500}"#
            ),
            Some(Some(Duration::from_millis(2500)))
        );
        assert_eq!(of_answer(500, &HeaderMap::new(), "oops"), None);
        assert_eq!(of_answer(422, &HeaderMap::new(), "{}"), None);
    }

    #[test]
    fn a_destination_is_the_host_and_a_digest_of_the_credential() {
        let a = destination("https://api.github.com", "tok-1");
        assert!(a.starts_with("api.github.com/"), "{a}");
        assert!(!a.contains("tok-1"));
        assert_ne!(a, destination("https://api.github.com", "tok-2"));
        assert_eq!(
            destination("https://hooks.slack.com/services/T/B/x", "u"),
            destination("https://HOOKS.slack.com/other", "u")
        );
        assert!(
            destination("https://user:pw@example.net:8448/x", "c").starts_with("example.net:8448/")
        );
    }
}
