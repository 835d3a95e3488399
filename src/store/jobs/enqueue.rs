//! Queueing: requests folded into their targets' queued jobs (one upsert
//! for a whole batch of callers), and webhook deliveries recorded with
//! their requests (`deliveries`, deduplicated by id). The fold is written
//! twice on purpose: in Rust for the rows of one statement, and in SQL for
//! a row meeting its target's queued job; a test holds them to the same
//! result.

use std::collections::{HashMap, HashSet};

use super::{Accepted, Jobs, Request, json_text};
use crate::model::BoxFuture;
use crate::store::db::is_postgres;
use crate::store::previews::{self, PullEvent};
use crate::store::statuses::{self, NewStatus};
use crate::store::{Batch, BatchTx, Locked, StoreError, direct, now_ms};

impl Jobs {
    /// Add a request, folding it into the target's queued job if there is
    /// one. Returns the queued job's id. Committed with the other small writes waiting at the same moment
    /// (`Store::batched`: requests arriving together are one statement),
    /// before this returns.
    pub async fn enqueue(&self, req: &Request) -> Result<i64, StoreError> {
        let queued = self
            .store
            .batched("queueing a job", Requests(vec![req.clone()]))
            .await?;
        queued
            .first()
            .map(|q| q.id)
            .ok_or_else(|| self.store.err("queueing a job")(no_job(&req.target)))
    }

    /// Queue `reqs` in one statement, as a burst of deliveries is: the
    /// id of each one's job, in order.
    pub async fn enqueue_together(&self, reqs: &[Request]) -> Result<Vec<i64>, StoreError> {
        let queued = self
            .store
            .batched("queueing jobs", Requests(reqs.to_vec()))
            .await?;
        Ok(queued.iter().map(|q| q.id).collect())
    }

    /// Queue the interval ticks of the targets the scheduler found due,
    /// each with when its last run started as the scheduler read it, in
    /// one write. Each is checked again inside that write, where no other
    /// instance's write can land in between: it is queued only if nothing
    /// of it is queued or running, it is not paused, and its last run is
    /// still the one read (another instance may have queued, run and
    /// finished it since: then it is not due). The targets queued; all of
    /// them are on disk when this returns, or none.
    pub async fn enqueue_due(
        &self,
        due: Vec<(Request, Option<i64>)>,
    ) -> Result<Vec<String>, StoreError> {
        if due.is_empty() {
            return Ok(Vec::new());
        }
        let kind = self.store.kind();
        let due = std::sync::Arc::new(due);
        self.store
            .grouped("queueing interval ticks", move |tx| {
                let due = due.clone();
                Box::pin(async move {
                    let names: Vec<String> = due.iter().map(|(r, _)| r.target.clone()).collect();
                    let now: HashMap<String, crate::store::Candidate> =
                        crate::store::candidates_on(tx, kind, &names)
                            .await?
                            .into_iter()
                            .map(|c| (c.name.clone(), c))
                            .collect();
                    let still: Vec<&Request> = due
                        .iter()
                        .filter(|(r, read)| {
                            now.get(&r.target)
                                .is_some_and(|c| !c.active && !c.paused && c.last_run_at == *read)
                        })
                        .map(|(r, _)| r)
                        .collect();
                    enqueue_many(tx, &still).await?;
                    Ok(still.iter().map(|r| r.target.clone()).collect())
                })
            })
            .await
    }

    /// Record a webhook delivery and queue its requests (a pull request's
    /// previews, the pushed commits' `pending` statuses), atomically:
    /// either the delivery id is new and all of it is on disk when this
    /// returns, or it was seen before and nothing is written. Deliveries
    /// arriving together share one commit and, mostly, one statement
    /// (`Store::batched`).
    pub async fn accept(&self, intake: Intake) -> Result<Accepted, StoreError> {
        self.store
            .batched("recording a webhook delivery", intake)
            .await
    }

