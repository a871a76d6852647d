//! What every provider agent shares.
//!
//! - [`provider`]: the async [`Provider`] trait mirroring `ProviderService`,
//!   its error type and the capability names;
//! - [`server`]: the gRPC adapter that exposes any [`Provider`], accepting
//!   only platform tokens and answering `UNIMPLEMENTED` for every RPC whose
//!   capability the provider does not advertise;
//! - [`client`]: the client the bootstrap and scheduler services use;
//! - [`join`]: the agent side of joining the control plane (identity file
//!   as a one-way lock, join with backoff, auto-join, heartbeats);
//! - [`member`]: serving a provider and joining, as every agent binary does;
//! - [`workload`]: roles, replica counts, start order and readiness probes.

#![forbid(unsafe_code)]

pub mod client;
pub mod join;
pub mod member;
pub mod provider;
pub mod server;
pub mod workload;

pub use provider::{Capability, LogStream, Provider, ProviderError};
