//! The cloudformation backend against moto's server (the AWS CloudFormation
//! API on 127.0.0.1), through the AWS SDK for Rust and its default
//! credential chain (the environment, here). moto differs from AWS in a few
//! places; each test says where.

use crate::common::*;
use serde_json::{Value, json};

const SECRET_KEY: &str = "canary-aws-secret-key-5e0c27";

fn template(with_param: bool) -> String {
    let value = if with_param {
        json!({ "Ref": "Greeting" })
    } else {
        json!("fixed")
    };
    let mut t = json!({
        "Resources": {
            "Greeting": {
                "Type": "AWS::SSM::Parameter",
                "Properties": { "Name": "/site/greeting", "Type": "String", "Value": value }
            }
        },
        "Outputs": { "ParameterName": { "Value": { "Ref": "Greeting" } } }
    });
    if with_param {
        t["Parameters"] = json!({ "Greeting": { "Type": "String" } });
    }
    serde_json::to_string_pretty(&t).expect("json")
}

struct Fx {
    _root: tempfile::TempDir,
    remote: Remote,
    moto: Moto,
    s: Setup,
}

fn fixture(backend: &str, timeout: &str) -> Fx {
    let root = tempfile::tempdir().expect("tempdir");
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("cfn/stack.json", &template(true)),
            ("cfn/params.json", "{\"Greeting\": \"hello\"}"),
        ],
        "stack",
    );
    let moto = Moto::start(root.path());
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"site\"\nrepo = \"{}\"\npath = \"cfn\"\ntimeout = \"{timeout}\"\n\
         [targets.backend]\nkind = \"cloudformation\"\nstack_name = \"site\"\ntemplate = \"stack.json\"\n\
         region = \"us-east-1\"\nendpoint_url = \"{}\"\n{backend}\n",
        remote.url(),
        moto.endpoint(),
    ));
    Fx {
        _root: root,
        remote,
        moto,
        s,
    }
}

impl Fx {
    fn run(&self, args: &[&str]) -> std::process::Output {
        output_within(
            std::process::Command::new(bin())
                .args(["--config", self.s.config.to_str().expect("utf8")])
                .args(args)
                .env("AWS_ACCESS_KEY_ID", "AKIDTESTING")
                .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env_remove("AWS_PROFILE")
                .env("RUST_LOG", "debug"),
            std::time::Duration::from_secs(300),
        )
    }

    fn tick(&self) -> (Option<i32>, String) {
        let out = self.run(&["tick", "site"]);
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    }

    /// The change set named in each `action` call moto received, in order.
    fn calls(&self, action: &str) -> Vec<String> {
        self.moto
            .log()
            .into_iter()
            .filter(|r| r["action"] == action)
            .map(|r| r["change_set_name"].as_str().unwrap_or("").to_string())
            .collect()
    }

    fn status(&self) -> (String, String) {
        let st = self.s.target_status("site");
        (
            st["last_result"].as_str().unwrap_or("").to_string(),
            st["last_message"].as_str().unwrap_or("").to_string(),
        )
    }
}

#[test]
fn cloudformation_lifecycle() {
    let f = fixture(
        "parameters_file = \"params.json\"\ntags = { team = \"web\" }",
        "2m",
    );
    let mut logs = String::new();
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed", "{msg}");
    assert!(msg.contains("created CREATE_COMPLETE"), "{msg}");

    // Same template, same parameters: no change. (moto refuses it at
    // CreateChangeSet with "No updates are to be performed"; AWS usually
    // creates the change set and fails it with "The submitted information
    // didn't contain changes". Both are handled.)
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status().0, "no_change", "{}", f.status().1);

    // A parameter change: changed.
    f.remote.commit(
        &[("cfn/params.json", "{\"Greeting\": \"bonjour\"}")],
        "french",
    );
    let (code, out) = f.tick();
    logs += &out;
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed", "{msg}");
    assert!(msg.contains("updated UPDATE_COMPLETE"), "{msg}");

    let out = f.run(&["destroy", "site", "--yes"]);
    logs += &text(&out.stdout);
    logs += &text(&out.stderr);
    assert!(out.status.success(), "{logs}");
    assert!(f.status().1.contains("deleted"), "{}", f.status().1);
    let out = f.run(&["outputs", "site", "--json"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("does not exist"));
    assert!(!logs.contains(SECRET_KEY), "the AWS secret key in the logs");
}

