//! Redaction: the one place that knows what a secret looks like.
//!
//! Everything driftless prints, stores or sends that came from a command or a
//! remote (output tails, error messages, git errors) passes through a
//! [`Redactor`] first. It replaces the secret values it was told about and
//! credentials embedded in URLs (`https://user:token@host`), after taking
//! out terminal control sequences ([`printable`]: a repository's command
//! must not rewrite the screen of whoever reads its output). It must not be
//! bypassed by "just this one log line".

/// The marker that replaces a secret.
pub const MASK: &str = "[REDACTED]";

/// Replaces known secret values and URL credentials in text.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl std::fmt::Debug for Redactor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Redactor({} secrets)", self.secrets.len())
    }
}

impl Redactor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Remember a secret value. Very short values (under 4 bytes) are not
    /// masked: they would shred ordinary text and are not worth protecting.
    pub fn add(&mut self, secret: impl Into<String>) {
        let s = secret.into();
        // Text is masked after its controls are taken out: a secret that
        // carries one is looked for in that form too.
        let shown = printable(&s).into_owned();
        // A multi-line secret (a PEM key) line by line too: output that
        // comes a line at a time (a run's live output) never holds it whole.
        let lines: Vec<String> = if s.contains('\n') {
            s.lines()
                .map(|l| l.trim_end_matches('\r').to_string())
                .collect()
        } else {
            Vec::new()
        };
        for s in [s, shown].into_iter().chain(lines) {
            if s.len() >= 4 && !self.secrets.contains(&s) {
                self.secrets.push(s);
            }
        }
        // Longest first, so a secret containing another is masked whole.
        self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    }

    pub fn with(mut self, secret: impl Into<String>) -> Self {
        self.add(secret);
        self
    }

    /// `text` with terminal control sequences taken out ([`printable`]),
    /// then credentials in URLs and every known secret masked. Controls go
    /// first, so a secret split by a colour code is still found whole.
    pub fn redact(&self, text: &str) -> String {
        let mut out = strip_url_credentials(&printable(text));
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), MASK);
            }
        }
        out
    }
}

