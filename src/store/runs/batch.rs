//! A run's start and end as group writes (`store::group`): the runs of
//! several workers starting or ending at the same moment share one
//! transaction, and so one fsync. On SQLite a batch of them is written on
//! the write thread's own connection (`store::direct`) in one call, not a
//! hand-off to sqlx's thread for each of the eleven or so statements of a
//! run that found nothing to do — most of such a tick's CPU was those
//! hand-offs. The statements are the ones sqlx runs on PostgreSQL (and on
//! SQLite for an end that also queues notifications, tells a plan's
//! owners or leaves a commit status, which stays on sqlx): one text, bound
//! twice. This module writes what `Store::begin_run_with_state` and
//! `Store::finish_run` were given; what a result means is decided before.

use rusqlite::Transaction;

use super::{DELETE_RUN, FOLD_INTO, STREAK_JOB, STREAK_ROW, Streak, Tx, fold};
use crate::model::{BoxFuture, Status};
use crate::store::direct::{self, failure};
use crate::store::{Batch, NewRun, Notice, Operation, TargetState, jobs, outbox, statuses};

const INSERT_RUN: &str = "INSERT INTO runs
     (target, job_id, operation, trigger, delivery_id, requested_sha, started_at, receiver, sha)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id";

/// Whether the run `$1` was marked interrupted (its lease ran out and
/// another process took its job).
const INTERRUPTED: &str = "SELECT COUNT(*) FROM runs WHERE id = $1 AND result = 'interrupted'";

/// Run `$1` ends at `$2` with result `$3`, message `$4`, output tail `$5`.
const FINISH_RUN: &str =
    "UPDATE runs SET finished_at = $2, duration_ms = $2 - started_at, result = $3,
            message = $4, output_tail = $5
     WHERE id = $1";

/// A run about to start ([`NewRun`], owned), at `now`.
#[derive(Clone)]
pub(super) struct Start {
    target: String,
    job_id: Option<i64>,
    operation: Operation,
    trigger: String,
    delivery_id: Option<String>,
    requested_sha: Option<String>,
    receiver: Option<String>,
    sha: Option<String>,
    now: i64,
}

impl Start {
    pub(super) fn of(run: &NewRun<'_>, now: i64) -> Start {
        let own = |s: Option<&str>| s.map(str::to_string);
        Start {
            target: run.target.to_string(),
            job_id: run.job_id,
            operation: run.operation,
            trigger: run.trigger.to_string(),
            delivery_id: own(run.delivery_id),
            requested_sha: own(run.requested_sha),
            receiver: own(run.receiver),
            sha: own(run.sha),
            now,
        }
    }
}

/// The run's id, and its target's state as the start left it.
type Begun = (i64, Option<TargetState>);

impl Batch for Start {
    type Out = Begun;

    fn run<'t>(
        tx: &'t mut Tx,
        all: Vec<&'t Start>,
    ) -> BoxFuture<'t, Result<Vec<Begun>, sqlx::Error>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(all.len());
            for s in all {
                let id: i64 = sqlx::query_scalar(INSERT_RUN)
                    .bind(&s.target)
                    .bind(s.job_id)
                    .bind(s.operation.as_str())
                    .bind(&s.trigger)
                    .bind(&s.delivery_id)
                    .bind(&s.requested_sha)
                    .bind(s.now)
                    .bind(&s.receiver)
                    .bind(&s.sha)
                    .fetch_one(&mut **tx)
                    .await?;
                let state = crate::store::targets::note_run_start(tx, &s.target, s.now).await?;
                out.push((id, state));
            }
            Ok(out)
        })
    }

    fn direct(all: Vec<&Start>) -> Option<direct::Job<Vec<Begun>>> {
        let all: Vec<Start> = all.into_iter().cloned().collect();
        Some(Box::new(move |tx| {
            let mut out = Vec::with_capacity(all.len());
            for s in &all {
                let id: i64 = tx
                    .prepare_cached(INSERT_RUN)
                    .and_then(|mut stmt| {
                        stmt.query_row(
                            rusqlite::named_params! {
                                "$1": s.target, "$2": s.job_id, "$3": s.operation.as_str(),
                                "$4": s.trigger, "$5": s.delivery_id, "$6": s.requested_sha,
                                "$7": s.now, "$8": s.receiver, "$9": s.sha,
                            },
                            |r| r.get(0),
                        )
                    })
                    .map_err(failure)?;
                let state = crate::store::targets::note_run_start_direct(tx, &s.target, s.now)?;
                out.push((id, state));
            }
            Ok(out)
        }))
    }
}