/// The bucket template, applied by the fixture's target `site` (stack
/// `site`), and a second config whose target `site` owns stack `site-two`
/// with the same template.
fn two_stacks_one_bucket(f: &Fx) -> std::path::PathBuf {
    // Two stacks cannot own one bucket name.
    let bucket = json!({ "Resources": { "B": { "Type": "AWS::S3::Bucket",
        "Properties": { "BucketName": "driftless-shared-bucket" } } } })
    .to_string();
    f.remote.commit(&[("cfn/stack.json", &bucket)], "bucket");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let s2 = f.s.config.parent().expect("dir").join("second.toml");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &s2,
        cfg.replace("stack_name = \"site\"", "stack_name = \"site-two\""),
    )
    .expect("write");
    s2
}

fn tick_with(config: &std::path::Path) -> std::process::Output {
    output_within(
        std::process::Command::new(bin())
            .args(["--config", config.to_str().expect("utf8"), "tick", "site"])
            .env("AWS_ACCESS_KEY_ID", "AKIDTESTING")
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_PROFILE"),
        std::time::Duration::from_secs(300),
    )
}

#[test]
fn an_execute_change_set_refused_by_the_api_fails_with_its_error() {
    // moto runs the change set inside ExecuteChangeSet and answers the
    // resource's error there: the run fails naming the call, the stack and
    // the API's code and message.
    let f = fixture("", "2m");
    let second = two_stacks_one_bucket(&f);
    let out = tick_with(&second);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    assert_eq!(
        msg,
        "CloudFormation ExecuteChangeSet for stack `site-two` failed: BucketAlreadyExists: \
         The requested bucket name is not available. The bucket namespace is shared by all users \
         of the system. Please select a different name and try again"
    );
}

#[test]
fn a_create_that_fails_and_rolls_back_fails_with_the_resources_reason() {
    // AWS accepts ExecuteChangeSet, fails the resource, rolls the new
    // stack back and tells why only in the stack events (scripted here by
    // the proxy, as moto cannot).
    let f = fixture("", "2m");
    let second = two_stacks_one_bucket(&f);
    let stack = "AWS::CloudFormation::Stack";
    f.moto.control(
        "execution",
        json!({
            "stack": "site-two",
            "statuses": ["CREATE_IN_PROGRESS", "ROLLBACK_IN_PROGRESS", "ROLLBACK_COMPLETE"],
            "steps": [
                [["site-two", stack, "CREATE_IN_PROGRESS", "User Initiated"]],
                [["B", "AWS::S3::Bucket", "CREATE_IN_PROGRESS", null],
                 ["B", "AWS::S3::Bucket", "CREATE_FAILED", "driftless-shared-bucket already exists"]],
                [["site-two", stack, "ROLLBACK_IN_PROGRESS",
                  "The following resource(s) failed to create: [B]. Rollback requested by user."],
                 ["B", "AWS::S3::Bucket", "DELETE_COMPLETE", null],
                 ["site-two", stack, "ROLLBACK_COMPLETE", null]]
            ]
        }),
    );
    let out = tick_with(&second);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    assert_eq!(
        msg,
        "stack `site-two` ended in ROLLBACK_COMPLETE: B CREATE_FAILED: driftless-shared-bucket already exists"
    );
    assert!(!msg.contains(SECRET_KEY));
}

/// Make stack `site` with CreateStack (no change set), as someone outside
/// driftless would.
fn create_stack_outside_driftless(f: &Fx, template: &str) {
    let made = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import boto3, sys\n\
             c = boto3.client('cloudformation', endpoint_url=sys.argv[1], region_name='us-east-1',\n\
                              aws_access_key_id='AKIDTESTING', aws_secret_access_key='x')\n\
             c.create_stack(StackName='site', TemplateBody=sys.argv[2])",
        )
        .arg(f.moto.endpoint())
        .arg(template)
        .output()
        .expect("python3 boto3");
    assert!(made.status.success(), "{}", text(&made.stderr));
}

