//! `driftless policy test|eval`: the `[[policies]]` in force, tested by
//! their own `test_*` rules or evaluated against a plan document (a fresh
//! plan of a target, or one recorded by `driftless plan --json`), and how
//! `plan` prints what they make of a plan.

use super::*;
use crate::policy::Outcome;

/// What the policies made of a plan, in lines (empty: no policy covers it).
pub fn judged_lines(judged: Option<&Result<Outcome, String>>) -> String {
    match judged {
        None => String::new(),
        Some(Err(e)) => format!("policies: {e}\n"),
        Some(Ok(o)) if o.is_empty() => "policies: nothing to say\n".to_string(),
        Some(Ok(o)) => o
            .lines()
            .iter()
            .map(|l| format!("policies: {l}\n"))
            .collect(),
    }
}

/// The same as JSON: `null`, `{"error": …}` or the outcome.
pub fn judged_json(judged: Option<&Result<Outcome, String>>) -> serde_json::Value {
    match judged {
        None => serde_json::Value::Null,
        Some(Err(e)) => serde_json::json!({ "error": e }),
        Some(Ok(o)) => serde_json::to_value(o).unwrap_or(serde_json::Value::Null),
    }
}

/// `driftless policy test [NAME]`: every policy's `test_*` rules, as
/// `opa test` runs them. Exit 1 when one fails or a policy does not load.
pub fn policy_test(app: &App, name: Option<&str>) -> Report {
    let settings = app.settings();
    let chosen: Vec<&config::PolicyConfig> = settings
        .policies
        .iter()
        .filter(|p| name.is_none_or(|n| p.spec.name == n))
        .collect();
    if chosen.is_empty() {
        return failed(match name {
            Some(n) => format!("no [[policies]] entry named `{n}`"),
            None => "no [[policies]] in the configuration".to_string(),
        });
    }
    let (mut out, mut pass, mut fail) = (String::new(), 0, 0);
    for p in chosen {
        let mut loaded = match crate::policy::load(&p.spec) {
            Ok(l) => l,
            Err(e) => {
                fail += 1;
                let _ = writeln!(out, "FAIL {e}");
                continue;
            }
        };
        let results = loaded.test();
        if results.is_empty() {
            let _ = writeln!(out, "{}: no test_* rules", p.spec.name);
        }
        for t in results {
            match t.result {
                Ok(()) => {
                    pass += 1;
                    let _ = writeln!(out, "PASS {}: {}", t.policy, t.rule);
                }
                Err(why) => {
                    fail += 1;
                    let _ = writeln!(out, "FAIL {}: {}: {why}", t.policy, t.rule);
                }
            }
        }
    }
    let _ = writeln!(out, "{pass} passed, {fail} failed");
    Report {
        stdout: out,
        code: if fail > 0 { EXIT_FAILED } else { 0 },
    }
}

/// `driftless policy eval TARGET [--input FILE]`: the policies covering
/// `target` against a fresh plan of it, or against a recorded plan
/// document (`driftless plan --json`'s output, or its `document`). Exit 1
/// when they deny it or cannot be evaluated.
pub async fn policy_eval(
    rec: &Reconciler,
    target: &str,
    input: Option<&Path>,
    as_json: bool,
) -> Result<Report, TickError> {
    known(rec.app(), target)?;
    let settings = rec.app().settings();
    let specs: Vec<crate::policy::Spec> =
        settings.policies_for(target).into_iter().cloned().collect();
    if specs.is_empty() {
        return Ok(failed(format!(
            "no [[policies]] entry covers target `{target}`"
        )));
    }
    let (document, judged) = match input {
        Some(file) => {
            let text = match std::fs::read_to_string(file) {
                Ok(t) => t,
                Err(e) => return Ok(failed(format!("cannot read {}: {e}", file.display()))),
            };
            let v: serde_json::Value = match serde_json::from_str(&text) {
                Ok(v) => v,
                Err(e) => {
                    return Ok(failed(format!("{} is not JSON: {e}", file.display())));
                }
            };
            let doc = match v.get("document") {
                Some(d) => d.clone(),
                None => v,
            };
            let refs: Vec<&crate::policy::Spec> = specs.iter().collect();
            let judged = crate::policy::evaluate_all(&refs, &doc).map_err(|e| e.to_string());
            (doc, judged)
        }
        None => match rec.plan_now(target).await? {
            Planned::Plan {
                document, policies, ..
            } => (
                serde_json::to_value(&*document).unwrap_or_default(),
                policies.unwrap_or_else(|| Ok(Outcome::default())),
            ),
            Planned::CannotPlan { backend } => {
                return Ok(failed(format!("target `{target}` ({backend}) cannot plan")));
            }
            Planned::Busy => {
                return Ok(Report {
                    stdout: format!("{target}: busy: another tick holds the target's lock\n"),
                    code: EXIT_BUSY,
                });
            }
        },
    };
    let denied = match &judged {
        Err(_) => true,
        Ok(o) => !o.deny.is_empty(),
    };
    let stdout = if as_json {
        let v = serde_json::json!({
            "document": document,
            "policies": judged_json(Some(&judged)),
        });
        format!("{v:#}\n")
    } else {
        judged_lines(Some(&judged))
    };
    Ok(Report {
        stdout,
        code: if denied { EXIT_FAILED } else { 0 },
    })
}
