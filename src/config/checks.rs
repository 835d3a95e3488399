//! The checks every section shares: a problem naming its section and key,
//! serde's errors turned into such problems, durations with their bounds,
//! and the names driftless accepts for targets, receivers and notifiers.
//! Pure functions of their input; nothing here reads a file.

use super::*;

pub(super) fn problem(section: &str, key: &str, message: impl Into<String>) -> Problem {
    Problem {
        section: section.to_string(),
        key: key.to_string(),
        message: message.into(),
    }
}

/// serde's "unknown field `x`, expected one of …" names the key; pull it out
/// so the problem's `key` is right.
pub(super) fn serde_problem(section: &str, prefix: &str, err: &serde_json::Error) -> Problem {
    let msg = err.to_string();
    let key = msg
        .split('`')
        .nth(1)
        .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
        .map(|k| format!("{prefix}{k}"))
        .unwrap_or_else(|| prefix.trim_end_matches('.').to_string());
    let key = if key.is_empty() {
        "(table)".into()
    } else {
        key
    };
    // serde_json appends " at line 0 column 0" to errors from `from_value`.
    let msg = msg
        .split(" at line ")
        .next()
        .unwrap_or(msg.as_str())
        .to_string();
    problem(section, &key, msg)
}

pub(super) fn duration(
    label: &str,
    key: &str,
    raw: Option<&str>,
    default: Duration,
    max: Duration,
    problems: &mut Vec<Problem>,
) -> Duration {
    let Some(raw) = raw else { return default };
    if let Some(unit) = calendar_unit(raw) {
        problems.push(problem(
            label,
            key,
            format!(
                "`{raw}` counts in {unit}, which nobody means here (`M` is months, `m` minutes; `y` years): \
                 write it in s, m, h or d, such as \"5m\" or \"2h\""
            ),
        ));
        return default;
    }
    match humantime::parse_duration(raw.trim()) {
        Ok(d) if d < Duration::from_secs(1) => {
            problems.push(problem(
                label,
                key,
                format!("`{raw}` is shorter than one second"),
            ));
            default
        }
        Ok(d) if d > max => {
            problems.push(problem(
                label,
                key,
                format!(
                    "`{raw}` is longer than the most this key takes ({})",
                    humantime::format_duration(max)
                ),
            ));
            default
        }
        Ok(d) => d,
        Err(e) => {
            problems.push(problem(
                label,
                key,
                format!("`{raw}` is not a duration such as \"90s\", \"5m\" or \"1h30m\" ({e})"),
            ));
            default
        }
    }
}

/// A month or year unit in a duration (humantime reads `5M` as five
/// months and `1y` as a year).
pub(super) fn calendar_unit(raw: &str) -> Option<&'static str> {
    let mut unit = String::new();
    let mut units = Vec::new();
    for c in raw.trim().chars().chain(std::iter::once(' ')) {
        if c.is_alphabetic() {
            unit.push(c);
        } else if !unit.is_empty() {
            units.push(std::mem::take(&mut unit));
        }
    }
    units.iter().find_map(|u| match u.as_str() {
        "M" | "month" | "months" | "mo" => Some("months"),
        "y" | "year" | "years" => Some("years"),
        _ => None,
    })
}

/// Target names end up in file names, URLs and SQL rows: keep them boring.
pub fn valid_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || b"_.-".contains(c))
        && !name.contains("..")
}
