//! The bootstrap service: converges every datacenter to its desired set of
//! bootstrap services and keeps it there.
//!
//! - [`model`]: workload rows and states;
//! - [`desired`]: declared ∪ hook specs, templated and hashed (pure);
//! - [`plan`]: the pure planner.

#![forbid(unsafe_code)]

pub mod desired;
pub mod model;
pub mod plan;
