//! The layering rules of ARCHITECTURE.md, checked on the source, and the
//! bundled example configuration kept valid.

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
        if f.ends_with("git.rs") {
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
