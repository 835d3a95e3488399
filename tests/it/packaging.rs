//! The shipped packaging, built and run for real. No registry is reachable,
//! so the base image `docker/Dockerfile` names (`debian:bookworm-slim`) is a
//! Debian bookworm root made here by `debootstrap --variant=minbase` from
//! Debian's archive and `docker import`ed into a private dockerd; the
//! image's own `apt-get` runs for real (`docker build --network host`).
//!
//! - The container image: built from the binary this suite compiled (the
//!   Dockerfile's `DRIFTLESS_BINARY` argument, so CI does not compile
//!   twice), then run as a user would run it.
//! - `docker/compose.yaml`: `docker-compose config` accepts it.
//! - The Debian package (`packaging/deb.sh`, cargo-deb): checked by
//!   lintian, installed with `apt-get install ./…deb` under a real systemd,
//!   configured and started, restarted, upgraded from a lower version of
//!   the same binary, purged.
//! - `systemd/`: `systemd-analyze verify` on every unit, then the units
//!   under a real systemd (PID 1 of a container): the sandbox leaves the
//!   daemon what it needs, and an apply orphaned by a `kill -9`ed daemon
//!   finishes before the restarted daemon runs the job again.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common::*;

const SECRET: &str = "packaging-hook-secret";
/// The uid docker/Dockerfile gives its user.
const IMAGE_UID: &str = "10001";

/// A Debian bookworm minbase root as a tarball, made once per test run and
/// kept in `target/tmp` for the next (a clean clone makes it again).
fn bookworm_base() -> &'static Path {
    static BASE: OnceLock<PathBuf> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bookworm-minbase");
        let tar = dir.join("rootfs-slim.tar");
        if tar.exists() {
            return tar;
        }
        let rootfs = dir.join("rootfs");
        let _ = std::fs::remove_dir_all(&rootfs);
        std::fs::create_dir_all(&dir).expect("mkdir base");
        let mirror = std::env::var("DRIFTLESS_DEBIAN_MIRROR")
            .unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let out = output_within(
            Command::new("debootstrap")
                .args(["--variant=minbase", "bookworm"])
                .arg(&rootfs)
                .arg(&mirror)
                .stdin(Stdio::null()),
            Duration::from_secs(600),
        );
        assert!(
            out.status.success(),
            "debootstrap (apt-get install debootstrap; see tests/run.sh) from {mirror}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        // As Debian's official slim images (debuerreotype's slimify and
        // its apt settings): no documentation, manuals or translations, and
        // none installed later; apt keeps no downloaded packages or caches.
        std::fs::write(
            rootfs.join("etc/dpkg/dpkg.cfg.d/slim"),
            "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n\
             path-exclude /usr/share/man/*\npath-exclude /usr/share/info/*\n\
             path-exclude /usr/share/locale/*\n",
        )
        .expect("dpkg config");
        std::fs::write(
            rootfs.join("etc/apt/apt.conf.d/slim"),
            "APT::Keep-Downloaded-Packages \"false\";\n\
             Dir::Cache::pkgcache \"\";\nDir::Cache::srcpkgcache \"\";\n",
        )
        .expect("apt config");
        for gone in [
            "usr/share/doc",
            "usr/share/man",
            "usr/share/info",
            "usr/share/locale",
            "var/cache/apt",
            "var/lib/apt/lists",
        ] {
            let p = rootfs.join(gone);
            let _ = std::fs::remove_dir_all(&p);
            std::fs::create_dir_all(&p).expect("mkdir");
        }
        let partial = dir.join("rootfs.tar.partial");
        let out = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&partial)
            .arg(".")
            .output()
            .expect("tar");
        assert!(out.status.success(), "tar: {}", text(&out.stderr));
        std::fs::rename(&partial, &tar).expect("rename");
        let _ = std::fs::remove_dir_all(&rootfs);
        tar
    })
}

/// A private dockerd holding the bookworm base as `debian:bookworm-slim`.
fn dockerd_with_base(root: &Path) -> Dockerd {
    let d = Dockerd::start(root);
    let tar = std::fs::File::open(bookworm_base()).expect("open base");
    let out = Command::new("docker")
        .args(["import", "-", "debian:bookworm-slim"])
        .env("DOCKER_HOST", &d.host)
        .stdin(tar)
        .output()
        .expect("docker import");
    assert!(out.status.success(), "docker import: {}", text(&out.stderr));
    d
}

/// `docker build --network host -t TAG … CONTEXT` (the build's apt-get
/// reaches Debian's archive through the host) with BuildKit. Debian's docker.io CLI (/usr/bin/docker)
/// carries BuildKit itself; a newer CLI needs its buildx plugin for it, and
/// without BuildKit a multi-stage build would run every stage, the
/// registry-only build stage included.
fn docker_build(d: &Dockerd, tag: &str, context: &Path, args: &[&str]) -> Output {
    let cli = if Command::new("docker")
        .args(["buildx", "version"])
        .output()
        .is_ok_and(|o| o.status.success())
    {
        "docker"
    } else {
        "/usr/bin/docker"
    };
    output_within(
        Command::new(cli)
            .args(["build", "--network", "host", "-t", tag])
            .args(args)
            .arg(context)
            .env("DOCKER_HOST", &d.host)
            .env("DOCKER_BUILDKIT", "1")
            .stdin(Stdio::null()),
        Duration::from_secs(600),
    )
}

