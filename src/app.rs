//! The application's shared state without git: settings, the state
//! database, the queue, metrics. HTTP, status and the read-only CLI commands
//! get an [`App`]; only `tick::Reconciler` adds `Git` and calls backends, so
//! nothing holding just an `App` can fetch, check out or apply. Cheap to
//! clone.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::{Live, Settings, Target};
use crate::metrics::Metrics;
use crate::queue::Queue;
use crate::store::{PgOptions, Store, StoreError, Usage};

/// Everything but git. Cheap to clone.
#[derive(Clone)]
pub struct App {
    /// The settings in force: the file's, with the `[[target_sets]]`
    /// members known now among the targets (`tick::sets` changes them).
    pub live: Live,
    pub store: Store,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    /// Rung when a run put notifications in the outbox.
    pub outbox_wake: Arc<tokio::sync::Notify>,
    /// Rung when a push reached the repository of a `[[target_sets]]`
    /// entry: its directories are listed again.
    pub sets_wake: Arc<tokio::sync::Notify>,
    /// Rung when a pull request preview was queued (or requeued): the
    /// preview worker looks at once. Apart from the apply workers' wake, so
    /// that the many jobs of a push flood don't each send it to the
    /// database for nothing.
    pub previews_wake: Arc<tokio::sync::Notify>,
}

impl App {
    /// Open the state database, register the configured targets and take
    /// the `[[target_sets]]` members it lists (not orphaned) as targets.
    pub async fn open(settings: Settings) -> Result<App, StoreError> {
        App::open_for(settings, Usage::Serve).await
    }

    /// As [`App::open`], its store opened for `usage` ([`Store::open_for`]).
    pub async fn open_for(settings: Settings, usage: Usage) -> Result<App, StoreError> {
        let store = match &settings.database {
            None => Store::open_for(&settings.database_path(), usage).await?,
            Some(db) => {
                // Git checkouts and locks stay on each host, in state_dir.
                std::fs::create_dir_all(&settings.state_dir).map_err(|e| StoreError {
                    path: settings.state_dir.clone(),
                    what: "creating the state directory",
                    source: sqlx::Error::Io(e),
                })?;
                let password = match &db.password {
                    None => None,
                    Some(p) => Some(p.load().map_err(|e| StoreError {
                        path: db.shown_url().into(),
                        what: "reading [database] password_file",
                        source: sqlx::Error::Configuration(e.into()),
                    })?),
                };
                Store::open_postgres_with(&PgOptions {
                    url: db.url().to_string(),
                    password,
                    sslmode: db.sslmode.clone(),
                    ca_file: db.ca_file.clone(),
                })
                .await?
            }
        };
        let names: Vec<(&str, &str)> = settings
            .targets
            .iter()
            .map(|t| (t.name.as_str(), t.backend.kind()))
            .collect();
        store.register_targets(&names).await?;
        let settings = if settings.target_sets.is_empty() {
            settings
        } else {
            let rows = store.set_members().await?;
            let members = known_members(&settings, &rows);
            settings.with_members(members)
        };
        Ok(App {
            queue: match &settings.database {
                Some(db) => Queue::new(store.clone()).with_lease(db.lease),
                None => Queue::new(store.clone()),
            },
            store,
            live: Live::new(settings),
            metrics: Arc::new(Metrics::new()),
            outbox_wake: Default::default(),
            sets_wake: Default::default(),
            previews_wake: Default::default(),
        })
    }

    /// The settings in force now (hold on to them while you use them).
    pub fn settings(&self) -> Arc<Settings> {
        self.live.get()
    }

    /// Where people reach the daemon's API and page: `[server] public_url`,
    /// else `http://` and the listen address (the address the running
    /// daemon noted when `listen` asked for port 0).
    pub fn base_url(&self) -> String {
        let settings = self.settings();
        if let Some(u) = &settings.server.public_url {
            return u.trim_end_matches('/').to_string();
        }
        let mut addr = settings.server.listen;
        if addr.port() == 0
            && let Some(a) = crate::lock::serving_addr(&settings.state_dir)
        {
            addr = a;
        }
        format!("http://{addr}")
    }

    /// The configured target of this name (a `[[target_sets]]` member
    /// while it is one).
    pub fn target(&self, name: &str) -> Option<Target> {
        self.settings().target(name).cloned()
    }
}

/// The members the store lists for the configured sets (not orphaned),
/// made from the sets as configured
/// now; a member the set no longer makes is left out with a WARN.
fn known_members(settings: &Settings, rows: &[crate::store::sets::SetMember]) -> Vec<Target> {
    let mut members = Vec::new();
    let mut taken = std::collections::HashSet::new();
    for set in &settings.target_sets {
        let ours: Vec<&crate::store::sets::SetMember> = rows
            .iter()
            .filter(|r| r.set == set.name_prefix && r.orphaned_at.is_none())
            .collect();
        let dirs: Vec<String> = ours.iter().map(|r| r.dir.clone()).collect();
        let now = ours
            .iter()
            .map(|r| (r.target.clone(), r.dir.clone()))
            .collect();
        let made = settings.expand(
            set,
            &crate::config::Found {
                dirs: &dirs,
                links: &[],
                taken: &taken,
                members: &now,
            },
        );
        for p in made.refused {
            tracing::warn!(problem = %p, "a target set's member cannot be made");
        }
        for t in made.members {
            taken.insert(t.name.clone());
            members.push(t);
        }
    }
    members
}

/// Shared between the daemon's workers and the HTTP health endpoints.
#[derive(Default)]
pub struct Health {
    /// The last queue operation failed (the database is not writable).
    pub store_failing: AtomicBool,
}
