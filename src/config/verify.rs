//! `verify` (`[targets.verify]`, or `[defaults.verify]` for targets without
//! one): the keys a target's commits must be signed with, and whether the
//! commit to apply or every commit since the last applied one must be.
//! Checked here: the keys, the mode, and (`check`, on this machine) that
//! the files can be read. Verifying is `git::verify`'s.

use super::*;
use crate::git::Verification;

/// `verify`: only commits signed by these keys are applied
/// (docs/supply-chain.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVerify {
    /// SSH keys in git's allowed-signers format.
    allowed_signers_file: Option<String>,
    /// OpenPGP public keys (armored or binary).
    gpg_keyring_file: Option<String>,
    /// `head`: the commit to apply must be signed; `all`: every commit
    /// since the last applied one. Default: head.
    #[schemars(extend("enum" = ["head", "all"]))]
    mode: Option<String>,
    /// A branch tip that does not descend from the commit last applied (a
    /// force push back) is applied without waiting for
    /// `driftless retry --accept-rewind`. Default: false.
    allow_rewind: Option<bool>,
}

pub(super) fn validate_verify(
    raw: Value,
    section: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Verification> {
    let raw = read_table::<RawVerify>(raw, section, "verify.", problems)?;
    let every_commit = match raw.mode.as_deref() {
        None | Some("head") => false,
        Some("all") => true,
        Some(other) => {
            problems.push(problem(
                section,
                "verify.mode",
                format!(
                    "`{other}` is not one of \"head\" (the commit to apply is signed) \
                     or \"all\" (every commit since the last applied one is)"
                ),
            ));
            false
        }
    };
    let mut file = |key: &str, v: Option<String>| -> Option<PathBuf> {
        let v = v?;
        if v.is_empty() {
            problems.push(problem(
                section,
                &format!("verify.{key}"),
                "must not be empty",
            ));
            return None;
        }
        let path = resolve(base, &v);
        if machine && std::fs::read(&path).is_err() {
            problems.push(problem(
                section,
                &format!("verify.{key}"),
                format!("{} is not a readable file", path.display()),
            ));
        }
        Some(path)
    };
    let allowed_signers_file = file("allowed_signers_file", raw.allowed_signers_file);
    let gpg_keyring_file = file("gpg_keyring_file", raw.gpg_keyring_file);
    if allowed_signers_file.is_none() && gpg_keyring_file.is_none() {
        problems.push(problem(
            section,
            "verify",
            "name the keys commits must be signed with: allowed_signers_file (SSH) \
             and/or gpg_keyring_file (OpenPGP)",
        ));
        return None;
    }
    Some(Verification {
        allowed_signers_file,
        gpg_keyring_file,
        every_commit,
        allow_rewind: raw.allow_rewind.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::super::*;

    fn load(s: &str, machine: bool) -> Result<Settings, ConfigError> {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("signers"),
            "a@example.net ssh-ed25519 AAAA\n",
        )
        .expect("signers");
        let p = dir.path().join("c.toml");
        std::fs::write(&p, s).expect("write");
        if machine {
            check(&p)
        } else {
            load_with_env(&p, false)
        }
    }

    fn target(name: &str, verify: &str) -> String {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"https://example.net/r.git\"\n{verify}\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
        )
    }

    #[test]
    fn verify_tables_are_checked_and_defaults_fill_in() {
        let ok = load(
            &format!(
                "[defaults.verify]\nallowed_signers_file = \"signers\"\n\n{}{}",
                target(
                    "own",
                    "[targets.verify]\ngpg_keyring_file = \"keys.asc\"\nmode = \"all\""
                ),
                target("inherits", ""),
            ),
            false,
        )
        .expect("valid");
        let own = ok.targets[0].verify.clone().expect("own");
        assert!(own.every_commit && own.allowed_signers_file.is_none());
        assert!(
            own.gpg_keyring_file
                .is_some_and(|f| f.ends_with("keys.asc"))
        );
        let inherited = ok.targets[1].verify.clone().expect("inherited");
        assert!(!inherited.every_commit);
        assert!(
            inherited
                .allowed_signers_file
                .is_some_and(|f| f.ends_with("signers"))
        );

        let shown = match load(
            &format!(
                "{}{}{}{}",
                target(
                    "a",
                    "[targets.verify]\nallowed_signers_file = \"signers\"\nmode = \"tip\""
                ),
                target("b", "[targets.verify]\nmode = \"all\""),
                target("c", "[targets.verify]\nallowed_signers = \"signers\""),
                target("d", "[targets.verify]\ngpg_keyring_file = \"missing.asc\""),
            ),
            true,
        ) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        };
        let shown: Vec<String> = shown.iter().map(|p| p.to_string()).collect();
        for want in [
            "targets[a]: key `verify.mode`: `tip` is not one of \"head\"",
            "targets[b]: key `verify`: name the keys commits must be signed with",
            "targets[c]: key `verify.allowed_signers`: unknown field",
            "targets[d]: key `verify.gpg_keyring_file`: ",
        ] {
            assert!(
                shown.iter().any(|p| p.starts_with(want)),
                "{want:?} not in {shown:#?}"
            );
        }
        assert!(
            shown
                .iter()
                .any(|p| p.contains("missing.asc is not a readable file")),
            "{shown:#?}"
        );
    }

    #[test]
    fn tag_targets_are_checked() {
        let ok = load(&target("t", "tag = \"v*\""), false).expect("valid");
        assert_eq!(ok.targets[0].tag.as_deref(), Some("v*"));
        let shown = match load(
            &format!(
                "{}{}{}",
                target("a", "tag = \"v*\"\nbranch = \"main\""),
                target("b", "tag = \"v*.*\""),
                target("c", "tag = \"v*\"\nforge = \"gh\"\npreviews = true"),
            ),
            false,
        ) {
            Err(ConfigError::Invalid { problems, .. }) => problems,
            other => panic!("expected problems, got {other:?}"),
        };
        let shown: Vec<String> = shown.iter().map(|p| p.to_string()).collect();
        for want in [
            "targets[a]: key `tag`: set either `branch`",
            "targets[b]: key `tag`: `v*.*` is not a tag pattern",
            "targets[c]: key `previews`: previews plan pull requests into a branch",
        ] {
            assert!(
                shown.iter().any(|p| p.starts_with(want)),
                "{want:?} not in {shown:#?}"
            );
        }
    }
}
