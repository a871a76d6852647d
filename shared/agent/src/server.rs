//! The gRPC adapter that serves any [`Provider`] as `ProviderService`.
//!
//! It is where the protocol's common rules live, so every agent keeps them
//! the same way:
//! - only platform tokens (`system:admin`, `system:service`) are accepted;
//! - an RPC whose capability the provider does not advertise answers
//!   `UNIMPLEMENTED` (and so does a Provision asking for volumes or GPUs
//!   from a provider without them) — never a fake success;
//! - requests are validated before the provider sees them: instance ids,
//!   names, kinds, labels and the services (the shared rules of
//!   `ctrlplane_core::validate`), reporting every bad field;
//! - calls that change the backend (provision, deprovision, start, stop,
//!   restart, deploy, rollback, scale) run in a task of their own, so a
//!   caller that goes away (a timeout, a killed control-plane process)
//!   never cancels a change half-way and leaves the backend between two
//!   states; the caller's retry then finds the finished result.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_core::{Violations, page, validate};
use ctrlplane_proto::provider::v1::{self as pb, provider_service_server::ProviderService};
use ctrlplane_runtime::auth::{Authenticator, require_system};
use ctrlplane_runtime::server::{ServeError, ServeOptions, serve};
use futures::StreamExt;
use tonic::{Request, Response, Status};

use crate::provider::{Capability, LogStream, Provider, ProviderError};

/// Longest instance id accepted.
pub const INSTANCE_ID_MAX: usize = 64;
/// Default Stop grace period.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// Longest Stop grace period.
pub const MAX_STOP_GRACE: Duration = Duration::from_secs(600);
/// Default and largest ListManaged page.
pub const MANAGED_PAGE: (u32, u32) = (100, 1000);

/// Serves a [`Provider`] over gRPC.
pub struct ProviderGrpc<P> {
    provider: Arc<P>,
}

impl<P> Clone for ProviderGrpc<P> {
    fn clone(&self) -> Self {
        ProviderGrpc {
            provider: self.provider.clone(),
        }
    }
}

impl<P: Provider> ProviderGrpc<P> {
    /// Wraps a provider.
    pub fn new(provider: Arc<P>) -> Self {
        ProviderGrpc { provider }
    }

    fn require(&self, cap: Capability) -> Result<(), Status> {
        if self.provider.capabilities().contains(&cap) {
            Ok(())
        } else {
            Err(ProviderError::unsupported(cap).into())
        }
    }
}

/// Serves `provider` on `listener` (with health, reflection and the auth
/// layer) until `shutdown` resolves.
///
/// # Errors
/// Server failures.
pub async fn serve_provider<P: Provider>(
    provider: Arc<P>,
    listener: tokio::net::TcpListener,
    auth: Arc<Authenticator>,
    grace: Duration,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let routes = tonic::service::Routes::new(
        pb::provider_service_server::ProviderServiceServer::new(ProviderGrpc::new(provider))
            .max_decoding_message_size(16 * 1024 * 1024),
    );
    let options = ServeOptions {
        auth,
        service_names: vec!["ctrlplane.provider.v1.ProviderService"],
        grace,
        public_methods: Vec::new(),
    };
    serve(listener, options, routes, shutdown).await
}

/// Checks an instance id: required, at most [`INSTANCE_ID_MAX`] characters
/// of `[a-z0-9_-]` (TypeIDs like `bws_…` fit), so every backend can use it
/// in object names.
pub fn check_instance_id(v: &mut Violations, field: &str, id: &str) {
    if id.is_empty() {
        v.add(field, "is required");
    } else if id.len() > INSTANCE_ID_MAX {
        v.add(
            field,
            format!("must be at most {INSTANCE_ID_MAX} characters"),
        );
    } else if !id
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    {
        v.add(field, "may contain only a-z, 0-9, '_' and '-'");
    }
}

fn instance(id: &str) -> Result<(), Status> {
    let mut v = Violations::new();
    check_instance_id(&mut v, "instance_id", id);
    v.into_result().map_err(|v| v.to_status())
}

/// Validates a Provision request with the shared rules.
pub fn check_provision(req: &pb::ProvisionRequest) -> Violations {
    let mut v = Violations::new();
    check_instance_id(&mut v, "instance_id", &req.instance_id);
    validate::dns_label(&mut v, "name", &req.name);
    if pb::WorkloadKind::try_from(req.kind).is_err() {
        v.add("kind", format!("unknown workload kind {}", req.kind));
    }
    if req.tenant_id.len() > 128 {
        v.add("tenant_id", "must be at most 128 characters");
    }
    validate::labels(&mut v, "labels", &req.labels);
    validate::service_specs(&mut v, "services", &req.services);
    v
}

fn duration(d: &Option<ctrlplane_proto::pbjson_types::Duration>) -> Option<Result<Duration, ()>> {
    d.as_ref().map(|d| {
        if d.seconds < 0 || d.nanos < 0 {
            Err(())
        } else {
            Ok(Duration::new(d.seconds as u64, d.nanos as u32))
        }
    })
}

