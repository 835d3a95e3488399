//! The layering rules of ARCHITECTURE.md, checked on the source, and the
//! bundled example configuration kept valid. The layer table is read from
//! ARCHITECTURE.md itself, so the map and the code cannot drift apart.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("read src").flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out.sort();
    out
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Code lines only: comments and doc comments may name other modules.
fn code(p: &Path) -> String {
    std::fs::read_to_string(p)
        .expect("read")
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `ARCHITECTURE.md`'s "Layers" table: module -> layer number.
fn layer_table() -> BTreeMap<String, usize> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("read ARCHITECTURE.md");
    let section = doc
        .split("\n## Layers\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Layers` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut layers = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | 3 configuration | `config` |
        let [_, layer, modules, ..] = cells.as_slice() else {
            continue;
        };
        let Some(n) = layer
            .split_whitespace()
            .next()
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        for m in modules.split(',') {
            let m = m.trim().trim_matches('`');
            if !m.is_empty() {
                assert!(
                    layers.insert(m.to_string(), n).is_none(),
                    "`{m}` is in two layers"
                );
            }
        }
    }
    assert!(!layers.is_empty(), "the Layers table lists no module");
    layers
}

/// The top-level module a source file belongs to (`backend/nomad.rs` ->
/// `backend`, `main.rs` -> `main`); `None` for `lib.rs`, which only declares.
fn top_module(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).expect("under src");
    let first = rel
        .components()
        .next()?
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    match first.trim_end_matches(".rs") {
        "lib" => None,
        m => Some(m.to_string()),
    }
}

