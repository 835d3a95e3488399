//! The `cloudformation` backend (cargo feature `cloudformation`, on by
//! default): one stack from a template in the target's path, through the
//! AWS SDK for Rust with the default credential chain (environment,
//! profile/SSO, web identity, instance role), optionally assuming a role.
//!
//! `apply` creates a change set (`CREATE` when the stack doesn't exist,
//! else `UPDATE`) and waits for it. A change set that fails because nothing
//! changed ("The submitted information didn't contain changes", or a
//! `ValidationError` "No updates are to be performed") is deleted and is
//! `no_change`. Otherwise it is executed and the stack waited on:
//! `*_COMPLETE` is `changed`; `ROLLBACK_*`/`*_FAILED` is `failed` with the
//! failing resources' reasons from the stack events. A stack left in
//! `ROLLBACK_COMPLETE` by a failed create fails the run saying how to
//! delete it, or, with `recreate_failed_create` and made by driftless, is
//! deleted first (and the message says so) ([`failed_create`]). A stack AWS will not update — `UPDATE_ROLLBACK_FAILED`,
//! `ROLLBACK_FAILED`, `DELETE_FAILED` — fails the run before any change
//! set, saying what a person must do ([`stuck`]); `REVIEW_IN_PROGRESS` (a
//! change set made and never executed on a new stack) gets a `CREATE`
//! change set; `*_IN_PROGRESS` is waited for. Every wait is bounded by the
//! target's timeout.
//!
//! It can plan: the change set is the plan, described by logical id, type
//! and action (a removal, or a modify AWS says replaces, is destructive),
//! kept — its id in a file under the plans directory — and executed by its
//! id once approved if AWS still offers it (`AVAILABLE`); deleted when it
//! will not be applied (`discard_plan`). This module knows nothing about
//! git, triggers or the queue.

use std::collections::BTreeMap;

use serde::Deserialize;

#[cfg(not(feature = "cloudformation"))]
use super::BackendError;
use super::Context;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
/// `kind = "cloudformation"`: an AWS CloudFormation stack, through change
/// sets.
pub struct Config {
    /// The stack's name.
    pub stack_name: String,
    /// The template, relative to the target's path.
    pub template: String,
    /// Template parameters: `Name = "value"`.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// A JSON file in the target's path: `{"Key": "Value"}` or the AWS
    /// CLI's `[{"ParameterKey": …, "ParameterValue": …}]`. `parameters`
    /// override it.
    pub parameters_file: Option<String>,
    /// The capabilities the stack needs, e.g.
    /// `["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM"]`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Stack tags: `Key = "value"`.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// The AWS region. Default: the SDK's (environment, profile).
    pub region: Option<String>,
    /// Assume this role (STS) for every call.
    pub role_arn: Option<String>,
    /// A named profile instead of the default chain's choice.
    pub profile: Option<String>,
    /// Another endpoint, for AWS-compatible services and tests.
    pub endpoint_url: Option<String>,
    /// An S3 bucket the template is uploaded to (under
    /// `driftless/<stack_name>/`) and passed as a `TemplateURL`: for
    /// templates over the 51,200 bytes CloudFormation takes in a
    /// `TemplateBody` (up to 1 MB).
    pub template_bucket: Option<String>,
    /// A stack driftless created whose creation failed (AWS leaves it in
    /// ROLLBACK_COMPLETE, where it can only be deleted) is deleted and
    /// created again by the next apply. Off by default: the person is told
    /// to delete it.
    #[serde(default)]
    pub recreate_failed_create: bool,
}

/// AWS's limit on a `TemplateBody` (CloudFormation API reference,
/// CreateChangeSet: "Minimum length of 1. Maximum length of 51200").
pub const TEMPLATE_BODY_LIMIT: usize = 51_200;
/// A template passed through S3 (`TemplateURL`) may be up to 1 MB
/// (CloudFormation quotas, "Template size in an S3 object").
pub const TEMPLATE_URL_LIMIT: usize = 1_048_576;

const CAPABILITIES: &[&str] = &[
    "CAPABILITY_IAM",
    "CAPABILITY_NAMED_IAM",
    "CAPABILITY_AUTO_EXPAND",
];