    /// Forget the delivery ids received before `cutoff` (Unix ms).
    pub async fn prune_deliveries(&self, cutoff: i64) -> Result<u64, StoreError> {
        let r = self
            .store
            .write_one(
                "forgetting old deliveries",
                sqlx::query("DELETE FROM deliveries WHERE received_at < $1").bind(cutoff),
            )
            .await?;
        Ok(r.rows_affected())
    }
}

/// What a webhook delivery writes: see [`Jobs::accept`].
#[derive(Debug, Clone)]
pub struct Intake {
    pub receiver: String,
    pub delivery_id: Option<String>,
    /// What became of it, for the delivery log.
    pub outcome: String,
    pub requests: Vec<Request>,
    pub pulls: Vec<PullEvent>,
    /// Each only where the commit has no state for the context yet.
    pub statuses: Vec<NewStatus>,
}

impl Batch for Intake {
    type Out = Accepted;

    /// Every delivery of the batch in one insert (those whose id was seen
    /// before, or earlier in the batch, are duplicates), then every
    /// request of the new ones in one more (`enqueue_many`); previews and
    /// statuses, which few deliveries carry, a statement each.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Intake>,
    ) -> BoxFuture<'t, Result<Vec<Accepted>, sqlx::Error>> {
        Box::pin(async move {
            let new: HashSet<(String, String)> = match delivery_rows(&all)? {
                None => HashSet::new(),
                Some(rows) => sqlx::query_as::<_, (String, String)>(if is_postgres(tx) {
                    DELIVERIES_PG
                } else {
                    DELIVERIES_SQLITE
                })
                .bind(rows)
                .bind(now_ms())
                .fetch_all(&mut **tx)
                .await?
                .into_iter()
                .collect(),
            };
            let taken = taken(&all, new);
            let jobs = enqueue_many(tx, &taken_requests(&all, &taken)).await?;
            let mut out = accepted(&all, &taken, &jobs)?;
            for (i, a) in all.iter().zip(&mut out) {
                let Accepted::Queued {
                    dropped_previews, ..
                } = a
                else {
                    continue;
                };
                for p in &i.pulls {
                    *dropped_previews += previews::record_event(tx, p).await?;
                }
                for s in &i.statuses {
                    statuses::record(tx, s, true).await?;
                }
            }
            Ok(out)
        })
    }

    /// The same two statements on SQLite's write thread, for a batch with
    /// no pull request events or statuses.
    fn direct(all: Vec<&Intake>) -> Option<direct::Job<Vec<Accepted>>> {
        if all
            .iter()
            .any(|i| !i.pulls.is_empty() || !i.statuses.is_empty())
        {
            return None;
        }
        let all: Vec<Intake> = all.into_iter().cloned().collect();
        Some(Box::new(move |tx| {
            let all: Vec<&Intake> = all.iter().collect();
            let new: HashSet<(String, String)> = match delivery_rows(&all)? {
                None => HashSet::new(),
                Some(rows) => {
                    let mut stmt = tx
                        .prepare_cached(DELIVERIES_SQLITE)
                        .map_err(direct::failure)?;
                    stmt.query_map(
                        rusqlite::named_params! { "$1": rows, "$2": now_ms() },
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .and_then(|rows| rows.collect::<Result<HashSet<_>, _>>())
                    .map_err(direct::failure)?
                }
            };
            let taken = taken(&all, new);
            let jobs = enqueue_direct(tx, &taken_requests(&all, &taken))?;
            accepted(&all, &taken, &jobs)
        }))
    }

    /// The same on PostgreSQL, one call of the intake function
    /// ([`pg_functions`]), for a batch with no pull request events or
    /// statuses and no delivery id twice. It writes nothing when a
    /// delivery was seen before: the usual way then tells which.
    fn locked(all: Vec<&Intake>) -> Option<Locked<Vec<Accepted>>> {
        if all
            .iter()
            .any(|i| !i.pulls.is_empty() || !i.statuses.is_empty())
        {
            return None;
        }
        let mut deliveries = Vec::with_capacity(all.len());
        let mut seen = HashSet::with_capacity(all.len());
        for i in &all {
            if let Some(id) = i.delivery_id.as_deref() {
                if !seen.insert((i.receiver.as_str(), id)) {
                    return None;
                }
                deliveries.push((i.receiver.as_str(), id, i.outcome.as_str()));
            }
        }
        let requests: Vec<&Request> = all.iter().flat_map(|i| i.requests.iter()).collect();
        let rows = json_text(&(deliveries, fold_requests(&requests))).ok()?;
        let all: Vec<Intake> = all.into_iter().cloned().collect();
        Some(Locked {
            function: PG_INTAKE,
            rows,
            now: now_ms(),
            answers: Box::new(move |text| {
                let jobs: Vec<(String, i64, bool, bool)> =
                    serde_json::from_str(text).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                let jobs: Vec<Queued> = jobs
                    .into_iter()
                    .map(|(target, id, fresh, paused)| Queued {
                        target,
                        id,
                        fresh,
                        paused,
                    })
                    .collect();
                let all: Vec<&Intake> = all.iter().collect();
                accepted(&all, &vec![true; all.len()], &jobs).map(Some)
            }),
        })
    }
}

