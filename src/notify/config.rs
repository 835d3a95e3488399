//! A `[[notifiers]]` table: its kinds and their keys, read with every bad
//! key named, and the events a notifier hears. Nothing here sends.

use super::*;

/// Email transport security.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
/// How the SMTP connection is encrypted.
pub enum Tls {
    Starttls,
    Tls,
    None,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "email"`: mail through an SMTP server.
pub struct EmailConfig {
    /// The SMTP server.
    pub host: String,
    /// Default by `tls`: 587, 465, 25.
    pub port: Option<u16>,
    /// `starttls`, `tls`, or `none` (a loopback host only). Default:
    /// starttls.
    #[serde(default = "default_tls")]
    pub tls: Tls,
    /// The SMTP user, with `password_file`.
    pub username: Option<String>,
    /// The SMTP password: a file or `env:NAME`.
    pub password_file: Option<String>,
    /// The sender's address.
    pub from: String,
    /// The recipients' addresses.
    pub to: Vec<String>,
}

fn default_tls() -> Tls {
    Tls::Starttls
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "slack"`: a Slack incoming webhook.
pub struct SlackConfig {
    /// The incoming-webhook URL is a secret: a file or `env:NAME`.
    pub url_file: String,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "ntfy"`: an ntfy topic (push to a phone).
pub struct NtfyConfig {
    /// The topic URL (`https://ntfy.sh/my-topic`), or `url_file` when the
    /// topic is a secret.
    pub url: Option<String>,
    /// A file holding the topic URL (or `env:NAME`), instead of `url`.
    pub url_file: Option<String>,
    /// An access token (`tk_…`), sent as `Authorization: Bearer`.
    pub token_file: Option<String>,
    /// Per event name: `min`, `low`, `default`, `high`, `max`/`urgent` or
    /// 1–5 (default: high for failures, approvals and drift).
    #[serde(default)]
    pub priority: BTreeMap<String, String>,
    /// Per event name: ntfy tags (emoji short codes show as emoji).
    #[serde(default)]
    pub tags: BTreeMap<String, Vec<String>>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "discord"`: a Discord webhook.
pub struct DiscordConfig {
    /// The webhook URL is a secret: a file or `env:NAME`.
    pub url_file: String,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "matrix"`: a Matrix room.
pub struct MatrixConfig {
    /// The homeserver's URL.
    pub homeserver: String,
    /// The bot user's access token: a file or `env:NAME`.
    pub access_token_file: String,
    /// The room's id (`!…:server`).
    pub room_id: String,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "webhook"`: the event document POSTed as JSON.
pub struct WebhookConfig {
    /// Where it is POSTed.
    pub url: Option<String>,
    /// A file holding the URL (or `env:NAME`), instead of `url`.
    pub url_file: Option<String>,
    /// Extra request headers.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body is signed with it (`X-Driftless-Signature-256`,
    /// HMAC-SHA256): a file or `env:NAME`.
    pub secret_file: Option<String>,
}

/// The keys every `[[notifiers]]` entry has beside its kind's (read by
/// hand in [`NotifierConfig::from_value`]; a schema only).
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct Common {
    /// The notifier's name, as targets' `notify` lists name it.
    name: String,
    /// The events it hears. Default: every failure and every
    /// person-facing event, not `changed`.
    #[schemars(extend("items" = { "enum": EVENTS }))]
    events: Option<Vec<String>>,
    /// How many times a notification is tried before it is given up.
    /// Default: 10.
    #[schemars(range(min = 1, max = 100))]
    attempts: Option<i64>,
    /// The wait after the first failed attempt; it doubles after each, up
    /// to 10m. Between 1s and 10m. Default: 2s.
    retry_after: Option<String>,
}

/// The event names `events` takes.
const EVENTS: &[&str] = &[
    "failed",
    "blocked",
    "unhealthy",
    "rolled_back",
    "still_failing",
    "recovered",
    "changed",
    "pending_approval",
    "drift_detected",
    "drift_resolved",
    "superseded",
];

/// The `[[notifiers]]` list's JSON Schema: `kind` picks the keys beside
/// the common ones (an `if`/`then` per kind, as the backends').
pub fn notifiers_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use schemars::JsonSchema;
    let common = Common::json_schema(generator).to_value();
    let kinds = [
        ("email", EmailConfig::json_schema(generator)),
        ("slack", SlackConfig::json_schema(generator)),
        ("matrix", MatrixConfig::json_schema(generator)),
        ("webhook", WebhookConfig::json_schema(generator)),
        ("ntfy", NtfyConfig::json_schema(generator)),
        ("discord", DiscordConfig::json_schema(generator)),
    ];
    let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
    let branches: Vec<Value> = kinds
        .into_iter()
        .map(|(kind, s)| {
            let mut s = s.to_value();
            if let (Some(props), Some(common)) = (
                s.get_mut("properties").and_then(Value::as_object_mut),
                common.get("properties").and_then(Value::as_object),
            ) {
                props.extend(common.clone());
            }
            crate::schema::kind_branch(kind, s)
        })
        .collect();
    schemars::json_schema!({
        "type": "array",
        "items": {
            "description": "A `[[notifiers]]` entry: who hears about a target, and how.",
            "type": "object",
            "properties": { "kind": { "description": "How it is told.", "enum": names } },
            "required": ["name", "kind"],
            "allOf": branches,
        },
    })
}

/// The kind-specific part of a `[[notifiers]]` table, with each secret it
/// names as a typed reference (resolved against the config file's
/// directory, read only when sending): the compiler, not a key lookup,
/// says which secret each kind has.
#[derive(Debug, Clone)]
pub enum NotifierKind {
    Email {
        config: EmailConfig,
        password: Option<SecretRef>,
    },
    Slack {
        /// The incoming-webhook URL (it is the credential).
        url: SecretRef,
    },
    Matrix {
        config: MatrixConfig,
        access_token: SecretRef,
    },
    Webhook {
        config: WebhookConfig,
        url: WebhookUrl,
        /// Signs each body (`X-Driftless-Signature`).
        signing_secret: Option<SecretRef>,
    },
    Ntfy {
        config: NtfyConfig,
        /// The topic URL (on a public server the topic is the password).
        url: WebhookUrl,
        token: Option<SecretRef>,
    },
    Discord {
        /// The webhook URL (it is the credential).
        url: SecretRef,
    },
}

/// Where a webhook notifier posts: a plain `url`, or a `url_file` secret.
#[derive(Debug, Clone)]
pub enum WebhookUrl {
    Plain(String),
    Secret(SecretRef),
}

impl WebhookUrl {
    /// Exactly one of `url` and `url_file` (a secret reference).
    fn one_of(
        url: &Option<String>,
        url_file: &Option<String>,
        base: &Path,
    ) -> Result<WebhookUrl, Vec<(String, String)>> {
        match (url, url_file) {
            (Some(u), None) => Ok(WebhookUrl::Plain(u.clone())),
            (None, Some(f)) => Ok(WebhookUrl::Secret(SecretRef::parse(f, base))),
            _ => Err(vec![(
                "url".to_string(),
                "set exactly one of url and url_file".to_string(),
            )]),
        }
    }

    /// The URL to send to, reading the secret file when it is one.
    pub(super) fn resolve(&self) -> Result<String, SendError> {
        match self {
            WebhookUrl::Plain(u) => Ok(u.clone()),
            WebhookUrl::Secret(r) => read_secret("url_file", r),
        }
    }
}

/// A configured notifier. Secret fields stay references, read when sending.
#[derive(Debug, Clone)]
pub struct NotifierConfig {
    pub name: String,
    /// The events it is told about.
    pub events: Vec<Event>,
    /// How many times a notification is tried before it is given up.
    pub attempts: i64,
    /// The wait after the first failed attempt; it doubles after each
    /// failure, up to ten minutes.
    pub retry_after: std::time::Duration,
    pub kind: NotifierKind,
}

impl NotifierConfig {
    /// Parse a `[[notifiers]]` table; errors are `(key, message)` pairs.
    pub fn from_value(mut v: Value, base: &Path) -> Result<Self, Vec<(String, String)>> {
        let mut errs = Vec::new();
        let obj = v
            .as_object_mut()
            .ok_or_else(|| vec![("(table)".to_string(), "must be a table".to_string())])?;
        let name = match obj.remove("name") {
            Some(Value::String(s)) => s,
            _ => {
                errs.push(("name".into(), "missing or not a string".into()));
                String::new()
            }
        };
        let events = read_events(obj.remove("events"), &mut errs);
        let attempts = read_attempts(obj.remove("attempts"), &mut errs);
        let retry_after = read_retry_after(obj.remove("retry_after"), &mut errs);
        let Some(kind) = read_kind(v, base, &mut errs) else {
            return Err(errs);
        };
        errs.extend(kind.problems());
        if errs.is_empty() {
            Ok(NotifierConfig {
                name,
                events,
                attempts,
                retry_after,
                kind,
            })
        } else {
            Err(errs)
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            NotifierKind::Email { .. } => "email",
            NotifierKind::Slack { .. } => "slack",
            NotifierKind::Matrix { .. } => "matrix",
            NotifierKind::Webhook { .. } => "webhook",
            NotifierKind::Ntfy { .. } => "ntfy",
            NotifierKind::Discord { .. } => "discord",
        }
    }

    /// The secret references, each with the key that names it, for
    /// `driftless check`.
    pub fn secrets(&self) -> Vec<(&'static str, &SecretRef)> {
        match &self.kind {
            NotifierKind::Email { password, .. } => {
                password.iter().map(|p| ("password_file", p)).collect()
            }
            NotifierKind::Slack { url } => vec![("url_file", url)],
            NotifierKind::Matrix { access_token, .. } => vec![("access_token_file", access_token)],
            NotifierKind::Webhook {
                url,
                signing_secret,
                ..
            } => {
                let mut v = Vec::new();
                if let WebhookUrl::Secret(u) = url {
                    v.push(("url_file", u));
                }
                if let Some(s) = signing_secret {
                    v.push(("secret_file", s));
                }
                v
            }
            NotifierKind::Ntfy { url, token, .. } => {
                let mut v = Vec::new();
                if let WebhookUrl::Secret(u) = url {
                    v.push(("url_file", u));
                }
                if let Some(t) = token {
                    v.push(("token_file", t));
                }
                v
            }
            NotifierKind::Discord { url } => vec![("url_file", url)],
        }
    }

    /// Whether it is told about `event`: a notifier told about failures
    /// hears of a target blocked by a failed dependency, found unhealthy
    /// or rolled back too.
    pub fn wants(&self, event: Event) -> bool {
        event == Event::Test
            || self.events.contains(&event)
            || (matches!(event, Event::Blocked | Event::Unhealthy | Event::RolledBack)
                && self.events.contains(&Event::Failed))
    }
}

/// `events`: the events a notifier hears (default: every failure and
/// every person-facing event, not `changed`).
fn read_events(value: Option<Value>, errs: &mut Vec<(String, String)>) -> Vec<Event> {
    match value {
        None => vec![
            Event::Failed,
            Event::Blocked,
            Event::Unhealthy,
            Event::RolledBack,
            Event::StillFailing,
            Event::Recovered,
            Event::PendingApproval,
            Event::DriftDetected,
            Event::DriftResolved,
            Event::Superseded,
        ],
        Some(Value::Array(a)) => {
            let mut out = Vec::new();
            for e in a {
                match e.as_str().and_then(Event::parse) {
                    Some(ev) => out.push(ev),
                    None => errs.push((
                        "events".into(),
                        format!("`{e}` is not one of {}", EVENTS.join(", ")),
                    )),
                }
            }
            out
        }
        Some(_) => {
            errs.push(("events".into(), "must be a list".into()));
            vec![]
        }
    }
}

/// `attempts`: how often a notification is tried, 1 to 100.
fn read_attempts(value: Option<Value>, errs: &mut Vec<(String, String)>) -> i64 {
    match value {
        None => outbox::MAX_ATTEMPTS,
        Some(Value::Number(n)) if n.as_i64().is_some_and(|n| (1..=100).contains(&n)) => {
            n.as_i64().unwrap_or(outbox::MAX_ATTEMPTS)
        }
        Some(other) => {
            errs.push((
                "attempts".into(),
                format!("{other} is not between 1 and 100"),
            ));
            outbox::MAX_ATTEMPTS
        }
    }
}

/// `retry_after`: the first wait before a failed notification is tried
/// again, 1s to 10m.
fn read_retry_after(value: Option<Value>, errs: &mut Vec<(String, String)>) -> std::time::Duration {
    match value {
        None => outbox::FIRST_RETRY,
        Some(Value::String(d)) => match humantime::parse_duration(d.trim()) {
            Ok(d) if d >= std::time::Duration::from_secs(1) && d <= outbox::MAX_RETRY => d,
            _ => {
                errs.push((
                    "retry_after".into(),
                    format!("`{d}` is not a duration between 1s and 10m"),
                ));
                outbox::FIRST_RETRY
            }
        },
        Some(other) => {
            errs.push(("retry_after".into(), format!("{other} is not a duration")));
            outbox::FIRST_RETRY
        }
    }
}

/// The rest of the table, read as the struct its `kind` picks, with every
/// bad key named; `None` (its problems in `errs`) when it cannot be read.
fn read_kind(mut v: Value, base: &Path, errs: &mut Vec<(String, String)>) -> Option<NotifierKind> {
    // `kind` picks the struct, read with every bad key named.
    const KINDS: &str = "email, slack, matrix, webhook, ntfy, discord";
    let kind_name = match v.as_object_mut().and_then(|o| o.remove("kind")) {
        Some(Value::String(k)) => k,
        Some(other) => {
            errs.push(("kind".into(), format!("{other} is not one of {KINDS}")));
            return None;
        }
        None => {
            errs.push(("kind".into(), format!("missing: one of {KINDS}")));
            return None;
        }
    };
    use crate::schema::read;
    let secret = |f: &str| SecretRef::parse(f, base);
    let parsed = match kind_name.as_str() {
        "email" => read::<EmailConfig>(v).map(|c| NotifierKind::Email {
            password: c.password_file.as_deref().map(secret),
            config: c,
        }),
        "slack" => read::<SlackConfig>(v).map(|c| NotifierKind::Slack {
            url: secret(&c.url_file),
        }),
        "matrix" => read::<MatrixConfig>(v).map(|c| NotifierKind::Matrix {
            access_token: secret(&c.access_token_file),
            config: c,
        }),
        "webhook" => read::<WebhookConfig>(v).and_then(|c| {
            let url = WebhookUrl::one_of(&c.url, &c.url_file, base)?;
            Ok(NotifierKind::Webhook {
                signing_secret: c.secret_file.as_deref().map(secret),
                url,
                config: c,
            })
        }),
        "ntfy" => read::<NtfyConfig>(v).and_then(|c| {
            let url = WebhookUrl::one_of(&c.url, &c.url_file, base)?;
            Ok(NotifierKind::Ntfy {
                token: c.token_file.as_deref().map(secret),
                url,
                config: c,
            })
        }),
        "discord" => read::<DiscordConfig>(v).map(|c| NotifierKind::Discord {
            url: secret(&c.url_file),
        }),
        other => Err(vec![(
            "kind".to_string(),
            format!("unknown variant `{other}`, expected one of {KINDS}"),
        )]),
    };
    match parsed {
        Ok(k) => Some(k),
        Err(e) => {
            errs.extend(e);
            None
        }
    }
}

impl NotifierKind {
    /// What is wrong with a notifier's values beyond their types: email
    /// addresses, TLS off the loopback, URLs, room ids, ntfy's events.
    fn problems(&self) -> Vec<(String, String)> {
        let mut errs: Vec<(String, String)> = Vec::new();
        match self {
            NotifierKind::Email { config: c, .. } => {
                if c.to.is_empty() {
                    errs.push(("to".into(), "must list at least one address".into()));
                }
                for a in c.to.iter().chain(Some(&c.from)) {
                    if !a.contains('@') {
                        errs.push(("to".into(), format!("`{a}` is not an email address")));
                    }
                }
                if c.tls == Tls::None && !is_loopback(&c.host) {
                    errs.push((
                        "tls".into(),
                        format!(
                            "`none` (no encryption) is only accepted for a loopback host, not `{}`",
                            c.host
                        ),
                    ));
                }
                if c.password_file.is_some() != c.username.is_some() {
                    errs.push((
                        "password_file".into(),
                        "username and password_file go together".into(),
                    ));
                }
            }
            NotifierKind::Slack { .. } => {}
            NotifierKind::Matrix { config: c, .. } => {
                if !(c.homeserver.starts_with("https://") || c.homeserver.starts_with("http://")) {
                    errs.push(("homeserver".into(), "must be an http(s):// URL".into()));
                }
                if !c.room_id.starts_with('!') {
                    errs.push((
                        "room_id".into(),
                        format!("`{}` is not a room id (they start with `!`)", c.room_id),
                    ));
                }
            }
            NotifierKind::Webhook { url, .. } => {
                if let WebhookUrl::Plain(u) = url
                    && !(u.starts_with("https://") || u.starts_with("http://"))
                {
                    errs.push(("url".into(), "must be an http(s):// URL".into()));
                }
            }
            NotifierKind::Ntfy { config: c, url, .. } => {
                if let WebhookUrl::Plain(u) = url
                    && !((u.starts_with("https://") || u.starts_with("http://"))
                        && ntfy::split_topic_url(u).is_some())
                {
                    errs.push((
                        "url".into(),
                        format!("`{u}` is not a topic URL (https://host/topic)"),
                    ));
                }
                for (e, p) in &c.priority {
                    if Event::parse(e).is_none() {
                        errs.push(("priority".into(), format!("`{e}` is not an event")));
                    } else if ntfy::priority(p).is_none() {
                        errs.push((
                            "priority".into(),
                            format!(
                                "`{p}` (for {e}) is not min, low, default, high, max, urgent or 1-5"
                            ),
                        ));
                    }
                }
                for e in c.tags.keys() {
                    if Event::parse(e).is_none() {
                        errs.push(("tags".into(), format!("`{e}` is not an event")));
                    }
                }
            }
            NotifierKind::Discord { .. } => {}
        }
        errs
    }
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_matches(['[', ']']);
    h.eq_ignore_ascii_case("localhost")
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The events the schema offers are those `events` takes.
    #[test]
    fn the_schema_offers_every_event_a_notifier_takes() {
        for e in EVENTS {
            assert!(Event::parse(e).is_some_and(|p| p.as_str() == *e), "{e}");
        }
        assert!(Event::parse("test").is_none(), "`test` is sent, not chosen");
        let mut errs = Vec::new();
        let every = Value::Array(EVENTS.iter().map(|e| Value::from(*e)).collect());
        assert_eq!(read_events(Some(every), &mut errs).len(), EVENTS.len());
        assert!(errs.is_empty(), "{errs:?}");
    }

    #[test]
    fn loopback_hosts() {
        for h in ["127.0.0.1", "localhost", "::1", "[::1]", "127.1.2.3"] {
            assert!(is_loopback(h), "{h}");
        }
        for h in ["smtp.example.net", "10.0.0.1", "192.168.1.1"] {
            assert!(!is_loopback(h), "{h}");
        }
    }
}
