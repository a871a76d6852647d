//! What every provider agent shares.
//!
//! - [`provider`]: the async [`Provider`] trait mirroring `ProviderService`,
//!   its error type and the capability names;
//! - [`server`]: the gRPC adapter that exposes any [`Provider`], accepting
//!   only platform tokens and answering `UNIMPLEMENTED` for every RPC whose
//!   capability the provider does not advertise;
//! - [`client`]: the client the bootstrap and scheduler services use;
//! - [`join`]: the agent side of joining the control plane (identity file
//!   as a one-way lock, join with backoff, heartbeats).

#![forbid(unsafe_code)]

pub mod client;
pub mod join;
pub mod provider;
pub mod server;

pub use provider::{Capability, LogStream, Provider, ProviderError};
