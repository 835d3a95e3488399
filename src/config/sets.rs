//! `[[target_sets]]`: one target per directory that matches a pattern at
//! the branch tip. This module reads a set's table into a [`TargetSet`]
//! (its template checked by building a sample member), names a member
//! after its directory ([`TargetSet::member_name`]) and turns a list of
//! directories into member targets ([`Settings::expand`]), each made
//! exactly as a `[[targets]]` entry with the set's keys would be.
//!
//! Pure: which directories exist is read from git elsewhere
//! (`git::Git::dirs_at`), and which members exist is kept by the store and
//! `tick::sets`; nothing here fetches, stores or applies.

use std::collections::BTreeMap;

use super::*;

/// The keys a set has beside a target's own.
const SET_KEYS: &[&str] = &["name_prefix", "paths", "destroy_removed", "name", "rollout"];
/// The target keys a set may not have: each member gets its own.
const MEMBER_KEYS: &[&str] = &["path", "tag"];
/// The longest `name_prefix`, leaving room for the directory's part.
const MAX_PREFIX: usize = 40;

/// A `[[target_sets]]` entry.
#[derive(Debug, Clone)]
pub struct TargetSet {
    /// `name_prefix`: every member's name starts with it, and it names the
    /// set (`target_sets[<prefix>]`).
    pub name_prefix: String,
    /// `paths`: a glob per directory level (`stacks/*`), relative to the
    /// repository's root.
    pub paths: String,
    /// `destroy_removed`: a member whose directory is removed is destroyed
    /// (its backend's destroy, at the commit it last applied) rather than
    /// only orphaned.
    pub destroy_removed: bool,
    /// `name`: the set itself, as rollouts and scopes name it (its
    /// members are named by `name_prefix`).
    pub name: Option<String>,
    /// `rollout`: its members take a new commit in waves (needs `name`).
    pub rollout: Option<crate::rollout::Rollout>,
    /// A member as the set's keys make it: its repository, branch,
    /// credentials and interval are every member's.
    pub sample: Target,
    /// The set's table without its own keys: a `[[targets]]` entry but for
    /// `name` and `path`.
    template: Value,
    /// Where relative paths in the template resolve from.
    base: PathBuf,
}

/// What a set's pattern found at one commit, and what it must respect.
#[derive(Debug, Clone, Copy)]
pub struct Found<'a> {
    /// The directories `paths` matched.
    pub dirs: &'a [String],
    /// Symbolic links where a directory was looked for (refused).
    pub links: &'a [String],
    /// Names other sets' members have.
    pub taken: &'a HashSet<String>,
    /// This set's members now: name -> directory.
    pub members: &'a BTreeMap<String, String>,
}

/// What a set's directories make: its members, and the directories
/// refused, each with why.
#[derive(Debug, Default)]
pub struct Expansion {
    pub members: Vec<Target>,
    pub refused: Vec<Problem>,
}

impl TargetSet {
    /// `target_sets[<prefix>]`, as problems name the set.
    pub fn label(&self) -> String {
        format!("target_sets[{}]", self.name_prefix)
    }

