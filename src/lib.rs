//! driftless: a GitOps reconciler for infrastructure outside Kubernetes.
//!
//! The flow, one way through (see ARCHITECTURE.md):
//!
//! - [`config`]: the settings file, validated with every problem named.
//! - [`scheduler`] (fallback intervals) and, later, webhooks and the API put
//!   requests in the durable [`queue`] (SQLite, [`store`]).
//! - [`daemon`] workers claim jobs; [`tick`] runs one: the per-target
//!   [`lock`], [`git`] sync to the exact commit, the [`backend`]'s `apply`,
//!   and the run recorded in [`store`].
//! - [`process`] runs every external command; [`redact`] masks secrets in
//!   everything printed or stored.
//! - [`http`] serves health endpoints; [`cli`] implements the commands.

pub mod auth;
pub mod backend;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod error;
pub mod forge;
pub mod git;
pub mod http;
pub mod lock;
pub mod metrics;
pub mod notify;
pub mod paths;
pub mod process;
pub mod queue;
pub mod redact;
pub mod route;
pub mod scheduler;
pub mod schema;
pub mod status;
pub mod store;
pub mod tick;
