//! A worker's grouped writes to `jobs`: the claim of the next runnable
//! job and the finish of one, each as statements in a batch's
//! transaction, as a job for SQLite's write thread (`store::direct`), and
//! on PostgreSQL as one call of a function of the write connection's own
//! that takes the write lock itself (`Batch::locked`): one round trip, the
//! lock held only inside the server, rather than `BEGIN` with the lock,
//! the statements and `COMMIT`, the lock held over each round trip. When
//! a job may be claimed (`RUNNABLE`) and what a claim writes (`claim_sql`)
//! are the parent module's; this one only writes them.

use super::{CLAIMED, JobRow, claim_sql, json_text};
use crate::model::BoxFuture;
use crate::store::db::PG_NOW_MS;
use crate::store::{Batch, BatchTx, Locked, direct};

/// A claim of the oldest runnable job: `sql` ([`claim_sql`]: `$1` now, `$2` the
/// owner, `$3` the lease) returns it, leased.
pub(super) struct Claim {
    pub(super) sql: std::sync::Arc<str>,
    pub(super) now: i64,
    pub(super) owner: String,
    pub(super) lease_ms: i64,
}

/// A claimed job, and when its lease was taken.
type Claimed = Option<(JobRow, std::time::Instant)>;

impl Batch for Claim {
    type Out = Claimed;

    /// A statement each, in order: each claim takes the job the ones
    /// before it left.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Claim>,
    ) -> BoxFuture<'t, Result<Vec<Claimed>, sqlx::Error>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(all.len());
            for c in all {
                let sent = std::time::Instant::now();
                let row = sqlx::query_as::<_, JobRow>(sqlx::AssertSqlSafe(c.sql.clone()))
                    .bind(c.now)
                    .bind(&c.owner)
                    .bind(c.lease_ms)
                    .fetch_optional(&mut **tx)
                    .await?;
                out.push(row.map(|r| (r, sent)));
            }
            Ok(out)
        })
    }

    /// One call of the claim function for them all, in order.
    fn locked(all: Vec<&Claim>) -> Option<Locked<Vec<Claimed>>> {
        let rows: Vec<(&str, i64, i64)> = all
            .iter()
            .map(|c| (c.owner.as_str(), c.lease_ms, c.now))
            .collect();
        let now = all.first()?.now;
        let n = all.len();
        let sent = std::time::Instant::now();
        Some(Locked {
            function: PG_CLAIM,
            rows: json_text(&rows).ok()?,
            now,
            answers: Box::new(move |text| claimed_of(text, n, sent).map(Some)),
        })
    }

    fn direct(all: Vec<&Claim>) -> Option<direct::Job<Vec<Claimed>>> {
        let all: Vec<Claim> = all
            .into_iter()
            .map(|c| Claim {
                sql: c.sql.clone(),
                owner: c.owner.clone(),
                ..*c
            })
            .collect();
        Some(Box::new(move |tx| {
            let mut out = Vec::with_capacity(all.len());
            for c in &all {
                let sent = std::time::Instant::now();
                let mut stmt = tx.prepare_cached(&c.sql).map_err(direct::failure)?;
                let mut rows = stmt
                    .query(rusqlite::named_params! { "$1": c.now, "$2": c.owner, "$3": c.lease_ms })
                    .map_err(direct::failure)?;
                let row = match rows.next().map_err(direct::failure)? {
                    None => None,
                    Some(r) => Some(job_row(r).map_err(direct::failure)?),
                };
                // Stepped to its end, so the update is done.
                while rows.next().map_err(direct::failure)?.is_some() {}
                out.push(row.map(|r| (r, sent)));
            }
            Ok(out)
        }))
    }
}

/// A [`JobRow`] from SQLite's write thread (the columns `RETURNING id,
/// target, triggers, requested_sha, delivery_ids, attempts, receiver`).
fn job_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<JobRow> {
    fn json<T: serde::de::DeserializeOwned>(
        r: &rusqlite::Row<'_>,
        i: usize,
    ) -> rusqlite::Result<T> {
        let text: String = r.get(i)?;
        serde_json::from_str(&text).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, Box::new(e))
        })
    }
    Ok(JobRow {
        id: r.get(0)?,
        target: r.get(1)?,
        triggers: json(r, 2)?,
        requested_sha: r.get(3)?,
        delivery_ids: json(r, 4)?,
        attempts: r.get(5)?,
        receiver: r.get(6)?,
    })
}

/// A job is over: `outcome` says how, `run_id` the run it made if any.
pub(super) struct Finish {
    pub(super) job_id: i64,
    pub(super) run_id: Option<i64>,
    pub(super) outcome: String,
    pub(super) now: i64,
}

const FINISH: &str =
    "UPDATE jobs SET state = 'done', run_id = $2, outcome = $3, lease_owner = NULL,
         lease_until = NULL, updated_at = $4
     WHERE id = $1";