/// Inserts the deliveries of a batch (`$1`, a JSON array of [receiver,
/// delivery id, outcome]) received at `$2`; returns the new ones.
const DELIVERIES_PG: &str = "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
     SELECT d.value ->> 0, d.value ->> 1, $2, d.value ->> 2
     FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS d(value, key)
     ORDER BY d.key
     ON CONFLICT DO NOTHING
     RETURNING receiver, delivery_id";
const DELIVERIES_SQLITE: &str =
    "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
     SELECT d.value ->> 0, d.value ->> 1, $2, d.value ->> 2
     FROM json_each($1) AS d WHERE true ORDER BY d.key
     ON CONFLICT DO NOTHING
     RETURNING receiver, delivery_id";

/// The deliveries of `all` that have an id, as the `$1` of `DELIVERIES_*`;
/// None if none has.
fn delivery_rows(all: &[&Intake]) -> Result<Option<String>, sqlx::Error> {
    let ids: Vec<(&str, &str, &str)> = all
        .iter()
        .filter_map(|i| {
            Some((
                i.receiver.as_str(),
                i.delivery_id.as_deref()?,
                i.outcome.as_str(),
            ))
        })
        .collect();
    if ids.is_empty() {
        return Ok(None);
    }
    json_text(&ids).map(Some)
}

/// A delivery is taken once: by the first of the batch with its id (`new`:
/// the ids the insert wrote). One without an id is always taken.
fn taken(all: &[&Intake], mut new: HashSet<(String, String)>) -> Vec<bool> {
    all.iter()
        .map(|i| match &i.delivery_id {
            None => true,
            Some(id) => new.remove(&(i.receiver.clone(), id.clone())),
        })
        .collect()
}

/// The requests of the deliveries taken, in order.
fn taken_requests<'a>(all: &[&'a Intake], taken: &[bool]) -> Vec<&'a Request> {
    all.iter()
        .zip(taken)
        .filter(|(_, t)| **t)
        .flat_map(|(i, _)| i.requests.iter())
        .collect()
}

/// What each delivery of `all` hears, from the jobs its requests are in
/// (previews dropped are counted by the caller).
fn accepted(
    all: &[&Intake],
    taken: &[bool],
    jobs: &[Queued],
) -> Result<Vec<Accepted>, sqlx::Error> {
    let jobs: HashMap<&str, &Queued> = jobs.iter().map(|q| (q.target.as_str(), q)).collect();
    let mut out = Vec::with_capacity(all.len());
    for (i, taken) in all.iter().zip(taken) {
        if !taken {
            out.push(Accepted::Duplicate);
            continue;
        }
        let (mut queued, mut paused, mut new_job) = (Vec::new(), Vec::new(), false);
        for req in &i.requests {
            let q = jobs
                .get(req.target.as_str())
                .ok_or_else(|| no_job(&req.target))?;
            new_job |= q.fresh;
            if q.paused {
                paused.push(req.target.clone());
            }
            queued.push((req.target.clone(), q.id));
        }
        out.push(Accepted::Queued {
            jobs: queued,
            paused,
            dropped_previews: 0,
            new_job,
        });
    }
    Ok(out)
}

