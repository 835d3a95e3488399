//! The integration tests, one binary (a module per area): each drives the
//! real `driftless` binary, its HTTP surface or the library's public API
//! against real programs on 127.0.0.1. Shared helpers live in `common`.
//! Run one area with `cargo test --test it <area>::`.

mod common;

mod ansible;
mod api;
mod architecture;
mod bad_input;
mod canaries;
mod chaos;
mod cloudformation;
mod compose;
mod config_check;
mod config_schema;
mod daemon;
mod decrypt;
mod dependencies;
mod exec;
mod forge_status;
mod git_sync;
mod health;
mod logs;
mod nomad;
mod notify;
mod packaging;
mod page;
mod page_live;
mod pi;
mod policies;
mod postgres;
mod previews;
mod pulumi;
mod server_limits;
mod shell;
mod soak;
mod sparse;
mod tags;
mod target_sets;
mod terraform;
mod unwritable;
mod verify;
mod waves;
mod webhooks;
mod windows;