#[test]
fn outputs_are_the_stacks_output_values_by_key() {
    // moto computes Outputs only for a stack made by CreateStack (a stack
    // made through change sets keeps the empty template it was created
    // with: moto/cloudformation/models.py, create_change_set), so the
    // stack is made that way, as one adopted from outside driftless.
    let f = fixture("", "2m");
    let t = json!({
        "Resources": { "Greeting": { "Type": "AWS::SSM::Parameter",
            "Properties": { "Name": "/site/greeting", "Type": "String", "Value": "fixed" } } },
        "Outputs": {
            "ParameterName": { "Value": { "Ref": "Greeting" }, "Description": "the parameter" },
            "Owner": { "Value": "team-web" }
        }
    })
    .to_string();
    f.remote.commit(&[("cfn/stack.json", &t)], "outputs");
    create_stack_outside_driftless(&f, &t);
    // The same template: nothing to do.
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status().0, "no_change", "{}", f.status().1);
    let out = f.run(&["outputs", "site", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let o: Value = serde_json::from_slice(&out.stdout).expect("outputs JSON");
    assert_eq!(
        o,
        json!({ "ParameterName": "/site/greeting", "Owner": "team-web" })
    );
}

/// The proxy's DeleteStack calls so far.
fn deletes(f: &Fx) -> usize {
    f.moto
        .log()
        .iter()
        .filter(|r| r["action"] == "DeleteStack")
        .count()
}

#[test]
fn a_stack_left_in_rollback_complete_is_named_and_left_alone_by_default() {
    let f = fixture("parameters_file = \"params.json\"", "2m");
    assert_eq!(f.tick().0, Some(0));
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"again\"}")], "again");
    // As AWS leaves a stack whose create failed.
    f.moto.fake_status("site", "ROLLBACK_COMPLETE", 100);
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    for want in [
        "ROLLBACK_COMPLETE",
        "can only delete it",
        "aws cloudformation delete-stack --stack-name site",
        "recreate_failed_create = true",
    ] {
        assert!(msg.contains(want), "{want:?} missing: {msg}");
    }
    assert_eq!(deletes(&f), 0, "deleted without being allowed to");
}

#[test]
fn recreate_failed_create_deletes_and_creates_again_a_stack_driftless_created() {
    let f = fixture(
        "parameters_file = \"params.json\"\nrecreate_failed_create = true",
        "2m",
    );
    assert_eq!(f.tick().0, Some(0));
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"again\"}")], "again");
    f.moto.fake_status("site", "ROLLBACK_COMPLETE", 1);
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed");
    assert!(
        msg.contains("left in ROLLBACK_COMPLETE")
            && msg.contains("deleted")
            && msg.contains("created CREATE_COMPLETE"),
        "{msg}"
    );
    assert_eq!(deletes(&f), 1);
}

#[test]
fn recreate_failed_create_never_deletes_a_stack_driftless_did_not_create() {
    let f = fixture("recreate_failed_create = true", "2m");
    // Made outside driftless, with CreateStack (no change set).
    create_stack_outside_driftless(&f, &template(false));
    f.moto.fake_status("site", "ROLLBACK_COMPLETE", 100);
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let msg = f.status().1;
    assert!(
        msg.contains("driftless did not create it") && msg.contains("without a change set"),
        "{msg}"
    );
    assert_eq!(deletes(&f), 0);
}

#[test]
fn a_stack_that_never_settles_times_out_naming_its_state() {
    let f = fixture("parameters_file = \"params.json\"", "4s");
    assert_eq!(f.tick().0, Some(0));
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"slow\"}")], "slow");
    f.moto.fake_status("site", "UPDATE_IN_PROGRESS", 1000);
    let started = std::time::Instant::now();
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    assert!(
        msg.contains("timed out after 4s") && msg.contains("UPDATE_IN_PROGRESS"),
        "{msg}"
    );
}

