//! driftless: a GitOps reconciler for infrastructure outside Kubernetes.
//!
//! The modules, by layer (each imports only its own layer or below; the
//! table in ARCHITECTURE.md is checked by `tests/it/architecture.rs`):
//!
//! 0. Plain types and pure helpers: [`model`] (what an apply reports),
//!    [`secret`] (secret references), [`redact`] (masking secrets in
//!    everything printed or stored), [`paths`], [`glob`], [`schema`]
//!    (config tables read naming every bad key), [`ledger`] (the Nomad
//!    deployment record's contract), [`error`].
//! 1. One outside thing each: [`process`] runs every external command,
//!    [`lock`] the per-target file lock, [`git`] the caches and checkouts,
//!    [`store`] SQLite, [`metrics`], [`decrypt`] SOPS files for one run.
//! 2. [`backend`] (terraform, pulumi, cloudformation, compose, ansible,
//!    pi, nomad, exec; apply, destroy, outputs, and a plan for those that
//!    can) and [`notify`] (email, Slack, Matrix, webhook).
//! 3. [`config`]: the settings file, validated with every problem named.
//! 4. Reconcile: the durable [`queue`], the [`scheduler`]'s intervals,
//!    [`app`] (shared state without git) and [`tick`] (the `Reconciler`,
//!    the one path to a backend: apply, or plan and record drift for a
//!    `detect` target).
//! 5. The HTTP surface: [`http`] (webhooks, the API, the page, health,
//!    metrics), [`forge`] (verify and parse a delivery), [`route`] (which
//!    targets a push concerns), [`auth`] (tokens and scopes), [`status`].
//! 6. The application: [`daemon`] (built on a bound listener: workers,
//!    scheduler, reaper and HTTP) and [`cli`] (the commands).

pub mod app;
pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod decrypt;
pub mod deploy;
pub mod error;
pub mod forge;
pub mod git;
pub mod glob;
pub mod health;
pub mod http;
pub mod keeper;
pub mod ledger;
pub mod lock;
pub mod metrics;
pub mod model;
pub mod notify;
pub mod paths;
pub mod plan;
pub mod policy;
pub mod process;
pub mod queue;
pub mod redact;
pub mod rollout;
pub mod route;
pub mod scheduler;
pub mod schema;
pub mod secret;
pub mod status;
pub mod store;
pub mod tick;
pub mod window;
