//! Rollouts in waves: a `rollout` table (on a `[[target_sets]]` entry or a
//! `[[groups]]` entry) and `[[groups]]` themselves, every problem named by
//! its key. Which member is in which wave is `rollout`'s; driving a
//! rollout is `tick::rollout`'s.

use std::collections::BTreeMap;

use super::*;
use crate::rollout::{Rollout, Size};

/// The longest `pause` between two waves.
const MAX_PAUSE: Duration = Duration::from_secs(7 * 24 * 3600);
/// Waves in one rollout.
const MAX_WAVES: usize = 20;

/// `[[groups]]`: named `[[targets]]` entries rolled out together.
#[derive(Debug, Clone)]
pub struct Group {
    pub name: String,
    pub targets: Vec<String>,
    pub rollout: Rollout,
}

/// `rollout`: a new commit goes to one wave of members at a time
/// (docs/waves.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRollout {
    /// How many members each wave reaches in all: a count (1 or more) or a
    /// percentage ("1%" to "100%"), e.g. `[1, "25%", "100%"]`.
    #[schemars(with = "Option<Vec<Wave>>", length(min = 1, max = 20))]
    waves: Option<Vec<Value>>,
    /// Between a wave applied and healthy and the next. Default: 0s.
    pause: Option<String>,
    /// Members (by name) put in a given wave (numbered from 1).
    wave_of: Option<BTreeMap<String, usize>>,
}

