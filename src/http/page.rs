//! `GET /`: an HTML page for people, rendered on the server (no
//! JavaScript): every target with its last result and commit, and every
//! deployment waiting for approval (Nomad's and every other backend's
//! plans) with its redacted diff and the `curl` line that approves exactly
//! that plan. By default (`[server] page = "token"`) it asks for a token
//! with a `read` scope (HTTP Basic, the token as the password, so a browser
//! can ask) and shows only what that token may read; `"open"` shows every
//! target to anyone, `"off"` answers 404. It never shows a secret (diffs are
//! redacted before they are stored).
//!
//! A viewer whose token may approve a target also gets an Approve and a
//! Reject button per waiting deployment: `POST /deployments/{id}/{verb}`, a
//! form whose CSRF token is an HMAC (a per-process key) over the viewer's
//! token name, the deployment, the verb and the plan hash; a request that
//! a browser marks as coming from another site, or whose `Origin` (else
//! `Referer`) is not the page's own origin, is refused as well. The
//! decision is the API's (`api::decide`): nothing is applied here.

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

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222}\
table{border-collapse:collapse;width:100%}th,td{text-align:left;padding:.35em .6em;border-bottom:1px solid #ddd;vertical-align:top}\
code,pre{font-family:ui-monospace,monospace;font-size:.9em}pre{background:#f6f6f6;padding:.6em;overflow-x:auto}pre.approve{white-space:pre-wrap;word-break:break-all}\
.failed,.blocked,.unhealthy,.rolled_back,.held{color:#b00020;font-weight:600}.changed{color:#0b6e4f}.no_change{color:#555}\
.card{border:1px solid #ccc;border-radius:6px;padding:1em;margin:1em 0}h1{font-size:1.4em}\
form.decide{display:inline-block;margin-right:.6em}form.decide button{font-size:1em;padding:.3em .9em}\
.destructive{color:#b00020;font-weight:600}";

/// A short HTML answer that is not the page: 401, 403 or 404.
fn refusal(status: StatusCode, text: &str) -> Response {
    let body = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>driftless</title>\
         <style>{STYLE}</style></head><body><h1>driftless</h1><p>{}</p></body></html>\n",
        escape(text)
    );
    let mut r = (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Basic realm=\"driftless\", charset=\"UTF-8\""),
        );
    }
    r
}

/// `GET /`
pub(super) async fn index(State(s): State<AppState>, caller: Result<Caller, ApiError>) -> Response {
    let settings = &s.app.settings();
    // Who is looking: `None` when the page is open to anyone.
    let viewer = match viewer(settings, caller) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let may_read = |target: &str| viewer.as_ref().is_none_or(|c| c.may(Verb::Read, target));
    let targets = match status::targets(&s.app).await {
        Ok(t) => t,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let targets: Vec<_> = targets.into_iter().filter(|t| may_read(&t.name)).collect();
    let waiting = match s.app.store.plans(Some("pending_approval"), 200).await {
        Ok(p) => p,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let to_promote = match s.app.store.plans(Some("pending_promotion"), 200).await {
        Ok(p) => p,
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    };
    let buttons = Buttons {
        viewer: viewer.as_ref(),
        key: &s.csrf_key,
    };
    let base = match &settings.server.public_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("http://{}", s.addr),
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>driftless</title>\
         <meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head><body>\
         <h1>driftless</h1><h2>Targets</h2><table><thead><tr><th>target</th><th>backend</th>\
         <th>last result</th><th>applied commit</th><th>last run</th><th>message</th></tr></thead><tbody>"
    );
    target_rows(&mut h, &targets, &may_read);
    h.push_str("</tbody></table><h2>Waiting for approval</h2>");
    let waiting: Vec<_> = waiting.iter().filter(|p| may_read(&p.target)).collect();
    if waiting.is_empty() {
        h.push_str("<p>Nothing waits for approval.</p>");
    }
    approval_cards(&mut h, &waiting, &buttons, &base);
    // Nomad deployments whose canaries wait for a person.
    let to_promote: Vec<_> = to_promote.iter().filter(|p| may_read(&p.target)).collect();
    if !to_promote.is_empty() {
        h.push_str("<h2>Waiting for promotion</h2>");
    }
    promotion_cards(&mut h, &to_promote, &buttons);
    h.push_str("</body></html>\n");
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        h,
    )
        .into_response()
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

/// One row per target the viewer may read; of its dependencies, only
/// those the viewer may read are named.
fn target_rows(h: &mut String, targets: &[status::TargetStatus], may_read: &dyn Fn(&str) -> bool) {
    for t in targets {
        let result = t.last_result.as_deref().unwrap_or("never run");
        let mut flags = String::new();
        if t.destroyed_at.is_some() {
            flags.push_str(" (destroyed: directory removed)");
        } else if t.orphaned_since.is_some() {
            flags.push_str(" (orphaned: directory removed, not applied)");
        }
        if t.paused {
            flags.push_str(" (paused)");
        }
        if let Some(hold) = &t.hold {
            let _ = write!(flags, " ({hold})");
        }
        let readable = |names: &[String]| -> Vec<String> {
            names.iter().filter(|n| may_read(n)).cloned().collect()
        };
        let waits = readable(&t.waiting_on);
        let window = t.window.as_ref();
        if t.running {
            flags.push_str(" (running)");
        } else if let Some(w) = window.filter(|w| w.waiting) {
            let _ = write!(flags, " (queued, waiting for its window: {})", w.state);
        } else if t.queued && !waits.is_empty() {
            let _ = write!(flags, " (queued, waiting on {})", waits.join(", "));
        } else if t.queued {
            flags.push_str(" (queued)");
        }
        if let Some(w) = window.filter(|w| !w.waiting) {
            let _ = write!(flags, " (window {})", w.state);
        }
        let after = readable(&t.depends_on);
        if !after.is_empty() {
            let _ = write!(flags, " after {}", after.join(", "));
        }
        let _ = write!(
            h,
            "<tr><td><strong>{}</strong>{}</td><td>{}</td><td class=\"{}\">{}</td><td><code>{}</code></td><td>{}</td><td>{}</td></tr>",
            escape(&t.name),
            escape(&flags),
            escape(&t.backend),
            escape(result),
            escape(result),
            escape(
                t.last_applied_sha
                    .as_deref()
                    .map(crate::model::short_sha)
                    .unwrap_or("-")
            ),
            escape(t.last_run_at.as_deref().unwrap_or("-")),
            escape(t.last_message.as_deref().unwrap_or("")),
        );
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
             <p><strong>{}</strong>{}</p><pre class=\"diff\">{}</pre>{}\
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
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>driftless</title>\
         <style>{STYLE}</style></head><body><h1>driftless</h1><p id=\"outcome\">{}</p>\
         <p><a href=\"/\">Back to the page</a></p></body></html>\n",
        escape(text)
    );
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        body,
    )
        .into_response()
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