/// Every module a file's code names: `crate::x` (in the library) or
/// `driftless::x` (in the binary), grouped imports `crate::{a, b}` included.
fn imports(file: &Path) -> BTreeSet<String> {
    let text = code(file);
    let mut out = BTreeSet::new();
    for prefix in ["crate::", "driftless::"] {
        for (i, _) in text.match_indices(prefix) {
            // `driftless::` only as a path start, not inside `my_driftless::`.
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue;
            }
            let rest = &text[i + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let inner = &group[..group.find('}').unwrap_or(group.len())];
                for part in inner.split(',') {
                    let name: String = part
                        .trim()
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() {
                        out.insert(name);
                    }
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// Module -> the other top-level modules it imports.
fn edges() -> BTreeMap<String, BTreeSet<String>> {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in rust_files(&src()) {
        let Some(from) = top_module(&f) else { continue };
        let to = edges.entry(from.clone()).or_default();
        for m in imports(&f) {
            if m != from {
                to.insert(m);
            }
        }
    }
    edges
}

#[test]
fn every_import_points_down_the_layer_table_and_none_is_circular() {
    let layers = layer_table();
    let edges = edges();
    let mut wrong = Vec::new();
    for (from, tos) in &edges {
        let Some(lf) = layers.get(from) else {
            wrong.push(format!("`{from}` is not in ARCHITECTURE.md's Layers table"));
            continue;
        };
        for to in tos {
            match layers.get(to) {
                None => wrong.push(format!(
                    "`{from}` imports `{to}`, which is not in the Layers table"
                )),
                Some(lt) if lt > lf => wrong.push(format!(
                    "`{from}` (layer {lf}) imports `{to}` (layer {lt}): imports point down"
                )),
                Some(_) => {}
            }
        }
    }
    for m in layers.keys() {
        if !edges.contains_key(m) {
            wrong.push(format!(
                "the Layers table lists `{m}`, which is not a module in src/"
            ));
        }
    }
    // No cycles, within a layer either: depth-first, reporting the loop.
    fn visit(
        m: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
        wrong: &mut Vec<String>,
    ) {
        if let Some(at) = path.iter().position(|p| p == m) {
            let mut cycle = path[at..].to_vec();
            cycle.push(m.to_string());
            wrong.push(format!("import cycle: {}", cycle.join(" -> ")));
            return;
        }
        if !done.insert(m.to_string()) {
            return;
        }
        path.push(m.to_string());
        for to in edges.get(m).into_iter().flatten() {
            visit(to, edges, path, done, wrong);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done, &mut wrong);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Only the reconciler (and `config`, which names `GitAuth` for the
/// targets' credentials) may name `git`: http, the CLI and status hold an
/// `App`, which has no `Git` in it.
#[test]
fn only_the_reconciler_reaches_git() {
    for (from, tos) in edges() {
        if tos.contains("git") {
            assert!(
                matches!(from.as_str(), "tick" | "config"),
                "`{from}` imports `git`; only `tick` (the Reconciler) may"
            );
        }
    }
}

#[test]
fn backends_never_see_the_queue_git_http_or_tick() {
    for f in rust_files(&src().join("backend")) {
        let text = code(&f);
        for banned in [
            "crate::queue",
            "crate::tick",
            "crate::git",
            "crate::http",
            "crate::cli",
            "crate::daemon",
            "crate::store",
            "crate::scheduler",
        ] {
            assert!(!text.contains(banned), "{} uses {banned}", f.display());
        }
    }
}

#[test]
fn only_the_git_module_knows_gix() {
    for f in rust_files(&src()) {
        if f.starts_with(src().join("git")) {
            continue;
        }
        assert!(!code(&f).contains("gix::"), "{} uses gix", f.display());
    }
}

#[test]
fn http_never_runs_git_or_a_backend() {
    for f in rust_files(&src().join("http")) {
        let text = code(&f);
        for banned in [
            "crate::git",
            "crate::backend",
            ".apply(",
            "run_job",
            "tick_now",
        ] {
            assert!(!text.contains(banned), "{} uses {banned}", f.display());
        }
    }
}

#[test]
fn every_module_says_what_it_is_for() {
    for f in rust_files(&src()) {
        let text = std::fs::read_to_string(&f).expect("read");
        assert!(
            text.starts_with("//!"),
            "{} has no //! module doc",
            f.display()
        );
    }
}

#[test]
fn the_bundled_example_config_is_valid() {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/example.toml");
    let out = std::process::Command::new(crate::common::bin())
        .args(["--config", example.to_str().expect("utf8"), "check"])
        .output()
        .expect("run check");
    assert!(out.status.success(), "{}", crate::common::text(&out.stdout));
}

/// The guide's CLI table (docs/cli.md) and each command's `--help` say the same: the
/// same commands, the same flags, the same exit codes — and where the
/// guide says a command is for every backend or runs in dependency
/// order, the help does not say otherwise. Read from both, so neither can
/// drift from the other again.
#[test]
fn every_commands_help_says_what_the_guide_says() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/cli.md"))
        .expect("docs/cli.md");
    let table = readme
        .split("# The CLI")
        .nth(1)
        .and_then(|t| t.split("\n## ").next())
        .expect("the guide's CLI chapter");
    let help = |args: &[&str]| {
        let out = std::process::Command::new(crate::common::bin())
            .args(args)
            .arg("--help")
            .output()
            .expect("--help");
        crate::common::text(&out.stdout)
    };
    let flags = |text: &str| -> BTreeSet<String> {
        text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .filter(|w| !matches!(*w, "--help" | "--config" | "--version"))
            .map(str::to_string)
            .collect()
    };
    // "Exit 0: …; 2: …; 1: …; 75: …": the codes it names.
    let exit_codes = |text: &str| -> BTreeSet<String> {
        let Some(rest) = text.split("Exit ").nth(1) else {
            return BTreeSet::new();
        };
        rest.split(';')
            .filter_map(|part| part.trim().split(':').next())
            .filter(|code| !code.is_empty() && code.chars().all(|c| c.is_ascii_digit()))
            .map(str::to_string)
            .collect()
    };
    // What the guide says of each command (`token new`: a command and
    // its subcommand), over every row naming it: its flags, the exit
    // codes, and the phrases below where its rows use them.
    type Said<'a> = (BTreeSet<String>, BTreeSet<String>, Vec<&'a str>);
    let mut documented: BTreeMap<Vec<String>, Said> = BTreeMap::new();
    for row in table.lines().filter(|l| l.starts_with("| `driftless ")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let (usage, what) = (cells[0], cells.get(1).copied().unwrap_or(""));
        // `driftless pause <target>` / `resume <target>`: each one.
        for u in usage.split('`').skip(1).step_by(2) {
            let u = u.trim_start_matches("driftless ");
            let args: Vec<String> = u
                .split(' ')
                .take_while(|w| w.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
                .map(str::to_string)
                .collect();
            let entry = documented.entry(args).or_default();
            entry.0.extend(flags(u));
            entry.1.extend(exit_codes(what));
            for phrase in ["dependency order", "blocked", "every backend"] {
                if what.contains(phrase) {
                    entry.2.push(phrase);
                }
            }
        }
    }
    for (args, (readme_flags, codes, phrases)) in &documented {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let said = help(&args);
        assert!(
            !said.is_empty(),
            "`driftless {}` has no --help",
            args.join(" ")
        );
        // The flags --help lists as options (not those its prose names).
        let options = said.split("Options:").nth(1).unwrap_or("");
        let options: String = options
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .map(|l| l.split("  ").find(|p| !p.trim().is_empty()).unwrap_or(""))
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            readme_flags,
            &flags(&options),
            "`driftless {}`: docs/cli.md's flags and --help's differ\n{said}",
            args.join(" ")
        );
        let said_flat = said.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            codes,
            &exit_codes(&said_flat),
            "`driftless {}`: docs/cli.md's exit codes and --help's differ\n{said}",
            args.join(" ")
        );
        for phrase in phrases {
            assert!(
                said_flat.contains(phrase),
                "`driftless {}`: docs/cli.md says \"{phrase}\", --help does not\n{said}",
                args.join(" ")
            );
        }
    }
    let documented: BTreeSet<String> = documented
        .keys()
        .filter_map(|a| a.first().cloned())
        .collect();
    // Every command --help lists is in the guide's table.
    let listed = help(&[]);
    let commands: BTreeSet<String> = listed
        .split("Commands:")
        .nth(1)
        .unwrap_or("")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(!commands.is_empty(), "{listed}");
    let missing: Vec<&String> = commands.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "not in docs/cli.md's table: {missing:?}"
    );
}

/// The anchor GitHub gives a heading: lower case, punctuation dropped,
/// spaces to hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown file's headings (outside code blocks).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// Every relative link in the README, ARCHITECTURE.md and the guide under
/// `docs/` names a file that exists, and where it names a heading
/// (`file.md#heading`), a heading of that file.
#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut pages = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    for e in std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "md") {
            pages.push(e.path());
        }
    }
    assert!(pages.len() > 10, "the guide has chapters: {pages:?}");
    let link = regex_lite::Regex::new(r"\]\(([^)\s]+)\)").expect("regex");
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let text = std::fs::read_to_string(page).expect("read page");
        let name = page
            .strip_prefix(root)
            .unwrap_or(page)
            .display()
            .to_string();
        for cap in link.captures_iter(&text) {
            let target = &cap[1];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let dest = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap_or(root).join(file)
            };
            if !dest.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            if !frag.is_empty() {
                let body = std::fs::read_to_string(&dest).unwrap_or_default();
                if !anchors(&body).contains(frag) {
                    broken.push(format!("{name}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The README is the front page and the guide holds the rest: the README
/// stays short, ARCHITECTURE.md a map rather than a manual.
#[test]
fn the_readme_is_a_front_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines; the rest belongs in docs/"
    );
}

/// A source file is read in one sitting: its production code (what comes
/// before its first `#[cfg(test)]`) stays under 1,000 lines, no exceptions.
#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let long: Vec<String> = rust_files(&src())
        .into_iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(&f).expect("read");
            let n = text
                .lines()
                .take_while(|l| l.trim_end() != "#[cfg(test)]")
                .count();
            let rel = f.strip_prefix(root).unwrap_or(&f).display().to_string();
            (n > 1000).then(|| format!("{rel}: {n} lines"))
        })
        .collect();
    assert!(long.is_empty(), "split these: {long:?}");
}

