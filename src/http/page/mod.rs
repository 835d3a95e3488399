//! The page for people, rendered on the server: `GET /` (every target the
//! viewer may read, grouped by state — failing first — and every
//! deployment waiting for a person), `/targets/{name}` (a target's
//! configuration, runs and open plan) and `/runs/{id}` (a run's whole
//! output). It works without JavaScript; the small script it serves itself
//! (`/assets/page.js`, no build chain, no CDN) keeps rows and a running
//! run's output live through Server-Sent Events (`page::events`). By
//! default (`[server] page = "token"`) it asks for a token with a `read`
//! scope (HTTP Basic, the token as the password, so a browser can ask) and
//! shows only what that token may read — rows, runs and streams alike;
//! `"open"` shows every target to anyone, `"off"` answers 404. It never
//! shows a secret (output and diffs are redacted before they are stored).
//!
//! A viewer whose token may approve a target also gets an Approve and a
//! Reject button per waiting deployment: `POST /deployments/{id}/{verb}`, a
//! form whose CSRF token is an HMAC (a per-process key) over the viewer's
//! token name, the deployment, the verb and the plan hash; a request that
//! a browser marks as coming from another site, or whose `Origin` (else
//! `Referer`) is not the page's own origin, is refused as well. The
//! decision is the API's (`api::decide`): nothing is applied here.

mod events;
mod rows;
mod target;

pub(crate) use events::Boards;
pub(super) use events::{board_events, run_events};
pub(super) use target::{run_page, target_page};

use std::fmt::Write as _;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hmac::{Hmac, Mac};
use serde::Deserialize;

use super::AppState;
use super::api;
use super::caller::{ApiError, Caller};
use crate::auth::Verb;
use crate::config::PageAccess;
use crate::status;
use crate::store::deployments::StoredPlan;

/// Escape text for HTML element content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = ":root{color-scheme:light dark;--fg:#1d1d1f;--bg:#fff;--mute:#666;--line:#ddd;--pre:#f4f4f4;\
--bad:#b00020;--good:#0b6e4f;--wait:#8a5a00;--live:#0b57d0}\
@media (prefers-color-scheme:dark){:root{--fg:#e6e6e6;--bg:#151515;--mute:#a0a0a0;--line:#333;--pre:#1f1f1f;\
--bad:#ff6b81;--good:#4cc38a;--wait:#e0b050;--live:#7aa7ff}}\
body{font-family:system-ui,sans-serif;margin:1.5em;color:var(--fg);background:var(--bg);line-height:1.4}\
a{color:var(--live)}a:focus-visible,button:focus-visible{outline:3px solid var(--live);outline-offset:2px}\
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%}\
th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid var(--line);vertical-align:top}\
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{background:var(--pre);padding:.6em;overflow-x:auto}\
pre.approve{white-space:pre-wrap;word-break:break-all}pre.output{white-space:pre-wrap;max-height:70vh;overflow-y:auto}\
.state{font-weight:600}.bad{color:var(--bad)}.good{color:var(--good)}.wait{color:var(--wait)}.live{color:var(--live)}\
.none,small,time{color:var(--mute)}tr.row-bad td:first-child{border-left:4px solid var(--bad)}\
tr.row-live td:first-child{border-left:4px solid var(--live)}tr.row-wait td:first-child{border-left:4px solid var(--wait)}\
table.targets{table-layout:fixed}table.targets td{overflow-wrap:anywhere}.c-target{width:20%}.c-backend{width:9%}\
.c-state{width:12%}.c-commit{width:12%}.c-when{width:10%}\
@media (max-width:640px){table.targets thead{display:none}table.targets tr{display:grid;grid-template-columns:1fr auto;\
border-bottom:1px solid var(--line);padding:.3em 0}table.targets td{border:0;padding:.1em .4em}\
table.targets td.msg{grid-column:1/-1}}\
.live-badge{color:var(--live);font-size:.85em;margin-left:.4em;animation:pulse 1.5s ease-in-out infinite}\
@keyframes pulse{50%{opacity:.35}}@media (prefers-reduced-motion:reduce){.live-badge{animation:none}}\
.card{border:1px solid var(--line);border-radius:6px;padding:1em;margin:1em 0}h1{font-size:1.4em}\
form.decide{display:inline-block;margin-right:.6em}form.decide button{font-size:1em;padding:.3em .9em}\
.destructive{color:var(--bad);font-weight:600}dl.config{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}\
dl.config dt{color:var(--mute)}dl.config dd{margin:0}\
@media (max-width:640px){body{margin:.6em}.wide{display:none}}";

