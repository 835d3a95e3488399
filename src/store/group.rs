//! Group commit: small writes that arrive together share one transaction,
//! and so one fsync. A single writer (on SQLite a thread of its own, on
//! PostgreSQL a task) takes every write waiting at that moment (at most
//! [`MAX_BATCH`]), runs them in one transaction, commits, and only then
//! answers each caller: nobody hears "done" before the commit is on disk,
//! and if the commit fails every caller hears that. A write that fails
//! rolls the batch back, and its writes are then run again one transaction
//! each, so one bad write never takes the others with it (and the common
//! case pays for no savepoints). Under load the next batch gathers while
//! the previous one commits. Writes of one [`Batch`] kind next to each
//! other in a batch run together, so the kind can write them all with one
//! statement (a batch of webhook deliveries: one insert for the
//! deliveries, one for their jobs) instead of a statement each. On SQLite,
//! a batch whose every write is of a kind that has a `direct` job is
//! written on `store::direct`'s connection instead, in one blocking call on
//! the writer thread, taking the same turn to write. On PostgreSQL, the
//! writes of a batch of a kind that has a `locked` call are written by that
//! one call (a function of the write connection's own that takes the write
//! lock: one round trip, a transaction of its own); a batch of nothing but
//! such kinds, by one statement calling each kind's function; in a batch
//! with other writes, each such kind by its own call, one after the other,
//! and the other writes after them in a transaction of their own. This module runs
//! what it is given; it knows nothing of deliveries or jobs.

use std::any::{Any, TypeId};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError, direct};
use crate::model::BoxFuture;

/// The most writes one transaction takes.
pub const MAX_BATCH: usize = 256;

/// The transaction a batch's writes share.
pub type Tx = crate::store::db::Tx;

/// One write: runs in the batch's transaction, keeps its own result. Run
/// again (in a transaction of its own) when another write of its batch
/// failed, so it may run more than once before one commit: it must only
/// write, and keep the result of its last run.
type One = Box<dyn for<'t> FnMut(&'t mut Tx) -> BoxFuture<'t, Result<(), sqlx::Error>> + Send>;

/// Writes of one kind that are written together: `run` is given every
/// write of the kind that stands next to each other in a batch, in the
/// order they came, and answers each in that order. Like a grouped
/// write, it may run more than once before one commit (alone, when
/// another write of its batch failed): it must only write.
pub trait Batch: Send + Sync + Sized + 'static {
    type Out: Send + 'static;
    fn run<'t>(
        tx: &'t mut Tx,
        all: Vec<&'t Self>,
    ) -> BoxFuture<'t, Result<Vec<Self::Out>, sqlx::Error>>;

    /// The same writes as `run`, as one job for SQLite's write thread
    /// (`direct`), where they are written without a hand-off for each
    /// statement; None (the default) where these cannot be written there.
    /// A batch of nothing but this kind goes there on SQLite.
    fn direct(_all: Vec<&Self>) -> Option<direct::Job<Vec<Self::Out>>> {
        None
    }

    /// The same writes as `run`, as one call of a PL/pgSQL function that
    /// takes the write lock itself: on PostgreSQL a batch of nothing but
    /// this kind is then one round trip (the call is a transaction of its
    /// own) instead of `BEGIN` with the lock, a statement or more, and
    /// `COMMIT`. None (the default) where these cannot be written so.
    fn locked(_all: Vec<&Self>) -> Option<Locked<Vec<Self::Out>>> {
        None
    }
}

/// The SQLSTATE a [`Locked`] function raises when the batch is not for it
/// (a delivery seen before): the call is rolled back whole, and the batch
/// is written the usual way.
pub const NOT_WRITTEN: &str = "DLSKP";

/// A [`Batch`] kind's writes as one call of `function`, a PL/pgSQL
/// function made on the write connection as it opens (`pg_temp`: it lives
/// as long as the connection, and is always this build's), called as
/// `function(rows, now)`. It takes the write lock first (its statements
/// then read what committed before it, a volatile function's statements
/// each taking a snapshot of their own) and answers with text.
pub struct Locked<A> {
    pub function: &'static str,
    pub rows: String,
    pub now: i64,
    /// The function's answer → the writes' answers (each write's, in
    /// order); `None`: the batch is written the usual way.
    pub answers: ReadAnswers<A>,
}

/// How a [`Locked`] call's answer is read.
pub type ReadAnswers<A> = Box<dyn FnOnce(&str) -> Result<Option<A>, sqlx::Error> + Send>;

/// A [`Batch`] write with the slot its answer goes to, its kind erased.
struct Slot<B: Batch> {
    input: B,
    out: Arc<Mutex<Option<B::Out>>>,
}

type Erased = Box<dyn Any + Send + Sync>;
/// A [`DirectJob`]'s answers, their kind erased.
type Answers = Box<dyn Any + Send>;
type Many =
    for<'t> fn(&'t mut Tx, &'t mut [&'t mut Erased]) -> BoxFuture<'t, Result<(), sqlx::Error>>;

/// `B::run` over erased slots (every one a `Slot<B>`: the caller groups
/// them by kind), each answer put in its slot.
fn run_many<'t, B: Batch>(
    tx: &'t mut Tx,
    slots: &'t mut [&'t mut Erased],
) -> BoxFuture<'t, Result<(), sqlx::Error>> {
    Box::pin(async move {
        let inputs: Vec<&B> = slots
            .iter()
            .filter_map(|s| s.downcast_ref::<Slot<B>>())
            .map(|s| &s.input)
            .collect();
        let outs = B::run(tx, inputs).await?;
        let slots = slots.iter().filter_map(|s| s.downcast_ref::<Slot<B>>());
        for (slot, out) in slots.zip(outs) {
            if let Ok(mut o) = slot.out.lock() {
                *o = Some(out);
            }
        }
        Ok(())
    })
}