/// Runs a backend-changing provider call to completion even if the caller
/// goes away (see the module docs).
async fn detached<T, F>(call: F) -> Result<T, Status>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<T, ProviderError>> + Send + 'static,
{
    tokio::spawn(call)
        .await
        .map_err(|e| Status::internal(format!("provider task failed: {e}")))?
        .map_err(Status::from)
}

type LogsStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::StreamLogsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl<P: Provider> ProviderService for ProviderGrpc<P> {
    async fn get_info(
        &self,
        req: Request<pb::GetInfoRequest>,
    ) -> Result<Response<pb::GetInfoResponse>, Status> {
        require_system(&req)?;
        Ok(Response::new(self.provider.info()))
    }

    async fn get_capabilities(
        &self,
        req: Request<pb::GetCapabilitiesRequest>,
    ) -> Result<Response<pb::GetCapabilitiesResponse>, Status> {
        require_system(&req)?;
        Ok(Response::new(pb::GetCapabilitiesResponse {
            capabilities: self
                .provider
                .capabilities()
                .into_iter()
                .map(|c| c.as_str().to_string())
                .collect(),
        }))
    }

    async fn provision(
        &self,
        req: Request<pb::ProvisionRequest>,
    ) -> Result<Response<pb::ProvisionResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        let req = req.into_inner();
        check_provision(&req)
            .into_result()
            .map_err(|v| v.to_status())?;
        if req.services.iter().any(|s| !s.volumes.is_empty()) {
            self.require(Capability::Volumes)?;
        }
        if req
            .services
            .iter()
            .any(|s| s.resources.as_ref().is_some_and(|r| r.gpu > 0))
        {
            self.require(Capability::Gpu)?;
        }
        let p = self.provider.clone();
        Ok(Response::new(
            detached(async move { p.provision(req).await }).await?,
        ))
    }

    async fn deprovision(
        &self,
        req: Request<pb::DeprovisionRequest>,
    ) -> Result<Response<pb::DeprovisionResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        instance(&req.get_ref().instance_id)?;
        let (p, id) = (self.provider.clone(), req.into_inner().instance_id);
        Ok(Response::new(
            detached(async move { p.deprovision(&id).await }).await?,
        ))
    }

    async fn start(
        &self,
        req: Request<pb::StartRequest>,
    ) -> Result<Response<pb::StartResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        instance(&req.get_ref().instance_id)?;
        let (p, id) = (self.provider.clone(), req.into_inner().instance_id);
        let status = detached(async move { p.start(&id).await }).await?;
        Ok(Response::new(pb::StartResponse {
            status: Some(status),
        }))
    }

    async fn stop(
        &self,
        req: Request<pb::StopRequest>,
    ) -> Result<Response<pb::StopResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        let r = req.get_ref();
        let mut v = Violations::new();
        check_instance_id(&mut v, "instance_id", &r.instance_id);
        let grace = match duration(&r.grace_period) {
            None => DEFAULT_STOP_GRACE,
            Some(Ok(d)) if d <= MAX_STOP_GRACE => d,
            Some(_) => {
                v.add(
                    "grace_period",
                    format!("must be between 0 and {}s", MAX_STOP_GRACE.as_secs()),
                );
                DEFAULT_STOP_GRACE
            }
        };
        v.into_result().map_err(|v| v.to_status())?;
        let (p, id) = (self.provider.clone(), r.instance_id.clone());
        let status = detached(async move { p.stop(&id, grace).await }).await?;
        Ok(Response::new(pb::StopResponse {
            status: Some(status),
        }))
    }

    async fn restart(
        &self,
        req: Request<pb::RestartRequest>,
    ) -> Result<Response<pb::RestartResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        let r = req.get_ref();
        instance(&r.instance_id)?;
        let (p, id, service) = (
            self.provider.clone(),
            r.instance_id.clone(),
            r.service_name.clone(),
        );
        let status = detached(async move {
            let service = Some(service.as_str()).filter(|s| !s.is_empty());
            p.restart(&id, service).await
        })
        .await?;
        Ok(Response::new(pb::RestartResponse {
            status: Some(status),
        }))
    }

    async fn get_status(
        &self,
        req: Request<pb::GetStatusRequest>,
    ) -> Result<Response<pb::GetStatusResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        instance(&req.get_ref().instance_id)?;
        let status = self.provider.status(&req.get_ref().instance_id).await?;
        Ok(Response::new(pb::GetStatusResponse {
            status: Some(status),
        }))
    }

    async fn deploy(
        &self,
        req: Request<pb::DeployRequest>,
    ) -> Result<Response<pb::DeployResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Deploy)?;
        let r = req.into_inner();
        let mut v = Violations::new();
        check_instance_id(&mut v, "instance_id", &r.instance_id);
        if r.release_id.is_empty() || r.release_id.len() > 128 {
            v.add("release_id", "is required (at most 128 characters)");
        }
        if r.services.is_empty() {
            v.add("services", "must name at least one service to change");
        }
        for (i, s) in r.services.iter().enumerate() {
            validate::dns_label(&mut v, &format!("services[{i}].name"), &s.name);
        }
        let strategy = pb::DeployStrategy::try_from(r.strategy);
        if strategy.is_err() {
            v.add("strategy", format!("unknown strategy {}", r.strategy));
        }
        v.into_result().map_err(|v| v.to_status())?;
        match strategy {
            Ok(pb::DeployStrategy::BlueGreen) => self.require(Capability::StrategyBlueGreen)?,
            Ok(pb::DeployStrategy::Canary) => self.require(Capability::StrategyCanary)?,
            _ => {}
        }
        let p = self.provider.clone();
        Ok(Response::new(
            detached(async move { p.deploy(r).await }).await?,
        ))
    }

    async fn rollback(
        &self,
        req: Request<pb::RollbackRequest>,
    ) -> Result<Response<pb::RollbackResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Deploy)?;
        instance(&req.get_ref().instance_id)?;
        let (p, r) = (self.provider.clone(), req.into_inner());
        Ok(Response::new(
            detached(async move { p.rollback(r).await }).await?,
        ))
    }

    async fn scale(
        &self,
        req: Request<pb::ScaleRequest>,
    ) -> Result<Response<pb::ScaleResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Scale)?;
        let r = req.into_inner();
        let mut v = Violations::new();
        check_instance_id(&mut v, "instance_id", &r.instance_id);
        match &r.resources {
            None => v.add("resources", "is required"),
            Some(res) => {
                for (name, value) in [
                    ("cpu_millis", res.cpu_millis),
                    ("memory_mb", res.memory_mb),
                    ("disk_mb", res.disk_mb),
                    ("replicas", res.replicas),
                    ("gpu", res.gpu),
                ] {
                    if value < 0 {
                        v.add(format!("resources.{name}"), "must not be negative");
                    }
                }
                if res.replicas > validate::MAX_REPLICAS {
                    v.add(
                        "resources.replicas",
                        format!("must be at most {}", validate::MAX_REPLICAS),
                    );
                }
            }
        }
        v.into_result().map_err(|v| v.to_status())?;
        let p = self.provider.clone();
        let status = detached(async move { p.scale(r).await }).await?;
        Ok(Response::new(pb::ScaleResponse {
            status: Some(status),
        }))
    }

    async fn get_resources(
        &self,
        req: Request<pb::GetResourcesRequest>,
    ) -> Result<Response<pb::GetResourcesResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Provision)?;
        instance(&req.get_ref().instance_id)?;
        let usage = self.provider.resources(&req.get_ref().instance_id).await?;
        Ok(Response::new(pb::GetResourcesResponse {
            usage: Some(usage),
        }))
    }

    type StreamLogsStream = LogsStream;

    async fn stream_logs(
        &self,
        req: Request<pb::StreamLogsRequest>,
    ) -> Result<Response<Self::StreamLogsStream>, Status> {
        require_system(&req)?;
        self.require(Capability::Logs)?;
        let r = req.into_inner();
        let mut v = Violations::new();
        check_instance_id(&mut v, "instance_id", &r.instance_id);
        if r.tail < 0 {
            v.add("tail", "must not be negative");
        }
        v.into_result().map_err(|v| v.to_status())?;
        let stream: LogStream = self.provider.logs(r).await?;
        Ok(Response::new(Box::pin(
            stream.map(|item| item.map_err(Status::from)),
        )))
    }

    async fn exec(
        &self,
        req: Request<pb::ExecRequest>,
    ) -> Result<Response<pb::ExecResponse>, Status> {
        require_system(&req)?;
        self.require(Capability::Exec)?;
        let r = req.into_inner();
        let mut v = Violations::new();
        check_instance_id(&mut v, "instance_id", &r.instance_id);
        if r.service_name.is_empty() {
            v.add("service_name", "is required");
        }
        if r.command.is_empty() || r.command[0].is_empty() {
            v.add("command", "is required");
        }
        if r.replica < 0 {
            v.add("replica", "must not be negative");
        }
        if let Some(Err(())) = duration(&r.timeout) {
            v.add("timeout", "must not be negative");
        }
        v.into_result().map_err(|v| v.to_status())?;
        Ok(Response::new(self.provider.exec(r).await?))
    }

    async fn check_health(
        &self,
        req: Request<pb::CheckHealthRequest>,
    ) -> Result<Response<pb::CheckHealthResponse>, Status> {
        require_system(&req)?;
        Ok(Response::new(self.provider.check_health().await?))
    }

    async fn list_managed(
        &self,
        req: Request<pb::ListManagedRequest>,
    ) -> Result<Response<pb::ListManagedResponse>, Status> {
        require_system(&req)?;
        let r = req.get_ref();
        let size = page::page_size(r.page_size, MANAGED_PAGE.0, MANAGED_PAGE.1).map_err(|e| {
            let mut v = Violations::new();
            v.add("page_size", e);
            v.to_status()
        })?;
        Ok(Response::new(
            self.provider.list_managed(size, &r.page_token).await?,
        ))
    }
}
