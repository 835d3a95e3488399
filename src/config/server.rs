//! `[server]`, `[[receivers]]` (which forge signs the webhooks, and the
//! secret they are checked against) and `[[tokens]]` (API token digests and
//! their scope syntax): parsed into [`Server`], [`Receiver`] and [`Token`],
//! every problem collected. Says nothing about what a scope allows (that is
//! `auth`).

use schemars::JsonSchema;

use super::*;

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A `[[receivers]]` entry: a webhook endpoint, `POST /hooks/<name>`.
pub(super) struct RawReceiver {
    /// The endpoint's name: `POST /hooks/<name>`.
    name: String,
    /// Who signs its deliveries, and how: github, gitea, forgejo, gitlab
    /// (its token) or generic (HMAC-SHA256 of the body).
    #[schemars(extend("enum" = ["github", "gitea", "forgejo", "gitlab", "generic"]))]
    forge: String,
    /// The secret deliveries are checked against: a file or `env:NAME`. A
    /// receiver without one is refused at start-up.
    secret_file: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// A `[[tokens]]` entry: an API token, as `driftless token new NAME`
/// prints it.
pub(super) struct RawToken {
    /// Who holds it (shown in the history of what it did).
    name: String,
    /// The token's SHA-256, 64 hex digits (the token itself is never
    /// written here).
    #[schemars(regex(pattern = r"^[0-9a-fA-F]{64}$"))]
    sha256: String,
    /// What it may do: `read`, `read:<glob>`, `reconcile:<glob>`,
    /// `pause:<glob>`, `approve:<glob>`, `override:<glob>` (globs match
    /// target names: `*`, `?`).
    scopes: Vec<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
/// `[server]`: the HTTP listener.
pub(super) struct RawServer {
    /// Where webhooks, the API, the page, /healthz, /readyz and /metrics
    /// are served (port 0: any free port). Default: 127.0.0.1:8080.
    listen: Option<String>,
    /// How many targets may converge at the same time (one target never
    /// runs twice at once). Default: 4.
    #[schemars(range(min = 1))]
    workers: Option<i64>,
    /// Request bodies above this many bytes are answered 413 unread.
    /// Default: 5 MiB.
    #[schemars(range(min = 1))]
    max_body_bytes: Option<i64>,
    /// A client must send its request headers within this. Default: 10s.
    header_read_timeout: Option<String>,
    /// Every request but a reconcile with `?wait=` must finish within
    /// this. Default: 30s.
    request_timeout: Option<String>,
    /// Connections served at once; more wait in the listen backlog.
    /// Default: 256.
    #[schemars(range(min = 1))]
    max_connections: Option<i64>,
    /// The URL people reach driftless at: notifications link to the run
    /// there.
    public_url: Option<String>,
    /// Who sees the HTML page at /: `token` (a token with a read scope),
    /// `open` (anyone who reaches the listener) or `off`. Default: token.
    #[schemars(extend("enum" = ["token", "open", "off"]))]
    page: Option<String>,
    /// Who scrapes /metrics: `open` or `token` (a read scope). Default:
    /// open.
    #[schemars(extend("enum" = ["open", "token"]))]
    metrics: Option<String>,
}

pub(super) fn validate_server(raw: Option<Value>, problems: &mut Vec<Problem>) -> Server {
    let mut server = Server {
        listen: DEFAULT_LISTEN
            .parse()
            .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8080))),
        workers: DEFAULT_WORKERS,
        max_body_bytes: DEFAULT_MAX_BODY,
        header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
        request_timeout: DEFAULT_REQUEST_TIMEOUT,
        max_connections: DEFAULT_MAX_CONNECTIONS,
        public_url: None,
        page: PageAccess::Token,
        metrics: PageAccess::Open,
    };
    let Some(raw) = raw else { return server };
    let Some(raw) = read_table::<RawServer>(raw, "server", "", problems) else {
        return server;
    };
    if let Some(listen) = raw.listen {
        match listen.parse() {
            Ok(a) => server.listen = a,
            Err(_) => problems.push(problem(
                "server",
                "listen",
                format!("`{listen}` is not an address:port such as 127.0.0.1:8080"),
            )),
        }
    }
    if let Some(w) = within("workers", raw.workers, 1..=64, problems) {
        server.workers = w as usize;
    }
    if let Some(b) = within(
        "max_body_bytes",
        raw.max_body_bytes,
        1024..=1 << 30,
        problems,
    ) {
        server.max_body_bytes = b as usize;
    }
    if let Some(c) = within(
        "max_connections",
        raw.max_connections,
        1..=100_000,
        problems,
    ) {
        server.max_connections = c as usize;
    }
    if let Some(u) = raw.public_url {
        let u = u.trim().trim_end_matches('/').to_string();
        if u.starts_with("http://") || u.starts_with("https://") {
            server.public_url = Some(u);
        } else {
            problems.push(problem(
                "server",
                "public_url",
                format!("`{u}` must be an http:// or https:// URL"),
            ));
        }
    }
    use PageAccess::{Off, Open, Token};
    if let Some(m) = one_of(
        "metrics",
        raw.metrics,
        &[("open", Open), ("token", Token)],
        problems,
    ) {
        server.metrics = m;
    }
    let pages = [("token", Token), ("open", Open), ("off", Off)];
    if let Some(p) = one_of("page", raw.page, &pages, problems) {
        server.page = p;
    }
    server.header_read_timeout = duration(
        "server",
        "header_read_timeout",
        raw.header_read_timeout.as_deref(),
        DEFAULT_HEADER_READ_TIMEOUT,
        MAX_HEADER_READ_TIMEOUT,
        problems,
    );
    server.request_timeout = duration(
        "server",
        "request_timeout",
        raw.request_timeout.as_deref(),
        DEFAULT_REQUEST_TIMEOUT,
        MAX_REQUEST_TIMEOUT,
        problems,
    );
    server
}