/// The head of a table of target rows.
const TARGETS_HEAD: &str = "<thead><tr><th class=\"c-target\">target</th><th class=\"c-backend\">backend</th>\
<th class=\"c-state\">state</th><th class=\"c-commit\">applied commit</th><th class=\"c-when\">last run</th>\
<th class=\"wide\">message</th></tr></thead>";

/// The head of every page: title, style, and the script that makes it
/// live (deferred: the page is whole without it).
fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title>\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\"><style>{STYLE}</style>\
         <script src=\"/assets/page.js\" defer></script></head><body>",
        escape(title)
    )
}

/// An HTML answer: never cached, and allowed nothing but this server's
/// own script and the page's style.
fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
            ),
        ],
        body,
    )
        .into_response()
}

/// `GET /assets/page.js`: the script that keeps the page live.
pub(super) async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        include_str!("page.js"),
    )
        .into_response()
}

/// A short HTML answer that is not the page: 401, 403 or 404.
fn refusal(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "{}<h1>driftless</h1><p>{}</p></body></html>\n",
        head("driftless"),
        escape(text)
    );
    let mut r = html(status, body);
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"driftless\", charset=\"UTF-8\""),
        );
    }
    r
}

/// Everything the dashboard and its stream show, as one viewer may see it.
pub(super) struct Board {
    pub targets: Vec<status::TargetStatus>,
    /// Targets with a plan waiting for a person.
    pub awaiting: Vec<String>,
    pub waiting: Vec<StoredPlan>,
    pub to_promote: Vec<StoredPlan>,
}

/// Read the board for `viewer` (`None`: the page is open to anyone).
pub(super) async fn board(
    s: &AppState,
    viewer: Option<&Caller>,
) -> Result<Board, crate::store::StoreError> {
    let may_read = |target: &str| viewer.is_none_or(|c| c.may(Verb::Read, target));
    let targets = status::targets(&s.app).await?;
    let waiting = s.app.store.plans(Some("pending_approval"), 200).await?;
    let to_promote = s.app.store.plans(Some("pending_promotion"), 200).await?;
    let waiting: Vec<StoredPlan> = waiting
        .into_iter()
        .filter(|p| may_read(&p.target))
        .collect();
    let to_promote: Vec<StoredPlan> = to_promote
        .into_iter()
        .filter(|p| may_read(&p.target))
        .collect();
    Ok(Board {
        targets: targets.into_iter().filter(|t| may_read(&t.name)).collect(),
        awaiting: waiting.iter().map(|p| p.target.clone()).collect(),
        waiting,
        to_promote,
    })
}

/// Where the page is reached: `[server] public_url`, else the listener.
fn base_url(s: &AppState) -> String {
    match &s.app.settings().server.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("http://{}", s.addr),
    }
}

