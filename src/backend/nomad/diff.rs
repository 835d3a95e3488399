//! A Nomad plan diff made safe and short: the spec hash a deployment is
//! known by, the diff with secrets redacted, and its one-line summary.
//! Pure functions.

use super::*;

/// SHA-256 of the job JSON (serde_json's maps are sorted: stable).
pub(super) fn spec_hash(job: &Value) -> String {
    hex::encode(Sha256::digest(job.to_string().as_bytes()))
}

const SECRET_WORDS: &[&str] = &[
    "secret",
    "password",
    "passwd",
    "token",
    "credential",
    "api_key",
    "apikey",
    "private_key",
    "access_key",
];

fn secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with("env[") || SECRET_WORDS.iter().any(|w| n.contains(w))
}

/// A job spec as a policy reads it (the plan document's `after`), with the
/// values the diff hides hidden too: every `Env` value, template contents
/// (`EmbeddedTmpl`), fields whose name looks like a secret, and anything
/// the target's redactor knows.
pub(super) fn redact_spec(spec: &Value, redactor: &crate::redact::Redactor) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    if k == "Env" || k == "EmbeddedTmpl" || secret_name(k) {
                        crate::plan::mask_values(x);
                    } else {
                        walk(x);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut out = spec.clone();
    walk(&mut out);
    crate::plan::redact_json(&mut out, redactor);
    out
}

/// The diff with every secret value replaced by `[REDACTED]`: the values of
/// unchanged (Type "None") fields, `Env[...]` fields, template contents,
/// fields whose name looks like a secret, credentials in any URL, and
/// anything the target's redactor knows.
pub(super) fn redact_diff(diff: &Value, redactor: &crate::redact::Redactor) -> Value {
    fn walk(v: &mut Value, in_template: bool) {
        match v {
            Value::Object(m) => {
                let is_template = m
                    .get("Name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| n == "Template" || n == "Templates");
                let is_field = m.contains_key("Old") || m.contains_key("New");
                if is_field {
                    let name = m.get("Name").and_then(Value::as_str).unwrap_or("");
                    // Nomad's plan diff is contextual: inside a changed
                    // object every field is listed, the unchanged ones with
                    // Type "None" and their values (structs/diff.go,
                    // fieldDiff). An unchanged value is nothing to review,
                    // and it is where driver config and artifact secrets
                    // sit: it is never kept.
                    let unchanged = m.get("Type").and_then(Value::as_str) == Some("None");
                    if unchanged || in_template || secret_name(name) {
                        for k in ["Old", "New"] {
                            if let Some(x) = m.get_mut(k)
                                && x.as_str().is_some_and(|s| !s.is_empty())
                            {
                                *x = Value::String("[REDACTED]".into());
                            }
                        }
                    }
                }
                for (_, x) in m.iter_mut() {
                    walk(x, in_template || is_template);
                }
            }
            Value::Array(a) => {
                for x in a {
                    walk(x, in_template);
                }
            }
            _ => {}
        }
    }
    let mut d = diff.clone();
    walk(&mut d, false);
    // Known secret values (the token, env: secrets) wherever they appear.
    let text = redactor.redact(&d.to_string());
    serde_json::from_str(&text).unwrap_or(d)
}

/// "2 groups, 3 fields edited; 1 added" — a one-line account of a diff.
pub(super) fn diff_summary(diff: &Value) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    fn walk(v: &Value, path: &str, counts: &mut BTreeMap<String, usize>) {
        let Some(m) = v.as_object() else { return };
        for f in m
            .get("Fields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let t = f["Type"].as_str().unwrap_or("Edited").to_lowercase();
            if t != "none" {
                let name = f["Name"].as_str().unwrap_or("?");
                *counts.entry(format!("{path}{name} {t}")).or_default() += 1;
            }
        }
        for (key, label) in [
            ("Objects", ""),
            ("TaskGroups", "group "),
            ("Tasks", "task "),
        ] {
            for o in m.get(key).and_then(Value::as_array).into_iter().flatten() {
                let name = o["Name"].as_str().unwrap_or("?");
                let t = o["Type"].as_str().unwrap_or("Edited");
                if t == "Added" || t == "Deleted" {
                    *counts
                        .entry(format!("{path}{label}{name} {}", t.to_lowercase()))
                        .or_default() += 1;
                } else {
                    walk(o, &format!("{path}{label}{name}: "), counts);
                }
            }
        }
    }
    let t = diff["Type"].as_str().unwrap_or("Edited");
    if t == "Added" {
        return "new job".into();
    }
    walk(diff, "", &mut counts);
    if counts.is_empty() {
        return t.to_lowercase();
    }
    let mut parts: Vec<String> = counts.into_keys().collect();
    if parts.len() > 8 {
        let more = parts.len() - 8;
        parts.truncate(8);
        parts.push(format!("and {more} more"));
    }
    parts.join(", ")
}

