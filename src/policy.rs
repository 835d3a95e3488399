//! Policies as code: Rego files on the controller evaluated in-process
//! (`regorus`, Rego v1) against a plan document ([`crate::plan::Document`]).
//! conftest's conventions: in the policy's package (`main` unless
//! configured), the rule sets `deny`, `violation` and `warn` and the rules
//! named `deny_*`, `violation_*` and `warn_*` yield messages; driftless
//! adds `require_approval`. `test_*` rules are the policy's own tests
//! (`driftless policy test`). Everything that goes wrong — a file that
//! cannot be read or parsed, a rule that fails to evaluate — is an error
//! naming the file and line: the caller refuses the plan (fail closed).
//! This module reads files and evaluates; it decides nothing about runs
//! and never reads a repository.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// How long one evaluation may take before it is an error.
const EVAL_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy `{policy}`: {message}")]
    Files { policy: String, message: String },
    /// `message` names the file (and line, where Rego says it).
    #[error("policy `{policy}`: {message}")]
    Rego { policy: String, message: String },
    #[error("policy `{policy}`: {message}")]
    Eval { policy: String, message: String },
}

/// A policy as configured (`[[policies]]`), its paths resolved against the
/// configuration's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    /// Files or patterns (`*` and `?` in the file name only).
    pub files: Vec<PathBuf>,
    /// The package its rules are in (`main`).
    pub package: String,
}

/// A policy's files read and parsed, ready to evaluate.
#[derive(Debug)]
pub struct Loaded {
    pub name: String,
    pub package: String,
    /// The files, in the order read.
    pub files: Vec<PathBuf>,
    /// A SHA-256 over the files' names and contents: what a plan's
    /// evaluation was made from.
    pub digest: String,
    /// The rule names the files mention that conftest's conventions read.
    rules: Vec<String>,
    /// The `test_*` rules.
    tests: Vec<String>,
    engine: regorus::Engine,
}

/// One message a rule yielded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub policy: String,
    pub rule: String,
    pub message: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "policy `{}`: {}", self.policy, self.message)
    }
}

/// What the policies make of one plan document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Outcome {
    pub deny: Vec<Finding>,
    pub warn: Vec<Finding>,
    pub require_approval: Vec<Finding>,
}

impl Outcome {
    pub fn extend(&mut self, other: Outcome) {
        self.deny.extend(other.deny);
        self.warn.extend(other.warn);
        self.require_approval.extend(other.require_approval);
    }

    pub fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.warn.is_empty() && self.require_approval.is_empty()
    }

    /// In words, one finding a line, denials first.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (what, list) in [
            ("deny", &self.deny),
            ("require_approval", &self.require_approval),
            ("warn", &self.warn),
        ] {
            for f in list {
                out.push(format!("{what}: {f}"));
            }
        }
        out
    }
}

/// A `test_*` rule's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestResult {
    pub policy: String,
    pub rule: String,
    /// `Err`: why it failed (false, undefined, or an error).
    pub result: Result<(), String>,
}

/// The files `spec` names, in name order: a pattern's matches (none is an
/// error), a plain path as is (missing is an error).
pub fn files_of(spec: &Spec) -> Result<Vec<PathBuf>, PolicyError> {
    let err = |message: String| PolicyError::Files {
        policy: spec.name.clone(),
        message,
    };
    let mut out = Vec::new();
    for f in &spec.files {
        let name = f.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.contains(['*', '?']) {
            if !f.is_file() {
                return Err(err(format!("{} is not a file", f.display())));
            }
            out.push(f.clone());
            continue;
        }
        let dir = f.parent().unwrap_or(Path::new("."));
        let entries = std::fs::read_dir(dir)
            .map_err(|e| err(format!("cannot list {}: {e}", dir.display())))?;
        let mut found: Vec<PathBuf> = Vec::new();
        for e in entries {
            let e = e.map_err(|e| err(format!("cannot list {}: {e}", dir.display())))?;
            let n = e.file_name();
            if let Some(n) = n.to_str()
                && crate::glob::glob_match(name, n)
                && e.path().is_file()
            {
                found.push(e.path());
            }
        }
        if found.is_empty() {
            return Err(err(format!("no file matches {}", f.display())));
        }
        found.sort();
        out.extend(found);
    }
    Ok(out)
}