/// `GET /`
pub(super) async fn index(State(s): State<AppState>, caller: Result<Caller, ApiError>) -> Response {
    let settings = &s.app.settings();
    // Who is looking: `None` when the page is open to anyone.
    let viewer = match viewer(settings, caller) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let b = match board(&s, viewer.as_ref()).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let may_read = |target: &str| viewer.as_ref().is_none_or(|c| c.may(Verb::Read, target));
    let buttons = Buttons {
        viewer: viewer.as_ref(),
        key: &s.csrf_key,
    };
    let base = base_url(&s);
    let cx = rows::Ctx {
        settings,
        now_ms: crate::store::now_ms(),
        may_read: &may_read,
        awaiting: &b.awaiting,
    };
    let mut h = head("driftless");
    h.push_str("<h1>driftless</h1><main id=\"board\" data-events=\"/events\">");
    for g in rows::Group::ALL {
        let mine: Vec<&status::TargetStatus> = b
            .targets
            .iter()
            .filter(|t| rows::state(t, b.awaiting.contains(&t.name)).0 == g)
            .collect();
        let _ = write!(
            h,
            "<section id=\"sec-{id}\"{hidden}><h2>{title} <small class=\"count\">{n}</small></h2>\
             <div class=\"scroll\"><table class=\"targets\">{TARGETS_HEAD}\
             <tbody id=\"g-{id}\">",
            id = g.id(),
            title = g.title(),
            n = mine.len(),
            hidden = if mine.is_empty() { " hidden" } else { "" },
        );
        for t in mine {
            h.push_str(&rows::row(t, &cx));
        }
        h.push_str("</tbody></table></div></section>");
    }
    if b.targets.is_empty() {
        h.push_str("<p>No target this token may read.</p>");
    }
    h.push_str("</main><h2>Waiting for approval</h2>");
    let waiting: Vec<&StoredPlan> = b.waiting.iter().collect();
    if waiting.is_empty() {
        h.push_str("<p>Nothing waits for approval.</p>");
    }
    approval_cards(&mut h, &waiting, &buttons, &base);
    // Nomad deployments whose canaries wait for a person.
    let to_promote: Vec<&StoredPlan> = b.to_promote.iter().collect();
    if !to_promote.is_empty() {
        h.push_str("<h2>Waiting for promotion</h2>");
    }
    promotion_cards(&mut h, &to_promote, &buttons);
    h.push_str("</body></html>\n");
    html(StatusCode::OK, h)
}

/// Who may look at the page: `Ok(None)` when it is open to anyone, the
/// caller when it needs a token with a read scope; `Err` the refusal.
fn viewer(
    settings: &crate::config::Settings,
    caller: Result<Caller, ApiError>,
) -> Result<Option<Caller>, Box<Response>> {
    match settings.server.page {
        PageAccess::Off => Err(Box::new(refusal(
            StatusCode::NOT_FOUND,
            "This page is off ([server] page = \"off\"); the API is at /api/v1/.",
        ))),
        PageAccess::Open => Ok(None),
        PageAccess::Token => match caller {
            Ok(c) if c.reads_anything() => Ok(Some(c)),
            Ok(c) => Err(Box::new(refusal(
                StatusCode::FORBIDDEN,
                &format!(
                    "Token `{}` has no read scope; this page needs `read` or `read:<glob>`.",
                    c.name()
                ),
            ))),
            Err(_) => Err(Box::new(refusal(
                StatusCode::UNAUTHORIZED,
                "Sign in with any user name and, as the password, a driftless token \
                         with a read scope (`driftless token new NAME` makes one).",
            ))),
        },
    }
}

/// The decision buttons (Approve and Reject, or Promote), for a viewer
/// who may approve.
struct Buttons<'a> {
    viewer: Option<&'a Caller>,
    key: &'a [u8; 32],
}

impl Buttons<'_> {
    fn html(&self, target: &str, id: i64, hash: &str, verbs: &[(&str, &str)]) -> String {
        let Some(c) = self.viewer.filter(|c| c.may(Verb::Approve, target)) else {
            return String::new();
        };
        let mut f = String::new();
        for &(verb, label) in verbs {
            let _ = write!(
                f,
                "<form class=\"decide\" method=\"post\" action=\"/deployments/{id}/{verb}\">\
                 <input type=\"hidden\" name=\"plan_hash\" value=\"{}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <button type=\"submit\" class=\"{verb}\">{label}</button></form>",
                escape(hash),
                csrf_token(self.key, c.name(), id, verb, hash),
            );
        }
        format!("<p>As <code>{}</code>: {f}</p>", escape(c.name()))
    }
}

