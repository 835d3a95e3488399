//! A nomad target's `[targets.backend]` table: its keys, their defaults
//! and what `driftless check` says of them.

use super::*;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "nomad"`: HashiCorp Nomad jobs, one per file.
pub struct Config {
    /// Nomad's HTTP API, e.g. `https://nomad.lan:4646`.
    pub address: String,
    /// A file holding the ACL token, or `env:NOMAD_TOKEN`.
    pub token_file: Option<String>,
    /// The namespace for jobs that don't name one.
    pub namespace: Option<String>,
    /// The region jobs are registered in. Default: the agent's.
    pub region: Option<String>,
    /// Extra CA roots (PEM) for Nomad's TLS certificate.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key (PEM) for mutual TLS.
    pub client_cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    pub client_key_file: Option<PathBuf>,
    /// Which files in the target's path are jobs (one job per file).
    /// Default: *.nomad.hcl.
    #[serde(default = "default_jobs")]
    pub jobs: String,
    /// The policy of jobs whose meta doesn't set one (`auto`, `approval`,
    /// or `none`: never write the job). Default: auto.
    #[serde(default = "default_policy")]
    #[schemars(extend("enum" = ["auto", "approval", "none", "detect"]))]
    pub default_policy: String,
    /// `destroy` deregisters (never purges) the target's jobs only when set.
    #[serde(default)]
    pub allow_destroy: bool,
    /// How long a deployment may wait for a person to promote its canaries
    /// before its owners are told it is overdue (it is never failed for
    /// it: Nomad's progress deadline governs that). Default 1h.
    #[serde(default)]
    pub promotion_wait: Option<String>,
    #[serde(skip)]
    pub(super) token: Option<SecretRef>,
}

fn default_jobs() -> String {
    "*.nomad.hcl".into()
}

fn default_policy() -> String {
    "auto".into()
}

/// A policy word as a job's `meta { driftless_policy }` and `default_policy`
/// say it: `auto`, `approval`, or `none` (never write this job: the
/// target-wide `detect`, which is accepted too). `approve_destructive` is
/// not: a job's plan diff does not say all that registering it stops.
pub fn job_policy(word: &str) -> Option<Policy> {
    match word {
        "none" => Some(Policy::Detect),
        w => Policy::parse(w).filter(|p| *p != Policy::ApproveDestructive),
    }
}

/// How long a deployment waits for promotion before its owners hear it is
/// overdue, unless `promotion_wait` says otherwise.
pub(super) const DEFAULT_PROMOTION_WAIT: Duration = Duration::from_secs(3600);

/// `promotion_wait`: a duration from 1s to 7d.
pub(super) fn parse_promotion_wait(raw: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(raw.trim())
        .map_err(|e| format!("`promotion_wait` `{raw}` is not a duration like 30m or 2h: {e}"))?;
    if d < Duration::from_secs(1) || d > Duration::from_secs(7 * 86400) {
        return Err(format!(
            "`promotion_wait` `{raw}` must be at least 1s and at most 7d"
        ));
    }
    Ok(d)
}

impl crate::backend::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        let a = self.address.trim();
        if !(a.starts_with("http://") || a.starts_with("https://")) {
            p.push((
                "address".into(),
                format!("`address` `{a}` must be an http:// or https:// URL, like https://nomad.lan:4646"),
            ));
        }
        if job_policy(&self.default_policy).is_none() {
            p.push((
                "default_policy".into(),
                format!(
                    "`default_policy` `{}` must be auto, approval or none",
                    self.default_policy
                ),
            ));
        }
        if self.jobs.is_empty() || self.jobs.contains('/') {
            p.push((
                "jobs".into(),
                format!(
                    "`jobs` `{}` must be a file name pattern like *.nomad.hcl",
                    self.jobs
                ),
            ));
        }
        if let Some(w) = &self.promotion_wait
            && let Err(why) = parse_promotion_wait(w)
        {
            p.push(("promotion_wait".into(), why));
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            let key = if self.client_cert_file.is_some() {
                "client_key_file"
            } else {
                "client_cert_file"
            };
            p.push((
                key.into(),
                "`client_cert_file` and `client_key_file` go together".into(),
            ));
        }
        p
    }

    /// It answers `plan` (for `driftless plan`); its policies are per job.
    fn can_plan(&self) -> bool {
        true
    }

    /// Each job is reviewed on its own: recorded, held for approval as its
    /// policy says, followed until it settles.
    fn reviews_units(&self) -> bool {
        true
    }

    /// The target's `policy` is its jobs' default (a job's `meta {
    /// driftless_policy }` still overrides it). `detect` is the jobs'
    /// default too, should the backend be asked to apply anyway (the tick
    /// only plans). It must agree with `default_policy` when both are set.
    fn set_unit_policy(&mut self, policy: Policy) -> Result<(), String> {
        let p = policy.as_str();
        let default = job_policy(&self.default_policy);
        if policy == Policy::ApproveDestructive {
            Err(format!(
                "`{p}` on a nomad target: Nomad's plan does not say whether a change \
                 deletes something; use \"approval\", or a job's `meta {{ driftless_policy }}`"
            ))
        } else if default == Some(Policy::Auto) || default == Some(policy) {
            self.default_policy = p.to_string();
            Ok(())
        } else {
            Err(format!(
                "`{p}` says one thing and the backend's `default_policy` `{}` another: set one of them",
                self.default_policy
            ))
        }
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn crate::backend::Backend>, BackendError> {
        Ok(Box::new(Nomad::new(self.clone(), ctx)?))
    }

    fn resolve_paths(&mut self, base: &Path) {
        self.token = self
            .token_file
            .as_deref()
            .map(|raw| SecretRef::parse(raw, base));
        for p in [
            &mut self.ca_file,
            &mut self.client_cert_file,
            &mut self.client_key_file,
        ]
        .into_iter()
        .flatten()
        {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        }
    }

    /// Files on the controller that must be readable, for `driftless check`.
    fn check_environment(&self) -> Vec<(String, String)> {
        let mut p = Vec::new();
        if let Some(t) = &self.token
            && let Err(e) = t.load()
        {
            p.push(("token_file".into(), e.to_string()));
        }
        for (key, f) in [
            ("ca_file", &self.ca_file),
            ("client_cert_file", &self.client_cert_file),
            ("client_key_file", &self.client_key_file),
        ] {
            if let Some(f) = f.as_ref().filter(|f| !f.is_file()) {
                p.push((
                    key.into(),
                    format!("{} is not a readable file", f.display()),
                ));
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_wait_is_a_bounded_duration_named_in_its_error() {
        assert_eq!(parse_promotion_wait("90m"), Ok(Duration::from_secs(5400)));
        for bad in ["10ms", "8d", "soon"] {
            let e = parse_promotion_wait(bad).expect_err(bad);
            assert!(e.contains("`promotion_wait`") && e.contains(bad), "{e}");
        }
    }
}
