//! What a plan is made from, beside its commit: the resolved inputs (as
//! recorded: a sensitive one's keyed digest, never its value), the
//! decrypted SOPS values (a keyed digest) and the backend table in force
//! (a digest). A plan a person approves is the plan that runs: `review`
//! records this with every plan, supersedes a waiting or approved plan when
//! any of it changed — whether by a push, a dependency's outputs, a set
//! refresh or a configuration reload — and says which ("inputs changed:
//! `greeting`"). This module only describes and compares; it decides
//! nothing and stores nothing.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What one run would plan from (besides its commit).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct MadeFrom {
    /// Input name → the value as recorded.
    pub inputs: BTreeMap<String, String>,
    /// The decrypted SOPS values, keyed-hashed (`None`: nothing decrypted).
    pub decrypted: Option<String>,
    /// A digest of the target's backend table as configured.
    pub backend: String,
    /// A digest of the policy files covering the target (`None`: no
    /// policy covers it).
    #[serde(default)]
    pub policies: Option<String>,
}

impl MadeFrom {
    /// The JSON kept with a plan.
    pub fn stored(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// What changed between what a plan was made from (`stored`, as kept
    /// with it; `None` for a plan recorded before this was kept) and
    /// `self`, in words; empty when nothing did.
    pub fn changes_since(&self, stored: Option<&str>) -> Vec<String> {
        let Some(old) = stored.and_then(|s| serde_json::from_str::<MadeFrom>(s).ok()) else {
            return vec![
                "it was made before driftless kept what a plan is made from (inputs, decrypted \
                 files, the backend table)"
                    .to_string(),
            ];
        };
        let mut out = Vec::new();
        let names: Vec<&String> = old
            .inputs
            .keys()
            .chain(self.inputs.keys())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .filter(|k| old.inputs.get(*k) != self.inputs.get(*k))
            .collect();
        if !names.is_empty() {
            let names: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
            out.push(format!("inputs changed: {}", names.join(", ")));
        }
        if old.decrypted != self.decrypted {
            out.push("the decrypted files changed".to_string());
        }
        if old.backend != self.backend {
            out.push("the backend table changed".to_string());
        }
        if old.policies != self.policies {
            out.push("the policies in force changed".to_string());
        }
        out
    }
}

/// A digest of a target's backend table as configured (its parsed form:
/// references such as `env:NAME`, never the values they name).
pub(super) fn backend_digest(backend: &crate::backend::BackendConfig) -> String {
    hex::encode(Sha256::digest(format!("{backend:?}").as_bytes()))
}

/// A keyed digest (HMAC-SHA256 under `key`, this installation's) of
/// decrypted values: it tells whether they changed, and nothing of them.
pub(super) fn keyed(key: &[u8], values: &[String]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    for v in values {
        mac.update(v.as_bytes());
        mac.update(&[0]);
    }
    hex::encode(mac.finalize().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_are_named() {
        let a = MadeFrom {
            inputs: [("greeting".to_string(), "1".to_string())].into(),
            decrypted: None,
            backend: "b".into(),
            policies: None,
        };
        assert!(a.changes_since(Some(&a.stored())).is_empty());
        let mut b = a.clone();
        b.inputs.insert("greeting".into(), "2".into());
        b.inputs.insert("extra".into(), "x".into());
        b.backend = "c".into();
        b.policies = Some("p".into());
        assert_eq!(
            b.changes_since(Some(&a.stored())),
            [
                "inputs changed: `extra`, `greeting`",
                "the backend table changed",
                "the policies in force changed"
            ]
        );
        assert_eq!(a.changes_since(None).len(), 1);
    }
}