/// A worker's claim of the next runnable job: `sql` (`$1` now, `$2` the
/// Requests queued by one caller (an API call, the scheduler's pass).
struct Requests(Vec<Request>);

impl Batch for Requests {
    type Out = Vec<Queued>;

    /// Every request of every caller in one statement; each caller hears
    /// of the jobs its own requests are in, in its order.
    fn run<'t>(
        tx: &'t mut BatchTx,
        all: Vec<&'t Requests>,
    ) -> BoxFuture<'t, Result<Vec<Vec<Queued>>, sqlx::Error>> {
        Box::pin(async move {
            let reqs: Vec<&Request> = all.iter().flat_map(|r| r.0.iter()).collect();
            let jobs = enqueue_many(tx, &reqs).await?;
            each_callers(&all, &jobs)
        })
    }

    /// The same statement on SQLite's write thread.
    fn direct(all: Vec<&Requests>) -> Option<direct::Job<Vec<Vec<Queued>>>> {
        let all: Vec<Requests> = all.into_iter().map(|r| Requests(r.0.clone())).collect();
        Some(Box::new(move |tx| {
            let all: Vec<&Requests> = all.iter().collect();
            let reqs: Vec<&Request> = all.iter().flat_map(|r| r.0.iter()).collect();
            let jobs = enqueue_direct(tx, &reqs)?;
            each_callers(&all, &jobs)
        }))
    }
}

/// The jobs each caller's requests are in, in its order.
fn each_callers(all: &[&Requests], jobs: &[Queued]) -> Result<Vec<Vec<Queued>>, sqlx::Error> {
    let jobs: HashMap<&str, &Queued> = jobs.iter().map(|q| (q.target.as_str(), q)).collect();
    all.iter()
        .map(|r| {
            r.0.iter()
                .map(|req| {
                    jobs.get(req.target.as_str())
                        .map(|q| (*q).clone())
                        .ok_or_else(|| no_job(&req.target))
                })
                .collect()
        })
        .collect()
}

/// The job a request is in now.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Queued {
    target: String,
    id: i64,
    /// A new job rather than a fold into a queued one (a fold within the
    /// same millisecond may say new: only a worker wakes for nothing), and
    /// no job of its target running: a worker can take it now. One behind
    /// a running job is taken when that one ends, by its worker, which
    /// looks again at once; waking another for it would only send that
    /// one to the database for nothing (under a flood of pushes to one
    /// target, three reads a job).
    #[sqlx(try_from = "crate::store::db::Flag")]
    fresh: bool,
    /// Its target is paused (read in the same statement): the job waits.
    #[sqlx(try_from = "crate::store::db::Flag")]
    paused: bool,
}

/// A request whose job the upsert did not return (it returns one row a
/// request): the write fails, naming the target.
fn no_job(target: &str) -> sqlx::Error {
    sqlx::Error::Protocol(format!(
        "queueing a job for target `{target}` returned no job row"
    ))
}

/// Queue `reqs` in order, in one statement, each folded into its target's
/// queued job if there is one (an earlier request of the same statement
/// made it, or it was there): the job each target's requests are in now,
/// one row per target in no particular order.
///
/// Each target's requests are folded here first, as the upsert would fold
/// them one after another (triggers each once, in order; the newest sha
/// and receiver given; delivery ids in order, at most 100: the first 99
/// and the newest), and the statement folds each target's one row into
/// its queued job the same way. One row per target: PostgreSQL will not
/// let one `INSERT … ON CONFLICT DO UPDATE` touch a row twice, and on
/// SQLite a burst of deliveries for one target costs one fold of its
/// job's lists instead of one per delivery.
async fn enqueue_many(
    conn: &mut crate::store::db::Conn,
    reqs: &[&Request],
) -> Result<Vec<Queued>, sqlx::Error> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let sql = if is_postgres(conn) {
        ENQUEUE_PG
    } else {
        ENQUEUE_SQLITE
    };
    upsert_jobs(conn, sql, &fold_requests(reqs)).await
}