impl Config {
    /// The template's size checked against what CloudFormation accepts, so a
    /// template it would refuse fails before any call, naming the limit and
    /// the key that lifts it.
    #[cfg_attr(not(feature = "cloudformation"), allow(dead_code))]
    fn check_template_size(&self, size: usize) -> Result<(), String> {
        let t = &self.template;
        if size > TEMPLATE_URL_LIMIT {
            return Err(format!(
                "template {t} is {size} bytes; CloudFormation takes at most {TEMPLATE_URL_LIMIT} bytes, even from S3"
            ));
        }
        if size > TEMPLATE_BODY_LIMIT && self.template_bucket.is_none() {
            return Err(format!(
                "template {t} is {size} bytes, over the {TEMPLATE_BODY_LIMIT} bytes CloudFormation accepts in a TemplateBody: \
                 set `template_bucket` in the target's backend to upload it to S3 and pass its TemplateURL (up to 1 MB); nothing was sent to AWS"
            ));
        }
        Ok(())
    }

    /// The parameters: the file's, then the table's on top.
    #[cfg_attr(not(feature = "cloudformation"), allow(dead_code))]
    fn parameters(&self, ctx: &Context) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        if let Some(f) = &self.parameters_file {
            let path = ctx.workdir.join(f);
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("parameters_file {f}: {e}"))?;
            let v: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| format!("parameters_file {f} is not JSON: {e}"))?;
            match v {
                serde_json::Value::Object(m) => {
                    for (k, v) in m {
                        let v = match v {
                            serde_json::Value::String(s) => s,
                            other => other.to_string(),
                        };
                        out.insert(k, v);
                    }
                }
                serde_json::Value::Array(a) => {
                    for p in a {
                        let (Some(k), Some(v)) =
                            (p["ParameterKey"].as_str(), p["ParameterValue"].as_str())
                        else {
                            return Err(format!(
                                "parameters_file {f}: every entry needs ParameterKey and ParameterValue strings"
                            ));
                        };
                        out.insert(k.to_string(), v.to_string());
                    }
                }
                _ => {
                    return Err(format!(
                        "parameters_file {f} must be a JSON object or the AWS CLI's list"
                    ));
                }
            }
        }
        out.extend(self.parameters.clone());
        Ok(out)
    }
}

impl super::Kind for Config {
    fn validate(&self) -> Vec<(String, String)> {
        let mut p: Vec<(String, String)> = Vec::new();
        if !cfg!(feature = "cloudformation") {
            p.push((
                "kind".into(),
                "this driftless was built without the `cloudformation` feature, so it cannot \
                 converge this target; rebuild with default features"
                    .into(),
            ));
        }
        let n = &self.stack_name;
        if n.is_empty()
            || n.len() > 128
            || !n.starts_with(|c: char| c.is_ascii_alphabetic())
            || !n.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            p.push((
                "stack_name".into(),
                format!(
                    "`stack_name` `{n}` must start with a letter and hold only letters, digits and '-' (at most 128)"
                ),
            ));
        }
        for (key, f) in [
            ("template", Some(&self.template)),
            ("parameters_file", self.parameters_file.as_ref()),
        ] {
            if let Some(f) = f
                && (f.is_empty() || f.starts_with('/') || f.split('/').any(|c| c == ".."))
            {
                p.push((
                    key.into(),
                    format!(
                        "`{key}` `{f}` must be a path relative to the target's path, without `..`"
                    ),
                ));
            }
        }
        for c in &self.capabilities {
            if !CAPABILITIES.contains(&c.as_str()) {
                p.push((
                    "capabilities".into(),
                    format!(
                        "`capabilities` entry `{c}` must be one of {}",
                        CAPABILITIES.join(", ")
                    ),
                ));
            }
        }
        if let Some(u) = &self.endpoint_url
            && !(u.starts_with("http://") || u.starts_with("https://"))
        {
            p.push((
                "endpoint_url".into(),
                format!("`endpoint_url` `{u}` must be an http(s) URL"),
            ));
        }
        if let Some(b) = &self.template_bucket
            && (b.len() < 3
                || b.len() > 63
                || !b
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
                || !b.starts_with(|c: char| c.is_ascii_alphanumeric()))
        {
            p.push((
                "template_bucket".into(),
                format!(
                    "`template_bucket` `{b}` must be an S3 bucket name (3-63 lowercase letters, digits, '-' and '.')"
                ),
            ));
        }
        p
    }

    fn repo_files(&self) -> Vec<(String, String)> {
        let mut v = vec![("template".to_string(), self.template.clone())];
        v.extend(
            self.parameters_file
                .iter()
                .map(|f| ("parameters_file".to_string(), f.clone())),
        );
        v
    }

    fn build(&self, ctx: Context) -> Result<Box<dyn super::Backend>, super::BackendError> {
        build(self.clone(), ctx)
    }

    fn can_plan(&self) -> bool {
        cfg!(feature = "cloudformation")
    }
}

