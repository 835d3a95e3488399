//! `driftless logs TARGET [--run N] [-f]`: a run's whole output as it was
//! kept (`tick::output`), read from the state database — the newest run of
//! the target, or run N. With `-f` a run still going is followed: its new
//! output printed as it is written (by this machine's daemon or one-shot
//! tick, or on PostgreSQL by any instance), with a progress line (elapsed,
//! lines) on a terminal's stderr, until it ends. Its exit code is the
//! run's result: 0 changed or no change (or still going, without `-f`), 1
//! any failure. Reads only.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use super::{Report, failed, readable};
use crate::app::App;
use crate::store::Run;
use crate::tick::TickError;

/// How often a followed run's new output is read.
const PACE: Duration = Duration::from_millis(250);

pub async fn logs(
    app: &App,
    target: &str,
    run: Option<i64>,
    follow: bool,
) -> Result<Report, TickError> {
    readable(app, target).await?;
    let found = match run {
        Some(id) => app.store.run(id).await?.filter(|r| r.target == target),
        None => app.store.history(target, 1).await?.into_iter().next(),
    };
    let Some(r) = found else {
        return Ok(failed(match run {
            Some(id) => format!("target `{target}` has no run {id}"),
            None => format!("target `{target}` has no runs yet"),
        }));
    };
    if follow && r.result.is_none() {
        return follow_run(app, r).await;
    }
    let chunks = app.store.run_output(r.id, 0).await?;
    let mut out: String = chunks.into_iter().map(|c| c.data).collect();
    if out.is_empty() {
        // Runs from before output was kept, or that started no command.
        out = match r.output_tail.as_deref().filter(|t| !t.is_empty()) {
            Some(tail) => format!(
                "[driftless: run {} kept no output; its tail:]\n{tail}\n",
                r.id
            ),
            None => format!("[driftless: run {} started no command]\n", r.id),
        };
    }
    Ok(Report {
        stdout: out,
        code: exit_code(&r),
    })
}

fn exit_code(r: &Run) -> u8 {
    match r.result.as_deref() {
        None | Some("changed") | Some("no_change") => 0,
        Some(_) => 1,
    }
}

/// Print run `r`'s output as it comes until the run has a result. The run
/// is read before its output: once it has a result, every chunk was
/// written before it.
async fn follow_run(app: &App, r: Run) -> Result<Report, TickError> {
    let mut progress = Progress::new(std::io::stderr().is_terminal(), r.started_at);
    let (mut id, mut cursor) = (r.id, 0);
    let ended = loop {
        let now = match app.store.run(id).await? {
            Some(run) => run,
            // Folded into the unchanged run before it (`store::runs::fold`),
            // its output with it: that row is how it ended.
            None => match app.store.folded_into(&r.target, r.id).await? {
                Some(into) => into,
                None => {
                    progress.clear();
                    return Ok(failed(format!("run {id} is no longer recorded")));
                }
            },
        };
        id = now.id;
        for c in app.store.run_output(id, cursor).await? {
            cursor = c.seq;
            progress.print(&c.data);
        }
        if now.result.is_some() {
            break now;
        }
        progress.show();
        tokio::time::sleep(PACE).await;
    };
    progress.clear();
    // How it ended, beside (not inside) the output a pipe may be keeping.
    let _ = writeln!(
        std::io::stderr(),
        "run {}: {}",
        ended.id,
        ended.result.as_deref().unwrap_or("ended")
    );
    Ok(Report {
        stdout: String::new(),
        code: exit_code(&ended),
    })
}

/// Output to stdout as it comes; on a terminal, a line on stderr saying
/// how long the run has gone and how many lines it printed.
struct Progress {
    tty: bool,
    started_ms: i64,
    lines: usize,
    shown: bool,
    since: Instant,
}

impl Progress {
    fn new(tty: bool, started_ms: i64) -> Progress {
        Progress {
            tty,
            started_ms,
            lines: 0,
            shown: false,
            since: Instant::now(),
        }
    }

    fn print(&mut self, text: &str) {
        self.clear();
        self.lines += text.matches('\n').count();
        let mut out = std::io::stdout().lock();
        // A reader that went away (a closed pipe) ends nothing here: the
        // run goes on, and so does the loop until it ends.
        let _ = out.write_all(text.as_bytes());
        let _ = out.flush();
    }

    fn show(&mut self) {
        if !self.tty {
            return;
        }
        let elapsed = (crate::store::now_ms() - self.started_ms).max(0) / 1000;
        let spin = ["|", "/", "-", "\\"][(self.since.elapsed().as_millis() / 250 % 4) as usize];
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[K{spin} running {}m{:02}s · {} lines",
            elapsed / 60,
            elapsed % 60,
            self.lines
        );
        let _ = err.flush();
        self.shown = true;
    }

    fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
            self.shown = false;
        }
    }
}
