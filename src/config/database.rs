//! `[database]`: where the state lives when it is not the embedded SQLite
//! file — a PostgreSQL database, its password (from a file or the
//! environment, never shown) and its TLS settings. It checks what is
//! written; it does not connect (the store does).

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::Problem;
use super::checks::{duration, problem};
use crate::paths::resolve;
use crate::redact::url_without_password as without_password;
use crate::secret::SecretRef;

/// A PostgreSQL database shared by the instances using it.
#[derive(Clone)]
pub struct Database {
    /// The `postgres://` URL as written; it may hold a password, so it is
    /// shown only through [`Database::shown_url`].
    url: String,
    /// `password_file`: a file, or `env:NAME`.
    pub password: Option<SecretRef>,
    /// libpq's `sslmode`: disable, allow, prefer, require, verify-ca,
    /// verify-full.
    pub sslmode: Option<String>,
    /// `ca_file`: the certificate authority that signed the server's.
    pub ca_file: Option<PathBuf>,
    /// `lease`: how long a running job's claim lasts without a renewal —
    /// how long an instance that died keeps its targets from the others,
    /// and how long a database outage a running command survives (its
    /// keeper stops it before the claim can run out).
    pub lease: Duration,
}

/// The default `lease`.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const MIN_LEASE: Duration = Duration::from_secs(3);
const MAX_LEASE: Duration = Duration::from_secs(3600);

impl fmt::Debug for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Database")
            .field("url", &self.shown_url())
            .field("password", &self.password)
            .field("sslmode", &self.sslmode)
            .field("ca_file", &self.ca_file)
            .field("lease", &self.lease)
            .finish()
    }
}

impl Database {
    /// The URL to connect with (a password in it included).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The URL without any password: what errors, logs and `status` show.
    pub fn shown_url(&self) -> String {
        without_password(&self.url)
    }
}

/// The `sslmode` values libpq (and sqlx) know.
const SSLMODES: [&str; 6] = [
    "disable",
    "allow",
    "prefer",
    "require",
    "verify-ca",
    "verify-full",
];

/// `[database]`: the state in PostgreSQL instead of SQLite in
/// `state_dir` (git caches, checkouts and locks stay there).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatabase {
    /// `postgres://user@host:port/database`, without a password.
    url: Option<String>,
    /// The password: a file holding it, or `env:NAME`. Never shown.
    password_file: Option<String>,
    /// libpq's sslmode. Default: prefer.
    #[schemars(extend("enum" = SSLMODES))]
    sslmode: Option<String>,
    /// The authority (PEM) that signed the server's certificate.
    ca_file: Option<String>,
    /// How long a running job's claim lasts without a renewal: an instance
    /// that died keeps its targets from the others this long. At least
    /// 3s. Default: 30s.
    lease: Option<String>,
}

/// Check `[database]`; `None` (with problems pushed) when it is unusable.
pub(super) fn validate_database(
    raw: RawDatabase,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Option<Database> {
    let before = problems.len();
    let url = match raw.url {
        None => {
            problems.push(problem(
                "database",
                "url",
                "missing: a postgres:// URL (leave [database] out to use SQLite in state_dir)",
            ));
            String::new()
        }
        Some(u) if !(u.starts_with("postgres://") || u.starts_with("postgresql://")) => {
            problems.push(problem(
                "database",
                "url",
                format!(
                    "`{}` is not a postgres:// URL (only PostgreSQL is supported here; SQLite is \
                     the default without [database])",
                    without_password(&u)
                ),
            ));
            u
        }
        Some(u) => u,
    };
    if has_password(&url) && raw.password_file.is_some() {
        problems.push(problem(
            "database",
            "password_file",
            "the url holds a password too: keep it in password_file only",
        ));
    }
    if let Some(mode) = &raw.sslmode
        && !SSLMODES.contains(&mode.as_str())
    {
        problems.push(problem(
            "database",
            "sslmode",
            format!("`{mode}` is not one of {}", SSLMODES.join(", ")),
        ));
    }
    let ca_file = raw.ca_file.map(|c| resolve(base, &c));
    if let Some(ca) = &ca_file
        && !ca.is_file()
    {
        problems.push(problem(
            "database",
            "ca_file",
            format!("{} is not a readable file", ca.display()),
        ));
    }
    let lease = duration(
        "database",
        "lease",
        raw.lease.as_deref(),
        DEFAULT_LEASE,
        MAX_LEASE,
        problems,
    );
    if lease < MIN_LEASE {
        problems.push(problem(
            "database",
            "lease",
            format!(
                "`{}` is too short: a lease is renewed every third of it, over the network (at least 3s)",
                humantime::format_duration(lease)
            ),
        ));
    }
    if problems.len() > before {
        return None;
    }
    Some(Database {
        lease,
        url,
        password: raw.password_file.map(|p| SecretRef::parse(&p, base)),
        sslmode: raw.sslmode,
        ca_file,
    })
}

/// Does `url` carry a password (in its user part or as `password=`)?
fn has_password(url: &str) -> bool {
    without_password(url) != url
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_never_shown() {
        assert_eq!(
            without_password("postgres://u:s3cret@db:5432/d"),
            "postgres://u:***@db:5432/d"
        );
        assert_eq!(
            without_password("postgres://u@db/d?sslmode=require&password=s3cret"),
            "postgres://u@db/d?sslmode=require&password=***"
        );
        assert_eq!(without_password("postgres://u@db/d"), "postgres://u@db/d");
        let mut problems = Vec::new();
        let db = validate_database(
            RawDatabase {
                url: Some("postgres://u:s3cret@db/d".into()),
                password_file: None,
                sslmode: Some("verify-full".into()),
                ca_file: None,
                lease: None,
            },
            Path::new("/etc/driftless"),
            &mut problems,
        )
        .expect("valid");
        assert!(!format!("{db:?}").contains("s3cret"), "{db:?}");
        assert_eq!(db.url(), "postgres://u:s3cret@db/d");
        assert_eq!(db.lease, DEFAULT_LEASE);
    }

    #[test]
    fn every_mistake_is_named_by_its_key() {
        let mut problems = Vec::new();
        let db = validate_database(
            RawDatabase {
                url: Some("mysql://u:pw@db/d".into()),
                password_file: Some("/run/pw".into()),
                sslmode: Some("sometimes".into()),
                ca_file: Some("/nonexistent/ca.pem".into()),
                lease: Some("2s".into()),
            },
            Path::new("/etc"),
            &mut problems,
        );
        assert!(db.is_none());
        let keys: Vec<&str> = problems.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(
            keys,
            ["url", "password_file", "sslmode", "ca_file", "lease"]
        );
        assert!(
            !problems.iter().any(|p| p.message.contains("pw@")),
            "{problems:?}"
        );
    }
}
