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

    /// Where people reach the daemon's API and page: `[server] public_url`,
    /// else `http://` and the listen address (the address the running
    /// daemon noted when `listen` asked for port 0).
    pub fn base_url(&self) -> String {
        if let Some(u) = &self.settings.server.public_url {
            return u.trim_end_matches('/').to_string();
        }
        let mut addr = self.settings.server.listen;
        if addr.port() == 0
            && let Some(a) = crate::lock::serving_addr(&self.settings.state_dir)
        {
            addr = a;
        }
        format!("http://{addr}")
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
