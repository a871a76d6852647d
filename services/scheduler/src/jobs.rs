//! The scheduler's workers: what each one asks of the other services.
//!
//! - `reconciler`: pages through every datacenter of every tenant (the
//!   scheduler's service token sees all) and asks bootstrap to reconcile
//!   each, with bounded concurrency;
//! - `watch`: holds `WatchDatacenters` and reconciles a changed datacenter
//!   at once, resuming from the last revision it saw after a disconnect —
//!   convergence never waits for the periodic tick;
//! - `status_sync` → `SyncStatus` per datacenter; `gc` → `CollectGarbage`;
//!   `telemetry` → `CollectResources`; `provider_health` → `CheckAgents`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use ctrlplane_core::snapshot::bootstrap_snapshot;
use ctrlplane_proto::agent::v1::{
    self as agpb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::bootstrap::v1::{
    self as bspb, bootstrap_service_client::BootstrapServiceClient,
};
use ctrlplane_proto::datacenter::v1::{
    self as dcpb, datacenter_service_client::DatacenterServiceClient,
};
use ctrlplane_runtime::client::AuthedChannel;
use futures::StreamExt;
use tonic::Code;

use crate::worker::{Job, JobFuture, RunScope};

/// Clients of the services the workers drive.
#[derive(Clone)]
pub struct Peers {
    /// Datacenter service.
    pub datacenters: DatacenterServiceClient<AuthedChannel>,
    /// Agent registry (in the datacenter process).
    pub registry: AgentRegistryServiceClient<AuthedChannel>,
    /// Bootstrap service.
    pub bootstrap: BootstrapServiceClient<AuthedChannel>,
    /// Timeout of one call.
    pub call_timeout: Duration,
    /// Calls made at once per run.
    pub concurrency: usize,
}

fn status(what: &str, s: &tonic::Status) -> String {
    format!("{what}: {:?}: {}", s.code(), s.message())
}

impl Peers {
    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.call_timeout);
        r
    }

    /// Every datacenter of every tenant, page by page.
    ///
    /// # Errors
    /// The failing call, described.
    pub async fn all_datacenters(&self) -> Result<Vec<dcpb::Datacenter>, String> {
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let page = self
                .datacenters
                .clone()
                .list_datacenters(self.request(dcpb::ListDatacentersRequest {
                    page_size: 500,
                    page_token: token.clone(),
                    ..Default::default()
                }))
                .await
                .map_err(|s| status("ListDatacenters", &s))?
                .into_inner();
            out.extend(page.datacenters);
            if page.next_page_token.is_empty() {
                return Ok(out);
            }
            token = page.next_page_token;
        }
    }

    async fn one_datacenter(&self, id: &str) -> Result<dcpb::Datacenter, String> {
        self.datacenters
            .clone()
            .get_datacenter(self.request(dcpb::GetDatacenterRequest { id: id.to_string() }))
            .await
            .map_err(|s| status("GetDatacenter", &s))?
            .into_inner()
            .datacenter
            .ok_or_else(|| "GetDatacenter: empty answer".to_string())
    }

    async fn scope_datacenters(&self, scope: &RunScope) -> Result<Vec<dcpb::Datacenter>, String> {
        match &scope.datacenter_id {
            Some(id) => Ok(vec![self.one_datacenter(id).await?]),
            None => self.all_datacenters().await,
        }
    }

    /// Reconciles one datacenter snapshot. Another reconcile of it being in
    /// flight (`ABORTED`) is retried a few times, so a change is never
    /// dropped because an older run was still going.
    ///
    /// # Errors
    /// The failing call, described.
    pub async fn reconcile(&self, dc: &dcpb::Datacenter) -> Result<(), String> {
        let (info, declared) = bootstrap_snapshot(dc);
        for attempt in 0..20u32 {
            let res = self
                .bootstrap
                .clone()
                .reconcile(self.request(bspb::ReconcileRequest {
                    datacenter: Some(info.clone()),
                    declared_services: declared.clone(),
                    dry_run: false,
                    datacenter_id: String::new(),
                }))
                .await;
            match res {
                Ok(_) => return Ok(()),
                Err(s) if s.code() == Code::Aborted && attempt < 19 => {
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt + 1).min(5)))
                        .await;
                }
                Err(s) => return Err(status(&format!("Reconcile {}", dc.id), &s)),
            }
        }
        Ok(())
    }

    /// Runs `f` for each datacenter with bounded concurrency; summarizes
    /// failures.
    async fn for_each<F, Fut>(
        &self,
        dcs: Vec<dcpb::Datacenter>,
        what: &str,
        f: F,
    ) -> Result<(), String>
    where
        F: Fn(Peers, dcpb::Datacenter) -> Fut,
        Fut: std::future::Future<Output = Result<(), String>>,
    {
        let total = dcs.len();
        let errors: Vec<String> = futures::stream::iter(dcs)
            .map(|dc| f(self.clone(), dc))
            .buffer_unordered(self.concurrency.max(1))
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
        match errors.first() {
            None => Ok(()),
            Some(first) => Err(format!(
                "{} of {total} {what} failed; first: {first}",
                errors.len()
            )),
        }
    }
}

/// The periodic reconcile of every datacenter.
pub fn reconciler(peers: Peers) -> Arc<dyn Job> {
    Arc::new(move |scope: RunScope| {
        let peers = peers.clone();
        async move {
            let dcs = peers.scope_datacenters(&scope).await?;
            peers
                .for_each(
                    dcs,
                    "reconciles",
                    |p, dc| async move { p.reconcile(&dc).await },
                )
                .await
        }
    })
}

