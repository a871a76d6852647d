//! Generated code for the ctrlplane gRPC contract (`proto/ctrlplane/**`).
//!
//! One module per protobuf package, named after it. `FILE_DESCRIPTOR_SET`
//! holds every file's descriptor for the reflection service.

#![allow(clippy::all, clippy::pedantic, missing_docs)]

pub use pbjson_types;

/// Serialized `FileDescriptorSet` of every ctrlplane proto file.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ctrlplane_descriptor");

/// Serialized `FileDescriptorSet` of `google/rpc/error_details.proto` (the
/// error details our statuses carry), for reflection.
pub const GOOGLE_RPC_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("google_rpc_descriptor");

pub mod provider {
    pub mod v1 {
        tonic::include_proto!("ctrlplane.provider.v1");
        include!(concat!(env!("OUT_DIR"), "/ctrlplane.provider.v1.serde.rs"));
    }
}

pub mod datacenter {
    pub mod v1 {
        tonic::include_proto!("ctrlplane.datacenter.v1");
        include!(concat!(
            env!("OUT_DIR"),
            "/ctrlplane.datacenter.v1.serde.rs"
        ));
    }
}

pub mod agent {
    pub mod v1 {
        tonic::include_proto!("ctrlplane.agent.v1");
        include!(concat!(env!("OUT_DIR"), "/ctrlplane.agent.v1.serde.rs"));
    }
}

pub mod bootstrap {
    pub mod v1 {
        tonic::include_proto!("ctrlplane.bootstrap.v1");
        include!(concat!(env!("OUT_DIR"), "/ctrlplane.bootstrap.v1.serde.rs"));
    }
}

pub mod scheduler {
    pub mod v1 {
        tonic::include_proto!("ctrlplane.scheduler.v1");
        include!(concat!(env!("OUT_DIR"), "/ctrlplane.scheduler.v1.serde.rs"));
    }
}