    /// The member name of `dir`, a directory `paths` matched: the prefix,
    /// then the parts of `dir` the pattern's wildcards matched (the last
    /// part when it has none), joined by `-`, lowercased, with every
    /// character a name may not hold made `-`. `None` when that is still
    /// not a valid target name (too long, say).
    pub fn member_name(&self, dir: &str) -> Option<String> {
        let pattern: Vec<&str> = self.paths.split('/').collect();
        let parts: Vec<&str> = dir.split('/').collect();
        let wild: Vec<&str> = pattern
            .iter()
            .zip(&parts)
            .filter(|(p, _)| p.contains(['*', '?']))
            .map(|(_, d)| *d)
            .collect();
        let chosen = if wild.is_empty() {
            parts.last().copied().into_iter().collect()
        } else {
            wild
        };
        let mut name: String = chosen
            .join("-")
            .chars()
            .map(|c| {
                let c = c.to_ascii_lowercase();
                if c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        while name.contains("..") {
            name = name.replace("..", ".");
        }
        let name = format!(
            "{}{}",
            self.name_prefix,
            name.trim_start_matches(['-', '.', '_'])
        );
        valid_name(&name).then_some(name)
    }
}

/// The directory levels of `paths` before its first wildcard: where every
/// match lives ("" when the first level has one).
pub fn literal_part(paths: &str) -> String {
    paths
        .split('/')
        .take_while(|p| !p.contains(['*', '?']))
        .collect::<Vec<_>>()
        .join("/")
}

/// The keys a set has beside a target's own ([`SET_KEYS`]; read by hand in
/// `validate_set`, so a schema only).
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct SetKeys {
    /// Every member is named `<name_prefix><directory>` (it may be "").
    name_prefix: String,
    /// A glob per directory level, relative to the repository's root
    /// (`stacks/*`): each directory it matches at the branch tip is a
    /// member.
    paths: String,
    /// A member whose directory is removed is destroyed (at the commit it
    /// last applied) rather than only orphaned. Default: false.
    destroy_removed: Option<bool>,
    /// The set's own name, as rollouts and scopes name it (needed with a
    /// `rollout`).
    name: Option<String>,
    /// Its members take a new commit in waves (docs/waves.md).
    rollout: Option<super::rollouts::RawRollout>,
}

/// The `[[target_sets]]` list's JSON Schema: an entry has every key of a
/// `[[targets]]` entry but those of [`MEMBER_KEYS`] and `name`, and
/// [`SetKeys`].
pub(super) fn sets_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use schemars::JsonSchema;
    let mut set = super::target::RawTarget::json_schema(generator).to_value();
    let own = SetKeys::json_schema(generator).to_value();
    if let Some(props) = set.get_mut("properties").and_then(Value::as_object_mut) {
        for key in MEMBER_KEYS.iter().chain(&["name"]) {
            props.remove(*key);
        }
        if let Some(own) = own.get("properties").and_then(Value::as_object) {
            props.extend(own.clone());
        }
    }
    if let Some(req) = set.get_mut("required").and_then(Value::as_array_mut) {
        req.retain(|k| !MEMBER_KEYS.iter().chain(&["name"]).any(|m| k == m));
        if let Some(own) = own.get("required").and_then(Value::as_array) {
            req.extend(own.iter().cloned());
        }
    }
    if let Some(o) = set.as_object_mut() {
        o.insert(
            "description".into(),
            Value::String(
                "A `[[target_sets]]` entry: one target per directory matching `paths`, each made with the set's keys."
                    .into(),
            ),
        );
    }
    schemars::json_schema!({ "type": "array", "items": set })
}

/// Read and check one `[[target_sets]]` table. Its template is checked by
/// making a sample member (named `<prefix>example`), so a problem in it
/// is found at load time, not when a directory appears.
pub(super) fn validate_set(
    raw: Value,
    i: usize,
    base: &Path,
    machine: bool,
    problems: &mut Vec<Problem>,
) -> Option<TargetSet> {
    let Value::Object(mut table) = raw else {
        problems.push(problem(&format!("target_sets[{i}]"), "", "must be a table"));
        return None;
    };
    let prefix = table
        .get("name_prefix")
        .and_then(Value::as_str)
        .map(str::to_string);
    let label = match &prefix {
        Some(p) => format!("target_sets[{p}]"),
        None => format!("target_sets[{i}]"),
    };
    let before = problems.len();
    let Some(prefix) = prefix else {
        problems.push(problem(
            &label,
            "name_prefix",
            "missing: every member's name starts with it (it may be \"\")",
        ));
        return None;
    };
    if prefix.len() > MAX_PREFIX || !(prefix.is_empty() || valid_name(&format!("{prefix}x"))) {
        problems.push(problem(
            &label,
            "name_prefix",
            format!(
                "`{prefix}` cannot begin a target name: use at most {MAX_PREFIX} characters from a-z, 0-9, '_', '.', '-', starting with a letter or digit"
            ),
        ));
    }
    let paths = match table.get("paths") {
        Some(Value::String(p)) => p.clone(),
        Some(_) => {
            problems.push(problem(
                &label,
                "paths",
                "must be a string, e.g. \"stacks/*\"",
            ));
            String::new()
        }
        None => {
            problems.push(problem(
                &label,
                "paths",
                "missing: the directories that become targets, e.g. \"stacks/*\"",
            ));
            String::new()
        }
    };
    if table.contains_key("paths")
        && let Some(why) = bad_pattern(&paths)
    {
        problems.push(problem(&label, "paths", why));
    }
    let destroy_removed = match table.get("destroy_removed") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            problems.push(problem(&label, "destroy_removed", "must be true or false"));
            false
        }
    };
    let name = match table.get("name") {
        None => None,
        Some(Value::String(n)) => Some(n.clone()),
        Some(_) => {
            problems.push(problem(&label, "name", "must be a string"));
            None
        }
    };
    let rollout = table
        .get("rollout")
        .cloned()
        .and_then(|r| super::rollouts::validate_rollout(r, &label, problems));
    if table.contains_key("rollout") && name.is_none() {
        problems.push(problem(
            &label,
            "name",
            "missing: a set with a `rollout` needs a `name` (rollouts and scopes such as approve:<name> name it)",
        ));
    }
    for key in SET_KEYS {
        table.remove(*key);
    }
    for key in MEMBER_KEYS {
        if table.remove(*key).is_some() {
            problems.push(problem(
                &label,
                key,
                match *key {
                    "tag" => "a set's members follow its branch; tags are for single targets",
                    _ => "each member gets its own, from its directory: remove it",
                },
            ));
        }
    }
    let template = Value::Object(table);
    let mut sample = template.clone();
    if let Value::Object(o) = &mut sample {
        o.insert("name".into(), Value::String(format!("{prefix}example")));
        o.insert("path".into(), Value::String(literal_part(&paths)));
    }
    let mut found = Vec::new();
    let sample = validate_target(sample, &label, base, machine, &mut found);
    // The sample's own name and path are ours, not the user's.
    problems.extend(found.into_iter().filter(|p| p.key != "path"));
    let sample = sample?;
    if problems.len() > before {
        return None;
    }
    Some(TargetSet {
        name_prefix: prefix,
        paths,
        destroy_removed,
        name,
        rollout,
        sample,
        template,
        base: base.to_path_buf(),
    })
}