/// `SyncStatus` for every datacenter.
pub fn status_sync(peers: Peers) -> Arc<dyn Job> {
    Arc::new(move |scope: RunScope| {
        let peers = peers.clone();
        async move {
            let dcs = peers.scope_datacenters(&scope).await?;
            peers
                .for_each(dcs, "status syncs", |p, dc| async move {
                    p.bootstrap
                        .clone()
                        .sync_status(p.request(bspb::SyncStatusRequest {
                            datacenter_id: dc.id.clone(),
                        }))
                        .await
                        .map(|_| ())
                        .map_err(|s| status(&format!("SyncStatus {}", dc.id), &s))
                })
                .await
        }
    })
}

/// `CollectGarbage`.
pub fn gc(peers: Peers) -> Arc<dyn Job> {
    Arc::new(move |_scope: RunScope| {
        let peers = peers.clone();
        async move {
            let r = peers
                .bootstrap
                .clone()
                .collect_garbage(peers.request(bspb::CollectGarbageRequest { grace_period: None }))
                .await
                .map_err(|s| status("CollectGarbage", &s))?
                .into_inner();
            match r.errors.first() {
                None => Ok(()),
                Some(e) => Err(format!("{} errors; first: {e}", r.errors.len())),
            }
        }
    })
}

/// `CollectResources`.
pub fn telemetry(peers: Peers) -> Arc<dyn Job> {
    Arc::new(move |scope: RunScope| {
        let peers = peers.clone();
        async move {
            let r = peers
                .bootstrap
                .clone()
                .collect_resources(peers.request(bspb::CollectResourcesRequest {
                    datacenter_id: scope.datacenter_id.unwrap_or_default(),
                }))
                .await
                .map_err(|s| status("CollectResources", &s))?
                .into_inner();
            match r.errors.first() {
                None => Ok(()),
                Some(e) => Err(format!("{} errors; first: {e}", r.errors.len())),
            }
        }
    })
}

/// `CheckAgents`: agent health and `last_checked_at` on their datacenters.
pub fn provider_health(peers: Peers) -> Arc<dyn Job> {
    Arc::new(move |_scope: RunScope| {
        let peers = peers.clone();
        async move {
            let r = peers
                .registry
                .clone()
                .check_agents(peers.request(agpb::CheckAgentsRequest {}))
                .await
                .map_err(|s| status("CheckAgents", &s))?
                .into_inner();
            let unhealthy: Vec<String> = r
                .agents
                .iter()
                .filter(|a| a.health != agpb::AgentHealth::Healthy as i32)
                .map(|a| format!("{} ({})", a.id, a.last_error))
                .collect();
            if unhealthy.is_empty() {
                Ok(())
            } else {
                Err(format!("unhealthy agents: {}", unhealthy.join(", ")))
            }
        }
    })
}

/// The watch-driven reconcile. One run holds the stream until it ends;
/// the next run resumes after the last revision seen.
pub struct Watcher {
    peers: Peers,
    last_revision: Arc<AtomicI64>,
}

impl Watcher {
    /// A watcher starting at "now".
    pub fn new(peers: Peers) -> Self {
        Watcher {
            peers,
            last_revision: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The last revision handled.
    pub fn last_revision(&self) -> i64 {
        self.last_revision.load(Ordering::SeqCst)
    }
}

impl Job for Watcher {
    fn run(&self, _scope: RunScope) -> JobFuture {
        let peers = self.peers.clone();
        let last = self.last_revision.clone();
        Box::pin(async move {
            let since = last.load(Ordering::SeqCst);
            let mut stream = peers
                .datacenters
                .clone()
                .watch_datacenters(dcpb::WatchDatacentersRequest {
                    since_revision: since,
                })
                .await
                .map_err(|s| status("WatchDatacenters", &s))?
                .into_inner();
            tracing::info!(since, "watching datacenters");
            let permits = Arc::new(tokio::sync::Semaphore::new(peers.concurrency.max(1)));
            if since == 0 {
                // Watching "from now": whatever changed before the stream
                // opened is caught by one pass over every datacenter, so
                // nothing slips between a listing and the watch.
                let peers = peers.clone();
                tokio::spawn(async move {
                    match peers.all_datacenters().await {
                        Ok(dcs) => {
                            let _ = peers
                                .for_each(dcs, "catch-up reconciles", |p, dc| async move {
                                    p.reconcile(&dc).await
                                })
                                .await
                                .map_err(
                                    |e| tracing::warn!(error = %e, "catch-up reconcile failed"),
                                );
                        }
                        Err(e) => tracing::warn!(error = %e, "catch-up listing failed"),
                    }
                });
            }
            loop {
                match stream.message().await {
                    Ok(Some(resp)) => {
                        let Some(event) = resp.event else { continue };
                        last.store(event.revision, Ordering::SeqCst);
                        if event.r#type == dcpb::DatacenterEventType::Purged as i32 {
                            continue;
                        }
                        let Some(dc) = event.datacenter else { continue };
                        let permit = permits
                            .clone()
                            .acquire_owned()
                            .await
                            .map_err(|e| e.to_string())?;
                        let peers = peers.clone();
                        tokio::spawn(async move {
                            if let Err(e) = peers.reconcile(&dc).await {
                                tracing::warn!(datacenter = %dc.id, error = %e, "watch-driven reconcile failed");
                            }
                            drop(permit);
                        });
                    }
                    Ok(None) => return Err("the datacenter watch ended; resuming".to_string()),
                    Err(s) => return Err(status("WatchDatacenters", &s)),
                }
            }
        })
    }
}
