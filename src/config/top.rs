//! The file's top level as serde reads it (`RawTop`, `[defaults]`,
//! `[history]`) and the configuration's JSON Schema
//! (`driftless config schema`), derived with `schemars` from the same
//! structs every table is read into, so it names exactly the keys
//! `driftless check` accepts. The tables read by hand (a set's own keys,
//! `windows`, a notifier's common keys, a rollout's waves) have a schema
//! type beside their reader, held to it by a test there.
//!
//! The schema says keys, types and the values a key takes from a fixed list
//! (every `kind`, `policy`, `page`, …); what it cannot say (a name's
//! characters, a duration's range, which targets exist) only
//! `driftless check` says. Pure: nothing here reads a file.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;

use super::{database, policies, rollouts, server, sets, target};

/// A driftless configuration file (TOML). Relative paths are relative to
/// the file's directory; secrets are never written here: `*_file` keys
/// name a file holding one, or `env:NAME` an environment variable. Every
/// key can be overridden from the environment with a `DRIFTLESS__`
/// prefix and `__` between levels (`DRIFTLESS__SERVER__WORKERS=8`).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "driftless configuration")]
pub(super) struct RawTop {
    /// Where the SQLite database, git caches, checkouts and locks live.
    /// Default: /var/lib/driftless.
    pub(super) state_dir: Option<String>,
    /// The HTTP listener: webhooks, the API, the page, /healthz, /readyz,
    /// /metrics.
    #[schemars(with = "Option<server::RawServer>")]
    pub(super) server: Option<Value>,
    /// The targets: one directory of a repository's branch (or tag),
    /// converged by one backend.
    #[serde(default)]
    #[schemars(with = "Vec<target::RawTarget>")]
    pub(super) targets: Vec<Value>,
    /// One target per directory matching `paths` at the branch tip, named
    /// `<name_prefix><directory>`, each made with the set's keys
    /// (docs/dependencies-and-sets.md).
    #[serde(default)]
    #[schemars(schema_with = "sets::sets_schema")]
    pub(super) target_sets: Vec<Value>,
    /// Named `[[targets]]` entries that take a new commit in waves
    /// (docs/waves.md).
    #[serde(default)]
    #[schemars(with = "Vec<rollouts::RawGroup>")]
    pub(super) groups: Vec<Value>,
    /// Rego policies on this machine that judge every plan of the targets
    /// they cover before it is applied (docs/policies.md).
    #[serde(default)]
    #[schemars(with = "Vec<policies::RawPolicy>")]
    pub(super) policies: Vec<Value>,
    /// Webhook endpoints, `POST /hooks/<name>`: one per forge pointed at
    /// driftless; deliveries must be signed with its secret.
    #[serde(default)]
    #[schemars(with = "Vec<server::RawReceiver>")]
    pub(super) receivers: Vec<Value>,
    /// API tokens (`Authorization: Bearer …`), each kept as its SHA-256
    /// with its scopes; `driftless token new NAME` prints one.
    #[serde(default)]
    #[schemars(with = "Vec<server::RawToken>")]
    pub(super) tokens: Vec<Value>,
    /// What targets inherit when they do not say.
    pub(super) defaults: Option<RawDefaults>,
    /// Who hears about failures, recoveries, approvals (docs/notifications.md).
    #[serde(default)]
    #[schemars(schema_with = "crate::notify::notifiers_schema")]
    pub(super) notifiers: Vec<Value>,
    /// Forge APIs that commit statuses and pull-request previews go to
    /// (docs/forges.md).
    #[serde(default)]
    #[schemars(with = "Vec<crate::notify::forge::RawForge>")]
    pub(super) forges: Vec<Value>,
    /// How long runs are kept.
    pub(super) history: Option<RawHistory>,
    /// The state in PostgreSQL instead of SQLite in `state_dir`; several
    /// instances may share one database (docs/postgresql.md).
    pub(super) database: Option<database::RawDatabase>,
}