/// A plan diff as one line per changed field: `group web › task server ›
/// Config › image: "nginx:1.25" → "nginx:1.27"` (values already redacted).
pub(super) fn diff_lines(diff: &serde_json::Value) -> String {
    fn walk(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        let Some(m) = v.as_object() else { return };
        for f in m
            .get("Fields")
            .and_then(|f| f.as_array())
            .into_iter()
            .flatten()
        {
            let t = f["Type"].as_str().unwrap_or("");
            if t == "None" {
                continue;
            }
            let name = f["Name"].as_str().unwrap_or("?");
            let old = f["Old"].as_str().unwrap_or("");
            let new = f["New"].as_str().unwrap_or("");
            out.push(match t {
                "Added" => format!("+ {path}{name}: {new:?}"),
                "Deleted" => format!("- {path}{name}: {old:?}"),
                _ => format!("~ {path}{name}: {old:?} → {new:?}"),
            });
        }
        for (key, label) in [
            ("Objects", ""),
            ("TaskGroups", "group "),
            ("Tasks", "task "),
        ] {
            for o in m.get(key).and_then(|o| o.as_array()).into_iter().flatten() {
                let name = o["Name"].as_str().unwrap_or("?");
                walk(o, &format!("{path}{label}{name} › "), out);
            }
        }
    }
    let mut out = Vec::new();
    walk(diff, "", &mut out);
    if out.len() > 300 {
        let more = out.len() - 300;
        out.truncate(300);
        out.push(format!(
            "… and {more} more (GET /api/v1/deployments/<id> has all of it)"
        ));
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_templates_and_secret_names_are_redacted() {
        let diff = json!({
            "Type": "Edited",
            "TaskGroups": [{ "Name": "web", "Type": "Edited", "Fields": [], "Tasks": [{
                "Name": "server", "Type": "Edited",
                "Fields": [
                    { "Type": "Edited", "Name": "Env[DB_URL]", "Old": "postgres://u:pw@db", "New": "postgres://u:pw2@db" },
                    { "Type": "Edited", "Name": "Meta[api_key]", "Old": "k1", "New": "k2" },
                    { "Type": "Edited", "Name": "Driver", "Old": "docker", "New": "exec" }
                ],
                "Objects": [{ "Name": "Template", "Type": "Edited", "Fields": [
                    { "Type": "Edited", "Name": "EmbeddedTmpl", "Old": "a", "New": "b" }
                ]}, { "Name": "Config", "Type": "Edited", "Fields": [
                    { "Type": "Edited", "Name": "image", "Old": "nginx:1", "New": "nginx:2" },
                    { "Type": "None", "Name": "args[1]", "Old": "s3cr3t-arg", "New": "s3cr3t-arg" },
                    { "Type": "Added", "Name": "auth_token", "Old": "", "New": "tok-123" }
                ]}]
            }]}]
        });
        let r = redact_diff(&diff, &crate::redact::Redactor::new().with("nginx:2"));
        let text = r.to_string();
        for secret in [
            "pw@db",
            "pw2",
            "k1",
            "k2",
            "\"a\"",
            "\"b\"",
            "tok-123",
            "nginx:2",
            "s3cr3t-arg",
        ] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(
            text.contains("docker") && text.contains("nginx:1"),
            "{text}"
        );
        // An empty Old (an added field) stays empty.
        assert!(text.contains(r#""Old":"""#), "{text}");
        assert_eq!(
            diff_summary(&diff),
            "group web: task server: Config: auth_token added, group web: task server: Config: image edited, group web: task server: Driver edited, group web: task server: Env[DB_URL] edited, group web: task server: Meta[api_key] edited, group web: task server: Template: EmbeddedTmpl edited"
        );
    }

    #[test]
    fn diffs_are_one_line_per_field() {
        let d = serde_json::json!({ "Type": "Edited", "Fields": [], "TaskGroups": [{ "Name": "web",
        "Fields": [{ "Type": "Edited", "Name": "Count", "Old": "2", "New": "3" }],
        "Tasks": [{ "Name": "server", "Fields": [
            { "Type": "Added", "Name": "Env[X]", "Old": "", "New": "[REDACTED]" }
        ], "Objects": [{ "Name": "Config", "Fields": [
            { "Type": "Edited", "Name": "image", "Old": "a:1", "New": "a:2" }
        ]}]}]}]});
        assert_eq!(
            diff_lines(&d),
            "~ group web › Count: \"2\" → \"3\"\n+ group web › task server › Env[X]: \"[REDACTED]\"\n~ group web › task server › Config › image: \"a:1\" → \"a:2\""
        );
    }
}