/// The streak a run's end joins ([`Streak`], owned).
#[derive(Clone)]
pub(super) enum Joins {
    No,
    Row(i64),
    Find {
        sha: Option<String>,
        trigger: String,
    },
}

impl From<Streak<'_>> for Joins {
    fn from(s: Streak<'_>) -> Joins {
        match s {
            Streak::No => Joins::No,
            Streak::Row(id) => Joins::Row(id),
            Streak::Find { sha, trigger } => Joins::Find {
                sha: sha.map(str::to_string),
                trigger: trigger.to_string(),
            },
        }
    }
}

impl Joins {
    fn streak(&self) -> Streak<'_> {
        match self {
            Joins::No => Streak::No,
            Joins::Row(id) => Streak::Row(*id),
            Joins::Find { sha, trigger } => Streak::Find {
                sha: sha.as_deref(),
                trigger,
            },
        }
    }
}

/// A run's end with all it changes (`Store::finish_run`'s arguments).
#[derive(Clone)]
pub(super) struct End {
    pub(super) run_id: i64,
    pub(super) target: String,
    pub(super) operation: Operation,
    pub(super) sha: Option<String>,
    pub(super) status: Status,
    pub(super) notice: Option<Notice>,
    pub(super) streak: Joins,
    pub(super) now: i64,
}

impl Batch for End {
    /// The id of the row the run now is (its own, or its streak's).
    type Out = i64;

    fn run<'t>(tx: &'t mut Tx, all: Vec<&'t End>) -> BoxFuture<'t, Result<Vec<i64>, sqlx::Error>> {
        Box::pin(async move {
            let mut out = Vec::with_capacity(all.len());
            for e in all {
                out.push(end(tx, e).await?);
            }
            Ok(out)
        })
    }

    /// Only ends whose notice writes nothing but the target's row: a
    /// notification, a plan or a commit status is written by its own
    /// module, on sqlx.
    fn direct(all: Vec<&End>) -> Option<direct::Job<Vec<i64>>> {
        if all
            .iter()
            .any(|e| e.notice.as_ref().is_some_and(|n| !n.only_columns()))
        {
            return None;
        }
        let all: Vec<End> = all.into_iter().cloned().collect();
        Some(Box::new(move |tx| {
            all.iter().map(|e| end_direct(tx, e)).collect()
        }))
    }
}

/// One run's end in the batch's transaction: the run (or the streak it
/// joins), its job, its target's row, and what its notice carries.
async fn end(tx: &mut Tx, e: &End) -> Result<i64, sqlx::Error> {
    // A run whose job was taken from this process (its lease ran out:
    // whoever recovered the job marked the run interrupted) is recorded
    // as it ended, but its job — another process's now — is left alone.
    let taken: i64 = sqlx::query_scalar(INTERRUPTED)
        .bind(e.run_id)
        .fetch_one(&mut **tx)
        .await?;
    let status = &e.status;
    let kept = fold(tx, &e.target, e.streak.streak(), e.run_id, e.now, status).await?;
    if kept == e.run_id {
        sqlx::query(FINISH_RUN)
            .bind(e.run_id)
            .bind(e.now)
            .bind(status.result.as_str())
            .bind(&status.message)
            .bind(&status.output_tail)
            .execute(&mut **tx)
            .await?;
    }
    // The run's job is over with it, in the same transaction: a job
    // whose run is recorded is never run again.
    if taken == 0 {
        jobs::close_with_run(tx, kept, status.result.as_str(), e.now).await?;
    }
    let notice = e.notice.as_ref();
    let (target, now) = (e.target.as_str(), e.now);
    crate::store::targets::record_result(
        tx,
        target,
        (kept, e.operation, e.sha.as_deref()),
        status,
        notice,
        now,
    )
    .await?;
    if let Some(n) = notice {
        outbox::queue_notifications(tx, target, Some(kept), &n.outbox, now).await?;
        for (id, told) in &n.plans_told {
            crate::store::deployments::mark_told(tx, *id, *told, now).await?;
        }
        for s in &n.statuses {
            statuses::record(tx, s, false).await?;
        }
        if let Some((id, state, message)) = &n.plan_done {
            crate::store::deployments::finish_applying(tx, (*id, target), *state, message, now)
                .await?;
        }
    }
    Ok(kept)
}