/// A function is read on one screenful or two: none in production code
/// runs past 130 lines (rustfmt puts a function's closing brace at its
/// `fn`'s indentation, which is how its end is found).
#[test]
fn no_function_is_over_130_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut long = Vec::new();
    for f in rust_files(&src()) {
        let text = std::fs::read_to_string(&f).expect("read");
        let lines: Vec<&str> = text
            .lines()
            .take_while(|l| l.trim_end() != "#[cfg(test)]")
            .collect();
        for (i, l) in lines.iter().enumerate() {
            let body = l.trim_start();
            let indent = &l[..l.len() - body.len()];
            let sig = [
                "pub(crate) ",
                "pub(super) ",
                "pub ",
                "const ",
                "async ",
                "unsafe ",
            ]
            .iter()
            .fold(body, |b, p| b.strip_prefix(p).unwrap_or(b));
            if !sig.starts_with("fn ") || l.trim_end().ends_with(';') {
                continue;
            }
            let close = format!("{indent}}}");
            let Some(end) = lines[i..].iter().position(|x| *x == close) else {
                continue;
            };
            if end + 1 > 130 {
                let rel = f.strip_prefix(root).unwrap_or(&f).display().to_string();
                let name: String = sig[3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                long.push(format!("{rel}:{}: {name}, {} lines", i + 1, end + 1));
            }
        }
    }
    assert!(long.is_empty(), "split these: {long:?}");
}