/// A card per plan waiting for approval: its diff, the buttons, and the
/// `curl` and CLI that approve exactly it.
fn approval_cards(h: &mut String, waiting: &[&StoredPlan], buttons: &Buttons<'_>, base: &str) {
    for p in waiting {
        let curl = format!(
            "curl -X POST -H \"Authorization: Bearer $TOKEN\" -d '{{\"plan_hash\":\"{}\"}}' {base}/api/v1/deployments/{}/approve",
            p.plan_hash, p.id
        );
        // A unit's deployment (a Nomad job's) says which unit.
        let of = match &p.unit_label {
            Some(unit) => format!("{} of ", escape(unit)),
            None => String::new(),
        };
        let _ = write!(
            h,
            "<div class=\"card\" id=\"deployment-{}\"><h3>Deployment {}: {} plan of {of}<strong>{}</strong></h3>\
             <p>commit <code>{}</code>, policy <code>{}</code>, planned {}</p>\
             <p><strong>{}</strong>{}</p>{}<pre class=\"diff\">{}</pre>{}\
             <p>Or approve exactly this plan with:</p><pre class=\"approve\">{}</pre>\
             <p>or <code>driftless approve {}</code></p></div>",
            p.id,
            p.id,
            escape(&p.backend),
            escape(&p.target),
            escape(crate::model::short_sha(&p.commit_sha)),
            escape(&p.policy),
            escape(&crate::store::format_ms(p.created_at)),
            escape(&p.summary),
            if p.destructive {
                " <span class=\"destructive\">destructive: deletes or replaces</span>"
            } else {
                ""
            },
            why_it_waits(p),
            escape(&p.diff),
            buttons.html(
                &p.target,
                p.id,
                &p.plan_hash,
                &[("approve", "Approve this plan"), ("reject", "Reject")]
            ),
            escape(&curl),
            p.id,
        );
    }
}

/// What the plan's record says of why it waits, when it says more than
/// that it does: the policies that ask for a person, and their warnings
/// (`tick::guard` writes them into the plan's message).
fn why_it_waits(p: &StoredPlan) -> String {
    match p.message.as_deref() {
        Some(m) if !m.is_empty() && m != "waits for approval" => {
            format!("<p class=\"why\">{}</p>", escape(m))
        }
        _ => String::new(),
    }
}

/// A card per Nomad deployment whose canaries wait for a person.
fn promotion_cards(h: &mut String, to_promote: &[&StoredPlan], buttons: &Buttons<'_>) {
    for p in to_promote {
        let _ = write!(
            h,
            "<div class=\"card\" id=\"deployment-{}\"><h3>Deployment {}: {}</h3>\
             <p>commit <code>{}</code>, waiting since {}</p><p>{}</p>{}\
             <p>or <code>driftless approve {}</code></p></div>",
            p.id,
            p.id,
            escape(&p.subject()),
            escape(crate::model::short_sha(&p.commit_sha)),
            escape(&crate::store::format_ms(
                p.waiting_since.unwrap_or(p.updated_at)
            )),
            escape(p.message.as_deref().unwrap_or("")),
            buttons.html(
                &p.target,
                p.id,
                &p.plan_hash,
                &[("approve", "Promote its canaries")]
            ),
            p.id,
        );
    }
}

/// The CSRF token of one form: HMAC-SHA256 under the process's key over
/// who may submit it, for which deployment, verb and plan.
fn csrf_token(key: &[u8; 32], name: &str, id: i64, verb: &str, hash: &str) -> String {
    hex::encode(csrf_mac(key, name, id, verb, hash).finalize().into_bytes())
}

fn csrf_mac(key: &[u8; 32], name: &str, id: i64, verb: &str, hash: &str) -> Hmac<sha2::Sha256> {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(format!("driftless page form\n{name}\n{id}\n{verb}\n{hash}").as_bytes());
    mac
}

