//! The bootstrap service's operations (no gRPC types beyond the shared
//! contract types). Every operation needs a platform caller
//! (`system:admin` or a service token).

use std::time::Duration;

use ctrlplane_core::{Violations, id, page};
use ctrlplane_proto::bootstrap::v1::{BootstrapServiceSpec, DatacenterInfo};
use ctrlplane_proto::datacenter::v1 as dcpb;
use ctrlplane_proto::provider::v1 as pb;
use ctrlplane_runtime::auth::Caller;
use tokio::sync::{mpsc, watch};

use crate::error::{Error, Result};
use crate::hooks::{self, Hooks};
use crate::model::{Event, NewEvent, RemoteHook, State, Workload};
use crate::reconcile::{Outcome, Reconciler, labels};
use crate::store::Store;

/// Settings of the observe-and-clean-up operations.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Unowned backend workloads younger than this are left alone.
    pub gc_grace: Duration,
    /// Backend workloads examined per agent per GC run.
    pub gc_batch: u32,
    /// Resource samples older than this are dropped.
    pub sample_retention: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            gc_grace: Duration::from_secs(15 * 60),
            gc_batch: 200,
            sample_retention: Duration::from_secs(24 * 3600),
        }
    }
}

/// Default and largest pages.
pub const PAGE: (u32, u32) = (100, 1000);
/// How often a watch re-reads the log without a local wake-up.
pub const WATCH_POLL: Duration = Duration::from_secs(1);

/// Outcome of syncing one row.
#[derive(Debug, Clone)]
pub struct SyncResult {
    /// The row.
    pub workload: Workload,
    /// What the agent reported.
    pub status: Option<pb::InstanceStatus>,
    /// The row drifted and will be repaired by the next reconcile.
    pub drifted: bool,
    /// The agent call's error.
    pub error: Option<String>,
}

/// Outcome of a GC run.
#[derive(Debug, Clone, Default)]
pub struct GcReport {
    /// Rows retired because their datacenter is gone.
    pub rows_retired: i32,
    /// Unowned backend workloads removed.
    pub workloads_deprovisioned: i32,
    /// Backend workloads looked at.
    pub workloads_examined: i32,
    /// Errors (each run goes on past them).
    pub errors: Vec<String>,
}

/// The bootstrap service.
#[derive(Clone)]
pub struct BootstrapService {
    store: Store,
    reconciler: Reconciler,
    hooks: Hooks,
    config: ServiceConfig,
    shutdown: watch::Receiver<bool>,
}

/// Every operation needs a platform caller; checked before any input, so a
/// tenant learns nothing from the shape of its request.
///
/// # Errors
/// `PermissionDenied` for other callers.
pub fn require(caller: &Caller) -> Result<()> {
    if caller.is_system() {
        Ok(())
    } else {
        Err(Error::PermissionDenied(
            "the bootstrap API needs a system:admin or system:service token".into(),
        ))
    }
}

fn check_dc_id(field: &str, id_: &str) -> Result<()> {
    let mut v = Violations::new();
    id::check_id(&mut v, field, id::DATACENTER, id_);
    Ok(v.into_result()?)
}

/// The bootstrap view of a datacenter resource.
pub use ctrlplane_core::snapshot::bootstrap_snapshot as snapshot_of;

