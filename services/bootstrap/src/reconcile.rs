//! The executor: plans a datacenter and applies the plan item by item.
//!
//! Flow / guarantees / assumptions:
//! - One reconcile per datacenter at a time, also across replicas: a lease
//!   row in `bootstrap_reconciles`; a snapshot older than the last revision
//!   acted on is ignored (`stale`).
//! - Every agent call is bracketed by row writes: before it the row goes to
//!   `provisioning`/`retiring` with a lease; after it to `running`,
//!   `failed` (attempts, last error, exponential backoff with jitter,
//!   capped) or is deleted (retired). A crash between the call and the
//!   second write leaves a leased row that the planner retries once the
//!   lease expires; agent calls are idempotent by instance id, so nothing
//!   is duplicated.
//! - Items are isolated: one failure never stops the others.
//! - After a round that changed something, the datacenter is planned again
//!   (bounded), so a `depends_on` chain converges in one reconcile.
//! - A deleting datacenter with no rows left is purged.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_core::{Violations, id, validate};
use ctrlplane_proto::bootstrap::v1::{BootstrapServiceSpec, DatacenterInfo, DatacenterPhase};
use ctrlplane_proto::datacenter::v1 as dcpb;
use ctrlplane_proto::provider::v1 as pb;
use futures::StreamExt;
use sha2::{Digest, Sha256};

use crate::agents::{AgentDirectory, AgentHandle};
use crate::desired::{self, Desired, Note};
use crate::error::{Error, Result};
use crate::hooks::{HookFailure, Hooks};
use crate::model::{NewEvent, Phase, State, Workload};
use crate::plan::{self, Action, Context, Kind, Step};
use crate::store::{Acquire, Store};

/// A source of the current time (injectable for tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// Label keys every backend workload carries.
pub mod labels {
    /// Always `bootstrap`.
    pub const MANAGED_BY: &str = "ctrlplane.io/managed-by";
    /// The datacenter id.
    pub const DATACENTER: &str = "ctrlplane.io/datacenter";
    /// The bootstrap service name.
    pub const SERVICE: &str = "ctrlplane.io/bootstrap-service";
    /// Value of [`MANAGED_BY`].
    pub const MANAGER: &str = "bootstrap";
}

/// Executor settings.
#[derive(Debug, Clone)]
pub struct ReconcileConfig {
    /// Lease of a row while an agent call is in flight (and of the
    /// datacenter while a reconcile runs).
    pub lease_ttl: Duration,
    /// First retry delay after a failure.
    pub backoff_base: Duration,
    /// Largest retry delay.
    pub backoff_cap: Duration,
    /// Items executed at once within one datacenter.
    pub concurrency: usize,
    /// Plan/execute rounds per reconcile.
    pub max_rounds: usize,
}

impl Default for ReconcileConfig {
    fn default() -> Self {
        ReconcileConfig {
            lease_ttl: Duration::from_secs(60),
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(300),
            concurrency: 8,
            max_rounds: 8,
        }
    }
}

/// Exponential backoff with jitter, capped: the n-th consecutive failure
/// (n ≥ 1) waits `min(cap, base·2ⁿ⁻¹)` scaled by a factor in [0.5, 1.0)
/// derived from the row id and n (deterministic, different across rows).
pub fn backoff(id: &str, attempts: i32, base: Duration, cap: Duration) -> Duration {
    let n = attempts.clamp(1, 31) as u32;
    let full = base.saturating_mul(2u32.saturating_pow(n - 1)).min(cap);
    let digest = Sha256::digest(format!("{id}/{attempts}").as_bytes());
    let jitter = f64::from(u16::from_be_bytes([digest[0], digest[1]])) / 65536.0;
    full.mul_f64(0.5 + jitter / 2.0)
}

/// One executed (or, in a dry run, planned) action.
#[derive(Debug, Clone)]
pub struct Executed {
    /// The action.
    pub action: Action,
    /// Its error, if it failed.
    pub error: Option<String>,
}

/// What a reconcile did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Actions of the first round, then those of later rounds that did
    /// something.
    pub actions: Vec<Executed>,
    /// The rows afterwards.
    pub workloads: Vec<Workload>,
    /// The snapshot was older than one already acted on.
    pub stale: bool,
    /// The datacenter's phase pauses changes.
    pub paused: bool,
    /// The datacenter was purged.
    pub purged: bool,
    /// Deduplication decisions.
    pub notes: Vec<Note>,
    /// Hooks that failed (their last known specs were used).
    pub hook_failures: Vec<HookFailure>,
}

