//! Shared by the fuzz targets: turn fuzzer bytes into a webhook delivery
//! (headers + body, correctly signed or not) and check what `forge::receive`
//! must always do with it. Panics here are findings.

use driftless::config::ForgeKind;
use driftless::forge::{self, Event, HookError};
use hmac::{Hmac, Mac};
use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::Sha256;

pub const SECRET: &[u8] = b"fuzz-secret";

/// What the first input byte chooses.
pub struct Shape {
    /// Sign with the right key (else: sign with another key).
    pub good_signature: bool,
    /// Send as `application/x-www-form-urlencoded` with the JSON in
    /// `payload` (GitHub, Gitea).
    pub form: bool,
    /// Which of the forge's header spellings to use.
    pub variant: u8,
}

fn hmac_hex(key: &[u8], data: &[u8]) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        unreachable!("HMAC takes keys of any length")
    };
    mac.update(data);
    hex::encode(mac.finalize().into_bytes())
}

fn put(h: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(n), Ok(v)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        h.insert(n, v);
    }
}

/// Split the input into a shape, a JSON document (the fuzzed part) and the
/// body actually sent.
pub fn delivery(forge: ForgeKind, data: &[u8]) -> Option<(Shape, HeaderMap, Vec<u8>, Vec<u8>)> {
    let (&first, json) = data.split_first()?;
    let shape = Shape {
        good_signature: first & 1 == 0,
        form: first & 2 != 0 && matches!(forge, ForgeKind::Github | ForgeKind::Gitea),
        variant: (first >> 2) & 3,
    };
    let json = json.to_vec();
    let body = if shape.form {
        form_urlencoded::Serializer::new(String::new())
            .append_pair("payload", &String::from_utf8_lossy(&json))
            .finish()
            .into_bytes()
    } else {
        json.clone()
    };
    // The bytes the forge signs: the raw body, except that Gitea/Forgejo sign
    // the JSON document even when they send a form.
    let signed: &[u8] = match forge {
        ForgeKind::Gitea | ForgeKind::Forgejo if shape.form => {
            // What the receiver will decode from the form.
            return Some(with_headers(forge, shape, decoded(&body), body));
        }
        _ => &body,
    };
    let signed = signed.to_vec();
    Some(with_headers(forge, shape, signed, body))
}

fn decoded(body: &[u8]) -> Vec<u8> {
    form_urlencoded::parse(body)
        .find(|(k, _)| k == "payload")
        .map(|(_, v)| v.into_owned().into_bytes())
        .unwrap_or_default()
}

fn with_headers(
    forge: ForgeKind,
    shape: Shape,
    signed: Vec<u8>,
    body: Vec<u8>,
) -> (Shape, HeaderMap, Vec<u8>, Vec<u8>) {
    let key: &[u8] = if shape.good_signature {
        SECRET
    } else {
        b"another-key"
    };
    let mac = hmac_hex(key, &signed);
    let mut h = HeaderMap::new();
    if shape.form {
        put(&mut h, "content-type", "application/x-www-form-urlencoded");
    } else {
        put(&mut h, "content-type", "application/json");
    }
    match forge {
        ForgeKind::Github => {
            put(
                &mut h,
                "x-github-event",
                if shape.variant == 3 { "ping" } else { "push" },
            );
            put(&mut h, "x-github-delivery", "d-1");
            put(&mut h, "x-hub-signature-256", &format!("sha256={mac}"));
        }
        ForgeKind::Gitea | ForgeKind::Forgejo => {
            let (event, sig) = match shape.variant {
                0 => ("x-gitea-event", "x-gitea-signature"),
                1 => ("x-forgejo-event", "x-forgejo-signature"),
                2 => ("x-gogs-event", "x-gogs-signature"),
                _ => ("x-github-event", "x-hub-signature-256"),
            };
            put(&mut h, event, "push");
            let value = if sig == "x-hub-signature-256" {
                format!("sha256={mac}")
            } else {
                mac
            };
            put(&mut h, sig, &value);
        }
        ForgeKind::Gitlab => {
            put(&mut h, "x-gitlab-event", "Push Hook");
            let token = String::from_utf8_lossy(key).into_owned();
            put(&mut h, "x-gitlab-token", &token);
        }
        ForgeKind::Generic => {
            put(&mut h, "x-delivery-id", "d-1");
            put(&mut h, "x-hub-signature-256", &format!("sha256={mac}"));
        }
    }
    (shape, h, signed, body)
}

/// Deliver the fuzzed document and check the rules that hold for any input:
/// a wrong signature is always `Unauthorized` (nothing is parsed before the
/// check); a right one is never `Unauthorized`; a push names a branch and a
/// commit; no panic anywhere.
pub fn check(forge: ForgeKind, data: &[u8]) {
    let Some((shape, headers, _signed, body)) = delivery(forge, data) else {
        return;
    };
    let got = forge::receive(forge, SECRET, &headers, &body);
    if !shape.good_signature {
        assert_eq!(
            got,
            Err(HookError::Unauthorized),
            "a wrong signature passed"
        );
        return;
    }
    match got {
        Err(HookError::Unauthorized) => {
            // Only a form body whose `payload` could not be decoded is
            // refused at the signature step (Gitea signs the document).
            assert!(
                shape.form && matches!(forge, ForgeKind::Gitea | ForgeKind::Forgejo),
                "a correctly signed delivery was refused as unauthorized"
            );
        }
        Err(HookError::BadPayload(msg)) => assert!(!msg.is_empty()),
        Ok(d) => {
            if let Event::Push(p) = d.event {
                // A branch push names its branch; a tag push its tag
                // (and no branch).
                match &p.tag {
                    None => assert!(!p.branch.is_empty(), "a push without a branch"),
                    Some(t) => assert!(
                        !t.is_empty() && p.branch.is_empty(),
                        "a tag push without a tag, or with a branch"
                    ),
                }
                assert!(!p.after.is_empty(), "a push without a commit");
                assert!(!p.repo_urls.is_empty(), "a push without a repository");
            }
        }
    }
    // Any extra byte appended after signing must fail the check.
    let mut tampered = body.clone();
    tampered.push(b' ');
    if !(shape.form && matches!(forge, ForgeKind::Gitea | ForgeKind::Forgejo))
        && forge != ForgeKind::Gitlab
    {
        assert_eq!(
            forge::receive(forge, SECRET, &headers, &tampered),
            Err(HookError::Unauthorized),
            "a body changed after signing passed"
        );
    }
}