/// The inputs of erased slots, every one a `Slot<B>`.
fn inputs_of<'s, B: Batch>(slots: &[&'s Erased]) -> Vec<&'s B> {
    slots
        .iter()
        .filter_map(|s| s.downcast_ref::<Slot<B>>())
        .map(|s| &s.input)
        .collect()
}

/// `B::direct` over erased slots (every one a `Slot<B>`): the job for
/// SQLite's write thread, its answers erased; None where `B` has none for
/// these.
type DirectJob = fn(&[&Erased]) -> Option<direct::Job<Answers>>;

fn direct_job<B: Batch>(slots: &[&Erased]) -> Option<direct::Job<Answers>> {
    let job = B::direct(inputs_of(slots))?;
    Some(Box::new(move |tx| {
        job(tx).map(|outs| Box::new(outs) as Answers)
    }))
}

/// `B::locked` over erased slots (every one a `Slot<B>`), its answers
/// erased.
type LockedCall = fn(&[&Erased]) -> Option<Locked<Answers>>;

fn locked_call<B: Batch>(slots: &[&Erased]) -> Option<Locked<Answers>> {
    let call = B::locked(inputs_of(slots))?;
    let answers = call.answers;
    Some(Locked {
        function: call.function,
        rows: call.rows,
        now: call.now,
        answers: Box::new(move |text| {
            Ok(answers(text)?.map(|outs: Vec<B::Out>| Box::new(outs) as Answers))
        }),
    })
}

/// Put the answers of a [`DirectJob`] in their slots.
type Fill = fn(&[&Erased], Answers);

fn fill<B: Batch>(slots: &[&Erased], outs: Answers) {
    let Ok(outs) = outs.downcast::<Vec<B::Out>>() else {
        return;
    };
    let slots = slots.iter().filter_map(|s| s.downcast_ref::<Slot<B>>());
    for (slot, out) in slots.zip(*outs) {
        if let Ok(mut o) = slot.out.lock() {
            *o = Some(out);
        }
    }
}

enum Work {
    One(One),
    Many {
        kind: TypeId,
        run: Many,
        direct: DirectJob,
        locked: LockedCall,
        fill: Fill,
        slot: Erased,
    },
}

struct Item {
    what: &'static str,
    work: Work,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// The writer's inbox, started by the first grouped write.
#[derive(Clone, Debug, Default)]
pub(super) struct Group {
    inbox: Arc<OnceLock<mpsc::UnboundedSender<Item>>>,
}

impl Store {
    /// Run `f` in a transaction shared with the writes waiting beside it,
    /// and return its result once that transaction is committed. `f` must
    /// be a short, self-contained write (no waiting on anything else): the
    /// others in the batch wait for it.
    pub async fn grouped<T, F>(&self, what: &'static str, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'t> Fn(&'t mut Tx) -> BoxFuture<'t, Result<T, sqlx::Error>> + Send + Sync + 'static,
    {
        let slot: Arc<Mutex<Option<T>>> = Arc::new(Mutex::new(None));
        let kept = slot.clone();
        let f = Arc::new(f);
        let work: One = Box::new(move |tx| {
            let (f, kept) = (f.clone(), kept.clone());
            Box::pin(async move {
                let v = f(tx).await?;
                if let Ok(mut s) = kept.lock() {
                    *s = Some(v);
                }
                Ok(())
            })
        });
        self.send(what, Work::One(work)).await?;
        let v = slot.lock().ok().and_then(|mut s| s.take());
        v.ok_or_else(|| self.lost(what))
    }

    /// Like [`Store::grouped`], for a write of kind `B`: the writes of its
    /// kind beside it in the batch are written with it by `B::run`.
    pub async fn batched<B: Batch>(
        &self,
        what: &'static str,
        input: B,
    ) -> Result<B::Out, StoreError> {
        let out = Arc::new(Mutex::new(None));
        let slot: Erased = Box::new(Slot {
            input,
            out: out.clone(),
        });
        let work = Work::Many {
            kind: TypeId::of::<B>(),
            run: run_many::<B>,
            direct: direct_job::<B>,
            locked: locked_call::<B>,
            fill: fill::<B>,
            slot,
        };
        self.send(what, work).await?;
        let v = out.lock().ok().and_then(|mut s| s.take());
        v.ok_or_else(|| self.lost(what))
    }

    /// Hand `work` to the writer (started by the first write) and wait for
    /// its commit.
    async fn send(&self, what: &'static str, work: Work) -> Result<(), StoreError> {
        let (done, answer) = oneshot::channel();
        let inbox = self.group.inbox.get_or_init(|| start_writer(self));
        inbox
            .send(Item { what, work, done })
            .map_err(|_| self.lost(what))?;
        answer.await.map_err(|_| self.lost(what))?
    }

    pub(super) fn lost(&self, what: &'static str) -> StoreError {
        StoreError {
            path: self.path.clone(),
            what,
            source: sqlx::Error::WorkerCrashed,
        }
    }
}

/// Start the writer and give its inbox. On SQLite it is a thread of its
/// own: it gathers each batch and writes it there (`direct`) the moment the
/// last one committed, without waiting for a turn on the runtime's workers,
/// which a flood of deliveries keeps busy (a quarter of its time went to
/// that wait when it was a task). Elsewhere, and should the thread not
/// start, it is a task on the runtime, writing through sqlx.
fn start_writer(store: &Store) -> mpsc::UnboundedSender<Item> {
    // The writer's store has an inbox of its own, never used: one holding
    // this one's sender would keep the writer waiting forever.
    let own = Store {
        group: Group::default(),
        ..store.clone()
    };
    if own.direct.is_some() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let handle = tokio::runtime::Handle::current();
        let thread = own.clone();
        let spawned = std::thread::Builder::new()
            .name("driftless-sqlite-writer".into())
            .spawn(move || {
                // Ends when every store that can send is gone.
                while let Some(first) = rx.blocking_recv() {
                    let batch = gather(first, &mut rx);
                    handle.block_on(commit(&thread, batch));
                }
            });
        match spawned {
            Ok(_) => return tx,
            Err(e) => tracing::warn!(error = %e,
                "cannot start SQLite's writer thread; writing through sqlx instead"),
        }
    }
    // Without the thread nothing may block a worker: no direct writes.
    let own = Store {
        direct: None,
        ..own
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let batch = gather(first, &mut rx);
            commit(&own, batch).await;
        }
    });
    tx
}

