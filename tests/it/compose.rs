//! The compose backend, and the pi backend's compose action, against a real
//! dockerd (Debian's docker.io, on a private socket, no networking) with
//! docker-compose. One test: one daemon for the whole scenario.

use crate::common::*;

const COMPOSE: &str = r#"services:
  web:
    image: driftless-test/busybox:1
    command: ["sh", "-c", "echo $$GREETING; sleep 3600"]
    network_mode: none
    environment:
      GREETING: ${GREETING:-unset}
"#;

/// A service serving a bind-mounted file and a `secrets:` file (compose
/// mounts both from the checkout), and a service that uses neither.
const FILES: &str = r#"services:
  site:
    image: driftless-test/busybox:1
    command: ["sh", "-c", "sleep 3600"]
    network_mode: none
    volumes:
      - ./www/index.html:/www/index.html:ro
    secrets:
      - token
  idle:
    image: driftless-test/busybox:1
    command: ["sh", "-c", "sleep 3600"]
    network_mode: none
secrets:
  token:
    file: ./token.txt
"#;

fn inspect_env(d: &Dockerd, name: &str) -> String {
    text(
        &d.docker(&["inspect", "--format", "{{json .Config.Env}}", name])
            .stdout,
    )
}

/// Someone runs `docker-compose up` by hand in target `project`'s checkout
/// with `GREETING=by-hand`: the container is recreated with settings that
/// are not git's.
fn recreate_by_hand(d: &Dockerd, s: &Setup, project: &str) {
    let out = std::process::Command::new("docker-compose")
        .args(["-p", project, "--env-file", ".env", "up", "-d"])
        .current_dir(s.checkout(project).join("app"))
        .env("DOCKER_HOST", &d.host)
        .env("GREETING", "by-hand")
        .output()
        .expect("docker-compose");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

fn container_id(d: &Dockerd, name: &str) -> String {
    text(&d.docker(&["inspect", "--format", "{{.Id}}", name]).stdout)
        .trim()
        .to_string()
}

#[test]
fn compose_projects_converge_locally_and_over_ssh() {
    let root = tempfile::tempdir().expect("tempdir");
    let docker = Dockerd::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("app/compose.yaml", COMPOSE),
            ("app/.env", "GREETING=hello\n"),
        ],
        "first",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"app\"\nrepo = \"{}\"\npath = \"app\"\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\nenv_files = [\".env\"]\n",
        remote.url(),
        docker.host
    ));
    let tick = || {
        let out = s.run(&["tick", "app"]);
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        s.history("app").into_iter().next().expect("a run")
    };

    // First apply: changed, the service runs.
    let run = tick();
    assert_eq!(run["result"], "changed", "{run}");
    assert_eq!(docker.running(), ["app_web_1"]);
    assert!(inspect_env(&docker, "app_web_1").contains("GREETING=hello"));
    let first_id = container_id(&docker, "app_web_1");

    // Second: no_change, and `up` did not run (nothing in the output).
    let run = tick();
    assert_eq!(run["result"], "no_change", "{run}");
    assert_eq!(run["output_tail"], "");
    assert_eq!(container_id(&docker, "app_web_1"), first_id);

    // An edited env value: changed, the container is recreated.
    remote.commit(&[("app/.env", "GREETING=bonjour\n")], "french");
    let run = tick();
    assert_eq!(run["result"], "changed", "{run}");
    assert_ne!(
        container_id(&docker, "app_web_1"),
        first_id,
        "not recreated"
    );
    assert!(inspect_env(&docker, "app_web_1").contains("GREETING=bonjour"));

    // Stopped by hand: drift, brought back and said so.
    assert!(
        docker
            .docker(&["stop", "-t", "1", "app_web_1"])
            .status
            .success()
    );
    assert!(docker.running().is_empty());
    let run = tick();
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("drift: service(s) web were not running"),
        "{run}"
    );
    assert_eq!(docker.running(), ["app_web_1"]);

    // Recreated by hand with other settings: running, and the stored
    // digest says nothing changed, but the container's config hash is not
    // git's. Drift: git's configuration is put back.
    recreate_by_hand(&docker, &s, "app");
    assert!(inspect_env(&docker, "app_web_1").contains("GREETING=by-hand"));
    let run = tick();
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("drift: service(s) web had another configuration than git's"),
        "{run}"
    );
    assert!(inspect_env(&docker, "app_web_1").contains("GREETING=bonjour"));
    let run = tick();
    assert_eq!(run["result"], "no_change", "{run}");

    // outputs: state and image per service.
    let out = s.run(&["outputs", "app", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["web"]["state"], "running", "{v}");
    assert_eq!(v["web"]["image"], TEST_IMAGE);

    // destroy removes the project.
    let out = s.run(&["destroy", "app", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&docker.docker(&["ps", "-aq"]).stdout)
            .trim()
            .is_empty()
    );

    // A bind-mounted file or a secrets file changed in git: the model is
    // the same, and what the container serves is the commit's file.
    let files = Setup::new(&format!(
        "[[targets]]\nname = \"files\"\nrepo = \"{}\"\npath = \"files\"\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\n",
        remote.url(),
        docker.host
    ));
    remote.commit(
        &[
            ("files/compose.yaml", FILES),
            ("files/www/index.html", "v1\n"),
            ("files/token.txt", "t1\n"),
            ("files/README", "a\n"),
        ],
        "files",
    );
    let tick_files = || {
        let out = files.run(&["tick", "files"]);
        assert!(
            out.status.success(),
            "{}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        files.history("files").into_iter().next().expect("a run")
    };
    let cat = |path: &str| text(&docker.docker(&["exec", "files_site_1", "cat", path]).stdout);
    assert_eq!(tick_files()["result"], "changed");
    assert_eq!(cat("/www/index.html"), "v1\n");
    assert_eq!(cat("/run/secrets/token"), "t1\n");
    let idle_id = container_id(&docker, "files_idle_1");
    remote.commit(&[("files/www/index.html", "v2\n")], "page v2");
    let run = tick_files();
    assert_eq!(run["result"], "changed", "{run}");
    assert!(
        run["message"]
            .as_str()
            .unwrap_or("")
            .contains("recreated site: files/www/index.html changed"),
        "{run}"
    );
    assert_eq!(
        cat("/www/index.html"),
        "v2\n",
        "the container serves the old file"
    );
    assert_eq!(
        container_id(&docker, "files_idle_1"),
        idle_id,
        "an unaffected service was recreated"
    );
    remote.commit(&[("files/token.txt", "t2\n")], "token t2");
    assert_eq!(tick_files()["result"], "changed");
    assert_eq!(cat("/run/secrets/token"), "t2\n");
    // A file no service uses: nothing is recreated.
    let site_id = container_id(&docker, "files_site_1");
    remote.commit(&[("files/README", "b\n")], "docs");
    let run = tick_files();
    assert_eq!(run["result"], "no_change", "{run}");
    assert_eq!(container_id(&docker, "files_site_1"), site_id);
    assert!(files.run(&["destroy", "files", "--yes"]).status.success());

    // The pi backend's compose action, over a real sshd, on the same engine.
    let sshd = Sshd::start(root.path());
    let remote_dir = root.path().join("pi apps");
    let pi = Setup::new(&format!(
        "[[targets]]\nname = \"pi\"\nrepo = \"{}\"\npath = \"app\"\n\
         [targets.backend]\nkind = \"pi\"\nhost = \"127.0.0.1\"\nport = {}\nuser = \"{}\"\n\
         identity_file = {}\nknown_hosts_file = {}\nremote_dir = {}\naction = \"compose\"\n\
         compose_command = [\"env\", \"DOCKER_HOST={}\", \"docker-compose\", \"-p\", \"piapps\"]\n",
        remote.url(),
        sshd.port,
        sshd.user,
        toml_str(&sshd.client_key.display().to_string()),
        toml_str(&sshd.known_hosts.display().to_string()),
        toml_str(&remote_dir.display().to_string()),
        docker.host
    ));
    let out = pi.run(&["tick", "pi"]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert_eq!(docker.running(), ["piapps_web_1"]);
    assert!(remote_dir.join("compose.yaml").is_file() && remote_dir.join(".env").is_file());
    let out = pi.run(&["outputs", "pi", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["web"]["state"], "running", "{v}");
}

/// `policy = "approve_destructive"` on a compose project, against the real
/// dockerd and docker-compose: creating a service is applied unattended, a
/// change that makes compose recreate a container (its config hash against
/// the container's label) waits for a person and leaves the container
/// alone until approved (a stale approval refused, a newer commit
/// superseding the waiting plan), and a service stopped by hand is started
/// again unattended; under `detect` nothing is brought up.
#[test]
fn a_compose_recreation_waits_for_approval_and_a_start_does_not() {
    const OPS: &str = "ops-token-compose-e61a";
    const CANARY: &str = "canary-compose-env-0b9e";
    let root = tempfile::tempdir().expect("tempdir");
    let docker = Dockerd::start(root.path());
    let remote = Remote::new(root.path(), "infra");
    remote.commit(
        &[
            ("app/compose.yaml", COMPOSE),
            ("app/.env", "GREETING=hello\n"),
        ],
        "first",
    );
    let s = Setup::new(&format!(
        "[[targets]]\nname = \"gated\"\nrepo = \"{}\"\npath = \"app\"\npolicy = \"approve_destructive\"\n\
         interval = \"1h\"\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\nenv_files = [\".env\"]\n{}",
        remote.url(),
        docker.host,
        token_table("ops", OPS, &["approve:gated", "read"]),
    ));
    let tick = || {
        let out = s.run(&["tick", "gated"]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert!(out.status.success(), "{said}");
        said
    };
    let intake = Intake::start(&s);
    let who = Approver {
        port: intake.port,
        token: OPS,
    };

    let said = tick();
    assert!(said.contains("gated: changed"), "{said}");
    let first = container_id(&docker, "gated_web_1");
    assert!(!first.is_empty(), "{said}");
    assert!(inspect_env(&docker, "gated_web_1").contains("GREETING=hello"));
    // Nothing changed: no plan, nothing waits.
    let said = tick();
    assert!(said.contains("no changes"), "{said}");

    remote.commit(&[("app/.env", "GREETING=bonjour\n")], "french");
    let said = tick();
    assert!(said.contains("waits for approval"), "{said}");
    let p = who.pending();
    assert_eq!(
        (&p[0]["backend"], &p[0]["destructive"], &p[0]["diff"]),
        (
            &"compose".into(),
            &true.into(),
            &"-/+ web (recreate: its configuration changed)".into()
        ),
        "{p:?}"
    );
    let newer = who.refuses_stale_and_supersedes(
        || {
            remote.commit(
                &[("app/.env", &format!("GREETING=hola-{CANARY}\n"))],
                "spanish",
            );
        },
        || {
            tick();
        },
    );
    assert_eq!(
        container_id(&docker, "gated_web_1"),
        first,
        "recreated before approval"
    );
    who.approve(&newer);
    let said = tick();
    assert!(said.contains("gated: changed"), "{said}");
    assert_ne!(container_id(&docker, "gated_web_1"), first);
    assert!(inspect_env(&docker, "gated_web_1").contains("GREETING=hola"));
    who.assert_plans_keep_out(&s, CANARY);

    // Stopped by hand: started again without waiting.
    let out = docker.docker(&["stop", "-t", "0", "gated_web_1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = tick();
    assert!(said.contains("gated: changed"), "{said}");
    assert!(who.pending().is_empty());
    assert!(
        docker.running().iter().any(|n| n == "gated_web_1"),
        "{:?}",
        docker.running()
    );

    // Someone recreates the container by hand with other settings: its
    // config hash differs from git's, while driftless's stored digest does
    // not. The plan sees it; the approved plan puts git's config back.
    recreate_by_hand(&docker, &s, "gated");
    assert!(inspect_env(&docker, "gated_web_1").contains("GREETING=by-hand"));
    let said = tick();
    assert!(said.contains("waits for approval"), "{said}");
    let p = who.pending();
    assert_eq!(
        p[0]["diff"], "-/+ web (recreate: its configuration changed)",
        "{p:?}"
    );
    who.approve(&p[0]);
    let said = tick();
    assert!(said.contains("gated: changed"), "{said}");
    assert!(inspect_env(&docker, "gated_web_1").contains("GREETING=hola"));

    // `detect` on a project nobody brought up: the plan is recorded as
    // drift, and no container is created.
    let cfg = std::fs::read_to_string(&s.config).expect("config");
    let watch = format!(
        "[[targets]]\nname = \"watch\"\nrepo = \"{}\"\npath = \"app\"\npolicy = \"detect\"\n\
         interval = \"1h\"\n\
         [targets.backend]\nkind = \"compose\"\ncommand = \"docker-compose\"\nhost = \"{}\"\nenv_files = [\".env\"]\n",
        remote.url(),
        docker.host,
    );
    std::fs::write(&s.config, format!("{cfg}\n{watch}")).expect("config");
    for _ in 0..2 {
        let out = s.run(&["tick", "watch"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    assert_detected(&s, "watch", "+ web (create)");
    assert!(
        !docker.running().iter().any(|n| n.starts_with("watch_")),
        "detect created a container: {:?}",
        docker.running()
    );
}
