//! The agent registry (`ctrlplane.agent.v1.AgentRegistryService`): join
//! tokens, agent identities, leases and health. Same file scheme as the
//! datacenter domain: [`model`], [`store`], [`service`], [`grpc`].

pub mod grpc;
pub mod model;
pub mod service;
pub mod store;
