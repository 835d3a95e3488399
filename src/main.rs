//! The `driftless` binary: parse the command line, load the config, start
//! logging, call into the library. No reconcile logic lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};

use driftless::app::App;
use driftless::cli;
use driftless::config::{self, DEFAULT_CONFIG_PATH};
use driftless::model::Trigger;
use driftless::store::{Operation, Usage};
use driftless::tick::Reconciler;

#[derive(Parser)]
#[command(
    name = "driftless",
    version,
    about = "GitOps for infrastructure outside Kubernetes"
)]
struct Args {
    /// The configuration file.
    #[arg(long, global = true, env = "DRIFTLESS_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    config: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: interval scheduler, workers, HTTP endpoints.
    Serve,
    /// Reconcile targets once, now, in dependency order (for systemd timers
    /// and cron). Exit 0: no_change/changed; 1: failed or blocked; 75: a
    /// target's lock is held elsewhere.
    Tick {
        /// Target names.
        #[arg(required_unless_present = "all", add = ArgValueCandidates::new(target_names))]
        targets: Vec<String>,
        /// Every configured target, one after another in dependency order.
        #[arg(long, conflicts_with = "targets")]
        all: bool,
        /// Apply now even outside the targets' change windows (`windows`);
        /// the run's trigger says `override`.
        #[arg(long)]
        override_window: bool,
    },
    /// Per target: the commit last applied and how the last run went.
    Status {
        /// Print JSON (an array of objects) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The runs of one target, newest first.
    History {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Print JSON, with each run's output tail.
        #[arg(long)]
        json: bool,
        /// How many runs to show, newest first.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// A run's whole output, as it was kept: the target's newest run, or
    /// run N; with -f, a run still going is followed until it ends. Exit 0:
    /// it changed something, nothing, or still goes; 1: it failed.
    Logs {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// This run (an id from `history`) instead of the newest.
        #[arg(long)]
        run: Option<i64>,
        /// Follow a run still going: print its output as it comes until it
        /// ends (a progress line on a terminal), then exit as it ended.
        #[arg(short, long)]
        follow: bool,
    },
    /// What applying a target's branch tip now would change, changing
    /// nothing: the backend's own plan, for every backend that can plan.
    /// Exit 0: no changes; 2: changes; 1: failed, or the target cannot plan
    /// (an exec or pi target without a `plan` command); 75: a tick holds
    /// the target's lock.
    Plan {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Print JSON: commit, changes, destructive, plan_hash, summary, diff.
        #[arg(long)]
        json: bool,
    },
    /// What a target exposes (terraform outputs, the exec command's JSON).
    Outputs {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Print the JSON object as is.
        #[arg(long)]
        json: bool,
    },
    /// Tear a target down (at the commit last applied). Its recorded outputs
    /// are forgotten and the targets that depend on it are blocked until it
    /// is applied again: with any, it is refused without --force.
    Destroy {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Required: destroying is not undone by anything.
        #[arg(long)]
        yes: bool,
        /// Destroy it although other targets depend on it (they are blocked
        /// until it is applied again).
        #[arg(long)]
        force: bool,
    },
    /// Validate the configuration and list every problem.
    Check,
    /// Print the order targets converge in (`depends_on`): numbered steps,
    /// the targets of one step independent of each other.
    Graph {
        /// Print the graph in Graphviz's DOT language instead.
        #[arg(long)]
        dot: bool,
    },
    /// Stop webhooks and intervals from ticking a target (manual API
    /// reconciles answer 409) until it is resumed; with --job, only keep
    /// driftless from registering or approving that Nomad job.
    Pause {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// A Nomad job of the target (its job ID), instead of the whole target.
        #[arg(long)]
        job: Option<String>,
    },
    /// Let a paused target (or Nomad job) tick again.
    Resume {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// A Nomad job of the target (its job ID), instead of the whole target.
        #[arg(long)]
        job: Option<String>,
    },
    /// Deployments of every backend (Nomad's, and the plans of targets
    /// whose policy waits for approval), newest first (through the API: the
    /// daemon must be running; token from DRIFTLESS_TOKEN).
    Deployments {
        /// Only the ones waiting for a person (to approve or to promote).
        #[arg(long)]
        pending: bool,
        /// Print JSON, diffs included (redacted).
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending deployment: shows its plan, then approves exactly
    /// that plan (through the API; token from DRIFTLESS_TOKEN).
    Approve {
        /// The deployment's id (from `driftless deployments --pending`).
        id: i64,
    },
    /// Queue a reconcile of a target through the running daemon (token
    /// from DRIFTLESS_TOKEN, scope `reconcile:<target>`).
    Reconcile {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Start it now even outside the target's change window (scope
        /// `override:<target>`); the run's trigger says `override`.
        #[arg(long)]
        now: bool,
        /// Wait this long for the result (`60s`, `5m`; at most 1h).
        #[arg(long)]
        wait: Option<String>,
    },
    /// Reject a pending deployment (through the API).
    Reject {
        /// The deployment's id.
        id: i64,
    },
    /// Try again what failed or was rejected at a target's branch tip (a
    /// plan, a Nomad spec) without a new push: a one-shot tick, as `tick`;
    /// under an approval policy its new plan waits for approval.
    Retry {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Accept the branch tip its newest run refused for not descending
        /// from the commit last applied (a force push under `verify`):
        /// that commit, and no other, may be applied.
        #[arg(long)]
        accept_rewind: bool,
    },
    /// The append-only record of a target's deployment state changes, for
    /// every backend that plans (Nomad's deployments and the plans that wait
    /// for a person): who, what, when, from which state.
    Events {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Start a target clean: its checkout (with its untracked files, such
    /// as terraform's local state), preview checkout, plan files and
    /// followed-tag note removed, and what it last applied forgotten (its
    /// runs stay). For a target whose `repo` changed, or a removed
    /// target's name given to a new one.
    Forget {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
    },
    /// Rollouts in waves ([[target_sets]] and [[groups]] entries with a
    /// `rollout`): where each is, and a person's resume or abort.
    Rollout {
        #[command(subcommand)]
        command: RolloutCommand,
    },
    /// Policies as code ([[policies]]): their own tests, or what they make
    /// of a target's plan.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Ask the running daemon's /readyz (at the configured server.listen,
    /// or --url): a container's HEALTHCHECK, without curl. Exit 0: ready;
    /// 1: not ready, or no answer within 5 s.
    Healthcheck {
        /// Ask this URL instead (e.g. http://127.0.0.1:8080/readyz).
        #[arg(long)]
        url: Option<String>,
    },
    /// Print the script that completes driftless's commands, flags and
    /// target names in SHELL (`source <(driftless completions bash)`); as
    /// you type, the script asks this binary, which reads the target names
    /// from the configuration (--config, DRIFTLESS_CONFIG or the default).
    Completions {
        /// The shell.
        shell: Shell,
    },
    /// Print the manual page (roff: `driftless man | man -l -`), or with
    /// --dir write a page for every command there (driftless.1,
    /// driftless-tick.1, …).
    Man {
        /// Write every command's page into this directory instead.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The configuration file's own tools.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// API tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Notifications.
    Notify {
        #[command(subcommand)]
        command: NotifyCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the configuration's JSON Schema (draft 7), made from the
    /// structs `check` reads each table into: save it and name it on the
    /// file's first line (`#:schema ./driftless.schema.json`) for taplo or
    /// Even Better TOML to complete and check every key.
    Schema,
}

/// The shells `completions` writes for.
#[derive(Clone, Copy, ValueEnum)]
enum Shell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Subcommand)]
enum RolloutCommand {
    /// Each rollout's commit, state and wave, and where each member is.
    Status {
        /// Only this rollout (its set's or group's `name`).
        name: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Try a halted rollout's wave again: its failed members are retried,
    /// and the rollout goes on once the wave is applied and healthy.
    Resume {
        /// The set's or group's `name`.
        name: String,
    },
    /// Stop a rollout: the waves it has not reached stay at the commit
    /// they have until a newer commit starts a rollout of its own.
    Abort {
        /// The set's or group's `name`.
        name: String,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Run every policy's `test_*` rules (exit 1 when one fails).
    Test {
        /// Only this policy (its `name`).
        name: Option<String>,
    },
    /// Evaluate the policies covering TARGET against a fresh plan of it, or
    /// against a recorded plan document (exit 1 when they deny it).
    Eval {
        /// The target's name.
        #[arg(add = ArgValueCandidates::new(target_names))]
        target: String,
        /// A plan document recorded by `driftless plan --json` (the whole
        /// output or its `document`).
        #[arg(long)]
        input: Option<std::path::PathBuf>,
        /// Print the document and the outcome as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum NotifyCommand {
    /// Send a test event through one notifier now and report the outcome.
    Test {
        /// The notifier's name, as in `[[notifiers]]`.
        notifier: String,
    },
    /// List the notifications waiting in the outbox.
    Pending {
        /// Include the ones given up after too many attempts.
        #[arg(long)]
        all: bool,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a fresh token and the [[tokens]] entry (its digest) for the config.
    New {
        /// A name for the token (it appears in logs and pause records).
        name: String,
    },
}

/// mimalloc rather than glibc's malloc: faster for the many small, short
/// allocations of a request (Cargo.toml says what it was measured at).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A command's keeper (on PostgreSQL): no config, no logging, no clap.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == driftless::keeper::ARG) {
        return driftless::keeper::main(&argv[2..]);
    }
    // A shell completing a command line (the script `completions`
    // printed sets COMPLETE): answer it and exit.
    clap_complete::CompleteEnv::with_factory(Args::command).complete();
    let args = Args::parse();
    if let Some(code) = without_config(&args.command) {
        return code;
    }
    let default_level = match args.command {
        Command::Serve | Command::Tick { .. } | Command::Retry { .. } | Command::Destroy { .. } => {
            "info"
        }
        _ => "warn",
    };
    // PostgreSQL's notices ("relation … already exists, skipping" at every
    // start's migration check) are not news, unless asked for by name.
    let quiet = "sqlx::postgres::notice=warn"
        .parse()
        .expect("a valid directive");
    let asked = std::env::var("RUST_LOG").is_ok_and(|v| v.contains("sqlx"));
    let mut filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    if !asked {
        filter = filter.add_directive(quiet);
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    // The daemon serves many things at once; a one-shot command waits on
    // one thing at a time (its backends are child processes, git reads and
    // SQLite have threads of their own), and one runtime thread spares it
    // the hand-offs between worker threads.
    let mut builder = match args.command {
        Command::Serve => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(cli::EXIT_FAILED);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", driftless::redact::printable(&said(&e)));
            ExitCode::from(cli::EXIT_FAILED)
        }
    }
}

/// The commands that need no configuration, run before logging and the
/// runtime start: `None` for every other command.
fn without_config(command: &Command) -> Option<ExitCode> {
    use clap_complete::env::EnvCompleter;
    let mut out = std::io::stdout().lock();
    let written = match command {
        Command::Completions { shell } => {
            let shell: &dyn EnvCompleter = match shell {
                Shell::Bash => &clap_complete::env::Bash,
                Shell::Zsh => &clap_complete::env::Zsh,
                Shell::Fish => &clap_complete::env::Fish,
            };
            shell.write_registration("COMPLETE", "driftless", "driftless", "driftless", &mut out)
        }
        Command::Man { dir: None } => clap_mangen::Man::new(Args::command()).render(&mut out),
        Command::Man { dir: Some(dir) } => std::fs::create_dir_all(dir)
            .and_then(|()| clap_mangen::generate_to(Args::command(), dir))
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
        Command::Config {
            command: ConfigCommand::Schema,
        } => serde_json::to_writer_pretty(&mut out, &config::json_schema())
            .map_err(std::io::Error::from)
            .and_then(|()| std::io::Write::write_all(&mut out, b"\n")),
        _ => return None,
    };
    Some(match written {
        Ok(()) => ExitCode::SUCCESS,
        // `driftless man | head`: the reader had what it wanted.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(cli::EXIT_FAILED)
        }
    })
}

/// The target names a shell offers where a command takes a target: those
/// of the configuration the command line being completed names (its
/// `--config`, else DRIFTLESS_CONFIG, else the default path).
fn target_names() -> Vec<CompletionCandidate> {
    // Asked as `COMPLETE=bash driftless -- driftless [the words so far]`.
    let words: Vec<std::ffi::OsString> = std::env::args_os()
        .skip_while(|a| a != "--")
        .skip(1)
        .collect();
    let mut path = None;
    for (i, w) in words.iter().enumerate() {
        let w = w.to_string_lossy();
        if w == "--config" {
            path = words.get(i + 1).map(PathBuf::from);
        } else if let Some(p) = w.strip_prefix("--config=") {
            path = Some(PathBuf::from(p));
        }
    }
    let path = path
        .or_else(|| std::env::var_os("DRIFTLESS_CONFIG").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
    config::target_names(&path)
        .into_iter()
        .map(CompletionCandidate::new)
        .collect()
}

/// An error and its causes on one line, each cause once: most errors here
/// already say their cause in their own message, which `{:#}` would
/// repeat ("…: BadSignature: …: BadSignature: BadSignature").
fn said(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !out.contains(&cause) {
            out.push_str(": ");
            out.push_str(&cause);
        }
    }
    out
}

/// `destroy`'s own checks: confirmed with --yes, and with --force when
/// other targets depend on it (they stay blocked); what follows is said.
fn may_destroy(app: &App, target: &str, yes: bool, force: bool) -> anyhow::Result<()> {
    if !yes {
        anyhow::bail!(
            "destroy tears down everything target `{target}` manages; pass --yes to confirm"
        );
    }
    let settings = app.settings();
    let dependents: Vec<String> = settings
        .dependents(target)
        .iter()
        .map(|t| format!("`{}`", t.name))
        .collect();
    if !dependents.is_empty() {
        let list = dependents.join(", ");
        if !force {
            anyhow::bail!(
                "{list} depend(s) on `{target}`: destroying it leaves them blocked until \
                 `{target}` is applied again; pass --force to go on"
            );
        }
        eprintln!("note: {list} stay(s) blocked until `{target}` is applied again");
    }
    eprintln!(
        "note: a running daemon will apply `{target}` again at its next tick unless you remove it from the configuration"
    );
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<u8> {
    if let Command::Check = args.command {
        let r = cli::check(&args.config).await;
        print!("{}", driftless::redact::printable(&r.stdout));
        return Ok(r.code);
    }
    if let Command::Healthcheck { url } = &args.command {
        let r = cli::healthcheck(&args.config, url.as_deref()).await;
        print!("{}", driftless::redact::printable(&r.stdout));
        return Ok(r.code);
    }
    if let Command::Graph { dot } = args.command {
        let r = cli::graph(&args.config, dot);
        print!("{}", driftless::redact::printable(&r.stdout));
        return Ok(r.code);
    }
    if let Command::Token {
        command: TokenCommand::New { name },
    } = &args.command
    {
        let r = cli::token_new(name);
        print!("{}", driftless::redact::printable(&r.stdout));
        return Ok(r.code);
    }
    let settings = config::load(&args.config)?;
    let usage = match args.command {
        Command::Serve => Usage::Serve,
        _ => Usage::Command,
    };
    let app = App::open_for(settings, usage)
        .await
        .context("cannot open the state database")?;
    // Only the commands that converge get git.
    let rec = || Reconciler::new(app.clone());
    let report = match args.command {
        Command::Serve => {
            driftless::daemon::serve(rec()).await?;
            return Ok(0);
        }
        Command::Tick {
            targets,
            all,
            override_window,
        } => {
            let trigger = if override_window {
                Trigger::Override
            } else {
                Trigger::Cli
            };
            cli::tick(&rec(), &targets, all, Operation::Apply, trigger).await?
        }
        Command::Status { json } => cli::status(&app, json).await?,
        Command::History {
            target,
            json,
            limit,
        } => cli::history(&app, &target, json, limit).await?,
        Command::Logs {
            target,
            run,
            follow,
        } => cli::logs(&app, &target, run, follow).await?,
        Command::Plan { target, json } => cli::plan(&rec(), &target, json).await?,
        Command::Outputs { target, json } => cli::outputs(&rec(), &target, json).await?,
        Command::Destroy { target, yes, force } => {
            may_destroy(&app, &target, yes, force)?;
            cli::tick(&rec(), &[target], false, Operation::Destroy, Trigger::Cli).await?
        }
        Command::Check => cli::check(&args.config).await,
        Command::Graph { dot } => cli::graph(&args.config, dot),
        Command::Token {
            command: TokenCommand::New { name },
        } => cli::token_new(&name),
        Command::Notify {
            command: NotifyCommand::Test { notifier },
        } => cli::notify_test(&app, &notifier).await?,
        Command::Notify {
            command: NotifyCommand::Pending { all },
        } => cli::notify_pending(&app, all).await?,
        Command::Pause { target, job } => cli::pause(&app, &target, job.as_deref(), true).await?,
        Command::Resume { target, job } => cli::pause(&app, &target, job.as_deref(), false).await?,
        Command::Deployments { pending, json } => cli::deployments(&app, pending, json).await,
        Command::Approve { id } => cli::approve_or_reject(&app, id, true).await,
        Command::Reject { id } => cli::approve_or_reject(&app, id, false).await,
        Command::Policy { command } => match command {
            PolicyCommand::Test { name } => cli::policy_test(&app, name.as_deref()),
            PolicyCommand::Eval {
                target,
                input,
                json,
            } => cli::policy_eval(&rec(), &target, input.as_deref(), json).await?,
        },
        Command::Rollout { command } => match command {
            RolloutCommand::Status { name, json } => {
                cli::rollout_status(&app, name.as_deref(), json).await?
            }
            RolloutCommand::Resume { name } => cli::rollout_decide(&app, &name, true).await?,
            RolloutCommand::Abort { name } => cli::rollout_decide(&app, &name, false).await?,
        },
        Command::Reconcile { target, now, wait } => {
            cli::reconcile(&app, &target, now, wait.as_deref()).await
        }
        Command::Retry {
            target,
            accept_rewind,
        } => {
            if accept_rewind {
                cli::accept_rewind(&app, &target).await?;
            }
            cli::tick(&rec(), &[target], false, Operation::Apply, Trigger::Retry).await?
        }
        Command::Events { target, json } => cli::events(&app, &target, json).await?,
        Command::Completions { .. }
        | Command::Man { .. }
        | Command::Healthcheck { .. }
        | Command::Config { .. } => {
            unreachable!("run those before the configuration is loaded")
        }
        Command::Forget { target } => cli::forget(&rec(), &target).await?,
    };
    // Done with the database: closed, so the next command need not read
    // the write-ahead log this one leaves (`Store::close`).
    app.store.close().await;
    print!("{}", driftless::redact::printable(&report.stdout));
    Ok(report.code)
}
