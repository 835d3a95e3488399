//! CloudFormation through the AWS SDK (feature `cloudformation`): a change
//! set made, waited on and executed (or kept for an approved plan and
//! executed by its id), the stack waited on, and the reasons AWS gives read
//! from its events in order. What a status means is decided in the parent
//! module, without the SDK.

use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use crate::model::CommitId;
use aws_config::BehaviorVersion;
use aws_sdk_cloudformation::Client;
use aws_sdk_cloudformation::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_cloudformation::types::{
    Capability, ChangeSetStatus, ChangeSetType, Parameter, Stack, StackEvent, Tag,
};

/// The failing resources' reasons among one operation's events (newest
/// first, as AWS lists them), oldest first: which events belong to the
/// operation is decided by AWS's own order, never by this machine's
/// clock.
fn failure_reasons(events: &[StackEvent]) -> String {
    let mut reasons: Vec<String> = events
        .iter()
        .filter(|e| {
            e.resource_status()
                .is_some_and(|s| s.as_str().ends_with("_FAILED"))
        })
        .map(|e| {
            format!(
                "{} {}: {}",
                e.logical_resource_id().unwrap_or("?"),
                e.resource_status().map(|s| s.as_str()).unwrap_or("?"),
                e.resource_status_reason().unwrap_or("no reason given")
            )
        })
        .collect();
    reasons.reverse();
    reasons.dedup();
    if reasons.is_empty() {
        "no failed resource events".into()
    } else {
        reasons.join("; ")
    }
}

use super::{
    Config, Settled, capabilities_message, change_set_name, failed_create, means_no_change,
    settled, stuck,
};
use crate::backend::{
    ApplyResult, Backend, BackendError, BoxFuture, Context, Outputs, Plan, PlanToApply, Status,
};
use sha2::{Digest, Sha256};

pub struct CloudFormation {
    cfg: Config,
    ctx: Context,
}

/// A change set made and waited on.
enum Staged {
    /// Nothing to change (the change set was deleted).
    NoChange(Status),
    /// Ready to execute.
    Ready {
        id: String,
        kind: ChangeSetType,
        stamp: u128,
    },
}

/// A plan's artifact: the change set kept for it, in a file under the
/// plans directory (so it is pruned like any plan file).
#[derive(serde::Serialize, serde::Deserialize)]
struct KeptChangeSet {
    id: String,
    kind: String,
    stamp: u128,
}

/// One change of a change set, as a plan line: `+` add, `~` modify,
/// `-/+` a modify that replaces (AWS's `Replacement` True or
/// Conditional), `-` remove; and whether it destroys something.
fn change_line(rc: &aws_sdk_cloudformation::types::ResourceChange) -> (String, bool) {
    use aws_sdk_cloudformation::types::{ChangeAction, Replacement};
    let id = rc.logical_resource_id().unwrap_or("?");
    let ty = rc.resource_type().unwrap_or("?");
    let replaces = matches!(
        rc.replacement(),
        Some(Replacement::True) | Some(Replacement::Conditional)
    );
    match rc.action() {
        Some(ChangeAction::Add) => (format!("+ {id} ({ty})"), false),
        Some(ChangeAction::Remove) => (format!("- {id} ({ty})"), true),
        Some(ChangeAction::Modify) if replaces => (format!("-/+ {id} ({ty}, replacement)"), true),
        Some(ChangeAction::Modify) => (format!("~ {id} ({ty})"), false),
        Some(other) => (format!("~ {id} ({ty}, {})", other.as_str()), replaces),
        None => (format!("~ {id} ({ty})"), replaces),
    }
}