impl BootstrapService {
    /// Assembles the service.
    pub fn new(
        store: Store,
        reconciler: Reconciler,
        hooks: Hooks,
        config: ServiceConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        BootstrapService {
            store,
            reconciler,
            hooks,
            config,
            shutdown,
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Reconciles a snapshot.
    ///
    /// # Errors
    /// See [`Reconciler::reconcile`].
    pub async fn reconcile(
        &self,
        caller: &Caller,
        dc: &DatacenterInfo,
        declared: &[BootstrapServiceSpec],
        dry_run: bool,
    ) -> Result<Outcome> {
        require(caller)?;
        self.reconciler.reconcile(dc, declared, dry_run).await
    }

    /// Reconciles a datacenter's current state, fetched from the datacenter
    /// service.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, `NotFound` when the datacenter does
    /// not exist, `Unavailable` when the datacenter service cannot be asked;
    /// reconcile errors.
    pub async fn reconcile_current(
        &self,
        caller: &Caller,
        datacenter_id: &str,
        dry_run: bool,
    ) -> Result<Outcome> {
        require(caller)?;
        check_dc_id("datacenter_id", datacenter_id)?;
        let dc = self
            .fetch(datacenter_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("datacenter {datacenter_id} not found")))?;
        let (info, declared) = snapshot_of(&dc);
        self.reconciler.reconcile(&info, &declared, dry_run).await
    }

    /// Fetches a datacenter from the datacenter service; `None` when it no
    /// longer exists.
    async fn fetch(&self, datacenter_id: &str) -> Result<Option<dcpb::Datacenter>> {
        let mut client = self.reconciler.agents().datacenters();
        let mut req = tonic::Request::new(dcpb::GetDatacenterRequest {
            id: datacenter_id.to_string(),
        });
        req.set_timeout(self.reconciler.agents().call_timeout());
        match client.get_datacenter(req).await {
            Ok(r) => Ok(r.into_inner().datacenter),
            Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
            Err(s) => Err(Error::Unavailable(format!(
                "datacenter service: {:?}: {}",
                s.code(),
                s.message()
            ))),
        }
    }

    /// A page of a datacenter's rows.
    ///
    /// # Errors
    /// `InvalidArgument`, `PermissionDenied`.
    pub async fn list(
        &self,
        caller: &Caller,
        datacenter_id: &str,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Workload>, Option<String>)> {
        require(caller)?;
        let mut v = Violations::new();
        id::check_id(&mut v, "datacenter_id", id::DATACENTER, datacenter_id);
        let size = page::page_size(page_size, PAGE.0, PAGE.1)
            .map_err(|e| v.add("page_size", e))
            .unwrap_or(PAGE.0);
        let fp = page::fingerprint(&[datacenter_id]);
        let after: Option<String> = page::decode_bound(
            &mut v,
            "page_token",
            page_token,
            &fp,
            "was issued for another datacenter",
        );
        v.into_result()?;
        let mut rows = self
            .store
            .workloads_page(datacenter_id, after.as_deref(), u64::from(size) + 1)
            .await?;
        let more = rows.len() > size as usize;
        rows.truncate(size as usize);
        let next = match rows.last() {
            Some(last) if more => Some(page::encode_bound(last.id.clone(), &fp)),
            _ => None,
        };
        Ok((rows, next))
    }

    /// One row.
    ///
    /// # Errors
    /// `InvalidArgument`, `NotFound`, `PermissionDenied`.
    pub async fn get(&self, caller: &Caller, workload_id: &str) -> Result<Workload> {
        require(caller)?;
        let mut v = Violations::new();
        id::check_id(&mut v, "id", id::BOOTSTRAP_WORKLOAD, workload_id);
        v.into_result()?;
        self.store
            .workload(workload_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("bootstrap workload {workload_id} not found")))
    }

