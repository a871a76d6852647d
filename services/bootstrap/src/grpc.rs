//! Thin gRPC adapter of the bootstrap service.

use std::pin::Pin;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_core::Violations;
use ctrlplane_proto::bootstrap::v1::{
    self as pb, bootstrap_service_server::BootstrapService as Rpc,
};
use ctrlplane_proto::pbjson_types;
use ctrlplane_runtime::auth::caller;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::model::{Event, State, Workload};
use crate::plan::Kind;
use crate::service::{self, BootstrapService};

/// The gRPC face of [`BootstrapService`].
#[derive(Clone)]
pub struct BootstrapGrpc {
    service: BootstrapService,
}

impl BootstrapGrpc {
    /// Wraps the service.
    pub fn new(service: BootstrapService) -> Self {
        BootstrapGrpc { service }
    }
}

fn ts(t: DateTime<Utc>) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// Protobuf state of a row state.
pub fn state_to_proto(s: State) -> pb::BootstrapState {
    match s {
        State::Pending => pb::BootstrapState::Pending,
        State::Provisioning => pb::BootstrapState::Provisioning,
        State::Running => pb::BootstrapState::Running,
        State::Failed => pb::BootstrapState::Failed,
        State::Retiring => pb::BootstrapState::Retiring,
        State::Retired => pb::BootstrapState::Retired,
        State::Waiting => pb::BootstrapState::Waiting,
    }
}

fn kind_to_proto(k: Kind) -> pb::ActionType {
    match k {
        Kind::Provision => pb::ActionType::Provision,
        Kind::Update => pb::ActionType::Update,
        Kind::Replace => pb::ActionType::Replace,
        Kind::Retire => pb::ActionType::Retire,
        Kind::Wait => pb::ActionType::Wait,
        Kind::Skip => pb::ActionType::Skip,
        Kind::Noop => pb::ActionType::Noop,
    }
}

/// Protobuf form of a row.
pub fn workload_to_proto(w: &Workload) -> pb::BootstrapWorkload {
    pb::BootstrapWorkload {
        id: w.id.clone(),
        datacenter_id: w.datacenter_id.clone(),
        name: w.name.clone(),
        kind: w.spec.kind,
        services: w.spec.services.clone(),
        state: state_to_proto(w.state) as i32,
        source: w.source.clone(),
        spec_hash: w.spec_hash.clone(),
        provider_ref: w.provider_ref.clone(),
        service_refs: w.service_refs.clone().into_iter().collect(),
        last_error: w.last_error.clone(),
        attempts: w.attempts,
        next_attempt_time: w.next_attempt_time.map(ts),
        labels: w.spec.labels.clone(),
        create_time: Some(ts(w.create_time)),
        update_time: Some(ts(w.update_time)),
        replicas: w.spec.replicas,
        depends_on: w.spec.depends_on.clone(),
        endpoints: w.endpoints.clone(),
        usage: w.usage.clone(),
        tenant_id: w.tenant_id.clone(),
    }
}

fn event_to_proto(e: &Event) -> pb::BootstrapEvent {
    pb::BootstrapEvent {
        id: e.id.clone(),
        sequence: e.sequence,
        datacenter_id: e.datacenter_id.clone(),
        workload_id: e.workload_id.clone(),
        name: e.name.clone(),
        r#type: e.kind.clone(),
        from_state: e.from_state.map(|s| state_to_proto(s) as i32).unwrap_or(0),
        to_state: e.to_state.map(|s| state_to_proto(s) as i32).unwrap_or(0),
        message: e.message.clone(),
        create_time: Some(ts(e.create_time)),
    }
}