#[test]
fn missing_credentials_are_named() {
    let f = fixture("", "1m");
    let out = output_within(
        std::process::Command::new(bin())
            .args([
                "--config",
                f.s.config.to_str().expect("utf8"),
                "tick",
                "site",
            ])
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/nonexistent")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        std::time::Duration::from_secs(300),
    );
    assert_eq!(out.status.code(), Some(1));
    let (_, msg) = f.status();
    assert!(msg.contains("credentials"), "{msg}");
}

/// A template over CloudFormation's 51,200-byte TemplateBody limit.
fn big_template() -> String {
    let mut t: Value = serde_json::from_str(&template(true)).expect("json");
    t["Metadata"] = json!({ "Padding": "x".repeat(60_000) });
    serde_json::to_string(&t).expect("json")
}

#[test]
fn a_template_over_the_body_limit_fails_before_any_call_and_goes_through_s3_with_a_bucket() {
    let f = fixture("parameters_file = \"params.json\"", "2m");
    f.remote
        .commit(&[("cfn/stack.json", &big_template())], "a big template");
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (_, msg) = f.status();
    assert!(
        msg.contains("over the 51200 bytes")
            && msg.contains("`template_bucket`")
            && msg.contains("nothing was sent to AWS"),
        "{msg}"
    );
    let calls: Vec<Value> = f
        .moto
        .log()
        .into_iter()
        .filter(|r| r["action"] != "")
        .collect();
    assert!(calls.is_empty(), "called AWS: {calls:#?}");

    // With a bucket: uploaded, then passed as a TemplateURL.
    f.moto.create_bucket("driftless-templates");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        cfg.replace(
            "parameters_file = \"params.json\"",
            "parameters_file = \"params.json\"\ntemplate_bucket = \"driftless-templates\"",
        ),
    )
    .expect("config");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(
        (result.as_str(), msg.as_str()),
        ("changed", "created CREATE_COMPLETE")
    );
    let create = f
        .moto
        .log()
        .into_iter()
        .find(|r| r["action"] == "CreateChangeSet")
        .expect("a CreateChangeSet");
    assert_eq!(create["has_template_body"], false, "{create}");
    let url = create["template_url"]
        .as_str()
        .expect("a TemplateURL")
        .to_string();
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        big_template().as_bytes(),
    ));
    assert_eq!(
        url,
        format!(
            "https://driftless-templates.s3.us-east-1.amazonaws.com/driftless/site/{digest}.json"
        )
    );
    // The object was put where the URL says, whole (moto then built the
    // stack from it: CREATE_COMPLETE above).
    let put = f
        .moto
        .log()
        .into_iter()
        .find(|r| r["method"] == "PUT")
        .expect("a PutObject");
    assert_eq!(
        put["path"],
        format!("/driftless-templates/driftless/site/{digest}.json")
    );
    assert_eq!(put["decoded_length"], big_template().len());
}

#[test]
fn a_stale_status_after_the_execute_is_not_read_as_this_runs_outcome() {
    let f = fixture("parameters_file = \"params.json\"", "1m");
    assert_eq!(f.tick().0, Some(0));
    // Right after ExecuteChangeSet, DescribeStacks still shows the previous
    // operation's end (a rolled-back update); this update succeeds.
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"hi\"}")], "hi");
    f.moto.control(
        "status",
        json!({ "stack": "site", "status": "UPDATE_ROLLBACK_COMPLETE", "times": 1, "after_execute": true }),
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        f.status(),
        ("changed".to_string(), "updated UPDATE_COMPLETE".to_string())
    );

    // The other way: DescribeStacks still says the previous UPDATE_COMPLETE
    // while this update fails and rolls back. AWS's clock is an hour behind
    // this machine's, and an older failure of another operation is on
    // record: the reasons are this operation's, by AWS's event order.
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"salut\"}")], "salut");
    let stack = "AWS::CloudFormation::Stack";
    f.moto.control(
        "execution",
        json!({
            "stack": "site",
            "clock_skew": -3600,
            "statuses": ["UPDATE_COMPLETE", "UPDATE_ROLLBACK_IN_PROGRESS", "UPDATE_ROLLBACK_COMPLETE"],
            "steps": [
                [["site", stack, "UPDATE_IN_PROGRESS", "User Initiated"]],
                [["Greeting", "AWS::SSM::Parameter", "UPDATE_IN_PROGRESS", null],
                 ["Greeting", "AWS::SSM::Parameter", "UPDATE_FAILED", "Parameter value is not allowed here"]],
                [["site", stack, "UPDATE_ROLLBACK_IN_PROGRESS", "The following resource(s) failed to update: [Greeting]."],
                 ["site", stack, "UPDATE_ROLLBACK_COMPLETE", null]]
            ]
        }),
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "failed");
    assert_eq!(
        msg,
        "stack `site` ended in UPDATE_ROLLBACK_COMPLETE: Greeting UPDATE_FAILED: Parameter value is not allowed here"
    );
    // ExecuteChangeSet carried a client request token, which AWS puts on
    // the operation's events.
    let exec = f
        .moto
        .log()
        .into_iter()
        .rev()
        .find(|r| r["action"] == "ExecuteChangeSet")
        .expect("an ExecuteChangeSet");
    assert!(
        exec["client_request_token"]
            .as_str()
            .unwrap_or("")
            .starts_with("driftless-"),
        "{exec}"
    );
}

