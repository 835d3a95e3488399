//! The plan document: one shape for what any backend's plan would change,
//! the input every policy (`[[policies]]`, Rego) is evaluated against and
//! what `driftless plan --json` prints. `Change` is one resource or unit in
//! the normal form (`address`, `type`, `action`, `before`/`after` where the
//! backend gives them); [`Document`] is the whole of it. Pure: it builds
//! and redacts values, it runs nothing and decides nothing. The schema is
//! `docs/schemas/plan-document.json`; change both together.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::redact::{MASK, Redactor};

/// The version of the document's shape (`input.version`).
pub const VERSION: u32 = 1;

/// What applying does to one resource or unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Action {
    Create,
    Update,
    Delete,
    Replace,
    Read,
    NoOp,
}

impl Action {
    /// The action of a diff line's sign (`+`, `~`, `-`, `-/+`); `None`
    /// for a line without one.
    pub fn of_sign(sign: &str) -> Option<Action> {
        Some(match sign {
            "+" => Action::Create,
            "~" => Action::Update,
            "-" => Action::Delete,
            "-/+" | "+/-" => Action::Replace,
            _ => return None,
        })
    }

    /// Terraform's (and OpenTofu's) `change.actions`: `["delete","create"]`
    /// or `["create","delete"]` is a replace; `forget` leaves the
    /// resource alone in the world but drops it from state: a delete as far
    /// as driftless can manage it.
    pub fn of_terraform(actions: &[&str]) -> Action {
        let has = |a: &str| actions.contains(&a);
        match () {
            _ if has("create") && has("delete") => Action::Replace,
            _ if has("create") => Action::Create,
            _ if has("delete") || has("forget") => Action::Delete,
            _ if has("update") => Action::Update,
            _ if has("read") => Action::Read,
            _ => Action::NoOp,
        }
    }
}

/// One resource or unit a plan would touch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// What it is called where it lives (`terraform_data.a`, a compose
    /// service, `job default/web`, a CloudFormation logical id).
    pub address: String,
    /// Its kind (`terraform_data`, `compose_service`, `nomad_job`,
    /// `AWS::S3::Bucket`); empty when the backend cannot say.
    #[serde(rename = "type")]
    pub kind: String,
    pub action: Action,
    /// How it is now, where the backend can say (secrets redacted).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub before: Value,
    /// How it will be, where the backend can say (secrets redacted).
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub after: Value,
}

impl Change {
    pub fn new(address: impl Into<String>, kind: impl Into<String>, action: Action) -> Change {
        Change {
            address: address.into(),
            kind: kind.into(),
            action,
            before: Value::Null,
            after: Value::Null,
        }
    }
}

/// The changes a diff of lines in driftless's words says (`+ x (create)`,
/// `-/+ y (…)`): the normal form of a backend that gives nothing more
/// (exec, pi, ansible). A line without a sign is an `update` of what it
/// names, its type `line`, so a policy sees it rather than nothing.
pub fn changes_of_diff(diff: &str) -> Vec<Change> {
    diff.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (sign, rest) = l.split_once(char::is_whitespace).unwrap_or((l, ""));
            match Action::of_sign(sign) {
                Some(a) => {
                    let rest = rest.trim();
                    let address = rest
                        .split_once(" (")
                        .map_or(rest, |(a, _)| a)
                        .trim()
                        .to_string();
                    Change::new(address, "", a)
                }
                None => Change::new(l, "line", Action::Update),
            }
        })
        .collect()
}

/// Terraform's `*_sensitive` companion of a value: `true` where a value
/// is sensitive, the same shape below. Those values become `[REDACTED]`.
pub fn mask_sensitive(value: &mut Value, sensitive: &Value) {
    match (value, sensitive) {
        (v, Value::Bool(true)) if !v.is_null() => *v = Value::String(MASK.into()),
        (Value::Object(m), Value::Object(s)) => {
            for (k, v) in m.iter_mut() {
                if let Some(sv) = s.get(k) {
                    mask_sensitive(v, sv);
                }
            }
        }
        (Value::Array(a), Value::Array(s)) => {
            for (v, sv) in a.iter_mut().zip(s) {
                mask_sensitive(v, sv);
            }
        }
        _ => {}
    }
}

/// Every non-empty string in `value` becomes the mask: for a part of a
/// spec whose values may all be secrets (a container's environment), kept
/// in shape so a policy can still see which names are set.
pub fn mask_values(value: &mut Value) {
    match value {
        Value::String(s) if !s.is_empty() => *s = MASK.into(),
        Value::Array(a) => a.iter_mut().for_each(mask_values),
        Value::Object(m) => m.values_mut().for_each(mask_values),
        _ => {}
    }
}