/// `[history]`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHistory {
    /// Runs are kept this long (a duration such as "90d"); each target's
    /// last run and the run that last changed it are always kept.
    /// Default: 90d.
    pub(super) keep: Option<String>,
}

/// `[defaults]`: what a target without its own takes.
#[derive(Deserialize, JsonSchema, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    /// Notifiers (by name) told about targets that name none.
    pub(super) notify: Option<Vec<String>>,
    /// While a target keeps failing with the same message, remind after
    /// this. Default: 6h.
    pub(super) repeat_after: Option<String>,
    /// The `[[forges]]` entry commit statuses go to for targets that name
    /// none.
    pub(super) forge: Option<String>,
    /// Only signed commits are applied, for every target without its own
    /// `verify` (docs/supply-chain.md).
    #[schemars(with = "Option<super::verify::RawVerify>")]
    pub(super) verify: Option<Value>,
    /// Health checks after every apply, for every target without its own
    /// `health` (docs/health.md).
    #[schemars(with = "Option<super::health::RawHealth>")]
    pub(super) health: Option<Value>,
    /// When work may start, for every target without its own `windows`
    /// (docs/windows.md). Default: any time.
    #[schemars(with = "Option<super::windows::WindowList>")]
    pub(super) windows: Option<Value>,
}

/// The configuration's JSON Schema (draft 7, which taplo and most editors
/// read).
pub fn json_schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let mut schema = generator.into_root_schema_for::<RawTop>().to_value();
    without_null(&mut schema);
    schema
}

/// TOML has no null: an optional key is absent, never null, so the
/// `null` schemars allows beside every `Option` is taken out (from a
/// `type` list, and as an `anyOf` branch), everywhere in `v`.
fn without_null(v: &mut Value) {
    match v {
        Value::Object(o) => {
            if let Some(Value::Array(types)) = o.get_mut("type") {
                types.retain(|t| t != "null");
                if let [only] = types.as_slice() {
                    let only = only.clone();
                    o.insert("type".into(), only);
                }
            }
            if let Some(Value::Array(branches)) = o.get_mut("anyOf") {
                branches.retain(|b| b.get("type").and_then(Value::as_str) != Some("null"));
                if let [Value::Object(only)] = branches.as_slice() {
                    let only = only.clone();
                    o.remove("anyOf");
                    if only.contains_key("$ref") {
                        // Draft 7 ignores a `$ref`'s siblings.
                        o.insert("allOf".into(), Value::Array(vec![Value::Object(only)]));
                    } else {
                        for (k, val) in only {
                            o.entry(k).or_insert(val);
                        }
                    }
                }
            }
            o.values_mut().for_each(without_null);
        }
        Value::Array(a) => a.iter_mut().for_each(without_null),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key an editor offers says what it is: each property of every
    /// table, every backend's and every notifier's, has a description.
    #[test]
    fn every_key_has_a_description() {
        fn walk(v: &Value, path: &str, missing: &mut Vec<String>) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::Object(props)) = o.get("properties") {
                        for (k, p) in props {
                            // `kind` inside a kind's branch is the const
                            // that picks it; the enum beside it says it.
                            let picks = k == "kind" && p.get("const").is_some();
                            if p.get("description").is_none() && !picks {
                                missing.push(format!("{path}.{k}"));
                            }
                        }
                    }
                    for (k, x) in o {
                        walk(x, &format!("{path}/{k}"), missing);
                    }
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, path, missing)),
                _ => {}
            }
        }
        let mut missing = Vec::new();
        walk(&json_schema(), "", &mut missing);
        assert!(
            missing.is_empty(),
            "keys without a description: {missing:#?}"
        );
    }

    /// No `null` is left: TOML has none.
    #[test]
    fn no_key_takes_null() {
        let text = json_schema().to_string();
        assert!(!text.contains("\"null\""), "{text}");
    }
}
