//! `checkout = "sparse"`: a target's checkout holds only its `path`, its
//! `extra_paths` and the repository's top-level files (git's sparse
//! checkout, cone mode), through the real git; full checkouts keep every
//! directory, so a Terraform module in a sibling directory works there,
//! and a sparse target without it fails saying what its checkout holds.

use std::path::Path;

use crate::common::*;

/// The files under `dir` (its `.git` left out), relative, sorted.
fn files(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let p = e.path();
            if p.file_name().is_some_and(|n| n == ".git") {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else if let Ok(rel) = p.strip_prefix(root) {
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// The entries of the checkout's index, as `git ls-files` lists them.
fn indexed(dir: &Path) -> Vec<String> {
    let out = std::process::Command::new("git")
        .args(["ls-files"])
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .output()
        .expect("git ls-files runs");
    assert!(out.status.success(), "git ls-files: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

fn last(s: &Setup, target: &str) -> (String, String) {
    let st = s.target_status(target);
    (
        st["last_result"].as_str().unwrap_or("").to_string(),
        st["last_message"].as_str().unwrap_or("").to_string(),
    )
}

#[test]
fn a_sparse_checkout_holds_only_its_directories_and_follows_the_config() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "mono");
    remote.commit(
        &[
            ("README.md", "top-level\n"),
            ("app/deploy.sh", "test -f ../lib/common.sh\n"),
            ("lib/common.sh", "echo common\n"),
            ("other/big.txt", "not this target's\n"),
            ("deep/a/b/file", "nested\n"),
        ],
        "mono",
    );
    let sparse = "path = \"app\"\ncheckout = \"sparse\"\nextra_paths = [\"lib\", \"deep/a\"]";
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        sparse,
        "apply = [\"sh\", \"deploy.sh\"]",
    ));
    let out = s.run(&["tick", "app"]);
    succeeded(&out, "tick app (sparse)");
    assert_eq!(last(&s, "app").0, "changed");
    assert_eq!(
        files(&s.checkout("app")),
        [
            "README.md",
            "app/deploy.sh",
            "deep/a/b/file",
            "lib/common.sh"
        ],
        "the checkout holds the target's path, its extra paths and the top-level files"
    );
    // Its index too: git's entries for the rest of the tree are dropped
    // (on a monorepo they are most of a sparse checkout's disk).
    assert_eq!(indexed(&s.checkout("app")), files(&s.checkout("app")));

    // Nothing to do: nothing moves, and a change outside the target's
    // path is not its change.
    succeeded(&s.run(&["tick", "app"]), "tick (no change)");
    assert_eq!(last(&s, "app").0, "no_change");
    remote.commit(&[("other/big.txt", "still not\n")], "other");
    succeeded(&s.run(&["tick", "app"]), "tick (another directory)");
    assert_eq!(last(&s, "app").0, "no_change");
    assert!(!s.checkout("app").join("other").exists());

    // A change inside: applied, still sparse.
    remote.commit(
        &[("app/deploy.sh", "test -f ../lib/common.sh && true\n")],
        "app",
    );
    succeeded(&s.run(&["tick", "app"]), "tick (a change)");
    assert_eq!(last(&s, "app").0, "changed");
    assert!(!s.checkout("app").join("other").exists());
    assert_eq!(
        std::fs::read_to_string(s.checkout("app").join("app/deploy.sh")).expect("read"),
        "test -f ../lib/common.sh && true\n"
    );
    assert_eq!(indexed(&s.checkout("app")), files(&s.checkout("app")));

    // A directory added to extra_paths: there at the next run, though its
    // entries had been dropped from the index.
    let wider = std::fs::read_to_string(&s.config).expect("config").replace(
        "extra_paths = [\"lib\", \"deep/a\"]",
        "extra_paths = [\"lib\", \"deep/a\", \"other\"]",
    );
    std::fs::write(&s.config, wider).expect("config");
    succeeded(&s.run(&["tick", "app"]), "tick (wider)");
    assert_eq!(
        std::fs::read_to_string(s.checkout("app").join("other/big.txt")).expect("other/big.txt"),
        "still not\n"
    );

    // Back to a full checkout: every directory is there again, the
    // checkout at the same commit.
    let full = std::fs::read_to_string(&s.config).expect("config").replace(
        "checkout = \"sparse\"\nextra_paths = [\"lib\", \"deep/a\", \"other\"]",
        "",
    );
    std::fs::write(&s.config, full).expect("config");
    succeeded(&s.run(&["tick", "app"]), "tick (full)");
    assert!(
        files(&s.checkout("app")).contains(&"other/big.txt".to_string()),
        "{:?}",
        files(&s.checkout("app"))
    );
    assert_eq!(indexed(&s.checkout("app")), files(&s.checkout("app")));
}

#[test]
fn a_sparse_target_without_what_its_backend_needs_says_what_its_checkout_holds() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "mono");
    remote.commit(
        &[
            ("app/deploy.sh", "test -f ../lib/common.sh\n"),
            ("lib/common.sh", "echo common\n"),
        ],
        "mono",
    );
    let s = Setup::new(&exec_target(
        "app",
        &remote.url(),
        "path = \"app\"\ncheckout = \"sparse\"",
        "apply = [\"sh\", \"deploy.sh\"]",
    ));
    let out = s.run(&["tick", "app"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let (result, message) = last(&s, "app");
    assert_eq!(result, "failed");
    assert!(
        message.contains("its checkout is sparse: only app and the repository's top-level files")
            && message.contains("extra_paths"),
        "{message}"
    );
}

const MODULE_TF: &str = r#"
variable "name" {
  type = string
}
resource "terraform_data" "m" {
  input = var.name
}
output "name" {
  value = terraform_data.m.output
}
"#;

const STACK_TF: &str = r#"
module "shared" {
  source = "../modules/shared"
  name   = "stack"
}
output "name" {
  value = module.shared.name
}
"#;

/// A Terraform module in a sibling directory: a full checkout has it; a
/// sparse one has it only when `extra_paths` names it, and says so when
/// it does not.
#[test]
fn a_terraform_module_in_a_sibling_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("stack/main.tf", STACK_TF),
            ("modules/shared/main.tf", MODULE_TF),
        ],
        "stack",
    );
    let target = |name: &str, extra: &str| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"{}\"\npath = \"stack\"\ntimeout = \"2m\"\n{extra}\n\
             [targets.backend]\nkind = \"terraform\"\nenv = {{ TF_CLI_CONFIG_FILE = \"/dev/null\" }}\n\n",
            remote.url()
        )
    };
    let s = Setup::new(
        &[
            target("full", ""),
            target("bare", "checkout = \"sparse\""),
            target(
                "with-module",
                "checkout = \"sparse\"\nextra_paths = [\"modules/shared\"]",
            ),
        ]
        .concat(),
    );
    succeeded(&s.run(&["tick", "full"]), "tick full");
    assert_eq!(last(&s, "full").0, "changed");

    let out = s.run(&["tick", "bare"]);
    assert_eq!(out.status.code(), Some(1));
    let (result, message) = last(&s, "bare");
    assert_eq!(result, "failed");
    assert!(
        message.contains("its checkout is sparse: only stack and the repository's top-level files"),
        "{message}"
    );

    succeeded(&s.run(&["tick", "with-module"]), "tick with-module");
    assert_eq!(last(&s, "with-module").0, "changed");
    let outputs = s.run(&["outputs", "with-module", "--json"]);
    assert!(
        succeeded(&outputs, "outputs").contains("\"stack\""),
        "the module ran"
    );
    assert!(!s.checkout("with-module").join("modules/other").exists());
}

