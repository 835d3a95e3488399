//! Commit signatures: is the commit about to be applied (or every commit
//! since the last applied one) signed by a key the target lists?
//!
//! The real tools decide: `git log` with `%G?` asks gpg (OpenPGP) or
//! `ssh-keygen -Y` (SSH) about each commit, in an isolated setting — a
//! private GnuPG home holding only the target's keyring, git's allowed
//! signers file set on the command line, no system or global git config —
//! so the host user's keyrings and `~/.gitconfig` never count. A commit
//! verified once for a target and a given set of keys is noted (a file in
//! the state directory) and not asked about again: a tick with nothing to
//! do starts no process. This module must not touch a checkout: it reads
//! the cache, after the fetch and before anything moves.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use super::Git;
use crate::plan::Signer;
use crate::process::{self, Spec};
use crate::redact::Redactor;

/// How long verifying may take (one gpg or ssh-keygen per signed commit).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(5 * 60);

/// What a target's commits must carry (`[targets.verify]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// git's allowed-signers format: SSH keys and who they belong to.
    pub allowed_signers_file: Option<PathBuf>,
    /// OpenPGP public keys, armored or binary.
    pub gpg_keyring_file: Option<PathBuf>,
    /// `mode = "all"`: every commit since the last applied one, not only the
    /// commit to apply.
    pub every_commit: bool,
    /// `allow_rewind = true`: a branch tip that does not descend from the
    /// commit last applied (a force push) is applied without a person
    /// accepting it first.
    pub allow_rewind: bool,
}

/// Why a commit is refused, or why none could be checked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Refused {
    #[error("commit {commit} refused: {why}")]
    Commit { commit: String, why: String },
    #[error("tag {tag} refused: {why}")]
    Tag { tag: String, why: String },
    #[error("cannot verify commit signatures: {0}")]
    Cannot(String),
}