#[test]
fn an_execution_that_never_ends_times_out_naming_the_state() {
    let f = fixture("parameters_file = \"params.json\"", "4s");
    assert_eq!(f.tick().0, Some(0));
    f.remote
        .commit(&[("cfn/params.json", "{\"Greeting\": \"slow\"}")], "slow");
    f.moto.control(
        "execution",
        json!({ "stack": "site", "statuses": ["UPDATE_COMPLETE"],
                "steps": [[["site", "AWS::CloudFormation::Stack", "UPDATE_IN_PROGRESS", "User Initiated"]]] }),
    );
    let started = std::time::Instant::now();
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    let (_, msg) = f.status();
    assert_eq!(
        msg,
        "timed out after 4s waiting for stack `site`; it was in state UPDATE_IN_PROGRESS"
    );
}

#[test]
fn iam_resources_without_capabilities_name_the_key_and_the_capability() {
    let f = fixture("", "1m");
    let role = json!({ "Resources": { "Role": { "Type": "AWS::IAM::Role", "Properties": {
        "AssumeRolePolicyDocument": { "Version": "2012-10-17", "Statement": [] } } } } });
    f.remote
        .commit(&[("cfn/stack.json", &role.to_string())], "a role");
    let (code, out) = f.tick();
    assert_eq!(code, Some(1), "{out}");
    let (_, msg) = f.status();
    assert!(
        msg.contains("needs the capability CAPABILITY_IAM")
            && msg.contains("`capabilities = [\"CAPABILITY_IAM\"]`"),
        "{msg}"
    );
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        cfg.replace(
            "region = \"us-east-1\"",
            "region = \"us-east-1\"\ncapabilities = [\"CAPABILITY_IAM\"]",
        ),
    )
    .expect("config");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(f.status().1, "created CREATE_COMPLETE");
}

