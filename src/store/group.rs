//! Group commit: small writes that arrive together share one transaction,
//! and so one fsync. A single writer task takes every write waiting at that
//! moment (at most [`MAX_BATCH`]), runs them in one transaction, commits,
//! and only then answers each caller: nobody hears "done" before the commit
//! is on disk, and if the commit fails every caller hears that. A write
//! that fails rolls the batch back, and its writes are then run again one
//! transaction each, so one bad write never takes the others with it (and
//! the common case pays for no savepoints). Under load the next batch
//! gathers while the previous one commits. This module runs what it is
//! given; it knows nothing of deliveries or jobs.

use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::{mpsc, oneshot};

use super::{Store, StoreError, WriteTx};
use crate::model::BoxFuture;

/// The most writes one transaction takes.
pub const MAX_BATCH: usize = 256;

type Tx = sqlx::Transaction<'static, sqlx::Sqlite>;

/// One write: runs in the batch's transaction, keeps its own result. Run
/// again (in a transaction of its own) when another write of its batch
/// failed, so it may run more than once before one commit: it must only
/// write, and keep the result of its last run.
type Work = Box<dyn for<'t> FnMut(&'t mut Tx) -> BoxFuture<'t, Result<(), sqlx::Error>> + Send>;

struct Item {
    what: &'static str,
    work: Work,
    done: oneshot::Sender<Result<(), StoreError>>,
}

/// The writer task's inbox, started by the first grouped write.
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
        let work: Work = Box::new(move |tx| {
            let (f, kept) = (f.clone(), kept.clone());
            Box::pin(async move {
                let v = f(tx).await?;
                if let Ok(mut s) = kept.lock() {
                    *s = Some(v);
                }
                Ok(())
            })
        });
        let (done, answer) = oneshot::channel();
        let inbox = self.group.inbox.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(writer(self.clone(), rx));
            tx
        });
        let lost = || StoreError {
            path: self.path.clone(),
            what,
            source: sqlx::Error::WorkerCrashed,
        };
        inbox.send(Item { what, work, done }).map_err(|_| lost())?;
        answer.await.map_err(|_| lost())??;
        let v = slot.lock().ok().and_then(|mut s| s.take());
        v.ok_or_else(lost)
    }
}

/// The writer: a batch at a time, for as long as anyone can send.
async fn writer(store: Store, mut rx: mpsc::UnboundedReceiver<Item>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        commit(&store, batch).await;
    }
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

async fn commit(store: &Store, mut batch: Vec<Item>) {
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

/// Why a batch did not commit.
enum Failed {
    /// A write of the batch failed (nothing of the batch is kept).
    Write(StoreError),
    /// The transaction could not begin or commit.
    Transaction(StoreError),
}

impl Failed {
    fn shared(&self, store: &Store, what: &'static str) -> StoreError {
        match self {
            Failed::Write(e) | Failed::Transaction(e) => shared(store, what, e),
        }
    }

    fn into_error(self, store: &Store, what: &'static str) -> StoreError {
        match self {
            Failed::Write(e) => e,
            Failed::Transaction(e) => shared(store, what, &e),
        }
    }
}

/// Every write of `batch` in one transaction, committed.
async fn run_batch(store: &Store, batch: &mut [Item]) -> Result<(), Failed> {
    let what = batch.first().map_or("a grouped write", |i| i.what);
    let WriteTx { mut tx, _turn } = store.begin_write(what).await.map_err(Failed::Transaction)?;
    for item in batch.iter_mut() {
        if let Err(e) = (item.work)(&mut tx).await {
            // Dropping the transaction rolls it back.
            return Err(Failed::Write(store.err(item.what)(e)));
        }
    }
    tx.commit()
        .await
        .map_err(|e| Failed::Transaction(store.err(what)(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes sent together all commit, each answered after its commit; a
    /// write that fails fails alone, and leaves nothing behind.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_sent_together_commit_together_and_fail_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("driftless.db"))
            .await
            .expect("store");
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