/// `first` and every write waiting behind it, up to [`MAX_BATCH`].
fn gather(first: Item, rx: &mut mpsc::UnboundedReceiver<Item>) -> Vec<Item> {
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH {
        match rx.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
    batch
}

/// The same failure for every write of a batch whose transaction could not
/// begin or commit (disk trouble stays recognisable as such).
fn shared(store: &Store, what: &'static str, e: &StoreError) -> StoreError {
    let msg = e.source.to_string();
    StoreError {
        path: store.path.clone(),
        what,
        source: if e.is_disk_trouble() {
            sqlx::Error::Io(std::io::Error::other(msg))
        } else {
            sqlx::Error::Protocol(msg)
        },
    }
}

async fn commit(store: &Store, batch: Vec<Item>) {
    let mut batch = all_locked(store, batch).await;
    if batch.is_empty() {
        return;
    }
    while let Some(locked) = take_locked(store, &mut batch) {
        Box::pin(commit(store, locked)).await;
        if batch.is_empty() {
            return;
        }
    }
    match run_batch(store, &mut batch).await {
        Ok(()) => {
            for item in batch {
                let _ = item.done.send(Ok(()));
            }
        }
        // One write failed: the others should not fail with it.
        Err(Failed::Write(_)) if batch.len() > 1 => {
            for item in batch {
                let mut one = vec![item];
                let r = run_batch(store, &mut one).await;
                if let Some(item) = one.pop() {
                    let _ = item
                        .done
                        .send(r.map_err(|f| f.into_error(store, item.what)));
                }
            }
        }
        Err(f) => {
            for item in batch {
                let _ = item.done.send(Err(f.shared(store, item.what)));
            }
        }
    }
}

/// On PostgreSQL, a batch of more than one kind of write, each kind with a
/// [`Batch::locked`] call (a worker's claim and another's finish beside
/// webhook deliveries): one statement calls each kind's function in turn,
/// in the order the kinds came — one round trip and one transaction, where
/// a call each took a round trip each (the writer's time under a flood is
/// mostly round trips). Its writes are answered here. Returned, to be
/// written each kind by its own call as before: the whole batch where it is
/// not such a batch or the statement did not commit (a kind's call refused
/// it, the connection was lost, an error: it is all rolled back), and the
/// writes of a kind whose answer says its call wrote nothing.
async fn all_locked(store: &Store, batch: Vec<Item>) -> Vec<Item> {
    if store.kind != super::Kind::Postgres {
        return batch;
    }
    let mut kinds: Vec<(TypeId, LockedCall, Fill)> = Vec::new();
    for i in &batch {
        let Work::Many {
            kind, locked, fill, ..
        } = &i.work
        else {
            return batch;
        };
        if !kinds.iter().any(|(k, ..)| k == kind) {
            kinds.push((*kind, *locked, *fill));
        }
    }
    if kinds.len() < 2 {
        return batch;
    }
    let mut calls = Vec::with_capacity(kinds.len());
    for (kind, locked, _) in &kinds {
        match locked(&slots_of(&batch, *kind)) {
            Some(call) => calls.push(call),
            None => return batch,
        }
    }
    let what = batch.first().map_or("a grouped write", |i| i.what);
    let texts = match call_all(store, &mut calls).await {
        Ok(texts) => texts,
        Err(e) => {
            tracing::debug!(error = %e, "one call for a batch's kinds did not commit; a call each");
            return batch;
        }
    };
    let mut answered: Vec<(TypeId, Result<(), StoreError>)> = Vec::with_capacity(kinds.len());
    for (((kind, _, fill), call), text) in kinds.iter().zip(calls).zip(texts) {
        match (call.answers)(&text) {
            Ok(Some(outs)) => {
                fill(&slots_of(&batch, *kind), outs);
                answered.push((*kind, Ok(())));
            }
            // Its call wrote nothing: written by a call of its own.
            Ok(None) => {}
            // Committed, but its answer cannot be read: every write of the
            // kind hears it, and none is written again.
            Err(e) => answered.push((*kind, Err(store.err(what)(e)))),
        }
    }
    let mut rest = Vec::new();
    for item in batch {
        let Work::Many { kind, .. } = &item.work else {
            rest.push(item);
            continue;
        };
        match answered.iter().find(|(k, _)| k == kind) {
            Some((_, Ok(()))) => {
                let _ = item.done.send(Ok(()));
            }
            Some((_, Err(e))) => {
                let _ = item.done.send(Err(shared(store, item.what, e)));
            }
            None => rest.push(item),
        }
    }
    rest
}

/// The slots of the writes of `kind` in `batch`, in order.
fn slots_of(batch: &[Item], kind: TypeId) -> Vec<&Erased> {
    batch
        .iter()
        .filter_map(|i| match &i.work {
            Work::Many { kind: k, slot, .. } if *k == kind => Some(slot),
            _ => None,
        })
        .collect()
}

/// One statement calling each of `calls`' functions (`SELECT f($1, $2),
/// g($3, $4), …`; their rows are taken) on the write connection, a
/// transaction of its own; each call's answer, in order. Each function's statements see what the calls
/// before it wrote (a volatile function's statements take a snapshot each);
/// which goes first matters no more than which of two writes sent at the
/// same moment does.
async fn call_all(
    store: &Store,
    calls: &mut [Locked<Answers>],
) -> Result<Vec<String>, sqlx::Error> {
    let mut sql = String::from("SELECT ");
    for (n, c) in calls.iter().enumerate() {
        if n > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!("{}(${}, ${})", c.function, 2 * n + 1, 2 * n + 2));
    }
    let binds: Vec<(String, i64)> = calls
        .iter_mut()
        .map(|c| (std::mem::take(&mut c.rows), c.now))
        .collect();
    let n = binds.len();
    store
        .writer
        .autocommit(move |conn| {
            Box::pin(async move {
                let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
                for (rows, now) in binds {
                    q = q.bind(rows).bind(now);
                }
                let row = q.fetch_one(conn).await?;
                (0..n)
                    .map(|i| sqlx::Row::try_get::<String, _>(&row, i))
                    .collect()
            })
        })
        .await
}