    /// Clears a row's backoff and reconciles its datacenter now.
    ///
    /// # Errors
    /// As [`BootstrapService::get`]; `Unavailable` when the datacenter
    /// service cannot be asked; reconcile errors.
    pub async fn retry(&self, caller: &Caller, workload_id: &str) -> Result<Workload> {
        let mut row = self.get(caller, workload_id).await?;
        if row.next_attempt_time.is_some() {
            row.next_attempt_time = None;
            row.update_time = crate::store::now();
            self.store
                .update(
                    &row,
                    None,
                    Some(&NewEvent::transition(
                        "retry",
                        Some(row.state),
                        Some(row.state),
                        "backoff cleared by RetryBootstrapWorkload",
                    )),
                )
                .await?;
        }
        if let Some(dc) = self.fetch(&row.datacenter_id).await? {
            let (info, declared) = snapshot_of(&dc);
            self.reconciler.reconcile(&info, &declared, false).await?;
        }
        self.store
            .workload(workload_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("bootstrap workload {workload_id} was retired")))
    }

    /// Asks the agent for each running row's status; a row whose backend
    /// workload vanished or failed is marked failed (due now), so the next
    /// reconcile repairs it.
    ///
    /// # Errors
    /// `InvalidArgument`, `PermissionDenied`, database failures. Agent
    /// failures are reported per row.
    pub async fn sync_status(
        &self,
        caller: &Caller,
        datacenter_id: &str,
    ) -> Result<Vec<SyncResult>> {
        require(caller)?;
        check_dc_id("datacenter_id", datacenter_id)?;
        let rows = self.store.workloads(datacenter_id).await?;
        let running: Vec<Workload> = rows
            .into_iter()
            .filter(|w| w.state == State::Running)
            .collect();
        if running.is_empty() {
            return Ok(Vec::new());
        }
        let agent = match self.reconciler.agents().for_datacenter(datacenter_id).await {
            Ok(a) => a,
            Err(e) => {
                let msg = e.to_string();
                return Ok(running
                    .into_iter()
                    .map(|w| SyncResult {
                        workload: w,
                        status: None,
                        drifted: false,
                        error: Some(msg.clone()),
                    })
                    .collect());
            }
        };
        let mut out = Vec::new();
        for mut w in running {
            let mut client = agent.client.clone();
            let mut req = tonic::Request::new(pb::GetStatusRequest {
                instance_id: w.id.clone(),
            });
            req.set_timeout(self.reconciler.agents().call_timeout());
            let (status, drift) = match client.get_status(req).await {
                Ok(r) => {
                    let st = r.into_inner().status;
                    let failed = st
                        .as_ref()
                        .is_some_and(|s| s.state == pb::InstanceState::Failed as i32);
                    let msg = st.as_ref().map(|s| s.message.clone()).unwrap_or_default();
                    (
                        st,
                        failed.then(|| format!("drift: the workload failed at the agent: {msg}")),
                    )
                }
                Err(s) if s.code() == tonic::Code::NotFound => (
                    None,
                    Some("drift: the workload vanished from the agent".to_string()),
                ),
                Err(s) => {
                    out.push(SyncResult {
                        workload: w,
                        status: None,
                        drifted: false,
                        error: Some(format!("{:?}: {}", s.code(), s.message())),
                    });
                    continue;
                }
            };
            let drifted = drift.is_some();
            if let Some(message) = drift {
                // Consecutive drifts back off (a workload that keeps
                // crashing is not reinstalled on every sync); the first is
                // repaired at once. `attempts` counts drifts until a sync
                // sees the workload healthy again.
                w.attempts += 1;
                let delay = if w.attempts <= 1 {
                    std::time::Duration::ZERO
                } else {
                    crate::reconcile::backoff(
                        &w.id,
                        w.attempts - 1,
                        self.reconciler.config().backoff_base,
                        self.reconciler.config().backoff_cap,
                    )
                };
                w.state = State::Failed;
                w.last_error = message.clone();
                // Due on the clock the planner compares it with.
                w.next_attempt_time = Some(
                    self.reconciler.now() + chrono::Duration::from_std(delay).unwrap_or_default(),
                );
                w.update_time = crate::store::now();
                self.store
                    .update(
                        &w,
                        None,
                        Some(&NewEvent::transition(
                            "drift",
                            Some(State::Running),
                            Some(State::Failed),
                            message,
                        )),
                    )
                    .await?;
            }
            let healthy = status
                .as_ref()
                .is_some_and(|st| st.state == pb::InstanceState::Running as i32 && st.ready);
            if !drifted && healthy && w.attempts > 0 {
                // Healthy again after drifts: the drift count starts over.
                w.attempts = 0;
                w.update_time = crate::store::now();
                self.store.update(&w, None, None).await?;
            }
            out.push(SyncResult {
                workload: w,
                status,
                drifted,
                error: None,
            });
        }
        Ok(out)
    }

    /// Garbage collection: rows whose datacenter is gone are retired; per
    /// agent, backend workloads labelled as ours with no row and older than
    /// the grace period are deprovisioned. Each agent is paged through with
    /// a stored cursor, `gc_batch` workloads per run, so every object is
    /// examined eventually.
    ///
    /// # Errors
    /// `PermissionDenied`; database failures. Agent and peer failures are
    /// collected in the report.
    pub async fn collect_garbage(
        &self,
        caller: &Caller,
        grace: Option<Duration>,
    ) -> Result<GcReport> {
        require(caller)?;
        let grace = grace.unwrap_or(self.config.gc_grace);
        let mut report = GcReport::default();

        for dc_id in self.store.datacenters_with_rows().await? {
            match self.fetch(&dc_id).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    let mut all_gone = true;
                    for row in self.store.workloads(&dc_id).await? {
                        match self.reconciler.retire(row.clone(), None).await {
                            Ok(_) => report.rows_retired += 1,
                            Err(e) => {
                                all_gone = false;
                                report.errors.push(format!(
                                    "retiring {} of vanished datacenter {dc_id}: {e}",
                                    row.id
                                ));
                            }
                        }
                    }
                    if all_gone {
                        self.store.forget_datacenter(&dc_id).await?;
                    }
                }
                Err(e) => report.errors.push(e.to_string()),
            }
        }

        let agents = match self.list_agents().await {
            Ok(a) => a,
            Err(e) => {
                report.errors.push(e.to_string());
                return Ok(report);
            }
        };
        let cutoff = chrono::Utc::now() - chrono::Duration::from_std(grace).unwrap_or_default();
        for agent in agents {
            // Each agent is asked for its own workloads, healthy or not.
            let handle = match self
                .reconciler
                .agents()
                .handle_for(&agent.id, &agent.endpoint)
            {
                Ok(h) => h,
                Err(e) => {
                    report.errors.push(e.to_string());
                    continue;
                }
            };
            if let Err(e) = self.gc_agent(&handle, cutoff, &mut report).await {
                report.errors.push(format!("agent {}: {e}", agent.id));
            }
        }
        Ok(report)
    }

    async fn list_agents(&self) -> Result<Vec<ctrlplane_proto::agent::v1::Agent>> {
        let mut client = ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient::new(
            self.reconciler.agents().registry_channel(),
        );
        let mut out = Vec::new();
        let mut token = String::new();
        loop {
            let r = client
                .list_agents(ctrlplane_proto::agent::v1::ListAgentsRequest {
                    provider_name: String::new(),
                    page_size: 500,
                    page_token: token.clone(),
                })
                .await
                .map_err(|s| {
                    Error::Unavailable(format!("listing agents: {:?}: {}", s.code(), s.message()))
                })?
                .into_inner();
            out.extend(
                r.agents.into_iter().filter(|a| {
                    a.health != ctrlplane_proto::agent::v1::AgentHealth::Revoked as i32
                }),
            );
            if r.next_page_token.is_empty() {
                return Ok(out);
            }
            token = r.next_page_token;
        }
    }

    async fn gc_agent(
        &self,
        agent: &crate::agents::AgentHandle,
        cutoff: chrono::DateTime<chrono::Utc>,
        report: &mut GcReport,
    ) -> Result<()> {
        let token = self.store.gc_cursor(&agent.agent_id).await?;
        let mut client = agent.client.clone();
        let mut req = tonic::Request::new(pb::ListManagedRequest {
            page_size: self.config.gc_batch as i32,
            page_token: token,
        });
        req.set_timeout(self.reconciler.agents().call_timeout());
        let page = client
            .list_managed(req)
            .await
            .map_err(|s| {
                Error::Unavailable(format!("ListManaged: {:?}: {}", s.code(), s.message()))
            })?
            .into_inner();
        for w in &page.workloads {
            report.workloads_examined += 1;
            if w.labels.get(labels::MANAGED_BY).map(String::as_str) != Some(labels::MANAGER) {
                continue;
            }
            if self.store.exists(&w.instance_id).await? {
                continue;
            }
            let created = w
                .created_at
                .as_ref()
                .and_then(|t| chrono::DateTime::from_timestamp(t.seconds, t.nanos.max(0) as u32));
            if created.is_none_or(|c| c > cutoff) {
                continue;
            }
            let mut req = tonic::Request::new(pb::DeprovisionRequest {
                instance_id: w.instance_id.clone(),
            });
            req.set_timeout(self.reconciler.agents().call_timeout());
            match client.deprovision(req).await {
                Ok(_) => {
                    report.workloads_deprovisioned += 1;
                    let dc = w
                        .labels
                        .get(labels::DATACENTER)
                        .cloned()
                        .unwrap_or_default();
                    self.store
                        .record_event(
                            &dc,
                            w.labels
                                .get(labels::SERVICE)
                                .map(String::as_str)
                                .unwrap_or(""),
                            &NewEvent::transition(
                                "gc_deprovisioned",
                                None,
                                None,
                                format!(
                                    "removed unowned workload {} from agent {}",
                                    w.instance_id, agent.agent_id
                                ),
                            ),
                        )
                        .await?;
                    tracing::info!(instance = %w.instance_id, agent = %agent.agent_id, "GC removed an unowned workload");
                }
                Err(s) => report.errors.push(format!(
                    "deprovisioning {}: {:?}: {}",
                    w.instance_id,
                    s.code(),
                    s.message()
                )),
            }
        }
        self.store
            .set_gc_cursor(&agent.agent_id, &page.next_page_token)
            .await?;
        Ok(())
    }

    /// Samples resource usage of running rows (optionally of one
    /// datacenter). Returns the number of samples and per-row errors.
    ///
    /// # Errors
    /// `PermissionDenied`, `InvalidArgument`, database failures.
    pub async fn collect_resources(
        &self,
        caller: &Caller,
        datacenter_id: &str,
    ) -> Result<(i32, Vec<String>)> {
        require(caller)?;
        let dcs = if datacenter_id.is_empty() {
            self.store.datacenters_with_rows().await?
        } else {
            check_dc_id("datacenter_id", datacenter_id)?;
            vec![datacenter_id.to_string()]
        };
        let mut samples = 0;
        let mut errors = Vec::new();
        for dc in dcs {
            let rows: Vec<Workload> = self
                .store
                .workloads(&dc)
                .await?
                .into_iter()
                .filter(|w| w.state == State::Running)
                .collect();
            if rows.is_empty() {
                continue;
            }
            let agent = match self.reconciler.agents().for_datacenter(&dc).await {
                Ok(a) => a,
                Err(e) => {
                    errors.push(e.to_string());
                    continue;
                }
            };
            for w in rows {
                let mut client = agent.client.clone();
                let mut req = tonic::Request::new(pb::GetResourcesRequest {
                    instance_id: w.id.clone(),
                });
                req.set_timeout(self.reconciler.agents().call_timeout());
                match client.get_resources(req).await {
                    Ok(r) => {
                        if let Some(usage) = r.into_inner().usage {
                            self.store
                                .record_usage(&w, &usage, self.config.sample_retention)
                                .await?;
                            samples += 1;
                        }
                    }
                    Err(s) => errors.push(format!("{}: {:?}: {}", w.id, s.code(), s.message())),
                }
            }
        }
        Ok((samples, errors))
    }

    /// Rule hooks (with their selectors) and remote hooks.
    ///
    /// # Errors
    /// `PermissionDenied`, database failures.
    pub async fn list_hooks(
        &self,
        caller: &Caller,
    ) -> Result<(Vec<hooks::RuleHook>, Vec<RemoteHook>)> {
        require(caller)?;
        Ok((self.hooks.rules().to_vec(), self.store.hooks().await?))
    }

    /// Registers or re-points a remote hook.
    ///
    /// # Errors
    /// `InvalidArgument` (incl. a rule hook's name), `PermissionDenied`.
    pub async fn register_hook(
        &self,
        caller: &Caller,
        name: &str,
        endpoint: &str,
        timeout: Option<Duration>,
    ) -> Result<RemoteHook> {
        require(caller)?;
        let timeout = hooks::check_registration(name, endpoint, timeout)?;
        if self.hooks.is_rule(name) {
            let mut v = Violations::new();
            v.add(
                "name",
                format!("{name:?} is a rule hook from the hooks file"),
            );
            return Err(v.into());
        }
        let hook = self.store.upsert_hook(name, endpoint, timeout).await?;
        tracing::info!(hook = %name, %endpoint, "remote hook registered");
        Ok(hook)
    }

    /// Removes a remote hook.
    ///
    /// # Errors
    /// `NotFound`, `PermissionDenied`.
    pub async fn unregister_hook(&self, caller: &Caller, name: &str) -> Result<()> {
        require(caller)?;
        if self.store.delete_hook(name).await? {
            Ok(())
        } else {
            Err(Error::NotFound(format!("remote hook {name:?} not found")))
        }
    }

    /// A page of events after a sequence, oldest first.
    ///
    /// # Errors
    /// `InvalidArgument`, `PermissionDenied`.
    pub async fn list_events(
        &self,
        caller: &Caller,
        datacenter_id: &str,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Event>, Option<String>)> {
        require(caller)?;
        let mut v = Violations::new();
        if !datacenter_id.is_empty() {
            id::check_id(&mut v, "datacenter_id", id::DATACENTER, datacenter_id);
        }
        let size = page::page_size(page_size, PAGE.0, PAGE.1)
            .map_err(|e| v.add("page_size", e))
            .unwrap_or(PAGE.0);
        let fp = page::fingerprint(&[datacenter_id]);
        let after = page::decode_bound::<String>(
            &mut v,
            "page_token",
            page_token,
            &fp,
            "was issued for another filter",
        )
        .and_then(|a| a.parse().ok())
        .unwrap_or(0);
        v.into_result()?;
        let filter = Some(datacenter_id).filter(|d| !d.is_empty());
        let mut events = self
            .store
            .events_after(filter, after, u64::from(size) + 1)
            .await?;
        let more = events.len() > size as usize;
        events.truncate(size as usize);
        let next = match events.last() {
            Some(last) if more => Some(page::encode_bound(last.sequence.to_string(), &fp)),
            _ => None,
        };
        Ok((events, next))
    }

    /// Streams events after `since` (0 = from now on), in order.
    ///
    /// # Errors
    /// `InvalidArgument`, `PermissionDenied`; later errors on the stream.
    pub async fn watch(
        &self,
        caller: &Caller,
        datacenter_id: &str,
        since: i64,
    ) -> Result<mpsc::Receiver<Result<Event>>> {
        require(caller)?;
        let mut v = Violations::new();
        if !datacenter_id.is_empty() {
            id::check_id(&mut v, "datacenter_id", id::DATACENTER, datacenter_id);
        }
        if since < 0 {
            v.add("since_sequence", "must not be negative");
        }
        v.into_result()?;
        let mut last = if since > 0 {
            since
        } else {
            self.store.current_sequence().await?
        };
        let (tx, rx) = mpsc::channel(64);
        let store = self.store.clone();
        let mut wake = store.subscribe();
        let mut shutdown = self.shutdown.clone();
        let filter = Some(datacenter_id.to_string()).filter(|d| !d.is_empty());
        tokio::spawn(async move {
            loop {
                if *shutdown.borrow() {
                    return;
                }
                wake.borrow_and_update();
                let batch = match store.events_after(filter.as_deref(), last, 256).await {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let full = batch.len() == 256;
                for e in batch {
                    last = e.sequence;
                    if tx.send(Ok(e)).await.is_err() {
                        return;
                    }
                }
                if full {
                    continue;
                }
                tokio::select! {
                    _ = wake.changed() => {}
                    () = tokio::time::sleep(WATCH_POLL) => {}
                    () = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
            }
        });
        Ok(rx)
    }
}
