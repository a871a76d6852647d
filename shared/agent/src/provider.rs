//! The [`Provider`] trait: one backend behind `ProviderService`.
//!
//! Contract every implementation keeps (the conformance kit checks it):
//! - calls are keyed by instance id; `provision` of an existing instance
//!   returns its refs and creates nothing; `deprovision` of an unknown
//!   instance succeeds;
//! - every backend object is named and labelled by the instance id, so the
//!   agent finds its objects again after a restart from the backend alone;
//! - a method whose capability is not in [`Provider::capabilities`] is never
//!   called (the server adapter answers `UNIMPLEMENTED`); its default body
//!   answers the same, never a fake success.

use std::pin::Pin;

use ctrlplane_core::Violations;
use ctrlplane_proto::provider::v1 as pb;
use futures::Stream;

/// A capability an agent may advertise (`GetCapabilities` strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Capability {
    /// Provision/Deprovision/Start/Stop/Restart/GetStatus.
    Provision,
    /// Deploy and Rollback.
    Deploy,
    /// Scale.
    Scale,
    /// StreamLogs.
    Logs,
    /// Exec.
    Exec,
    /// Volumes in service specs.
    Volumes,
    /// GPUs in resource specs.
    Gpu,
    /// Rolling deploys.
    StrategyRolling,
    /// Blue-green deploys.
    StrategyBlueGreen,
    /// Canary deploys.
    StrategyCanary,
    /// Autoscaling.
    Autoscale,
    /// Custom domains.
    CustomDomains,
    /// TLS termination.
    Tls,
}

impl Capability {
    /// Every capability.
    pub const ALL: [Capability; 13] = [
        Capability::Provision,
        Capability::Deploy,
        Capability::Scale,
        Capability::Logs,
        Capability::Exec,
        Capability::Volumes,
        Capability::Gpu,
        Capability::StrategyRolling,
        Capability::StrategyBlueGreen,
        Capability::StrategyCanary,
        Capability::Autoscale,
        Capability::CustomDomains,
        Capability::Tls,
    ];

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Provision => "provision",
            Capability::Deploy => "deploy",
            Capability::Scale => "scale",
            Capability::Logs => "logs",
            Capability::Exec => "exec",
            Capability::Volumes => "volumes",
            Capability::Gpu => "gpu",
            Capability::StrategyRolling => "strategy:rolling",
            Capability::StrategyBlueGreen => "strategy:blue-green",
            Capability::StrategyCanary => "strategy:canary",
            Capability::Autoscale => "autoscale",
            Capability::CustomDomains => "custom-domains",
            Capability::Tls => "tls",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Capability> {
        Capability::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors a provider returns; mapped to gRPC codes in one place.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// Bad request; names every bad field.
    #[error("{0}")]
    InvalidArgument(Violations),
    /// No such instance (or service, or release).
    #[error("{0}")]
    NotFound(String),
    /// The instance's state forbids the call.
    #[error("{0}")]
    FailedPrecondition(String),
    /// The backend cannot do this.
    #[error("{0}")]
    Unimplemented(String),
    /// The backend is unreachable or overloaded; retry later.
    #[error("{0}")]
    Unavailable(String),
    /// The call did not finish in time.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// Anything else the backend failed at.
    #[error("{0}")]
    Internal(String),
}

impl ProviderError {
    /// `Unimplemented` for a capability this provider lacks.
    pub fn unsupported(cap: Capability) -> Self {
        ProviderError::Unimplemented(format!(
            "this agent does not support {cap:?} (capability {:?} not advertised)",
            cap.as_str()
        ))
    }

    /// `InvalidArgument` with one violation.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        let mut v = Violations::new();
        v.add(field, description);
        ProviderError::InvalidArgument(v)
    }

    /// `NotFound` for an instance id.
    pub fn no_instance(id: &str) -> Self {
        ProviderError::NotFound(format!("instance {id} not found"))
    }
}

impl From<Violations> for ProviderError {
    fn from(v: Violations) -> Self {
        ProviderError::InvalidArgument(v)
    }
}

