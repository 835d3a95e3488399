//! The page's target rows: each target's state in words and colour, the
//! group it is shown in (failing first), its commit linked to the forge,
//! its last run as a relative time with the exact one on hover, and a
//! live badge while it runs. The same HTML is sent by the page and by its
//! event stream (`page::events`), so a row looks the same either way. It
//! renders what `status` gives; it reads nothing itself.

use std::fmt::Write as _;

use super::escape;
use crate::config::Settings;
use crate::status::TargetStatus;

/// Where a target is shown, in the page's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    Failing,
    Running,
    Waiting,
    Fine,
    Never,
}

impl Group {
    pub(super) const ALL: [Group; 5] = [
        Group::Failing,
        Group::Running,
        Group::Waiting,
        Group::Fine,
        Group::Never,
    ];

    pub(super) fn id(self) -> &'static str {
        match self {
            Group::Failing => "failing",
            Group::Running => "running",
            Group::Waiting => "waiting",
            Group::Fine => "fine",
            Group::Never => "never",
        }
    }

    pub(super) fn title(self) -> &'static str {
        match self {
            Group::Failing => "Failing",
            Group::Running => "Running",
            Group::Waiting => "Waiting",
            Group::Fine => "Converged",
            Group::Never => "Never run",
        }
    }
}

/// A target's state: its group, the word shown, and the colour's class.
pub(super) fn state(
    t: &TargetStatus,
    awaits_approval: bool,
) -> (Group, &'static str, &'static str) {
    let failing = |word| (Group::Failing, word, "bad");
    let waiting = |word| (Group::Waiting, word, "wait");
    if t.running {
        return (Group::Running, "running", "live");
    }
    if t.hold.is_some() && t.quarantined_sha.is_some() {
        return failing("held");
    }
    match t.last_result.as_deref() {
        Some("failed") => return failing("failed"),
        Some("blocked") => return failing("blocked"),
        Some("unhealthy") => return failing("unhealthy"),
        Some("rolled_back") => return failing("rolled back"),
        Some("held") => return failing("held"),
        Some("interrupted") => return failing("interrupted"),
        _ => {}
    }
    if awaits_approval {
        return waiting("awaits approval");
    }
    if t.paused {
        return waiting("paused");
    }
    if t.window.as_ref().is_some_and(|w| w.waiting) {
        return waiting("waits for its window");
    }
    if t.queued {
        return waiting("queued");
    }
    if t.drift.is_some() {
        return waiting("drifted");
    }
    if t.orphaned_since.is_some() {
        return waiting("orphaned");
    }
    match t.last_result.as_deref() {
        Some("changed") => (Group::Fine, "applied", "good"),
        Some("no_change") => (Group::Fine, "up to date", "good"),
        Some(_) => failing("unknown result"),
        None => (Group::Never, "never run", "none"),
    }
}

/// "12 s ago", "3 min ago", "5 h ago", "2 d ago" (the page's script says
/// the same, counting on).
pub(super) fn ago(now_ms: i64, then_ms: i64) -> String {
    let s = (now_ms - then_ms).max(0) / 1000;
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

/// A time as `<time>`: relative, the exact time on hover, and its ms for
/// the script to keep it relative.
pub(super) fn time_html(now_ms: i64, ms: i64) -> String {
    let exact = crate::store::format_ms(ms);
    format!(
        "<time datetime=\"{exact}\" title=\"{exact}\" data-ms=\"{ms}\">{}</time>",
        ago(now_ms, ms)
    )
}

/// A time as `status` shows it (RFC 3339, to the second) in ms.
pub(super) fn parse_ms(shown: &str) -> Option<i64> {
    humantime::parse_rfc3339(shown)
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_millis() as i64)
}

