//! SOPS-encrypted files, decrypted in a target's checkout for the duration
//! of one run and encrypted again afterwards.
//!
//! `open` finds the files (those under the target's path that carry SOPS
//! metadata, or those a `files` glob names), notes them in a marker file
//! in the state directory *before* any plaintext exists, and has the real
//! `sops --decrypt` write each one, with only the target's age key in its
//! environment (no home, no other key source). Every decrypted value is
//! handed back for the redactor. `close` puts the encrypted bytes back and
//! removes the marker; after a `kill -9`, `remove_leftovers` (the next
//! tick, before anything else) deletes the noted files, and the checkout's
//! reset restores them from git. Plaintext is written to a new file renamed
//! into place, and the ciphertext the same way: a container that mounted
//! the decrypted file keeps it. This module must not touch the git cache,
//! log a value, or name the key in an error (only where it comes from).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::process::{self, Spec};
use crate::redact::Redactor;
use crate::secret::SecretRef;

/// How long decrypting one file may take.
const SOPS_TIMEOUT: Duration = Duration::from_secs(60);
/// Larger files are not looked into for SOPS metadata.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// `[targets.decrypt]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sops {
    /// The age identity (`AGE-SECRET-KEY-1…`, one or more lines).
    pub age_key: SecretRef,
    /// Only the files whose path under the target's directory matches (`*`
    /// and `?`); none: every file carrying SOPS metadata.
    pub files: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum DecryptError {
    #[error("cannot decrypt {file} with the age key from {key}: {reason}")]
    File {
        file: String,
        key: String,
        reason: String,
    },
    #[error("cannot read the age key: {0}")]
    Key(String),
    #[error("{0}")]
    Io(String),
}

/// Files decrypted in place; `close` encrypts them again.
#[derive(Debug)]
pub struct Opened {
    marker: PathBuf,
    /// Each file and its encrypted bytes.
    files: Vec<(PathBuf, Vec<u8>)>,
    /// Every decrypted value, for the redactor.
    pub secrets: Vec<String>,
}

/// Decrypt the SOPS files under `workdir`, noting them in `marker` first.
pub async fn open(workdir: &Path, marker: &Path, sops: &Sops) -> Result<Opened, DecryptError> {
    let key = sops
        .age_key
        .load()
        .map_err(|e| DecryptError::Key(e.to_string()))?;
    let key = key.trim().to_string();
    let mut redactor = Redactor::new().with(key.clone());
    for line in key.lines() {
        redactor.add(line.trim().to_string());
    }
    let mut found = Vec::new();
    find(workdir, workdir, sops.files.as_deref(), &mut found)
        .map_err(|e| DecryptError::Io(format!("cannot look for SOPS files: {e}")))?;
    found.sort();
    let mut opened = Opened {
        marker: marker.to_path_buf(),
        files: Vec::new(),
        secrets: Vec::new(),
    };
    if found.is_empty() {
        return Ok(opened);
    }
    if let Some(dir) = marker.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| DecryptError::Io(format!("cannot create {}: {e}", dir.display())))?;
    }
    let listing: String = found
        .iter()
        .map(|(p, _)| format!("{}\n", p.display()))
        .collect();
    write_synced(marker, listing.as_bytes())
        .map_err(|e| DecryptError::Io(format!("cannot note {}: {e}", marker.display())))?;
    // A private, empty home: sops finds no key but the one given.
    let home = marker.with_extension("home");
    let _ = std::fs::remove_dir_all(&home);
    std::fs::create_dir_all(&home)
        .map_err(|e| DecryptError::Io(format!("cannot create {}: {e}", home.display())))?;
    let result = decrypt_all(&found, &home, &key, sops, &redactor, &mut opened).await;
    let _ = std::fs::remove_dir_all(&home);
    match result {
        Ok(()) => Ok(opened),
        Err(e) => {
            // Put back what was decrypted before the failure.
            if let Err(close) = opened.close() {
                tracing::error!(error = %close, "cannot encrypt the decrypted files again");
            }
            Err(e)
        }
    }
}

