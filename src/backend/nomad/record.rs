//! Moving a deployment record through the ledger: state changes, reloads,
//! failing and superseding it, and the message each carries. Never calls
//! Nomad.

use super::*;

impl Nomad {
    /// Move deployment `id` from `from` to `to` (with a message): durable
    /// when this returns; a ledger error stops the apply.
    pub(super) async fn set_state(
        &self,
        p: &Parsed,
        id: i64,
        from: &str,
        to: &str,
        message: Option<String>,
    ) -> Result<(), JobReport> {
        self.ledger
            .transition(
                id,
                from,
                to,
                Change {
                    message,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))
    }

    pub(super) fn ledger_err(&self, p: &Parsed, e: LedgerError) -> JobReport {
        self.job_error(
            &p.file,
            Some(&p.key.job),
            format!("cannot record its deployment, so nothing was sent to Nomad: {e}"),
        )
    }

    /// The deployment as the ledger has it now.
    pub(super) async fn reload(&self, p: &Parsed, id: i64) -> Result<Deployment, JobReport> {
        match self.ledger.active(&p.key).await {
            Ok(Some(d)) if d.id == id => Ok(d),
            Ok(_) => Err(self.job_error(
                &p.file,
                Some(&p.key.job),
                format!("deployment {id} is no longer active (another process moved it)"),
            )),
            Err(e) => Err(self.ledger_err(p, e)),
        }
    }

    pub(super) async fn fail_deployment(
        &self,
        p: &Parsed,
        id: i64,
        at_index: i64,
        msg: String,
    ) -> Result<Followed, JobReport> {
        self.fail_from(p, id, "applying", Some(at_index), msg).await
    }

    /// Move a deployment to `failed`; `at_index` is the live JobModifyIndex
    /// the same spec must not be registered again at (default: the one it
    /// was planned against).
    pub(super) async fn fail_from(
        &self,
        p: &Parsed,
        id: i64,
        from: &str,
        at_index: Option<i64>,
        msg: String,
    ) -> Result<Followed, JobReport> {
        let msg = self.ctx.redactor.redact(&msg);
        self.ledger
            .transition(
                id,
                from,
                "failed",
                Change {
                    message: Some(msg.clone()),
                    failed_at_index: at_index,
                    ..Change::default()
                },
            )
            .await
            .map_err(|e| self.ledger_err(p, e))?;
        Ok(Followed::Settled(self.job_error(
            &p.file,
            Some(&p.key.job),
            msg,
        )))
    }

    /// Give up on an active deployment for a newer spec.
    pub(super) async fn supersede(
        &self,
        p: &Parsed,
        d: &Deployment,
        why: String,
    ) -> Result<Followed, JobReport> {
        self.set_state(p, d.id, &d.state, "superseded", Some(why.clone()))
            .await?;
        Ok(Followed::Superseded(JobReport {
            result: JobResult::NoChange,
            line: format!("{}: deployment {} {why}", p.key.job, d.id),
        }))
    }

    /// Why a newer spec replaces deployment `d`: a newer commit, or, at
    /// the same commit, what else goes into the spec (the target's inputs,
    /// the job's variables file as it resolves, a scaled group's live count).
    pub(super) fn superseded_by(&self, d: &Deployment) -> String {
        let now = self.commit();
        if !now.is_empty() && d.commit_sha != now {
            format!("superseded by commit {}", self.commit_short())
        } else {
            format!(
                "superseded at the same commit {}: the job's spec changed (the target's inputs, or a scaled group's live count)",
                self.commit_short()
            )
        }
    }

    /// Has a person paused this job of the target?
    pub(super) async fn paused(&self, p: &Parsed) -> Result<bool, JobReport> {
        self.ledger
            .is_paused(&self.ctx.name, &p.key.job)
            .await
            .map_err(|e| self.ledger_err(p, e))
    }
}
