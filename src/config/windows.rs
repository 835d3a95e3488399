//! `windows` (on a target, a target set or `[defaults]`): a list of
//! `{ allow = "…" }` and `{ deny = "…" }` entries, each parsed by `window`,
//! every problem named by its key (`windows[1].deny`). What a window
//! means is `window`'s; what it holds back is `tick::window`'s.

use super::*;
use crate::window::{Entry, Windows};

/// Entries in one list: each is looked at for every next opening.
const MAX_ENTRIES: usize = 32;

/// `windows`' JSON Schema (`validate_windows` reads the list by hand).
#[derive(schemars::JsonSchema)]
#[schemars(transparent)]
#[allow(dead_code)] // A schema only.
pub(super) struct WindowList(#[schemars(schema_with = "window_list")] Vec<Value>);

/// At most [`MAX_ENTRIES`] entries, each a table with exactly one key.
fn window_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let entry = |key: &str, says: &str| {
        serde_json::json!({
            "type": "object",
            "properties": { key: { "type": "string", "description": says } },
            "required": [key],
            "additionalProperties": false,
        })
    };
    schemars::json_schema!({
        "type": "array",
        "maxItems": MAX_ENTRIES,
        "items": { "oneOf": [
            entry("allow", "Work may start in this window: a weekly range or one-off dates in an IANA time zone, e.g. \"Mon-Fri 09:00-17:00 Europe/Berlin\"."),
            entry("deny", "Work may not start in this window (a deny wins), e.g. \"Fri 16:00 - Mon 08:00 Europe/Berlin\"."),
        ] },
    })
}

pub(super) fn validate_windows(
    raw: Value,
    section: &str,
    problems: &mut Vec<Problem>,
) -> Option<Windows> {
    let Value::Array(list) = raw else {
        problems.push(problem(
            section,
            "windows",
            "must be a list of { allow = \"…\" } and { deny = \"…\" } entries, e.g. [{ deny = \"Fri 16:00 - Mon 08:00 Europe/Berlin\" }]",
        ));
        return None;
    };
    if list.len() > MAX_ENTRIES {
        problems.push(problem(
            section,
            "windows",
            format!("at most {MAX_ENTRIES} entries"),
        ));
        return None;
    }
    let before = problems.len();
    let mut entries = Vec::new();
    for (i, item) in list.into_iter().enumerate() {
        let key = format!("windows[{i}]");
        let Value::Object(table) = item else {
            problems.push(problem(
                section,
                &key,
                "must be a table with one key, `allow` or `deny`",
            ));
            continue;
        };
        let mut keys = table.into_iter();
        let (Some((which, text)), None) = (keys.next(), keys.next()) else {
            problems.push(problem(
                section,
                &key,
                "must have exactly one key, `allow` or `deny`",
            ));
            continue;
        };
        let allow = match which.as_str() {
            "allow" => true,
            "deny" => false,
            other => {
                problems.push(problem(
                    section,
                    &format!("{key}.{other}"),
                    "unknown key: an entry is `allow` or `deny`",
                ));
                continue;
            }
        };
        let Value::String(text) = text else {
            problems.push(problem(
                section,
                &format!("{key}.{which}"),
                format!("must be a string: {}", crate::window::SHAPES),
            ));
            continue;
        };
        match Entry::parse(allow, &text) {
            Ok(e) => entries.push(e),
            Err(e) => problems.push(problem(section, &format!("{key}.{which}"), e)),
        }
    }
    (problems.len() == before).then_some(Windows { entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(extra: &str, target: &str) -> (Vec<Problem>, Option<Settings>) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            format!(
                "{extra}\n[[targets]]\nname = \"web\"\nrepo = \"https://git.example.net/r.git\"\n{target}\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\
                 [[targets]]\nname = \"db\"\nrepo = \"https://git.example.net/r.git\"\n\
                 [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n"
            ),
        )
        .expect("write");
        let (settings, problems) = super::super::parse(&file, false, true).expect("read");
        (problems, settings)
    }

    /// Each bad entry is named by its key, with the target or `defaults`.
    #[test]
    fn every_bad_entry_is_named_by_its_key() {
        for (target, key, says) in [
            ("windows = \"Mon-Fri\"", "windows", "must be a list"),
            (
                "windows = [\"Mon-Fri 09:00-17:00 UTC\"]",
                "windows[0]",
                "one key",
            ),
            (
                "windows = [{ allow = \"x\", deny = \"y\" }]",
                "windows[0]",
                "exactly one key",
            ),
            (
                "windows = [{ permit = \"Mon 09:00-10:00 UTC\" }]",
                "windows[0].permit",
                "unknown key",
            ),
            (
                "windows = [{ deny = 5 }]",
                "windows[0].deny",
                "must be a string",
            ),
            (
                "windows = [{ allow = \"Mon 09:00-10:00 UTC\" }, { deny = \"Fri 16:00 - Mon 08:00 Europe/Berln\" }]",
                "windows[1].deny",
                "`Europe/Berln` is not a time zone",
            ),
        ] {
            let (problems, _) = load("", target);
            assert!(
                problems.iter().any(|p| p.section == "targets[web]"
                    && p.key == key
                    && p.message.contains(says)),
                "{target}: {problems:?}"
            );
        }
        let (problems, _) = load(
            "[defaults]\nwindows = [{ deny = \"Sun 25:00-26:00 UTC\" }]",
            "",
        );
        assert!(
            problems
                .iter()
                .any(|p| p.section == "defaults" && p.key == "windows[0].deny"),
            "{problems:?}"
        );
    }

    /// A target's own windows replace the defaults' (an empty list: none);
    /// a target without its own gets the defaults'.
    #[test]
    fn a_targets_windows_replace_the_defaults() {
        let (problems, settings) = load(
            "[defaults]\nwindows = [{ deny = \"Fri 16:00 - Mon 08:00 Europe/Berlin\" }]",
            "windows = []",
        );
        assert!(problems.is_empty(), "{problems:?}");
        let s = settings.expect("settings");
        let web = s.target("web").expect("web");
        let db = s.target("db").expect("db");
        assert!(web.windows.is_empty());
        assert_eq!(db.windows.entries.len(), 1);
        assert!(!db.windows.entries[0].allow);
    }
}
