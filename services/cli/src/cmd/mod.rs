//! One module per top-level command. Each defines its clap arguments, pure
//! functions turning them into requests, and a `run` that makes the calls
//! and prints the results.

pub mod agents;
pub mod bootstrap;
pub mod datacenter;
pub mod events;
pub mod health;
pub mod paging;
pub mod token;
pub mod up;
pub mod workers;