impl From<ProviderError> for tonic::Status {
    fn from(e: ProviderError) -> Self {
        match e {
            ProviderError::InvalidArgument(v) => v.to_status(),
            ProviderError::NotFound(m) => tonic::Status::not_found(m),
            ProviderError::FailedPrecondition(m) => tonic::Status::failed_precondition(m),
            ProviderError::Unimplemented(m) => tonic::Status::unimplemented(m),
            ProviderError::Unavailable(m) => tonic::Status::unavailable(m),
            ProviderError::DeadlineExceeded(m) => tonic::Status::deadline_exceeded(m),
            ProviderError::Internal(m) => tonic::Status::internal(m),
        }
    }
}

/// Result alias.
pub type Result<T, E = ProviderError> = std::result::Result<T, E>;

/// Where a ListManaged page starts: the instance id its token (made by
/// [`managed_page_token`]) continues after; `None` for the first page.
///
/// # Errors
/// `INVALID_ARGUMENT` on `page_token` for a token this agent did not issue.
pub fn managed_page_start(page_token: &str) -> Result<Option<String>> {
    let mut v = Violations::new();
    let after = ctrlplane_core::page::decode_bound(&mut v, "page_token", page_token, "", "");
    v.into_result()?;
    Ok(after)
}

/// The ListManaged token of a page that continues after `last_instance_id`.
pub fn managed_page_token(last_instance_id: &str) -> String {
    ctrlplane_core::page::encode_bound(last_instance_id, "")
}

/// A stream of log lines.
pub type LogStream = Pin<Box<dyn Stream<Item = Result<pb::StreamLogsResponse>> + Send>>;

/// One backend. Requests arrive already checked by the server adapter:
/// instance ids are present, Provision's name, kind, labels and services
/// pass the shared validation, and the RPC's capability is advertised.
#[tonic::async_trait]
pub trait Provider: Send + Sync + 'static {
    /// Provider name, version and backend description.
    fn info(&self) -> pb::GetInfoResponse;

    /// The capabilities this provider really supports.
    fn capabilities(&self) -> Vec<Capability>;

    /// Creates and starts an instance; idempotent by instance id.
    async fn provision(&self, req: pb::ProvisionRequest) -> Result<pb::ProvisionResponse>;

    /// Removes an instance and everything it owns; unknown ids succeed
    /// with `existed = false`.
    async fn deprovision(&self, instance_id: &str) -> Result<pb::DeprovisionResponse>;

    /// Starts a stopped instance.
    async fn start(&self, instance_id: &str) -> Result<pb::InstanceStatus>;

    /// Stops an instance: graceful signal, forced kill after `grace`.
    async fn stop(
        &self,
        instance_id: &str,
        grace: std::time::Duration,
    ) -> Result<pb::InstanceStatus>;

    /// Restarts one service (`Some`) or all.
    async fn restart(&self, instance_id: &str, service: Option<&str>)
    -> Result<pb::InstanceStatus>;

    /// The instance's status.
    async fn status(&self, instance_id: &str) -> Result<pb::InstanceStatus>;

    /// Rolls out new images/env/commands (capability `deploy`).
    async fn deploy(&self, _req: pb::DeployRequest) -> Result<pb::DeployResponse> {
        Err(ProviderError::unsupported(Capability::Deploy))
    }

    /// Returns to an earlier release (capability `deploy`).
    async fn rollback(&self, _req: pb::RollbackRequest) -> Result<pb::RollbackResponse> {
        Err(ProviderError::unsupported(Capability::Deploy))
    }

    /// Changes replicas/resources (capability `scale`).
    async fn scale(&self, _req: pb::ScaleRequest) -> Result<pb::InstanceStatus> {
        Err(ProviderError::unsupported(Capability::Scale))
    }

    /// Current resource usage.
    async fn resources(&self, instance_id: &str) -> Result<pb::ResourceUsage>;

    /// Log lines (capability `logs`).
    async fn logs(&self, _req: pb::StreamLogsRequest) -> Result<LogStream> {
        Err(ProviderError::unsupported(Capability::Logs))
    }

    /// Runs a command in a service (capability `exec`).
    async fn exec(&self, _req: pb::ExecRequest) -> Result<pb::ExecResponse> {
        Err(ProviderError::unsupported(Capability::Exec))
    }

    /// Whether the backend is reachable.
    async fn check_health(&self) -> Result<pb::CheckHealthResponse>;

    /// Every instance this agent manages, paginated.
    async fn list_managed(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListManagedResponse>;
}
