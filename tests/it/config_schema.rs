//! `driftless config schema`: the configuration's JSON Schema, checked
//! with a real validator (PyPI's `check-jsonschema`) against what
//! `driftless check` accepts and refuses — the shipped configurations
//! pass; a configuration with every key the schema names (every backend
//! and notifier kind) passes both, with no key `check` does not know;
//! and wrong configurations fail both, on the same key.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::common::*;

/// The schema as the binary prints it, written to `dir`.
fn schema_file(dir: &Path) -> (PathBuf, Value) {
    let out = output_within(
        Command::new(bin()).args(["config", "schema"]),
        Duration::from_secs(30),
    );
    let text = succeeded(&out, "driftless config schema");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let path = dir.join("driftless.schema.json");
    std::fs::write(&path, &text).expect("write schema");
    (path, schema)
}

/// `check-jsonschema` on `files` (TOML); (passed, what it printed).
fn validate(schema: &Path, files: &[&Path]) -> (bool, String) {
    let out = output_within(
        Command::new("check-jsonschema")
            .args(["--default-filetype", "toml", "--schemafile"])
            .arg(schema)
            .args(files),
        Duration::from_secs(60),
    );
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

/// `driftless check` on `config`: (passed, what it printed).
fn check(config: &Path) -> (bool, String) {
    let out = output_within(
        Command::new(bin()).arg("--config").arg(config).arg("check"),
        Duration::from_secs(60),
    );
    (
        out.status.success(),
        format!("{}{}", text(&out.stdout), text(&out.stderr)),
    )
}

#[test]
fn the_schema_is_draft_7_and_accepts_the_shipped_configurations() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, schema) = schema_file(dir.path());
    assert_eq!(
        schema["$schema"], "http://json-schema.org/draft-07/schema#",
        "draft 7, which taplo reads"
    );
    // The schema is itself a valid draft-7 schema.
    let out = output_within(
        Command::new("check-jsonschema")
            .args(["--check-metaschema"])
            .arg(&path),
        Duration::from_secs(60),
    );
    succeeded(&out, "check-jsonschema --check-metaschema");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for shipped in ["config/example.toml", "packaging/driftless.toml.example"] {
        let (ok, said) = validate(&path, &[&root.join(shipped)]);
        assert!(ok, "{shipped} fails the schema:\n{said}");
    }
    // Every `kind` is an enum of the registry's names.
    let kinds = &schema["definitions"]["RawTarget"]["properties"]["backend"]["properties"]["kind"];
    let kinds: Vec<&str> = kinds["enum"]
        .as_array()
        .expect("backend kinds")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        kinds,
        [
            "terraform",
            "exec",
            "ansible",
            "pi",
            "compose",
            "nomad",
            "pulumi",
            "cloudformation"
        ]
    );
}

/// A configuration with every key the schema names — a target of every
/// backend kind, a notifier of every kind, a set, a group, every table —
/// each with a value of the schema's type: it validates, and `check`
/// knows every key in it (its values may still be wrong for this machine:
/// files that do not exist, hosts that do not answer).
#[test]
fn every_key_the_schema_names_is_one_check_knows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, schema) = schema_file(dir.path());
    let sink = samples(&schema, &schema)
        .into_iter()
        .next()
        .expect("a sample");
    let config = dir.path().join("every-key.toml");
    std::fs::write(&config, toml_of(&sink)).expect("write");
    for kind in ["exec", "terraform", "nomad", "cloudformation"] {
        assert!(
            sink["targets"]
                .as_array()
                .is_some_and(|t| t.iter().any(|t| t["backend"]["kind"] == kind)),
            "the sample has a {kind} target: {sink:#}"
        );
    }
    let (ok, said) = validate(&path, &[&config]);
    assert!(ok, "the schema's own sample fails it:\n{said}");
    let (_, said) = check(&config);
    let unknown: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("unknown field") || l.contains("unknown key"))
        .collect();
    assert!(
        unknown.is_empty(),
        "keys the schema names but check does not know: {unknown:#?}\n{}",
        std::fs::read_to_string(&config).unwrap_or_default()
    );
    assert!(
        said.contains("targets[") && said.contains("notifiers["),
        "check read the targets and notifiers: {said}"
    );
}

