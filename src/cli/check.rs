//! `driftless check` and `driftless graph`: the configuration read the way
//! the daemon reads it, every problem named, and what only this machine can
//! tell (files, binaries, a target set's directories).

use super::*;

/// `driftless check`: every problem, or a one-line summary with every
/// target, and the targets each `[[target_sets]]` entry makes at its
/// branch tip (fetched into a throwaway cache: nothing in `state_dir` is
/// touched).
pub async fn check(path: &Path) -> Report {
    match config::check(path) {
        Ok(s) => {
            let mut stdout = format!(
                "{}: ok ({} target(s), state in {})\n",
                path.display(),
                s.targets.len(),
                s.state_dir.display()
            );
            for t in &s.targets {
                let p = t.path.display().to_string();
                let _ = writeln!(
                    stdout,
                    "  {}: {} from {} {} path {}",
                    t.name,
                    t.backend.kind(),
                    crate::redact::Redactor::new().redact(&t.repo),
                    match &t.tag {
                        Some(tag) => format!("tag {tag}"),
                        None => format!("branch {}", t.branch),
                    },
                    if p.is_empty() { "." } else { &p }
                );
                if !t.depends_on.is_empty() {
                    let _ = writeln!(stdout, "    after {}", t.depends_on.join(", "));
                }
                window_lines(&t.windows, &mut stdout);
            }
            for g in &s.groups {
                let placed = g.rollout.assign(&g.targets);
                let waves: Vec<String> = crate::rollout::nonempty_waves(&placed)
                    .iter()
                    .enumerate()
                    .map(|(i, w)| {
                        let names: Vec<&str> = placed
                            .iter()
                            .filter(|(_, x)| x == w)
                            .map(|(m, _)| m.as_str())
                            .collect();
                        format!("{}: {}", i + 1, names.join(", "))
                    })
                    .collect();
                let _ = writeln!(
                    stdout,
                    "  groups[{}]: rolled out in waves ({}), pause {}",
                    g.name,
                    waves.join("; "),
                    humantime::format_duration(g.rollout.pause)
                );
            }
            for set in &s.target_sets {
                if !set.sample.windows.is_empty() {
                    let _ = writeln!(stdout, "  {} (each member):", set.label());
                    window_lines(&set.sample.windows, &mut stdout);
                }
            }
            let mut code = check_policies(&s, &mut stdout);
            code = code.max(check_sets(&s, &mut stdout).await);
            Report { stdout, code }
        }
        Err(e) => Report {
            stdout: format!("{e}\n"),
            code: EXIT_FAILED,
        },
    }
}

/// A target's change windows in words, and whether they are open now and
/// until when (or when they next open).
fn window_lines(w: &crate::window::Windows, out: &mut String) {
    if w.is_empty() {
        return;
    }
    let now = crate::window::now();
    let _ = writeln!(out, "    windows: {}", w.words());
    let _ = writeln!(out, "    window now: {}", w.state_words(now));
    let at = w.at(now);
    if !at.open && at.next_change.is_none() {
        let _ = writeln!(
            out,
            "    warning: these windows do not open within a year: its pushes would wait queued"
        );
    }
}

/// `check`'s part for `[[target_sets]]`: each set's members at its
/// branch tip, and the directories refused. A set whose branch cannot be
/// fetched is a failure.
/// Every `[[policies]]` entry's files read and parsed (each problem
/// names the file and line), and the targets it covers.
fn check_policies(s: &config::Settings, out: &mut String) -> u8 {
    let mut code = 0;
    for p in &s.policies {
        let covered: Vec<&str> = s
            .targets
            .iter()
            .filter(|t| p.covers(&t.name))
            .map(|t| t.name.as_str())
            .collect();
        match crate::policy::load(&p.spec) {
            Ok(l) => {
                let _ = writeln!(
                    out,
                    "  policies[{}]: {} file(s), package {}; covers {}",
                    p.spec.name,
                    l.files.len(),
                    p.spec.package,
                    if covered.is_empty() {
                        format!("no [[targets]] entry (globs {})", p.targets.join(", "))
                    } else {
                        covered.join(", ")
                    }
                );
            }
            Err(e) => {
                code = EXIT_FAILED;
                let _ = writeln!(out, "  policies[{}]: {e}", p.spec.name);
            }
        }
    }
    code
}

pub(super) async fn check_sets(s: &config::Settings, out: &mut String) -> u8 {
    if s.target_sets.is_empty() {
        return 0;
    }
    let listings = match crate::tick::list_sets(s).await {
        Ok(l) => l,
        Err(e) => {
            let _ = writeln!(out, "cannot list target sets: {e}");
            return EXIT_FAILED;
        }
    };
    let mut code = 0;
    for (set, listed) in s.target_sets.iter().zip(listings) {
        let (tip, made) = match listed {
            Ok(l) => l,
            Err(e) => {
                let _ = writeln!(out, "{}: cannot list `{}`: {e}", set.label(), set.paths);
                code = EXIT_FAILED;
                continue;
            }
        };
        let _ = writeln!(
            out,
            "{}: `{}` at {} of branch {} makes {} target(s){}",
            set.label(),
            set.paths,
            crate::model::short_sha(&tip),
            set.sample.branch,
            made.members.len(),
            if set.destroy_removed {
                " (destroy_removed: a removed directory's target is destroyed)"
            } else {
                ""
            }
        );
        for m in &made.members {
            let _ = writeln!(
                out,
                "  {}: {} path {}",
                m.name,
                m.backend.kind(),
                m.path.display()
            );
        }
        for p in &made.refused {
            let _ = writeln!(out, "  refused: {p}");
        }
    }
    code
}

/// `driftless graph [--dot]`: the order targets converge in, from the
/// configuration alone. Text: one line per step, the targets of a step
/// independent of each other (they converge in parallel), each with what
/// it waits on; `--dot`: the graph for Graphviz.
pub fn graph(path: &Path, dot: bool) -> Report {
    let s = match config::check(path) {
        Ok(s) => s,
        Err(e) => {
            return Report {
                stdout: format!("{e}\n"),
                code: EXIT_FAILED,
            };
        }
    };
    if dot {
        return Report {
            stdout: config::graph::dot(&s.targets),
            code: 0,
        };
    }
    let mut out = String::new();
    for (i, level) in config::graph::levels(&s.targets).iter().enumerate() {
        let _ = writeln!(out, "{}.", i + 1);
        for t in level {
            if t.depends_on.is_empty() {
                let _ = writeln!(out, "  {}", t.name);
            } else {
                let _ = writeln!(out, "  {} (after {})", t.name, t.depends_on.join(", "));
            }
        }
    }
    Report {
        stdout: out,
        code: 0,
    }
}