async fn decrypt_all(
    found: &[(PathBuf, Vec<u8>)],
    home: &Path,
    key: &str,
    sops: &Sops,
    redactor: &Redactor,
    opened: &mut Opened,
) -> Result<(), DecryptError> {
    let deadline = || Instant::now() + SOPS_TIMEOUT;
    for (file, encrypted) in found {
        let fail = |reason: String| DecryptError::File {
            file: file.display().to_string(),
            key: sops.age_key.to_string(),
            reason: redactor.redact(&reason),
        };
        let path = file.to_string_lossy().into_owned();
        // The values, as JSON whatever the file's format, for the redactor.
        let values = sops_run(
            &["--decrypt", "--output-type", "json", &path],
            home,
            key,
            deadline(),
        )
        .await
        .map_err(&fail)?;
        let tree: serde_json::Value = serde_json::from_str(&values)
            .map_err(|e| fail(format!("sops printed no JSON: {e}")))?;
        leaves(&tree, &mut opened.secrets);
        let plain = sops_run(&["--decrypt", &path], home, key, deadline())
            .await
            .map_err(&fail)?;
        // The original is put back even if writing the plaintext fails half
        // way: it is in the list before the file changes.
        opened.files.push((file.clone(), encrypted.clone()));
        replace(file, plain.as_bytes()).map_err(|e| fail(format!("cannot write it: {e}")))?;
    }
    Ok(())
}

/// `sops ARGS` with only the age key: its stdout, or why it failed.
async fn sops_run(
    args: &[&str],
    home: &Path,
    key: &str,
    deadline: Instant,
) -> Result<String, String> {
    let mut argv = vec!["sops".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut spec = Spec::new(argv, home);
    spec.deadline = Some(deadline);
    let h = home.to_string_lossy().into_owned();
    for (k, v) in [
        ("HOME", h.as_str()),
        ("XDG_CONFIG_HOME", h.as_str()),
        ("GNUPGHOME", h.as_str()),
        ("SOPS_AGE_KEY", key),
        ("SOPS_AGE_KEY_FILE", "/dev/null"),
        ("SOPS_AGE_SSH_PRIVATE_KEY_FILE", "/dev/null"),
    ] {
        spec.env.insert(k.into(), v.into());
    }
    // The values are read from the output; nothing of it is logged.
    let out = process::run(&spec, &Redactor::new())
        .await
        .map_err(|e| e.to_string())?;
    if out.success() {
        Ok(out.stdout)
    } else {
        Err(format!("sops: {}", out.stderr_summary(3)))
    }
}

/// Every string, number and boolean leaf of a decrypted tree (the
/// redactor ignores values under 4 bytes).
fn leaves(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) => {
            out.push(s.clone());
            // A multi-line value (a key, a certificate) leaks a line at a time.
            if s.contains('\n') {
                out.extend(s.lines().map(|l| l.trim().to_string()));
            }
        }
        serde_json::Value::Number(n) => out.push(n.to_string()),
        serde_json::Value::Array(a) => a.iter().for_each(|v| leaves(v, out)),
        serde_json::Value::Object(o) => o
            .iter()
            .filter(|(k, _)| k.as_str() != "sops")
            .for_each(|(_, v)| leaves(v, out)),
        _ => {}
    }
}

impl Opened {
    /// Put the encrypted bytes back and forget the marker.
    pub fn close(self) -> Result<(), DecryptError> {
        let mut failed = Vec::new();
        for (file, encrypted) in &self.files {
            if let Err(e) = replace(file, encrypted) {
                // The plaintext must not stay: remove it (the checkout's
                // reset brings the file back from git).
                if std::fs::remove_file(file).is_err() {
                    failed.push(format!("{}: {e}", file.display()));
                }
            }
        }
        if !failed.is_empty() {
            return Err(DecryptError::Io(format!(
                "cannot encrypt again (the marker {} stays, the next tick removes them): {}",
                self.marker.display(),
                failed.join("; ")
            )));
        }
        match std::fs::remove_file(&self.marker) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(DecryptError::Io(format!(
                "cannot remove {}: {e}",
                self.marker.display()
            ))),
        }
    }

    /// How many files were decrypted.
    pub fn count(&self) -> usize {
        self.files.len()
    }
}