/// One change of a change set in the plan document's normal form (its
/// new properties from the submitted template, `resources`: AWS gives no
/// property values) and as AWS said it (`raw`).
fn change_item(
    rc: &aws_sdk_cloudformation::types::ResourceChange,
    line: &str,
    resources: &Value,
    redactor: &crate::redact::Redactor,
) -> (crate::plan::Change, Value) {
    use crate::plan::{Action, Change};
    let id = rc.logical_resource_id().unwrap_or("?");
    let sign = line.split_whitespace().next().unwrap_or("~");
    let action = Action::of_sign(sign).unwrap_or(Action::Update);
    let mut item = Change::new(id, rc.resource_type().unwrap_or(""), action);
    if action != Action::Delete {
        item.after = resources[id]["Properties"].clone();
        crate::plan::redact_json(&mut item.after, redactor);
    }
    let raw = serde_json::json!({
        "LogicalResourceId": id,
        "PhysicalResourceId": rc.physical_resource_id(),
        "ResourceType": rc.resource_type(),
        "Action": rc.action().map(|a| a.as_str()),
        "Replacement": rc.replacement().map(|r| r.as_str()),
    });
    (item, raw)
}

/// A failed SDK call, in words, with a hint when credentials are the
/// problem.
fn sdk_err<E>(call: &str, stack: &str, e: &aws_sdk_cloudformation::error::SdkError<E>) -> String
where
    E: std::error::Error + ProvideErrorMetadata + 'static,
{
    let detail = match (e.code(), e.message()) {
        (Some(c), Some(m)) => format!("{c}: {m}"),
        _ => format!("{}", DisplayErrorContext(e)),
    };
    let mut msg = format!("CloudFormation {call} for stack `{stack}` failed: {detail}");
    let lower = msg.to_lowercase();
    if lower.contains("credentials") || lower.contains("credential provider") {
        msg.push_str(
            " (no usable AWS credentials: set them in the environment, a profile/SSO login, web identity or an instance role)",
        );
    }
    msg
}

fn is_missing_stack<E: ProvideErrorMetadata>(
    e: &aws_sdk_cloudformation::error::SdkError<E>,
) -> bool {
    e.code() == Some("ValidationError") && e.message().is_some_and(|m| m.contains("does not exist"))
}

pub fn build(cfg: Config, ctx: Context) -> Result<Box<dyn Backend>, BackendError> {
    Ok(Box::new(CloudFormation { cfg, ctx }))
}

impl CloudFormation {
    async fn client(&self) -> Client {
        Client::new(&self.sdk_config().await)
    }

    async fn sdk_config(&self) -> aws_config::SdkConfig {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(r) = &self.cfg.region {
            loader = loader.region(aws_config::Region::new(r.clone()));
        }
        if let Some(p) = &self.cfg.profile {
            loader = loader.profile_name(p);
        }
        if let Some(u) = &self.cfg.endpoint_url {
            loader = loader.endpoint_url(u);
        }
        let sdk = loader.load().await;
        match &self.cfg.role_arn {
            Some(role) => {
                let provider = aws_config::sts::AssumeRoleProvider::builder(role)
                    .session_name(format!("driftless-{}", self.ctx.name))
                    .configure(&sdk)
                    .build()
                    .await;
                sdk.into_builder()
                    .credentials_provider(
                        aws_sdk_cloudformation::config::SharedCredentialsProvider::new(provider),
                    )
                    .build()
            }
            None => sdk,
        }
    }

