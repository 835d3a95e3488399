//! What a shell user gets: completions and man pages made from the same
//! clap definitions the binary parses with. Bash's completion is driven
//! the way bash drives it — the script `driftless completions bash`
//! prints is sourced into a real bash, and the function it registered for
//! `driftless` (read back from `complete -p`) is called with `COMP_WORDS`
//! and `COMP_CWORD` set — so the target names come from the binary reading
//! the configuration, as they do at a prompt. Fish is asked with its own
//! `complete -C`; zsh's completion needs a terminal (zle), so only its
//! script is checked.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::*;

/// What bash offers after `words` (the last one is the word being typed),
/// with this build of driftless first on the PATH and `env` set.
fn bash_offers(words: &[&str], env: &[(&str, &str)]) -> Vec<String> {
    let bin_dir = bin().parent().expect("the binary's dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let quoted: Vec<String> = words.iter().map(|w| shell_quote(w)).collect();
    let script = format!(
        "set -e\n\
         source <(driftless completions bash)\n\
         fn=$(complete -p driftless | sed -n 's/.* -F \\([^ ]*\\) .*/\\1/p')\n\
         [ -n \"$fn\" ] || {{ echo 'no completion function registered for driftless' >&2; exit 1; }}\n\
         COMP_WORDS=({words})\n\
         COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))\n\
         COMP_LINE=\"${{COMP_WORDS[*]}}\"\n\
         COMP_POINT=${{#COMP_LINE}}\n\
         COMP_TYPE=9\n\
         \"$fn\" driftless \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        words = quoted.join(" ")
    );
    let out = output_within(
        Command::new("bash")
            .args(["--norc", "--noprofile", "-c", &script])
            .env("PATH", path)
            .env_remove("DRIFTLESS_CONFIG")
            .envs(env.iter().copied()),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "bash: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

fn targets_config(dir: &Path) -> std::path::PathBuf {
    let config = dir.join("driftless.toml");
    let remote = Remote::new(dir, "infra");
    remote.commit(&[("README", "infra\n")], "first");
    let target = |name: &str| {
        format!(
            "[[targets]]\nname = \"{name}\"\nrepo = \"{}\"\n\
             [targets.backend]\nkind = \"exec\"\napply = [\"true\"]\n\n",
            remote.url()
        )
    };
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\n\n{}{}{}",
            dir.join("state").display(),
            target("web-prod"),
            target("web-staging"),
            target("db-main")
        ),
    )
    .expect("write config");
    config
}

#[test]
fn bash_completes_commands_flags_and_the_configured_target_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = targets_config(dir.path());
    let cfg = config.to_str().expect("utf8");
    let check = output_within(
        Command::new(bin()).args(["--config", cfg, "check"]),
        Duration::from_secs(30),
    );
    assert!(check.status.success(), "{}", text(&check.stdout));

    // Commands, then a command's flags.
    let offers = bash_offers(&["driftless", "lo"], &[]);
    assert_eq!(offers, ["logs"], "{offers:?}");
    let offers = bash_offers(&["driftless", "tick", "--o"], &[]);
    assert_eq!(offers, ["--override-window"], "{offers:?}");

    // Target names, from the configuration --config names…
    let offers = bash_offers(&["driftless", "--config", cfg, "tick", ""], &[]);
    for name in ["web-prod", "web-staging", "db-main"] {
        assert!(offers.iter().any(|o| o == name), "{name}: {offers:?}");
    }
    let offers = bash_offers(&["driftless", "--config", cfg, "logs", "web-"], &[]);
    assert_eq!(offers, ["web-prod", "web-staging"], "{offers:?}");
    let offers = bash_offers(
        &[
            "driftless",
            &format!("--config={cfg}"),
            "policy",
            "eval",
            "d",
        ],
        &[],
    );
    assert_eq!(offers, ["db-main"], "{offers:?}");
    // …or from DRIFTLESS_CONFIG, as the command itself would read it.
    let offers = bash_offers(
        &["driftless", "history", "web-p"],
        &[("DRIFTLESS_CONFIG", cfg)],
    );
    assert_eq!(offers, ["web-prod"], "{offers:?}");

    // A configuration with a problem still names the targets it reads; one
    // that is missing names none, and says nothing on the prompt.
    let text_now = std::fs::read_to_string(&config).expect("read");
    std::fs::write(
        &config,
        text_now + "[[targets]]\nname = \"broken\"\nrepo = \"file:///x.git\"\n",
    )
    .expect("write");
    let offers = bash_offers(&["driftless", "--config", cfg, "plan", "db"], &[]);
    assert_eq!(offers, ["db-main"], "{offers:?}");
    let missing = dir.path().join("missing.toml");
    let offers = bash_offers(
        &[
            "driftless",
            "--config",
            missing.to_str().expect("utf8"),
            "plan",
            "db",
        ],
        &[],
    );
    assert!(offers.is_empty(), "{offers:?}");
}

