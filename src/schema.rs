//! Reading one configuration table into its struct, naming every bad key.
//!
//! serde stops at the first problem, and its messages name a key only for
//! unknown and missing fields. Here a table is read with
//! `serde_path_to_error`, so a wrong type names its key too, and after each
//! problem the offending key is set aside and the table read again, so one
//! `driftless check` lists every problem of the table at once. Pure: no
//! I/O. ([`kind_branch`]: the JSON Schema of such a table, when its
//! `kind` picks its keys.)

use serde::de::DeserializeOwned;
use serde_json::Value;

/// A problem in a table: (key, message).
pub type KeyProblem = (String, String);

/// Read `table` as a `T`, or every problem found in it.
pub fn read<T: DeserializeOwned>(table: Value) -> Result<T, Vec<KeyProblem>> {
    match read_partly(table) {
        (Some(t), problems) if problems.is_empty() => Ok(t),
        (_, problems) => Err(problems),
    }
}

/// Every problem found in `table`, and the `T` read from what is left
/// once each bad key is set aside (`None` when that is not possible: a
/// required key is missing, or a problem names no key), so a caller can
/// go on checking the rest of what the table says.
pub fn read_partly<T: DeserializeOwned>(mut table: Value) -> (Option<T>, Vec<KeyProblem>) {
    let mut problems: Vec<KeyProblem> = Vec::new();
    let mut removed: Vec<Vec<String>> = Vec::new();
    for _ in 0..64 {
        let err = match serde_path_to_error::deserialize::<_, T>(&table) {
            Ok(t) => return (Some(t), problems),
            Err(e) => e,
        };
        let path: Vec<String> = err
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                _ => None,
            })
            .collect();
        let msg = err.inner().to_string();
        let msg = msg.split(" at line ").next().unwrap_or(&msg).to_string();
        let named = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"))
            .map(str::to_string);
        let mut key = path.clone();
        if let Some(n) = named.filter(|n| path.last() != Some(n)) {
            key.push(n);
        }
        // A key set aside for its own problem is now missing: one problem
        // is one line, not "invalid type" and then "missing field".
        if msg.starts_with("missing field") && removed.contains(&key) {
            return (None, problems);
        }
        let label = if key.is_empty() {
            "(table)".to_string()
        } else {
            key.join(".")
        };
        problems.push((label, msg.clone()));
        // A missing field cannot be set aside; neither can a problem with no
        // key to remove.
        if msg.starts_with("missing field") || key.is_empty() || !remove(&mut table, &key) {
            return (None, problems);
        }
        removed.push(key);
    }
    (None, problems)
}

/// One branch of the JSON Schema of a table whose `kind` picks its other
/// keys (a backend's, a notifier's): when `kind` is `kind`, the table is
/// `keys` (that kind's struct's schema) with `kind` among them. An
/// `if`/`then` rather than a `oneOf`, so a validator names the key at
/// fault rather than every kind the table is not.
pub fn kind_branch(kind: &str, mut keys: Value) -> Value {
    if let Some(props) = keys.get_mut("properties").and_then(Value::as_object_mut) {
        props.insert("kind".into(), serde_json::json!({ "const": kind }));
    }
    if let Some(o) = keys.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    serde_json::json!({
        "if": { "properties": { "kind": { "const": kind } }, "required": ["kind"] },
        "then": keys,
    })
}

/// Remove the value at `path` (object keys, array indexes as numbers);
/// whether anything was removed.
fn remove(v: &mut Value, path: &[String]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let mut cur = v;
    for p in parents {
        cur = match cur {
            Value::Object(m) => match m.get_mut(p) {
                Some(x) => x,
                None => return false,
            },
            Value::Array(a) => match p.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                Some(x) => x,
                None => return false,
            },
            _ => return false,
        };
    }
    match cur {
        Value::Object(m) => m.remove(last).is_some(),
        Value::Array(a) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct T {
        name: String,
        port: Option<u16>,
        tags: Option<Vec<String>>,
    }

    #[test]
    fn every_bad_key_is_named_at_once() {
        let e = read::<T>(serde_json::json!({
            "name": "x", "port": "eighty", "colour": "blue", "tags": ["a", 1], "sizee": 3
        }))
        .expect_err("problems");
        let keys: Vec<&str> = e.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["colour", "port", "sizee", "tags.1"], "{e:?}");
        assert!(e[1].1.contains("invalid type"), "{e:?}");
        let e = read::<T>(serde_json::json!({ "port": 1 })).expect_err("missing");
        assert_eq!(e[0].0, "name");
        // A required key of the wrong type is one problem, not two.
        let e = read::<T>(serde_json::json!({ "name": 7 })).expect_err("wrong type");
        assert_eq!(e.len(), 1, "{e:?}");
        assert!(e[0].0 == "name" && e[0].1.contains("invalid type"), "{e:?}");
        assert!(read::<T>(serde_json::json!({ "name": "ok" })).is_ok());
    }
}