    /// Upload the template to `template_bucket` (content-addressed:
    /// the same template is the same object) and return its TemplateURL.
    async fn upload_template(&self, bucket: &str, body: &str) -> Result<String, String> {
        use sha2::Digest;
        let sdk = self.sdk_config().await;
        let s3 = aws_sdk_s3::Client::from_conf(
            aws_sdk_s3::config::Builder::from(&sdk)
                // an S3-compatible endpoint (tests, LocalStack) serves
                // buckets by path
                .force_path_style(self.cfg.endpoint_url.is_some())
                .build(),
        );
        let ext = std::path::Path::new(&self.cfg.template)
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("template");
        let key = format!(
            "driftless/{}/{}.{ext}",
            self.stack(),
            hex::encode(sha2::Sha256::digest(body.as_bytes()))
        );
        s3.put_object()
            .bucket(bucket)
            .key(&key)
            .body(aws_sdk_s3::primitives::ByteStream::from(body.as_bytes().to_vec()))
            .send()
            .await
            .map_err(|e| {
                let detail = match (e.code(), e.message()) {
                    (Some(c), Some(m)) => format!("{c}: {m}"),
                    _ => format!("{}", aws_sdk_s3::error::DisplayErrorContext(&e)),
                };
                format!(
                    "cannot upload template {} to s3://{bucket}/{key} (`template_bucket`): {detail}",
                    self.cfg.template
                )
            })?;
        // CloudFormation reads the object itself, by its virtual-hosted
        // URL in the stack's region.
        let region = sdk
            .region()
            .map(|r| r.as_ref().to_string())
            .unwrap_or_else(|| "us-east-1".into());
        Ok(format!("https://{bucket}.s3.{region}.amazonaws.com/{key}"))
    }

    fn stack(&self) -> &str {
        &self.cfg.stack_name
    }

    async fn describe(&self, c: &Client) -> Result<Option<Stack>, String> {
        match c.describe_stacks().stack_name(self.stack()).send().await {
            Ok(out) => Ok(out.stacks().first().cloned()),
            Err(e) if is_missing_stack(&e) => Ok(None),
            Err(e) => Err(sdk_err("DescribeStacks", self.stack(), &e)),
        }
    }