impl Batch for Finish {
    type Out = ();

    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Finish>,
    ) -> BoxFuture<'t, Result<Vec<()>, sqlx::Error>> {
        Box::pin(async move {
            for f in &all {
                sqlx::query(FINISH)
                    .bind(f.job_id)
                    .bind(f.run_id)
                    .bind(&f.outcome)
                    .bind(f.now)
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(vec![(); all.len()])
        })
    }

    /// One call of the finish function for them all, in order.
    fn locked(all: Vec<&Finish>) -> Option<Locked<Vec<()>>> {
        let rows: Vec<(i64, Option<i64>, &str, i64)> = all
            .iter()
            .map(|f| (f.job_id, f.run_id, f.outcome.as_str(), f.now))
            .collect();
        let now = all.first()?.now;
        let n = all.len();
        Some(Locked {
            function: PG_FINISH,
            rows: json_text(&rows).ok()?,
            now,
            answers: Box::new(move |text| match text.parse::<usize>() {
                Ok(written) if written == n => Ok(Some(vec![(); n])),
                _ => Err(wrong_answer(format!(
                    "the finish function answered {text:?} to {n} finishes"
                ))),
            }),
        })
    }

    fn direct(all: Vec<&Finish>) -> Option<direct::Job<Vec<()>>> {
        let all: Vec<(i64, Option<i64>, String, i64)> = all
            .into_iter()
            .map(|f| (f.job_id, f.run_id, f.outcome.clone(), f.now))
            .collect();
        Some(Box::new(move |tx| {
            let mut stmt = tx.prepare_cached(FINISH).map_err(direct::failure)?;
            for f in &all {
                stmt.execute(
                    rusqlite::named_params! { "$1": f.0, "$2": f.1, "$3": f.2, "$4": f.3 },
                )
                .map_err(direct::failure)?;
            }
            Ok(vec![(); all.len()])
        }))
    }
}

/// The claim function ([`Claim::locked`]), made by [`pg_functions`].
const PG_CLAIM: &str = "pg_temp.driftless_claim";
/// The finish function ([`Finish::locked`]), made by [`pg_functions`].
const PG_FINISH: &str = "pg_temp.driftless_finish";

/// The claim and finish functions (`lock`: the advisory lock every write
/// takes). `driftless_claim(rows, now)`: `rows` is `[[owner, lease ms,
/// now], …]`, one claim each, in order, each with the statement the usual
/// way runs ([`claim_sql`] on the server's clock); it answers `[job or
/// null, …]`, each job the [`CLAIMED`] columns in an array.
/// `driftless_finish(rows, now)`: `rows` is `[[job id, run id or null,
/// outcome, now], …]`, each written with [`FINISH`] in order; it answers
/// the number of rows it was given.
pub(super) fn pg_functions(lock: i64) -> String {
    let claim = claim_sql(PG_NOW_MS)
        .replace("$1", "v_now")
        .replace("$2", "v_owner")
        .replace("$3", "v_lease")
        .replace(
            &format!("RETURNING {CLAIMED}"),
            &format!("RETURNING jsonb_build_array({CLAIMED}) INTO claimed"),
        );
    let finish = FINISH
        .replace("$1", "(f ->> 0)::bigint")
        .replace("$2", "(f ->> 1)::bigint")
        .replace("$3", "(f ->> 2)")
        .replace("$4", "(f ->> 3)::bigint");
    format!(
        "CREATE OR REPLACE FUNCTION {PG_CLAIM}(p_rows text, p_now bigint) RETURNS text
         LANGUAGE plpgsql VOLATILE AS $driftless$
         DECLARE c jsonb; v_owner text; v_lease bigint; v_now bigint; claimed jsonb;
                 answer jsonb := '[]'::jsonb;
         BEGIN
           PERFORM pg_advisory_xact_lock({lock});
           FOR c IN SELECT x.value FROM jsonb_array_elements(p_rows::jsonb) WITH ORDINALITY
                    AS x(value, n) ORDER BY x.n LOOP
             v_owner := c ->> 0;
             v_lease := (c ->> 1)::bigint;
             v_now := (c ->> 2)::bigint;
             claimed := NULL;
             {claim};
             answer := answer || jsonb_build_array(claimed);
           END LOOP;
           RETURN answer::text;
         END $driftless$;
         CREATE OR REPLACE FUNCTION {PG_FINISH}(p_rows text, p_now bigint) RETURNS text
         LANGUAGE plpgsql VOLATILE AS $driftless$
         DECLARE f jsonb;
         BEGIN
           PERFORM pg_advisory_xact_lock({lock});
           FOR f IN SELECT x.value FROM jsonb_array_elements(p_rows::jsonb) WITH ORDINALITY
                    AS x(value, n) ORDER BY x.n LOOP
             {finish};
           END LOOP;
           RETURN jsonb_array_length(p_rows::jsonb)::text;
         END $driftless$"
    )
}

/// A claim function's answer: for each claim, its job's [`CLAIMED`]
/// columns, or null.
type ClaimAnswer = Vec<
    Option<(
        i64,
        String,
        String,
        Option<String>,
        String,
        i64,
        Option<String>,
    )>,
>;

/// `text`, a claim function's answer to `n` claims sent at `sent`, as
/// their jobs.
fn claimed_of(text: &str, n: usize, sent: std::time::Instant) -> Result<Vec<Claimed>, sqlx::Error> {
    let decode = |e: serde_json::Error| sqlx::Error::Decode(Box::new(e));
    let answer: ClaimAnswer = serde_json::from_str(text).map_err(decode)?;
    if answer.len() != n {
        return Err(wrong_answer(format!(
            "the claim function answered {} claims of {n}",
            answer.len()
        )));
    }
    answer
        .into_iter()
        .map(|job| {
            let Some((id, target, triggers, requested_sha, delivery_ids, attempts, receiver)) = job
            else {
                return Ok(None);
            };
            let row = JobRow {
                id,
                target,
                triggers: serde_json::from_str(&triggers).map_err(decode)?,
                requested_sha,
                delivery_ids: serde_json::from_str(&delivery_ids).map_err(decode)?,
                attempts,
                receiver,
            };
            Ok(Some((row, sent)))
        })
        .collect()
}

/// A function's answer that does not fit what it was given: a decoding
/// error, never taken for a lost connection (the call committed; written
/// again the usual way, its writes would be made twice).
fn wrong_answer(said: String) -> sqlx::Error {
    sqlx::Error::Decode(said.into())
}
