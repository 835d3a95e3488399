//! The dependency graph between targets (`depends_on`): the names checked
//! against the configured targets, a cycle refused (named, in order), the
//! order targets converge in (levels: a target's level is one past its
//! deepest dependency), each target's ancestors (what the queue waits on)
//! and direct dependents (what a recovered target wakes). Pure functions
//! over the loaded targets; it must not touch the queue or a run.

use std::collections::{BTreeSet, HashMap};

use super::Problem;
use super::Target;
use super::checks::problem;

/// Every `depends_on` problem: unknown names, a target naming itself or a
/// name twice, and one cycle (a → b → a) if the graph has any.
pub(super) fn validate(targets: &[Target], problems: &mut Vec<Problem>) {
    let known: BTreeSet<&str> = targets.iter().map(|t| t.name.as_str()).collect();
    for t in targets {
        let label = format!("targets[{}]", t.name);
        let mut seen = BTreeSet::new();
        for d in &t.depends_on {
            let why = if *d == t.name {
                Some(format!("`{d}` is the target itself"))
            } else if !known.contains(d.as_str()) {
                Some(format!("no target named `{d}`"))
            } else if !seen.insert(d.as_str()) {
                Some(format!("`{d}` is listed twice"))
            } else {
                None
            };
            let Some(why) = why else { continue };
            // A dependency an input brought is the input's problem: named
            // by the input's key, not by a `depends_on` nobody wrote.
            let from: Vec<&str> = t
                .inputs
                .iter()
                .filter(|i| i.target == *d)
                .map(|i| i.name.as_str())
                .collect();
            if from.is_empty() {
                problems.push(problem(&label, "depends_on", why));
            } else {
                for name in from {
                    problems.push(problem(
                        &label,
                        &format!("inputs.{name}"),
                        format!("{why} (the target this input's output comes from)"),
                    ));
                }
            }
        }
    }
    // Beside the problems above, not only once they are fixed (a name
    // that is not a target, or the target itself, makes no cycle).
    if let Some(cycle) = cycle(targets) {
        problems.push(problem(
            &format!("targets[{}]", cycle[0]),
            "depends_on",
            format!(
                "a dependency cycle: {} (no target of it could ever run first)",
                cycle.join(" → ")
            ),
        ));
    }
}

/// A cycle, as the names around it with the first repeated at the end
/// (`a → b → c → a`), or `None`. Names not among the targets, and a
/// target naming itself (refused on its own), are ignored.
pub fn cycle(targets: &[Target]) -> Option<Vec<String>> {
    let index: HashMap<&str, usize> = targets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect();
    // 0 unvisited, 1 on the current path, 2 done.
    let mut mark = vec![0u8; targets.len()];
    for start in 0..targets.len() {
        if mark[start] != 0 {
            continue;
        }
        // An explicit stack of (node, next edge to look at): no recursion
        // depth bound by the configuration's size.
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        mark[start] = 1;
        while let Some(&mut (node, ref mut edge)) = path.last_mut() {
            let deps = &targets[node].depends_on;
            if *edge < deps.len() {
                let next = index.get(deps[*edge].as_str()).copied();
                *edge += 1;
                let Some(next) = next.filter(|&n| n != node) else {
                    continue;
                };
                match mark[next] {
                    0 => {
                        mark[next] = 1;
                        path.push((next, 0));
                    }
                    1 => {
                        let from = path.iter().position(|&(n, _)| n == next).unwrap_or(0);
                        let mut names: Vec<String> = path[from..]
                            .iter()
                            .map(|&(n, _)| targets[n].name.clone())
                            .collect();
                        names.push(targets[next].name.clone());
                        return Some(names);
                    }
                    _ => {}
                }
            } else {
                mark[node] = 2;
                path.pop();
            }
        }
    }
    None
}

/// The order targets converge in: level 0 depends on nothing, level n on
/// targets of lower levels only; within a level, configuration order.
/// Targets of one level are independent of each other. On a graph with a
/// cycle (refused by validation) the targets in it are left out.
pub fn levels(targets: &[Target]) -> Vec<Vec<&Target>> {
    let mut level: HashMap<&str, usize> = HashMap::new();
    let mut left: Vec<&Target> = targets.iter().collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|t| {
            let deps: Option<Vec<usize>> = t
                .depends_on
                .iter()
                .map(|d| level.get(d.as_str()).copied())
                .collect();
            match deps {
                Some(d) => {
                    level.insert(&t.name, d.iter().map(|l| l + 1).max().unwrap_or(0));
                    false
                }
                None => true,
            }
        });
        if left.len() == before {
            break;
        }
    }
    let mut out: Vec<Vec<&Target>> = Vec::new();
    for t in targets {
        if let Some(&l) = level.get(t.name.as_str()) {
            if out.len() <= l {
                out.resize_with(l + 1, Vec::new);
            }
            out[l].push(t);
        }
    }
    out
}

/// Every (target, ancestor) pair: the targets each one waits on, directly
/// or through others.
pub fn ancestors(targets: &[Target]) -> Vec<(String, String)> {
    let by_name: HashMap<&str, &Target> = targets.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut pairs = Vec::new();
    for t in targets {
        let mut seen: BTreeSet<&str> = BTreeSet::new();
        let mut todo: Vec<&str> = t.depends_on.iter().map(String::as_str).collect();
        while let Some(d) = todo.pop() {
            if d == t.name || !seen.insert(d) {
                continue;
            }
            if let Some(dt) = by_name.get(d) {
                todo.extend(dt.depends_on.iter().map(String::as_str));
            }
        }
        pairs.extend(seen.into_iter().map(|d| (t.name.clone(), d.to_string())));
    }
    pairs
}

/// The targets that name `name` in their `depends_on`.
pub fn dependents<'a>(targets: &'a [Target], name: &str) -> Vec<&'a Target> {
    targets
        .iter()
        .filter(|t| t.depends_on.iter().any(|d| d == name))
        .collect()
}

/// The graph in Graphviz's DOT language: an edge from each dependency to
/// the target that waits on it.
pub fn dot(targets: &[Target]) -> String {
    let quote = |s: &str| format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""));
    let mut s = String::from("digraph driftless {\n  rankdir=LR;\n");
    for t in targets {
        s.push_str(&format!("  {};\n", quote(&t.name)));
    }
    for t in targets {
        for d in &t.depends_on {
            s.push_str(&format!("  {} -> {};\n", quote(d), quote(&t.name)));
        }
    }
    s.push_str("}\n");
    s
}
