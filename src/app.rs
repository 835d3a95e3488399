//! The application's shared state without git: settings, the state
//! database, the queue, metrics. HTTP, status and the read-only CLI commands
//! get an [`App`]; only `tick::Reconciler` adds `Git` and calls backends, so
//! nothing holding just an `App` can fetch, check out or apply. Cheap to
//! clone.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::{Settings, Target};
use crate::metrics::Metrics;
use crate::queue::Queue;
use crate::store::{Store, StoreError};

/// Everything but git. Cheap to clone.
#[derive(Clone)]
pub struct App {
    pub settings: Arc<Settings>,
    pub store: Store,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    /// Rung when a run put notifications in the outbox.
    pub outbox_wake: Arc<tokio::sync::Notify>,
}

impl App {
    /// Open the state database and register the configured targets.
    pub async fn open(settings: Settings) -> Result<App, StoreError> {
        let store = Store::open(&settings.database_path()).await?;
        let names: Vec<(&str, &str)> = settings
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t.backend.kind()))
            .collect();
        store.register_targets(&names).await?;
        Ok(App {
            queue: Queue::new(store.clone()),
            store,
            settings: Arc::new(settings),
            metrics: Arc::new(Metrics::new()),
            outbox_wake: Default::default(),
        })
    }

    /// The configured target of this name.
    pub fn target(&self, name: &str) -> Option<&Target> {
        self.settings.target(name)
    }
}

/// Shared between the daemon's workers and the HTTP health endpoints.
#[derive(Default)]
pub struct Health {
    /// The last queue operation failed (the database is not writable).
    pub store_failing: AtomicBool,
}