impl Git {
    /// Check `tip` of `remote` (already fetched into its cache) for target
    /// `target`: with `every_commit`, every commit reachable from `tip` and
    /// not from `last_applied` (the tip alone when nothing was applied
    /// yet). `Ok` when every one carries a good signature from a listed key.
    pub async fn verify(
        &self,
        target: &str,
        remote: &str,
        tip: &str,
        last_applied: Option<&str>,
        v: &Verification,
    ) -> Result<(), Refused> {
        let Some(b) = self.begin(target, v, tip).await? else {
            return Ok(());
        };
        let (work, home, deadline, noted, note) = (b.work, b.home, b.deadline, b.noted, b.note);
        let cache = self.cache_dir(remote);
        let mut argv: Vec<String> = [
            "git",
            "-c",
            &b.allowed,
            "log",
            "--format=%H%x1f%G?%x1f%GK%x1f%GS%x1f%GF",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every commit since the last applied one; with none since (the
        // tip is the commit last applied), the tip itself, as in "head" mode.
        match (v.every_commit, last_applied) {
            (true, Some(last)) if last != tip => {
                argv.extend([tip.to_string(), "--not".into(), last.to_string()])
            }
            _ => argv.extend(["-1".to_string(), tip.to_string()]),
        }
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = run(&argv, &cache, &home, deadline).await?;
        if !out.success() {
            return Err(Refused::Cannot(format!(
                "git log in {} failed: {}",
                cache.display(),
                out.stderr_summary(3)
            )));
        }
        // Oldest first: the first bad commit in history is the one named;
        // the last judged is the tip (git log lists newest first).
        let mut signer = None;
        for line in out.stdout.lines().rev() {
            signer = Some(judge(line)?);
        }
        let _ = std::fs::remove_dir_all(&work);
        write_note(&noted, &note, tip, signer)
    }

    /// Who signed `commit` (or the tag naming it), as the verification
    /// noted for `target` found (read-only, no process): `None` when the
    /// last verification noted for it was of another commit, or before
    /// driftless noted signers.
    pub fn signer(&self, target: &str, commit: &str) -> Option<Signer> {
        let noted =
            std::fs::read_to_string(self.verify_root.join(format!("{target}.verified"))).ok()?;
        let n: Noted = serde_json::from_str(noted.lines().nth(1)?).ok()?;
        (n.commit == commit).then_some(n.signer)
    }

    /// `None` when `what` (a commit, or a tag and its object) was verified
    /// for `target` under these keys already; else a fresh private GnuPG
    /// home holding only its keyring, and git's allowed-signers setting.
    async fn begin(
        &self,
        target: &str,
        v: &Verification,
        what: &str,
    ) -> Result<Option<Begun>, Refused> {
        let keys = read_keys(v)?;
        let noted = self.verify_root.join(format!("{target}.verified"));
        let note = format!("{what} {}\n", keys.digest);
        // The first line says what was verified under which keys; the
        // second, who signed it.
        if std::fs::read_to_string(&noted).is_ok_and(|n| n.lines().next() == Some(note.trim_end()))
        {
            return Ok(None);
        }
        let (work, home, deadline) = self.prepare(target, v).await?;
        let signers = v
            .allowed_signers_file
            .as_deref()
            .unwrap_or(Path::new("/dev/null"));
        Ok(Some(Begun {
            work,
            home,
            deadline,
            noted,
            note,
            allowed: format!("gpg.ssh.allowedSignersFile={}", signers.display()),
        }))
    }

    /// A fresh private GnuPG home for `target` holding only its keyring;
    /// the directory to remove afterwards, the home and the deadline.
    async fn prepare(
        &self,
        target: &str,
        v: &Verification,
    ) -> Result<(PathBuf, PathBuf, Instant), Refused> {
        let work = self.verify_root.join(target);
        let _ = std::fs::remove_dir_all(&work);
        let home = work.join("gnupg");
        create_private_dir(&home)
            .map_err(|e| Refused::Cannot(format!("cannot create {}: {e}", home.display())))?;
        // Nothing to start: verifying needs no agent or key server.
        std::fs::write(home.join("gpg.conf"), "no-autostart\n")
            .map_err(|e| Refused::Cannot(format!("cannot write gpg.conf: {e}")))?;
        let deadline = Instant::now() + VERIFY_TIMEOUT;
        if let Some(keyring) = &v.gpg_keyring_file {
            let argv = [
                "gpg",
                "--homedir",
                &home.to_string_lossy(),
                "--batch",
                "--quiet",
                "--import",
                &keyring.to_string_lossy(),
            ];
            let out = run(&argv, &work, &home, deadline).await?;
            if !out.success() {
                return Err(Refused::Cannot(format!(
                    "gpg cannot import gpg_keyring_file {}: {}",
                    keyring.display(),
                    out.stderr_summary(3)
                )));
            }
        }
        Ok((work, home, deadline))
    }

    /// Check that `tag` (fetched into `remote`'s cache) is an annotated tag
    /// carrying a good signature from a key `v` lists.
    pub async fn verify_tag(
        &self,
        target: &str,
        remote: &str,
        tag: &super::TagTip,
        v: &Verification,
    ) -> Result<(), Refused> {
        let refuse = |why: String| Refused::Tag {
            tag: tag.name.clone(),
            why,
        };
        if !tag.annotated {
            return Err(refuse(
                "a lightweight tag carries no signature: sign it (git tag -s)".into(),
            ));
        }
        let what = format!("tag {} {}", tag.name, tag.object);
        let Some(b) = self.begin(target, v, &what).await? else {
            return Ok(());
        };
        let (work, home, deadline, noted, note) = (b.work, b.home, b.deadline, b.noted, b.note);
        let cache = self.cache_dir(remote);
        let argv = ["git", "-c", &b.allowed, "verify-tag", "--raw", &tag.object];
        let out = run(&argv, &cache, &home, deadline).await?;
        let _ = std::fs::remove_dir_all(&work);
        let said = format!("{}\n{}", out.stdout, out.stderr);
        let good =
            said.contains("[GNUPG:] GOODSIG") || said.contains("Good \"git\" signature for ");
        if out.success() && good {
            return write_note(&noted, &note, &tag.commit, tag_signer(&said));
        }
        let why = tag_refusal(&said)
            .map(str::to_string)
            .unwrap_or_else(|| format!("git verify-tag: {}", out.stderr_summary(3)));
        Err(refuse(why))
    }
}

/// What a passed verification notes beside what it verified.
#[derive(serde::Serialize, serde::Deserialize)]
struct Noted {
    /// The commit applied: the tip, or the commit the tag names.
    commit: String,
    signer: Signer,
}

/// Note that `note` (what was verified, under which keys) passed, and who
/// signed `commit` when that is known.
fn write_note(
    noted: &Path,
    note: &str,
    commit: &str,
    signer: Option<Signer>,
) -> Result<(), Refused> {
    let mut text = note.to_string();
    if let Some(signer) = signer {
        let n = Noted {
            commit: commit.to_string(),
            signer,
        };
        if let Ok(line) = serde_json::to_string(&n) {
            text.push_str(&line);
            text.push('\n');
        }
    }
    std::fs::write(noted, text).map_err(|e| {
        Refused::Cannot(format!(
            "cannot note the verification in {}: {e}",
            noted.display()
        ))
    })
}

/// Who signed a tag `git verify-tag --raw` passed, from what it said:
/// gpg's `GOODSIG <key id> <user id>` and `VALIDSIG <fingerprint> …`
/// status lines, or ssh-keygen's `Good "git" signature for <principal>
/// with <type> key <SHA256:…>`.
fn tag_signer(said: &str) -> Option<Signer> {
    let signer = |name: &str, key: &str| Signer {
        name: name.to_string(),
        key: key.to_string(),
        on: "tag".into(),
    };
    let mut gpg_name = None;
    let mut gpg_key = None;
    for line in said.lines() {
        if let Some(rest) = line.strip_prefix("[GNUPG:] GOODSIG ") {
            let (id, name) = rest.split_once(' ').unwrap_or((rest, ""));
            gpg_name = Some(name.to_string());
            gpg_key.get_or_insert_with(|| id.to_string());
        } else if let Some(rest) = line.strip_prefix("[GNUPG:] VALIDSIG ") {
            gpg_key = rest.split(' ').next().map(str::to_string);
        } else if let Some(rest) = line.strip_prefix("Good \"git\" signature for ")
            && let Some((name, key)) = rest.split_once(" with ")
        {
            let key = key.rsplit(' ').next().unwrap_or(key);
            return Some(signer(name, key));
        }
    }
    Some(signer(&gpg_name?, &gpg_key?))
}

/// Why `git verify-tag --raw` refused a tag, from what it said (gpg's
/// status lines, or ssh-keygen's words); `None` when it says nothing known.
fn tag_refusal(said: &str) -> Option<&'static str> {
    let has = |w: &str| said.contains(w);
    Some(if has("NO_PUBKEY") || has("ERRSIG") {
        "signed by a key that is not in gpg_keyring_file"
    } else if has("EXPKEYSIG") || has("KEYEXPIRED") {
        "signed by a key that has expired"
    } else if has("REVKEYSIG") {
        "signed by a key that is revoked"
    } else if has("BADSIG") {
        "bad signature (the tag does not match it)"
    } else if has("Good \"git\" signature with") || has("No principal matched") {
        "signed by an SSH key that no entry of allowed_signers_file lists"
    } else if has("no signature found") {
        "not signed"
    } else {
        return None;
    })
}

/// A verification under way (`Git::begin`).
struct Begun {
    /// Removed when done.
    work: PathBuf,
    /// The private GnuPG home.
    home: PathBuf,
    deadline: Instant,
    /// Where a success is noted, and what.
    noted: PathBuf,
    note: String,
    /// `gpg.ssh.allowedSignersFile=…` for git's command line.
    allowed: String,
}

/// The key files' bytes, hashed with the mode: a verification noted under
/// other keys does not count.
struct Keys {
    digest: String,
}

fn read_keys(v: &Verification) -> Result<Keys, Refused> {
    let mut h = Sha256::new();
    h.update(if v.every_commit { b"all\0" } else { b"head" });
    for (key, file) in [
        ("allowed_signers_file", &v.allowed_signers_file),
        ("gpg_keyring_file", &v.gpg_keyring_file),
    ] {
        h.update(key.as_bytes());
        if let Some(f) = file {
            let bytes = std::fs::read(f).map_err(|e| {
                Refused::Cannot(format!("cannot read verify.{key} {}: {e}", f.display()))
            })?;
            h.update((bytes.len() as u64).to_le_bytes());
            h.update(&bytes);
        }
    }
    Ok(Keys {
        digest: hex::encode(h.finalize()),
    })
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Run `argv` in `cwd` with the private GnuPG home and no system or global
/// git config.
async fn run(
    argv: &[&str],
    cwd: &Path,
    gnupg_home: &Path,
    deadline: Instant,
) -> Result<process::Output, Refused> {
    let mut spec = Spec::new(argv.iter().map(|s| s.to_string()).collect(), cwd);
    spec.deadline = Some(deadline);
    spec.env.insert("GIT_CONFIG_NOSYSTEM".into(), "1".into());
    spec.env
        .insert("GIT_CONFIG_GLOBAL".into(), "/dev/null".into());
    spec.env.insert(
        "GNUPGHOME".into(),
        gnupg_home.to_string_lossy().into_owned(),
    );
    process::run(&spec, &Redactor::new())
        .await
        .map_err(|e| Refused::Cannot(e.to_string()))
}

/// One `git log` line: `%H %G? %GK %GS %GF`, separated by 0x1f.
fn judge(line: &str) -> Result<Signer, Refused> {
    let mut f = line.split('\u{1f}');
    let commit = f.next().unwrap_or("").to_string();
    let code = f.next().unwrap_or("");
    let key = f.next().unwrap_or("");
    let signer = f.next().unwrap_or("");
    let fingerprint = f.next().unwrap_or("");
    let by = || {
        let id = if fingerprint.is_empty() {
            key
        } else {
            fingerprint
        };
        if signer.is_empty() {
            format!("key {id}")
        } else {
            format!("key {id} ({signer})")
        }
    };
    let why = match code {
        // A good signature: gpg found the key in the target's keyring, or
        // ssh-keygen found the key's principal in allowed_signers_file. An
        // SSH signature whose key no entry lists is good but has no
        // principal: not ours.
        "G" | "U" if !signer.is_empty() => {
            return Ok(Signer {
                name: signer.to_string(),
                key: if fingerprint.is_empty() {
                    key
                } else {
                    fingerprint
                }
                .to_string(),
                on: "commit".into(),
            });
        }
        "G" | "U" => format!(
            "signed by SSH {}, which no entry of allowed_signers_file lists",
            by()
        ),
        "N" => "not signed".to_string(),
        "B" => format!("bad signature (the commit does not match it) from {}", by()),
        "E" if key.starts_with("SHA256:") => format!(
            "signed by SSH {}, which cannot be checked (not in allowed_signers_file?)",
            by()
        ),
        "E" => format!(
            "signed by {}, which is not in gpg_keyring_file (or the signature cannot be checked)",
            by()
        ),
        "X" => format!("the signature by {} has expired", by()),
        "Y" => format!("signed by {}, which has expired", by()),
        "R" => format!("signed by {}, which is revoked", by()),
        other => format!("git reports signature status `{other}` for {}", by()),
    };
    Err(Refused::Commit { commit, why })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(code: &str, key: &str, signer: &str) -> String {
        ["c0ffee", code, key, signer, key].join("\u{1f}")
    }

    /// Each thing `git verify-tag` may say of a refused tag, alone, is
    /// named for what it is.
    #[test]
    fn a_refused_tag_is_named_for_what_git_said() {
        for (said, why) in [
            ("[GNUPG:] NO_PUBKEY 0123", "not in gpg_keyring_file"),
            ("[GNUPG:] ERRSIG 0123 1 8 00", "not in gpg_keyring_file"),
            ("[GNUPG:] EXPKEYSIG 0123 Signer", "has expired"),
            ("[GNUPG:] KEYEXPIRED 1700000000", "has expired"),
            ("[GNUPG:] REVKEYSIG 0123 Signer", "revoked"),
            ("[GNUPG:] BADSIG 0123 Signer", "bad signature"),
            (
                "Good \"git\" signature with ED25519 key SHA256:abc",
                "no entry of allowed_signers_file",
            ),
            ("No principal matched.", "no entry of allowed_signers_file"),
            ("error: no signature found", "not signed"),
        ] {
            let got = tag_refusal(said).unwrap_or("nothing");
            assert!(got.contains(why), "{said:?}: {got}");
        }
        assert_eq!(tag_refusal("something else entirely"), None);
    }

    /// Who signed a passed tag, as gpg's status lines or ssh-keygen say.
    #[test]
    fn a_tags_signer_is_read_from_what_verify_tag_said() {
        let gpg = "[GNUPG:] NEWSIG\n[GNUPG:] GOODSIG 0123456789ABCDEF Signer <s@example.net>\n\
                   [GNUPG:] VALIDSIG 89ABCDEF0123456789ABCDEF0123456789ABCDEF 2026-01-01 0 4 0 22 8 00 89ABCDEF\n";
        let ssh = "Good \"git\" signature for alice@example.net with ED25519 key SHA256:xyz\n";
        let got = |said: &str| tag_signer(said).map(|s| (s.name, s.key, s.on));
        assert_eq!(
            got(gpg),
            Some((
                "Signer <s@example.net>".into(),
                "89ABCDEF0123456789ABCDEF0123456789ABCDEF".into(),
                "tag".into()
            ))
        );
        assert_eq!(
            got(ssh),
            Some((
                "alice@example.net".into(),
                "SHA256:xyz".into(),
                "tag".into()
            ))
        );
        assert_eq!(got("[GNUPG:] NEWSIG\n"), None);
    }

    #[test]
    fn only_a_good_signature_with_a_known_signer_passes() {
        let by = |name: &str, key: &str| Signer {
            name: name.into(),
            key: key.into(),
            on: "commit".into(),
        };
        assert_eq!(
            judge(&line("G", "SHA256:abc", "alice@example.net")).ok(),
            Some(by("alice@example.net", "SHA256:abc"))
        );
        assert_eq!(
            judge(&line("U", "ABCDEF", "Signer <s@example.net>")).ok(),
            Some(by("Signer <s@example.net>", "ABCDEF"))
        );
        for (code, key, signer, says) in [
            ("U", "SHA256:abc", "", "no entry of allowed_signers_file"),
            ("N", "", "", "not signed"),
            ("B", "ABCDEF", "Signer", "bad signature"),
            ("E", "ABCDEF", "", "not in gpg_keyring_file"),
            (
                "E",
                "SHA256:abc",
                "",
                "signed by SSH key SHA256:abc, which cannot be checked",
            ),
            ("Y", "ABCDEF", "Signer", "has expired"),
            ("R", "ABCDEF", "Signer", "revoked"),
        ] {
            let e = judge(&line(code, key, signer)).expect_err(code).to_string();
            assert!(e.contains("commit c0ffee refused"), "{e}");
            assert!(e.contains(says), "{code}: {e}");
        }
    }
}
