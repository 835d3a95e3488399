//! Nomad's HTTP API as this backend calls it: one client (TLS, token,
//! region), the error a failed call gives, and the four calls a job's
//! reconcile makes (read the live job, plan, register with CAS, list its
//! deployments). No ledger, no policy.

use super::*;

/// A failed call to Nomad: which call, and what Nomad said.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NomadError {
    #[error("cannot reach Nomad at {address} for {call}: {reason}")]
    Unreachable {
        address: String,
        call: String,
        reason: String,
    },
    #[error("Nomad answered {status} to {call}: {body}")]
    Status {
        call: String,
        status: u16,
        body: String,
    },
    #[error("Nomad's answer to {call} is not what its API documents: {reason}")]
    Invalid { call: String, reason: String },
}

impl NomadError {
    pub(super) fn is_cas_conflict(&self) -> bool {
        matches!(self, NomadError::Status { status: 500, body, .. } if body.contains("Enforcing job modify index"))
    }
}

pub(super) struct Client {
    http: reqwest::Client,
    pub(super) address: String,
    token: Option<String>,
    region: Option<String>,
    redactor: crate::redact::Redactor,
}

impl Client {
    pub(super) fn new(cfg: &Config, ctx: &mut Context) -> Result<Client, BackendError> {
        let mut b = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60).min(ctx.timeout));
        if let Some(ca) = &cfg.ca_file {
            let pem = std::fs::read(ca).map_err(|e| {
                BackendError::Config(format!("backend.ca_file {}: {e}", ca.display()))
            })?;
            let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                BackendError::Config(format!("backend.ca_file {}: {e}", ca.display()))
            })?;
            for c in certs {
                b = b.add_root_certificate(c);
            }
        }
        if let (Some(cert), Some(key)) = (&cfg.client_cert_file, &cfg.client_key_file) {
            let mut pem = std::fs::read(cert).map_err(|e| {
                BackendError::Config(format!("backend.client_cert_file {}: {e}", cert.display()))
            })?;
            pem.push(b'\n');
            pem.extend(std::fs::read(key).map_err(|e| {
                BackendError::Config(format!("backend.client_key_file {}: {e}", key.display()))
            })?);
            let id = reqwest::Identity::from_pem(&pem).map_err(|e| {
                BackendError::Config(format!("backend.client_cert_file/client_key_file: {e}"))
            })?;
            b = b.identity(id);
        }
        let http = b
            .build()
            .map_err(|e| BackendError::Config(format!("cannot build Nomad's HTTP client: {e}")))?;
        let token = match &cfg.token {
            Some(r) => {
                let t = r
                    .load()
                    .map_err(|e| BackendError::Config(format!("backend.token_file: {e}")))?;
                ctx.redactor.add(t.clone());
                Some(t)
            }
            None => None,
        };
        Ok(Client {
            http,
            address: cfg.address.trim_end_matches('/').to_string(),
            token,
            region: cfg.region.clone(),
            redactor: ctx.redactor.clone(),
        })
    }

    /// One API call; `Ok(None)` for a 404 when `not_found_ok`.
    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        namespace: Option<&str>,
        query: &[(&str, &str)],
        body: Option<&Value>,
        not_found_ok: bool,
    ) -> Result<Option<Value>, NomadError> {
        let call = format!("{method} {path}");
        let mut q: Vec<(&str, &str)> = query.to_vec();
        if let Some(ns) = namespace {
            q.push(("namespace", ns));
        }
        if let Some(r) = &self.region {
            q.push(("region", r));
        }
        let mut url = format!("{}{path}", self.address);
        if !q.is_empty() {
            let qs = form_urlencoded::Serializer::new(String::new())
                .extend_pairs(q)
                .finish();
            url.push('?');
            url.push_str(&qs);
        }
        let mut req = self.http.request(method, url);
        if let Some(t) = &self.token {
            req = req.header("X-Nomad-Token", t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req.send().await.map_err(|e| NomadError::Unreachable {
            address: self.address.clone(),
            call: call.clone(),
            reason: self.redactor.redact(&crate::error::chain(&e)),
        })?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(|e| NomadError::Unreachable {
            address: self.address.clone(),
            call: call.clone(),
            reason: self.redactor.redact(&crate::error::chain(&e)),
        })?;
        if status == 404 && not_found_ok {
            return Ok(None);
        }
        if !(200..300).contains(&status) {
            let mut body = self.redactor.redact(text.trim());
            if body.len() > 2000 {
                let mut cut = 2000;
                while !body.is_char_boundary(cut) {
                    cut -= 1;
                }
                body.truncate(cut);
                body.push('…');
            }
            return Err(NomadError::Status { call, status, body });
        }
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| NomadError::Invalid {
                call,
                reason: format!("not JSON: {e}"),
            })
    }
}