    /// Poll the stack until it settles or `deadline` passes; returns the
    /// final status (`None`: the stack is gone).
    async fn wait_stack(&self, c: &Client, deadline: Instant) -> Result<Option<String>, String> {
        let mut pause = Duration::from_millis(500);
        loop {
            let status = self
                .describe(c)
                .await?
                .and_then(|s| s.stack_status().map(|s| s.as_str().to_string()));
            match &status {
                None => return Ok(None),
                Some(s) if settled(s) != Settled::InProgress => return Ok(status),
                Some(s) => {
                    if Instant::now() + pause > deadline {
                        return Err(format!(
                            "timed out after {} waiting for stack `{}`; it was in state {s}",
                            humantime::format_duration(self.ctx.timeout),
                            self.stack()
                        ));
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// The stack's events newer than the event `mark` (newest first),
    /// paging back until `mark`; every event with no `mark`.
    async fn events_since(
        &self,
        c: &Client,
        mark: Option<&str>,
    ) -> Result<Vec<StackEvent>, String> {
        let mut out = Vec::new();
        let mut next: Option<String> = None;
        for _ in 0..50 {
            let page = c
                .describe_stack_events()
                .stack_name(self.stack())
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| sdk_err("DescribeStackEvents", self.stack(), &e))?;
            for e in page.stack_events() {
                if mark.is_some() && e.event_id() == mark {
                    return Ok(out);
                }
                out.push(e.clone());
            }
            match page.next_token() {
                Some(t) => next = Some(t.to_string()),
                None => break,
            }
        }
        Ok(out)
    }

    /// Wait for the operation ExecuteChangeSet started: its events are
    /// the ones newer than `mark` (the stack runs one operation at a
    /// time; AWS stamps them with the operation's ClientRequestToken),
    /// and it has ended when the newest stack-level one is no longer
    /// `*_IN_PROGRESS`. DescribeStacks is not asked: right after the
    /// execute it can still show the previous operation's end state.
    async fn wait_operation(
        &self,
        c: &Client,
        mark: Option<&str>,
        token: &str,
        deadline: Instant,
    ) -> Result<(String, Vec<StackEvent>), String> {
        let mut pause = Duration::from_millis(500);
        loop {
            let ours: Vec<StackEvent> = self
                .events_since(c, mark)
                .await?
                .into_iter()
                .filter(|e| e.client_request_token().is_none_or(|t| t == token))
                .collect();
            let stack_level = ours
                .iter()
                .find(|e| {
                    e.logical_resource_id() == Some(self.stack())
                        && e.resource_type() == Some("AWS::CloudFormation::Stack")
                })
                .and_then(|e| e.resource_status().map(|s| s.as_str().to_string()));
            if let Some(s) = &stack_level
                && settled(s) != Settled::InProgress
            {
                return Ok((s.clone(), ours));
            }
            if Instant::now() + pause > deadline {
                let state = match stack_level {
                    Some(s) => s,
                    None => self
                        .describe(c)
                        .await?
                        .and_then(|s| s.stack_status().map(|s| s.as_str().to_string()))
                        .unwrap_or_else(|| "not started".into()),
                };
                return Err(format!(
                    "timed out after {} waiting for stack `{}`; it was in state {state}",
                    humantime::format_duration(self.ctx.timeout),
                    self.stack()
                ));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    async fn apply_inner(&self) -> Result<Status, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let c = self.client().await;
        let mut notes = Vec::new();
        match self.change_set(&c, deadline, &mut notes, true).await? {
            Staged::NoChange(status) => Ok(status),
            Staged::Ready { id, kind, stamp } => {
                self.execute(&c, &id, &kind, stamp, notes, deadline).await
            }
        }
    }

    /// Make a change set for the template at this commit and wait for
    /// it: `NoChange` (the change set deleted) or `Ready` to execute.
    /// With `recreate`, a stack left in ROLLBACK_COMPLETE is deleted
    /// first; without (a plan, which changes nothing), that is refused.
    async fn change_set(
        &self,
        c: &Client,
        deadline: Instant,
        notes: &mut Vec<String>,
        recreate: bool,
    ) -> Result<Staged, String> {
        let template_path = self.ctx.workdir.join(&self.cfg.template);
        let body = std::fs::read_to_string(&template_path)
            .map_err(|e| format!("template {}: {e}", self.cfg.template))?;
        self.cfg.check_template_size(body.len())?;
        let params = self.cfg.parameters(&self.ctx)?;
        let template_url = match &self.cfg.template_bucket {
            Some(bucket) => Some(self.upload_template(bucket, &body).await?),
            None => None,
        };

        let status = self.stack_before(c, deadline, notes, recreate).await?;
        let kind = match status.as_deref() {
            None | Some("DELETE_COMPLETE") | Some("REVIEW_IN_PROGRESS") => ChangeSetType::Create,
            Some(_) => ChangeSetType::Update,
        };
        let stamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let name = format!(
            "driftless-{}-{stamp}",
            self.ctx.commit.as_ref().map_or("manual", CommitId::short)
        );
        let parameters: Vec<Parameter> = params
            .iter()
            .map(|(k, v)| {
                Parameter::builder()
                    .parameter_key(k)
                    .parameter_value(v)
                    .build()
            })
            .collect();
        let tags: Vec<Tag> = self
            .cfg
            .tags
            .iter()
            .map(|(k, v)| Tag::builder().key(k).value(v).build())
            .collect();
        let caps: Vec<Capability> = self
            .cfg
            .capabilities
            .iter()
            .map(|c| Capability::from(c.as_str()))
            .collect();
        let created = c
            .create_change_set()
            .stack_name(self.stack())
            .change_set_name(&name)
            .change_set_type(kind.clone())
            .set_template_body(template_url.is_none().then_some(body))
            .set_template_url(template_url)
            .set_parameters(Some(parameters))
            .set_capabilities(Some(caps))
            .set_tags(Some(tags))
            .description(format!(
                "driftless: commit {}",
                self.ctx.commit.as_ref().map_or("(none)", CommitId::as_str)
            ))
            .send()
            .await;
        let created = match created {
            Ok(c) => c,
            // Real AWS may refuse an unchanged update right here.
            Err(e) if e.message().is_some_and(means_no_change) => {
                return Ok(Staged::NoChange(
                    self.no_change(notes, "no changes (refused at CreateChangeSet)"),
                ));
            }
            Err(e) => {
                return Err(e
                    .message()
                    .and_then(capabilities_message)
                    .unwrap_or_else(|| sdk_err("CreateChangeSet", self.stack(), &e)));
            }
        };
        let cs_id = created.id().unwrap_or(&name).to_string();

        // Wait for the change set.
        if let Some(no_change) = self.wait_change_set(c, &cs_id, deadline, notes).await? {
            return Ok(no_change);
        }
        Ok(Staged::Ready {
            id: cs_id,
            kind,
            stamp,
        })
    }

    /// The stack's status before a change set, once it has settled: a
    /// stack AWS will not update is refused; one a failed create left in
    /// ROLLBACK_COMPLETE is deleted first with `recreate` (and only when
    /// driftless made it), else refused. `None`: there is no stack.
    async fn stack_before(
        &self,
        c: &Client,
        deadline: Instant,
        notes: &mut Vec<String>,
        recreate: bool,
    ) -> Result<Option<String>, String> {
        let existing = self.describe(c).await?;
        let mut status = existing
            .as_ref()
            .and_then(|s| s.stack_status().map(|s| s.as_str().to_string()));
        if let Some(s) = status.as_deref()
            && settled(s) == Settled::InProgress
            && s != "REVIEW_IN_PROGRESS"
        {
            status = self.wait_stack(c, deadline).await?;
        }
        if let Some(why) = status.as_deref().and_then(|s| stuck(s, self.stack())) {
            return Err(why);
        }
        if status.as_deref() == Some("ROLLBACK_COMPLETE") {
            let made_by = existing
                .as_ref()
                .and_then(|s| s.change_set_id())
                .and_then(change_set_name);
            if let Some(why) = failed_create(
                self.stack(),
                recreate,
                self.cfg.recreate_failed_create,
                made_by,
            ) {
                return Err(why);
            }
            c.delete_stack()
                .stack_name(self.stack())
                .send()
                .await
                .map_err(|e| sdk_err("DeleteStack", self.stack(), &e))?;
            if let Some(s) = self.wait_stack(c, deadline).await?
                && s != "DELETE_COMPLETE"
            {
                return Err(format!(
                    "stack `{}` was left in ROLLBACK_COMPLETE by a failed create; deleting it ended in {s}",
                    self.stack()
                ));
            }
            notes.push(format!(
                "stack `{}` was left in ROLLBACK_COMPLETE by a failed create and was deleted before creating it again",
                self.stack()
            ));
            status = None;
        }
        Ok(status)
    }

    /// Wait for change set `cs_id` to be made: `None` when it is ready,
    /// `Some(NoChange)` when it changes nothing (it is deleted); `Err` when
    /// it failed (deleted too) or the deadline passed.
    async fn wait_change_set(
        &self,
        c: &Client,
        cs_id: &str,
        deadline: Instant,
        notes: &[String],
    ) -> Result<Option<Staged>, String> {
        let mut pause = Duration::from_millis(300);
        loop {
            let d = c
                .describe_change_set()
                .change_set_name(cs_id)
                .stack_name(self.stack())
                .send()
                .await
                .map_err(|e| sdk_err("DescribeChangeSet", self.stack(), &e))?;
            match d.status() {
                Some(ChangeSetStatus::CreateComplete) => return Ok(None),
                Some(ChangeSetStatus::Failed) => {
                    let reason = d.status_reason().unwrap_or("no reason given").to_string();
                    // Leave nothing behind either way.
                    let _ = c
                        .delete_change_set()
                        .change_set_name(cs_id)
                        .stack_name(self.stack())
                        .send()
                        .await
                        .map_err(|e| {
                            tracing::warn!(
                                target_name = %self.ctx.name,
                                "{}",
                                sdk_err("DeleteChangeSet", self.stack(), &e)
                            )
                        });
                    if means_no_change(&reason) {
                        return Ok(Some(Staged::NoChange(self.no_change(notes, "no changes"))));
                    }
                    if let Some(m) = capabilities_message(&reason) {
                        return Err(m);
                    }
                    return Err(format!(
                        "change set for stack `{}` failed: {reason}",
                        self.stack()
                    ));
                }
                other => {
                    if Instant::now() + pause > deadline {
                        return Err(format!(
                            "timed out after {} waiting for the change set of stack `{}`; it was {}",
                            humantime::format_duration(self.ctx.timeout),
                            self.stack(),
                            other.map(|s| s.as_str()).unwrap_or("in no state")
                        ));
                    }
                }
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(5));
        }
    }

    /// Execute change set `cs_id` and wait for the stack.
    async fn execute(
        &self,
        c: &Client,
        cs_id: &str,
        kind: &ChangeSetType,
        stamp: u128,
        mut notes: Vec<String>,
        deadline: Instant,
    ) -> Result<Status, String> {
        // The newest event before the execute: this operation's events
        // are the ones after it.
        let mark = c
            .describe_stack_events()
            .stack_name(self.stack())
            .send()
            .await
            .map_err(|e| sdk_err("DescribeStackEvents", self.stack(), &e))?
            .stack_events()
            .first()
            .and_then(|e| e.event_id().map(str::to_string));
        let token = format!(
            "driftless-{}-{stamp}",
            self.ctx.commit.as_ref().map_or("manual", CommitId::short)
        );
        c.execute_change_set()
            .change_set_name(cs_id)
            .stack_name(self.stack())
            .client_request_token(&token)
            .send()
            .await
            .map_err(|e| sdk_err("ExecuteChangeSet", self.stack(), &e))?;
        let (final_status, events) = self
            .wait_operation(c, mark.as_deref(), &token, deadline)
            .await?;
        match settled(&final_status) {
            Settled::Succeeded => {
                notes.push(format!(
                    "{} {}",
                    if *kind == ChangeSetType::Create {
                        "created"
                    } else {
                        "updated"
                    },
                    final_status
                ));
                Ok(Status {
                    result: ApplyResult::Changed,
                    message: self.ctx.redactor.redact(&notes.join("; ")),
                    output_tail: String::new(),
                    digest: None,
                })
            }
            _ => {
                let reasons = failure_reasons(&events);
                notes.push(format!(
                    "stack `{}` ended in {final_status}: {reasons}",
                    self.stack()
                ));
                Err(notes.join("; "))
            }
        }
    }

    /// A change set kept as the plan: its changes by logical id, type
    /// and action (never a property value), hashed with the template.
    async fn plan_inner(&self) -> Result<Plan, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let c = self.client().await;
        let mut notes = Vec::new();
        let (id, kind, stamp) = match self.change_set(&c, deadline, &mut notes, false).await? {
            Staged::NoChange(_) => {
                return Ok(Plan {
                    changes: false,
                    summary: "no changes".into(),
                    diff: String::new(),
                    destructive: false,
                    hash: String::new(),
                    ..Plan::default()
                });
            }
            Staged::Ready { id, kind, stamp } => (id, kind, stamp),
        };
        let template = std::fs::read_to_string(self.ctx.workdir.join(&self.cfg.template))
            .map_err(|e| format!("template {}: {e}", self.cfg.template))?;
        let resources = super::template_resources(&template);
        let mut lines = Vec::new();
        let mut items = Vec::new();
        let mut raw = Vec::new();
        let mut destructive = false;
        let (mut add, mut change, mut destroy) = (0, 0, 0);
        let mut next: Option<String> = None;
        loop {
            let d = c
                .describe_change_set()
                .change_set_name(&id)
                .stack_name(self.stack())
                .set_next_token(next.take())
                .send()
                .await
                .map_err(|e| sdk_err("DescribeChangeSet", self.stack(), &e))?;
            for ch in d.changes() {
                let Some(rc) = ch.resource_change() else {
                    continue;
                };
                let (line, destroys) = change_line(rc);
                destructive |= destroys;
                let (item, said) = change_item(rc, &line, &resources, &self.ctx.redactor);
                items.push(item);
                raw.push(said);
                match line.split_whitespace().next() {
                    Some("+") => add += 1,
                    Some("-") => destroy += 1,
                    Some("-/+") => {
                        add += 1;
                        destroy += 1;
                    }
                    _ => change += 1,
                }
                lines.push(line);
            }
            match d.next_token() {
                Some(t) => next = Some(t.to_string()),
                None => break,
            }
        }
        if lines.is_empty() {
            // The change set was made, so something changes: what AWS
            // does not list per resource (outputs, say).
            lines.push("~ the stack (CloudFormation lists no resource change)".into());
            change += 1;
        }
        let mut h = Sha256::new();
        h.update(b"driftless-cloudformation-plan-v1\0");
        h.update(template.as_bytes());
        for l in &lines {
            h.update(b"\0");
            h.update(l.as_bytes());
        }
        let dir = &self.ctx.plans_dir;
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the plans directory {}: {e}", dir.display()))?;
        let file = dir.join(format!("{stamp}.changeset.json"));
        let kept = KeptChangeSet {
            id: id.clone(),
            kind: kind.as_str().to_string(),
            stamp,
        };
        let json = serde_json::to_string(&kept).map_err(|e| e.to_string())?;
        std::fs::write(&file, json)
            .map_err(|e| format!("cannot write the plan file {}: {e}", file.display()))?;
        // `lines` is never empty here: a made change set changes something.
        Ok(Plan {
            artifact: Some(file),
            items,
            raw: serde_json::json!({ "changes": raw }),
            ..Plan::of_lines(
                &lines,
                (add, change, destroy),
                destructive,
                hex::encode(h.finalize()),
                &self.ctx.redactor,
            )
        })
    }

    fn kept(plan: &PlanToApply) -> Result<KeptChangeSet, String> {
        let file = plan
            .artifact
            .as_ref()
            .ok_or("the approved plan names no change set")?;
        let text = std::fs::read_to_string(file).map_err(|e| {
            format!(
                "the approved plan's change set record {} cannot be read ({e}); nothing applied",
                file.display()
            )
        })?;
        serde_json::from_str(&text).map_err(|e| {
            format!(
                "the approved plan's change set record {} is not valid: {e}",
                file.display()
            )
        })
    }

    /// Execute exactly the approved change set, by its id, if AWS still
    /// offers it for execution (after the stack changed it is not).
    async fn apply_plan_inner(&self, plan: &PlanToApply) -> Result<Status, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let kept = Self::kept(plan)?;
        let c = self.client().await;
        let d = c
            .describe_change_set()
            .change_set_name(&kept.id)
            .stack_name(self.stack())
            .send()
            .await
            .map_err(|e| sdk_err("DescribeChangeSet", self.stack(), &e))?;
        let status = d.status().map(|s| s.as_str().to_string());
        let exec = d.execution_status().map(|s| s.as_str().to_string());
        if status.as_deref() != Some("CREATE_COMPLETE") || exec.as_deref() != Some("AVAILABLE") {
            return Err(format!(
                "the approved change set can no longer be executed (status {}, execution \
                 status {}{}): nothing applied; a new plan is needed",
                status.as_deref().unwrap_or("?"),
                exec.as_deref().unwrap_or("?"),
                d.status_reason()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default()
            ));
        }
        let kind = ChangeSetType::from(kept.kind.as_str());
        self.execute(&c, &kept.id, &kind, kept.stamp, Vec::new(), deadline)
            .await
    }

    /// Delete a kept change set nobody will execute.
    async fn discard_inner(&self, plan: &PlanToApply) -> Result<(), String> {
        let kept = Self::kept(plan)?;
        let c = self.client().await;
        match c
            .delete_change_set()
            .change_set_name(&kept.id)
            .stack_name(self.stack())
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.code() == Some("ChangeSetNotFound") => Ok(()),
            Err(e) => Err(sdk_err("DeleteChangeSet", self.stack(), &e)),
        }
    }

    fn no_change(&self, notes: &[String], what: &str) -> Status {
        let mut n = notes.to_vec();
        n.push(what.to_string());
        Status {
            result: if notes.is_empty() {
                ApplyResult::NoChange
            } else {
                ApplyResult::Changed
            },
            message: n.join("; "),
            output_tail: String::new(),
            digest: None,
        }
    }

    async fn destroy_inner(&self) -> Result<Status, String> {
        let deadline = Instant::now() + self.ctx.timeout;
        let c = self.client().await;
        if self.describe(&c).await?.is_none() {
            return Ok(Status {
                result: ApplyResult::NoChange,
                message: format!("stack `{}` does not exist", self.stack()),
                output_tail: String::new(),
                digest: None,
            });
        }
        c.delete_stack()
            .stack_name(self.stack())
            .send()
            .await
            .map_err(|e| sdk_err("DeleteStack", self.stack(), &e))?;
        match self.wait_stack(&c, deadline).await? {
            None => {}
            Some(s) if s == "DELETE_COMPLETE" => {}
            Some(s) => {
                return Err(format!("deleting stack `{}` ended in {s}", self.stack()));
            }
        }
        Ok(Status {
            result: ApplyResult::Changed,
            message: format!("stack `{}` deleted", self.stack()),
            output_tail: String::new(),
            digest: None,
        })
    }
}

impl Backend for CloudFormation {
    fn apply(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            self.apply_inner()
                .await
                .unwrap_or_else(|e| Status::failed(self.ctx.redactor.redact(&e)))
        })
    }

    fn plan(&self) -> Option<BoxFuture<'_, Result<Plan, String>>> {
        Some(Box::pin(async move {
            self.plan_inner()
                .await
                .map_err(|e| self.ctx.redactor.redact(&e))
        }))
    }