/// One entry of `waves` (`validate_rollout` reads it).
#[derive(schemars::JsonSchema)]
#[schemars(untagged)]
#[allow(dead_code)] // A schema only.
enum Wave {
    /// A count of members.
    Count(#[schemars(range(min = 1))] u64),
    /// A percentage of the members, "1%" to "100%".
    Percent(#[schemars(regex(pattern = r"^\s*\+?0*([1-9][0-9]?|100)\s*%\s*$"))] String),
}

/// A `[[groups]]` entry: named `[[targets]]` entries rolled out together.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGroup {
    /// The group's name (rollouts and scopes such as `approve:<name>` name
    /// it).
    name: String,
    /// Its `[[targets]]` entries, by name.
    targets: Vec<String>,
    /// How its targets are rolled out.
    #[schemars(with = "Option<RawRollout>")]
    rollout: Option<Value>,
}

/// One `rollout` table of `section`.
pub(super) fn validate_rollout(
    raw: Value,
    section: &str,
    problems: &mut Vec<Problem>,
) -> Option<Rollout> {
    let raw = read_table::<RawRollout>(raw, section, "rollout.", problems)?;
    let before = problems.len();
    let mut waves = Vec::new();
    match raw.waves {
        None => problems.push(problem(
            section,
            "rollout.waves",
            "missing: the members each wave reaches in all, e.g. [1, \"25%\", \"100%\"]",
        )),
        Some(list) if list.is_empty() || list.len() > MAX_WAVES => problems.push(problem(
            section,
            "rollout.waves",
            format!("1 to {MAX_WAVES} waves"),
        )),
        Some(list) => {
            for (i, w) in list.iter().enumerate() {
                let size = match w {
                    Value::Number(n) => n
                        .as_u64()
                        .filter(|n| *n >= 1)
                        .map(|n| Size::Count(n as usize)),
                    Value::String(s) => Size::percent(s),
                    _ => None,
                };
                match size {
                    Some(s) => waves.push(s),
                    None => problems.push(problem(
                        section,
                        &format!("rollout.waves[{i}]"),
                        format!("`{w}` is neither a count (1 or more) nor a percentage (\"1%\" to \"100%\")"),
                    )),
                }
            }
        }
    }
    let pause = match raw.pause.as_deref().map(str::trim) {
        None | Some("0" | "0s") => Duration::ZERO,
        p => duration(
            section,
            "rollout.pause",
            p,
            Duration::ZERO,
            MAX_PAUSE,
            problems,
        ),
    };
    let wave_of = raw.wave_of.unwrap_or_default();
    for (member, w) in &wave_of {
        if *w == 0 || *w > waves.len().max(1) {
            problems.push(problem(
                section,
                &format!("rollout.wave_of.{member}"),
                format!("wave {w}: the waves are numbered 1 to {}", waves.len()),
            ));
        }
    }
    (problems.len() == before).then_some(Rollout {
        waves,
        pause,
        wave_of,
    })
}

/// `[[groups]]`: each names `[[targets]]` entries on one repository and
/// branch, in one group at most, with a `rollout`; a member that depends on
/// a member of a later wave is refused. The members' `rollout_of` is set.
pub(super) fn validate_groups(
    raw: Vec<Value>,
    targets: &mut [Target],
    taken: &mut HashSet<String>,
    problems: &mut Vec<Problem>,
) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("groups[{n}]"))
            .unwrap_or_else(|| format!("groups[{i}]"));
        let Some(g) = read_table::<RawGroup>(raw, &label, "", problems) else {
            continue;
        };
        let before = problems.len();
        unit_name(&g.name, &label, targets, taken, problems);
        let rollout = match g.rollout {
            Some(r) => validate_rollout(r, &label, problems),
            None => {
                problems.push(problem(
                    &label,
                    "rollout",
                    "missing: how the group's targets are rolled out, e.g. { waves = [1, \"100%\"] }",
                ));
                None
            }
        };
        if g.targets.is_empty() {
            problems.push(problem(&label, "targets", "must name at least one target"));
        }
        let mut first: Option<(String, String)> = None;
        for name in &g.targets {
            let Some(t) = targets.iter().find(|t| &t.name == name) else {
                problems.push(problem(
                    &label,
                    "targets",
                    format!("no [[targets]] entry named `{name}`"),
                ));
                continue;
            };
            if let Some(other) = &t.rollout_of {
                problems.push(problem(
                    &label,
                    "targets",
                    format!(
                        "`{name}` is in group `{other}` already: a target is in one rollout at most"
                    ),
                ));
            }
            if t.tag.is_some() {
                problems.push(problem(
                    &label,
                    "targets",
                    format!("`{name}` follows tags: a rollout is of one branch's commits"),
                ));
            }
            let here = (t.repo_key.clone(), t.branch.clone());
            match &first {
                None => first = Some(here),
                Some(f) if *f != here => problems.push(problem(
                    &label,
                    "targets",
                    format!("`{name}` is on another repository or branch than `{}`: a rollout is of one branch's commits", g.targets[0]),
                )),
                Some(_) => {}
            }
        }
        if let Some(r) = &rollout {
            for m in r.wave_of.keys() {
                if !g.targets.contains(m) {
                    problems.push(problem(
                        &label,
                        &format!("rollout.wave_of.{m}"),
                        "not one of the group's targets",
                    ));
                }
            }
            contradicting_waves(&g.targets, r, targets, &label, problems);
        }
        if problems.len() > before {
            continue;
        }
        let Some(rollout) = rollout else { continue };
        for t in targets.iter_mut().filter(|t| g.targets.contains(&t.name)) {
            t.rollout_of = Some(g.name.clone());
        }
        out.push(Group {
            name: g.name,
            targets: g.targets,
            rollout,
        });
    }
    out
}

/// A set's or a group's `name`: a safe name, taken by no other set or
/// group, and no `[[targets]]` entry's (scopes name either).
pub(super) fn unit_name(
    name: &str,
    label: &str,
    targets: &[Target],
    taken: &mut HashSet<String>,
    problems: &mut Vec<Problem>,
) {
    if !valid_name(name) {
        problems.push(problem(
            label,
            "name",
            format!("`{name}` is not a safe name: use 1-63 characters from a-z, 0-9, '_', '.', '-', starting with a letter or digit"),
        ));
    } else if targets.iter().any(|t| t.name == name) {
        problems.push(problem(
            label,
            "name",
            format!("`{name}` is a target's name: scopes such as approve:{name} would mean both"),
        ));
    } else if !taken.insert(name.to_string()) {
        problems.push(problem(
            label,
            "name",
            format!("another [[target_sets]] or [[groups]] entry is named `{name}`"),
        ));
    }
}