/// The suite's driftless binary without its symbol tables, in a directory
/// of its own.
fn stripped_binary(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("mkdir");
    let out = dir.join("driftless");
    let status = Command::new("strip")
        .arg("-o")
        .arg(&out)
        .arg(bin())
        .status()
        .expect("strip (binutils)");
    assert!(status.success(), "strip failed");
    out
}

fn image_size(d: &Dockerd, image: &str) -> u64 {
    let out = d.docker(&["image", "inspect", "--format", "{{.Size}}", image]);
    assert!(
        out.status.success(),
        "inspect {image}: {}",
        text(&out.stderr)
    );
    text(&out.stdout).trim().parse().expect("a size")
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}

/// `chown -R` the bare repository to `owner`: git refuses to serve a
/// repository another user owns ("dubious ownership"), and the host's
/// commits are root's.
fn hand_over(repo: &Path, owner: &str) {
    let status = Command::new("chown")
        .args(["-R", owner])
        .arg(repo)
        .status()
        .expect("chown");
    assert!(status.success(), "chown {owner} {}", repo.display());
}

/// `driftless history app --json` inside container `name`.
fn container_history(d: &Dockerd, name: &str, exec_prefix: &[&str]) -> Vec<Value> {
    let mut args = vec!["exec", name];
    args.extend_from_slice(exec_prefix);
    args.extend(["driftless", "history", "app", "--json"]);
    let out = d.docker(&args);
    serde_json::from_str(&succeeded(&out, "history in the container")).expect("history --json")
}

fn results_at(history: &[Value], sha: &str) -> Vec<String> {
    history
        .iter()
        .filter(|r| r["sha"] == sha)
        .map(|r| r["result"].as_str().unwrap_or("").to_string())
        .collect()
}

/// The exec target's files: `apply.sh` writes where backend tools keep
/// their own state (a plugin cache, ssh's known hosts: under `$HOME`, the
/// state directory) and logs its start and end (with its pid) there,
/// sleeping for the committed `delay` between.
/// The bare repository is handed to `owner` (the user driftless runs as)
/// after the commit, and back to root for it.
fn commit_app(remote: &Remote, version: &str, delay: &str, owner: &str) -> String {
    hand_over(&remote.bare, "root");
    let sha = remote.commit(
        &[
            (
                "app/apply.sh",
                "set -e\n\
                 mkdir -p \"$HOME/.terraform.d/plugin-cache\" \"$HOME/.ssh\"\n\
                 touch \"$HOME/.ssh/known_hosts\"\n\
                 log=\"$HOME/apply.log\"\n\
                 echo \"start $$ $(cat version)\" >> \"$log\"\n\
                 sleep \"$(cat delay)\"\n\
                 echo \"end $$ $(cat version)\" >> \"$log\"\n\
                 echo applied version $(cat version)\n",
            ),
            ("app/version", version),
            ("app/delay", delay),
        ],
        &format!("version {version}"),
    );
    hand_over(&remote.bare, owner);
    sha
}

/// A signed GitHub push of `sha` for the repository driftless knows as
/// `url` (its path inside the container); the response.
fn push(port: u16, url: &str, sha: &str, secret: &str, delivery: &str) -> HttpResponse {
    let body = github_push_body(url, sha, &["app/version"]);
    deliver_github_push(port, secret, &body, delivery)
}