/// Every string in `value` (keys too) with the registered secrets masked.
pub fn redact_json(value: &mut Value, redactor: &Redactor) {
    match value {
        Value::String(s) => {
            let r = redactor.redact(s);
            if r != *s {
                *s = r;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|v| redact_json(v, redactor)),
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut v) in old {
                redact_json(&mut v, redactor);
                m.insert(redactor.redact(&k), v);
            }
        }
        _ => {}
    }
}

/// A YAML document (a compose model as `compose config` prints it) as
/// JSON, read by the same YAML reader Rego's `yaml.unmarshal` uses.
pub fn yaml_to_json(text: &str) -> Result<Value, String> {
    let v = regorus::Value::from_yaml_str(text).map_err(|e| e.to_string())?;
    let json = v.to_json_str().map_err(|e| e.to_string())?;
    serde_json::from_str(&json).map_err(|e| e.to_string())
}

/// Who signed a verified commit (or, for a target following tags, the
/// tag naming it), as git and gpg or ssh-keygen said when they checked it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signer {
    /// The signer: the key's OpenPGP user id, or the SSH principal
    /// `allowed_signers_file` lists for the key (git's `%GS`).
    pub name: String,
    /// The key: its fingerprint (OpenPGP) or `SHA256:…` (SSH).
    pub key: String,
    /// What carried the signature: `commit` or `tag`.
    pub on: String,
}

/// The whole plan document, as a policy reads it (`input`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Document {
    /// [`VERSION`].
    pub version: u32,
    pub target: String,
    /// The backend's kind (`terraform`, `compose`, …).
    pub backend: String,
    /// The commit the plan was made at.
    pub commit: String,
    /// Who signed it, when the target verifies signatures (`[targets.verify]`)
    /// and the verification passed; `null` otherwise.
    #[serde(default)]
    pub signer: Option<Signer>,
    /// Files changed since the last applied commit, relative to the
    /// repository (`null` when nothing was applied yet or the history
    /// cannot say).
    #[serde(default)]
    pub files_changed: Option<Vec<String>>,
    /// The target's inputs by name: the value of a non-sensitive one, the
    /// mask for a sensitive one.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// One line for people.
    pub summary: String,
    /// It deletes or replaces something.
    pub destructive: bool,
    /// The normal form: one entry per resource or unit.
    pub changes: Vec<Change>,
    /// The backend's own machine-readable plan, redacted (terraform's
    /// `show -json`, Nomad's plan responses, a change set's changes).
    #[serde(default)]
    pub raw: Value,
    /// Terraform only: `raw.resource_changes`, where conftest's terraform
    /// policies look for it.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub resource_changes: Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terraform_actions_in_the_normal_form() {
        assert_eq!(Action::of_terraform(&["delete", "create"]), Action::Replace);
        assert_eq!(Action::of_terraform(&["create", "delete"]), Action::Replace);
        assert_eq!(Action::of_terraform(&["forget"]), Action::Delete);
        assert_eq!(Action::of_terraform(&["no-op"]), Action::NoOp);
        assert_eq!(Action::of_terraform(&["read"]), Action::Read);
        assert_eq!(
            serde_json::to_value(Action::NoOp).ok(),
            Some(Value::from("no-op"))
        );
    }

    #[test]
    fn diff_lines_become_changes() {
        let c = changes_of_diff("+ web (create)\n-/+ db (recreate: x changed)\n\nrestart all\n");
        assert_eq!(c.len(), 3);
        assert_eq!(
            (c[0].address.as_str(), c[0].action),
            ("web", Action::Create)
        );
        assert_eq!(
            (c[1].address.as_str(), c[1].action),
            ("db", Action::Replace)
        );
        assert_eq!((c[2].kind.as_str(), c[2].action), ("line", Action::Update));
    }

    #[test]
    fn yaml_reads_as_json() {
        let v = yaml_to_json("services:\n  web:\n    image: x:1\n    ports: [80]\n").ok();
        assert_eq!(
            v,
            Some(serde_json::json!({"services": {"web": {"image": "x:1", "ports": [80]}}}))
        );
        assert!(yaml_to_json("a: [").is_err());
    }

    #[test]
    fn sensitive_values_are_masked() {
        let mut v = serde_json::json!({"a": "x", "b": {"c": "s", "d": 1}, "l": ["p", "q"]});
        mask_sensitive(
            &mut v,
            &serde_json::json!({"b": {"c": true}, "l": [false, true]}),
        );
        assert_eq!(
            v,
            serde_json::json!({"a": "x", "b": {"c": MASK, "d": 1}, "l": ["p", MASK]})
        );
        let mut r = Redactor::new();
        r.add("hunter2");
        let mut v = serde_json::json!({"k": ["pw=hunter2"], "hunter2": 1});
        redact_json(&mut v, &r);
        assert!(!v.to_string().contains("hunter2"), "{v}");
    }
}