/// [`end`] on SQLite's write thread, for an end whose notice writes only
/// the target's row: the same statements in the same order.
fn end_direct(tx: &Transaction<'_>, e: &End) -> Result<i64, sqlx::Error> {
    let taken: i64 = tx
        .prepare_cached(INTERRUPTED)
        .and_then(|mut s| s.query_row(rusqlite::named_params! { "$1": e.run_id }, |r| r.get(0)))
        .map_err(failure)?;
    let status = &e.status;
    let kept = fold_direct(tx, e)?;
    if kept == e.run_id {
        tx.prepare_cached(FINISH_RUN)
            .and_then(|mut s| {
                s.execute(rusqlite::named_params! {
                    "$1": e.run_id, "$2": e.now, "$3": status.result.as_str(),
                    "$4": status.message, "$5": status.output_tail,
                })
            })
            .map_err(failure)?;
    }
    if taken == 0 {
        tx.prepare_cached(jobs::CLOSE_WITH_RUN)
            .and_then(|mut s| {
                s.execute(rusqlite::named_params! {
                    "$1": kept, "$2": status.result.as_str(), "$3": e.now,
                })
            })
            .map_err(failure)?;
    }
    crate::store::targets::record_result_direct(
        tx,
        &e.target,
        (kept, e.operation, e.sha.as_deref()),
        status,
        e.notice.as_ref(),
        e.now,
    )?;
    Ok(kept)
}

/// `runs::fold` on SQLite's write thread: the streak row the end joins,
/// if there is one that takes it, counts it, and the run's own row goes.
fn fold_direct(tx: &Transaction<'_>, e: &End) -> Result<i64, sqlx::Error> {
    use rusqlite::OptionalExtension;
    let status = &e.status;
    let found: Option<(i64, Option<i64>)> = match &e.streak {
        Joins::No => None,
        Joins::Row(id) => tx
            .prepare_cached(STREAK_JOB)
            .and_then(|mut s| {
                s.query_row(rusqlite::named_params! { "$1": id }, |r| r.get(0))
                    .optional()
            })
            .map_err(failure)?
            .map(|job| (*id, job)),
        Joins::Find { sha, trigger } => tx
            .prepare_cached(STREAK_ROW)
            .and_then(|mut s| {
                s.query_row(
                    rusqlite::named_params! {
                        "$1": e.target, "$2": e.run_id, "$3": sha, "$4": trigger,
                        "$5": status.message,
                    },
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()
            })
            .map_err(failure)?,
    };
    let Some((streak, older_job)) = found else {
        return Ok(e.run_id);
    };
    let folded = tx
        .prepare_cached(FOLD_INTO)
        .and_then(|mut s| {
            s.execute(rusqlite::named_params! {
                "$1": streak, "$2": e.run_id, "$3": e.now, "$4": status.output_tail,
                "$5": status.result.as_str(), "$6": status.message,
            })
        })
        .map_err(failure)?;
    if folded != 1 {
        return Ok(e.run_id);
    }
    crate::store::run_output::fold_direct(tx, e.run_id, streak)?;
    tx.prepare_cached(DELETE_RUN)
        .and_then(|mut s| s.execute(rusqlite::named_params! { "$1": e.run_id }))
        .map_err(failure)?;
    tx.prepare_cached(jobs::DELETE_IF_UNNAMED)
        .and_then(|mut s| s.execute(rusqlite::named_params! { "$1": older_job }))
        .map_err(failure)?;
    Ok(streak)
}