/// What a run killed mid-way left decrypted (noted in `marker`): removed,
/// and the marker with them. The number of files removed.
pub fn remove_leftovers(marker: &Path) -> Result<usize, DecryptError> {
    let listing = match std::fs::read_to_string(marker) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => {
            return Err(DecryptError::Io(format!(
                "cannot read {}: {e}",
                marker.display()
            )));
        }
    };
    let mut removed = 0;
    for line in listing.lines().filter(|l| !l.is_empty()) {
        match std::fs::remove_file(line) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(DecryptError::Io(format!(
                    "cannot remove the decrypted leftover {line}: {e}"
                )));
            }
        }
    }
    std::fs::remove_file(marker)
        .map_err(|e| DecryptError::Io(format!("cannot remove {}: {e}", marker.display())))?;
    Ok(removed)
}

/// Files under `dir` (not following links, `.git` and `.terraform` left
/// out) that carry SOPS metadata and match `glob` (a path relative to
/// `root`), with their bytes.
fn find(
    root: &Path,
    dir: &Path,
    glob: Option<&str>,
    out: &mut Vec<(PathBuf, Vec<u8>)>,
) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() {
            let name = entry.file_name();
            if name != ".git" && name != ".terraform" {
                find(root, &path, glob, out)?;
            }
            continue;
        }
        if !kind.is_file() || entry.metadata()?.len() > MAX_FILE {
            continue;
        }
        let rel = path.strip_prefix(root).unwrap_or(&path).to_string_lossy();
        if glob.is_some_and(|g| !crate::glob::glob_match(g, &rel)) {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        if is_sops(&bytes) {
            out.push((path, bytes));
        }
    }
    Ok(())
}

/// SOPS metadata: an encrypted value and the `sops` section (YAML, JSON,
/// INI, dotenv and binary files all carry both).
fn is_sops(bytes: &[u8]) -> bool {
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    has(b"ENC[AES256_GCM,") && has(b"sops")
}