/// [`enqueue_many`] on SQLite's write thread.
fn enqueue_direct(
    tx: &rusqlite::Transaction<'_>,
    reqs: &[&Request],
) -> Result<Vec<Queued>, sqlx::Error> {
    if reqs.is_empty() {
        return Ok(Vec::new());
    }
    let rows = json_text(&fold_requests(reqs))?;
    let mut stmt = tx
        .prepare_cached(&format!("{ENQUEUE_SQLITE} {RETURNING_QUEUED}"))
        .map_err(direct::failure)?;
    stmt.query_map(
        rusqlite::named_params! { "$1": rows, "$2": now_ms() },
        |r| {
            Ok(Queued {
                target: r.get(0)?,
                id: r.get(1)?,
                fresh: r.get(2)?,
                paused: r.get(3)?,
            })
        },
    )
    .and_then(|rows| rows.collect())
    .map_err(direct::failure)
}

/// `reqs` folded into one row per target, in the order each target first
/// came: the `$1` of `ENQUEUE_*`.
fn fold_requests(reqs: &[&Request]) -> Vec<serde_json::Value> {
    struct Fold<'r> {
        target: &'r str,
        triggers: Vec<&'static str>,
        sha: Option<&'r str>,
        deliveries: Vec<&'r str>,
        receiver: Option<&'r str>,
    }
    let mut folds: Vec<Fold<'_>> = Vec::new();
    let mut at: HashMap<&str, usize> = HashMap::new();
    for r in reqs {
        let i = *at.entry(r.target.as_str()).or_insert_with(|| {
            folds.push(Fold {
                target: &r.target,
                triggers: Vec::new(),
                sha: None,
                deliveries: Vec::new(),
                receiver: None,
            });
            folds.len() - 1
        });
        let f = &mut folds[i];
        if !f.triggers.contains(&r.trigger.as_str()) {
            f.triggers.push(r.trigger.as_str());
        }
        f.sha = r.sha.as_deref().or(f.sha);
        f.receiver = r.receiver.as_deref().or(f.receiver);
        if let Some(d) = &r.delivery_id {
            f.deliveries.push(d);
        }
    }
    folds
        .into_iter()
        .map(|mut f| {
            if f.deliveries.len() > DELIVERY_IDS_KEPT {
                let newest = f.deliveries[f.deliveries.len() - 1];
                f.deliveries.truncate(DELIVERY_IDS_KEPT - 1);
                f.deliveries.push(newest);
            }
            serde_json::json!([f.target, f.triggers, f.sha, f.deliveries, f.receiver])
        })
        .collect()
}