/// Why `paths` is not a usable pattern, if it is not.
fn bad_pattern(paths: &str) -> Option<&'static str> {
    if paths.is_empty() {
        return Some("must not be empty");
    }
    if paths.starts_with('/') || paths.contains('\\') {
        return Some("is relative to the repository's root, with `/` between levels");
    }
    if paths
        .split('/')
        .any(|p| p.is_empty() || p == "." || p == ".." || p.contains("**"))
    {
        return Some(
            "each level is a name or a glob (`*`, `?`), without `.`, `..`, `**` or empty levels",
        );
    }
    if !paths.contains(['*', '?']) {
        return Some("has no wildcard: for one directory, write a [[targets]] entry");
    }
    None
}

impl Settings {
    /// The set's members for what `set.paths` matched at some commit. A
    /// `[[targets]]` entry of a member's name overrides it (no member is
    /// made). Refused, each named in `refused`: a symbolic link where a
    /// directory was looked for, a name `taken` by another set's member, a
    /// directory making no valid name, two directories making one name —
    /// unless one of them is the member of that name already
    /// (`found.members`): that one stays the member and only the newcomer
    /// is refused — and a member whose keys fail, with their problems.
    pub fn expand(&self, set: &TargetSet, found: &Found<'_>) -> Expansion {
        let mut out = Expansion::default();
        let label = set.label();
        for link in found.links {
            out.refused.push(problem(
                &label,
                "paths",
                format!("`{link}` is a symbolic link, not a directory: a target set never follows one (it may point anywhere); make it a directory"),
            ));
        }
        let mut by_name: BTreeMap<String, Vec<&String>> = BTreeMap::new();
        for dir in found.dirs {
            match set.member_name(dir) {
                Some(n) => by_name.entry(n).or_default().push(dir),
                None => out.refused.push(problem(
                    &label,
                    "paths",
                    format!("directory `{dir}` makes no valid target name with prefix `{}` (at most 63 characters)", set.name_prefix),
                )),
            }
        }
        for (name, mut dirs) in by_name {
            if let [first, second, ..] = dirs.as_slice() {
                let Some(kept) = found
                    .members
                    .get(&name)
                    .and_then(|m| dirs.iter().copied().find(|d| *d == m))
                else {
                    out.refused.push(problem(
                        &label,
                        "paths",
                        format!("directories `{first}` and `{second}` both make target `{name}`: neither is a member; rename one"),
                    ));
                    continue;
                };
                for dir in dirs.iter().filter(|d| **d != kept) {
                    out.refused.push(problem(
                        &label,
                        "paths",
                        format!("directory `{dir}` makes target `{name}`, which directory `{kept}` already is: `{dir}` is not a member (and `{name}` is left alone); rename it"),
                    ));
                }
                dirs = vec![kept];
            }
            if self
                .targets
                .iter()
                .any(|t| t.name == name && t.set.is_none())
            {
                // A [[targets]] entry of this name is the member.
                continue;
            }
            if found.taken.contains(&name) {
                out.refused.push(problem(
                    &label,
                    "name_prefix",
                    format!("directory `{}` makes target `{name}`, which another set's member already is", dirs[0]),
                ));
                continue;
            }
            match self.member(set, &name, dirs[0]) {
                Ok(t) => out.members.push(t),
                Err(found) => out.refused.extend(found),
            }
        }
        out
    }

