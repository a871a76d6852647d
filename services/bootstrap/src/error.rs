//! The bootstrap service's errors and their one mapping to gRPC statuses.

use ctrlplane_core::Violations;

/// Everything an operation of this service can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input; names every bad field.
    #[error("{0}")]
    InvalidArgument(Violations),
    /// No such row, hook or datacenter.
    #[error("{0}")]
    NotFound(String),
    /// The state forbids the operation.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// An agent, hook or peer service is unreachable.
    #[error("{0}")]
    Unavailable(String),
    /// Another reconcile of the datacenter is running.
    #[error("{0}")]
    Aborted(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// Stored data could not be decoded.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Violations> for Error {
    fn from(v: Violations) -> Self {
        Error::InvalidArgument(v)
    }
}

impl From<Error> for tonic::Status {
    fn from(e: Error) -> Self {
        match e {
            Error::InvalidArgument(v) => v.to_status(),
            Error::NotFound(m) => tonic::Status::not_found(m),
            Error::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            Error::PermissionDenied(m) => tonic::Status::permission_denied(m),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
            Error::Aborted(m) => tonic::Status::aborted(m),
            Error::Database(e) => {
                tracing::error!(error = %e, "database error");
                tonic::Status::internal("internal database error")
            }
            Error::Corrupt(m) => {
                tracing::error!(error = %m, "corrupt stored data");
                tonic::Status::internal("internal error: corrupt stored data")
            }
        }
    }
}