/// Plans and executes.
#[derive(Clone)]
pub struct Reconciler {
    store: Store,
    agents: AgentDirectory,
    hooks: Hooks,
    config: ReconcileConfig,
    owner: String,
    clock: Clock,
    /// Datacenters being reconciled by this process: the lease row keeps
    /// replicas apart, this keeps two tasks of one replica apart.
    inflight: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// Removes a datacenter from the in-flight set when dropped (also when the
/// reconcile task is cancelled).
struct InflightGuard {
    set: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    id: String,
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

fn phase_of(dc: &DatacenterInfo) -> Option<Phase> {
    Some(match DatacenterPhase::try_from(dc.phase).ok()? {
        DatacenterPhase::Unspecified => return None,
        DatacenterPhase::Active => Phase::Active,
        DatacenterPhase::Maintenance => Phase::Maintenance,
        DatacenterPhase::Draining => Phase::Draining,
        DatacenterPhase::Offline => Phase::Offline,
        DatacenterPhase::Deleting => Phase::Deleting,
    })
}

/// Validates a reconcile request.
///
/// # Errors
/// `InvalidArgument` naming every bad field.
pub fn check_request(dc: &DatacenterInfo, declared: &[BootstrapServiceSpec]) -> Result<Phase> {
    let mut v = Violations::new();
    id::check_id(&mut v, "datacenter.id", id::DATACENTER, &dc.id);
    validate::dns_label(&mut v, "datacenter.provider_name", &dc.provider_name);
    let phase = phase_of(dc);
    if phase.is_none() {
        v.add(
            "datacenter.phase",
            "must be one of active, maintenance, draining, offline, deleting",
        );
    }
    if dc.revision < 0 {
        v.add("datacenter.revision", "must not be negative");
    }
    validate::bootstrap_specs(&mut v, "declared_services", declared);
    v.into_result()?;
    Ok(phase.unwrap_or(Phase::Active))
}

impl Reconciler {
    /// A reconciler acting as `owner` (this replica's identity).
    pub fn new(
        store: Store,
        agents: AgentDirectory,
        hooks: Hooks,
        config: ReconcileConfig,
        owner: String,
        clock: Clock,
    ) -> Self {
        Reconciler {
            store,
            agents,
            hooks,
            config,
            owner,
            clock,
            inflight: Default::default(),
        }
    }

    /// The agent directory.
    pub fn agents(&self) -> &AgentDirectory {
        &self.agents
    }

    /// The settings.
    pub fn config(&self) -> &ReconcileConfig {
        &self.config
    }

    /// The current time on the reconciler's clock (the one the planner
    /// compares `next_attempt_time` and leases with).
    pub fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    /// Reconciles one datacenter snapshot.
    ///
    /// # Errors
    /// `InvalidArgument`; `Aborted` while another reconcile of the
    /// datacenter runs; database failures. Agent failures are not errors:
    /// they are recorded on the rows and in the actions.
    pub async fn reconcile(
        &self,
        dc: &DatacenterInfo,
        declared: &[BootstrapServiceSpec],
        dry_run: bool,
    ) -> Result<Outcome> {
        let phase = check_request(dc, declared)?;
        let mut outcome = Outcome {
            paused: matches!(phase, Phase::Maintenance | Phase::Offline),
            ..Default::default()
        };
        let _guard = if dry_run {
            None
        } else {
            let mut set = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            if !set.insert(dc.id.clone()) {
                return Err(Error::Aborted(format!(
                    "another reconcile of datacenter {} is running; try again",
                    dc.id
                )));
            }
            Some(InflightGuard {
                set: self.inflight.clone(),
                id: dc.id.clone(),
            })
        };
        if !dry_run {
            match self
                .store
                .acquire(&dc.id, &self.owner, dc.revision, self.config.lease_ttl)
                .await?
            {
                Acquire::Acquired => {}
                Acquire::Stale { last_revision } => {
                    tracing::debug!(datacenter = %dc.id, revision = dc.revision, last_revision, "stale snapshot ignored");
                    outcome.stale = true;
                    outcome.workloads = self.store.workloads(&dc.id).await?;
                    return Ok(outcome);
                }
                Acquire::Busy => {
                    return Err(Error::Aborted(format!(
                        "another reconcile of datacenter {} is running; try again",
                        dc.id
                    )));
                }
            }
        }
        let result = self
            .reconcile_locked(dc, phase, declared, dry_run, &mut outcome)
            .await;
        if !dry_run {
            // Record the revision only when the run completed; a failed run
            // leaves it to be acted on again.
            let revision = if result.is_ok() { dc.revision } else { 0 };
            self.store.release(&dc.id, &self.owner, revision).await?;
        }
        result?;
        Ok(outcome)
    }

