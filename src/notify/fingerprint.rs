//! When are two failure messages "the same failure"?
//!
//! A failing target is notified again when its message changes. Tools put
//! things in their errors that change on every attempt — timestamps,
//! durations, lock and request UUIDs, container ids, temp file names — and
//! comparing raw text would mail the owners on every tick of an unchanged
//! failure. [`normalise`] replaces those volatile parts with placeholders;
//! messages are the same failure when their normal forms are equal. It only
//! compares: the stored and sent message is always the real one.

use std::sync::LazyLock;

use regex_lite::Regex;

/// Volatile parts of a message, in the order they are replaced, each with
/// its placeholder. Earlier patterns win (a UUID is not read as hex runs).
static VOLATILE: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        // 123e4567-e89b-12d3-a456-426614174000
        (
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
            "<id>",
        ),
        // 2026-11-29T23:22:49.123Z, 2026-11-29 23:22:49 +0000 UTC, 2026-11-29
        (
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?(?:Z|\s?[+-]\d{2}:?\d{2})?(?:\s?UTC)?",
            "<time>",
        ),
        // 23:22:49, 23:22:49.123
        (r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b", "<time>"),
        // Unix time in seconds or milliseconds (2001 to 2286)
        (r"\b1\d{9}(?:\d{3})?\b", "<time>"),
        // 1.5s, 250ms, 3m20s, 1h0m0s, 12µs
        (
            r"\b(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h))+\b",
            "<duration>",
        ),
        // tempfile / mktemp names: .tmpAb12Cd, tmp.XXXXXXXXXX
        (r"\.tmp[0-9A-Za-z]{6,}|\btmp\.[0-9A-Za-z]{6,}", "<tmp>"),
    ]
    .into_iter()
    .map(|(re, with)| {
        // The patterns are constants: a failure here is a bug caught by the
        // unit tests below, not input.
        (Regex::new(re).expect("constant pattern"), with)
    })
    .collect()
});

/// Container ids, object hashes, request ids: 12 or more hex digits. Only
/// runs with a digit in them count, so words like `deadbeefcafe` stay.
static HEX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b[0-9a-f]{12,}\b").expect("constant pattern"));

/// `msg` with its volatile parts replaced by placeholders.
pub fn normalise(msg: &str) -> String {
    let mut out = msg.to_string();
    for (re, with) in VOLATILE.iter() {
        out = re.replace_all(&out, *with).into_owned();
    }
    HEX.replace_all(&out, |c: &regex_lite::Captures<'_>| {
        let m = &c[0];
        if m.bytes().any(|b| b.is_ascii_digit()) {
            "<hex>".to_string()
        } else {
            m.to_string()
        }
    })
    .into_owned()
}

/// Are `a` and `b` the same failure, volatile parts aside?
pub fn same_failure(a: &str, b: &str) -> bool {
    a == b || normalise(a) == normalise(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn volatile_parts_do_not_make_a_new_failure() {
        for (a, b) in [
            (
                "Error acquiring the state lock: ID: 0f1c3a52-6b7e-4c1d-9a6e-1f2b3c4d5e6f Created: 2026-11-29 23:22:49.123456 +0000 UTC",
                "Error acquiring the state lock: ID: 9d8e7f60-1a2b-4c3d-8e9f-a0b1c2d3e4f5 Created: 2026-11-30 01:02:03.000001 +0000 UTC",
            ),
            (
                "[2026-11-29T23:22:49Z] deploy failed after 1.52s",
                "[2026-11-29T23:25:10Z] deploy failed after 12.3s",
            ),
            (
                "timed out at 23:22:49 (3m20s)",
                "timed out at 00:01:02 (3m21s)",
            ),
            (
                "container 3f2a9c1b7d4e8f60 exited (1)",
                "container a1b2c3d4e5f60718 exited (1)",
            ),
            (
                "cannot open /tmp/.tmpAb12Cd/plan",
                "cannot open /tmp/.tmpZz98Yx/plan",
            ),
            ("at 1764458569123: refused", "at 1764458600001: refused"),
        ] {
            assert!(
                same_failure(a, b),
                "{a}\n{b}\n{}\n{}",
                normalise(a),
                normalise(b)
            );
        }
    }

    #[test]
    fn a_different_failure_is_different() {
        for (a, b) in [
            ("exit status 1", "exit status 2"),
            (
                "connection refused: 127.0.0.1:8080",
                "connection refused: 127.0.0.1:8081",
            ),
            ("image nginx:1.25 not found", "image nginx:1.27 not found"),
            ("error on line 12", "error on line 13"),
            (
                "resource aws_s3_bucket.logs failed",
                "resource aws_s3_bucket.data failed",
            ),
            ("Job \"web\" is invalid", "Job \"api\" is invalid"),
        ] {
            assert!(!same_failure(a, b), "{a} == {b}: {}", normalise(a));
        }
    }

    #[test]
    fn words_survive_normalising() {
        assert_eq!(
            normalise("cafe deadbeefcafe facade: failed in 2s"),
            "cafe deadbeefcafe facade: failed in <duration>"
        );
    }
}
