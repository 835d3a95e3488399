//! `[[policies]]`: Rego files on the controller that every plan of the
//! targets they cover is evaluated against, each key checked and named.
//! Reading and evaluating the files is `policy`'s (`check` parses them);
//! what an outcome does to a run is `tick::guard`'s. A policy's files are
//! never read from a repository: a repository must not relax its own
//! policy.

use super::*;

/// One `[[policies]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyConfig {
    pub spec: crate::policy::Spec,
    /// Target name globs it covers (`["*"]` unless said).
    pub targets: Vec<String>,
}

impl PolicyConfig {
    pub fn covers(&self, target: &str) -> bool {
        self.targets
            .iter()
            .any(|g| crate::glob::glob_match(g, target))
    }
}

/// A `[[policies]]` entry: Rego files on this machine that judge every
/// plan of the targets they cover (docs/policies.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    /// The policy's name, in findings and messages.
    name: String,
    /// The Rego files (globs allowed), on this machine, never from a
    /// repository.
    files: Vec<String>,
    /// Globs of the target names it covers. Default: every target.
    targets: Option<Vec<String>>,
    /// The Rego package its rules are in. Default: main.
    package: Option<String>,
}

/// Every `[[policies]]` entry, its files resolved against `base` (the
/// configuration's directory).
pub(super) fn validate_policies(
    raw: Vec<Value>,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<PolicyConfig> {
    let mut out: Vec<PolicyConfig> = Vec::new();
    for (i, r) in raw.into_iter().enumerate() {
        let label = format!("policies[{i}]");
        let Some(r) = read_table::<RawPolicy>(r, &label, "", problems) else {
            continue;
        };
        let label = format!("policies[{}]", r.name);
        let before = problems.len();
        if !valid_name(&r.name) {
            problems.push(problem(
                &label,
                "name",
                "lowercase letters, digits, `_`, `.` and `-`, starting with a letter or digit",
            ));
        }
        if out.iter().any(|p| p.spec.name == r.name) {
            problems.push(problem(&label, "name", "two [[policies]] have this name"));
        }
        if r.files.is_empty() {
            problems.push(problem(
                &label,
                "files",
                "empty: the Rego files on this machine, e.g. [\"/etc/driftless/policy/*.rego\"]",
            ));
        }
        let mut files = Vec::new();
        for (j, f) in r.files.iter().enumerate() {
            let p = Path::new(f);
            let parent_wild = p
                .parent()
                .is_some_and(|d| d.to_string_lossy().contains(['*', '?']));
            if parent_wild {
                problems.push(problem(
                    &label,
                    &format!("files[{j}]"),
                    format!("`{f}`: `*` and `?` may stand in the file name only"),
                ));
            }
            files.push(if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            });
        }
        let targets = r.targets.unwrap_or_else(|| vec!["*".to_string()]);
        if targets.is_empty() {
            problems.push(problem(
                &label,
                "targets",
                "empty: name globs of the targets it covers (leave it out for every target)",
            ));
        }
        let package = r.package.unwrap_or_else(|| "main".to_string());
        let package_ok = !package.is_empty()
            && package.split('.').all(|seg| {
                seg.chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && seg.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
        if !package_ok {
            problems.push(problem(
                &label,
                "package",
                format!(
                    "`{package}` is not a Rego package name (such as `main` or `driftless.prod`)"
                ),
            ));
        }
        if problems.len() == before {
            out.push(PolicyConfig {
                spec: crate::policy::Spec {
                    name: r.name,
                    files,
                    package,
                },
                targets,
            });
        }
    }
    out
}

/// A target a policy covers must be planned before it is applied: a
/// backend that cannot plan is refused, naming the policy.
pub(super) fn check_covered(
    policies: &[PolicyConfig],
    target: &Target,
    section: &str,
    problems: &mut Vec<Problem>,
) {
    let Some(p) = policies.iter().find(|p| p.covers(&target.name)) else {
        return;
    };
    if !target.backend.can_plan() {
        problems.push(problem(
            section,
            "backend",
            format!(
                "policy `{}` covers this target, but its backend cannot plan (a policy is \
                 evaluated on the plan before every apply; a command backend plans with its \
                 `plan` command)",
                p.spec.name
            ),
        ));
    }
}