    async fn reconcile_locked(
        &self,
        dc: &DatacenterInfo,
        phase: Phase,
        declared: &[BootstrapServiceSpec],
        dry_run: bool,
        outcome: &mut Outcome,
    ) -> Result<()> {
        let (contributions, failures) = if phase == Phase::Deleting {
            (Vec::new(), Vec::new())
        } else {
            self.hooks.contributions(dc, !dry_run).await?
        };
        outcome.hook_failures = failures;
        let desired = desired::build(dc, declared, &contributions);
        outcome.notes = desired.notes.clone();

        for round in 0..self.config.max_rounds.max(1) {
            let current = self.store.workloads(&dc.id).await?;
            let paused = outcome.paused;
            let agent = if paused || current.is_empty() && desired.items.is_empty() {
                None
            } else {
                Some(
                    self.agents
                        .for_datacenter(&dc.id)
                        .await
                        .map_err(|e| e.to_string()),
                )
            };
            let can_deploy = match &agent {
                Some(Ok(a)) => self
                    .agents
                    .capabilities(a)
                    .await
                    .map(|c| c.iter().any(|x| x == "deploy"))
                    .unwrap_or(true),
                _ => true,
            };
            let ctx = Context {
                phase,
                now: self.now(),
                can_deploy,
            };
            let actions = plan::plan(&desired, &current, &ctx);
            if dry_run {
                outcome.actions = actions
                    .into_iter()
                    .map(|action| Executed {
                        action,
                        error: None,
                    })
                    .collect();
                break;
            }
            let rows: HashMap<&str, &Workload> =
                current.iter().map(|w| (w.id.as_str(), w)).collect();
            let results: Vec<(Action, Option<String>, bool)> = futures::stream::iter(actions)
                .map(|action| {
                    let row = action
                        .workload_id
                        .as_deref()
                        .and_then(|id| rows.get(id))
                        .map(|w| (*w).clone());
                    let agent = agent.clone();
                    async move {
                        let (error, progressed) = self.execute(dc, &action, row, agent).await;
                        (action, error, progressed)
                    }
                })
                .buffer_unordered(self.config.concurrency.max(1))
                .collect()
                .await;
            let progressed = results.iter().any(|(_, _, p)| *p);
            for (action, error, _) in results {
                let interesting = round == 0 || !matches!(action.kind, Kind::Noop | Kind::Skip);
                if interesting {
                    outcome.actions.push(Executed { action, error });
                }
            }
            if !progressed {
                break;
            }
        }
        outcome
            .actions
            .sort_by(|a, b| a.action.name.cmp(&b.action.name));

        if !dry_run && phase == Phase::Deleting && self.store.workloads(&dc.id).await?.is_empty() {
            self.purge(dc).await?;
            outcome.purged = true;
        }
        outcome.workloads = self.store.workloads(&dc.id).await?;
        Ok(())
    }

    async fn purge(&self, dc: &DatacenterInfo) -> Result<()> {
        let mut client = self.agents.datacenters();
        let mut req = tonic::Request::new(dcpb::PurgeDatacenterRequest { id: dc.id.clone() });
        req.set_timeout(self.agents.call_timeout());
        match client.purge_datacenter(req).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => {
                return Err(Error::Unavailable(format!(
                    "purging datacenter {}: {:?}: {}",
                    dc.id,
                    s.code(),
                    s.message()
                )));
            }
        }
        self.store.forget_datacenter(&dc.id).await?;
        self.store
            .record_event(
                &dc.id,
                "",
                &NewEvent::transition(
                    "purged",
                    None,
                    None,
                    "no bootstrap workloads left; datacenter purged",
                ),
            )
            .await?;
        tracing::info!(datacenter = %dc.id, "datacenter purged");
        Ok(())
    }