/// `policy = "approval"` on a CloudFormation target: the change set is the
/// plan (its changes by logical id, type and action), kept and executed by
/// its id only after a person approves it; nothing is executed before; a
/// newer commit supersedes a waiting plan and its change set is deleted,
/// as is a rejected one's. A renamed parameter is replaced (AWS's
/// `Replacement`, which tests/cfn_proxy.py adds where moto has none): the
/// plan says `-/+` and is destructive.
#[test]
fn an_approved_change_set_is_executed_by_its_id_and_others_are_deleted() {
    const OPS: &str = "ops-token-cfn-41c9";
    let f = fixture("parameters_file = \"params.json\"", "2m");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    let cfg = cfg.replacen(
        "[targets.backend]",
        "policy = \"approval\"\ninterval = \"1h\"\n[targets.backend]",
        1,
    ) + &token_table("ops", OPS, &["approve:site", "read"]);
    std::fs::write(&f.s.config, cfg).expect("config");
    let intake = Intake::start(&f.s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };
    let calls = |action: &str| f.calls(action);
    let plan_files = || f.s.plan_files("site").len();

    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("waits for approval: 1 to add, 0 to change, 0 to destroy"),
        "{out}"
    );
    assert!(
        calls("ExecuteChangeSet").is_empty(),
        "executed before approval"
    );
    let p1 = who.pending();
    assert_eq!(
        (&p1[0]["backend"], &p1[0]["diff"]),
        (
            &"cloudformation".into(),
            &"+ Greeting (AWS::SSM::Parameter)".into()
        ),
        "{p1:?}"
    );
    assert_eq!(plan_files(), 1);
    who.approve(&p1[0]);
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("created CREATE_COMPLETE"), "{out}");
    let created = calls("CreateChangeSet");
    let executed = calls("ExecuteChangeSet");
    assert_eq!(executed.len(), 1, "{executed:?}");
    assert!(
        executed[0].starts_with("arn:") && executed[0].contains(&format!("/{}/", created[0])),
        "executed {executed:?}, created {created:?}"
    );
    assert_eq!(plan_files(), 0);

    // A plan superseded by a newer commit, then a rejected one: both
    // change sets deleted, neither executed.
    // (A template change: moto finds changes in resources only, where AWS
    // would also list a parameter's effect as a Modify.)
    let renamed = |to: &str| template(true).replace("/site/greeting", to);
    f.remote
        .commit(&[("cfn/stack.json", &renamed("/site/fr"))], "fr");
    f.tick();
    let p2 = who.pending();
    assert_eq!(
        (&p2[0]["diff"], &p2[0]["destructive"]),
        (
            &"-/+ Greeting (AWS::SSM::Parameter, replacement)".into(),
            &true.into()
        ),
        "{p2:?}"
    );
    let p3 = who.refuses_stale_and_supersedes(
        || {
            f.remote
                .commit(&[("cfn/stack.json", &renamed("/site/es"))], "es");
        },
        || {
            f.tick();
        },
    );
    assert_eq!(
        calls("DeleteChangeSet").len(),
        1,
        "the superseded change set"
    );
    who.reject(p3["id"].as_i64().expect("id"));
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("was rejected by token:ops"), "{out}");
    assert_eq!(calls("DeleteChangeSet").len(), 2, "the rejected change set");
    assert_eq!(calls("ExecuteChangeSet").len(), 1);
    assert_eq!(plan_files(), 0);
    let out = f.run(&["outputs", "site", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    who.assert_plans_keep_out(&f.s, SECRET_KEY);
}

/// `policy = "detect"` on a CloudFormation target: every tick makes a
/// change set, records its changes as the target's drift and deletes it;
/// none is ever executed.
#[test]
fn a_cloudformation_detect_target_records_its_change_set_and_executes_none() {
    let f = fixture("parameters_file = \"params.json\"", "2m");
    f.s.target_keys("policy = \"detect\"\ninterval = \"1h\"");
    for _ in 0..2 {
        let (code, out) = f.tick();
        assert_eq!(code, Some(0), "{out}");
    }
    assert_detected(&f.s, "site", "+ Greeting (AWS::SSM::Parameter)");
    let count = |action: &str| {
        f.moto
            .log()
            .into_iter()
            .filter(|r| r["action"] == action)
            .count()
    };
    assert_eq!(count("ExecuteChangeSet"), 0, "detect executed a change set");
    assert_eq!(
        (count("CreateChangeSet"), count("DeleteChangeSet")),
        (2, 2),
        "every change set made to look is deleted"
    );
}

/// A pull request's preview of a CloudFormation target: a change set is
/// created for the pull request's template, described for the comment and
/// deleted; none is executed, the stack stays as `main` made it, and the
/// AWS secret key is in no comment.
#[test]
fn a_pull_request_preview_deletes_its_change_set_and_executes_none() {
    const HOOK: &str = "cfn-preview-hook-secret";
    let f = fixture("parameters_file = \"params.json\"", "2m");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let forge = ForgeStandin::start(f.s.path());
    let secret_file = f.s.path().join("hook-secret");
    std::fs::write(&secret_file, HOOK).expect("write");
    f.s.edit_config(|c| {
        let receiver = format!(
            "[[receivers]]\nname = \"github\"\nforge = \"github\"\nsecret_file = {}\n\n[[targets]]",
            toml_str(&secret_file.display().to_string()),
        );
        c.replacen("[[targets]]", &receiver, 1).replacen(
            "[targets.backend]",
            "interval = \"1h\"\nforge = \"f\"\nforge_repo = \"me/infra\"\npreviews = true\n[targets.backend]",
            1,
        ) + &forge.table("f", "github")
    });
    let calls = |action: &str| f.calls(action);
    let (created, executed) = (calls("CreateChangeSet").len(), calls("ExecuteChangeSet"));
    let d = Daemon::start_with_env(
        &f.s.config,
        f.s.path(),
        &[
            ("RUST_LOG", "info"),
            ("AWS_ACCESS_KEY_ID", "AKIDTESTING"),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
    );
    let head = f.remote.pull_request(
        "refs/pull/9/head",
        &[(
            "cfn/stack.json",
            &template(true).replace("/site/greeting", "/site/fr"),
        )],
        "fr",
    );
    let (body, event) = pull_body("github", "opened", &f.remote.url(), 9, &head, false);
    let r = deliver_event(d.port, "github", event, HOOK, &body, "cfn-pr-9");
    assert_eq!(r.status, 202, "{}", r.body);
    wait_for(
        std::time::Duration::from_secs(120),
        "the preview comment",
        || !forge.comments().is_empty(),
    );
    let comment = forge.comments()[0]["body"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        comment.contains("-/+ Greeting (AWS::SSM::Parameter, replacement)"),
        "{comment}"
    );
    let made = calls("CreateChangeSet");
    assert_eq!(made.len(), created + 1, "{made:?}");
    let preview_set = made.last().expect("the preview's change set").clone();
    assert!(
        calls("DeleteChangeSet")
            .iter()
            .any(|d| d == &preview_set || d.contains(&format!("/{preview_set}/"))),
        "the preview's change set {preview_set} was not deleted: {:?}",
        calls("DeleteChangeSet")
    );
    assert_eq!(
        calls("ExecuteChangeSet"),
        executed,
        "a preview executed a change set"
    );
    d.stop();
    assert!(!comment.contains(SECRET_KEY));
    assert_eq!(f.s.history("site").len(), 1);
}

/// A stack AWS will not update fails the run before any change set, in
/// words that say what a person must do (AWS itself answers CreateChangeSet
/// with a bare ValidationError): UPDATE_ROLLBACK_FAILED needs its rollback
/// continued; ROLLBACK_FAILED and DELETE_FAILED can only be deleted.
#[test]
fn a_stack_aws_will_not_update_is_named_with_what_to_do() {
    let f = fixture("parameters_file = \"params.json\"", "2m");
    assert_eq!(f.tick().0, Some(0));
    for (n, (state, says)) in [
        (
            "UPDATE_ROLLBACK_FAILED",
            "continue-update-rollback --stack-name site",
        ),
        ("ROLLBACK_FAILED", "delete-stack --stack-name site"),
        ("DELETE_FAILED", "--retain-resources"),
    ]
    .into_iter()
    .enumerate()
    {
        f.remote.commit(
            &[(
                "cfn/params.json",
                &format!("{{\"Greeting\": \"stuck-{n}\"}}"),
            )],
            state,
        );
        f.moto.fake_status("site", state, 1000);
        let (code, out) = f.tick();
        assert_eq!(code, Some(1), "{state}: {out}");
        let (result, msg) = f.status();
        assert_eq!(result, "failed", "{state}");
        assert!(
            msg.contains(&format!("stack `site` is in {state}"))
                && msg.contains(says)
                && msg.contains("nothing was changed"),
            "{state}: {msg}"
        );
        assert!(!msg.contains("ValidationError"), "{state}: {msg}");
        let created = f
            .moto
            .log()
            .iter()
            .filter(|r| r["action"] == "CreateChangeSet")
            .count();
        assert_eq!(created, 1, "{state}: a change set was asked for");
    }
}

/// Policies on a change set: "only these resource types" and "warn on a
/// public S3 bucket", the bucket's properties read from the submitted
/// template (moto's change sets, like AWS's, carry no property values).
#[test]
fn policies_judge_a_change_set_before_it_is_executed() {
    let dir = tempfile::tempdir().expect("tempdir");
    for name in ["only_types.rego", "public_buckets.rego"] {
        let from = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/policies")
            .join(name);
        std::fs::copy(&from, dir.path().join(name)).expect("copy policy");
    }
    let f = fixture(
        &format!(
            "parameters_file = \"params.json\"\n\n\
             [[policies]]\nname = \"only-types\"\nfiles = [\"{0}/only_types.rego\"]\n\n\
             [[policies]]\nname = \"public-buckets\"\nfiles = [\"{0}/public_buckets.rego\"]\n",
            dir.path().display()
        ),
        "2m",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let first = f.s.target_status("site")["last_applied_sha"].clone();

    // A public bucket: applied, with the warning on the run.
    let mut t: Value = serde_json::from_str(&template(true)).expect("json");
    t["Resources"]["Site"] = json!({
        "Type": "AWS::S3::Bucket",
        "Properties": { "BucketName": "site-bucket", "AccessControl": "PublicRead" }
    });
    let second = f.remote.commit(
        &[(
            "cfn/stack.json",
            &serde_json::to_string_pretty(&t).expect("json"),
        )],
        "a public bucket",
    );
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed", "{msg}");
    assert!(
        msg.contains("policy `public-buckets` warns: bucket Site is public (PublicRead)"),
        "{msg}"
    );
    assert_eq!(
        f.s.target_status("site")["last_applied_sha"],
        second.as_str()
    );
    assert_ne!(f.s.target_status("site")["last_applied_sha"], first);

    // A queue is not an allowed type: denied, the change set never executed.
    t["Resources"]["Jobs"] = json!({ "Type": "AWS::SQS::Queue", "Properties": {} });
    f.remote.commit(
        &[(
            "cfn/stack.json",
            &serde_json::to_string_pretty(&t).expect("json"),
        )],
        "a queue",
    );
    let executed = f.calls("ExecuteChangeSet").len();
    let (code, out) = f.tick();
    assert_ne!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "failed", "{msg}");
    assert!(
        msg.contains("denied by policy `only-types`: Jobs: type AWS::SQS::Queue is not allowed")
            && msg.contains("nothing applied"),
        "{msg}"
    );
    assert_eq!(
        f.calls("ExecuteChangeSet").len(),
        executed,
        "executed anyway"
    );
    assert_eq!(
        f.s.target_status("site")["last_applied_sha"],
        second.as_str()
    );
    // The refused change set is let go of.
    assert!(!f.calls("DeleteChangeSet").is_empty(), "{:?}", f.moto.log());

    // The same stack as a YAML template with CloudFormation's short forms:
    // its properties reach the policy too (a public bucket is warned).
    let yaml = "Parameters:\n  Greeting:\n    Type: String\n\
                Resources:\n  Greeting:\n    Type: AWS::SSM::Parameter\n    Properties:\n      \
                Name: /site/greeting\n      Type: String\n      Value: !Ref Greeting\n  \
                Site:\n    Type: AWS::S3::Bucket\n    Properties:\n      BucketName: site-bucket\n      \
                AccessControl: PublicRead\n  \
                Assets:\n    Type: AWS::S3::Bucket\n    Properties:\n      \
                BucketName: !Sub '${AWS::StackName}-assets'\n      AccessControl: PublicReadWrite\n\
                Outputs:\n  ParameterName:\n    Value: !Ref Greeting\n";
    let third = f
        .remote
        .commit(&[("cfn/stack.yaml", yaml)], "as YAML, with assets");
    let cfg = std::fs::read_to_string(&f.s.config).expect("config");
    std::fs::write(
        &f.s.config,
        cfg.replace("template = \"stack.json\"", "template = \"stack.yaml\""),
    )
    .expect("config");
    let (code, out) = f.tick();
    assert_eq!(code, Some(0), "{out}");
    let (result, msg) = f.status();
    assert_eq!(result, "changed", "{msg}");
    assert!(
        msg.contains("policy `public-buckets` warns: bucket Assets is public (PublicReadWrite)"),
        "{msg}"
    );
    assert_eq!(
        f.s.target_status("site")["last_applied_sha"],
        third.as_str()
    );
}