fn duration(d: Duration) -> pbjson_types::Duration {
    pbjson_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn from_duration(
    field: &str,
    d: &Option<pbjson_types::Duration>,
) -> Result<Option<Duration>, Status> {
    match d {
        None => Ok(None),
        Some(d) if d.seconds >= 0 && d.nanos >= 0 => {
            Ok(Some(Duration::new(d.seconds as u64, d.nanos as u32)))
        }
        Some(_) => {
            let mut v = Violations::new();
            v.add(field, "must not be negative");
            Err(v.to_status())
        }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEventsResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Rpc for BootstrapGrpc {
    async fn reconcile(
        &self,
        req: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let caller = caller(&req)?;
        service::require(&caller)?;
        let r = req.into_inner();
        let outcome = match (r.datacenter, r.datacenter_id.is_empty()) {
            (Some(dc), true) => {
                self.service
                    .reconcile(&caller, &dc, &r.declared_services, r.dry_run)
                    .await?
            }
            (None, false) => {
                self.service
                    .reconcile_current(&caller, &r.datacenter_id, r.dry_run)
                    .await?
            }
            (Some(_), false) => {
                let mut v = Violations::new();
                v.add(
                    "datacenter_id",
                    "give either a datacenter snapshot or a datacenter_id, not both",
                );
                return Err(v.to_status());
            }
            (None, true) => {
                let mut v = Violations::new();
                v.add("datacenter", "is required (or set datacenter_id)");
                return Err(v.to_status());
            }
        };
        let mut actions: Vec<pb::PlanAction> = outcome
            .actions
            .iter()
            .map(|e| pb::PlanAction {
                name: e.action.name.clone(),
                r#type: kind_to_proto(e.action.kind) as i32,
                reason: e.action.reason.clone(),
                source: e.action.source.clone(),
                workload_id: e.action.workload_id.clone().unwrap_or_default(),
                error: e.error.clone().unwrap_or_default(),
            })
            .collect();
        // Deduplication decisions are part of the plan: shown as skips of
        // the losing source.
        actions.extend(outcome.notes.iter().map(|n| pb::PlanAction {
            name: n.name.clone(),
            r#type: pb::ActionType::Skip as i32,
            reason: n.message.clone(),
            source: n.source.clone(),
            workload_id: String::new(),
            error: String::new(),
        }));
        Ok(Response::new(pb::ReconcileResponse {
            actions,
            workloads: outcome.workloads.iter().map(workload_to_proto).collect(),
            stale: outcome.stale,
            paused: outcome.paused,
            purged: outcome.purged,
        }))
    }

    async fn list_bootstrap_workloads(
        &self,
        req: Request<pb::ListBootstrapWorkloadsRequest>,
    ) -> Result<Response<pb::ListBootstrapWorkloadsResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let (rows, next) = self
            .service
            .list(&caller, &r.datacenter_id, r.page_size, &r.page_token)
            .await?;
        Ok(Response::new(pb::ListBootstrapWorkloadsResponse {
            workloads: rows.iter().map(workload_to_proto).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn get_bootstrap_workload(
        &self,
        req: Request<pb::GetBootstrapWorkloadRequest>,
    ) -> Result<Response<pb::GetBootstrapWorkloadResponse>, Status> {
        let caller = caller(&req)?;
        let w = self.service.get(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::GetBootstrapWorkloadResponse {
            workload: Some(workload_to_proto(&w)),
        }))
    }

    async fn retry_bootstrap_workload(
        &self,
        req: Request<pb::RetryBootstrapWorkloadRequest>,
    ) -> Result<Response<pb::RetryBootstrapWorkloadResponse>, Status> {
        let caller = caller(&req)?;
        let w = self.service.retry(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::RetryBootstrapWorkloadResponse {
            workload: Some(workload_to_proto(&w)),
        }))
    }

    async fn sync_status(
        &self,
        req: Request<pb::SyncStatusRequest>,
    ) -> Result<Response<pb::SyncStatusResponse>, Status> {
        let caller = caller(&req)?;
        let results = self
            .service
            .sync_status(&caller, &req.get_ref().datacenter_id)
            .await?;
        Ok(Response::new(pb::SyncStatusResponse {
            results: results
                .into_iter()
                .map(|r| pb::SyncResult {
                    workload_id: r.workload.id.clone(),
                    name: r.workload.name.clone(),
                    status: r.status,
                    drifted: r.drifted,
                    error: r.error.unwrap_or_default(),
                })
                .collect(),
        }))
    }

    async fn collect_garbage(
        &self,
        req: Request<pb::CollectGarbageRequest>,
    ) -> Result<Response<pb::CollectGarbageResponse>, Status> {
        let caller = caller(&req)?;
        service::require(&caller)?;
        let grace = from_duration("grace_period", &req.get_ref().grace_period)?;
        let r = self.service.collect_garbage(&caller, grace).await?;
        Ok(Response::new(pb::CollectGarbageResponse {
            rows_retired: r.rows_retired,
            workloads_deprovisioned: r.workloads_deprovisioned,
            workloads_examined: r.workloads_examined,
            errors: r.errors,
        }))
    }

    async fn collect_resources(
        &self,
        req: Request<pb::CollectResourcesRequest>,
    ) -> Result<Response<pb::CollectResourcesResponse>, Status> {
        let caller = caller(&req)?;
        let (samples, errors) = self
            .service
            .collect_resources(&caller, &req.get_ref().datacenter_id)
            .await?;
        Ok(Response::new(pb::CollectResourcesResponse {
            samples,
            errors,
        }))
    }

    async fn list_hooks(
        &self,
        req: Request<pb::ListHooksRequest>,
    ) -> Result<Response<pb::ListHooksResponse>, Status> {
        let caller = caller(&req)?;
        let (rules, remote) = self.service.list_hooks(&caller).await?;
        let mut hooks: Vec<pb::Hook> = rules
            .iter()
            .map(|r| pb::Hook {
                name: r.name.clone(),
                kind: pb::HookKind::Rule as i32,
                selector: r.selector.describe(),
                ..Default::default()
            })
            .chain(remote.iter().map(|h| pb::Hook {
                name: h.name.clone(),
                kind: pb::HookKind::Remote as i32,
                endpoint: h.endpoint.clone(),
                timeout: Some(duration(h.timeout)),
                last_error: h.last_error.clone(),
                last_success_time: h.last_success_time.map(ts),
                selector: String::new(),
                create_time: Some(ts(h.create_time)),
            }))
            .collect();
        hooks.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListHooksResponse { hooks }))
    }

    async fn register_hook(
        &self,
        req: Request<pb::RegisterHookRequest>,
    ) -> Result<Response<pb::RegisterHookResponse>, Status> {
        let caller = caller(&req)?;
        service::require(&caller)?;
        let r = req.get_ref();
        let timeout = from_duration("timeout", &r.timeout)?;
        let h = self
            .service
            .register_hook(&caller, &r.name, &r.endpoint, timeout)
            .await?;
        Ok(Response::new(pb::RegisterHookResponse {
            hook: Some(pb::Hook {
                name: h.name,
                kind: pb::HookKind::Remote as i32,
                endpoint: h.endpoint,
                timeout: Some(duration(h.timeout)),
                last_error: h.last_error,
                last_success_time: h.last_success_time.map(ts),
                selector: String::new(),
                create_time: Some(ts(h.create_time)),
            }),
        }))
    }

    async fn unregister_hook(
        &self,
        req: Request<pb::UnregisterHookRequest>,
    ) -> Result<Response<pb::UnregisterHookResponse>, Status> {
        let caller = caller(&req)?;
        self.service
            .unregister_hook(&caller, &req.get_ref().name)
            .await?;
        Ok(Response::new(pb::UnregisterHookResponse {}))
    }

    async fn list_events(
        &self,
        req: Request<pb::ListEventsRequest>,
    ) -> Result<Response<pb::ListEventsResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let (events, next) = self
            .service
            .list_events(&caller, &r.datacenter_id, r.page_size, &r.page_token)
            .await?;
        Ok(Response::new(pb::ListEventsResponse {
            events: events.iter().map(event_to_proto).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        req: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let rx = self
            .service
            .watch(&caller, &r.datacenter_id, r.since_sequence)
            .await?;
        let stream =
            futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), |item| {
                item.map(|e| pb::WatchEventsResponse {
                    event: Some(event_to_proto(&e)),
                })
                .map_err(Status::from)
            });
        Ok(Response::new(Box::pin(stream)))
    }
}