    /// Executes one action; returns its error and whether it changed the
    /// backend.
    async fn execute(
        &self,
        dc: &DatacenterInfo,
        action: &Action,
        row: Option<Workload>,
        agent: Option<std::result::Result<AgentHandle, String>>,
    ) -> (Option<String>, bool) {
        let res = match &action.step {
            Step::Nothing => return (None, false),
            Step::Wait { desired, on, .. } => self.wait(dc, row, desired, on).await.map(|()| false),
            Step::ProvisionNew { desired, replaces } => {
                let row = self.new_row(dc, desired, replaces.clone());
                self.provision(row, desired, agent, true).await
            }
            Step::ProvisionExisting { desired, .. } => match row {
                Some(row) => self.provision(row, desired, agent, false).await,
                None => Err(Error::NotFound(format!(
                    "row {:?} vanished",
                    action.workload_id
                ))),
            },
            Step::Update { desired, .. } => match row {
                Some(row) => self.update(row, desired, agent).await,
                None => Err(Error::NotFound(format!(
                    "row {:?} vanished",
                    action.workload_id
                ))),
            },
            Step::Retire { .. } => match row {
                Some(row) => self.retire(row, agent).await,
                None => Ok(false),
            },
        };
        match res {
            Ok(progressed) => (None, progressed),
            Err(e) => (Some(e.to_string()), false),
        }
    }

    fn new_row(&self, dc: &DatacenterInfo, d: &Desired, replaces: Option<String>) -> Workload {
        let now = crate::store::now();
        Workload {
            id: id::new_id(id::BOOTSTRAP_WORKLOAD),
            datacenter_id: dc.id.clone(),
            tenant_id: dc.tenant_id.clone(),
            provider_name: dc.provider_name.clone(),
            name: d.name.clone(),
            source: d.source.clone(),
            spec: d.spec.clone(),
            spec_hash: d.spec_hash.clone(),
            structure_hash: d.structure_hash.clone(),
            applied_hash: None,
            retire: false,
            state: State::Pending,
            provider_ref: String::new(),
            service_refs: BTreeMap::new(),
            last_error: String::new(),
            attempts: 0,
            next_attempt_time: None,
            lease_expire_time: None,
            replaces,
            endpoints: Vec::new(),
            usage: None,
            create_time: now,
            update_time: now,
        }
    }

    fn set_target(row: &mut Workload, d: &Desired) {
        row.source = d.source.clone();
        row.spec = d.spec.clone();
        row.spec_hash = d.spec_hash.clone();
        row.structure_hash = d.structure_hash.clone();
    }

    fn lease(&self) -> DateTime<Utc> {
        self.now() + chrono::Duration::from_std(self.config.lease_ttl).unwrap_or_default()
    }

    async fn wait(
        &self,
        dc: &DatacenterInfo,
        row: Option<Workload>,
        d: &Desired,
        on: &[String],
    ) -> Result<()> {
        let message = format!("waiting for {}", on.join(", "));
        match row {
            None => {
                let mut row = self.new_row(dc, d, None);
                row.state = State::Waiting;
                row.last_error = message.clone();
                self.store
                    .insert(
                        &row,
                        &NewEvent::transition("waiting", None, Some(State::Waiting), message),
                    )
                    .await
            }
            Some(mut row) => {
                if row.state == State::Waiting
                    && row.last_error == message
                    && row.spec_hash == d.spec_hash
                {
                    return Ok(());
                }
                let from = row.state;
                Self::set_target(&mut row, d);
                row.state = State::Waiting;
                row.last_error = message.clone();
                row.update_time = crate::store::now();
                self.store
                    .update(
                        &row,
                        None,
                        Some(&NewEvent::transition(
                            "waiting",
                            Some(from),
                            Some(State::Waiting),
                            message,
                        )),
                    )
                    .await
            }
        }
    }