/// On PostgreSQL, the writes of `batch` of a kind whose [`Batch::locked`]
/// call takes them, taken out of a batch that holds other writes too (a
/// worker's claim beside webhook deliveries): they are written by that
/// one call, the rest after them (another kind's call, or the usual
/// way). None where there are none, or where they are the whole batch
/// (written so anyway).
fn take_locked(store: &Store, batch: &mut Vec<Item>) -> Option<Vec<Item>> {
    if store.kind != super::Kind::Postgres {
        return None;
    }
    let mut kinds: Vec<(TypeId, LockedCall)> = Vec::new();
    for i in batch.iter() {
        if let Work::Many { kind, locked, .. } = &i.work
            && !kinds.iter().any(|(k, _)| k == kind)
        {
            kinds.push((*kind, *locked));
        }
    }
    if kinds.len() == 1 && batch.iter().all(|i| matches!(i.work, Work::Many { .. })) {
        return None;
    }
    let kind = kinds
        .into_iter()
        .find_map(|(kind, locked)| locked(&slots_of(batch, kind)).map(|_| kind))?;
    let of_kind = |i: &Item| matches!(&i.work, Work::Many { kind: k, .. } if *k == kind);
    let (taken, rest): (Vec<Item>, Vec<Item>) =
        std::mem::take(batch).into_iter().partition(of_kind);
    *batch = rest;
    Some(taken)
}

/// Why a batch did not commit.
enum Failed {
    /// A write of the batch failed (nothing of the batch is kept).
    Write(StoreError),
    /// The transaction could not begin or commit.
    Transaction(StoreError),
    /// A [`Locked`] call committed, but its answer cannot be read: its
    /// writes are never written again (each alone, they would be twice).
    Answer(StoreError),
}

impl Failed {
    fn shared(&self, store: &Store, what: &'static str) -> StoreError {
        match self {
            Failed::Write(e) | Failed::Transaction(e) | Failed::Answer(e) => shared(store, what, e),
        }
    }

    fn into_error(self, store: &Store, what: &'static str) -> StoreError {
        match self {
            Failed::Write(e) | Failed::Answer(e) => e,
            Failed::Transaction(e) => shared(store, what, &e),
        }
    }
}

/// Every write of `batch` in one transaction, committed.
async fn run_batch(store: &Store, batch: &mut [Item]) -> Result<(), Failed> {
    let what = batch.first().map_or("a grouped write", |i| i.what);
    if let Some(done) = run_direct(store, batch).await {
        return done.map_err(|f| match f {
            direct::Failure::Write(e) => Failed::Write(store.err(what)(e)),
            direct::Failure::Transaction(e) => Failed::Transaction(store.err(what)(e)),
        });
    }
    if let Some(done) = run_locked(store, batch).await {
        return done;
    }
    let mut tx = store.begin_write(what).await.map_err(Failed::Transaction)?;
    let mut rest = &mut batch[..];
    while let Some((first, _)) = rest.split_first_mut() {
        let what = first.what;
        let result = match &mut first.work {
            Work::One(work) => {
                let r = work(&mut tx).await;
                rest = &mut rest[1..];
                r
            }
            Work::Many { kind, run, .. } => {
                // This write and the ones of its kind right after it.
                let (kind, run) = (*kind, *run);
                let n = rest
                    .iter()
                    .take_while(|i| matches!(&i.work, Work::Many { kind: k, .. } if *k == kind))
                    .count();
                let (same, after) = std::mem::take(&mut rest).split_at_mut(n);
                rest = after;
                let mut slots: Vec<&mut Erased> = same
                    .iter_mut()
                    .filter_map(|i| match &mut i.work {
                        Work::Many { slot, .. } => Some(slot),
                        Work::One(_) => None,
                    })
                    .collect();
                run(&mut tx, &mut slots).await
            }
        };
        if let Err(e) = result {
            // Dropping the transaction rolls it back.
            return Err(Failed::Write(store.err(what)(e)));
        }
    }
    tx.commit()
        .await
        .map_err(|e| Failed::Transaction(store.err(what)(e)))
}