/// How a stack status reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    InProgress,
    Succeeded,
    Failed,
}

/// `ROLLBACK_*`/`*_FAILED` (including `UPDATE_ROLLBACK_COMPLETE`) is a
/// failure; other `*_COMPLETE` a success; `*_IN_PROGRESS` not settled.
pub fn settled(status: &str) -> Settled {
    if status.ends_with("_IN_PROGRESS") {
        Settled::InProgress
    } else if status.contains("ROLLBACK") || status.ends_with("_FAILED") {
        Settled::Failed
    } else {
        Settled::Succeeded
    }
}

/// The name in a change set's ARN
/// (`arn:aws:cloudformation:<region>:<account>:changeSet/<name>/<uuid>`,
/// the CreateChangeSet `Id` the API reference describes).
pub fn change_set_name(arn: &str) -> Option<&str> {
    arn.split_once(":changeSet/")
        .and_then(|(_, rest)| rest.split('/').next())
        .filter(|n| !n.is_empty())
}

/// Whether a stack left in ROLLBACK_COMPLETE (its creation failed; AWS
/// can only delete it) may be deleted and created again: only by an
/// apply (a plan changes nothing), only with `recreate_failed_create`, and
/// only a stack driftless created (the change set it was made from,
/// `Stack.ChangeSetId`, is one of driftless's `driftless-…`). `None`: go
/// ahead; otherwise what the person must do.
pub fn failed_create(
    stack: &str,
    apply: bool,
    allowed: bool,
    made_by: Option<&str>,
) -> Option<String> {
    let state = format!(
        "stack `{stack}` is in ROLLBACK_COMPLETE: its creation failed and CloudFormation rolled \
         it back, so AWS can only delete it"
    );
    let delete = format!(
        "delete it (aws cloudformation delete-stack --stack-name {stack}) and the next tick \
         creates it"
    );
    if !apply {
        return Some(format!(
            "{state}; applying would delete and re-create it, which a plan cannot show: {delete}"
        ));
    }
    if !allowed {
        return Some(format!(
            "{state}. Nothing was changed: {delete}, or set `recreate_failed_create = true` in the \
             target's backend to let driftless delete and re-create the stacks it created"
        ));
    }
    match made_by {
        Some(name) if name.starts_with("driftless-") => None,
        other => Some(format!(
            "{state}. driftless did not create it (it was made {}), so \
             `recreate_failed_create` does not cover it: {delete}",
            match other {
                Some(n) => format!("by change set `{n}`"),
                None => "without a change set".to_string(),
            }
        )),
    }
}

/// What a person must do for a stack in a state AWS updates nothing from
/// (the CloudFormation API reference: ContinueUpdateRollback, DeleteStack's
/// `RetainResources`); `None` for any other state.
pub fn stuck(status: &str, stack: &str) -> Option<String> {
    let what = match status {
        "UPDATE_ROLLBACK_FAILED" => format!(
            "an update failed and so did its rollback: AWS accepts no change until the rollback \
             is continued. Fix what the stack's events say failed, then run `aws cloudformation \
             continue-update-rollback --stack-name {stack}` (with `--resources-to-skip` for \
             resources that cannot roll back); the next run applies again"
        ),
        "ROLLBACK_FAILED" => format!(
            "a create failed and so did its rollback: AWS can only delete the stack. Run `aws \
             cloudformation delete-stack --stack-name {stack}` (with `--retain-resources` for \
             those it cannot delete); the next run creates it again"
        ),
        "DELETE_FAILED" => format!(
            "a delete failed: AWS can only delete it again. Fix what the stack's events say \
             failed, or keep those resources: `aws cloudformation delete-stack --stack-name \
             {stack} --retain-resources <logical ids>`; the next run creates it again"
        ),
        _ => return None,
    };
    Some(format!(
        "stack `{stack}` is in {status} — {what}; nothing was changed"
    ))
}

/// A change set failure (or CreateChangeSet error) that only means "no
/// change".
pub fn means_no_change(reason: &str) -> bool {
    reason.contains("didn't contain changes") || reason.contains("No updates are to be performed")
}

