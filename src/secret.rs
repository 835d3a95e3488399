//! Secret references (`env:NAME` or a file path) and reading them. A value
//! is read only when needed and never shown: `Debug` and every error name
//! the reference, not the value. Imports only `paths`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::paths::resolve;

/// A reference to a secret: a file to read, or an environment variable.
/// The value is read when needed (so rotating the file works) and never
/// printed: `Debug` shows only where it comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// A file; `bare` when the value was a bare name (no `/`), which might
    /// be a secret pasted where a path belongs.
    File {
        path: PathBuf,
        bare: bool,
    },
    Env(String),
}

impl fmt::Debug for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A bare name that names no file may be the secret itself,
            // pasted where a path belongs: it is never shown.
            SecretRef::File { path, bare: true } if std::fs::symlink_metadata(path).is_err() => {
                write!(
                    f,
                    "file:{}/… (no such file; its name is not shown in case it is the secret itself: \
                     the key takes a path to a file holding the secret, or env:NAME)",
                    path.parent().unwrap_or(Path::new("")).display()
                )
            }
            SecretRef::File { path, .. } => write!(f, "file:{}", path.display()),
            SecretRef::Env(n) => write!(f, "env:{n}"),
        }
    }
}

impl fmt::Display for SecretRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Reading a secret failed. The message names the reference, never the value.
#[derive(Debug, thiserror::Error)]
#[error("cannot read secret {reference}: {reason}")]
pub struct SecretError {
    pub reference: String,
    pub reason: String,
}

impl SecretRef {
    /// `env:NAME` is an environment variable; anything else is a file path,
    /// relative paths resolved against `base` (the config file's directory).
    pub fn parse(raw: &str, base: &Path) -> Self {
        match raw.strip_prefix("env:") {
            Some(name) => SecretRef::Env(name.to_string()),
            None => SecretRef::File {
                path: resolve(base, raw),
                bare: !raw.contains('/'),
            },
        }
    }

    /// Read the secret, trimming one trailing newline (files written by `echo`).
    pub fn load(&self) -> Result<String, SecretError> {
        let raw = match self {
            SecretRef::File { path, .. } => {
                std::fs::read_to_string(path).map_err(|e| SecretError {
                    reference: self.to_string(),
                    reason: e.to_string(),
                })?
            }
            SecretRef::Env(n) => std::env::var(n).map_err(|e| SecretError {
                reference: self.to_string(),
                reason: e.to_string(),
            })?,
        };
        let value = raw.strip_suffix('\n').unwrap_or(&raw);
        let value = value.strip_suffix('\r').unwrap_or(value).to_string();
        if value.is_empty() {
            return Err(SecretError {
                reference: self.to_string(),
                reason: "it is empty".into(),
            });
        }
        Ok(value)
    }
}

/// Turn a table of `env`-style strings into values, resolving `env:NAME`
/// references from driftless's own environment. Returns the resolved map and
/// the values that came from references (so they can be redacted).
pub fn resolve_env_map(
    map: &BTreeMap<String, String>,
) -> Result<(BTreeMap<String, String>, Vec<String>), SecretError> {
    let mut out = BTreeMap::new();
    let mut secrets = Vec::new();
    for (k, v) in map {
        if let Some(name) = v.strip_prefix("env:") {
            let value = SecretRef::Env(name.to_string()).load()?;
            secrets.push(value.clone());
            out.insert(k.clone(), value);
        } else {
            out.insert(k.clone(), v.clone());
        }
    }
    Ok((out, secrets))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_pasted_where_a_path_belongs_is_never_echoed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pasted = SecretRef::parse("ghp_pastedCanary0123456789", dir.path());
        let e = pasted.load().expect_err("no such file");
        let text = format!("{e} {pasted:?}");
        assert!(!text.contains("ghp_pastedCanary"), "{text}");
        assert!(text.contains("takes a path"), "{text}");
        // A file that exists is named.
        std::fs::write(dir.path().join("token"), "x\n").expect("write");
        let real = SecretRef::parse("token", dir.path());
        assert!(format!("{real:?}").ends_with("/token"), "{real:?}");
    }

    #[test]
    fn secret_ref_debug_names_the_reference_only() {
        let r = SecretRef::parse("env:SOME_TOKEN", Path::new("/etc"));
        assert_eq!(format!("{r:?}"), "env:SOME_TOKEN");
        let f = SecretRef::parse("./token", Path::new("/etc/driftless"));
        assert_eq!(
            f,
            SecretRef::File {
                path: PathBuf::from("/etc/driftless/token"),
                bare: false
            }
        );
    }

    #[test]
    fn secret_file_is_trimmed_and_empty_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("s");
        std::fs::write(&p, "hunter2\n").expect("write");
        assert_eq!(
            SecretRef::File {
                path: p.clone(),
                bare: false
            }
            .load()
            .expect("load"),
            "hunter2"
        );
        std::fs::write(&p, "\n").expect("write");
        let e = SecretRef::File {
            path: p,
            bare: false,
        }
        .load()
        .expect_err("empty");
        assert!(e.to_string().contains("empty"));
    }
}