/// What fish offers for `line` (`complete -C`, fish's own way to ask for
/// a command line's completions), with the script `driftless completions
/// fish` printed sourced and this build first on the PATH.
fn fish_offers(line: &str) -> Vec<String> {
    let bin_dir = bin().parent().expect("the binary's dir").to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = output_within(
        Command::new("fish")
            .args(["--no-config", "-c"])
            .arg(format!(
                "driftless completions fish | source; complete -C {}",
                shell_quote(line)
            ))
            .env("PATH", path)
            .env_remove("DRIFTLESS_CONFIG"),
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "fish (apt-get install fish): {}",
        text(&out.stderr)
    );
    text(&out.stdout)
        .lines()
        .map(|l| l.split('\t').next().unwrap_or("").trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

#[test]
fn fish_completes_the_configured_target_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = targets_config(dir.path());
    let cfg = config.to_str().expect("utf8");
    let offers = fish_offers(&format!("driftless --config {cfg} logs web-"));
    assert_eq!(offers, ["web-prod", "web-staging"], "{offers:?}");
    let offers = fish_offers(&format!("driftless --config {cfg} tick d"));
    assert_eq!(offers, ["db-main"], "{offers:?}");
}

#[test]
fn zsh_and_fish_scripts_call_back_into_the_binary() {
    for shell in ["zsh", "fish"] {
        let out = output_within(
            Command::new(bin()).args(["completions", shell]),
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{shell}: {}", text(&out.stderr));
        let script = text(&out.stdout);
        assert!(
            script.contains("COMPLETE") && script.contains("driftless"),
            "{shell}: {script}"
        );
    }
    let out = output_within(
        Command::new(bin()).args(["completions", "tcsh"]),
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("invalid value 'tcsh'"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn man_pages_cover_every_command() {
    let out = output_within(Command::new(bin()).arg("man"), Duration::from_secs(30));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let page = text(&out.stdout);
    assert!(page.contains(".TH driftless 1"), "{page}");
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let out = output_within(
        Command::new(bin()).args(["man", "--dir"]).arg(&pages),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Every command `--help` lists has its page, and the main page names it.
    let help = output_within(Command::new(bin()).arg("--help"), Duration::from_secs(30));
    let help = text(&help.stdout);
    let commands: Vec<&str> = help
        .split("Commands:")
        .nth(1)
        .and_then(|s| s.split("Options:").next())
        .unwrap_or("")
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .collect();
    assert!(commands.len() > 20, "{help}");
    for c in &commands {
        let file = pages.join(format!("driftless-{c}.1"));
        let text =
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            text.contains(&format!(".TH driftless-{c} 1")),
            "{c}: {text}"
        );
        assert!(page.contains(c), "the main page does not name {c}");
    }
    assert!(pages.join("driftless-policy-eval.1").is_file());
}

#[test]
fn healthcheck_asks_readyz_where_the_configuration_listens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = targets_config(dir.path());
    let healthcheck = |extra: &[&str]| {
        let out = output_within(
            Command::new(bin())
                .arg("--config")
                .arg(&config)
                .arg("healthcheck")
                .args(extra),
            Duration::from_secs(30),
        );
        (out.status.code(), text(&out.stdout) + &text(&out.stderr))
    };

    // A port the kernel picks cannot be asked: say what to pass.
    let base = std::fs::read_to_string(&config).expect("read");
    let with_port = |listen: &str| {
        let server = format!("\n[server]\nlisten = \"{listen}\"\n\n");
        std::fs::write(&config, base.replacen("\n\n", &server, 1)).expect("write");
    };
    with_port("127.0.0.1:0");
    let (code, said) = healthcheck(&[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("server.listen is 127.0.0.1:0") && said.contains("pass --url"),
        "{said}"
    );

    // Serving on a fixed port (every address): asked on loopback, ready.
    let port = free_port();
    with_port(&format!("0.0.0.0:{port}"));
    let d = Daemon::start_with(&config, dir.path());
    assert_eq!(d.port, port);
    let (code, said) = healthcheck(&[]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(
        said.trim(),
        format!("ready: http://127.0.0.1:{port}/readyz")
    );
    let (code, said) = healthcheck(&["--url", &format!("http://127.0.0.1:{port}/healthz")]);
    assert_eq!(code, Some(0), "{said}");
    // A password in the URL is never shown, ready or not.
    let secret = "hc-canary-9f2e71";
    let (code, said) = healthcheck(&[
        "--url",
        &format!("http://probe:{secret}@127.0.0.1:{port}/healthz"),
    ]);
    assert_eq!(code, Some(0), "{said}");
    assert_eq!(
        said.trim(),
        format!("ready: http://probe:***@127.0.0.1:{port}/healthz")
    );

    // Not ready: the answer's status and words.
    let (code, said) = healthcheck(&["--url", &format!("http://127.0.0.1:{port}/no-such-path")]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("answered 404"), "{said}");

    // Stopped: nothing answers, and it says so.
    d.stop();
    let (code, said) = healthcheck(&[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(&format!("http://127.0.0.1:{port}/readyz"))
            && said.to_lowercase().contains("connection refused"),
        "{said}"
    );
    let (code, said) = healthcheck(&[
        "--url",
        &format!("http://probe:{secret}@127.0.0.1:{port}/readyz"),
    ]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        !said.contains(secret) && said.contains("probe:***@127.0.0.1"),
        "{said}"
    );
}