impl Client {
    /// `GET path` in `namespace`; a 404 is an error.
    pub(super) async fn get(&self, path: &str, namespace: &str) -> Result<Value, NomadError> {
        self.call(
            reqwest::Method::GET,
            path,
            Some(namespace),
            &[],
            None,
            false,
        )
        .await
        .map(|v| v.unwrap_or(Value::Null))
    }
}

impl Nomad {
    pub(super) async fn live(&self, key: &JobKey) -> Result<Option<Value>, NomadError> {
        self.client
            .call(
                reqwest::Method::GET,
                &format!("/v1/job/{}", seg(&key.job)),
                Some(&key.namespace),
                &[],
                None,
                true,
            )
            .await
    }

    pub(super) async fn plan(&self, key: &JobKey, job: &Value) -> Result<Plan, NomadError> {
        let call = format!("POST /v1/job/{}/plan", key.job);
        let v = self
            .client
            .call(
                reqwest::Method::POST,
                &format!("/v1/job/{}/plan", seg(&key.job)),
                Some(&key.namespace),
                &[],
                Some(&json!({ "Job": job, "Diff": true, "PolicyOverride": false })),
                false,
            )
            .await?
            .unwrap_or(Value::Null);
        let index = v["JobModifyIndex"].as_i64().ok_or(NomadError::Invalid {
            call: call.clone(),
            reason: "no JobModifyIndex".into(),
        })?;
        let diff = v["Diff"].clone();
        let annotations = v["Annotations"].clone();
        let kind = diff["Type"]
            .as_str()
            .ok_or(NomadError::Invalid {
                call,
                reason: "no Diff.Type (was Diff: true sent?)".into(),
            })?
            .to_string();
        Ok(Plan {
            index,
            diff,
            kind,
            annotations,
        })
    }

    pub(super) async fn register(
        &self,
        key: &JobKey,
        job: &Value,
        index: i64,
    ) -> Result<Value, NomadError> {
        self.client
            .call(
                reqwest::Method::POST,
                "/v1/jobs",
                Some(&key.namespace),
                &[],
                Some(&json!({
                    "Job": job,
                    "EnforceIndex": true,
                    "JobModifyIndex": index,
                    "PolicyOverride": false,
                })),
                false,
            )
            .await
            .map(|v| v.unwrap_or(Value::Null))
    }

    /// The job's deployments (`GET /v1/job/:id/deployments`: those of the
    /// job's current incarnation).
    pub(super) async fn nomad_deployments(&self, key: &JobKey) -> Result<Vec<Value>, NomadError> {
        let call = format!("GET /v1/job/{}/deployments", key.job);
        match self
            .client
            .get(
                &format!("/v1/job/{}/deployments", seg(&key.job)),
                &key.namespace,
            )
            .await?
        {
            Value::Array(a) => Ok(a),
            Value::Null => Ok(Vec::new()),
            _ => Err(NomadError::Invalid {
                call,
                reason: "not a list of deployments".into(),
            }),
        }
    }
}
