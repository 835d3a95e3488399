//! A job file as git gives it: which files are jobs, Nomad's parse of the
//! HCL (with the target's inputs as variables), the policy its meta sets,
//! and the live counts a scaled group keeps. Talks to Nomad only to parse.

use super::*;

impl Nomad {
    /// The job files, sorted, relative to the target's path.
    pub(super) fn job_files(&self) -> Result<Vec<String>, String> {
        let dir = &self.ctx.workdir;
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot list the job files in {}: {e}", dir.display()))?;
        let mut files: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| crate::glob::glob_match(&self.cfg.jobs, n))
            .filter(|n| !n.ends_with(".vars.hcl"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// `POST /v1/jobs/parse`: Nomad turns the HCL (with its variables) into
    /// a job; a 400 is Nomad's parse error.
    pub(super) async fn parse_hcl(
        &self,
        hcl: &str,
        vars: Option<&str>,
        canonicalize: bool,
    ) -> Result<Value, String> {
        let mut body = json!({ "JobHCL": hcl, "Canonicalize": canonicalize });
        if let Some(v) = vars {
            body["Variables"] = Value::String(v.to_string());
        }
        Ok(self
            .client
            .call(
                reqwest::Method::POST,
                "/v1/jobs/parse",
                // Nomad authorises a parse in `?namespace=` (default
                // `default`): a token limited to the target's namespace
                // must be asked there.
                Some(self.cfg.namespace.as_deref().unwrap_or("default")),
                &[],
                Some(&body),
                false,
            )
            .await
            .map_err(|e| match e {
                NomadError::Status {
                    status: 400, body, ..
                } => {
                    format!("Nomad could not parse it: {body}")
                }
                other => other.to_string(),
            })?
            .unwrap_or(Value::Null))
    }

    /// The variables a job file is parsed with: its `.vars.hcl`, then the
    /// target's `inputs` as assignments (`name = "value"`). Nomad's parse
    /// takes one variables text (`JobsParseRequest.Variables`, parsed as a
    /// var file: command/agent/job_endpoint.go `JobsParseRequest`,
    /// jobspec2/types.variables.go), where a variable the job does not
    /// declare is only a warning — so every input can go to every job —
    /// and an input the `.vars.hcl` sets too is HCL's "Attribute
    /// redefined" error, which fails the job naming it.
    pub(super) fn variables(&self, file: Option<String>) -> Option<String> {
        if self.ctx.inputs.is_empty() {
            return file;
        }
        let mut text = file.unwrap_or_default();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for (name, value) in &self.ctx.inputs {
            text.push_str(&format!("{name} = {}\n", hcl_string(value)));
        }
        Some(text)
    }

    /// Nomad parses the file (and its `.vars.hcl`); the policy comes from
    /// the parsed job's meta.
    pub(super) async fn parse(&self, file: &str) -> Result<Parsed, String> {
        let path = self.ctx.inside("jobs", file)?;
        let hcl = std::fs::read_to_string(&path).map_err(|e| format!("cannot read it: {e}"))?;
        let stem = file.strip_suffix(".nomad.hcl").unwrap_or(file);
        let stem = stem.strip_suffix(".hcl").unwrap_or(stem);
        let vars_path = self
            .ctx
            .inside("(its variables file)", &format!("{stem}.vars.hcl"))?;
        let vars = match std::fs::read_to_string(&vars_path) {
            Ok(v) => Some(v),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {stem}.vars.hcl: {e}")),
        };
        let vars = self.variables(vars);
        let mut job = self.parse_hcl(&hcl, vars.as_deref(), true).await?;
        let id = job["ID"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or("Nomad's parse returned a job without an ID")?
            .to_string();
        // The target's `namespace` is for jobs whose file names none.
        // Canonicalize writes `default` into those, so when it says
        // `default` and the target has a namespace, a parse without
        // Canonicalize tells a file that names `default` from one that names
        // nothing.
        let parsed_ns = job["Namespace"].as_str().unwrap_or("").to_string();
        let namespace = match (&self.cfg.namespace, parsed_ns.as_str()) {
            (Some(ns), "") => ns.clone(),
            (Some(ns), "default") => {
                let raw = self.parse_hcl(&hcl, vars.as_deref(), false).await?;
                match raw["Namespace"].as_str() {
                    Some(named) if !named.is_empty() => named.to_string(),
                    _ => ns.clone(),
                }
            }
            (None, "") => "default".into(),
            (_, ns) => ns.to_string(),
        };
        job["Namespace"] = Value::String(namespace.clone());
        let policy = self.policy(file, &job);
        let meta = |k: &str| {
            job["Meta"][k]
                .as_str()
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        };
        let pre_hook = meta("driftless_pre_hook");
        let post_hook = meta("driftless_post_hook");
        let hook_timeout = meta("driftless_hook_timeout")
            .and_then(|t| humantime::parse_duration(&t).ok())
            .unwrap_or(DEFAULT_HOOK_TIMEOUT);
        Ok(Parsed {
            file: file.to_string(),
            key: JobKey {
                cluster: self.cluster.clone(),
                namespace,
                job: id,
            },
            job,
            policy,
            pre_hook,
            post_hook,
            hook_timeout,
        })
    }

    /// The policy from the job's own meta; anything invalid is `none` and
    /// an ERROR naming the file and key.
    pub(super) fn policy(&self, file: &str, job: &Value) -> Policy {
        let meta = job["Meta"].as_object();
        let mut invalid = Vec::new();
        let mut policy = job_policy(&self.cfg.default_policy).unwrap_or(Policy::Detect);
        if let Some(meta) = meta {
            for (k, v) in meta {
                if !k.starts_with("driftless_") {
                    continue;
                }
                if !KNOWN_META.contains(&k.as_str()) {
                    invalid.push(format!(
                        "unknown meta key `{k}` (known: {})",
                        KNOWN_META.join(", ")
                    ));
                    continue;
                }
                if k == "driftless_policy" {
                    match v.as_str().and_then(job_policy) {
                        Some(p) => policy = p,
                        None => invalid.push(format!(
                            "meta `driftless_policy` = {v} must be \"auto\", \"approval\" or \"none\""
                        )),
                    }
                }
                if (k == "driftless_pre_hook" || k == "driftless_post_hook")
                    && v.as_str().is_none_or(|s| s.trim().is_empty())
                {
                    invalid.push(format!("meta `{k}` must name a parameterized job"));
                }
                if k == "driftless_hook_timeout"
                    && v.as_str()
                        .is_none_or(|s| humantime::parse_duration(s.trim()).is_err())
                {
                    invalid.push(format!(
                        "meta `driftless_hook_timeout` = {v} must be a duration like \"5m\""
                    ));
                }
            }
        }
        if invalid.is_empty() {
            policy
        } else {
            for why in &invalid {
                tracing::error!(
                    target_name = %self.ctx.name,
                    file,
                    "{file}: {why}; the job's policy is `none` until this is fixed"
                );
            }
            Policy::Detect
        }
    }

    /// The spec driftless would register: the parsed job with the live
    /// count of every group whose scaling block is enabled.
    pub(super) fn with_live_counts(job: &Value, live: Option<&Value>) -> Value {
        let mut job = job.clone();
        let Some(live) = live else { return job };
        let live_counts: BTreeMap<&str, &Value> = live["TaskGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| Some((g["Name"].as_str()?, &g["Count"])))
            .collect();
        if let Some(groups) = job["TaskGroups"].as_array_mut() {
            for g in groups {
                let scaled = g["Scaling"]["Enabled"].as_bool() == Some(true);
                let name = g["Name"].as_str().unwrap_or("").to_string();
                if scaled && let Some(c) = live_counts.get(name.as_str()) {
                    g["Count"] = (*c).clone();
                }
            }
        }
        job
    }
}

/// A path segment, percent-encoded.
pub(super) fn seg(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// `value` as an HCL quoted string: its escapes (`\\`, `\"`, `\n`, `\r`,
/// `\t`, `\uNNNN` for other control characters) and template sequences
/// doubled (`$${`, `%%{`), so Nomad reads back exactly `value`
/// (hashicorp/hcl hclsyntax/spec.md, "Template Literals" and escapes).
pub(super) fn hcl_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '$' | '%' if chars.peek() == Some(&'{') => {
                out.push(c);
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_input_becomes_an_hcl_string_nomad_reads_back_as_it_was() {
        assert_eq!(hcl_string("nginx:1.27"), r#""nginx:1.27""#);
        assert_eq!(
            hcl_string("a \"b\" \\ c\nd ${e} %{f} $g\u{1}"),
            r#""a \"b\" \\ c\nd $${e} %%{f} $g\u0001""#
        );
    }

    #[test]
    fn live_counts_are_kept_only_for_enabled_scaling_groups() {
        let job = json!({ "TaskGroups": [
            { "Name": "a", "Count": 2, "Scaling": { "Enabled": true } },
            { "Name": "b", "Count": 2, "Scaling": { "Enabled": false } },
            { "Name": "c", "Count": 2, "Scaling": null }
        ]});
        let live = json!({ "TaskGroups": [
            { "Name": "a", "Count": 7 }, { "Name": "b", "Count": 7 }, { "Name": "c", "Count": 7 }
        ]});
        let spec = Nomad::with_live_counts(&job, Some(&live));
        let counts: Vec<i64> = spec["TaskGroups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["Count"].as_i64())
            .collect();
        assert_eq!(counts, [7, 2, 2]);
    }
}