/// Read and parse `spec`'s files. Every problem is an error naming the
/// file (and, for Rego, the line).
pub fn load(spec: &Spec) -> Result<Loaded, PolicyError> {
    let files = files_of(spec)?;
    let mut engine = regorus::Engine::new();
    engine.set_strict_builtin_errors(true);
    if let Some(every) = std::num::NonZeroU32::new(64) {
        engine.set_execution_timer_config(regorus::utils::limits::ExecutionTimerConfig {
            limit: EVAL_LIMIT,
            check_interval: every,
        });
    }
    let mut h = Sha256::new();
    let mut rules = std::collections::BTreeSet::new();
    let mut tests = std::collections::BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).map_err(|e| PolicyError::Files {
            policy: spec.name.clone(),
            message: format!("cannot read {}: {e}", f.display()),
        })?;
        h.update(f.display().to_string().as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        h.update([0]);
        for word in rule_words(&text) {
            if word.starts_with("test_") {
                tests.insert(word);
            } else {
                rules.insert(word);
            }
        }
        engine
            .add_policy(f.display().to_string(), text)
            .map_err(|e| {
                let said = one_line(&e.to_string());
                let file = f.display().to_string();
                PolicyError::Rego {
                    policy: spec.name.clone(),
                    message: if said.contains(&file) {
                        said
                    } else {
                        format!("{file}: {said}")
                    },
                }
            })?;
    }
    for fixed in ["deny", "violation", "warn", "require_approval"] {
        rules.insert(fixed.to_string());
    }
    Ok(Loaded {
        name: spec.name.clone(),
        package: spec.package.clone(),
        files,
        digest: hex::encode(h.finalize()),
        rules: rules.into_iter().collect(),
        tests: tests.into_iter().collect(),
        engine,
    })
}

/// The words in `text` that may be rules conftest's conventions read
/// (`deny_…`, `violation_…`, `warn_…`) or tests (`test_…`). A word that
/// turns out not to be a rule of the package is undefined there, and
/// yields nothing.
fn rule_words(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| {
            ["deny_", "violation_", "warn_", "test_"]
                .iter()
                .any(|p| w.starts_with(p) && w.len() > p.len())
        })
        .map(str::to_string)
        .collect()
}

/// regorus's multi-line message (`--> file:line:col`, the line, a caret,
/// `error: …`) as one line: `file:line:col: error: …`.
fn one_line(message: &str) -> String {
    let mut at = None;
    let mut what = None;
    for l in message.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("--> ") {
            at.get_or_insert(rest.to_string());
        } else if t.starts_with("error:") {
            what.get_or_insert(t.to_string());
        }
    }
    match (at, what) {
        (Some(a), Some(w)) => format!("{a}: {w}"),
        (None, Some(w)) => w,
        _ => message.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

impl Loaded {
    /// Evaluate the policy against `input` (a plan document).
    pub fn evaluate(&mut self, input: &Value) -> Result<Outcome, PolicyError> {
        let value =
            regorus::Value::from_json_str(&input.to_string()).map_err(|e| PolicyError::Eval {
                policy: self.name.clone(),
                message: format!("the plan document does not read: {e}"),
            })?;
        self.engine.set_input(value);
        let mut out = Outcome::default();
        for rule in self.rules.clone() {
            let messages = self.messages(&rule)?;
            let list = if rule == "require_approval" || rule.starts_with("require_approval_") {
                &mut out.require_approval
            } else if rule.starts_with("warn") {
                &mut out.warn
            } else {
                &mut out.deny
            };
            list.extend(messages.into_iter().map(|message| Finding {
                policy: self.name.clone(),
                rule: rule.clone(),
                message,
            }));
        }
        Ok(out)
    }

    /// The messages rule `rule` of the package yields: a set or array of
    /// strings (or of objects with `msg`), one string, or `true` (the rule's
    /// name is the message); nothing when it is undefined or false.
    fn messages(&mut self, rule: &str) -> Result<Vec<String>, PolicyError> {
        let query = format!("data.{}.{rule}", self.package);
        let results = self
            .engine
            .eval_query(query, false)
            .map_err(|e| PolicyError::Eval {
                policy: self.name.clone(),
                message: format!("rule `{rule}`: {}", one_line(&e.to_string())),
            })?;
        let json = serde_json::to_value(&results).unwrap_or(Value::Null);
        let mut out = Vec::new();
        for r in json["result"].as_array().into_iter().flatten() {
            for e in r["expressions"].as_array().into_iter().flatten() {
                collect(&e["value"], rule, &mut out);
            }
        }
        Ok(out)
    }

    /// Run every `test_*` rule: each passes when it is true.
    pub fn test(&mut self) -> Vec<TestResult> {
        self.engine.set_input(regorus::Value::new_object());
        let mut out = Vec::new();
        for rule in self.tests.clone() {
            let result = match self.messages_raw(&rule) {
                Err(e) => Err(e),
                Ok(Value::Bool(true)) => Ok(()),
                Ok(Value::Null) => Err("undefined".to_string()),
                Ok(v) => Err(format!("gave {v}")),
            };
            out.push(TestResult {
                policy: self.name.clone(),
                rule,
                result,
            });
        }
        out
    }

    fn messages_raw(&mut self, rule: &str) -> Result<Value, String> {
        let query = format!("data.{}.{rule}", self.package);
        let results = self
            .engine
            .eval_query(query, false)
            .map_err(|e| one_line(&e.to_string()))?;
        let json = serde_json::to_value(&results).unwrap_or(Value::Null);
        Ok(json["result"][0]["expressions"][0]["value"].clone())
    }
}

fn collect(v: &Value, rule: &str, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Bool(true) => out.push(format!("rule `{rule}`")),
        Value::Array(a) => a.iter().for_each(|x| collect(x, rule, out)),
        Value::Object(m) if m.contains_key("msg") => collect(&m["msg"], rule, out),
        Value::Object(_) | Value::Number(_) => out.push(v.to_string()),
        _ => {}
    }
}