/// Whether a form post comes from the page's own origin: its `Origin`
/// header or, without one, its `Referer`, against `[server] public_url`
/// when set, else the scheme the browser names and the request's `Host`.
/// A post with neither header is not a browser's cross-site form (every
/// browser sends `Origin` on a cross-origin POST); its CSRF token decides.
/// `Err` says which header named what.
fn same_origin(headers: &HeaderMap, public_url: Option<&str>) -> Result<(), String> {
    let (name, value) = match (headers.get(header::ORIGIN), headers.get(header::REFERER)) {
        (Some(o), _) => ("Origin", o),
        (None, Some(r)) => ("Referer", r),
        (None, None) => return Ok(()),
    };
    let named = value.to_str().unwrap_or("").trim();
    let refused = || {
        let mut shown: String = named.chars().filter(|c| !c.is_control()).take(80).collect();
        if shown.is_empty() {
            shown = "an unreadable value".into();
        }
        Err(format!("{name}: {shown}"))
    };
    let Ok(from_url) = reqwest::Url::parse(named) else {
        return refused();
    };
    let from = from_url.origin();
    if !from.is_tuple() {
        return refused();
    }
    let own = match public_url {
        Some(u) => reqwest::Url::parse(u).ok().map(|u| u.origin()),
        None => headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .and_then(|host| reqwest::Url::parse(&format!("{}://{host}/", from_url.scheme())).ok())
            .map(|u| u.origin()),
    };
    match own {
        Some(own) if own == from => Ok(()),
        _ => refused(),
    }
}

/// What an Approve or Reject form sends.
#[derive(Deserialize)]
pub(super) struct DecideForm {
    plan_hash: String,
    csrf: String,
}

/// `POST /deployments/{id}/{approve|reject}`: a form from the page. Checks
/// the viewer's token, that the browser does not call it cross-site, and
/// the form's CSRF token, then records the decision as the API would
/// (scope `approve:<target>`; a stale plan is 409 with the reason).
pub(super) async fn decide(
    State(s): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path((id, verb)): Path<(i64, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if s.app.settings().server.page == PageAccess::Off {
        return refusal(StatusCode::NOT_FOUND, "This page is off.");
    }
    let approve = match verb.as_str() {
        "approve" => true,
        "reject" => false,
        _ => return refusal(StatusCode::NOT_FOUND, "No such form."),
    };
    let caller = match caller {
        Ok(c) => c,
        Err(_) => {
            return refusal(
                StatusCode::UNAUTHORIZED,
                "Sign in with a driftless token that may approve this target.",
            );
        }
    };
    // Sent by every current browser: a form posted from another site.
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return refusal(
            StatusCode::FORBIDDEN,
            "Refused: this form was sent from another site.",
        );
    }
    // Whatever the browser says of the fetch, the origin it names must be
    // the page's own (older browsers, privacy extensions, `Origin: null`
    // from a sandboxed frame or a data: URL).
    if let Err(why) = same_origin(&headers, s.app.settings().server.public_url.as_deref()) {
        return refusal(
            StatusCode::FORBIDDEN,
            &format!("Refused: this form was sent from another site ({why})."),
        );
    }
    let Ok(form) = serde_urlencoded::from_bytes::<DecideForm>(&body) else {
        return refusal(
            StatusCode::BAD_REQUEST,
            "The form must carry `plan_hash` and `csrf`; reload the page.",
        );
    };
    let valid = hex::decode(form.csrf.trim()).is_ok_and(|tag| {
        csrf_mac(&s.csrf_key, caller.name(), id, &verb, &form.plan_hash)
            .verify_slice(&tag)
            .is_ok()
    });
    if !valid {
        return refusal(
            StatusCode::FORBIDDEN,
            "Refused: the form's CSRF token does not match (it was made for another token, \
             deployment or plan, or before driftless restarted); reload the page.",
        );
    }
    let hash = approve.then(|| form.plan_hash.clone());
    match api::decide(&s, &caller, id, hash, approve).await {
        Ok(d) => {
            let what = if approve {
                "the next tick applies exactly this plan, if git still gives its commit"
            } else {
                "it will not be applied"
            };
            page_answer(
                StatusCode::OK,
                &format!("Deployment {id} of {} is {}: {what}.", d.target, d.state),
            )
        }
        Err(e) => page_answer(
            e.status,
            &format!("Deployment {id} was not changed: {}", e.message),
        ),
    }
}

/// A short page after a form: the outcome and the way back.
fn page_answer(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "{}<h1>driftless</h1><p id=\"outcome\">{}</p>\
         <p><a href=\"/\">Back to the page</a></p></body></html>\n",
        head("driftless"),
        escape(text)
    );
    html(status, body)
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;"
        );
    }
}
