//! `GET /targets/{name}` and `GET /runs/{id}`: one target — its row, its
//! configuration in short (backend, where it comes from, policy, windows,
//! health, dependencies linked), its open plan with the Approve/Reject
//! buttons, its running run's output (live with the script), its runs —
//! and one run's whole output. Shown only to a viewer who may read the
//! target; this module reads and renders, and decides nothing.

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::rows::{self, path_segment};
use super::{AppState, Buttons, Caller, escape, head, html, refusal, viewer};
use crate::auth::Verb;
use crate::config::Settings;
use crate::http::caller::ApiError;
use crate::store::Run;
use crate::store::deployments::StoredPlan;

/// Who looks, when they may read `target`; else the refusal.
pub(super) fn reader(
    settings: &Settings,
    caller: Result<Caller, ApiError>,
    target: &str,
) -> Result<Option<Caller>, Box<Response>> {
    let v = viewer(settings, caller)?;
    may_read(v, target)
}

/// `viewer` (from [`viewer`]), when it may read `target`.
pub(super) fn may_read(v: Option<Caller>, target: &str) -> Result<Option<Caller>, Box<Response>> {
    if let Some(c) = &v
        && !c.may(Verb::Read, target)
    {
        return Err(Box::new(refusal(
            StatusCode::FORBIDDEN,
            &format!("Token `{}` may not read this target.", c.name()),
        )));
    }
    Ok(v)
}

/// Run `id`, for a viewer who may read its target; else the refusal.
pub(super) async fn readable_run(
    s: &AppState,
    caller: Result<Caller, ApiError>,
    id: i64,
) -> Result<Run, Box<Response>> {
    let v = viewer(&s.app.settings(), caller)?;
    let run = match s.app.store.run(id).await {
        Ok(Some(r)) => r,
        Ok(None) => return Err(Box::new(refusal(StatusCode::NOT_FOUND, "No such run."))),
        Err(e) => return Err(Box::new(unavailable(e))),
    };
    may_read(v, &run.target)?;
    Ok(run)
}

pub(super) fn unavailable(e: impl std::fmt::Display) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
}

