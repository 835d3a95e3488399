//! The durable job queue's policy: what should be reconciled, and by whom.
//!
//! A request (interval, manual, webhook, cli) becomes a row before anyone
//! is told it was accepted; the rows and every statement on them are
//! `store::jobs`'. This module decides what the statements do not: who a
//! process is (its owner identity), how long its claim on a job lasts
//! without a renewal, how long delivery ids are remembered, how many
//! times a job may be interrupted before its next run ends it, and what
//! an interrupted run says. The queue decides order, never what a backend
//! does.

use std::time::Duration;

use crate::model::Trigger;
use crate::store::jobs::Jobs;
pub use crate::store::jobs::{
    Accepted, Activity, Intake, Job, JobRecord, JobStatus, Lease, Request, RunningJob,
};
use crate::store::{Store, StoreError, now_ms};

/// How long a claim lasts without a heartbeat.
pub const LEASE: Duration = Duration::from_secs(30);
/// A job whose runs driftless died during this many times is not run
/// again: its next claim records a failed run that says so, and owners are
/// told (`tick`), so a job that takes driftless down cannot do it forever
/// and is never closed without a word.
pub const MAX_ATTEMPTS: i64 = 5;

/// The message of a run left open when its process died; counted by
/// [`Queue::interruptions`].
pub const INTERRUPTED: &str =
    "driftless stopped during this run (the process died or was killed); the job was queued again";

/// The message of a run whose tick stopped without a result (its worker
/// gave the job back).
const STOPPED: &str =
    "the tick stopped before recording a result (see the daemon log); the job was queued again";

/// How long delivery ids are remembered for dedupe.
pub const DELIVERY_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);

/// A job whose target another tick holds waits this long to be tried again.
pub const BUSY_RETRY: Duration = Duration::from_secs(2);
/// A job whose tick stopped on an error waits this long to be tried again.
pub const ERROR_RETRY: Duration = Duration::from_secs(10);