/// Upserts rows ([target, triggers, sha, delivery ids, receiver]) into
/// their targets' queued jobs, made at `$now`, the rows from `$rows` (a
/// `FROM … AS x(r, n)` numbering them, in order). A person's `override`
/// makes a job waiting for its change window (or to be tried again)
/// runnable now. One text for [`ENQUEUE_PG`] and the intake function
/// ([`PG_INTAKE_FUNCTION`]).
macro_rules! enqueue_pg {
    ($rows:literal, $now:literal) => {
        concat!(
            "INSERT INTO jobs (target, state, triggers, requested_sha, delivery_ids, receiver, created_at, updated_at)
         SELECT r ->> 0, 'queued', (r -> 1)::text, r ->> 2, (r -> 3)::text, r ->> 4, ",
            $now,
            ", ",
            $now,
            "\n         ",
            $rows,
            "\n         ON CONFLICT (target) WHERE state = 'queued' DO UPDATE SET
             triggers = (jobs.triggers::jsonb || COALESCE(
                 (SELECT jsonb_agg(t ORDER BY o)
                  FROM jsonb_array_elements(excluded.triggers::jsonb) WITH ORDINALITY AS n(t, o)
                  WHERE NOT jobs.triggers::jsonb @> jsonb_build_array(t)),
                 '[]'::jsonb))::text,
             requested_sha = COALESCE(excluded.requested_sha, jobs.requested_sha),
             delivery_ids = (SELECT CASE WHEN jsonb_array_length(c) <= 100 THEN c
                                        ELSE (SELECT jsonb_agg(e ORDER BY o)
                                              FROM jsonb_array_elements(c) WITH ORDINALITY AS k(e, o)
                                              WHERE o < 100 OR o = jsonb_array_length(c)) END
                             FROM (SELECT jobs.delivery_ids::jsonb || excluded.delivery_ids::jsonb
                                          AS c) AS both_ids)::text,
             receiver = COALESCE(excluded.receiver, jobs.receiver),
             not_before = CASE WHEN strpos(excluded.triggers, '\"override\"') > 0 THEN 0
                          ELSE jobs.not_before END,
             updated_at = excluded.updated_at"
        )
    };
}

/// [`enqueue_pg`] of `$1`'s rows at `$2`.
const ENQUEUE_PG: &str = enqueue_pg!(
    "FROM jsonb_array_elements($1::jsonb) WITH ORDINALITY AS x(r, n) WHERE true ORDER BY n",
    "$2"
);

/// `n` numbers the job's list and then the new one, from 0. The general
/// fold (a union of `json_each`s, ordered through temporary b-trees) was a
/// third of SQLite's write thread's time under a flood of deliveries, so
/// the common cases take shortcuts that give the same arrays: triggers
/// already there stay as they are; delivery ids are appended as text while
/// they fit, and past the 100th only the newest changes. The columns hold
/// only what `->` and the json functions wrote (minified arrays), so their
/// text can be joined.
const ENQUEUE_SQLITE: &str = "INSERT INTO jobs (target, state, triggers, requested_sha, delivery_ids, receiver, created_at, updated_at)
         SELECT r.value ->> 0, 'queued', r.value -> 1, r.value ->> 2, r.value -> 3, r.value ->> 4, $2, $2
         FROM json_each($1) AS r WHERE true ORDER BY r.key
         ON CONFLICT (target) WHERE state = 'queued' DO UPDATE SET
             triggers = CASE WHEN excluded.triggers = jobs.triggers THEN jobs.triggers
                 ELSE (SELECT json_group_array(value ORDER BY n) FROM (
                     SELECT value, key AS n FROM json_each(jobs.triggers)
                     UNION ALL
                     SELECT value, json_array_length(jobs.triggers) + key FROM json_each(excluded.triggers)
                     WHERE value NOT IN (SELECT value FROM json_each(jobs.triggers)))) END,
             requested_sha = COALESCE(excluded.requested_sha, jobs.requested_sha),
             delivery_ids = CASE
                 WHEN excluded.delivery_ids = '[]' THEN jobs.delivery_ids
                 WHEN jobs.delivery_ids = '[]' THEN excluded.delivery_ids
                 WHEN json_array_length(jobs.delivery_ids) + json_array_length(excluded.delivery_ids) <= 100
                     THEN json(substr(jobs.delivery_ids, 1, length(jobs.delivery_ids) - 1)
                               || ',' || substr(excluded.delivery_ids, 2))
                 WHEN json_array_length(jobs.delivery_ids) = 100
                     THEN json_replace(jobs.delivery_ids, '$[99]', excluded.delivery_ids -> '$[#-1]')
                 ELSE (SELECT json_group_array(value ORDER BY n) FROM (
                     SELECT value, n, count(*) OVER () AS total FROM (
                         SELECT value, key AS n FROM json_each(jobs.delivery_ids)
                         UNION ALL
                         SELECT value, json_array_length(jobs.delivery_ids) + key
                         FROM json_each(excluded.delivery_ids)))
                     WHERE n < 99 OR n = total - 1) END,
             receiver = COALESCE(excluded.receiver, jobs.receiver),
             not_before = CASE WHEN instr(excluded.triggers, '\"override\"') > 0 THEN 0
                          ELSE jobs.not_before END,
             updated_at = excluded.updated_at";

