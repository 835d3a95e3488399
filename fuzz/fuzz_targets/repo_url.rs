//! Repository URL normalisation: never panic, and the https / scp / ssh
//! spellings of one repository always compare equal.
#![no_main]
use driftless::route::normalize_repo;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    let n = normalize_repo(&s);
    // What it produces, spelt as an https URL with `.git`, normalises to
    // itself (for hosts that are names or whole bracketed IPv6 literals;
    // "[::1" is no host).
    let host = n.split('/').next().unwrap_or("");
    let sane_host = !host.contains(':') || (host.starts_with('[') && host.ends_with(']'));
    if !n.starts_with("file:") && sane_host && !n.chars().any(char::is_whitespace) {
        assert_eq!(
            normalize_repo(&format!("https://{n}.git")),
            n,
            "input {s:?}"
        );
    }
    // A host and a path made of URL-safe characters: every spelling agrees.
    let mut parts = s.splitn(2, '|');
    let host: String = parts
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
        .collect();
    let path: String = parts
        .next()
        .unwrap_or("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_./".contains(*c))
        .collect();
    let path = path.trim_matches('/');
    if host.is_empty() || path.is_empty() || host.starts_with('.') {
        return;
    }
    let https = normalize_repo(&format!("https://{host}/{path}.git"));
    let scp = normalize_repo(&format!("git@{host}:{path}.git"));
    let ssh = normalize_repo(&format!("ssh://git@{host}:22/{path}.git/"));
    assert_eq!(https, scp, "{host} {path}");
    assert_eq!(https, ssh, "{host} {path}");
});
