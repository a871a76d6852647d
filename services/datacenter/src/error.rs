//! The datacenter service's errors and their one mapping to gRPC statuses.

use ctrlplane_core::Violations;

/// Everything an operation of this service can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input; names every bad field.
    #[error("{0}")]
    InvalidArgument(Violations),
    /// No such datacenter visible to the caller.
    #[error("{0}")]
    NotFound(String),
    /// A datacenter with the same slug exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The current state forbids the operation (e.g. a status move).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller may see but not change it.
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller's credential is not (or no longer) valid.
    #[error("{0}")]
    Unauthenticated(String),
    /// A dependency (e.g. a provider agent) is not available.
    #[error("{0}")]
    Unavailable(String),
    /// The database failed.
    #[error("database error: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// Stored data could not be decoded (a bug or a hand-edited row).
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
}

/// Result alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A `NotFound` for a datacenter id.
    pub fn not_found(id: &str) -> Self {
        Error::NotFound(format!("datacenter {id} not found"))
    }
}

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
            Error::AlreadyExists(m) => tonic::Status::already_exists(m),
            Error::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            Error::PermissionDenied(m) => tonic::Status::permission_denied(m),
            Error::Unauthenticated(m) => tonic::Status::unauthenticated(m),
            Error::Unavailable(m) => tonic::Status::unavailable(m),
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