#[test]
fn the_image_builds_and_runs_as_a_user_runs_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let d = dockerd_with_base(root.path());
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR"));

    // docker/compose.yaml as docker-compose reads it.
    let out = Command::new("docker-compose")
        .args(["-f", "docker/compose.yaml", "config", "--quiet"])
        .current_dir(repo_root)
        .output()
        .expect("docker-compose");
    succeeded(&out, "docker-compose config docker/compose.yaml");
    // Its PostgreSQL profile: a database service in the `postgres`
    // profile only (docker-compose v1 shows profiles rather than filtering).
    let out = Command::new("docker-compose")
        .args([
            "-f",
            "docker/compose.yaml",
            "--profile",
            "postgres",
            "config",
        ])
        .current_dir(repo_root)
        .output()
        .expect("docker-compose");
    let rendered = succeeded(&out, "docker-compose --profile postgres config");
    let postgres = rendered
        .split("\n  postgres:\n")
        .nth(1)
        .expect("a postgres service");
    assert!(
        postgres.contains("profiles:\n    - postgres\n"),
        "{rendered}"
    );
    assert!(
        !rendered
            .split("\n  postgres:\n")
            .next()
            .is_some_and(|driftless| driftless.contains("profiles:")),
        "driftless itself must not need a profile: {rendered}"
    );
    // The driftless service's healthcheck is the binary's own.
    let driftless = rendered.split("\n  postgres:\n").next().unwrap_or("");
    assert!(
        driftless.contains("healthcheck:")
            && driftless.contains("/usr/local/bin/driftless\n      - healthcheck\n"),
        "{rendered}"
    );

    // The binary image the build argument names, then the Dockerfile.
    let binary = stripped_binary(&root.path().join("binary"));
    let tar = Command::new("tar")
        .arg("-C")
        .arg(binary.parent().expect("dir"))
        .args(["-cf", "-", "driftless"])
        .output()
        .expect("tar");
    let mut import = Command::new("docker")
        .args(["import", "-", "driftless-binary:suite"])
        .env("DOCKER_HOST", &d.host)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("docker import");
    std::io::Write::write_all(&mut import.stdin.take().expect("stdin"), &tar.stdout)
        .expect("write");
    assert!(import.wait().expect("wait").success(), "import binary");
    let started = Instant::now();
    let out = docker_build(
        &d,
        "driftless:suite",
        repo_root,
        &[
            "-f",
            "docker/Dockerfile",
            "--build-arg",
            "DRIFTLESS_BINARY=driftless-binary:suite",
            "--build-arg",
            concat!("VERSION=", env!("CARGO_PKG_VERSION")),
            "--build-arg",
            "REVISION=0123456789abcdef0123456789abcdef01234567",
        ],
    );
    succeeded(&out, "docker build");
    // What the image says of itself: the OCI labels, and its health check
    // is the binary's own (no curl in the image).
    let labels: Value = serde_json::from_str(&succeeded(
        &d.docker(&[
            "image",
            "inspect",
            "--format",
            "{{json .Config.Labels}}",
            "driftless:suite",
        ]),
        "labels",
    ))
    .expect("labels as JSON");
    for (key, value) in [
        ("org.opencontainers.image.title", "driftless"),
        (
            "org.opencontainers.image.version",
            env!("CARGO_PKG_VERSION"),
        ),
        (
            "org.opencontainers.image.revision",
            "0123456789abcdef0123456789abcdef01234567",
        ),
        ("org.opencontainers.image.licenses", "MIT OR Apache-2.0"),
    ] {
        assert_eq!(labels[key], value, "{key}: {labels}");
    }
    let check: Value = serde_json::from_str(&succeeded(
        &d.docker(&[
            "image",
            "inspect",
            "--format",
            "{{json .Config.Healthcheck}}",
            "driftless:suite",
        ]),
        "healthcheck",
    ))
    .expect("healthcheck as JSON");
    assert_eq!(
        check["Test"],
        serde_json::json!(["CMD", "/usr/local/bin/driftless", "healthcheck"]),
        "{check}"
    );
    let (image, base) = (
        image_size(&d, "driftless:suite"),
        image_size(&d, "debian:bookworm-slim"),
    );
    let binary_size = std::fs::metadata(&binary).expect("binary").len();
    println!(
        "image driftless:suite: {} (base debian:bookworm-slim from debootstrap {}, \
         git+ca-certificates+openssh-client {}, driftless {} (the suite's debug build, stripped)); \
         built in {:.0} s",
        mb(image),
        mb(base),
        mb(image.saturating_sub(base).saturating_sub(binary_size)),
        mb(binary_size),
        started.elapsed().as_secs_f64()
    );

    // The repository, mounted into the container; config and secret as
    // the README says: read-only mounts.
    let remote = Remote::new(root.path(), "infra");
    let first = commit_app(&remote, "1", "0", IMAGE_UID);
    let etc = root.path().join("etc");
    let secrets = root.path().join("secrets");
    std::fs::create_dir_all(&etc).expect("mkdir");
    std::fs::create_dir_all(&secrets).expect("mkdir");
    std::fs::write(secrets.join("github-hook-secret"), SECRET).expect("secret");
    let in_container_url = "file:///srv/infra.git";
    std::fs::write(
        etc.join("driftless.toml"),
        format!(
            "[[receivers]]\nname = \"github\"\nforge = \"github\"\n\
             secret_file = \"/run/secrets/github-hook-secret\"\n\n\
             [[targets]]\nname = \"app\"\nrepo = \"{in_container_url}\"\npath = \"app\"\ninterval = \"1h\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"sh\", \"apply.sh\"]\n"
        ),
    )
    .expect("config");
    succeeded(
        &d.docker(&["volume", "create", "driftless-state"]),
        "volume create",
    );
    let port = free_port();
    let listen = format!("DRIFTLESS__SERVER__LISTEN=127.0.0.1:{port}");
    let mounts = [
        "-v".to_string(),
        "driftless-state:/var/lib/driftless".to_string(),
        "-v".to_string(),
        format!(
            "{}:/etc/driftless/driftless.toml:ro",
            etc.join("driftless.toml").display()
        ),
        "-v".to_string(),
        format!("{}:/run/secrets:ro", secrets.display()),
        "-v".to_string(),
        format!("{}:/srv/infra.git:ro", remote.bare.display()),
    ];
    let run = |name: &str| {
        // `--init`, as docker/compose.yaml's `init: true`: a small init
        // reaps what backend tools orphan and passes SIGTERM on.
        // The image's HEALTHCHECK, asked every second rather than every
        // 30 s so the test sees it turn healthy.
        let mut args: Vec<&str> = vec![
            "run",
            "-d",
            "--init",
            "--health-interval=1s",
            "--name",
            name,
            "--network",
            "host",
        ];
        args.extend(["-e", &listen]);
        args.extend(mounts.iter().map(String::as_str));
        args.push("driftless:suite");
        succeeded(&d.docker(&args), "docker run");
        wait_for(Duration::from_secs(30), "the container to serve", || {
            http_get(port, "/healthz").is_some_and(|(c, _)| c == 200)
        });
    };
    let logs = |name: &str| {
        let out = d.docker(&["logs", name]);
        format!("{}{}", text(&out.stdout), text(&out.stderr))
    };

    run("d1");
    // Not root: driftless runs as the image's user.
    let uids = succeeded(
        &d.docker(&[
            "exec",
            "d1",
            "sh",
            "-c",
            "for p in /proc/[0-9]*; do \
             [ \"$(cat $p/comm 2>/dev/null)\" = driftless ] && grep ^Uid: $p/status; done; true",
        ]),
        "the daemon's uid",
    );
    let uid_line = uids.lines().next().expect("a driftless process");
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == IMAGE_UID),
        "driftless runs as {uid_line}"
    );
    assert_eq!(
        http_get(port, "/readyz").map(|(c, _)| c),
        Some(200),
        "{}",
        logs("d1")
    );
    // Its own health check says so: the binary asked /readyz at the
    // address the environment set, and docker counts the container healthy.
    let said = succeeded(
        &d.docker(&["exec", "d1", "driftless", "healthcheck"]),
        "driftless healthcheck in the container",
    );
    assert_eq!(
        said.trim(),
        format!("ready: http://127.0.0.1:{port}/readyz")
    );
    wait_for(Duration::from_secs(30), "the container healthy", || {
        let out = d.docker(&["inspect", "--format", "{{.State.Health.Status}}", "d1"]);
        text(&out.stdout).trim() == "healthy"
    });
    // The first interval tick applies the mounted repository.
    wait_for(Duration::from_secs(60), "the first apply", || {
        results_at(&container_history(&d, "d1", &[]), &first) == ["changed"]
    });

    // A push signed with the secret from /run/secrets is accepted and
    // applied.
    let second = commit_app(&remote, "2", "0", IMAGE_UID);
    let r = push(port, in_container_url, &second, SECRET, "image-1");
    assert_eq!(r.status, 202, "{r:?}\n{}", logs("d1"));
    let wrong = push(port, in_container_url, &second, "not-the-secret", "image-2");
    assert_eq!(wrong.status, 401, "{wrong:?}");
    wait_for(Duration::from_secs(60), "the pushed commit applied", || {
        results_at(&container_history(&d, "d1", &[]), &second) == ["changed"]
    });

    // State survives `docker restart`.
    succeeded(&d.docker(&["restart", "-t", "30", "d1"]), "docker restart");
    wait_for(Duration::from_secs(30), "the restarted container", || {
        http_get(port, "/healthz").is_some_and(|(c, _)| c == 200)
    });
    let h = container_history(&d, "d1", &[]);
    assert_eq!(results_at(&h, &first), ["changed"], "{h:?}");
    assert_eq!(results_at(&h, &second), ["changed"], "{h:?}");

    // `docker stop` while an apply runs: SIGTERM lets it finish, exit 0.
    let third = commit_app(&remote, "3", "4", IMAGE_UID);
    let r = push(port, in_container_url, &third, SECRET, "image-3");
    assert_eq!(r.status, 202, "{r:?}");
    wait_for(Duration::from_secs(30), "the slow apply to start", || {
        let out = d.docker(&["exec", "d1", "cat", "/var/lib/driftless/apply.log"]);
        text(&out.stdout).contains(" 3\n")
    });
    let stopping = Instant::now();
    succeeded(&d.docker(&["stop", "-t", "60", "d1"]), "docker stop");
    let took = stopping.elapsed();
    let code = succeeded(
        &d.docker(&["inspect", "--format", "{{.State.ExitCode}}", "d1"]),
        "inspect",
    );
    assert_eq!(
        code.trim(),
        "0",
        "exit code after docker stop\n{}",
        logs("d1")
    );
    assert!(
        took < Duration::from_secs(55),
        "docker stop took {took:?}: SIGTERM was not heeded, the stop timed out"
    );
    let secret_in_logs = logs("d1").contains(SECRET);
    assert!(
        !secret_in_logs,
        "the webhook secret is in the container's log"
    );
    succeeded(&d.docker(&["rm", "d1"]), "docker rm");

    // A new container on the same volume: everything recorded before is
    // there, the interrupted-by-stop apply included, finished.
    run("d2");
    let h = container_history(&d, "d2", &[]);
    assert_eq!(results_at(&h, &first), ["changed"], "{h:?}");
    assert_eq!(results_at(&h, &third), ["changed"], "{h:?}");
    let log = succeeded(
        &d.docker(&["exec", "d2", "cat", "/var/lib/driftless/apply.log"]),
        "apply log",
    );
    let ends: Vec<&str> = log.lines().filter(|l| l.starts_with("end")).collect();
    assert_eq!(ends.len(), 3, "every apply ran to its end once: {log}");
    succeeded(&d.docker(&["stop", "-t", "30", "d2"]), "docker stop d2");
}