/// AWS's "Requires capabilities : [CAPABILITY_IAM]" (an
/// InsufficientCapabilitiesException, or a change set's status reason),
/// said with the key that fixes it.
pub fn capabilities_message(aws: &str) -> Option<String> {
    let i = aws.find("Requires capabilities")?;
    let needed: Vec<&str> = aws[i..]
        .split(|c: char| !(c.is_ascii_uppercase() || c == '_'))
        .filter(|w| w.starts_with("CAPABILITY_"))
        .collect();
    let list = needed
        .iter()
        .map(|c| format!("\"{c}\""))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "CloudFormation refused the template: it needs {} ({}); acknowledge it with `capabilities = [{list}]` in the target's backend",
        if needed.len() == 1 {
            format!("the capability {}", needed[0])
        } else {
            format!("the capabilities {}", needed.join(", "))
        },
        aws[i..].trim()
    ))
}

#[cfg(feature = "cloudformation")]
pub use aws::build;

/// A template's `Resources`, JSON or YAML, as JSON: the plan document's
/// new properties of each resource. YAML's short forms become the long
/// ones CloudFormation documents (`!Ref x` → `{"Ref": "x"}`, `!GetAtt a.b`
/// → `{"Fn::GetAtt": ["a", "b"]}`, `!Condition c` → `{"Condition": "c"}`,
/// any other `!Name v` → `{"Fn::Name": v}`; AWS's "Intrinsic function
/// reference"). A template neither reads as is `Null`: the change set,
/// which AWS read, still says what changes.
#[cfg_attr(not(feature = "cloudformation"), allow(dead_code))]
fn template_resources(text: &str) -> serde_json::Value {
    if let Ok(t) = serde_json::from_str::<serde_json::Value>(text) {
        return t["Resources"].clone();
    }
    match serde_yaml::from_str::<serde_yaml::Value>(text) {
        Ok(t) => long_form(t)["Resources"].clone(),
        Err(_) => serde_json::Value::Null,
    }
}

/// One YAML node of a template as JSON, its tags in their long form.
#[cfg_attr(not(feature = "cloudformation"), allow(dead_code))]
fn long_form(v: serde_yaml::Value) -> serde_json::Value {
    use serde_json::Value as J;
    use serde_yaml::Value as Y;
    match v {
        Y::Null => J::Null,
        Y::Bool(b) => J::Bool(b),
        Y::Number(n) => n
            .as_i64()
            .map(J::from)
            .or_else(|| n.as_u64().map(J::from))
            .or_else(|| n.as_f64().map(J::from))
            .unwrap_or(J::Null),
        Y::String(s) => J::String(s),
        Y::Sequence(items) => J::Array(items.into_iter().map(long_form).collect()),
        Y::Mapping(m) => J::Object(
            m.into_iter()
                .map(|(k, v)| {
                    let key = match long_form(k) {
                        J::String(s) => s,
                        other => other.to_string(),
                    };
                    (key, long_form(v))
                })
                .collect(),
        ),
        Y::Tagged(t) => {
            let name = t.tag.to_string();
            let name = name.trim_start_matches('!');
            let value = long_form(t.value);
            let (key, value) = match (name, value) {
                ("Ref" | "Condition", v) => (name.to_string(), v),
                ("GetAtt", J::String(s)) => {
                    let parts = match s.split_once('.') {
                        Some((res, attr)) => vec![J::from(res), J::from(attr)],
                        None => vec![J::from(s)],
                    };
                    ("Fn::GetAtt".to_string(), J::Array(parts))
                }
                (other, v) => (format!("Fn::{other}"), v),
            };
            J::Object([(key, value)].into_iter().collect())
        }
    }
}

/// Without the SDK compiled in, a cloudformation target is refused.
#[cfg(not(feature = "cloudformation"))]
pub fn build(_cfg: Config, _ctx: Context) -> Result<Box<dyn super::Backend>, BackendError> {
    Err(BackendError::Config(
        "this driftless was built without the `cloudformation` feature; rebuild with default features".into(),
    ))
}