    fn apply_plan<'a>(&'a self, plan: &'a PlanToApply) -> Option<BoxFuture<'a, Status>> {
        Some(Box::pin(async move {
            self.apply_plan_inner(plan)
                .await
                .unwrap_or_else(|e| Status::failed(self.ctx.redactor.redact(&e)))
        }))
    }

    fn discard_plan<'a>(
        &'a self,
        plan: &'a PlanToApply,
    ) -> Option<BoxFuture<'a, Result<(), String>>> {
        Some(Box::pin(async move {
            self.discard_inner(plan)
                .await
                .map_err(|e| self.ctx.redactor.redact(&e))
        }))
    }

    fn destroy(&self) -> BoxFuture<'_, Status> {
        Box::pin(async move {
            self.destroy_inner()
                .await
                .unwrap_or_else(|e| Status::failed(self.ctx.redactor.redact(&e)))
        })
    }

    fn outputs(&self) -> BoxFuture<'_, Result<Outputs, BackendError>> {
        Box::pin(async move {
            let c = self.client().await;
            let stack = self
                .describe(&c)
                .await
                .map_err(|e| BackendError::Command(self.ctx.redactor.redact(&e)))?
                .ok_or_else(|| {
                    BackendError::Command(format!("stack `{}` does not exist", self.stack()))
                })?;
            let mut out = Outputs::new();
            let map: BTreeMap<String, String> = stack
                .outputs()
                .iter()
                .filter_map(|o| {
                    Some((
                        o.output_key()?.to_string(),
                        o.output_value().unwrap_or("").to_string(),
                    ))
                })
                .collect();
            for (k, v) in map {
                out.insert(k, serde_json::Value::String(self.ctx.redactor.redact(&v)));
            }
            Ok(out)
        })
    }
}
