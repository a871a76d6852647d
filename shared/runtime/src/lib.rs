//! Runtime plumbing shared by every ctrlplane process.
//!
//! - [`config`]: every `CP_*` setting, from the environment and flags;
//! - [`telemetry`]: tracing (human or JSON) and the TLS crypto provider;
//! - [`auth`]: bearer JWTs, the auth layer, the caller of a request;
//! - [`server`]: the gRPC server with health, reflection and graceful drain;
//! - [`client`]: channels to peers with a bearer token attached;
//! - [`db`]: database pools (SQLite by default, Postgres by URL).

#![forbid(unsafe_code)]

pub mod auth;
pub mod client;
pub mod config;
pub mod db;
pub mod server;
pub mod telemetry;