/// Every unit in `systemd/`, as `systemd-analyze verify` names it (a
/// template with the instance `app`).
fn shipped_units() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd");
    let mut units: Vec<(PathBuf, String)> = std::fs::read_dir(&dir)
        .expect("systemd/")
        .map(|e| e.expect("entry").path())
        .filter(|p| {
            p.extension()
                .is_some_and(|e| e == "service" || e == "timer")
        })
        .map(|p| {
            let file = p.file_name().expect("name").to_string_lossy().to_string();
            let name = file.replacen("@.", "@app.", 1);
            (p, name)
        })
        .collect();
    units.sort();
    units
}

/// Run `image` in container `name` with systemd as PID 1 (what it needs
/// in a container: its cgroups, a tmpfs /run, and the capability to set up
/// the units' sandboxes), `mount` bound in, on the host's network; wait
/// until it has booted.
fn boot_systemd(d: &Dockerd, name: &str, image: &str, mount: &str) {
    succeeded(
        &d.docker(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            "--cap-add",
            "SYS_ADMIN",
            "--security-opt",
            "seccomp=unconfined",
            "--security-opt",
            "apparmor=unconfined",
            "--tmpfs",
            "/run",
            "--tmpfs",
            "/run/lock",
            "-v",
            "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "-v",
            mount,
            image,
            "/sbin/init",
        ]),
        "docker run systemd",
    );
    wait_for(Duration::from_secs(60), "systemd to boot", || {
        let out = d.docker(&["exec", name, "systemctl", "is-system-running"]);
        matches!(text(&out.stdout).trim(), "running" | "degraded")
    });
}

