//! `driftless rollout status|resume|abort`: rollouts in waves, read from
//! the state database and moved there (as `pause` is), the person's
//! decision recorded with the rollout.

use super::*;

/// `driftless rollout status [NAME] [--json]`: each rollout's commit,
/// state and wave, and where each member is.
pub async fn rollout_status(
    app: &App,
    name: Option<&str>,
    as_json: bool,
) -> Result<Report, TickError> {
    let mut all = crate::status::rollouts(app).await?;
    if let Some(n) = name {
        all.retain(|(u, _)| u == n);
        if all.is_empty() {
            return Ok(failed(format!(
                "no [[target_sets]] or [[groups]] entry named `{n}` has a rollout"
            )));
        }
    }
    if as_json {
        let views: Vec<_> = all.iter().filter_map(|(_, v)| v.as_ref()).collect();
        return Ok(Report {
            stdout: serde_json::to_string_pretty(&views).unwrap_or_else(|_| "[]".into()) + "\n",
            code: 0,
        });
    }
    let mut out = String::new();
    for (unit, view) in &all {
        let Some(v) = view else {
            let _ = writeln!(
                out,
                "{unit}: not started (the daemon starts it at its first look)"
            );
            continue;
        };
        let _ = writeln!(
            out,
            "{unit}: {} {} at wave {} of {} (pause {}){}",
            crate::model::short_sha(&v.sha),
            v.state,
            v.wave,
            v.waves,
            v.pause,
            v.reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        );
        for w in 1..=v.waves {
            let line: Vec<String> = v
                .members
                .iter()
                .filter(|m| m.wave == w)
                .map(|m| match &m.why {
                    Some(why) => format!("{} ({}: {why})", m.target, m.state),
                    None => format!("{} ({})", m.target, m.state),
                })
                .collect();
            let _ = writeln!(out, "  wave {w}: {}", line.join(", "));
        }
    }
    Ok(Report {
        stdout: out,
        code: 0,
    })
}

/// `driftless rollout resume|abort NAME`.
pub async fn rollout_decide(app: &App, name: &str, resume: bool) -> Result<Report, TickError> {
    if app.settings().rollout_unit(name).is_none() {
        return Ok(failed(format!(
            "no [[target_sets]] or [[groups]] entry named `{name}` has a rollout"
        )));
    }
    let by = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    Ok(
        match crate::tick::decide_rollout(app, name, resume, &by).await? {
            Ok(r) => Report {
                stdout: format!(
                    "{name}: {} {} at wave {}{}\n",
                    crate::model::short_sha(&r.sha),
                    r.state.as_str(),
                    r.wave,
                    r.reason.map(|x| format!(": {x}")).unwrap_or_default()
                ),
                code: 0,
            },
            Err(why) => failed(why),
        },
    )
}