/// The direct jobs of `batch`, one per run of one kind, and where each
/// run's answers go; None unless every write has one.
#[allow(clippy::type_complexity)]
fn direct_jobs(batch: &[Item]) -> Option<(Vec<direct::Job<Answers>>, Vec<(Vec<&Erased>, Fill)>)> {
    let mut jobs = Vec::new();
    let mut runs: Vec<(Vec<&Erased>, Fill)> = Vec::new();
    let mut rest = batch;
    while let Some(first) = rest.first() {
        let Work::Many {
            kind, direct, fill, ..
        } = &first.work
        else {
            return None;
        };
        let mut slots = Vec::new();
        while let Some(Item {
            work: Work::Many { kind: k, slot, .. },
            ..
        }) = rest.first()
        {
            if k != kind {
                break;
            }
            slots.push(slot);
            rest = &rest[1..];
        }
        jobs.push(direct(&slots)?);
        runs.push((slots, *fill));
    }
    Some((jobs, runs))
}

/// On SQLite, a batch whose every write has a job for the write thread
/// (a [`Batch`] kind's `direct`, for each run of one kind), run there as
/// one transaction in the turn to write; None where it is not such a batch
/// (nothing has run).
async fn run_direct(store: &Store, batch: &mut [Item]) -> Option<Result<(), direct::Failure>> {
    let on = store.direct.as_ref()?;
    let (jobs, runs) = direct_jobs(batch)?;
    let all: direct::Job<Vec<Answers>> =
        Box::new(move |tx| jobs.into_iter().map(|job| job(tx)).collect());
    let _turn = store.writer.turn().await;
    if let Err(e) = store.check_identity() {
        return Some(Err(direct::Failure::Transaction(e.source)));
    }
    // Blocking: this runs on the writer thread (`start_writer`).
    match on.run(all) {
        Ok(outs) => {
            for ((slots, fill), outs) in runs.into_iter().zip(outs) {
                fill(&slots, outs);
            }
            Some(Ok(()))
        }
        Err(e) => Some(Err(e)),
    }
}