/// The "Tables and their owners" table of ARCHITECTURE.md: table -> owner
/// (a file, or a module directory ending in `/`), relative to the crate.
fn owner_table() -> BTreeMap<String, String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
            .expect("read ARCHITECTURE.md");
    let section = doc
        .split("\n## Tables and their owners\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Tables and their owners` section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let mut owners = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, table, owner, ..] = cells.as_slice() else {
            continue;
        };
        let (table, owner) = (table.trim_matches('`'), owner.trim_matches('`'));
        if !owner.starts_with("src/") {
            continue;
        }
        assert!(
            owners
                .insert(table.to_string(), owner.to_string())
                .is_none(),
            "`{table}` has two rows"
        );
    }
    assert!(owners.len() > 10, "the owners table lists {owners:?}");
    owners
}

/// A source file's code outside its unit tests (`#[cfg(test)]` onwards),
/// comments dropped.
fn code_outside_tests(p: &Path) -> String {
    let text = code(p);
    text.split("#[cfg(test)]").next().unwrap_or("").to_string()
}

/// The tables each statement of `code` writes: `INSERT INTO t`,
/// `UPDATE t SET`, `DELETE FROM t`.
fn tables_written(code: &str) -> BTreeSet<String> {
    let re =
        regex_lite::Regex::new(r"(?:INSERT INTO|DELETE FROM)\s+([a-z_]+)|UPDATE\s+([a-z_]+)\s+SET")
            .expect("regex");
    re.captures_iter(code)
        .filter_map(|c| c.get(1).or(c.get(2)).map(|m| m.as_str().to_string()))
        .collect()
}

/// Every table has one writer: only its owner (ARCHITECTURE.md's table)
/// writes it, and every table written has an owner there.
#[test]
fn every_table_is_written_by_its_owner_alone() {
    let owners = owner_table();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut wrong = Vec::new();
    let mut seen = BTreeSet::new();
    for file in rust_files(&src()) {
        let rel = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .display()
            .to_string();
        for table in tables_written(&code_outside_tests(&file)) {
            seen.insert(table.clone());
            match owners.get(&table) {
                None => wrong.push(format!("{rel} writes `{table}`, which has no owner")),
                Some(o) if o.ends_with('/') && rel.starts_with(o.as_str()) => {}
                Some(o) if *o == rel => {}
                Some(o) => wrong.push(format!("{rel} writes `{table}`, owned by {o}")),
            }
        }
    }
    assert!(seen.len() > 10, "only {seen:?} found written");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    for (table, owner) in &owners {
        assert!(
            root.join(owner).exists(),
            "`{table}`'s owner {owner} does not exist"
        );
    }
}

/// SQL runs only under `src/store/`: no other file (its unit tests aside)
/// builds a query or holds a statement.
#[test]
fn only_the_store_runs_sql() {
    let sql = regex_lite::Regex::new(
        r#"sqlx::query|rusqlite::|\.prepare_cached\(|"\s*(?:SELECT\s[^"]*\sFROM\s|INSERT INTO|DELETE FROM|UPDATE\s+[a-z_]+\s+SET)"#,
    )
    .expect("regex");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let store = src().join("store");
    let mut outside = Vec::new();
    let mut inside = 0;
    for file in rust_files(&src()) {
        let code = code_outside_tests(&file);
        let n = sql.find_iter(&code).count();
        if file.starts_with(&store) {
            inside += n;
        } else if n > 0 {
            let rel = file
                .strip_prefix(root)
                .unwrap_or(&file)
                .display()
                .to_string();
            outside.push(format!("{rel}: {n}"));
        }
    }
    assert!(
        inside > 100,
        "only {inside} statements found under src/store/"
    );
    assert!(
        outside.is_empty(),
        "SQL outside src/store/:\n{}",
        outside.join("\n")
    );
}