/// `GET /targets/{name}`
pub(crate) async fn target_page(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
) -> Response {
    let settings = s.app.settings();
    let viewer = match reader(&settings, caller, &name) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(target) = settings.target(&name) else {
        return refusal(StatusCode::NOT_FOUND, "No such target.");
    };
    let board = match super::board(&s, viewer.as_ref()).await {
        Ok(b) => b,
        Err(e) => return unavailable(e),
    };
    let runs = match s.app.store.history(&name, 30).await {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    // The running run's output so far, read before anything is rendered.
    let mut live = String::new();
    if let Some(r) = runs.iter().find(|r| r.result.is_none()) {
        let _ = write!(
            live,
            "<h2 id=\"run-heading\">Running now: <a href=\"/runs/{id}\">run {id}</a></h2>",
            id = r.id
        );
        if let Err(e) = output_block(&mut live, &s, r).await {
            return unavailable(e);
        }
    }
    let readable = |t: &str| viewer.as_ref().is_none_or(|c| c.may(Verb::Read, t));
    let now = crate::store::now_ms();
    let cx = rows::Ctx {
        settings: &settings,
        now_ms: now,
        may_read: &readable,
        awaiting: &board.awaiting,
    };
    let mut h = head(&format!("{name} · driftless"));
    let _ = write!(
        h,
        "<p><a href=\"/\">← every target</a></p><h1>{}</h1>\
         <main id=\"board\" data-events=\"/events?target={}\"><div class=\"scroll\">\
         <table class=\"targets\">{}<tbody id=\"g-one\">",
        escape(&name),
        escape(&path_segment(&name)),
        super::TARGETS_HEAD,
    );
    if let Some(t) = board.targets.iter().find(|t| t.name == name) {
        h.push_str(&rows::row(t, &cx));
    }
    h.push_str("</tbody></table></div></main>");
    config_summary(&mut h, target, &settings, &readable);

    let plans: Vec<&StoredPlan> = board.waiting.iter().filter(|p| p.target == name).collect();
    let promote: Vec<&StoredPlan> = board
        .to_promote
        .iter()
        .filter(|p| p.target == name)
        .collect();
    if !plans.is_empty() || !promote.is_empty() {
        h.push_str("<h2>Open plan</h2>");
        let buttons = Buttons {
            viewer: viewer.as_ref(),
            key: &s.csrf_key,
        };
        super::approval_cards(&mut h, &plans, &buttons, &super::base_url(&s));
        super::promotion_cards(&mut h, &promote, &buttons);
    }
    h.push_str(&live);
    runs_table(&mut h, &runs, &settings, now);
    h.push_str("</body></html>\n");
    html(StatusCode::OK, h)
}

/// Backend, source, policy, windows, health and dependencies, in short.
fn config_summary(
    h: &mut String,
    t: &crate::config::Target,
    settings: &Settings,
    may_read: &dyn Fn(&str) -> bool,
) {
    let mut rows: Vec<(&str, String)> = vec![
        ("backend", escape(t.backend.kind())),
        (
            "repository",
            format!(
                "<code>{}</code>",
                escape(&crate::redact::url_without_password(&t.repo))
            ),
        ),
        (
            if t.tag.is_some() { "tags" } else { "branch" },
            format!(
                "<code>{}</code>",
                escape(t.tag.as_deref().unwrap_or(&t.branch))
            ),
        ),
        (
            "path",
            match t.path.to_string_lossy() {
                p if p.is_empty() => "the repository's root".to_string(),
                p => format!("<code>{}</code>", escape(&p)),
            },
        ),
        ("policy", escape(t.policy.as_str())),
    ];
    let policies: Vec<String> = settings
        .policies_for(&t.name)
        .iter()
        .map(|p| format!("<code>{}</code>", escape(&p.name)))
        .collect();
    if !policies.is_empty() {
        rows.push(("policies", policies.join(", ")));
    }
    if !t.windows.is_empty() {
        rows.push(("windows", escape(&t.windows.words())));
    }
    if let Some(hc) = &t.health {
        rows.push((
            "health",
            format!(
                "{} check(s), on unhealthy: {}",
                hc.checks.len(),
                hc.on_unhealthy.as_str()
            ),
        ));
    }
    let deps: Vec<String> = t
        .depends_on
        .iter()
        .filter(|d| may_read(d))
        .map(|d| {
            format!(
                "<a href=\"/targets/{}\">{}</a>",
                escape(&path_segment(d)),
                escape(d)
            )
        })
        .collect();
    if !deps.is_empty() {
        rows.push(("depends on", deps.join(", ")));
    }
    h.push_str("<h2>Configuration</h2><dl class=\"config\">");
    for (k, v) in rows {
        let _ = write!(h, "<dt>{k}</dt><dd>{v}</dd>");
    }
    h.push_str("</dl>");
}

/// The runs, newest first, each opening its whole output.
fn runs_table(h: &mut String, runs: &[Run], settings: &Settings, now: i64) {
    h.push_str(
        "<h2>Runs</h2><div class=\"scroll\"><table><thead><tr><th>run</th><th>result</th>\
         <th>trigger</th><th>commit</th><th>started</th><th>took</th></tr></thead><tbody id=\"runs\">",
    );
    if runs.is_empty() {
        h.push_str("<tr><td colspan=\"6\">No runs yet.</td></tr>");
    }
    for r in runs {
        let (word, class) = match r.result.as_deref() {
            None => ("running", "live"),
            Some("changed") => ("changed", "good"),
            Some("no_change") => ("no change", "good"),
            Some(other) => (other, "bad"),
        };
        let repeats = if r.repeats > 1 {
            format!(" <small>×{}</small>", r.repeats)
        } else {
            String::new()
        };
        let _ = write!(
            h,
            "<tr id=\"run-{id}\"><td><a href=\"/runs/{id}\">{id}</a></td>\
             <td><span class=\"state {class}\">{word}</span>{repeats}</td><td>{trigger}</td>\
             <td>{commit}</td><td>{started}</td><td>{took}</td></tr>",
            id = r.id,
            word = escape(word),
            trigger = escape(&r.trigger),
            commit = rows::commit_html(settings, &r.target, r.sha.as_deref()),
            started = rows::time_html(now, r.started_at),
            took = r.duration_ms.map_or_else(
                || "-".to_string(),
                |ms| format!("{:.1} s", ms as f64 / 1000.0)
            ),
        );
    }
    h.push_str("</tbody></table></div>");
}

/// A run's output as kept so far; a running run's followed by the script
/// from the last chunk shown.
async fn output_block(
    h: &mut String,
    s: &AppState,
    r: &Run,
) -> Result<(), crate::store::StoreError> {
    let chunks = s.app.store.run_output(r.id, 0).await?;
    let last = chunks.last().map_or(0, |c| c.seq);
    let mut text: String = chunks.into_iter().map(|c| c.data).collect();
    if text.is_empty() && r.result.is_some() {
        text = match r.output_tail.as_deref().filter(|t| !t.is_empty()) {
            Some(tail) => format!("[driftless: this run kept no output; its tail:]\n{tail}\n"),
            None => "[driftless: this run started no command]\n".into(),
        };
    }
    let follow = if r.result.is_none() {
        format!(
            " data-run=\"{id}\" data-follow=\"/runs/{id}/events?after={last}\"",
            id = r.id
        )
    } else {
        String::new()
    };
    let _ = write!(
        h,
        "<pre id=\"output\" class=\"output\" tabindex=\"0\" aria-live=\"polite\"{follow}>{}</pre>\
         <p id=\"run-end\"></p>",
        escape(&text)
    );
    Ok(())
}

/// `GET /runs/{id}`
pub(crate) async fn run_page(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(id): Path<i64>,
) -> Response {
    let run = match readable_run(&s, caller, id).await {
        Ok(r) => r,
        Err(r) => return *r,
    };
    let settings = s.app.settings();
    let now = crate::store::now_ms();
    let mut h = head(&format!("run {id} of {} · driftless", run.target));
    let result = run.result.as_deref().unwrap_or("running");
    let _ = write!(
        h,
        "<p><a href=\"/targets/{seg}\">← {name}</a></p><h1>Run {id} of {name}</h1>\
         <dl class=\"config\"><dt>result</dt><dd><span id=\"run-result\" class=\"state\">{result}</span></dd>\
         <dt>trigger</dt><dd>{trigger}</dd><dt>commit</dt><dd>{commit}</dd>\
         <dt>started</dt><dd>{started}</dd><dt>message</dt><dd>{message}</dd></dl><h2>Output</h2>",
        seg = escape(&path_segment(&run.target)),
        name = escape(&run.target),
        result = escape(result),
        trigger = escape(&run.trigger),
        commit = rows::commit_html(&settings, &run.target, run.sha.as_deref()),
        started = rows::time_html(now, run.started_at),
        message = escape(run.message.as_deref().unwrap_or("")),
    );
    if let Err(e) = output_block(&mut h, &s, &run).await {
        return unavailable(e);
    }
    h.push_str("</body></html>\n");
    html(StatusCode::OK, h)
}