/// Credentials in URLs: `scheme://user:password@host` and
/// `https://TOKEN@host` (GitHub's token-clone form) → `scheme://[REDACTED]@host`.
/// Over ssh a bare user name (`ssh://git@host`) is not a secret and stays.
fn strip_url_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let scheme: String = head[..i]
            .chars()
            .rev()
            .take_while(|c| c.is_ascii_alphanumeric() || "+.-".contains(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
            .to_ascii_lowercase();
        let ssh = matches!(
            scheme.as_str(),
            "ssh" | "git+ssh" | "ssh+git" | "sftp" | "scp"
        );
        // The authority ends at the first '/', whitespace or quote.
        let end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '"' || c == '\'' || c == '\\')
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) if at > 0 && (!ssh || authority[..at].contains(':')) => {
                out.push_str(MASK);
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// `text` safe to print on a terminal: escape sequences (CSI `ESC [ … X`,
/// the 8-bit CSI, OSC/DCS/PM/APC strings up to BEL or `ESC \`, two-character
/// escapes) and every other control character are taken out but newline,
/// tab, NUL and the four information separators (`\x1c`–`\x1f`: terminals
/// ignore them, and tools' machine formats use them, as `git log
/// --format=%x1f` does); `\r\n` becomes `\n` and a lone `\r` a newline (it
/// would let a line overwrite what was printed before it). Text that a repository's
/// command printed can otherwise move the cursor, rewrite the screen or
/// set a terminal's title when `plan`, `history` or `status` shows it.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let kept = |c: char| matches!(c, '\n' | '\t' | '\0' | '\u{1c}'..='\u{1f}');
    if !text.chars().any(|c| c.is_control() && !kept(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    // A control sequence's parameters and intermediates, up to and
    // including its final byte; a malformed one ends at the first other
    // character, which is kept.
    let csi = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
        while let Some(&c) = chars.peek() {
            match c {
                '\u{20}'..='\u{3f}' => {
                    chars.next();
                }
                '\u{40}'..='\u{7e}' => {
                    chars.next();
                    return;
                }
                _ => return,
            }
        }
    };
    while let Some(c) = chars.next() {
        match c {
            c if kept(c) => out.push(c),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('\n');
                }
            }
            '\u{9b}' => csi(&mut chars),
            '\u{1b}' => match chars.peek() {
                Some('[') => {
                    chars.next();
                    csi(&mut chars);
                }
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    chars.next();
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' || c == '\u{9c}' {
                            break;
                        }
                        if c == '\u{1b}' {
                            if chars.peek() == Some(&'\\') {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                Some('\u{20}'..='\u{7e}') => {
                    chars.next();
                }
                _ => {}
            },
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Keep at most the last `max` bytes of `text`, cut at a char boundary, with a
/// marker saying how much was dropped.
pub fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("[… {start} bytes omitted …]\n{}", &text[start..])
}

/// `url` with any password (in its user part, or a `password=` parameter)
/// replaced by `***`.
pub fn url_without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_string(),
        },
        None => authority.to_string(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|kv| match kv.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                    _ => kv.to_string(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_string(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line of a multi-line secret is masked on its own too: a line
    /// at a time, the whole is never there to match.
    #[test]
    fn a_multi_line_secret_is_masked_line_by_line() {
        let key = "-----BEGIN KEY-----\nMIIEowIBAAKCAQEAx\nq83kdLa0\n-----END KEY-----\n";
        let r = Redactor::new().with(key);
        assert_eq!(r.redact(key), MASK);
        assert_eq!(r.redact("got q83kdLa0\n"), format!("got {MASK}\n"));
        assert_eq!(r.redact("MIIEowIBAAKCAQEAx"), MASK);
    }

    /// Text with no control character is returned as it is, not copied
    /// (every line driftless shows goes through here).
    #[test]
    fn clean_text_is_not_copied() {
        assert!(matches!(
            printable("plain text, tabs\tand\nlines"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert!(matches!(
            printable("a\u{1b}[0m"),
            std::borrow::Cow::Owned(_)
        ));
    }

    /// A tail keeps at most `max` bytes, cut forward to a character
    /// boundary, and says how much went.
    #[test]
    fn a_tail_keeps_at_most_its_bytes_on_a_character_boundary() {
        let text = "é".repeat(10); // 20 bytes
        let t = tail(&text, 5);
        let kept = t.rsplit('\n').next().unwrap_or("");
        assert_eq!(kept, "éé", "{t:?}");
        assert!(t.starts_with("[… 16 bytes omitted …]"), "{t:?}");
        assert_eq!(tail("short", 5), "short");
    }

    /// A redactor's debug form says how many secrets it holds, never one.
    #[test]
    fn the_debug_form_shows_no_secret() {
        let r = Redactor::new().with("hunter2-secret");
        assert_eq!(format!("{r:?}"), "Redactor(1 secrets)");
    }

    /// A URL's authority ends at a `/`, whitespace, a quote or a
    /// backslash: an `@` after it (an npm scope, an e-mail address) is not
    /// a credential's end, and an authority that starts with `@` has none.
    #[test]
    fn a_urls_authority_ends_where_it_ends() {
        for text in [
            "https://registry.npmjs.org/@scope/pkg",
            "see https://example.net mail ops@example.net",
            "url=\"https://example.net\"@x",
            "url='https://example.net'@x",
            "C:\\https://example.net\\@x",
            "https://@example.net/x",
        ] {
            assert_eq!(strip_url_credentials(text), text, "{text}");
        }
        assert_eq!(
            strip_url_credentials("https://user:pw@example.net/x@y"),
            "https://[REDACTED]@example.net/x@y"
        );
    }
    #[test]
    fn terminal_controls_are_taken_out() {
        use super::printable;
        assert_eq!(printable("plain\n\tline"), "plain\n\tline");
        assert_eq!(
            printable("\u{1b}[31mred\u{1b}[0m \u{1b}]0;title\u{7}x \u{1b}]8;;http://e\u{1b}\\y"),
            "red x y"
        );
        assert_eq!(printable("a\r\nb\rc\u{7}\u{8}\u{9b}2Jd\u{1b}c"), "a\nb\ncd");
        // Separators that machine formats use (and terminals ignore) stay.
        assert_eq!(printable("a\u{1f}b\u{0}c\u{1b}[0m"), "a\u{1f}b\u{0}c");
        // A malformed sequence ends at the first character it cannot hold.
        assert_eq!(printable("\u{1b}[12\nnext"), "\nnext");
        // A secret split by a colour code is still masked.
        let r = super::Redactor::new().with("hunter2-long");
        assert_eq!(r.redact("pw=hunter2\u{1b}[0m-long"), "pw=[REDACTED]");
    }

    #[test]
    fn masks_known_values_longest_first() {
        let r = Redactor::new()
            .with("hunter2")
            .with("hunter2-extended")
            .with("ab");
        assert_eq!(
            r.redact("pw=hunter2-extended and hunter2 and ab"),
            "pw=[REDACTED] and [REDACTED] and ab"
        );
    }

    #[test]
    fn masks_url_credentials() {
        let r = Redactor::new();
        assert_eq!(
            r.redact("fatal: could not read from https://bob:s3cret@git.example.net/x.git: 403"),
            "fatal: could not read from https://[REDACTED]@git.example.net/x.git: 403"
        );
        // a user name alone is not a secret over ssh
        assert_eq!(r.redact("ssh://git@host/x"), "ssh://git@host/x");
        // but over https it is GitHub's token form
        assert_eq!(
            r.redact("clone https://ghp_abc123@github.com/o/r.git failed"),
            "clone https://[REDACTED]@github.com/o/r.git failed"
        );
        assert_eq!(
            r.redact(r#"{"GetterSource":"s3::https://AKID@bucket/x"}"#),
            r#"{"GetterSource":"s3::https://[REDACTED]@bucket/x"}"#
        );
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abc", 10), "abc");
        let t = tail("0123456789", 4);
        assert!(t.ends_with("6789"), "{t}");
        assert!(t.contains("6 bytes omitted"), "{t}");
        // multi-byte boundary
        let t = tail("ééé", 3);
        assert!(t.ends_with('é'));
    }
}