/// How a job ends when no run of its own records its end (a run closes
/// its job in the run's transaction). [`Queue::end`] says what each means.
#[derive(Debug, Clone, Copy)]
pub enum JobEnd<'a> {
    /// Its target is no longer configured: closed.
    Unknown,
    /// Its target is paused: closed (a push to it waits in a job of its
    /// own, queued again at `resume`).
    Paused,
    /// Another tick holds the target's lock: an interval tick is skipped,
    /// anything else waits [`BUSY_RETRY`] and is tried again.
    Busy { interval_only: bool },
    /// The push did not change the target: closed, saying why.
    Unaffected(&'a str),
    /// Not run, for the reason given: closed.
    Skipped(&'a str),
    /// The tick stopped on an error before recording a run: tried again
    /// after [`ERROR_RETRY`].
    Stopped,
    /// Outside its target's change window: queued again to look after
    /// this long, as if never claimed (its claim is not an attempt).
    Waiting(Duration),
}

/// The queue, bound to one owner identity (this process).
#[derive(Clone, Debug)]
pub struct Queue {
    jobs: Jobs,
    store: Store,
    owner: String,
    lease: Duration,
}

impl Queue {
    pub fn new(store: Store) -> Queue {
        let owner = format!("pid{}-{:08x}", std::process::id(), fastrand::u32(..));
        Queue::owned(store, owner, LEASE)
    }

    fn owned(store: Store, owner: String, lease: Duration) -> Queue {
        Queue {
            jobs: Jobs::new(store.clone(), owner.clone(), lease),
            store,
            owner,
            lease,
        }
    }

    /// The same queue, its claims lasting `lease` without a renewal
    /// (`[database] lease`).
    pub fn with_lease(self, lease: Duration) -> Queue {
        Queue::owned(self.store, self.owner, lease)
    }

    /// How long a claim lasts without a renewal.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// What a [`Lease`] holder renews this job's claim with.
    pub fn lease_of(&self, job_id: i64) -> Lease {
        self.jobs.lease_of(job_id)
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A target was resumed: queue a job that applies it if its branch
    /// moved while it was paused (git decides, as for a push; pushes that
    /// arrived meanwhile are already queued).
    pub async fn resumed(&self, target: &str) -> Result<i64, StoreError> {
        self.enqueue(&Request {
            target: target.to_string(),
            trigger: Trigger::Resume,
            sha: None,
            delivery_id: None,
            receiver: None,
        })
        .await
    }

    /// Add a request, folding it into the target's queued job if there is
    /// one. Returns the queued job's id; the request is on disk when this
    /// returns.
    pub async fn enqueue(&self, req: &Request) -> Result<i64, StoreError> {
        self.jobs.enqueue(req).await
    }

    /// Queue the interval ticks of the targets the scheduler found due
    /// ([`Jobs::enqueue_due`]): the targets queued, all on disk or none.
    pub async fn enqueue_due(
        &self,
        due: Vec<(Request, Option<i64>)>,
    ) -> Result<Vec<String>, StoreError> {
        self.jobs.enqueue_due(due).await
    }

    /// Record a webhook delivery and queue its requests, atomically
    /// ([`Jobs::accept`]).
    pub async fn accept(&self, intake: Intake) -> Result<Accepted, StoreError> {
        self.jobs.accept(intake).await
    }

    /// Forget delivery ids older than [`DELIVERY_MEMORY`].
    pub async fn prune_deliveries(&self) -> Result<u64, StoreError> {
        let cutoff = now_ms() - DELIVERY_MEMORY.as_millis() as i64;
        self.jobs.prune_deliveries(cutoff).await
    }

    /// A job by id: its state, outcome and run.
    pub async fn job(&self, id: i64) -> Result<Option<JobRecord>, StoreError> {
        self.jobs.job(id).await
    }

    /// Claim the oldest runnable job, leased to this process. Looked for
    /// with a read first, which waits for no writer: an idle worker that
    /// finds nothing takes no turn to write.
    pub async fn claim(&self) -> Result<Option<Job>, StoreError> {
        self.jobs.claim(true).await
    }

    /// The same claim by a worker that has just run a job, without the
    /// read first: while a round of interval ticks is worked off there
    /// mostly is a next job, and the read is a statement more a tick (the
    /// last claim of a round writes nothing, and commits nothing).
    pub async fn claim_next(&self) -> Result<Option<Job>, StoreError> {
        self.jobs.claim(false).await
    }

    /// A job running from the start, for a one-shot `tick` that already
    /// holds the target's lock ([`Jobs::start_now`]).
    pub async fn start_now(
        &self,
        target: &str,
        trigger: Trigger,
    ) -> Result<Option<Job>, StoreError> {
        self.jobs.start_now(target, trigger).await
    }

    /// Extend the lease. `false` when the job is no longer ours.
    pub async fn heartbeat(&self, job_id: i64) -> Result<bool, StoreError> {
        self.jobs.heartbeat(job_id).await
    }

    /// The job is over: `outcome` says how (`changed`, `failed`, `skipped: …`).
    pub async fn finish(
        &self,
        job_id: i64,
        run_id: Option<i64>,
        outcome: &str,
    ) -> Result<(), StoreError> {
        self.jobs.finish(job_id, run_id, outcome).await
    }

    /// End job `job_id` as `end` says: closed with an outcome that says
    /// why, or given back to run again later. The one place a job's end
    /// is decided when no run records it.
    pub async fn end(&self, job_id: i64, end: JobEnd<'_>) -> Result<(), StoreError> {
        let closed = |outcome: String| async move { self.finish(job_id, None, &outcome).await };
        match end {
            JobEnd::Unknown => closed("skipped: target no longer configured".into()).await,
            JobEnd::Paused => closed("skipped: target paused".into()).await,
            JobEnd::Busy {
                interval_only: true,
            } => closed("skipped: target locked by another tick".into()).await,
            JobEnd::Busy {
                interval_only: false,
            } => self.requeue(job_id, BUSY_RETRY).await,
            JobEnd::Unaffected(why) => closed(format!("unaffected: {why}")).await,
            JobEnd::Skipped(why) => closed(format!("skipped: {why}")).await,
            JobEnd::Stopped => self.requeue(job_id, ERROR_RETRY).await,
            JobEnd::Waiting(again) => self.jobs.defer(job_id, again).await,
        }
    }

    /// Give a running job back, to run after `delay`; the run it left open
    /// says the tick stopped without a result.
    pub async fn requeue(&self, job_id: i64, delay: Duration) -> Result<(), StoreError> {
        self.jobs.requeue(job_id, delay, STOPPED).await
    }

    /// Jobs whose lease expired go back to the queue (their process died);
    /// the runs they left open are marked `interrupted`. Returns the ids.
    pub async fn recover_expired(&self) -> Result<Vec<i64>, StoreError> {
        self.jobs.recover_expired(INTERRUPTED).await
    }

    /// Every job marked running.
    pub async fn running(&self) -> Result<Vec<RunningJob>, StoreError> {
        self.jobs.running().await
    }

    /// Put jobs that were running when their process died back in the queue
    /// and mark the runs they left open `interrupted`. Every one goes back:
    /// one interrupted [`MAX_ATTEMPTS`] times is ended by its next run, a
    /// failure that says why ([`Queue::interruptions`]).
    pub async fn recover(&self, ids: &[i64]) -> Result<(), StoreError> {
        self.jobs.recover(ids, INTERRUPTED).await
    }

    /// How many of job `job_id`'s runs were left open by a process that
    /// died (marked [`INTERRUPTED`] by [`Queue::recover`]).
    pub async fn interruptions(&self, job_id: i64) -> Result<i64, StoreError> {
        self.jobs.interruptions(job_id, INTERRUPTED).await
    }

    /// Queued and running counts per target.
    pub async fn activity(&self) -> Result<Vec<Activity>, StoreError> {
        self.jobs.activity().await
    }

    /// Replace the dependency table with `pairs`, (target, a target it
    /// waits on directly or through others): the daemon's configuration
    /// as it starts.
    pub async fn set_dependencies(&self, pairs: &[(String, String)]) -> Result<(), StoreError> {
        self.jobs.set_dependencies(pairs).await
    }

    /// Queued jobs for targets that are no longer configured are closed.
    pub async fn drop_unknown(&self, targets: &[String]) -> Result<u64, StoreError> {
        self.jobs.drop_unknown(targets).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Batch;

    /// A queue on SQLite, and one on PostgreSQL: each test runs on both.
    async fn queues() -> Vec<(std::sync::Arc<tempfile::TempDir>, Queue)> {
        let dir = std::sync::Arc::new(tempfile::tempdir().expect("tempdir"));
        crate::store::testing::stores(dir.path())
            .await
            .into_iter()
            .map(|s| (dir.clone(), Queue::new(s)))
            .collect()
    }

    fn req(target: &str, trigger: Trigger, sha: Option<&str>, delivery: Option<&str>) -> Request {
        Request {
            target: target.into(),
            trigger,
            sha: sha.map(Into::into),
            delivery_id: delivery.map(Into::into),
            receiver: None,
        }
    }

    #[tokio::test]
    async fn requests_fold_into_one_queued_job() {
        for (_d, q) in queues().await {
            let a = q
                .enqueue(&req("web", Trigger::Webhook, Some("aaa"), Some("d1")))
                .await
                .expect("enqueue");
            let b = q
                .enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            let c = q
                .enqueue(&req("web", Trigger::Webhook, Some("bbb"), Some("d2")))
                .await
                .expect("enqueue");
            assert_eq!(a, b);
            assert_eq!(b, c);
            let job = q.claim().await.expect("claim").expect("a job");
            assert_eq!(job.triggers, vec![Trigger::Webhook, Trigger::Interval]);
            assert_eq!(job.requested_sha.as_deref(), Some("bbb"));
            assert_eq!(job.delivery_ids, vec!["d1", "d2"]);
            // running: the target is not claimable again, but a new request queues
            assert_eq!(q.claim().await.expect("claim"), None);
            let d = q
                .enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            assert_ne!(d, job.id);
            // A job queued without a delivery takes the first one's id.
            let e = q
                .enqueue(&req("web", Trigger::Webhook, Some("ccc"), Some("d3")))
                .await
                .expect("enqueue");
            assert_eq!(d, e);
            // A worker that just ran a job claims without looking first:
            // the same answers.
            assert_eq!(q.claim_next().await.expect("claim"), None);
            q.finish(job.id, None, "changed").await.expect("finish");
            let next = q.claim_next().await.expect("claim").expect("the next job");
            assert_eq!(next.id, d);
            assert_eq!(next.triggers, vec![Trigger::Manual, Trigger::Webhook]);
            assert_eq!(next.delivery_ids, vec!["d3"]);
        }
    }

    fn intake(delivery: &str, reqs: Vec<Request>) -> Intake {
        Intake {
            receiver: "github".into(),
            delivery_id: Some(delivery.into()),
            outcome: "queued".into(),
            requests: reqs,
            pulls: Vec::new(),
            statuses: Vec::new(),
        }
    }

    /// Requests written in one statement fold into a target's job exactly
    /// as the same requests written one after another do: triggers each
    /// once in order, the newest sha and receiver, the first 99 delivery
    /// ids and the newest. (On PostgreSQL a batch is folded per target
    /// before its one upsert.)
    #[tokio::test]
    async fn requests_written_together_fold_as_one_after_another() {
        for (_d, q) in queues().await {
            let reqs = |target: &str| -> Vec<Request> {
                (0..300)
                    .map(|i| Request {
                        target: target.into(),
                        trigger: match i % 7 {
                            3 => Trigger::Interval,
                            5 => Trigger::Manual,
                            _ => Trigger::Webhook,
                        },
                        sha: (i % 7 != 3).then(|| format!("sha{i}")),
                        delivery_id: (i % 7 < 3).then(|| format!("d{i}")),
                        receiver: (i % 11 == 0).then(|| format!("r{i}")),
                    })
                    .collect()
            };
            // With a queued job for each first (its first requests), or
            // none; then the rest: one at a time for `seq`, in one
            // statement for `bat`.
            for head in [20, 0] {
                let (seq_t, bat_t) = (format!("seq{head}"), format!("bat{head}"));
                for r in reqs(&seq_t).iter().chain(&reqs(&bat_t)[..head]) {
                    q.enqueue(r).await.expect("enqueue");
                }
                q.jobs
                    .enqueue_together(&reqs(&bat_t)[head..])
                    .await
                    .expect("batch");
                let mut jobs = [
                    q.claim().await.expect("claim").expect("a job"),
                    q.claim().await.expect("claim").expect("a job"),
                ];
                assert!(q.claim().await.expect("claim").is_none());
                jobs.sort_by(|a, b| a.target.cmp(&b.target));
                let [bat, seq] = [&jobs[0], &jobs[1]];
                let kind = (q.store().kind(), head);
                assert_eq!(seq.triggers, bat.triggers, "{kind:?}");
                assert_eq!(seq.requested_sha, bat.requested_sha, "{kind:?}");
                assert_eq!(seq.receiver, bat.receiver, "{kind:?}");
                assert_eq!(seq.delivery_ids, bat.delivery_ids, "{kind:?}");
                assert_eq!(seq.delivery_ids.len(), 100, "{kind:?}");
                assert_eq!(
                    seq.triggers,
                    [Trigger::Webhook, Trigger::Interval, Trigger::Manual]
                );
                assert_eq!(seq.requested_sha.as_deref(), Some("sha299"));
                assert_eq!(seq.receiver.as_deref(), Some("r297"));
                assert_eq!(seq.delivery_ids.last().map(String::as_str), Some("d296"));
            }
        }
    }

    /// A delivery wakes a worker only for a job one can take now: one
    /// queued behind its target's running job is left to that job's
    /// worker, which looks again when it ends.
    #[tokio::test]
    async fn a_job_behind_a_running_one_wakes_no_worker() {
        for (_d, q) in queues().await {
            let push =
                |d: &str| intake(d, vec![req("web", Trigger::Webhook, Some("aaa"), Some(d))]);
            let woke = |a: Accepted| match a {
                Accepted::Queued { new_job, .. } => new_job,
                Accepted::Duplicate => panic!("taken as a duplicate"),
            };
            assert!(woke(q.accept(push("d1")).await.expect("accept")));
            // Folded into the queued job: nothing new.
            assert!(!woke(q.accept(push("d2")).await.expect("accept")));
            let job = q.claim().await.expect("claim").expect("a job");
            assert!(!woke(q.accept(push("d3")).await.expect("accept")));
            q.finish(job.id, None, "changed").await.expect("finish");
            let next = q.claim().await.expect("claim").expect("the job behind");
            assert_eq!(next.delivery_ids, vec!["d3"]);
            q.finish(next.id, None, "no_change").await.expect("finish");
            assert!(woke(q.accept(push("d4")).await.expect("accept")));
        }
    }

    /// Deliveries written together: the first of the batch with an id is
    /// taken, a later one and one seen before are duplicates, and the
    /// requests fold in the order the deliveries came.
    #[tokio::test]
    async fn deliveries_written_together_are_taken_once_in_order() {
        for (_d, q) in queues().await {
            let push = |d: &str, t: &str, sha: &str| {
                intake(d, vec![req(t, Trigger::Webhook, Some(sha), Some(d))])
            };
            assert!(matches!(
                q.accept(push("d0", "api", "000")).await.expect("accept"),
                Accepted::Queued { new_job: true, .. }
            ));
            let batch = [
                push("d1", "web", "aaa"),
                push("d0", "web", "xxx"), // seen before
                intake(
                    "d2",
                    vec![
                        req("web", Trigger::Webhook, Some("bbb"), Some("d2")),
                        req("api", Trigger::Webhook, Some("bbb"), Some("d2")),
                    ],
                ),
                push("d1", "web", "yyy"), // earlier in this batch
                push("d3", "web", "ccc"),
            ];
            let mut tx = q.store().begin_write("test").await.expect("begin");
            let out = Intake::run(&mut tx, batch.iter().collect())
                .await
                .expect("batch");
            tx.commit().await.expect("commit");
            assert_eq!(out.len(), 5);
            assert_eq!(out[1], Accepted::Duplicate);
            assert_eq!(out[3], Accepted::Duplicate);
            let jobs = |a: &Accepted| match a {
                Accepted::Queued { jobs, .. } => jobs.clone(),
                Accepted::Duplicate => panic!("a duplicate"),
            };
            let web = jobs(&out[0])[0].1;
            assert_eq!(jobs(&out[4]), vec![("web".to_string(), web)]);
            let api = jobs(&out[2]);
            assert_eq!(api[0], ("web".to_string(), web));
            assert_ne!(api[1].1, web);
            let first = q.claim().await.expect("claim").expect("api's job");
            assert_eq!(first.target, "api");
            assert_eq!(first.delivery_ids, vec!["d0", "d2"]);
            let job = q.claim().await.expect("claim").expect("web's job");
            assert_eq!(job.id, web);
            assert_eq!(job.requested_sha.as_deref(), Some("ccc"));
            assert_eq!(job.delivery_ids, vec!["d1", "d2", "d3"]);
            let kept: Vec<String> =
                sqlx::query_scalar("SELECT delivery_id FROM deliveries ORDER BY delivery_id")
                    .fetch_all(q.store().pool())
                    .await
                    .expect("deliveries");
            assert_eq!(kept, vec!["d0", "d1", "d2", "d3"]);
        }
    }

    /// The PostgreSQL queue of [`queues`] (none without PostgreSQL), with
    /// a connection of its own on which the write connection's functions
    /// are made (`store::jobs::pg_functions`).
    async fn with_functions() -> Vec<(
        std::sync::Arc<tempfile::TempDir>,
        Queue,
        sqlx::pool::PoolConnection<sqlx::Any>,
    )> {
        let mut out = Vec::new();
        for (d, q) in queues().await {
            if q.store().kind() != crate::store::Kind::Postgres {
                continue;
            }
            let mut conn = q
                .store()
                .connections()
                .acquire()
                .await
                .expect("a connection");
            sqlx::raw_sql(sqlx::AssertSqlSafe(crate::store::jobs::pg_functions(7)))
                .execute(&mut *conn)
                .await
                .expect("the functions");
            out.push((d, q, conn));
        }
        out
    }

    /// A call of the intake function ([`crate::store::Locked`]) on `conn`.
    async fn call_locked(
        conn: &mut sqlx::AnyConnection,
        call: crate::store::Locked<Vec<Accepted>>,
    ) -> Option<Vec<Accepted>> {
        let called = sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!(
            "SELECT {}($1, $2)",
            call.function
        )))
        .bind(call.rows)
        .bind(call.now)
        .fetch_one(&mut *conn)
        .await;
        match called {
            Ok(text) => (call.answers)(&text).expect("its answers"),
            // Rolled back: not for it.
            Err(sqlx::Error::Database(d))
                if d.code().as_deref() == Some(crate::store::NOT_WRITTEN) =>
            {
                None
            }
            Err(e) => panic!("the call: {e}"),
        }
    }

    /// On PostgreSQL a batch of deliveries is one call of the write
    /// connection's intake function. Every delivery new: it answers as
    /// the usual way does (`deliveries_written_together_…`). One seen
    /// before: it is rolled back whole, for the usual way to sort them
    /// out. An
    /// id twice in the batch: not written so at all.
    #[tokio::test]
    async fn the_intake_function_answers_as_the_usual_way_or_writes_nothing() {
        for (_d, q, mut conn) in with_functions().await {
            let push = |d: &str, t: &str, sha: &str| {
                intake(d, vec![req(t, Trigger::Webhook, Some(sha), Some(d))])
            };
            let Accepted::Queued { jobs: api, .. } =
                q.accept(push("d0", "api", "000")).await.expect("accept")
            else {
                panic!("d0 taken as a duplicate");
            };
            let api = api[0].1;
            let no_id = Intake {
                delivery_id: None,
                ..intake("", vec![req("web", Trigger::Webhook, Some("ccc"), None)])
            };
            let batch = [
                push("d1", "web", "aaa"),
                intake(
                    "d2",
                    vec![
                        req("web", Trigger::Webhook, Some("bbb"), Some("d2")),
                        req("api", Trigger::Webhook, Some("bbb"), Some("d2")),
                    ],
                ),
                no_id,
            ];
            let call = Intake::locked(batch.iter().collect()).expect("a call");
            let out = call_locked(&mut conn, call).await.expect("written");
            let jobs = |a: &Accepted| match a {
                Accepted::Queued { jobs, .. } => jobs.clone(),
                Accepted::Duplicate => panic!("a duplicate"),
            };
            assert_eq!(out.len(), 3);
            let web = jobs(&out[0])[0].1;
            assert_eq!(jobs(&out[0]), vec![("web".to_string(), web)]);
            assert_eq!(
                jobs(&out[1]),
                vec![("web".to_string(), web), ("api".to_string(), api)]
            );
            assert_eq!(jobs(&out[2]), vec![("web".to_string(), web)]);
            assert!(matches!(out[0], Accepted::Queued { new_job: true, .. }));

            // d1 was seen: nothing of this batch is written, d3 included.
            let again = [push("d3", "web", "ddd"), push("d1", "web", "eee")];
            let call = Intake::locked(again.iter().collect()).expect("a call");
            assert_eq!(call_locked(&mut conn, call).await, None);
            let twice = [push("d4", "web", "fff"), push("d4", "web", "fff")];
            assert!(Intake::locked(twice.iter().collect()).is_none());

            let kept: Vec<String> =
                sqlx::query_scalar("SELECT delivery_id FROM deliveries ORDER BY delivery_id")
                    .fetch_all(q.store().pool())
                    .await
                    .expect("deliveries");
            assert_eq!(kept, vec!["d0", "d1", "d2"]);
            let first = q.claim().await.expect("claim").expect("api's job");
            assert_eq!((first.id, first.target.as_str()), (api, "api"));
            assert_eq!(first.delivery_ids, vec!["d0", "d2"]);
            assert_eq!(first.requested_sha.as_deref(), Some("bbb"));
            let job = q.claim().await.expect("claim").expect("web's job");
            assert_eq!(job.id, web);
            assert_eq!(job.requested_sha.as_deref(), Some("ccc"));
            assert_eq!(job.delivery_ids, vec!["d1", "d2"]);
            assert_eq!(job.triggers, vec![Trigger::Webhook]);
            assert!(q.claim().await.expect("claim").is_none());
        }
    }

    /// On PostgreSQL a worker's claim and finish are each one call of a
    /// function of the write connection's own. The claim function takes
    /// the runnable jobs in order, one a claim, and answers null for a
    /// claim that found none (a target's second job waits for its first);
    /// the finish function closes the job. The queue's own claims go
    /// through the same function (this one's connection is not the
    /// queue's, so what the queue then claims shows both agree).
    #[tokio::test]
    async fn a_claim_and_a_finish_are_one_call_each_on_postgres() {
        for (_d, q, mut conn) in with_functions().await {
            let now = crate::store::now_ms();
            let claim = |n: usize| {
                let one = format!(r#"["me", 60000, {now}]"#);
                format!("[{}]", vec![one; n].join(", "))
            };
            let call = |rows: String| {
                sqlx::query_scalar::<_, String>("SELECT pg_temp.driftless_claim($1, $2)")
                    .bind(rows)
                    .bind(now)
            };
            // db's first job running, its second queued behind it (not
            // runnable, though older than web's and api's).
            q.enqueue(&req("db", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let first = call(claim(1)).fetch_one(&mut *conn).await.expect("a call");
            assert!(first.contains(r#""db""#), "{first}");
            q.enqueue(&req("db", Trigger::Webhook, Some("ddd"), Some("d0")))
                .await
                .expect("enqueue");
            let web = q
                .enqueue(&req("web", Trigger::Webhook, Some("aaa"), Some("d1")))
                .await
                .expect("enqueue");
            let api = q
                .enqueue(&req("api", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let answer = call(claim(3)).fetch_one(&mut *conn).await.expect("a call");
            let answer: serde_json::Value = serde_json::from_str(&answer).expect("JSON");
            assert_eq!(answer.as_array().map(Vec::len), Some(3), "{answer}");
            assert_eq!(answer[0][0], web, "{answer}");
            assert_eq!(answer[0][1], "web");
            assert_eq!(answer[0][2], r#"["webhook"]"#);
            assert_eq!(answer[0][3], "aaa");
            assert_eq!(answer[0][4], r#"["d1"]"#);
            assert_eq!(answer[0][5], 1);
            assert_eq!(answer[1][0], api, "{answer}");
            assert_eq!(answer[2], serde_json::Value::Null, "{answer}");
            // Queued behind web's running job: not runnable yet.
            let again = q
                .enqueue(&req("web", Trigger::Webhook, Some("bbb"), Some("d2")))
                .await
                .expect("enqueue");
            assert!(q.claim().await.expect("claim").is_none());
            let finish = format!(r#"[[{web}, null, "changed", {now}]]"#);
            let finished: String = sqlx::query_scalar("SELECT pg_temp.driftless_finish($1, $2)")
                .bind(&finish)
                .bind(now)
                .fetch_one(&mut *conn)
                .await
                .expect("the finish call");
            assert_eq!(finished, "1");
            let done = q.job(web).await.expect("job").expect("web's job");
            assert_eq!(done.state, crate::store::jobs::JobStatus::Done);
            assert_eq!(done.outcome.as_deref(), Some("changed"));
            let next = q.claim().await.expect("claim").expect("web's next job");
            assert_eq!(next.id, again);
            q.finish(next.id, None, "failed").await.expect("finish");
            let done = q.job(again).await.expect("job").expect("web's job");
            assert_eq!(done.outcome.as_deref(), Some("failed"));
        }
    }

    /// On PostgreSQL, a delivery, a worker's claim and another's finish
    /// sent at the same moment are one statement calling the three
    /// functions: the rows each wrote share one transaction. Each is
    /// answered as alone would be — the claim takes the job queued before,
    /// not the one the delivery queued beside it (its target is another).
    /// A delivery seen before among them rolls that statement back: each
    /// kind is then written alone, the claim and finish still by their
    /// calls, the duplicate found one.
    #[tokio::test]
    async fn a_delivery_a_claim_and_a_finish_at_once_are_one_statement_on_postgres() {
        for (_d, q) in queues().await {
            if q.store().kind() != crate::store::Kind::Postgres {
                continue;
            }
            let xmin = |sql: &'static str, id: String| {
                let q = q.clone();
                async move {
                    sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(sql))
                        .bind(id)
                        .fetch_one(q.store().pool())
                        .await
                        .expect("xmin")
                }
            };
            let job_xmin = "SELECT xmin::text FROM jobs WHERE id::text = $1";
            let delivery_xmin = "SELECT xmin::text FROM deliveries WHERE delivery_id = $1";
            for (round, seen) in [(0, None), (1, Some("d0"))] {
                q.enqueue(&req("db", Trigger::Manual, None, None))
                    .await
                    .expect("enqueue");
                let db = q.claim().await.expect("claim").expect("db's job");
                let api = q
                    .enqueue(&req("api", Trigger::Manual, None, None))
                    .await
                    .expect("enqueue");
                let id = format!("d{round}");
                let push = intake(
                    seen.unwrap_or(&id),
                    vec![req(
                        "web",
                        Trigger::Webhook,
                        Some("aaa"),
                        seen.or(Some(&id)),
                    )],
                );
                let (a, c, f) = (q.clone(), q.clone(), q.clone());
                let accepted = tokio::spawn(async move { a.accept(push).await });
                let claimed = tokio::spawn(async move { c.claim_next().await });
                let finished = tokio::spawn(async move { f.finish(db.id, None, "changed").await });
                let accepted = accepted.await.expect("task").expect("accepted");
                let claimed = claimed.await.expect("task").expect("claimed");
                finished.await.expect("task").expect("finished");
                let claimed = claimed.expect("api's job");
                assert_eq!(claimed.id, api, "round {round}");
                q.finish(api, None, "changed").await.expect("finish");
                let done = q.job(db.id).await.expect("job").expect("db's job");
                assert_eq!(done.outcome.as_deref(), Some("changed"), "round {round}");
                match (seen, accepted) {
                    (None, Accepted::Queued { jobs, .. }) => {
                        assert_eq!(jobs[0].0, "web");
                        let wrote = [
                            xmin(delivery_xmin, id.clone()).await,
                            xmin(job_xmin, jobs[0].1.to_string()).await,
                            xmin(job_xmin, db.id.to_string()).await,
                        ];
                        assert!(wrote.iter().all(|x| *x == wrote[0]), "{wrote:?}");
                        let web = q.claim().await.expect("claim").expect("web's job");
                        q.finish(web.id, None, "changed").await.expect("finish");
                    }
                    (Some(_), Accepted::Duplicate) => {}
                    (_, other) => panic!("round {round}: {other:?}"),
                }
            }
        }
    }

    /// A database user without the TEMP privilege: the write connection
    /// cannot make its functions, and deliveries are written the usual
    /// way, every one taken once.
    #[tokio::test]
    async fn without_temporary_functions_deliveries_are_written_the_usual_way() {
        let url = crate::store::testing::database().await;
        let db = url
            .split('?')
            .next()
            .and_then(|u| u.rsplit_once('/'))
            .map(|(_, db)| db.to_string())
            .expect("a database name");
        crate::store::testing::execute(
            None,
            &format!(
                "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'notemp')
                   THEN CREATE ROLE notemp LOGIN; END IF; END $$;
                 ALTER DATABASE \"{db}\" OWNER TO notemp;
                 REVOKE TEMPORARY ON DATABASE \"{db}\" FROM PUBLIC, notemp"
            ),
        )
        .await;
        let url = url.replacen("postgres://postgres@", "postgres://notemp@", 1);
        let q = Queue::new(Store::open_postgres(&url).await.expect("a store"));
        let mut taken = 0;
        for d in ["d1", "d2", "d1"] {
            let a = q
                .accept(intake(
                    d,
                    vec![req("web", Trigger::Webhook, Some("aaa"), Some(d))],
                ))
                .await
                .expect("accept");
            taken += usize::from(a != Accepted::Duplicate);
        }
        assert_eq!(taken, 2);
        let job = q.claim().await.expect("claim").expect("web's job");
        assert_eq!(job.delivery_ids, vec!["d1", "d2"]);
    }

    /// Many deliveries at once (batched by the writer as they come): each
    /// id taken exactly once, every request in its target's one job.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliveries_arriving_together_are_each_taken_once() {
        for (_d, q) in queues().await {
            let mut all = Vec::new();
            for n in 0..200 {
                let q = q.clone();
                let id = format!("d{}", n % 150);
                let target = format!("t{}", n % 7);
                all.push(tokio::spawn(async move {
                    q.accept(intake(
                        &id,
                        vec![req(&target, Trigger::Webhook, Some("abc"), Some(&id))],
                    ))
                    .await
                    .map(|a| (id, a))
                }));
            }
            let mut taken = std::collections::BTreeSet::new();
            for h in all {
                let (id, a) = h.await.expect("task").expect("accept");
                if a != Accepted::Duplicate {
                    assert!(taken.insert(id.clone()), "{id} taken twice");
                }
            }
            assert_eq!(taken.len(), 150);
            let mut ids = 0;
            while let Some(job) = q.claim().await.expect("claim") {
                ids += job.delivery_ids.len();
            }
            assert_eq!(ids, 150);
        }
    }

    #[tokio::test]
    async fn requeue_merges_into_a_newer_queued_job() {
        for (_d, q) in queues().await {
            q.enqueue(&req("web", Trigger::Webhook, Some("old"), Some("d1")))
                .await
                .expect("enqueue");
            let running = q.claim().await.expect("claim").expect("job");
            let newer = q
                .enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            q.requeue(running.id, Duration::ZERO)
                .await
                .expect("requeue");
            let job = q.claim().await.expect("claim").expect("job");
            assert_eq!(job.id, newer);
            assert_eq!(job.triggers, vec![Trigger::Webhook, Trigger::Interval]);
            assert_eq!(job.delivery_ids, vec!["d1"]);
            assert_eq!(job.requested_sha.as_deref(), Some("old"));
        }
    }

    /// A manual apply of `web` begun for job `job`: its run id.
    /// The queue's store, with the target `web` (an exec target) known.
    async fn with_web(q: &Queue) -> Store {
        let store = q.store().clone();
        store
            .register_targets(&[("web", "exec")])
            .await
            .expect("register");
        store
    }

    async fn begin_manual_run(store: &Store, job: i64) -> i64 {
        store
            .begin_run(&crate::store::NewRun {
                target: "web",
                job_id: Some(job),
                operation: crate::store::Operation::Apply,
                trigger: "manual",
                delivery_id: None,
                requested_sha: None,
                receiver: None,
                sha: None,
            })
            .await
            .expect("run")
    }

    #[tokio::test]
    async fn expired_leases_are_recovered_and_runs_interrupted() {
        for (_d, q) in queues().await {
            q.enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let store = with_web(&q).await;
            let run = begin_manual_run(&store, job.id).await;
            // not expired yet
            assert!(q.recover_expired().await.expect("recover").is_empty());
            let expire = sqlx::query("UPDATE jobs SET lease_until = 0 WHERE id = $1").bind(job.id);
            store.write_one("test", expire).await.expect("expire");
            assert_eq!(q.recover_expired().await.expect("recover"), vec![job.id]);
            let r = store.run(run).await.expect("read").expect("run row");
            assert_eq!(r.result.as_deref(), Some("interrupted"));
            let again = q.claim().await.expect("claim").expect("requeued");
            assert_eq!(again.id, job.id);
            assert_eq!(again.attempts, 2);
            assert_eq!(q.interruptions(job.id).await.expect("count"), 1);
            // Every interrupted job goes back, however often: the tick,
            // not the queue, ends one interrupted MAX_ATTEMPTS times.
            for n in 2..=MAX_ATTEMPTS + 1 {
                begin_manual_run(&store, job.id).await;
                q.recover(&[job.id]).await.expect("recover");
                assert_eq!(q.interruptions(job.id).await.expect("count"), n);
                let back = q.claim().await.expect("claim").expect("requeued again");
                assert_eq!(back.id, job.id);
            }
            // A run stopped another way (a tick error) is not counted.
            begin_manual_run(&store, job.id).await;
            q.requeue(job.id, std::time::Duration::ZERO)
                .await
                .expect("requeue");
            assert_eq!(
                q.interruptions(job.id).await.expect("count"),
                MAX_ATTEMPTS + 1
            );
            let back = q
                .claim()
                .await
                .expect("claim")
                .expect("requeued by the tick");
            assert_eq!(back.id, job.id);
            // someone else's heartbeat cannot keep it
            let other = Queue::new(store);
            assert!(!other.heartbeat(job.id).await.expect("hb"));
            assert!(q.heartbeat(job.id).await.expect("hb"));
            // A requeue with a delay is not claimed before it.
            q.requeue(job.id, std::time::Duration::from_secs(60))
                .await
                .expect("requeue");
            assert!(q.claim().await.expect("claim").is_none(), "claimed early");
            let not_before: i64 = sqlx::query_scalar("SELECT not_before FROM jobs WHERE id = $1")
                .bind(job.id)
                .fetch_one(q.store.pool())
                .await
                .expect("read");
            let now = crate::store::now_ms();
            assert!(
                (now + 55_000..=now + 60_000).contains(&not_before),
                "{not_before} vs {now}"
            );
        }
    }

    /// A worker whose job was taken over (its lease ran out, another
    /// process recovered and claimed it) records its run when it ends but
    /// does not close the job the other process now runs.
    #[tokio::test]
    async fn a_run_whose_job_was_taken_over_leaves_the_job_alone() {
        for (_d, q) in queues().await {
            let store = with_web(&q).await;
            q.enqueue(&req("web", Trigger::Manual, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let run = begin_manual_run(&store, job.id).await;
            let expire = sqlx::query("UPDATE jobs SET lease_until = 0 WHERE id = $1").bind(job.id);
            store.write_one("test", expire).await.expect("expire");
            let other = Queue::new(store.clone());
            assert_eq!(
                other.recover_expired().await.expect("recover"),
                vec![job.id]
            );
            let taken = other.claim().await.expect("claim").expect("taken over");
            assert_eq!(taken.id, job.id);
            store
                .finish_run(
                    run,
                    "web",
                    crate::store::Operation::Apply,
                    Some("abc"),
                    &crate::model::Status {
                        result: crate::model::ApplyResult::Changed,
                        message: "applied".into(),
                        output_tail: String::new(),
                        digest: None,
                    },
                    None,
                    crate::store::runs::Streak::No,
                )
                .await
                .expect("finish");
            let row = q.job(job.id).await.expect("read").expect("job row");
            assert_eq!(row.state.as_str(), "running", "{:?}", store.kind());
            assert!(
                other.heartbeat(job.id).await.expect("hb"),
                "{:?}",
                store.kind()
            );
            let runs: i64 =
                sqlx::query_scalar("SELECT COUNT(*) FROM runs WHERE result = 'changed'")
                    .fetch_one(store.pool())
                    .await
                    .expect("runs");
            assert_eq!(runs, 1, "the run was not recorded as it ended");
        }
    }

    /// The scheduler's due targets are checked again inside the write that
    /// queues them: a target another instance queued, ran and finished
    /// after the scheduler read it gets no second interval tick.
    #[tokio::test]
    async fn an_interval_tick_is_not_queued_for_a_target_run_since_it_was_read() {
        for (_d, q) in queues().await {
            let store = with_web(&q).await;
            let read = |store: Store| async move {
                let c = store
                    .schedule_candidates(&["web".to_string()])
                    .await
                    .expect("candidates");
                assert_eq!(c.len(), 1);
                assert!(!c[0].active && !c[0].paused);
                c[0].last_run_at
            };
            let before = read(store.clone()).await;
            // Meanwhile another instance runs the target's interval tick.
            q.enqueue(&req("web", Trigger::Interval, None, None))
                .await
                .expect("enqueue");
            let job = q.claim().await.expect("claim").expect("job");
            let run = begin_manual_run(&store, job.id).await;
            q.finish(job.id, Some(run), "no_change")
                .await
                .expect("finish");
            let interval = || req("web", Trigger::Interval, None, None);
            let queued = q
                .enqueue_due(vec![(interval(), before)])
                .await
                .expect("enqueue_due");
            assert!(queued.is_empty(), "{:?}: {queued:?}", store.kind());
            assert!(
                q.claim().await.expect("claim").is_none(),
                "{:?}",
                store.kind()
            );
            // Read again, it is due by what it reads.
            let after = read(store.clone()).await;
            assert_ne!(after, before);
            let queued = q
                .enqueue_due(vec![(interval(), after)])
                .await
                .expect("enqueue_due");
            assert_eq!(queued, ["web"], "{:?}", store.kind());
            // Queued once: a second look finds it active.
            let queued = q
                .enqueue_due(vec![(interval(), after)])
                .await
                .expect("enqueue_due");
            assert!(queued.is_empty(), "{:?}: {queued:?}", store.kind());
        }
    }

    #[tokio::test]
    async fn start_now_refuses_a_second_running_job() {
        for (_d, q) in queues().await {
            let a = q.start_now("web", Trigger::Cli).await.expect("start");
            assert!(a.is_some());
            let b = q.start_now("web", Trigger::Cli).await.expect("start");
            assert!(b.is_none());
        }
    }
}