/// Wrong configurations fail the schema on the key `check` names.
#[test]
fn wrong_configurations_fail_the_schema_on_the_key_check_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (path, _) = schema_file(dir.path());
    let target = "[[targets]]\nname = \"web\"\nrepo = \"https://git.example.net/r.git\"\n";
    let exec = "[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n";
    // (configuration, what check says, what the schema says)
    let cases: Vec<(String, &str, &str)> = vec![
        (
            format!("{target}[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\napplyy = [\"x\"]\n"),
            "key `backend.applyy`: unknown field",
            "$.targets[0].backend: Additional properties are not allowed ('applyy' was unexpected)",
        ),
        (
            format!("{target}[targets.backend]\nkind = \"exe\"\napply = [\"true\"]\n"),
            "key `backend.kind`: unknown variant `exe`",
            "$.targets[0].backend.kind: 'exe' is not one of",
        ),
        (
            format!("{target}policy = \"aproval\"\n{exec}"),
            "key `policy`: `aproval` is not one of",
            "$.targets[0].policy: 'aproval' is not one of",
        ),
        (
            format!("[server]\nworkers = \"4\"\n{target}{exec}"),
            "server: key `workers`: invalid type",
            "$.server.workers: '4' is not of type 'integer'",
        ),
        (
            format!("colour = \"blue\"\n{target}{exec}"),
            "key `colour`: unknown field",
            "('colour' was unexpected)",
        ),
        (
            format!("[[notifiers]]\nname = \"m\"\nkind = \"slack\"\nurl = \"x\"\nurl_file = \"env:U\"\n{target}{exec}"),
            "notifiers[m]: key `url`: unknown field",
            "$.notifiers[0]: Additional properties are not allowed ('url' was unexpected)",
        ),
        (
            format!("[[notifiers]]\nname = \"m\"\nkind = \"slack\"\nurl_file = \"env:U\"\nevents = [\"fialed\"]\n{target}{exec}"),
            "notifiers[m]: key `events`: `\"fialed\"` is not one of",
            "$.notifiers[0].events[0]: 'fialed' is not one of",
        ),
        (
            "[[target_sets]]\nname_prefix = \"s-\"\nrepo = \"https://git.example.net/r.git\"\npaths = \"s/*\"\npath = \"x\"\n[target_sets.backend]\nkind = \"compose\"\n".to_string(),
            "target_sets[s-]: key `path`: each member gets its own",
            "$.target_sets[0]: Additional properties are not allowed ('path' was unexpected)",
        ),
        (
            format!("{target}windows = [{{ alow = \"Mon 09:00-10:00 UTC\" }}]\n{exec}"),
            "key `windows[0].alow`: unknown key",
            "('alow' was unexpected)",
        ),
        (
            format!("{target}[targets.backend]\nkind = \"terraform\"\nvar_files = \"x.tfvars\"\n"),
            "key `backend.var_files`: invalid type",
            "$.targets[0].backend.var_files: 'x.tfvars' is not of type 'array'",
        ),
        (
            format!("{target}[targets.health]\non_unhealthy = \"rolback\"\n{exec}"),
            "key `health.on_unhealthy`",
            "$.targets[0].health.on_unhealthy: 'rolback' is not one of",
        ),
        (
            format!("[[groups]]\nname = \"g\"\ntargets = [\"web\"]\nrollout = {{ waves = [0] }}\n{target}{exec}"),
            "key `rollout.waves[0]`",
            "$.groups[0].rollout.waves[0]",
        ),
    ];
    for (i, (body, check_says, schema_says)) in cases.iter().enumerate() {
        let config = dir.path().join(format!("wrong-{i}.toml"));
        std::fs::write(&config, body).expect("write");
        let (ok, said) = check(&config);
        assert!(
            !ok && said.contains(check_says),
            "check on case {i} should say {check_says:?}:\n{said}\n--\n{body}"
        );
        let (ok, said) = validate(&path, &[&config]);
        assert!(
            !ok && said.contains(schema_says),
            "the schema on case {i} should say {schema_says:?}:\n{said}\n--\n{body}"
        );
    }
}

/// Values `schema` describes, each with every property it names: one for
/// each `if`/`then` branch of an object picked by its `kind`, and an array
/// holding every sample of its items.
fn samples(schema: &Value, root: &Value) -> Vec<Value> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/definitions/");
        return samples(&root["definitions"][name], root);
    }
    if let Some(c) = schema.get("const") {
        return vec![c.clone()];
    }
    if let Some(e) = schema["enum"].as_array().and_then(|e| e.first()) {
        return vec![e.clone()];
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(first) = schema[key].as_array().and_then(|b| b.first()) {
            return samples(first, root);
        }
    }
    let branches: Vec<&Value> = schema["allOf"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if let [only] = branches.as_slice()
        && only.get("if").is_none()
    {
        return samples(only, root);
    }
    match schema["type"].as_str() {
        Some("object") => {
            let base = object_samples(schema, root);
            let kinds: Vec<Value> = branches
                .iter()
                .filter_map(|b| b.get("then"))
                .flat_map(|then| object_samples(then, root))
                .map(|mut v| {
                    if let (Some(v), Some(base)) = (v.as_object_mut(), base[0].as_object()) {
                        for (k, x) in base {
                            v.entry(k.clone()).or_insert_with(|| x.clone());
                        }
                    }
                    v
                })
                .collect();
            if kinds.is_empty() { base } else { kinds }
        }
        Some("array") => vec![Value::Array(samples(&schema["items"], root))],
        Some("string") => vec![json!(match schema["pattern"].as_str() {
            Some(p) if p.contains("{64}") => "0".repeat(64),
            Some(_) => "50%".to_string(),
            None => "x".to_string(),
        })],
        Some("integer") => vec![json!(schema["minimum"].as_i64().unwrap_or(1).max(1))],
        Some("boolean") => vec![json!(false)],
        _ => vec![json!("x")],
    }
}

/// Objects with every property `schema` names: as many as the property
/// with the most samples has (a target per backend kind), the others
/// taking their first.
fn object_samples(schema: &Value, root: &Value) -> Vec<Value> {
    let props: Vec<(&String, Vec<Value>)> = schema["properties"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, p)| (k, samples(p, root)))
        .collect();
    let n = props.iter().map(|(_, s)| s.len()).max().unwrap_or(1).max(1);
    (0..n)
        .map(|i| {
            Value::Object(
                props
                    .iter()
                    .filter_map(|(k, s)| s.get(i).or(s.first()).map(|v| ((*k).clone(), v.clone())))
                    .collect(),
            )
        })
        .collect()
}

/// `v` (an object) as TOML: every value inline, each top-level key on its
/// own line.
fn toml_of(v: &Value) -> String {
    fn inline(v: &Value) -> String {
        match v {
            Value::Object(o) => format!(
                "{{ {} }}",
                o.iter()
                    .map(|(k, x)| format!("{} = {}", Value::String(k.clone()), inline(x)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Array(a) => format!("[{}]", a.iter().map(inline).collect::<Vec<_>>().join(", ")),
            other => other.to_string(),
        }
    }
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, x)| format!("{} = {}\n", Value::String(k.clone()), inline(x)))
        .collect()
}
