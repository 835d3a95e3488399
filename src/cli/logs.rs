//! `driftless logs TARGET [--run N]`: a run's whole output as it was kept
//! (`tick::output`), read from the state database — the newest run of the
//! target, or run N. Its exit code is the run's result: 0 changed or no
//! change (or still going), 1 any failure. Reads only.

use super::{Report, failed, readable};
use crate::app::App;
use crate::tick::TickError;

pub async fn logs(app: &App, target: &str, run: Option<i64>) -> Result<Report, TickError> {
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
    let code = match r.result.as_deref() {
        None | Some("changed") | Some("no_change") => 0,
        Some(_) => 1,
    };
    Ok(Report { stdout: out, code })
}