/// Evaluate every policy in `specs` against `input`: the findings of all,
/// or the first error (fail closed). Also the digest of every file read.
pub fn evaluate_all(specs: &[&Spec], input: &Value) -> Result<Outcome, PolicyError> {
    let mut out = Outcome::default();
    for s in specs {
        out.extend(load(s)?.evaluate(input)?);
    }
    Ok(out)
}

/// A digest of the files of `specs` as they are now (one over each
/// policy's): what a plan's evaluation was made from. A policy whose files
/// do not read gives its error's text, so a fix changes the digest too.
pub fn digest_of(specs: &[&Spec]) -> String {
    let mut h = Sha256::new();
    for s in specs {
        h.update(s.name.as_bytes());
        h.update([0]);
        match files_digest(s) {
            Ok(d) => h.update(d.as_bytes()),
            Err(e) => h.update(e.to_string().as_bytes()),
        }
        h.update([0]);
    }
    hex::encode(h.finalize())
}

fn files_digest(spec: &Spec) -> Result<String, PolicyError> {
    let mut h = Sha256::new();
    for f in files_of(spec)? {
        let bytes = std::fs::read(&f).map_err(|e| PolicyError::Files {
            policy: spec.name.clone(),
            message: format!("cannot read {}: {e}", f.display()),
        })?;
        h.update(f.display().to_string().as_bytes());
        h.update([0]);
        h.update(&bytes);
        h.update([0]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(dir: &Path, files: &[(&str, &str)]) -> Spec {
        for (n, t) in files {
            std::fs::write(dir.join(n), t).expect("write");
        }
        Spec {
            name: "p".into(),
            files: vec![dir.join("*.rego")],
            package: "main".into(),
        }
    }

    #[test]
    fn conftest_conventions_and_require_approval() {
        let dir = tempfile::tempdir().expect("tmp");
        let spec = spec_with(
            dir.path(),
            &[(
                "a.rego",
                "package main\nimport rego.v1\n\
                 deny contains msg if { some c in input.changes; c.action == \"delete\"; msg := sprintf(\"no deletes: %s\", [c.address]) }\n\
                 warn_public contains \"public\" if input.target == \"t\"\n\
                 violation contains {\"msg\": \"v\"} if true\n\
                 require_approval contains \"big\" if count(input.changes) > 1\n\
                 test_deny if { count(deny) == 1 with input as {\"changes\": [{\"action\": \"delete\", \"address\": \"x\"}]} }\n\
                 test_wrong if { count(deny) == 2 with input as {\"changes\": []} }\n",
            )],
        );
        let mut l = load(&spec).expect("load");
        let out = l
            .evaluate(&serde_json::json!({"target": "t", "changes": [
                {"action": "delete", "address": "a.b"}, {"action": "create", "address": "c"}]}))
            .expect("eval");
        let msgs = |v: &[Finding]| v.iter().map(|f| f.message.clone()).collect::<Vec<_>>();
        assert_eq!(msgs(&out.deny), ["no deletes: a.b", "v"]);
        assert_eq!(msgs(&out.warn), ["public"]);
        assert_eq!(msgs(&out.require_approval), ["big"]);
        let tests = l.test();
        assert_eq!(tests.len(), 2);
        assert!(tests[0].result.is_ok(), "{tests:?}");
        assert!(tests[1].result.is_err(), "{tests:?}");
        // Nothing to say: an empty outcome.
        let out = l
            .evaluate(&serde_json::json!({"target": "u", "changes": []}))
            .expect("eval");
        assert_eq!(msgs(&out.deny), ["v"]);
        assert!(out.warn.is_empty() && out.require_approval.is_empty());
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().expect("tmp");
        let spec = spec_with(
            dir.path(),
            &[(
                "bad.rego",
                "package main\ndeny contains x if {\n  x := \n}\n",
            )],
        );
        let e = load(&spec).expect_err("parse error").to_string();
        assert!(e.contains("bad.rego:3:"), "{e}");
        let spec = spec_with(
            dir.path(),
            &[(
                "bad.rego",
                "package main\ndeny contains m if { m := input.a + 1 }\n",
            )],
        );
        let e = load(&spec)
            .expect("parses")
            .evaluate(&serde_json::json!({"a": "s"}))
            .expect_err("eval error")
            .to_string();
        assert!(e.contains("bad.rego:2:") && e.contains("`deny`"), "{e}");
        let none = Spec {
            files: vec![dir.path().join("nothing-*.rego")],
            ..spec
        };
        assert!(
            load(&none)
                .expect_err("no file")
                .to_string()
                .contains("no file matches")
        );
    }
}