/// Write `bytes` to a new file beside `path` and rename it over `path`
/// (the old inode, which a container may have mounted, is left alone),
/// readable by its owner only: 0600, or 0700 where `path` was executable.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o100)
        .unwrap_or(0)
        | 0o600;
    let tmp = path.with_file_name(format!(
        ".{}.driftless-tmp",
        path.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = std::fs::remove_file(&tmp);
    write_synced(&tmp, bytes)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    std::fs::rename(&tmp, path)
}

/// Write `bytes` to `path`, created 0600 (plaintext is never readable by
/// others, not even between its creation and a `chmod`).
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sops_files_are_told_by_their_metadata() {
        assert!(is_sops(
            b"password: ENC[AES256_GCM,data:xx,type:str]\nsops:\n  mac: y\n"
        ));
        assert!(!is_sops(b"password: hunter2\n"));
        assert!(!is_sops(
            b"sops: is mentioned here without an encrypted value\n"
        ));
    }

    #[test]
    fn every_leaf_but_the_metadata_is_a_secret() {
        let tree = serde_json::json!({
            "db": { "password": "s3cret-value", "port": 54321, "hosts": ["a.internal"] },
            "key": "-----BEGIN-----\nline-one-of-it\n-----END-----",
            "sops": { "mac": "not-a-secret" }
        });
        let mut out = Vec::new();
        leaves(&tree, &mut out);
        for want in ["s3cret-value", "54321", "a.internal", "line-one-of-it"] {
            assert!(out.iter().any(|s| s == want), "{want} not in {out:?}");
        }
        assert!(!out.iter().any(|s| s == "not-a-secret"));
    }

    const SOPS: &[u8] = b"password: ENC[AES256_GCM,data:xx,type:str]\nsops:\n  mac: y\n";

    fn found(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        find(root, root, None, &mut out).expect("find");
        let mut names: Vec<String> = out
            .iter()
            .map(|(p, _)| {
                p.strip_prefix(root)
                    .expect("under root")
                    .display()
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }

    #[test]
    fn find_reads_only_regular_files_outside_git_and_terraform_up_to_sixteen_mib() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        for sub in [".git", ".terraform", "sub"] {
            std::fs::create_dir(root.join(sub)).expect("mkdir");
        }
        for f in [
            "a.yaml",
            ".git/in-git.yaml",
            ".terraform/in-tf.yaml",
            "sub/b.yaml",
        ] {
            std::fs::write(root.join(f), SOPS).expect("write");
        }
        std::fs::write(root.join("plain.yaml"), b"password: hunter2\n").expect("write");
        // A link to a SOPS file is not a file of the checkout's own.
        std::os::unix::fs::symlink(root.join("a.yaml"), root.join("link.yaml")).expect("link");
        // Exactly MAX_FILE bytes is looked into; one byte more is not.
        for (name, len) in [("at-max.yaml", MAX_FILE), ("over-max.yaml", MAX_FILE + 1)] {
            let mut f = std::fs::File::create(root.join(name)).expect("create");
            std::io::Write::write_all(&mut f, SOPS).expect("write");
            f.set_len(len).expect("set_len");
        }
        assert_eq!(MAX_FILE, 16 << 20);
        assert_eq!(found(root), ["a.yaml", "at-max.yaml", "sub/b.yaml"]);
    }

    #[test]
    fn close_puts_the_ciphertext_back_and_a_marker_already_gone_is_no_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files: Vec<(PathBuf, Vec<u8>)> = ["a.yaml", "b.yaml"]
            .iter()
            .map(|n| {
                let p = dir.path().join(n);
                std::fs::write(&p, b"plaintext").expect("write");
                (p, SOPS.to_vec())
            })
            .collect();
        let opened = Opened {
            marker: dir.path().join("never-written"),
            files: files.clone(),
            secrets: Vec::new(),
        };
        assert_eq!(opened.count(), 2);
        opened.close().expect("a marker already gone is no error");
        for (p, _) in &files {
            assert_eq!(std::fs::read(p).expect("read"), SOPS);
        }
        // A marker that cannot be removed (here a directory) is an error
        // that names it.
        let marker = dir.path().join("marker-dir");
        std::fs::create_dir(&marker).expect("mkdir");
        let e = Opened {
            marker: marker.clone(),
            files: Vec::new(),
            secrets: Vec::new(),
        }
        .close()
        .expect_err("a directory is not removed as a marker");
        assert!(e.to_string().contains("marker-dir"), "{e}");
    }

    #[test]
    fn leftovers_are_counted_and_removed_and_only_a_missing_one_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("marker");
        assert_eq!(remove_leftovers(&marker).expect("no marker"), 0);
        let (a, b) = (dir.path().join("a.yaml"), dir.path().join("b.yaml"));
        std::fs::write(&a, b"x").expect("write");
        std::fs::write(&b, b"y").expect("write");
        let gone = dir.path().join("gone.yaml");
        std::fs::write(
            &marker,
            format!("{}\n{}\n{}\n", a.display(), gone.display(), b.display()),
        )
        .expect("marker");
        assert_eq!(remove_leftovers(&marker).expect("leftovers"), 2);
        assert!(!a.exists() && !b.exists() && !marker.exists());

        // A leftover that cannot be removed stops it, named, marker kept.
        let stuck = dir.path().join("stuck");
        std::fs::create_dir(&stuck).expect("mkdir");
        std::fs::write(&marker, format!("{}\n", stuck.display())).expect("marker");
        let e = remove_leftovers(&marker).expect_err("a directory is not a leftover file");
        assert!(e.to_string().contains("stuck"), "{e}");
        assert!(marker.exists());

        // A marker that cannot be read is an error, not "nothing left".
        let e = remove_leftovers(&stuck).expect_err("a directory is no marker");
        assert!(e.to_string().contains("cannot read"), "{e}");
    }
}