    /// Set `set`'s member `name` for directory `dir`.
    fn member(&self, set: &TargetSet, name: &str, dir: &str) -> Result<Target, Vec<Problem>> {
        let mut raw = set.template.clone();
        if let Value::Object(o) = &mut raw {
            o.insert("name".into(), Value::String(name.to_string()));
            o.insert("path".into(), Value::String(dir.to_string()));
        }
        let label = format!("targets[{name}]");
        let mut problems = Vec::new();
        let Some(mut t) = validate_target(raw, &label, &set.base, false, &mut problems) else {
            return Err(problems);
        };
        finish_target(
            &mut t,
            &self.forges,
            &self.defaults,
            &self.notifiers,
            &mut problems,
        );
        t.set = Some(set.name_prefix.clone());
        t.rollout_of = set.rollout.as_ref().and(set.name.clone());
        if problems.is_empty() {
            Ok(t)
        } else {
            Err(problems)
        }
    }

    /// Every rollout in waves: the sets with a `rollout`, then the groups.
    pub fn rollout_units(&self) -> Vec<RolloutUnit<'_>> {
        let members = |name: &str| -> Vec<&Target> {
            self.targets
                .iter()
                .filter(|t| t.rollout_of.as_deref() == Some(name))
                .collect()
        };
        let sets = self.target_sets.iter().filter_map(|s| {
            let (name, rollout) = (s.name.as_deref()?, s.rollout.as_ref()?);
            Some(RolloutUnit {
                name,
                rollout,
                members: members(name),
            })
        });
        let groups = self.groups.iter().map(|g| RolloutUnit {
            name: &g.name,
            rollout: &g.rollout,
            members: members(&g.name),
        });
        sets.chain(groups).collect()
    }

    /// The rollout of this name.
    pub fn rollout_unit(&self, name: &str) -> Option<RolloutUnit<'_>> {
        self.rollout_units().into_iter().find(|u| u.name == name)
    }

    /// The set of this name prefix.
    pub fn target_set(&self, prefix: &str) -> Option<&TargetSet> {
        self.target_sets.iter().find(|s| s.name_prefix == prefix)
    }

    /// These settings with `members` (of every set) as targets beside the
    /// `[[targets]]` entries, in place of the members they had.
    pub fn with_members(&self, members: Vec<Target>) -> Settings {
        let mut s = self.clone();
        s.targets.retain(|t| t.set.is_none());
        s.targets.extend(members);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(sets: &str) -> Result<Settings, ConfigError> {
        let text = format!(
            "state_dir = \"/tmp/x\"\n[[targets]]\nname = \"s-db\"\nrepo = \"https://h/o/r\"\npath = \"db\"\n[targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n{sets}"
        );
        from_toml_str(&text, Path::new("t.toml"), Path::new("/tmp"))
    }

    /// The schema's set keys are the ones `validate_set` reads.
    #[test]
    fn the_schema_names_the_keys_a_set_reads() {
        use schemars::JsonSchema;
        let mut generator = schemars::SchemaGenerator::default();
        let schema = SetKeys::json_schema(&mut generator).to_value();
        let mut named: Vec<&str> = schema["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        named.sort_unstable();
        let mut read = SET_KEYS.to_vec();
        read.sort_unstable();
        assert_eq!(named, read);
    }

    const SET: &str = "[[target_sets]]\nname_prefix = \"s-\"\nrepo = \"https://h/o/r\"\npaths = \"stacks/*\"\ninterval = \"2m\"\n[target_sets.backend]\nkind = \"exec\"\napply = [\"./up\"]\n";

    #[test]
    fn a_set_makes_one_target_per_directory_with_the_sets_keys() {
        let s = settings(SET).expect("valid");
        let set = &s.target_sets[0];
        assert_eq!(set.sample.repo, "https://h/o/r");
        assert_eq!(set.sample.interval, Duration::from_secs(120));
        let dirs = vec!["stacks/web".to_string(), "stacks/Media Server".to_string()];
        let e = s.expand(set, &found(&dirs, &HashSet::new(), &BTreeMap::new()));
        assert!(e.refused.is_empty(), "{:?}", e.refused);
        let names: Vec<_> = e.members.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["s-media-server", "s-web"]);
        let web = &e.members[1];
        assert_eq!(web.path, PathBuf::from("stacks/web"));
        assert_eq!(web.interval, Duration::from_secs(120));
        assert_eq!(web.set.as_deref(), Some("s-"));
    }

    #[test]
    fn an_explicit_target_overrides_its_member_and_collisions_are_refused() {
        let s = settings(SET).expect("valid");
        let set = &s.target_sets[0];
        let dirs: Vec<String> = ["stacks/db", "stacks/a_b", "stacks/A_b", "stacks/x"]
            .iter()
            .map(|d| d.to_string())
            .collect();
        let taken: HashSet<String> = ["s-x".to_string()].into();
        let e = s.expand(set, &found(&dirs, &taken, &BTreeMap::new()));
        assert!(e.members.is_empty(), "{:?}", e.members);
        let why: Vec<String> = e.refused.iter().map(|p| p.to_string()).collect();
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(
            why[0].contains("`stacks/a_b` and `stacks/A_b` both make target `s-a_b`"),
            "{why:?}"
        );
        assert!(
            why[1].contains("`s-x`, which another set's member already is"),
            "{why:?}"
        );
        // The member of that name already keeps it; only the newcomer is
        // refused.
        let members: BTreeMap<String, String> =
            [("s-a_b".to_string(), "stacks/a_b".to_string())].into();
        let e = s.expand(set, &found(&dirs, &taken, &members));
        let names: Vec<_> = e.members.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["s-a_b"]);
        assert_eq!(e.members[0].path, PathBuf::from("stacks/a_b"));
        let why: Vec<String> = e.refused.iter().map(|p| p.to_string()).collect();
        assert!(
            why[0].contains("directory `stacks/A_b` makes target `s-a_b`, which directory `stacks/a_b` already is"),
            "{why:?}"
        );
    }

    fn found<'a>(
        dirs: &'a [String],
        taken: &'a HashSet<String>,
        members: &'a BTreeMap<String, String>,
    ) -> Found<'a> {
        Found {
            dirs,
            links: &[],
            taken,
            members,
        }
    }

    #[test]
    fn member_names_come_from_the_wildcard_levels() {
        let s = settings(&SET.replace("stacks/*", "*/compose")).expect("valid");
        let set = &s.target_sets[0];
        assert_eq!(set.member_name("web/compose").as_deref(), Some("s-web"));
        assert_eq!(set.member_name("..x/compose").as_deref(), Some("s-x"));
        assert_eq!(set.member_name(&"a".repeat(70)), None);
    }

    #[test]
    fn bad_sets_are_refused_naming_the_key() {
        for (set, key, says) in [
            (
                SET.replace("paths = \"stacks/*\"\n", ""),
                "paths",
                "missing",
            ),
            (
                SET.replace("stacks/*", "stacks/web"),
                "paths",
                "no wildcard",
            ),
            (SET.replace("stacks/*", "../*"), "paths", "`..`"),
            (
                SET.replace("name_prefix = \"s-\"", "name_prefix = \"S!\""),
                "name_prefix",
                "cannot begin",
            ),
            (
                SET.replace("interval = \"2m\"", "path = \"x\""),
                "path",
                "its own",
            ),
            (
                SET.replace("apply = [\"./up\"]", "aply = 1"),
                "backend.aply",
                "",
            ),
            (
                SET.replace("paths =", "destroy_removed = 1\npaths ="),
                "destroy_removed",
                "true or false",
            ),
        ] {
            let err = settings(&set).expect_err(&set).to_string();
            assert!(
                err.contains(&format!("target_sets[s-]: key `{key}`"))
                    || err.contains(&format!("key `{key}`")),
                "{set}\n{err}"
            );
            assert!(err.contains(says), "{set}\n{err}");
        }
    }
}