/// `check` names each mistake in `checkout` and `extra_paths`.
#[test]
fn check_names_the_sparse_keys_at_fault() {
    let s = Setup::new(
        &[
            exec_target(
                "a",
                "https://git.example.net/r.git",
                "path = \"app\"\ncheckout = \"thin\"",
                "apply = [\"true\"]",
            ),
            exec_target(
                "b",
                "https://git.example.net/r.git",
                "path = \"app\"\nextra_paths = [\"lib\"]",
                "apply = [\"true\"]",
            ),
            exec_target(
                "c",
                "https://git.example.net/r.git",
                "checkout = \"sparse\"",
                "apply = [\"true\"]",
            ),
            exec_target(
                "d",
                "https://git.example.net/r.git",
                "path = \"app\"\ncheckout = \"sparse\"\nextra_paths = [\"../etc\", \".\"]",
                "apply = [\"true\"]",
            ),
        ]
        .concat(),
    );
    let out = s.run(&["check"]);
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout) + &text(&out.stderr);
    for (target, key) in [
        ("a", "checkout"),
        ("b", "extra_paths"),
        ("c", "checkout"),
        ("d", "extra_paths[0]"),
        ("d", "extra_paths[1]"),
    ] {
        assert!(
            said.contains(&format!("targets[{target}]: key `{key}`")),
            "no problem for {target}'s {key}:\n{said}"
        );
    }
}