/// Every test ARCHITECTURE.md names for an invariant
/// (`file.rs::test_name`) exists in `tests/it/`.
#[test]
fn every_invariant_names_a_test_that_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let named = regex_lite::Regex::new(r"`([a-z_0-9]+)\.rs::([a-z_0-9]+)`").expect("regex");
    let mut missing = Vec::new();
    let mut checked = 0;
    for c in named.captures_iter(&doc) {
        let (file, test) = (&c[1], &c[2]);
        let path = root.join("tests/it").join(format!("{file}.rs"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        checked += 1;
        if !text.contains(&format!("fn {test}(")) {
            missing.push(format!("tests/it/{file}.rs::{test}"));
        }
    }
    assert!(checked > 20, "only {checked} tests named");
    assert!(
        missing.is_empty(),
        "named but not found:\n{}",
        missing.join("\n")
    );
}

/// The production code of a file: up to its first column-0 `#[cfg(test)]`.
fn production(p: &Path) -> String {
    let all = code(p);
    match all.find("\n#[cfg(test)]") {
        Some(i) => all[..i].to_string(),
        None => all,
    }
}

fn ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `text` has `word` with no identifier character either side.
fn has_word(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(ident)
            && !text[i + word.len()..].chars().next().is_some_and(ident)
    })
}

/// Whether `text` has a path through `module` (`module::`, not
/// `other_module::`).
fn has_path(text: &str, module: &str) -> bool {
    text.match_indices(&format!("{module}::"))
        .any(|(i, _)| !text[..i].chars().next_back().is_some_and(ident))
}

/// A backend plugs in by its own module and one registry line: no code
/// outside `src/backend/<module>` names its module or its `BackendConfig`
/// variant, and `src/backend/mod.rs` names it only in `pub mod` and the
/// `backends!` registry. Nomad, which keeps per-deployment state (the unit
/// ledger), reviews each job and follows it until it settles, is not even
/// named in code anywhere else: the store, config, tick, API and page
/// serve it through the shared deployment vocabulary.
#[test]
fn only_the_registry_names_a_backend_outside_its_module() {
    let registry_file = src().join("backend/mod.rs");
    let registry_code = production(&registry_file);
    let start = registry_code
        .find("backends! {")
        .expect("the backends! registry");
    let registry = &registry_code[start..start + registry_code[start..].find('}').expect("end")];
    let backends: Vec<(String, String)> = registry
        .lines()
        .filter_map(|l| {
            let (variant, rest) = l.trim().split_once('(')?;
            let (module, _) = rest.split_once(')')?;
            Some((variant.to_string(), module.to_string()))
        })
        .collect();
    assert!(backends.len() >= 8, "{backends:?}");
    let mut found = Vec::new();
    for file in rust_files(&src()) {
        let rel = file.strip_prefix(src()).expect("under src").to_path_buf();
        let text = production(&file);
        for (variant, module) in &backends {
            let own = rel.starts_with(format!("backend/{module}"))
                || rel == Path::new(&format!("backend/{module}.rs"));
            if own || rel.starts_with("backend") && rel != Path::new("backend/mod.rs") {
                continue;
            }
            for (n, line) in text.lines().enumerate() {
                let registered = rel == Path::new("backend/mod.rs")
                    && (line.trim() == format!("pub mod {module};")
                        || line.trim() == format!("{variant}({module}) = \"{module}\","));
                if registered {
                    continue;
                }
                let named = has_path(line, module)
                    || line.contains(&format!("BackendConfig::{variant}"))
                    || (module == "nomad" && has_word(&line.to_lowercase(), "nomad"));
                if named {
                    found.push(format!("{}:{}: {}", rel.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "backends named outside their module and the registry:\n{}",
        found.join("\n")
    );
}