/// The intake function a batch of deliveries is written with on
/// PostgreSQL ([`Intake::locked`]), made by [`pg_functions`].
const PG_INTAKE: &str = "pg_temp.driftless_intake";

/// The intake function the write connection makes as it opens, on
/// PostgreSQL (`lock`: the advisory lock every write takes; the parent's
/// `pg_functions` adds a worker's). `driftless_intake(rows,
/// now)`: `rows` is `[deliveries, jobs]`, each delivery [receiver, id,
/// outcome], each job a row of [`fold_requests`]. After the lock it
/// inserts the deliveries; if one is on record already it raises
/// [`crate::store::NOT_WRITTEN`], which rolls the call back whole (the
/// usual way then tells which). Else it upserts the jobs (a volatile
/// function's statement sees what committed before the lock) and answers
/// `[[target, id, fresh, paused], …]`. The inserts probe the key's index,
/// as the usual statements do: a read of `deliveries` joined to the batch
/// was planned as a scan of the whole table (2.9 ms a batch at 40,000
/// deliveries).
pub(crate) fn pg_functions(lock: i64) -> String {
    let enqueue = enqueue_pg!(
        "FROM jsonb_array_elements(p_rows::jsonb -> 1) WITH ORDINALITY AS x(r, n) ORDER BY n",
        "p_now"
    );
    let not_written = crate::store::NOT_WRITTEN;
    format!(
        "CREATE OR REPLACE FUNCTION {PG_INTAKE}(p_rows text, p_now bigint) RETURNS text
         LANGUAGE plpgsql VOLATILE AS $driftless$
         DECLARE answer text; recorded bigint;
         BEGIN
           PERFORM pg_advisory_xact_lock({lock});
           WITH inserted AS (
                  INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
                  SELECT d.value ->> 0, d.value ->> 1, p_now, d.value ->> 2
                  FROM jsonb_array_elements(p_rows::jsonb -> 0) WITH ORDINALITY AS d(value, key)
                  ORDER BY d.key
                  ON CONFLICT DO NOTHING
                  RETURNING 1)
           SELECT count(*) INTO recorded FROM inserted;
           IF recorded < jsonb_array_length(p_rows::jsonb -> 0) THEN
             RAISE EXCEPTION 'a delivery of the batch is on record already'
               USING ERRCODE = '{not_written}';
           END IF;
           WITH queued AS ({enqueue} {RETURNING_QUEUED})
           SELECT COALESCE(jsonb_agg(jsonb_build_array(target, id, fresh, paused)), '[]'::jsonb)::text
             INTO answer FROM queued;
           RETURN answer;
         END $driftless$"
    )
}

/// What an `ENQUEUE_*` upsert returns of each job: a [`Queued`].
const RETURNING_QUEUED: &str = "RETURNING target, id,
     created_at = updated_at
       AND NOT EXISTS (SELECT 1 FROM jobs r WHERE r.target = jobs.target AND r.state = 'running')
       AS fresh,
     EXISTS (SELECT 1 FROM targets WHERE name = jobs.target AND paused_at IS NOT NULL) AS paused";

/// A jobs upsert `sql` of `rows` (a JSON array, `$1`) at now (`$2`), each
/// row's job returned as a [`Queued`].
async fn upsert_jobs(
    conn: &mut crate::store::db::Conn,
    sql: &str,
    rows: &[serde_json::Value],
) -> Result<Vec<Queued>, sqlx::Error> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!("{sql} {RETURNING_QUEUED}")))
        .bind(json_text(&rows)?)
        .bind(now_ms())
        .fetch_all(conn)
        .await
}

/// The most delivery ids a job keeps: the first 99 and the newest.
const DELIVERY_IDS_KEPT: usize = 100;