/// A member that depends on a member of a later wave could never converge
/// in its own: refused, naming both.
fn contradicting_waves(
    members: &[String],
    rollout: &Rollout,
    targets: &[Target],
    label: &str,
    problems: &mut Vec<Problem>,
) {
    let waves: BTreeMap<String, usize> = rollout.assign(members).into_iter().collect();
    for (m, w) in &waves {
        let Some(t) = targets.iter().find(|t| &t.name == m) else {
            continue;
        };
        for d in &t.depends_on {
            if let Some(dw) = waves.get(d)
                && dw > w
            {
                problems.push(problem(
                    label,
                    "rollout.waves",
                    format!("`{m}` (wave {w}) depends on `{d}` (wave {dw}): a member may depend only on members of its own or earlier waves (place them with rollout.wave_of)"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems_of(extra: &str) -> Vec<Problem> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        let target = |n: &str, more: &str| {
            format!(
                "[[targets]]\nname = \"{n}\"\nrepo = \"https://git.example.net/r.git\"\n{more}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            )
        };
        std::fs::write(
            &file,
            format!(
                "{}{}{}{extra}",
                target("a", "depends_on = [\"b\"]"),
                target("b", ""),
                target("t", "repo = \"https://git.example.net/other.git\"").replacen(
                    "repo = \"https://git.example.net/r.git\"\n",
                    "",
                    1
                ),
            ),
        )
        .expect("write");
        super::super::parse(&file, false, true).expect("read").1
    }

    /// Each bad key of a group or its rollout is named; a good one passes.
    #[test]
    fn every_bad_group_key_is_named() {
        let ok = problems_of(
            "[[groups]]\nname = \"fleet\"\ntargets = [\"a\", \"b\"]\n\
             rollout = { waves = [1, \"100%\"], pause = \"5m\", wave_of = { b = 1 } }\n",
        );
        assert!(ok.is_empty(), "{ok:?}");
        for (group, key, says) in [
            (
                "targets = [\"a\", \"b\"]\nrollout = { waves = [1, \"100%\"] }",
                "rollout.waves",
                "`a` (wave 1) depends on `b` (wave 2)",
            ),
            (
                "targets = [\"b\", \"nope\"]\nrollout = { waves = [1] }",
                "targets",
                "no [[targets]] entry named `nope`",
            ),
            (
                "targets = [\"b\", \"t\"]\nrollout = { waves = [1] }",
                "targets",
                "another repository or branch",
            ),
            ("targets = [\"b\"]", "rollout", "missing"),
            (
                "targets = [\"b\"]\nrollout = { waves = [0] }",
                "rollout.waves[0]",
                "neither a count",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [\"150%\"] }",
                "rollout.waves[0]",
                "neither a count",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [] }",
                "rollout.waves",
                "1 to 20 waves",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [1], pause = \"5M\" }",
                "rollout.pause",
                "months",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [1], wave_of = { b = 3 } }",
                "rollout.wave_of.b",
                "numbered 1 to 1",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [1], wave_of = { t = 1 } }",
                "rollout.wave_of.t",
                "not one of",
            ),
            (
                "targets = [\"b\"]\nrollout = { waves = [1], speed = 2 }",
                "rollout.speed",
                "",
            ),
        ] {
            let found = problems_of(&format!("[[groups]]\nname = \"fleet\"\n{group}\n"));
            assert!(
                found.iter().any(|p| p.section == "groups[fleet]"
                    && p.key == key
                    && p.message.contains(says)),
                "{group}: {found:?}"
            );
        }
        let named =
            problems_of("[[groups]]\nname = \"a\"\ntargets = [\"b\"]\nrollout = { waves = [1] }\n");
        assert!(
            named
                .iter()
                .any(|p| p.key == "name" && p.message.contains("a target's name")),
            "{named:?}"
        );
        let twice = problems_of(
            "[[groups]]\nname = \"g\"\ntargets = [\"b\"]\nrollout = { waves = [1] }\n\
             [[groups]]\nname = \"g\"\ntargets = [\"a\"]\nrollout = { waves = [1] }\n",
        );
        assert!(
            twice
                .iter()
                .any(|p| p.key == "name" && p.message.contains("another")),
            "{twice:?}"
        );
        let set = problems_of(
            "[[target_sets]]\nname_prefix = \"s-\"\nrepo = \"https://git.example.net/r.git\"\npaths = \"s/*\"\n\
             rollout = { waves = [1] }\n[target_sets.backend]\nkind = \"exec\"\napply = [\"true\"]\n",
        );
        assert!(
            set.iter()
                .any(|p| p.section == "target_sets[s-]" && p.key == "name"),
            "{set:?}"
        );
    }
}