/// A commit: its short SHA, linked to the forge when the target's
/// repository says where.
pub(super) fn commit_html(settings: &Settings, target: &str, sha: Option<&str>) -> String {
    let Some(sha) = sha else {
        return "-".into();
    };
    let short = escape(crate::model::short_sha(sha));
    match settings
        .target(target)
        .and_then(|t| t.commit_url(sha))
        .filter(|u| u.starts_with("https://") || u.starts_with("http://"))
    {
        Some(url) => format!(
            "<a href=\"{}\" title=\"{}\"><code>{short}</code></a>",
            escape(&url),
            escape(sha)
        ),
        None => format!("<code title=\"{}\">{short}</code>", escape(sha)),
    }
}

/// What a row needs besides the target.
pub(super) struct Ctx<'a> {
    pub settings: &'a Settings,
    pub now_ms: i64,
    pub may_read: &'a dyn Fn(&str) -> bool,
    /// Targets with a plan waiting for a person.
    pub awaiting: &'a [String],
}

/// One target's row; of its dependencies, only those the viewer may read
/// are named.
pub(super) fn row(t: &TargetStatus, cx: &Ctx<'_>) -> String {
    let (_, word, class) = state(t, cx.awaiting.contains(&t.name));
    let mut notes = Vec::new();
    if t.destroyed_at.is_some() {
        notes.push("destroyed: directory removed".to_string());
    } else if t.orphaned_since.is_some() {
        notes.push("orphaned: directory removed, not applied".into());
    }
    if let Some(hold) = &t.hold {
        notes.push(hold.clone());
    }
    let readable = |names: &[String]| -> Vec<String> {
        names.iter().filter(|n| (cx.may_read)(n)).cloned().collect()
    };
    let waits = readable(&t.waiting_on);
    if let Some(w) = t.window.as_ref() {
        notes.push(format!("window {}", w.state));
    }
    if t.queued && !t.running && !waits.is_empty() {
        notes.push(format!("queued, waiting on {}", waits.join(", ")));
    }
    let after = readable(&t.depends_on);
    if !after.is_empty() {
        notes.push(format!("after {}", after.join(", ")));
    }
    let live = if t.running {
        " <span class=\"live-badge\" aria-label=\"running now\">● live</span>"
    } else {
        ""
    };
    let when = t
        .last_run_at
        .as_deref()
        .and_then(parse_ms)
        .map_or_else(|| "-".to_string(), |ms| time_html(cx.now_ms, ms));
    let mut h = String::new();
    let _ = write!(
        h,
        "<tr id=\"t-{id}\" class=\"row row-{class}\" data-name=\"{id}\">\
         <td><a href=\"/targets/{url}\"><strong>{name}</strong></a>{live}{notes}</td>\
         <td>{backend}</td><td><span class=\"state {class}\">{word}</span></td>\
         <td>{commit}</td><td>{when}</td><td class=\"msg\">{message}</td></tr>",
        id = escape(&t.name),
        url = escape(&path_segment(&t.name)),
        name = escape(&t.name),
        notes = if notes.is_empty() {
            String::new()
        } else {
            format!("<br><small>{}</small>", escape(&notes.join("; ")))
        },
        backend = escape(&t.backend),
        commit = commit_html(cx.settings, &t.name, t.last_applied_sha.as_deref()),
        message = escape(t.last_message.as_deref().unwrap_or("")),
    );
    h
}

/// A target name as one URL path segment (names are letters, digits and
/// `-_.`, but a set's member may carry more).
pub(super) fn path_segment(name: &str) -> String {
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_say_them() {
        assert_eq!(ago(100_000, 100_000), "0 s ago");
        assert_eq!(ago(100_000, 41_000), "59 s ago");
        assert_eq!(ago(200_000, 20_000), "3 min ago");
        assert_eq!(ago(4 * 3_600_000, 0), "4 h ago");
        assert_eq!(ago(3 * 86_400_000, 0), "3 d ago");
        assert_eq!(ago(0, 5_000), "0 s ago", "a clock behind says now");
        assert_eq!(
            parse_ms(&crate::store::format_ms(1_700_000_000_000)),
            Some(1_700_000_000_000)
        );
    }

    #[test]
    fn a_name_is_one_path_segment() {
        assert_eq!(path_segment("web-01_a.b"), "web-01_a.b");
        assert_eq!(path_segment("a/b c"), "a%2Fb%20c");
    }
}
