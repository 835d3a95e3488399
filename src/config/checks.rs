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

/// Read one table into its struct (`crate::schema::read_partly`), every
/// problem named by its full key under `section`: `prefix` (`verify.`)
/// then the key's path in the table (`workers`, `history.keep`), so a
/// value of the wrong type names its key, never `(table)`. The struct read
/// from the rest of the table when a bad key could be set aside, so the
/// caller goes on checking the other keys (the problems already make the
/// configuration invalid); `None` when it could not be read at all.
pub(super) fn read_table<T: serde::de::DeserializeOwned>(
    raw: Value,
    section: &str,
    prefix: &str,
    problems: &mut Vec<Problem>,
) -> Option<T> {
    let (read, found) = crate::schema::read_partly(raw);
    for (key, msg) in found {
        let key = if key == "(table)" {
            match prefix.trim_end_matches('.') {
                "" => key,
                p => p.to_string(),
            }
        } else {
            format!("{prefix}{key}")
        };
        problems.push(problem(section, &key, msg));
    }
    read
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
                    "`{raw}` is longer than the most this key takes (at most {})",
                    in_accepted_units(max)
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

/// `d` in the units a duration key accepts (s, m, h, d), in the largest
/// one that says it exactly: `3650d`, `24h`, `90s` — never in the months
/// and years `humantime` would write, which the keys refuse.
pub(super) fn in_accepted_units(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => "0s".to_string(),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3_600 == 0 => format!("{}h", s / 3_600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
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