/// `unit`'s journal in container `name`.
fn journal_of(d: &Dockerd, name: &str, unit: &str) -> String {
    let out = d.docker(&["exec", name, "journalctl", "--no-pager", "-u", unit]);
    text(&out.stdout)
}

/// `systemctl start driftless` in container `name`, its journal said if
/// it fails.
fn start_driftless(d: &Dockerd, name: &str) {
    let out = d.docker(&["exec", name, "systemctl", "start", "driftless"]);
    assert!(
        out.status.success(),
        "systemctl start driftless: {}\n{}",
        text(&out.stderr),
        journal_of(d, name, "driftless")
    );
}

/// The app target's history as the service user reads it, in container
/// `name` running the units.
fn service_history(d: &Dockerd, name: &str) -> Vec<Value> {
    container_history(
        d,
        name,
        &[
            "runuser",
            "-u",
            "driftless",
            "--",
            "env",
            "DRIFTLESS_CONFIG=/etc/driftless/driftless.toml",
        ],
    )
}

/// Run `args` in container `name`; its stdout, or a failure naming `what`.
fn in_container(d: &Dockerd, name: &str, args: &[&str], what: &str) -> String {
    let mut all = vec!["exec", name];
    all.extend_from_slice(args);
    succeeded(&d.docker(&all), what)
}

