//! API tokens: bearer tokens checked against SHA-256 digests from the config,
//! and scopes (`reconcile:<glob>`, `pause:<glob>`, `approve:<glob>`,
//! `read[:<glob>]`).
//!
//! The config holds digests, never tokens; a presented token is hashed and
//! compared in constant time. This module decides who may do what; it does
//! not know HTTP beyond the header value, nor the queue.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Token;
use crate::glob::glob_match;

/// What a request wants to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Reconcile,
    Pause,
    /// Approve or reject a Nomad deployment of the target.
    Approve,
    /// Start work outside the target's change window.
    Override,
    Read,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Reconcile => "reconcile",
            Verb::Pause => "pause",
            Verb::Approve => "approve",
            Verb::Override => "override",
            Verb::Read => "read",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No token, or not one we know: 401.
    #[error("a valid bearer token is required")]
    Unauthorized,
    /// A known token without the scope: 403.
    #[error("token `{token}` lacks the scope {scope}")]
    Forbidden { token: String, scope: String },
}

/// The hex SHA-256 of a token, as written in `[[tokens]] sha256`.
pub fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token (`dl_` + 64 hex digits) and its digest.
pub fn new_token() -> Result<(String, String), getrandom::Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)?;
    let token = format!("dl_{}", hex::encode(bytes));
    let d = digest(&token);
    Ok((token, d))
}

/// The token in an `Authorization` header value: `Bearer <token>`, or
/// `Basic <base64 of user:token>` (any user name) so a browser can ask for
/// it. The scheme is case-insensitive (RFC 9110).
fn presented(header: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, rest) = header.trim().split_once(' ')?;
    let rest = rest.trim();
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.to_string()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .ok()?;
        let pair = String::from_utf8(raw).ok()?;
        pair.split_once(':')?.1.trim().to_string()
    } else {
        return None;
    };
    (!token.is_empty()).then_some(token)
}

/// Find the token an `Authorization` header value presents.
pub fn authenticate<'a>(tokens: &'a [Token], header: Option<&str>) -> Result<&'a Token, AuthError> {
    let presented = header.and_then(presented).ok_or(AuthError::Unauthorized)?;
    let d = digest(&presented);
    // Compare against every digest so timing says nothing about which matched.
    let mut found = None;
    for t in tokens {
        if bool::from(t.sha256.as_bytes().ct_eq(d.as_bytes())) {
            found = Some(t);
        }
    }
    found.ok_or(AuthError::Unauthorized)
}

/// May `token` read anything at all?
pub fn reads_anything(token: &Token) -> bool {
    token
        .scopes
        .iter()
        .any(|s| s == "read" || s.starts_with("read:"))
}

/// May `token` do `verb` on `target`?
pub fn allows(token: &Token, verb: Verb, target: &str) -> bool {
    token.scopes.iter().any(|s| match s.split_once(':') {
        None => s == verb.as_str() && verb == Verb::Read,
        Some((v, glob)) => v == verb.as_str() && glob_match(glob, target),
    })
}

/// `allows`, as an answer that names the missing scope.
pub fn require(token: &Token, verb: Verb, target: &str) -> Result<(), AuthError> {
    if allows(token, verb, target) {
        Ok(())
    } else {
        Err(AuthError::Forbidden {
            token: token.name.clone(),
            scope: format!("{}:{target}", verb.as_str()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(scopes: &[&str]) -> Token {
        Token {
            name: "ops".into(),
            sha256: digest("secret-token"),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn scopes() {
        let t = token(&["reconcile:web-*", "read"]);
        assert!(allows(&t, Verb::Reconcile, "web-eu"));
        assert!(!allows(&t, Verb::Reconcile, "db"));
        assert!(!allows(&t, Verb::Pause, "web-eu"));
        assert!(allows(&t, Verb::Read, "db"));
        let r = token(&["read:web-*"]);
        assert!(allows(&r, Verb::Read, "web-1"));
        assert!(!allows(&r, Verb::Read, "db"));
    }

    #[test]
    fn bearer_tokens() {
        let tokens = vec![token(&["read"])];
        assert!(authenticate(&tokens, Some("Bearer secret-token")).is_ok());
        for bad in [
            None,
            Some("secret-token"),
            Some("Bearer wrong"),
            Some("Bearer "),
            Some("Basic x"),
            Some("Token secret-token"),
        ] {
            assert_eq!(
                authenticate(&tokens, bad).map(|_| ()),
                Err(AuthError::Unauthorized),
                "{bad:?}"
            );
        }
        let t = authenticate(&tokens, Some("Bearer secret-token")).expect("known token");
        assert_eq!(
            require(t, Verb::Reconcile, "web"),
            Err(AuthError::Forbidden {
                token: "ops".into(),
                scope: "reconcile:web".into()
            })
        );
        assert_eq!(require(t, Verb::Read, "web"), Ok(()));
    }

    #[test]
    fn basic_credentials_carry_the_token_as_password() {
        use base64::Engine as _;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let tokens = vec![token(&["read"])];
        for good in [
            format!("Basic {}", b64("anyone:secret-token")),
            format!("basic {}", b64(":secret-token")),
            "bearer secret-token".to_string(),
        ] {
            assert!(authenticate(&tokens, Some(&good)).is_ok(), "{good}");
        }
        for bad in [
            format!("Basic {}", b64("secret-token")),
            format!("Basic {}", b64("secret-token:wrong")),
            format!("Basic {}", b64("user:")),
            "Basic !!not-base64!!".to_string(),
            format!("Digest {}", b64("user:secret-token")),
        ] {
            assert_eq!(
                authenticate(&tokens, Some(&bad)).map(|_| ()),
                Err(AuthError::Unauthorized),
                "{bad}"
            );
        }
        assert!(reads_anything(&token(&["read:web-*"])));
        assert!(!reads_anything(&token(&["reconcile:*", "approve:*"])));
    }

    #[test]
    fn new_tokens_are_random_and_match_their_digest() {
        let (a, da) = new_token().expect("random");
        let (b, _) = new_token().expect("random");
        assert_ne!(a, b);
        assert_eq!(digest(&a), da);
        assert!(a.starts_with("dl_") && a.len() == 67);
    }
}
