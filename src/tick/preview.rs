//! Pull-request previews: plan one target at a pull request's head and
//! tell the pull request. Git decides whether the pull request changes the
//! target's path (from the merge base with the target's branch to the
//! head); the head is planned in the target's preview checkout, under its
//! preview lock, never its apply lock; nothing is applied and no run or
//! target state is written. The result, its commit status
//! (`driftless/<target>/preview`) and the pull request's rebuilt comment
//! are recorded in one transaction, and only for the head that was planned.
//! This module must not apply, move the target's own checkout, or take its
//! lock.

use tracing::{info, warn};

use super::{Reconciler, TickError};
use crate::backend;
use crate::config::{Previews, Target};
use crate::lock::{LockError, TargetLock};
use crate::model::short_sha;
use crate::notify::forge::{COMMENT_MARKER, Kind};
use crate::store::previews::{Claimed, Outcome, PreviewRow, PullRow};
use crate::store::statuses::{NewStatus, State};

/// What became of a claimed preview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previewed {
    /// Recorded (or found out of date: a newer head or a close came).
    Done,
    /// Its preview checkout is in use by another process: queue it again.
    Busy,
}

impl Reconciler {
    /// Preview `job`: see the module documentation.
    pub async fn preview(&self, job: &Claimed) -> Result<Previewed, TickError> {
        let p = &job.preview;
        let Some(target) = self
            .app
            .target(&p.target)
            .filter(|t| t.previews != Previews::Off)
        else {
            info!(target = %p.target, number = job.pull.number,
                  "preview dropped: the target is gone or no longer previews");
            self.app.store.drop_preview(p.id).await?;
            return Ok(Previewed::Done);
        };
        let _lock =
            match TargetLock::try_acquire(&self.app.settings().preview_locks_dir(), &target.name) {
                Ok(l) => l,
                Err(LockError::Busy { .. }) => return Ok(Previewed::Busy),
                Err(e) => return Err(TickError::Lock(e)),
            };
        let outcome = self.plan_preview(&target, job).await;
        match &outcome {
            Outcome::Failed(why) => {
                warn!(target = %target.name, number = job.pull.number, head = %short_sha(&p.head_sha),
                      error = %why, "pull request preview failed")
            }
            Outcome::Unaffected => {
                info!(target = %target.name, number = job.pull.number, head = %short_sha(&p.head_sha),
                      "pull request changes nothing under the target's path: not planned")
            }
            Outcome::Planned { summary, .. } => {
                info!(target = %target.name, number = job.pull.number, head = %short_sha(&p.head_sha),
                      %summary, "pull request previewed")
            }
        }
        let statuses = self.preview_status(&target, p, &outcome);
        let limit = self
            .app
            .settings()
            .forges
            .iter()
            .find(|f| f.name == job.pull.forge)
            .map(|f| f.kind)
            .unwrap_or(Kind::GitHub);
        let kept = self
            .app
            .store
            .finish_preview(
                p.id,
                &p.head_sha,
                &outcome,
                statuses.as_slice(),
                |pull, previews| render_comment(pull, previews, limit),
            )
            .await?;
        if !kept {
            info!(target = %target.name, number = job.pull.number, head = %short_sha(&p.head_sha),
                  "preview result dropped: the pull request moved on or was closed meanwhile");
        }
        self.app.outbox_wake.notify_waiters();
        Ok(Previewed::Done)
    }