#[test]
fn the_systemd_units_verify_and_keep_their_promises_under_systemd() {
    let root = tempfile::tempdir().expect("tempdir");
    let units = shipped_units();
    assert!(units.len() >= 3, "{units:?}");

    // systemd-analyze verify, in a root holding the units, the binary their
    // Exec lines name and systemd's own units. It exits 0 on an unknown
    // key or a bad value (a warning on stderr): any output is a failure.
    let sysroot = root.path().join("sysroot");
    let unit_dir = sysroot.join("etc/systemd/system");
    std::fs::create_dir_all(&unit_dir).expect("mkdir");
    std::fs::create_dir_all(sysroot.join("usr/local/bin")).expect("mkdir");
    std::fs::create_dir_all(sysroot.join("usr/lib/systemd")).expect("mkdir");
    std::fs::copy(bin(), sysroot.join("usr/local/bin/driftless")).expect("copy binary");
    for (path, _) in &units {
        std::fs::copy(path, unit_dir.join(path.file_name().expect("name"))).expect("copy unit");
    }
    let out = Command::new("cp")
        .args(["-a", "/usr/lib/systemd/system"])
        .arg(sysroot.join("usr/lib/systemd/"))
        .output()
        .expect("cp");
    succeeded(&out, "copy systemd's units (apt-get install systemd)");
    let names: Vec<&str> = units.iter().map(|(_, n)| n.as_str()).collect();
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(format!("--root={}", sysroot.display()))
        .args(&names)
        .current_dir(&unit_dir)
        .output()
        .expect("systemd-analyze (apt-get install systemd)");
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "systemd-analyze verify {names:?}:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(format!("--root={}", sysroot.display()))
        .arg("driftless.service")
        .current_dir(&unit_dir)
        .output()
        .expect("systemd-analyze security");
    if let Some(line) = text(&out.stdout)
        .lines()
        .chain(text(&out.stderr).lines())
        .find(|l| l.contains("Overall exposure level"))
    {
        println!(
            "systemd-analyze security driftless.service: {}",
            line.trim()
        );
    }

    // The units under a real systemd: PID 1 of a container.
    let d = dockerd_with_base(root.path());
    let ctx = root.path().join("context");
    std::fs::create_dir_all(ctx.join("units")).expect("mkdir");
    stripped_binary(&ctx);
    for (path, _) in &units {
        std::fs::copy(
            path,
            ctx.join("units").join(path.file_name().expect("name")),
        )
        .expect("copy unit");
    }
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("systemd/driftless.sysusers"),
        ctx.join("driftless.sysusers.conf"),
    )
    .expect("copy sysusers");
    let port = free_port();
    let url = "file:///srv/infra.git";
    std::fs::write(
        ctx.join("driftless.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [[receivers]]\nname = \"github\"\nforge = \"github\"\n\
             secret_file = \"/etc/driftless/github-hook-secret\"\n\n\
             [[targets]]\nname = \"app\"\nrepo = \"{url}\"\npath = \"app\"\ninterval = \"1h\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"sh\", \"apply.sh\"]\n"
        ),
    )
    .expect("config");
    std::fs::write(ctx.join("github-hook-secret"), SECRET).expect("secret");
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian:bookworm-slim\n\
         RUN apt-get update \\\n && apt-get install -y --no-install-recommends systemd systemd-sysv git ca-certificates \\\n && rm -rf /var/lib/apt/lists/*\n\
         COPY driftless /usr/local/bin/driftless\n\
         COPY units/ /etc/systemd/system/\n\
         COPY driftless.sysusers.conf /usr/lib/sysusers.d/driftless.conf\n\
         COPY driftless.toml /etc/driftless/driftless.toml\n\
         COPY github-hook-secret /etc/driftless/github-hook-secret\n",
    )
    .expect("Dockerfile");
    let out = docker_build(&d, "driftless-systemd:suite", &ctx, &[]);
    succeeded(&out, "docker build (systemd image)");

    let remote = Remote::new(root.path(), "infra");
    let repo_mount = format!("{}:/srv/infra.git:ro", remote.bare.display());
    boot_systemd(&d, "sd", "driftless-systemd:suite", &repo_mount);
    let journal = |unit: &str| journal_of(&d, "sd", unit);
    // systemd-sysusers made the user at boot.
    let uid = in_container(&d, "sd", &["id", "-u", "driftless"], "the driftless user");
    let uid = uid.trim();
    // The README's way to keep a secret: readable by root and the
    // driftless group only.
    in_container(
        &d,
        "sd",
        &[
            "sh",
            "-c",
            "chown root:driftless /etc/driftless/github-hook-secret \
             && chmod 0640 /etc/driftless/github-hook-secret",
        ],
        "the secret's owner",
    );
    let first = commit_app(&remote, "1", "0", uid);
    let history = |d: &Dockerd| service_history(d, "sd");

    // The sandboxed daemon starts (`driftless check` first), serves, and
    // applies: its state directory, its home (tools' caches, ssh's known
    // hosts) and the config are what it was left.
    start_driftless(&d, "sd");
    wait_for(Duration::from_secs(30), "the daemon to serve", || {
        http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)
    });
    wait_for(Duration::from_secs(60), "the first apply", || {
        results_at(&history(&d), &first) == ["changed"]
    });
    // The webhook secret was readable in the sandbox.
    let second = commit_app(&remote, "2", "0", uid);
    let r = push(port, url, &second, SECRET, "systemd-1");
    assert_eq!(r.status, 202, "{r:?}\n{}", journal("driftless"));
    wait_for(Duration::from_secs(60), "the pushed commit applied", || {
        results_at(&history(&d), &second) == ["changed"]
    });

    // kill -9 of the daemon mid-apply: the apply finishes (systemd leaves
    // it alone), systemd restarts the daemon, which waits for the orphan,
    // then runs the job again: never two at once.
    let third = commit_app(&remote, "3", "6", uid);
    let r = push(port, url, &third, SECRET, "systemd-2");
    assert_eq!(r.status, 202, "{r:?}");
    let apply_log = || {
        in_container(
            &d,
            "sd",
            &["cat", "/var/lib/driftless/apply.log"],
            "apply log",
        )
    };
    wait_for(Duration::from_secs(30), "the slow apply to start", || {
        apply_log().contains(" 3\n")
    });
    in_container(
        &d,
        "sd",
        &[
            "sh",
            "-c",
            "kill -9 \"$(systemctl show --property MainPID --value driftless)\"",
        ],
        "kill -9 the daemon",
    );
    wait_for(
        Duration::from_secs(90),
        "the restarted daemon to run the job again",
        || {
            let h = history(&d);
            results_at(&h, &third).iter().any(|r| r == "changed")
        },
    );
    let log = apply_log();
    let of_third: Vec<Vec<&str>> = log
        .lines()
        .filter(|l| l.ends_with(" 3"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    let kinds: Vec<&str> = of_third.iter().map(|l| l[0]).collect();
    assert_eq!(
        kinds,
        ["start", "end", "start", "end"],
        "the orphaned apply was killed, or the rerun overlapped it:\n{log}\n{}",
        journal("driftless")
    );
    assert_eq!(of_third[0][1], of_third[1][1], "{log}");
    let h = history(&d);
    let results = results_at(&h, &third);
    assert!(results.contains(&"interrupted".to_string()), "{results:?}");
    let restarts = in_container(
        &d,
        "sd",
        &[
            "systemctl",
            "show",
            "--property",
            "NRestarts",
            "--value",
            "driftless",
        ],
        "NRestarts",
    );
    assert_eq!(restarts.trim(), "1", "{}", journal("driftless"));

    // `systemctl stop`: a clean exit.
    in_container(&d, "sd", &["systemctl", "stop", "driftless"], "stop");
    let result = in_container(
        &d,
        "sd",
        &[
            "systemctl",
            "show",
            "--property",
            "Result",
            "--value",
            "driftless",
        ],
        "Result",
    );
    assert_eq!(result.trim(), "success", "{}", journal("driftless"));

    // The timer's one-shot tick shares the state: one more run, no change.
    let before = history(&d).len();
    in_container(
        &d,
        "sd",
        &["systemctl", "start", "driftless-tick@app.service"],
        "a one-shot tick",
    );
    let h = history(&d);
    assert_eq!(h.len(), before + 1, "{}", journal("driftless-tick@app"));
    assert_eq!(h[0]["result"], "no_change", "{h:?}");
    let journal_text = journal("driftless");
    assert!(
        !journal_text.contains(SECRET),
        "the webhook secret is in the journal"
    );
}

/// `packaging/deb.sh` on the binary this suite built, as version
/// `version`; the package's path.
fn debian_package(out: &Path, version: &str) -> PathBuf {
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let built = output_within(
        Command::new(repo_root.join("packaging/deb.sh"))
            .args(["--profile", "dev", "--fast", "--deb-version", version, "-o"])
            .arg(out)
            .current_dir(repo_root),
        Duration::from_secs(600),
    );
    let said = succeeded(
        &built,
        "packaging/deb.sh (cargo install cargo-deb; see tests/run.sh)",
    );
    let deb = PathBuf::from(said.trim().lines().last().unwrap_or(""));
    assert!(deb.is_file(), "no package: {said}{}", text(&built.stderr));
    deb
}

#[test]
fn the_debian_package_installs_starts_upgrades_and_purges_like_a_debian_service() {
    let root = tempfile::tempdir().expect("tempdir");
    // The package, and a lower version of the same binary to upgrade from
    // — or, with DRIFTLESS_UPGRADE_FROM_DEB, a package built from an
    // earlier revision (packaging/upgrade-from.sh: a real upgrade).
    let debs = root.path().join("context/debs");
    std::fs::create_dir_all(&debs).expect("mkdir");
    let started = Instant::now();
    let old = match std::env::var_os("DRIFTLESS_UPGRADE_FROM_DEB") {
        Some(from) => {
            let from = PathBuf::from(from);
            let to = debs.join(from.file_name().expect("a .deb file name"));
            std::fs::copy(&from, &to).expect("copy the previous package");
            to
        }
        None => debian_package(&debs, "0.0.9-1"),
    };
    let new = debian_package(&debs, concat!(env!("CARGO_PKG_VERSION"), "-1"));
    println!(
        "package {}: {} (made in {:.0} s with the previous one)",
        new.file_name().expect("name").to_string_lossy(),
        mb(std::fs::metadata(&new).expect("deb").len()),
        started.elapsed().as_secs_f64()
    );

    // lintian, Debian's own package checker: no errors.
    let lint = output_within(
        Command::new("lintian")
            .args(["--tag-display-limit", "0"])
            .arg(&new),
        Duration::from_secs(300),
    );
    let said = text(&lint.stdout) + &text(&lint.stderr);
    assert!(
        !said.lines().any(|l| l.starts_with("E: ")),
        "lintian found errors:\n{said}"
    );

    // A bookworm with systemd and what the package depends on (the cached
    // base has no network later: apt-get install ./…deb needs none).
    let d = dockerd_with_base(root.path());
    let ctx = root.path().join("context");
    std::fs::write(
        ctx.join("Dockerfile"),
        "FROM debian:bookworm-slim\n\
         RUN apt-get update \\\n && apt-get install -y --no-install-recommends systemd systemd-sysv git ca-certificates \\\n && rm -rf /var/lib/apt/lists/*\n\
         COPY debs/ /debs/\n",
    )
    .expect("Dockerfile");
    succeeded(
        &docker_build(&d, "driftless-deb:suite", &ctx, &[]),
        "docker build (package image)",
    );
    let remote = Remote::new(root.path(), "infra");
    let first = commit_app(&remote, "1", "0", "root");
    boot_systemd(
        &d,
        "deb",
        "driftless-deb:suite",
        &format!("{}:/srv/infra.git:ro", remote.bare.display()),
    );
    let sh = |script: &str, what: &str| in_container(&d, "deb", &["sh", "-c", script], what);
    let journal = || journal_of(&d, "deb", "driftless");
    let old_name = old.file_name().expect("name").to_string_lossy().to_string();
    let new_name = new.file_name().expect("name").to_string_lossy().to_string();

    // Installed: the user, the modes, the example (which `check` passes);
    // enabled, not started.
    sh(
        &format!("apt-get install -y --no-install-recommends /debs/{old_name}"),
        "apt-get install (the previous package)",
    );
    let uid = sh("id -u driftless", "the service user").trim().to_string();
    assert_eq!(
        sh("stat -c '%U:%G %a' /etc/driftless", "stat").trim(),
        "root:driftless 750"
    );
    sh(
        "driftless --config /etc/driftless/driftless.toml.example check",
        "check on the shipped example",
    );
    assert_eq!(
        sh("systemctl is-enabled driftless", "is-enabled").trim(),
        "enabled"
    );
    let active = d.docker(&["exec", "deb", "systemctl", "is-active", "driftless"]);
    assert_eq!(
        text(&active.stdout).trim(),
        "inactive",
        "started before it was configured"
    );
    assert!(
        sh(
            "test -e /var/lib/driftless && echo there || echo none",
            "state dir"
        )
        .trim()
            == "none",
        "the package made /var/lib/driftless itself (StateDirectory= does)"
    );

    // Configured and started: systemd makes the state directory the
    // service user's, the daemon applies the repository.
    hand_over(&remote.bare, &uid);
    let port = free_port();
    sh(
        &format!(
            "printf '%s' '[server]\nlisten = \"127.0.0.1:{port}\"\n\n\
             [[targets]]\nname = \"app\"\nrepo = \"file:///srv/infra.git\"\npath = \"app\"\ninterval = \"1h\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"sh\", \"apply.sh\"]\n' \
             > /etc/driftless/driftless.toml && chmod 0640 /etc/driftless/driftless.toml \
             && chgrp driftless /etc/driftless/driftless.toml"
        ),
        "the configuration",
    );
    start_driftless(&d, "deb");
    let history = || service_history(&d, "deb");
    wait_for(Duration::from_secs(60), "the first apply", || {
        results_at(&history(), &first) == ["changed"]
    });
    assert_eq!(
        sh("stat -c '%U %a' /var/lib/driftless", "stat").trim(),
        "driftless 750"
    );
    assert_eq!(
        sh("stat -c '%U:%G %a' /etc/driftless", "stat").trim(),
        "root:driftless 750",
        "systemd changed the configuration directory's mode"
    );
    let main_pid = || {
        sh("systemctl show -p MainPID --value driftless", "MainPID")
            .trim()
            .to_string()
    };

    // systemctl restart: serving again, nothing lost.
    let before = main_pid();
    sh("systemctl restart driftless", "systemctl restart");
    wait_for(Duration::from_secs(30), "the restarted daemon", || {
        http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)
    });
    assert_ne!(main_pid(), before);
    assert_eq!(results_at(&history(), &first), ["changed"]);

    // The upgrade: the running service restarted by the package, its
    // state and configuration kept.
    let before = main_pid();
    sh(
        &format!("apt-get install -y --no-install-recommends /debs/{new_name}"),
        "apt-get install (the upgrade)",
    );
    assert_eq!(
        sh("dpkg-query -W -f '${Version}' driftless", "version").trim(),
        concat!(env!("CARGO_PKG_VERSION"), "-1")
    );
    wait_for(Duration::from_secs(30), "the upgraded daemon", || {
        http_get(port, "/readyz").is_some_and(|(c, _)| c == 200)
    });
    let after = main_pid();
    assert!(
        after != before && after != "0",
        "not restarted by the upgrade: {before} → {after}\n{}",
        journal()
    );
    assert_eq!(
        results_at(&history(), &first),
        ["changed"],
        "the state was not kept"
    );
    assert!(sh("cat /etc/driftless/driftless.toml", "config").contains("name = \"app\""));
    // The package's files in their places: completions, man pages, the
    // schema (the one the binary prints), the units.
    let files = sh("dpkg -L driftless", "dpkg -L");
    for f in [
        "/usr/bin/driftless",
        "/usr/share/bash-completion/completions/driftless",
        "/usr/share/zsh/vendor-completions/_driftless",
        "/usr/share/fish/vendor_completions.d/driftless.fish",
        "/usr/share/man/man1/driftless.1.gz",
        "/usr/share/man/man1/driftless-tick.1.gz",
        "/usr/share/driftless/driftless.schema.json",
        "/usr/lib/systemd/system/driftless.service",
        "/usr/lib/systemd/system/driftless-tick@.timer",
        "/usr/lib/sysusers.d/driftless.conf",
    ] {
        assert!(
            files.lines().any(|l| l == f),
            "{f} not in the package:\n{files}"
        );
    }
    sh(
        "driftless config schema | cmp - /usr/share/driftless/driftless.schema.json",
        "the shipped schema is the one the binary prints",
    );

    // Purge: nothing of the package is left but the system user.
    sh("apt-get purge -y driftless", "apt-get purge");
    let quoted: Vec<String> = files.lines().map(|f| format!("'{f}'")).collect();
    let left = sh(
        &format!(
            "for f in {}; do [ -f \"$f\" ] && echo \"$f\"; done; true",
            quoted.join(" ")
        ),
        "what purge left",
    );
    assert!(left.is_empty(), "purge left {left:?}");
    for gone in ["/etc/driftless", "/var/lib/driftless", "/usr/bin/driftless"] {
        let out = d.docker(&["exec", "deb", "test", "-e", gone]);
        assert!(!out.status.success(), "{gone} is still there after purge");
    }
    let enabled = d.docker(&["exec", "deb", "systemctl", "is-enabled", "driftless"]);
    assert!(!enabled.status.success(), "{}", text(&enabled.stdout));
    assert_eq!(sh("id -u driftless", "the user stays").trim(), uid);
}