/// On PostgreSQL, a batch of writes of one kind that has a
/// [`Batch::locked`] call, written by that call; None where it is not
/// such a batch, or where the call wrote nothing or lost its connection
/// (the batch is then written the usual way: a call whose connection was
/// lost after its commit leaves those deliveries to be found duplicates,
/// their jobs queued).
async fn run_locked(store: &Store, batch: &mut [Item]) -> Option<Result<(), Failed>> {
    if store.kind != super::Kind::Postgres {
        return None;
    }
    let (what, kind, locked, fill) = match batch.first()? {
        Item {
            what,
            work: Work::Many {
                kind, locked, fill, ..
            },
            ..
        } => (*what, *kind, *locked, *fill),
        _ => return None,
    };
    let slots = batch
        .iter_mut()
        .map(|i| match &mut i.work {
            Work::Many { kind: k, slot, .. } if *k == kind => Some(&*slot),
            _ => None,
        })
        .collect::<Option<Vec<&Erased>>>()?;
    let mut calls = [locked(&slots)?];
    let called = call_all(store, &mut calls)
        .await
        .and_then(|texts| texts.into_iter().next().ok_or(sqlx::Error::RowNotFound));
    let [Locked { answers, .. }] = calls;
    let text = match called {
        Ok(text) => text,
        // Not for it (rolled back), or the connection has no such
        // function: it could not make it (no temporary schema, "pg_temp
        // does not exist"; or no such function, or not allowed to run it).
        Err(sqlx::Error::Database(d))
            if d.code().is_some_and(|c| {
                matches!(&*c, "3F000" | "42883" | "42501") || c == NOT_WRITTEN
            }) =>
        {
            return None;
        }
        Err(e) if super::write::connection_lost(&e) => return None,
        // Rolled back: each write may be tried alone.
        Err(e) => return Some(Err(Failed::Write(store.err(what)(e)))),
    };
    match answers(&text) {
        Ok(Some(outs)) => {
            fill(&slots, outs);
            Some(Ok(()))
        }
        Ok(None) => None,
        Err(e) => Some(Err(Failed::Answer(store.err(what)(e)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes sent together all commit, each answered after its commit; a
    /// write that fails fails alone, and leaves nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_sent_together_commit_together_and_fail_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let mut all = Vec::new();
            for n in 0..64 {
                let store = store.clone();
                all.push(tokio::spawn(async move {
                    store
                        .grouped("test write", move |tx| {
                            Box::pin(async move {
                                let table = if n == 13 {
                                    "no_such_table"
                                } else {
                                    "deliveries"
                                };
                                sqlx::query(sqlx::AssertSqlSafe(format!(
                                "INSERT INTO {table} (receiver, delivery_id, received_at, outcome)
                                 VALUES ('r', 'd{n}', 0, 'ok')"
                            )))
                                .execute(&mut **tx)
                                .await?;
                                Ok(n)
                            })
                        })
                        .await
                }));
            }
            let mut ok = 0;
            for (n, h) in all.into_iter().enumerate() {
                match h.await.expect("task") {
                    Ok(v) => {
                        assert_eq!(v, n);
                        ok += 1;
                    }
                    Err(e) => {
                        assert_eq!(n, 13, "{e}");
                        assert!(e.to_string().contains("no_such_table"), "{e}");
                    }
                }
            }
            assert_eq!(ok, 63);
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM deliveries")
                .fetch_one(store.pool())
                .await
                .expect("count");
            assert_eq!(rows, 63);
        }
    }
    /// Each write answered with its own result (`n * 10`, from `round`
    /// on), but 113's: it fails, naming the table it spoiled.
    async fn expect_answers(
        round: i64,
        all: Vec<tokio::task::JoinHandle<Result<i64, StoreError>>>,
    ) {
        for (n, h) in (round..).zip(all) {
            match h.await.expect("task") {
                Ok(v) => assert_eq!(v, n * 10),
                Err(e) => {
                    assert_eq!(n, 113, "{e}");
                    assert!(e.to_string().contains("no_such_table"), "{e}");
                }
            }
        }
    }

    async fn count_deliveries(store: &Store) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM deliveries")
            .fetch_one(store.pool())
            .await
            .expect("count")
    }

    /// A grouped write of delivery `g<n>` from `receiver`.
    async fn grouped_delivery(
        store: &Store,
        receiver: &'static str,
        n: i64,
    ) -> Result<(), StoreError> {
        store
            .grouped("test write", move |tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
                         VALUES ($1, 'g' || $2, 0, 'ok')",
                    )
                    .bind(receiver)
                    .bind(n)
                    .execute(&mut **tx)
                    .await
                    .map(drop)
                })
            })
            .await
    }

    /// A kind of write that is written together.
    struct Row(i64);

    /// The most writes of the kind one `run` was given.
    static WIDEST: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    impl Batch for Row {
        type Out = i64;
        fn run<'t>(
            tx: &'t mut Tx,
            all: Vec<&'t Row>,
        ) -> BoxFuture<'t, Result<Vec<i64>, sqlx::Error>> {
            Box::pin(async move {
                let ids: Vec<i64> = all.iter().map(|r| r.0).collect();
                WIDEST.fetch_max(ids.len(), std::sync::atomic::Ordering::Relaxed);
                // One of them spoils the statement for all of them.
                let table = if ids.contains(&113) {
                    "no_such_table"
                } else {
                    "deliveries"
                };
                let each = if crate::store::db::is_postgres(tx) {
                    "jsonb_array_elements_text($1::jsonb) AS e(value)"
                } else {
                    "json_each($1)"
                };
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "INSERT INTO {table} (receiver, delivery_id, received_at, outcome)
                     SELECT 'r', 'b' || value, 0, 'ok' FROM {each}"
                )))
                .bind(serde_json::to_string(&ids).unwrap_or_default())
                .execute(&mut **tx)
                .await?;
                Ok(ids.iter().map(|n| n * 10).collect())
            })
        }
    }

    /// Writes of a kind, among other writes: each answered with its own
    /// result; the one that fails the kind's statement fails alone. (On
    /// one thread every write is sent before the writer first looks: one
    /// batch, the kind's writes between the others written together.)
    #[tokio::test]
    async fn writes_of_a_kind_are_written_together_and_fail_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            // Two rounds: one where every write succeeds, one where 113 fails.
            for round in [0i64, 100] {
                let mut all = Vec::new();
                for n in round..round + 64 {
                    let store = store.clone();
                    all.push(tokio::spawn(async move {
                        if n % 5 == 0 {
                            grouped_delivery(&store, "r", n).await.map(|()| n * 10)
                        } else {
                            store.batched("test batch", Row(n)).await
                        }
                    }));
                }
                expect_answers(round, all).await;
            }
            assert_eq!(count_deliveries(&store).await, 127);
            assert_eq!(WIDEST.load(std::sync::atomic::Ordering::Relaxed), 4);
        }
    }

    /// Two kinds of write that SQLite's write thread can run (`direct`):
    /// `Pair::<false>` and `Pair::<true>`, whose writes are named `p…`.
    struct Pair<const SECOND: bool>(i64);

    /// Every write `Pair`'s direct jobs wrote.
    static DIRECT_WRITES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    /// The statement for `Pair`s: `$1` their numbers; 113 spoils it.
    fn pair_sql(ids: &[i64], prefix: &str, each: &str) -> String {
        let table = if ids.contains(&113) {
            "no_such_table"
        } else {
            "deliveries"
        };
        format!(
            "INSERT INTO {table} (receiver, delivery_id, received_at, outcome)
             SELECT 'r', '{prefix}' || value, 0, 'ok' FROM {each}"
        )
    }

    impl<const SECOND: bool> Batch for Pair<SECOND> {
        type Out = i64;
        fn run<'t>(
            tx: &'t mut Tx,
            all: Vec<&'t Pair<SECOND>>,
        ) -> BoxFuture<'t, Result<Vec<i64>, sqlx::Error>> {
            Box::pin(async move {
                let ids: Vec<i64> = all.iter().map(|r| r.0).collect();
                let prefix = if SECOND { "p" } else { "d" };
                let each = if crate::store::db::is_postgres(tx) {
                    "jsonb_array_elements_text($1::jsonb) AS e(value)"
                } else {
                    "json_each($1)"
                };
                sqlx::query(sqlx::AssertSqlSafe(pair_sql(&ids, prefix, each)))
                    .bind(serde_json::to_string(&ids).unwrap_or_default())
                    .execute(&mut **tx)
                    .await?;
                Ok(ids.iter().map(|n| n * 10).collect())
            })
        }

        fn direct(all: Vec<&Pair<SECOND>>) -> Option<direct::Job<Vec<i64>>> {
            let ids: Vec<i64> = all.iter().map(|r| r.0).collect();
            let prefix = if SECOND { "p" } else { "d" };
            Some(Box::new(move |tx| {
                tx.execute(
                    &pair_sql(&ids, prefix, "json_each($1)"),
                    [serde_json::to_string(&ids).unwrap_or_default()],
                )
                .map_err(direct::failure)?;
                DIRECT_WRITES.fetch_add(ids.len(), std::sync::atomic::Ordering::Relaxed);
                Ok(ids.iter().map(|n| n * 10).collect())
            }))
        }
    }

    /// On SQLite a batch of writes that all have direct jobs is written on
    /// the write thread, as one transaction: each write answered with its
    /// own result, the one that fails failing alone, and the write turn
    /// free again at once for the other connection.
    #[tokio::test]
    async fn writes_with_direct_jobs_are_written_there_and_fail_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let sqlite = store.kind() == crate::store::Kind::Sqlite;
            let before = DIRECT_WRITES.load(std::sync::atomic::Ordering::Relaxed);
            for round in [0i64, 100] {
                let mut all = Vec::new();
                for n in round..round + 40 {
                    let store = store.clone();
                    // Runs of each kind: 0-9 one, 10-19 the other, …
                    all.push(tokio::spawn(async move {
                        if (n / 10) % 2 == 1 {
                            store.batched("test batch", Pair::<true>(n)).await
                        } else {
                            store.batched("test batch", Pair::<false>(n)).await
                        }
                    }));
                }
                expect_answers(round, all).await;
            }
            assert_eq!(count_deliveries(&store).await, 79);
            let direct = DIRECT_WRITES.load(std::sync::atomic::Ordering::Relaxed) - before;
            if sqlite {
                // Every write that committed, at least once.
                assert!(direct >= 79, "{direct} writes ran on the write thread");
                // The failed transaction holds nothing: the other
                // connection writes at once.
                tokio::time::timeout(
                    std::time::Duration::from_secs(3),
                    store.write_one(
                        "test",
                        sqlx::query(
                            "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
                             VALUES ('r', 'after', 0, 'ok')",
                        ),
                    ),
                )
                .await
                .expect("the write lock is free")
                .expect("write");
            } else {
                assert_eq!(direct, 0, "PostgreSQL has no write thread");
            }
        }
    }

    /// A kind of write that has a [`Batch::locked`] call: its answers say
    /// which way it was written. `K` makes two such kinds, each with a
    /// function of its own (`FUNCTIONS`).
    struct Called<const K: usize>(i64);

    /// The locked call of `Called<0>`, `Called<1>` and `Called<2>`.
    const FUNCTIONS: [&str; 3] = [
        "driftless_test_called",
        "driftless_test_also",
        "driftless_test_wrong",
    ];

    impl<const K: usize> Batch for Called<K> {
        type Out = (&'static str, i64);
        fn run<'t>(
            tx: &'t mut Tx,
            all: Vec<&'t Called<K>>,
        ) -> BoxFuture<'t, Result<Vec<Self::Out>, sqlx::Error>> {
            Box::pin(async move {
                for c in &all {
                    sqlx::query(
                        "INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
                         VALUES ('c', 'c' || $1, 0, 'ok')",
                    )
                    .bind(c.0)
                    .execute(&mut **tx)
                    .await?;
                }
                Ok(all.iter().map(|c| ("usual", c.0)).collect())
            })
        }

        fn locked(all: Vec<&Called<K>>) -> Option<Locked<Vec<Self::Out>>> {
            let ids: Vec<i64> = all.iter().map(|c| c.0).collect();
            Some(Locked {
                function: FUNCTIONS[K],
                rows: serde_json::to_string(&ids).ok()?,
                now: 0,
                answers: Box::new(|text| {
                    let ids: Vec<i64> =
                        serde_json::from_str(text).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                    Ok(Some(ids.into_iter().map(|n| ("locked", n)).collect()))
                }),
            })
        }
    }

    /// The functions of `Called<K>` (`FUNCTIONS`): each writes its rows
    /// as deliveries of receiver `k<K>`, the id of its transaction as
    /// their outcome, and refuses (`NOT_WRITTEN`) rows holding -1. The
    /// third answers what is not an answer, and its deliveries' ids carry
    /// the transaction's, so a second call would write them again.
    async fn make_functions(store: &Store) {
        for (k, function) in FUNCTIONS.iter().enumerate() {
            let (id, answer) = match k {
                2 => ("'c' || value || '-' || txid_current()", "'not an answer'"),
                _ => ("'c' || value", "p_rows"),
            };
            let made = sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE OR REPLACE FUNCTION {function}(p_rows text, p_now bigint)
                 RETURNS text LANGUAGE plpgsql AS $f$
                 BEGIN
                   INSERT INTO deliveries (receiver, delivery_id, received_at, outcome)
                   SELECT 'k{k}', {id}, p_now, txid_current()::text
                   FROM jsonb_array_elements_text(p_rows::jsonb);
                   IF p_rows::jsonb @> '[-1]' THEN
                     RAISE EXCEPTION 'seen before' USING ERRCODE = '{NOT_WRITTEN}';
                   END IF;
                   RETURN {answer};
                 END $f$"
            )));
            store.write_one("test", made).await.expect("function");
        }
    }

    /// Send `Called<K>(n)` for each `(K, n)` of `writes` at once, and give
    /// each answer in order.
    async fn send_called(
        store: &Store,
        writes: &[(usize, i64)],
    ) -> Vec<Result<(&'static str, i64), StoreError>> {
        let mut all = Vec::new();
        for &(k, n) in writes {
            let store = store.clone();
            all.push(tokio::spawn(async move {
                match k {
                    2 => store.batched("test write", Called::<2>(n)).await,
                    1 => store.batched("test write", Called::<1>(n)).await,
                    _ => store.batched("test write", Called::<0>(n)).await,
                }
            }));
        }
        let mut answers = Vec::new();
        for h in all {
            answers.push(h.await.expect("task"));
        }
        answers
    }

    /// On PostgreSQL, a batch of nothing but kinds with a locked call is
    /// one statement calling each kind's function: the writes of both
    /// kinds share a transaction. When one kind's call refuses its writes
    /// (`NOT_WRITTEN`), nothing of that statement is kept and each kind is
    /// written as before: the other by its own call, the refused one the
    /// usual way. Every write is answered, and on disk once.
    #[tokio::test]
    async fn a_batch_of_locked_kinds_is_one_statement_and_a_refusal_splits_it() {
        let url = crate::store::testing::database().await;
        let store = Store::open_postgres(&url).await.expect("postgres store");
        make_functions(&store).await;
        let writes: Vec<(usize, i64)> = (0..20).map(|n| ((n % 2) as usize, n)).collect();
        let answers: Vec<_> = send_called(&store, &writes)
            .await
            .into_iter()
            .map(|a| a.expect("written"))
            .collect();
        let expected: Vec<_> = (0..20).map(|n| ("locked", n)).collect();
        assert_eq!(answers, expected);
        let shared: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM (SELECT outcome FROM deliveries GROUP BY outcome
                                   HAVING count(DISTINCT receiver) = 2) AS both_kinds",
        )
        .fetch_one(store.pool())
        .await
        .expect("count");
        assert!(shared >= 1, "no transaction wrote both kinds");

        let writes: Vec<(usize, i64)> = (20..40)
            .map(|n| ((n % 2) as usize, if n == 21 { -1 } else { n }))
            .collect();
        let answers = send_called(&store, &writes).await;
        for ((k, n), answer) in writes.iter().zip(answers) {
            let (way, m) = answer.expect("written");
            assert_eq!(m, *n, "write {n}'s answer");
            // Kind 1's others went with the refused one (the usual way)
            // or by a call of their own.
            match (k, n) {
                (_, -1) => assert_eq!(way, "usual", "the refused write"),
                (0, _) => assert_eq!(way, "locked", "write {n} of the other kind"),
                _ => assert!(matches!(way, "usual" | "locked"), "{way}"),
            }
        }
        let kept: Vec<(String, String)> = sqlx::query_as(
            "SELECT receiver, delivery_id FROM deliveries WHERE delivery_id = 'c-1'",
        )
        .fetch_all(store.pool())
        .await
        .expect("read");
        assert_eq!(
            kept,
            [("c".to_string(), "c-1".to_string())],
            "the refused write, once, the usual way"
        );
        assert_eq!(count_deliveries(&store).await, 40);
    }

    /// On PostgreSQL, a locked call that committed but whose answer cannot
    /// be read fails each of its writes, and writes none of them again
    /// (one at a time, each would be written twice) — alone in its batch
    /// or beside another kind in one statement.
    #[tokio::test]
    async fn a_call_whose_answer_cannot_be_read_is_never_written_again() {
        let url = crate::store::testing::database().await;
        let store = Store::open_postgres(&url).await.expect("postgres store");
        make_functions(&store).await;
        for writes in [vec![(2, 1), (2, 2), (2, 3)], vec![(2, 4), (0, 5), (2, 6)]] {
            for (answer, (k, n)) in send_called(&store, &writes).await.into_iter().zip(writes) {
                match (k, answer) {
                    (2, Err(e)) => assert!(e.to_string().contains("test write"), "{e}"),
                    (2, Ok(a)) => panic!("write {n} answered {a:?}"),
                    (_, answer) => assert_eq!(answer.expect("written"), ("locked", n)),
                }
            }
        }
        let written: i64 =
            sqlx::query_scalar("SELECT count(*) FROM deliveries WHERE receiver = 'k2'")
                .fetch_one(store.pool())
                .await
                .expect("count");
        assert_eq!(written, 5, "each write of the third kind once");
    }

    /// On PostgreSQL, the writes of a kind with a locked call are written by
    /// that call even when the batch holds other writes (a worker's claim
    /// beside webhook deliveries) — each such kind by its own call — the
    /// others the usual way; every write is answered with its own result
    /// and on disk. On SQLite there is no such call: all are written the
    /// usual way.
    #[tokio::test]
    async fn a_mixed_batch_writes_its_locked_kind_by_the_call_and_the_rest_as_usual() {
        let dir = tempfile::tempdir().expect("tempdir");
        for store in crate::store::testing::stores(dir.path()).await {
            let pg = store.kind() == crate::store::Kind::Postgres;
            if pg {
                make_functions(&store).await;
            }
            let mut all = Vec::new();
            for n in 0..40i64 {
                let store = store.clone();
                all.push(tokio::spawn(async move {
                    match n % 4 {
                        0 => grouped_delivery(&store, "g", n)
                            .await
                            .map(|()| ("grouped", n)),
                        1 => store.batched("test write", Called::<1>(n)).await,
                        _ => store.batched("test write", Called::<0>(n)).await,
                    }
                }));
            }
            let way = if pg { "locked" } else { "usual" };
            for (n, h) in (0..).zip(all) {
                let answer = h.await.expect("task").expect("written");
                let expected = if n % 4 == 0 { "grouped" } else { way };
                assert_eq!(answer, (expected, n), "write {n}");
            }
            assert_eq!(count_deliveries(&store).await, 40);
        }
    }

    /// An error on the write thread keeps SQLite's code: a full disk is
    /// still recognised as one, a unique violation as one.
    #[test]
    fn direct_errors_keep_sqlite_s_code() {
        let e = |code: i32| {
            direct::failure(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                Some("from SQLite".into()),
            ))
        };
        let store_error = |source| StoreError {
            path: "state.db".into(),
            what: "test",
            source,
        };
        assert!(store_error(e(13)).is_disk_trouble(), "SQLITE_FULL");
        assert!(
            store_error(e(10 | (4 << 8))).is_disk_trouble(),
            "SQLITE_IOERR_WRITE"
        );
        assert!(!store_error(e(1)).is_disk_trouble());
        let unique = e(2067);
        assert!(
            unique
                .as_database_error()
                .is_some_and(|d| d.is_unique_violation()),
            "{unique}"
        );
        assert!(unique.to_string().contains("from SQLite"), "{unique}");
    }
}