#[cfg(feature = "cloudformation")]
mod aws;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_yaml_template_gives_its_properties_in_the_long_form() {
        // YAML wants its indentation: a raw string, not continued lines.
        let yaml = r#"AWSTemplateFormatVersion: '2010-09-09'
Resources:
  Site:
    Type: AWS::S3::Bucket
    Properties:
      BucketName: !Sub '${AWS::StackName}-site'
      AccessControl: PublicRead
      Tags:
        - Key: size
          Value: 3
  Param:
    Type: AWS::SSM::Parameter
    Properties:
      Value: !GetAtt Site.Arn
      Name: !Ref Name
      Other: !Join [',', [a, !Ref B]]
"#;
        let r = template_resources(yaml);
        assert_eq!(
            r["Site"]["Properties"],
            serde_json::json!({
                "BucketName": {"Fn::Sub": "${AWS::StackName}-site"},
                "AccessControl": "PublicRead",
                "Tags": [{"Key": "size", "Value": 3}],
            })
        );
        assert_eq!(
            r["Param"]["Properties"],
            serde_json::json!({
                "Value": {"Fn::GetAtt": ["Site", "Arn"]},
                "Name": {"Ref": "Name"},
                "Other": {"Fn::Join": [",", ["a", {"Ref": "B"}]]},
            })
        );
        // JSON as it is; neither: nothing.
        assert_eq!(
            template_resources(r#"{"Resources": {"A": {"Type": "T"}}}"#)["A"]["Type"],
            "T"
        );
        assert_eq!(template_resources("a: [\n"), serde_json::Value::Null);
    }

    #[test]
    fn statuses_settle_the_right_way() {
        assert_eq!(settled("CREATE_COMPLETE"), Settled::Succeeded);
        assert_eq!(settled("UPDATE_COMPLETE"), Settled::Succeeded);
        assert_eq!(settled("IMPORT_COMPLETE"), Settled::Succeeded);
        assert_eq!(settled("UPDATE_ROLLBACK_COMPLETE"), Settled::Failed);
        assert_eq!(settled("ROLLBACK_COMPLETE"), Settled::Failed);
        assert_eq!(settled("CREATE_FAILED"), Settled::Failed);
        assert_eq!(settled("DELETE_FAILED"), Settled::Failed);
        assert_eq!(settled("UPDATE_IN_PROGRESS"), Settled::InProgress);
        assert_eq!(
            settled("UPDATE_COMPLETE_CLEANUP_IN_PROGRESS"),
            Settled::InProgress
        );
        assert!(means_no_change(
            "The submitted information didn't contain changes. Submit different information to create a change set."
        ));
        assert!(means_no_change("No updates are to be performed."));
        assert!(!means_no_change("Template format error"));
    }

    #[test]
    fn a_failed_create_is_recreated_only_when_allowed_and_made_by_driftless() {
        let arn = "arn:aws:cloudformation:us-east-1:1:changeSet/driftless-abc1234-17/9f2e";
        assert_eq!(change_set_name(arn), Some("driftless-abc1234-17"));
        assert_eq!(change_set_name("arn:aws:cloudformation:x"), None);
        let ours = change_set_name(arn);
        assert_eq!(failed_create("s", true, true, ours), None);
        for (apply, allowed, made_by, want) in [
            (false, true, ours, "a plan cannot show"),
            (true, false, ours, "recreate_failed_create = true"),
            (true, true, None, "without a change set"),
            (true, true, Some("theirs"), "by change set `theirs`"),
        ] {
            let why = failed_create("s", apply, allowed, made_by).expect(want);
            assert!(
                why.contains(want) && why.contains("delete-stack --stack-name s"),
                "{why}"
            );
        }
    }
}

#[cfg(all(test, not(feature = "cloudformation")))]
mod without_feature {
    use super::*;

    #[test]
    fn a_cloudformation_target_is_refused_with_a_reason() {
        let cfg: Config = serde_json::from_value(serde_json::json!({
            "stack_name": "web", "template": "t.json"
        }))
        .expect("config");
        let ctx = Context {
            name: "web".into(),
            workdir: std::path::PathBuf::from("/"),
            checkout: std::path::PathBuf::from("/"),
            source_digest: String::new(),
            last_digest: None,
            timeout: std::time::Duration::from_secs(1),
            redactor: crate::redact::Redactor::new(),
            commit: None,
            ledger: None,
            plans_dir: std::path::PathBuf::from("/nonexistent"),
            retry: false,
            preview: None,
            inputs: Default::default(),
            confirm_within: None,
        };
        let Err(e) = build(cfg, ctx) else {
            panic!("built without the SDK")
        };
        assert!(
            e.to_string()
                .contains("without the `cloudformation` feature"),
            "{e}"
        );
    }
}