    /// The agent for a row's call: the one resolved for this round, else
    /// (no datacenter to resolve through, e.g. it vanished) a healthy agent
    /// of the row's provider.
    async fn agent_for(
        &self,
        row: &Workload,
        resolved: Option<std::result::Result<AgentHandle, String>>,
    ) -> std::result::Result<AgentHandle, String> {
        match resolved {
            Some(r) => r,
            None => self
                .agents
                .for_provider(&row.provider_name)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    /// Marks a row failed with backoff.
    /// The row's agent; without one the row fails (and is retried with
    /// backoff).
    async fn agent_or_fail(
        &self,
        row: &Workload,
        agent: Option<std::result::Result<AgentHandle, String>>,
    ) -> Result<AgentHandle> {
        match self.agent_for(row, agent).await {
            Ok(a) => Ok(a),
            Err(e) => {
                self.fail(row.clone(), &e).await?;
                Err(Error::Unavailable(e))
            }
        }
    }

    /// Fails the row after the agent refused `call`.
    async fn call_failed<T>(&self, row: Workload, call: &str, s: &tonic::Status) -> Result<T> {
        let msg = format!("{call}: {:?}: {}", s.code(), s.message());
        self.fail(row, &msg).await?;
        Err(Error::Unavailable(msg))
    }

    async fn fail(&self, mut row: Workload, error: &str) -> Result<()> {
        let from = row.state;
        row.attempts += 1;
        let delay = backoff(
            &row.id,
            row.attempts,
            self.config.backoff_base,
            self.config.backoff_cap,
        );
        row.state = State::Failed;
        row.last_error = error.to_string();
        row.lease_expire_time = None;
        row.next_attempt_time =
            Some(self.now() + chrono::Duration::from_std(delay).unwrap_or_default());
        row.update_time = crate::store::now();
        tracing::warn!(workload = %row.id, name = %row.name, attempts = row.attempts, ?delay, %error, "bootstrap action failed");
        self.store
            .update(
                &row,
                None,
                Some(&NewEvent::transition(
                    "failed",
                    Some(from),
                    Some(State::Failed),
                    format!(
                        "attempt {} failed: {error}; next attempt in {:.1}s",
                        row.attempts,
                        delay.as_secs_f64()
                    ),
                )),
            )
            .await
    }

    fn provision_request(row: &Workload) -> pb::ProvisionRequest {
        let mut services = row.spec.services.clone();
        if row.spec.replicas > 0 {
            for s in services
                .iter_mut()
                .filter(|s| s.role != pb::ServiceRole::Init as i32)
            {
                let r = s.resources.get_or_insert_with(Default::default);
                if r.replicas == 0 {
                    r.replicas = row.spec.replicas;
                }
            }
        }
        let mut labels: std::collections::HashMap<String, String> = row.spec.labels.clone();
        labels.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
        labels.insert(labels::DATACENTER.into(), row.datacenter_id.clone());
        labels.insert(labels::SERVICE.into(), row.name.clone());
        pb::ProvisionRequest {
            instance_id: row.id.clone(),
            tenant_id: row.tenant_id.clone(),
            name: row.name.clone(),
            kind: row.spec.kind,
            services,
            labels,
        }
    }

    async fn provision(
        &self,
        mut row: Workload,
        d: &Desired,
        agent: Option<std::result::Result<AgentHandle, String>>,
        insert: bool,
    ) -> Result<bool> {
        let from = if insert { None } else { Some(row.state) };
        // A repair: the backend was running this very spec. Provision
        // re-creates a vanished workload but, being idempotent, leaves an
        // existing failed one as it is; Start (a no-op on a running one)
        // brings that back.
        let repair = !insert && row.applied_hash.as_deref() == Some(d.spec_hash.as_str());
        Self::set_target(&mut row, d);
        row.state = State::Provisioning;
        row.lease_expire_time = Some(self.lease());
        row.update_time = crate::store::now();
        let event = NewEvent::transition(
            "provisioning",
            from,
            Some(State::Provisioning),
            format!("installing {}", row.name),
        );
        if insert {
            self.store.insert(&row, &event).await?;
        } else {
            self.store.update(&row, None, Some(&event)).await?;
        }
        let agent = self.agent_or_fail(&row, agent).await?;
        let mut client = agent.client.clone();
        let mut req = tonic::Request::new(Self::provision_request(&row));
        req.set_timeout(self.agents.call_timeout());
        let mut result = client.provision(req).await;
        if repair && let Ok(provisioned) = result {
            let mut req = tonic::Request::new(pb::StartRequest {
                instance_id: row.id.clone(),
            });
            req.set_timeout(self.agents.call_timeout());
            result = match client.start(req).await {
                Ok(_) => Ok(provisioned),
                Err(s) => return self.call_failed(row, "Start", &s).await,
            };
        }
        match result {
            Ok(resp) => {
                let r = resp.into_inner();
                row.state = State::Running;
                row.applied_hash = Some(row.spec_hash.clone());
                row.provider_ref = r.provider_ref;
                row.service_refs = r.service_refs.into_iter().collect();
                // A repaired drift keeps its count until a status sync sees
                // the workload healthy (see `sync_status`), so a crash loop
                // backs off; any other success starts over.
                if !row.last_error.starts_with("drift:") {
                    row.attempts = 0;
                }
                row.last_error.clear();
                row.next_attempt_time = None;
                row.lease_expire_time = None;
                row.update_time = crate::store::now();
                self.store
                    .update(
                        &row,
                        Some(&r.endpoints),
                        Some(&NewEvent::transition(
                            "provisioned",
                            Some(State::Provisioning),
                            Some(State::Running),
                            format!("running on agent {}", agent.agent_id),
                        )),
                    )
                    .await?;
                Ok(true)
            }
            Err(s) => self.call_failed(row, "Provision", &s).await,
        }
    }

    async fn update(
        &self,
        mut row: Workload,
        d: &Desired,
        agent: Option<std::result::Result<AgentHandle, String>>,
    ) -> Result<bool> {
        let from = row.state;
        Self::set_target(&mut row, d);
        row.state = State::Provisioning;
        row.lease_expire_time = Some(self.lease());
        row.update_time = crate::store::now();
        self.store
            .update(
                &row,
                None,
                Some(&NewEvent::transition(
                    "updating",
                    Some(from),
                    Some(State::Provisioning),
                    "deploying new images/env in place",
                )),
            )
            .await?;
        let agent = self.agent_or_fail(&row, agent).await?;
        let services = row
            .spec
            .services
            .iter()
            .map(|s| pb::DeployService {
                name: s.name.clone(),
                image: s.image.clone(),
                env: s.env.clone(),
                health_check: s.health_check.clone(),
                command: s.command.clone(),
                args: s.args.clone(),
            })
            .collect();
        let mut client = agent.client.clone();
        let mut req = tonic::Request::new(pb::DeployRequest {
            instance_id: row.id.clone(),
            release_id: row.spec_hash.clone(),
            services,
            strategy: pb::DeployStrategy::Rolling as i32,
        });
        req.set_timeout(self.agents.call_timeout());
        match client.deploy(req).await {
            Ok(_) => {
                row.state = State::Running;
                row.applied_hash = Some(row.spec_hash.clone());
                row.attempts = 0;
                row.last_error.clear();
                row.next_attempt_time = None;
                row.lease_expire_time = None;
                row.update_time = crate::store::now();
                self.store
                    .update(
                        &row,
                        None,
                        Some(&NewEvent::transition(
                            "updated",
                            Some(State::Provisioning),
                            Some(State::Running),
                            "deployed in place",
                        )),
                    )
                    .await?;
                Ok(true)
            }
            Err(s) => self.call_failed(row, "Deploy", &s).await,
        }
    }

    /// Retires a row: deprovision, then delete it.
    pub(crate) async fn retire(
        &self,
        mut row: Workload,
        agent: Option<std::result::Result<AgentHandle, String>>,
    ) -> Result<bool> {
        let from = row.state;
        row.retire = true;
        row.state = State::Retiring;
        row.lease_expire_time = Some(self.lease());
        row.update_time = crate::store::now();
        self.store
            .update(
                &row,
                None,
                Some(&NewEvent::transition(
                    "retiring",
                    Some(from),
                    Some(State::Retiring),
                    "removing",
                )),
            )
            .await?;
        let agent = self.agent_or_fail(&row, agent).await?;
        let mut client = agent.client.clone();
        let mut req = tonic::Request::new(pb::DeprovisionRequest {
            instance_id: row.id.clone(),
        });
        req.set_timeout(self.agents.call_timeout());
        match client.deprovision(req).await {
            Ok(_) => {
                self.store
                    .delete(
                        &row,
                        &NewEvent::transition(
                            "retired",
                            Some(State::Retiring),
                            Some(State::Retired),
                            format!("removed from agent {}", agent.agent_id),
                        ),
                    )
                    .await?;
                Ok(true)
            }
            Err(s) => self.call_failed(row, "Deprovision", &s).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_a_cap() {
        let base = Duration::from_secs(1);
        let cap = Duration::from_secs(60);
        let mut previous_full = Duration::ZERO;
        for n in 1..=10 {
            let full = base.saturating_mul(2u32.pow(n as u32 - 1)).min(cap);
            let d = backoff("bws_x", n, base, cap);
            assert!(
                d >= full / 2 && d < full,
                "attempt {n}: {d:?} not in [{:?}, {full:?})",
                full / 2
            );
            assert!(full >= previous_full);
            previous_full = full;
        }
        assert!(backoff("bws_x", 40, base, cap) < cap);
        // Jitter differs across rows, but is stable for one row and attempt.
        assert_eq!(
            backoff("bws_a", 3, base, cap),
            backoff("bws_a", 3, base, cap)
        );
        let distinct: std::collections::HashSet<_> = (0..20)
            .map(|i| backoff(&format!("bws_{i}"), 5, base, cap))
            .collect();
        assert!(distinct.len() > 10);
    }
}