    /// Fetch, decide, check out and plan; every failure is the preview's.
    async fn plan_preview(&self, target: &Target, job: &Claimed) -> Outcome {
        let p = &job.preview;
        let auth = &target.git;
        let base = match self.git.fetch(&target.repo, &target.branch, auth).await {
            Ok(b) => b,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let tip = match self.git.fetch_ref(&target.repo, &p.head_ref, auth).await {
            Ok(t) => t,
            Err(e) => {
                return Outcome::Failed(format!(
                    "cannot fetch the pull request's head ({}): {e}",
                    p.head_ref
                ));
            }
        };
        if tip != p.head_sha && !self.git.has_commit(&target.repo, &p.head_sha).await {
            return Outcome::Failed(format!(
                "the pull request's head {} is no longer on {} (now {}); the newer head is previewed when the forge reports it",
                short_sha(&p.head_sha),
                p.head_ref,
                short_sha(&tip)
            ));
        }
        let merge_base = match self.git.merge_base(&target.repo, &base, &p.head_sha).await {
            Ok(m) => m,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        // The path the same at the merge base and the head, or at neither (the
        // pull request does not touch this target): nothing to preview.
        if let Some(m) = &merge_base {
            let between = self
                .git
                .path_between(&target.repo, &target.path, m, &p.head_sha)
                .await;
            if between != crate::git::PathBetween::Changed {
                return Outcome::Unaffected;
            }
        }
        if let Some(s) = self.planning_status(target, p) {
            if let Err(e) = self.app.store.record_statuses(&[s], false).await {
                warn!(target = %target.name, error = %e, "cannot record the preview's pending status");
            }
            self.app.outbox_wake.notify_waiters();
        }
        let synced = match self
            .git
            .checkout_preview(target.source(), &p.head_sha)
            .await
        {
            Ok(s) => s,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let (last_digest, applied) = match self.app.store.target_state(&target.name).await {
            Ok(s) => (
                s.as_ref().and_then(|s| s.backend_digest.clone()),
                s.and_then(|s| s.last_applied_sha),
            ),
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        let mut ctx = self.context(target, &synced, last_digest, false);
        // The inputs a preview plans with are today's: it says which.
        let mut inputs_used = None;
        let mut values = std::collections::BTreeMap::new();
        if !target.inputs.is_empty() {
            match self.resolve_inputs(target).await {
                Ok(Ok(v)) => {
                    inputs_used = Some(inputs_line(target, &v.recorded));
                    values = v.values.clone();
                    super::with_inputs(&mut ctx, v)
                }
                Ok(Err(why)) => return Outcome::Failed(why),
                Err(e) => return Outcome::Failed(e.to_string()),
            }
        }
        let shown: std::collections::BTreeMap<String, String> = values
            .into_iter()
            .map(|(k, v)| (k, ctx.redactor.redact(&v)))
            .collect();
        ctx.plans_dir = self.app.settings().preview_plans_dir(&target.name);
        ctx.preview = Some(self.git.checkout_dir(&target.name).join(&target.path));
        let b = match backend::build(&target.backend, ctx) {
            Ok(b) => b,
            Err(e) => return Outcome::Failed(e.to_string()),
        };
        match self.plan_and_let_go(target, b.as_ref()).await {
            None => Outcome::Failed(format!(
                "this `{}` target cannot plan",
                target.backend.kind()
            )),
            Some(Err(e)) => Outcome::Failed(e),
            Some(Ok(plan)) => {
                // What the policies would make of it, beside the plan: a
                // person sees a denial before merging.
                let judged = match self.guarded(target) && plan.changes {
                    true => {
                        let doc = self
                            .plan_document(target, applied.as_deref(), shown, &synced.sha, &plan)
                            .await;
                        Some(self.evaluate(target, &doc).await)
                    }
                    false => None,
                };
                let (summary, lines) = with_policies(plan.summary, judged);
                let diff = [inputs_used, lines, Some(plan.diff)]
                    .into_iter()
                    .flatten()
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
                    .join("\n");
                Outcome::Planned {
                    changes: plan.changes,
                    destructive: plan.destructive,
                    summary,
                    diff,
                }
            }
        }
    }

    fn status(
        &self,
        target: &Target,
        p: &PreviewRow,
        state: State,
        says: String,
    ) -> Option<NewStatus> {
        target.preview_status(&p.head_sha, &p.head_ref, state, says)
    }

    fn planning_status(&self, target: &Target, p: &PreviewRow) -> Option<NewStatus> {
        self.status(
            target,
            p,
            State::Pending,
            "planning the pull request's head".into(),
        )
    }

    /// The preview's status on the head: none when the pull request does
    /// not touch the target (nothing to say about it there).
    fn preview_status(&self, target: &Target, p: &PreviewRow, o: &Outcome) -> Vec<NewStatus> {
        let s = match o {
            Outcome::Unaffected => None,
            Outcome::Planned { changes: false, .. } => {
                self.status(target, p, State::Success, "plan: no changes".into())
            }
            Outcome::Planned { summary, .. } if summary.contains(DENIED) => {
                self.status(target, p, State::Failure, format!("plan: {summary}"))
            }
            Outcome::Planned { summary, .. } => {
                self.status(target, p, State::Success, format!("plan: {summary}"))
            }
            Outcome::Failed(why) => self.status(
                target,
                p,
                State::Failure,
                format!("plan failed: {}", first_line(why)),
            ),
        };
        s.into_iter().collect()
    }
}

/// What a preview's summary says when a policy denies its plan.
const DENIED: &str = "denied by policy";

/// A preview's summary with what the policies made of its plan (`judged`;
/// `None`: no policy covers the target), and their findings as lines for
/// the top of its diff.
fn with_policies(
    summary: String,
    judged: Option<Result<crate::policy::Outcome, String>>,
) -> (String, Option<String>) {
    match judged {
        None => (summary, None),
        Some(Err(e)) => (
            format!("{summary}; {DENIED} (it cannot be evaluated): {e}"),
            Some(format!("policies: {e}")),
        ),
        Some(Ok(o)) => {
            let lines = o.lines();
            let said = match (o.deny.first(), o.require_approval.first()) {
                (Some(d), _) => format!(
                    "{summary}; {DENIED} `{}`: {}{}",
                    d.policy,
                    d.message,
                    match o.deny.len() {
                        1 => String::new(),
                        n => format!(" (and {} more)", n - 1),
                    }
                ),
                (None, Some(r)) => format!(
                    "{summary}; waits for approval: policy `{}` requires it: {}",
                    r.policy, r.message
                ),
                (None, None) if !o.warn.is_empty() => {
                    format!("{summary}; {} policy warning(s)", o.warn.len())
                }
                _ => summary,
            };
            let lines = (!lines.is_empty()).then(|| {
                lines
                    .iter()
                    .map(|l| format!("policies: {l}"))
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            (said, lines)
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
}

/// Text for a Markdown table cell: one line, no `|`, no HTML.
fn cell(s: &str) -> String {
    let one: String = first_line(s).chars().take(300).collect();
    html(&one).replace('|', "\\|")
}

fn html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The pull request's comment from its previews at the current head
/// (`None`: nothing to say yet and no comment to correct). A table with
/// one row per target the pull request touches, then each plan's lines in
/// a collapsed section, cut to the forge's `limit` with a note where.
/// The line a preview's plan starts with when the target takes inputs:
/// each input, where it comes from and a fingerprint of the value as
/// recorded (a sensitive one's is of its keyed digest): which inputs the
/// plan used, never a value.
fn inputs_line(target: &Target, recorded: &std::collections::BTreeMap<String, String>) -> String {
    use sha2::{Digest, Sha256};
    let each: Vec<String> = target
        .inputs
        .iter()
        .map(|i| {
            let print = recorded
                .get(&i.name)
                .map(|v| hex::encode(Sha256::digest(v.as_bytes()))[..12].to_string())
                .unwrap_or_else(|| "-".into());
            format!(
                "`{}` = {}.outputs.{} (fingerprint {print})",
                i.name, i.target, i.output
            )
        })
        .collect();
    format!("planned with the inputs recorded now: {}", each.join(", "))
}

pub(crate) fn render_comment(
    pull: &PullRow,
    previews: &[PreviewRow],
    kind: Kind,
) -> Option<String> {
    let touched: Vec<&PreviewRow> = previews
        .iter()
        .filter(|p| p.state != "unaffected" && p.state != "dropped")
        .collect();
    let done = touched
        .iter()
        .any(|p| p.state == "planned" || p.state == "failed");
    let head = short_sha(&pull.head_sha);
    if !done {
        let waiting = !touched.is_empty();
        // Nothing planned at this head yet: say nothing unless a comment
        // about an older head is there to correct.
        pull.body.as_ref()?;
        if waiting {
            return Some(format!(
                "{COMMENT_MARKER}\n### driftless preview of `{head}`\n\nPlanning…\n"
            ));
        }
        return Some(format!(
            "{COMMENT_MARKER}\n### driftless preview of `{head}`\n\nThis head changes no target's path: nothing to plan.\n"
        ));
    }
    let mut top = format!(
        "{COMMENT_MARKER}\n### driftless preview of `{head}`\n\nWhat merging would do, planned at this pull request's head (nothing was applied):\n\n| target | plan |\n|---|---|\n"
    );
    let mut sections = Vec::new();
    for p in &touched {
        let summary = p.summary.as_deref().unwrap_or("");
        let what = match p.state.as_str() {
            "planned" if !p.changes => "no changes".to_string(),
            "planned" if summary.contains(DENIED) => format!("**denied**: {}", cell(summary)),
            "planned" if p.destructive => format!("**deletes or replaces**: {}", cell(summary)),
            "planned" => cell(summary),
            "failed" => format!("**plan failed**: {}", cell(summary)),
            _ => "planning…".to_string(),
        };
        top.push_str(&format!("| `{}` | {what} |\n", cell(&p.target)));
        match (p.state.as_str(), &p.diff) {
            ("planned", Some(d)) if p.changes && !d.trim().is_empty() => {
                sections.push((p.target.clone(), html(d.trim_end())));
            }
            ("failed", _) if summary.lines().count() > 1 || summary.len() > 300 => {
                sections.push((p.target.clone(), html(summary.trim_end())));
            }
            _ => {}
        }
    }
    let others = previews.iter().filter(|p| p.state == "unaffected").count();
    if others > 0 {
        top.push_str(&format!(
            "\n{others} other target(s) with previews: not changed by this pull request.\n"
        ));
    }
    Some(fit(top, &sections, kind))
}

/// `top` and then each `(target, lines)` section, within the forge's
/// comment limit: a section that does not fit is cut at a line, with a note
/// saying where and why, and the sections after it are left out.
fn fit(mut body: String, sections: &[(String, String)], kind: Kind) -> String {
    let limit = kind.comment_limit();
    let note = format!(
        "\n_… cut here: the comment reached {}'s limit of {} characters. `driftless plan <target>` shows a whole plan._\n",
        kind.label(),
        limit
    );
    let room = |b: &String| limit.saturating_sub(b.chars().count() + note.chars().count());
    for (target, lines) in sections {
        let open = format!(
            "\n<details><summary><code>{}</code></summary>\n\n<pre>\n",
            html(target)
        );
        let close = "</pre>\n</details>\n";
        let whole = format!("{open}{lines}\n{close}");
        if whole.chars().count() <= room(&body) {
            body.push_str(&whole);
            continue;
        }
        let mut kept = String::new();
        let budget = room(&body).saturating_sub(open.chars().count() + close.chars().count() + 1);
        let mut used = 0;
        for l in lines.lines() {
            let n = l.chars().count() + 1;
            if used + n > budget {
                break;
            }
            kept.push_str(l);
            kept.push('\n');
            used += n;
        }
        if !kept.is_empty() {
            body.push_str(&format!("{open}{kept}{close}"));
        }
        body.push_str(&note);
        return body;
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pull(body: Option<&str>) -> PullRow {
        PullRow {
            id: 1,
            forge: "f".into(),
            repo: "me/infra".into(),
            number: 7,
            head_sha: "0123456789abcdef0123456789abcdef01234567".into(),
            open: true,
            comment_id: None,
            body: body.map(str::to_string),
            version: 0,
            sent_version: 0,
            attempts: 0,
            last_error: None,
            given_up: false,
        }
    }

    fn preview(target: &str, state: &str, summary: &str, diff: &str) -> PreviewRow {
        PreviewRow {
            id: 1,
            pull_request: 1,
            target: target.into(),
            head_sha: "0123456789abcdef0123456789abcdef01234567".into(),
            head_ref: "refs/pull/7/head".into(),
            state: state.into(),
            changes: !diff.is_empty(),
            destructive: false,
            summary: Some(summary.into()),
            diff: Some(diff.into()),
        }
    }

    #[test]
    fn the_comment_says_each_touched_target_and_escapes_what_a_plan_prints() {
        let body = render_comment(
            &pull(None),
            &[
                preview(
                    "web",
                    "planned",
                    "1 to add, 0 to change, 0 to destroy",
                    "+ <script>x</script> | y",
                ),
                preview("dns", "unaffected", "", ""),
                preview("db", "failed", "boom\nsecond line", ""),
            ],
            Kind::GitHub,
        )
        .expect("a comment");
        assert!(body.starts_with(COMMENT_MARKER), "{body}");
        assert!(
            body.contains("| `web` | 1 to add, 0 to change, 0 to destroy |"),
            "{body}"
        );
        assert!(body.contains("| `db` | **plan failed**: boom |"), "{body}");
        assert!(!body.contains("`dns`"), "{body}");
        assert!(body.contains("1 other target(s)"), "{body}");
        assert!(body.contains("&lt;script&gt;"), "{body}");
        assert!(!body.contains("<script>"), "{body}");
    }

    #[test]
    fn a_policys_denial_is_shown_beside_the_plan() {
        use crate::policy::{Finding, Outcome as Judged};
        let f = |m: &str| Finding {
            policy: "no-deletes".into(),
            rule: "deny".into(),
            message: m.into(),
        };
        let (summary, lines) = with_policies(
            "0 to add, 0 to change, 1 to destroy".into(),
            Some(Ok(Judged {
                deny: vec![f("b would be deleted")],
                warn: vec![f("careful")],
                require_approval: vec![],
            })),
        );
        assert_eq!(
            summary,
            "0 to add, 0 to change, 1 to destroy; denied by policy `no-deletes`: b would be deleted"
        );
        let lines = lines.expect("lines");
        assert!(
            lines.contains("policies: deny: policy `no-deletes`: b would be deleted")
                && lines.contains("policies: warn: policy `no-deletes`: careful"),
            "{lines}"
        );
        let body = render_comment(
            &pull(None),
            &[preview(
                "net",
                "planned",
                &summary,
                &format!("{lines}\n- b"),
            )],
            Kind::GitHub,
        )
        .expect("a comment");
        assert!(
            body.contains("| `net` | **denied**: 0 to add, 0 to change, 1 to destroy; denied by policy `no-deletes`: b would be deleted |"),
            "{body}"
        );
        assert!(body.contains("policies: warn:"), "{body}");
        // A policy that cannot be evaluated is a denial too.
        let (summary, _) = with_policies("1 to add".into(), Some(Err("broken.rego:3:1".into())));
        assert!(
            summary.contains(DENIED) && summary.contains("broken.rego:3:1"),
            "{summary}"
        );
        // No policy: the summary as it was.
        assert_eq!(
            with_policies("1 to add".into(), None),
            ("1 to add".to_string(), None)
        );
    }

    #[test]
    fn nothing_is_said_until_there_is_something_to_say_or_correct() {
        let none = [preview("web", "unaffected", "", "")];
        assert_eq!(render_comment(&pull(None), &none, Kind::GitHub), None);
        let queued = [preview("web", "queued", "", "")];
        assert_eq!(render_comment(&pull(None), &queued, Kind::GitHub), None);
        let fixed = render_comment(&pull(Some("old")), &none, Kind::GitHub).expect("a correction");
        assert!(fixed.contains("changes no target's path"), "{fixed}");
    }

    #[test]
    fn a_long_plan_is_cut_at_a_line_within_the_forges_limit() {
        let diff: String = (0..20_000)
            .map(|i| format!("+ resource.r{i} create\n"))
            .collect();
        let body = render_comment(
            &pull(None),
            &[
                preview("a", "planned", "20000 to add", &diff),
                preview("b", "planned", "20000 to add", &diff),
            ],
            Kind::GitHub,
        )
        .expect("a comment");
        assert!(body.chars().count() <= 65_536, "{}", body.len());
        assert!(
            body.contains("cut here: the comment reached GitHub's limit of 65536"),
            "{}",
            &body[body.len() - 300..]
        );
        assert!(body.contains("</pre>\n</details>"), "sections are closed");
        let gitlab = render_comment(
            &pull(None),
            &[preview("a", "planned", "n", &diff)],
            Kind::GitLab,
        )
        .expect("a comment");
        assert!(
            !gitlab.contains("cut here"),
            "GitLab takes a million characters"
        );
    }
}