/// `[server] key`'s number, if it is given and within `range`.
fn within(
    key: &str,
    value: Option<i64>,
    range: std::ops::RangeInclusive<i64>,
    problems: &mut Vec<Problem>,
) -> Option<i64> {
    let v = value?;
    if range.contains(&v) {
        return Some(v);
    }
    problems.push(problem(
        "server",
        key,
        format!("{v} is not between {} and {}", range.start(), range.end()),
    ));
    None
}

/// `[server] key`'s word, if it is given and one of `choices`.
fn one_of<T: Copy>(
    key: &str,
    value: Option<String>,
    choices: &[(&str, T)],
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let v = value?;
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v) {
        return Some(*t);
    }
    let names: Vec<String> = choices.iter().map(|(n, _)| format!("\"{n}\"")).collect();
    problems.push(problem(
        "server",
        key,
        format!("`{v}` is not one of {}", names.join(", ")),
    ));
    None
}

pub(super) fn validate_receivers(
    raw: Vec<Value>,
    base: &Path,
    problems: &mut Vec<Problem>,
) -> Vec<Receiver> {
    let mut out: Vec<Receiver> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("receivers[{n}]"))
            .unwrap_or_else(|| format!("receivers[{i}]"));
        let Some(r) = read_table::<RawReceiver>(raw, &label, "", problems) else {
            continue;
        };
        if !valid_name(&r.name) {
            problems.push(problem(
                &label,
                "name",
                format!(
                    "`{}` is not a safe receiver name (a-z, 0-9, '_', '.', '-')",
                    r.name
                ),
            ));
            continue;
        }
        if out.iter().any(|o| o.name == r.name) {
            problems.push(problem(
                &label,
                "name",
                format!("duplicate receiver name `{}`", r.name),
            ));
            continue;
        }
        let forge = match r.forge.as_str() {
            "github" => ForgeKind::Github,
            "gitea" => ForgeKind::Gitea,
            "forgejo" => ForgeKind::Forgejo,
            "gitlab" => ForgeKind::Gitlab,
            "generic" => ForgeKind::Generic,
            other => {
                problems.push(problem(
                    &label,
                    "forge",
                    format!(
                        "unknown forge `{other}`: use github, gitea, forgejo, gitlab or generic"
                    ),
                ));
                continue;
            }
        };
        let Some(secret) = r.secret_file.filter(|s| !s.trim().is_empty()) else {
            problems.push(problem(
                &label,
                "secret_file",
                "a receiver needs a secret (a file path or \"env:NAME\"): unsigned deliveries are never accepted",
            ));
            continue;
        };
        out.push(Receiver {
            name: r.name,
            forge,
            secret: SecretRef::parse(&secret, base),
        });
    }
    out
}

/// A scope is `reconcile:<glob>`, `pause:<glob>`, `approve:<glob>`,
/// `override:<glob>`, `read` or `read:<glob>`.
pub fn valid_scope(s: &str) -> bool {
    match s.split_once(':') {
        None => s == "read",
        Some((verb, glob)) => {
            matches!(
                verb,
                "reconcile" | "pause" | "approve" | "override" | "read"
            ) && !glob.is_empty()
                && glob
                    .bytes()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-*?".contains(&c))
        }
    }
}

pub(super) fn validate_tokens(raw: Vec<Value>, problems: &mut Vec<Problem>) -> Vec<Token> {
    let mut out: Vec<Token> = Vec::new();
    for (i, raw) in raw.into_iter().enumerate() {
        let label = raw
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("tokens[{n}]"))
            .unwrap_or_else(|| format!("tokens[{i}]"));
        let Some(t) = read_table::<RawToken>(raw, &label, "", problems) else {
            continue;
        };
        let before = problems.len();
        let digest = t.sha256.trim().to_ascii_lowercase();
        if digest.len() != 64 || !digest.bytes().all(|c| c.is_ascii_hexdigit()) {
            problems.push(problem(
                &label,
                "sha256",
                "must be the 64-character hex SHA-256 of the token, as printed by `driftless token new`",
            ));
        }
        if t.scopes.is_empty() {
            problems.push(problem(&label, "scopes", "must list at least one scope"));
        }
        for sc in &t.scopes {
            if !valid_scope(sc) {
                problems.push(problem(
                    &label,
                    "scopes",
                    format!("`{sc}` is not a scope: use reconcile:<target glob>, pause:<target glob>, approve:<target glob>, read or read:<target glob>"),
                ));
            }
        }
        if out.iter().any(|o| o.name == t.name) {
            problems.push(problem(
                &label,
                "name",
                format!("duplicate token name `{}`", t.name),
            ));
        }
        if out.iter().any(|o| o.sha256 == digest) {
            problems.push(problem(
                &label,
                "sha256",
                "the same digest is used by another token",
            ));
        }
        if problems.len() == before {
            out.push(Token {
                name: t.name,
                sha256: digest,
                scopes: t.scopes,
            });
        }
    }
    out
}
