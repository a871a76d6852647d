//! The [`Agent`]: the process backend behind `ProviderService`.
//!
//! It keeps one [`Instance`] per instance id (loaded from the state
//! directory at start and re-adopted), checks what the shared validation
//! cannot know about this backend (a command is required, paths stay inside
//! the instance root, secrets exist), and maps each RPC onto instance
//! operations. Operations on one instance are serialised by its `op` lock;
//! creations by one agent-wide lock, which makes Provision idempotent.
//!
//! Deprovision flow / guarantees / assumptions:
//! - flow: mark the record `deleting` → stop every process group (SIGTERM,
//!   SIGKILL after the grace) → kill anything the record still names →
//!   remove the instance root → remove the record;
//! - guarantees: each step is repeat-safe, and a record marked `deleting`
//!   is finished at the next agent start, so an interrupted Deprovision
//!   converges; an unknown id answers `existed = false`;
//! - assumptions: processes do not leave their process group (a workload
//!   that calls `setsid` itself escapes the kill, as under raw_exec).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctrlplane_agent::provider::Result;
use ctrlplane_agent::{Capability, LogStream, Provider, ProviderError};
use ctrlplane_core::Violations;
use ctrlplane_core::violations::{child, index};
use ctrlplane_proto::provider::v1 as pb;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::AgentConfig;
use crate::instance::{Instance, Shared};
use crate::logs;
use crate::model::{
    Desired, INITIAL_RELEASE, InstanceRecord, MAX_RELEASES, Release, Role, RunRecord, now_ms, role,
    timestamp,
};
use crate::process::{Exit, Processes};
use crate::state::Store;
use crate::workdir;

/// Provider name this agent serves.
pub const PROVIDER_NAME: &str = "process";

/// What the agent supports.
pub const CAPABILITIES: [Capability; 7] = [
    Capability::Provision,
    Capability::Deploy,
    Capability::Scale,
    Capability::Logs,
    Capability::Exec,
    Capability::Volumes,
    Capability::StrategyRolling,
];

/// Longest Exec output kept per stream.
pub const EXEC_OUTPUT_MAX: usize = 4 * 1024 * 1024;

/// Why the agent could not open its state directory.
#[derive(Debug, thiserror::Error)]
#[error("state directory {path}: {source}")]
pub struct OpenError {
    /// The directory.
    pub path: String,
    /// Why.
    pub source: std::io::Error,
}

/// The process backend.
#[derive(Debug)]
pub struct Agent {
    shared: Arc<Shared>,
    instances: Mutex<BTreeMap<String, Arc<Instance>>>,
    create: tokio::sync::Mutex<()>,
}

impl Agent {
    /// Opens the state directory and takes over every recorded instance:
    /// live process groups are re-adopted, dead ones restarted, interrupted
    /// deprovisions finished. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// The state directory cannot be created or read.
    pub fn open(cfg: AgentConfig) -> std::result::Result<Arc<Agent>, OpenError> {
        let store = Store::open(&cfg.state_dir).map_err(|source| OpenError {
            path: cfg.state_dir.display().to_string(),
            source,
        })?;
        let shared = Arc::new(Shared {
            cfg,
            store,
            procs: Arc::new(Processes::default()),
            detach: CancellationToken::new(),
            tracker: TaskTracker::new(),
            taken_ports: Mutex::new(Default::default()),
            base_env: workdir::base_env(),
        });
        let agent = Arc::new(Agent {
            shared: shared.clone(),
            instances: Mutex::new(BTreeMap::new()),
            create: tokio::sync::Mutex::new(()),
        });
        let records = shared.store.load_all();
        tracing::info!(state_dir = %shared.store.dir().display(), instances = records.len(), "opened the state directory");
        for rec in records {
            let deleting = rec.deleting;
            let inst = Instance::new(shared.clone(), rec);
            agent.map().insert(inst.id.clone(), inst.clone());
            if deleting {
                let agent2 = agent.clone();
                shared.tracker.spawn(async move {
                    let _g = inst.op_lock().await;
                    inst.destroy().await;
                    agent2.map().remove(&inst.id);
                });
            } else {
                inst.adopt();
            }
        }
        Ok(agent)
    }

    /// The state directory (absolute).
    pub fn state_dir(&self) -> &Path {
        self.shared.store.dir()
    }

    /// Lets go of every workload (they keep running, to be re-adopted by
    /// the next agent) and waits up to `timeout` for the agent's tasks.
    pub async fn shutdown(&self, timeout: Duration) {
        self.shared.detach.cancel();
        self.shared.tracker.close();
        if tokio::time::timeout(timeout, self.shared.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some agent tasks did not finish in time");
        }
    }

    /// Kills every process group the agent is responsible for and refuses
    /// to start any more; then lets go of its tasks. Synchronous, so a test
    /// guard can call it from `Drop`. The instance records stay.
    pub fn halt(&self) {
        self.shared.procs.halt();
        self.shared.detach.cancel();
        self.shared.tracker.close();
    }

    /// Number of process groups currently recorded as running.
    pub fn process_groups(&self) -> usize {
        self.shared.procs.len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Instance>>> {
        self.instances.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<Instance>> {
        self.map()
            .get(id)
            .cloned()
            .ok_or_else(|| ProviderError::no_instance(id))
    }

    /// The instance with its operation lock held.
    async fn locked(&self, id: &str) -> Result<(Arc<Instance>, tokio::sync::OwnedMutexGuard<()>)> {
        let inst = self.get(id)?;
        let guard = inst.op_lock().await;
        if inst.is_gone() {
            return Err(ProviderError::no_instance(id));
        }
        Ok((inst, guard))
    }

    fn provision_response(&self, inst: &Instance) -> pb::ProvisionResponse {
        let rec = inst.record();
        pb::ProvisionResponse {
            provider_ref: provider_ref(&rec.instance_id),
            service_refs: rec
                .services
                .iter()
                .map(|s| {
                    (
                        s.name.clone(),
                        format!("{}/{}", provider_ref(&rec.instance_id), s.name),
                    )
                })
                .collect(),
            endpoints: inst.endpoints(),
            metadata: HashMap::from([
                ("root".to_string(), inst.root.display().to_string()),
                ("release".to_string(), rec.release.clone()),
            ]),
        }
    }

    fn secrets_problems(&self, services: &[pb::ServiceSpec]) -> Vec<String> {
        let dir = self.shared.store.secrets_dir();
        services
            .iter()
            .flat_map(|s| s.secrets.iter())
            .filter_map(|sec| workdir::read_secret(&dir, &sec.key).err())
            .collect()
    }
}

fn provider_ref(id: &str) -> String {
    format!("{PROVIDER_NAME}/{id}")
}

/// What this backend needs beyond the shared validation: a command for
/// every service, config-file paths and secret keys inside their roots.
pub fn check_runnable(services: &[pb::ServiceSpec]) -> Violations {
    let mut v = Violations::new();
    for (i, s) in services.iter().enumerate() {
        let f = index("services", i);
        if s.command.first().is_none_or(String::is_empty) {
            v.add(
                child(&f, "command"),
                "is required: the process agent runs command + args (the image is only recorded)",
            );
        }
        for (j, file) in s.config_files.iter().enumerate() {
            if let Some(p) = workdir::relative_path_problem(&file.path) {
                v.add(child(&index(&child(&f, "config_files"), j), "path"), p);
            }
        }
        for (j, sec) in s.secrets.iter().enumerate() {
            if let Some(p) = workdir::secret_key_problem(&sec.key) {
                v.add(child(&index(&child(&f, "secrets"), j), "key"), p);
            }
        }
    }
    v
}

#[tonic::async_trait]
impl Provider for Agent {
    fn info(&self) -> pb::GetInfoResponse {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        pb::GetInfoResponse {
            provider_name: PROVIDER_NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: format!("local processes on {host} (Linux {kernel})"),
            metadata: HashMap::from([
                (
                    "state_dir".to_string(),
                    self.state_dir().display().to_string(),
                ),
                ("hostname".to_string(), host),
            ]),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        CAPABILITIES.to_vec()
    }

    async fn provision(&self, req: pb::ProvisionRequest) -> Result<pb::ProvisionResponse> {
        check_runnable(&req.services).into_result()?;
        let _create = self.create.lock().await;
        if let Ok(inst) = self.get(&req.instance_id) {
            let _g = inst.op_lock().await;
            if !inst.is_gone() {
                return Ok(self.provision_response(&inst));
            }
        }
        let missing = self.secrets_problems(&req.services);
        if !missing.is_empty() {
            return Err(ProviderError::FailedPrecondition(missing.join("; ")));
        }
        let now = now_ms();
        let rec = InstanceRecord {
            instance_id: req.instance_id.clone(),
            tenant_id: req.tenant_id,
            name: req.name,
            kind: req.kind,
            labels: req.labels.into_iter().collect(),
            created_at_ms: now,
            services: req.services,
            desired: Desired::Running,
            deleting: false,
            run: RunRecord {
                started_at_ms: now,
                ..RunRecord::default()
            },
            replicas: BTreeMap::new(),
            ports: BTreeMap::new(),
            release: INITIAL_RELEASE.to_string(),
            releases: Vec::new(),
        };
        self.shared.store.save(&rec).map_err(|e| {
            ProviderError::Internal(format!("cannot write the instance record: {e}"))
        })?;
        let inst = Instance::new(self.shared.clone(), rec);
        let _g = inst.op_lock().await;
        inst.allocate_all_ports();
        self.map().insert(inst.id.clone(), inst.clone());
        inst.begin_run();
        tracing::info!(instance = %inst.id, "provisioned");
        Ok(self.provision_response(&inst))
    }

    async fn deprovision(&self, instance_id: &str) -> Result<pb::DeprovisionResponse> {
        let Ok((inst, _g)) = self.locked(instance_id).await else {
            return Ok(pb::DeprovisionResponse { existed: false });
        };
        inst.destroy().await;
        self.map().remove(instance_id);
        tracing::info!(instance = %instance_id, "deprovisioned");
        Ok(pb::DeprovisionResponse { existed: true })
    }

    async fn start(&self, instance_id: &str) -> Result<pb::InstanceStatus> {
        let (inst, _g) = self.locked(instance_id).await?;
        let rec = inst.record();
        if rec.desired == Desired::Running && rec.run.failure.is_none() && inst.active() {
            return Ok(inst.status());
        }
        inst.stop_all(self.shared.cfg.stop_grace).await;
        inst.update(|r| r.desired = Desired::Running);
        inst.begin_run();
        Ok(inst.status())
    }

    async fn stop(&self, instance_id: &str, grace: Duration) -> Result<pb::InstanceStatus> {
        let (inst, _g) = self.locked(instance_id).await?;
        inst.update(|r| r.desired = Desired::Stopped);
        inst.stop_all(grace).await;
        Ok(inst.status())
    }

    async fn restart(
        &self,
        instance_id: &str,
        service: Option<&str>,
    ) -> Result<pb::InstanceStatus> {
        let (inst, _g) = self.locked(instance_id).await?;
        let rec = inst.record();
        if let Some(name) = service {
            let spec = rec.service(name).ok_or_else(|| {
                ProviderError::NotFound(format!("instance {instance_id} has no service {name:?}"))
            })?;
            if role(spec) == Role::Init {
                return Err(ProviderError::FailedPrecondition(format!(
                    "{name:?} is an init service: it runs when the workload starts; restart the whole workload"
                )));
            }
            if rec.desired == Desired::Running && inst.active() {
                inst.roll(&[name.to_string()], false).await?;
                return Ok(inst.status());
            }
        }
        inst.stop_all(self.shared.cfg.stop_grace).await;
        inst.update(|r| r.desired = Desired::Running);
        inst.begin_run();
        Ok(inst.status())
    }

    async fn status(&self, instance_id: &str) -> Result<pb::InstanceStatus> {
        Ok(self.get(instance_id)?.status())
    }

    async fn deploy(&self, req: pb::DeployRequest) -> Result<pb::DeployResponse> {
        let (inst, _g) = self.locked(&req.instance_id).await?;
        let rec = inst.record();
        if rec.release == req.release_id {
            return Ok(pb::DeployResponse {
                release_id: req.release_id,
                status: Some(inst.status()),
            });
        }
        if rec.releases.iter().any(|r| r.id == req.release_id) {
            return Err(ProviderError::FailedPrecondition(format!(
                "release {:?} was deployed before and is not the current one; use Rollback to return to it",
                req.release_id
            )));
        }
        let mut services = rec.services.clone();
        let mut changed = Vec::new();
        for (i, d) in req.services.iter().enumerate() {
            let Some(spec) = services.iter_mut().find(|s| s.name == d.name) else {
                return Err(ProviderError::NotFound(format!(
                    "services[{i}].name: instance {} has no service {:?}",
                    req.instance_id, d.name
                )));
            };
            let before = spec.clone();
            ctrlplane_agent::workload::apply_deploy(spec, d);
            if *spec != before && !changed.contains(&spec.name) {
                changed.push(spec.name.clone());
            }
        }
        let mut v = Violations::new();
        ctrlplane_core::validate::service_specs(&mut v, "services", &services);
        v.extend(check_runnable(&services));
        v.into_result()?;
        let recreate = req.strategy == pb::DeployStrategy::Recreate as i32;
        apply_release(&inst, req.release_id.clone(), services);
        tracing::info!(instance = %inst.id, release = %req.release_id, ?changed, "deploying");
        inst.roll(&changed, recreate).await?;
        Ok(pb::DeployResponse {
            release_id: req.release_id,
            status: Some(inst.status()),
        })
    }

    async fn rollback(&self, req: pb::RollbackRequest) -> Result<pb::RollbackResponse> {
        let (inst, _g) = self.locked(&req.instance_id).await?;
        let rec = inst.record();
        let target = if req.release_id.is_empty() {
            rec.releases.last().cloned().ok_or_else(|| {
                ProviderError::FailedPrecondition(format!(
                    "instance {} has no earlier release to return to",
                    req.instance_id
                ))
            })?
        } else if req.release_id == rec.release {
            return Ok(pb::RollbackResponse {
                release_id: req.release_id,
                status: Some(inst.status()),
            });
        } else {
            rec.releases
                .iter()
                .find(|r| r.id == req.release_id)
                .cloned()
                .ok_or_else(|| {
                    ProviderError::NotFound(format!(
                        "instance {} has no release {:?}",
                        req.instance_id, req.release_id
                    ))
                })?
        };
        // Keep replica counts: a rollback changes what runs, not how many.
        let mut services = target.services.clone();
        for s in &mut services {
            if let Some(cur) = rec.service(&s.name) {
                s.resources = cur.resources;
            }
        }
        let changed: Vec<String> = services
            .iter()
            .filter(|s| rec.service(&s.name) != Some(*s))
            .map(|s| s.name.clone())
            .collect();
        apply_release(&inst, target.id.clone(), services);
        inst.roll(&changed, false).await?;
        Ok(pb::RollbackResponse {
            release_id: target.id,
            status: Some(inst.status()),
        })
    }

    async fn scale(&self, req: pb::ScaleRequest) -> Result<pb::InstanceStatus> {
        let (inst, _g) = self.locked(&req.instance_id).await?;
        let rec = inst.record();
        let targets: Vec<String> = if req.service_name.is_empty() {
            rec.services
                .iter()
                .filter(|s| role(s) != Role::Init)
                .map(|s| s.name.clone())
                .collect()
        } else {
            let spec = rec.service(&req.service_name).ok_or_else(|| {
                ProviderError::NotFound(format!(
                    "instance {} has no service {:?}",
                    req.instance_id, req.service_name
                ))
            })?;
            if role(spec) == Role::Init && req.resources.as_ref().is_some_and(|r| r.replicas > 1) {
                return Err(ProviderError::invalid(
                    "service_name",
                    "init services run once; they cannot have replicas",
                ));
            }
            vec![req.service_name.clone()]
        };
        let res = req.resources.unwrap_or_default();
        inst.scale(&targets, &res).await;
        Ok(inst.status())
    }

    async fn resources(&self, instance_id: &str) -> Result<pb::ResourceUsage> {
        Ok(self.get(instance_id)?.resources())
    }

    async fn logs(&self, req: pb::StreamLogsRequest) -> Result<LogStream> {
        let inst = self.get(&req.instance_id)?;
        let rec = inst.record();
        let services: Vec<String> = if req.service_name.is_empty() {
            rec.services.iter().map(|s| s.name.clone()).collect()
        } else if rec.service(&req.service_name).is_some() {
            vec![req.service_name.clone()]
        } else {
            return Err(ProviderError::NotFound(format!(
                "instance {} has no service {:?}",
                req.instance_id, req.service_name
            )));
        };
        let since = match &req.since {
            None => None,
            Some(ts) => Some(
                chrono::DateTime::from_timestamp(ts.seconds, ts.nanos.max(0) as u32)
                    .ok_or_else(|| ProviderError::invalid("since", "is not a valid timestamp"))?,
            ),
        };
        let query = logs::Query {
            since,
            tail: req.tail.max(0) as usize,
            follow: req.follow,
        };
        let logs_dir = workdir::logs_dir(&inst.root);
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let detach = self.shared.detach.clone();
        self.shared
            .tracker
            .spawn(stream_logs(inst, logs_dir, services, query, tx, detach));
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn exec(&self, req: pb::ExecRequest) -> Result<pb::ExecResponse> {
        let inst = self.get(&req.instance_id)?;
        let ctx = inst.exec_context(&req.service_name, req.replica.max(0) as u32)?;
        let timeout = req
            .timeout
            .as_ref()
            .filter(|d| d.seconds > 0 || d.nanos > 0)
            .map_or(self.shared.cfg.exec_timeout, |d| {
                Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32)
            });
        exec(&self.shared.procs, &req.command, &req.stdin, &ctx, timeout).await
    }

    async fn check_health(&self) -> Result<pb::CheckHealthResponse> {
        let probe = self.state_dir().join(".health");
        let writable = std::fs::write(&probe, b"ok").is_ok();
        let _ = std::fs::remove_file(&probe);
        let instances = self.map().len() as i32;
        Ok(pb::CheckHealthResponse {
            healthy: writable,
            message: if writable {
                format!("managing {instances} instance(s)")
            } else {
                format!(
                    "state directory {} is not writable",
                    self.state_dir().display()
                )
            },
            instances,
        })
    }

    async fn list_managed(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListManagedResponse> {
        let after = ctrlplane_agent::provider::managed_page_start(page_token)?.unwrap_or_default();
        let page: Vec<Arc<Instance>> = self
            .map()
            .range::<String, _>((
                std::ops::Bound::Excluded(&after),
                std::ops::Bound::Unbounded,
            ))
            .take(page_size as usize + 1)
            .map(|(_, i)| i.clone())
            .collect();
        let more = page.len() > page_size as usize;
        let workloads: Vec<pb::ManagedWorkload> = page
            .iter()
            .take(page_size as usize)
            .map(|inst| {
                let rec = inst.record();
                pb::ManagedWorkload {
                    instance_id: rec.instance_id.clone(),
                    labels: rec.managed_labels(),
                    created_at: Some(timestamp(rec.created_at_ms)),
                    tenant_id: rec.tenant_id.clone(),
                }
            })
            .collect();
        let next_page_token = match (more, workloads.last()) {
            (true, Some(last)) => ctrlplane_agent::provider::managed_page_token(&last.instance_id),
            _ => String::new(),
        };
        Ok(pb::ListManagedResponse {
            workloads,
            next_page_token,
        })
    }
}

fn apply_release(inst: &Instance, id: String, services: Vec<pb::ServiceSpec>) {
    inst.update(|rec| {
        let previous = Release {
            id: std::mem::replace(&mut rec.release, id.clone()),
            services: std::mem::replace(&mut rec.services, services),
        };
        rec.releases.retain(|r| r.id != id && r.id != previous.id);
        rec.releases.push(previous);
        let excess = rec.releases.len().saturating_sub(MAX_RELEASES);
        rec.releases.drain(..excess);
    });
}

/// Runs a command in a service's environment and directory.
async fn exec(
    procs: &Processes,
    argv: &[String],
    stdin: &[u8],
    ctx: &crate::health::CommandContext,
    timeout: Duration,
) -> Result<pb::ExecResponse> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&ctx.cwd)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let (mut child, p) = procs.spawn(&mut cmd).map_err(|e| match e {
        crate::process::SpawnError::Halted => ProviderError::Unavailable(e.to_string()),
        // The command is the caller's: a missing program is their mistake.
        e => ProviderError::FailedPrecondition(e.to_string()),
    })?;
    let mut child_in = child.stdin.take();
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let input = stdin.to_vec();
    let run = async {
        let feed = async {
            if let Some(mut i) = child_in.take() {
                let _ = i.write_all(&input).await;
            }
        };
        let read = |pipe: Option<tokio::process::ChildStdout>| async move {
            let mut buf = Vec::new();
            if let Some(p) = pipe {
                let _ = p.take(EXEC_OUTPUT_MAX as u64).read_to_end(&mut buf).await;
            }
            buf
        };
        let read_err = async {
            let mut buf = Vec::new();
            if let Some(p) = err.take() {
                let _ = p.take(EXEC_OUTPUT_MAX as u64).read_to_end(&mut buf).await;
            }
            buf
        };
        let ((), stdout, stderr, status) =
            tokio::join!(feed, read(out.take()), read_err, child.wait());
        (stdout, stderr, status)
    };
    let result = tokio::time::timeout(timeout, run).await;
    crate::process::signal_group(&p, nix::sys::signal::Signal::SIGKILL);
    procs.forget(&p);
    match result {
        Ok((stdout, stderr, Ok(status))) => Ok(pb::ExecResponse {
            exit_code: Exit::from_status(status).code(),
            stdout,
            stderr,
        }),
        Ok((_, _, Err(e))) => Err(ProviderError::Internal(format!(
            "waiting for the command: {e}"
        ))),
        Err(_) => Err(ProviderError::DeadlineExceeded(format!(
            "the command did not finish within {}s and was killed",
            timeout.as_secs_f64()
        ))),
    }
}

/// The producer of a StreamLogs call: the selected history first, merged
/// by time, then (with `follow`) new lines as they are written, until the
/// client goes away, the instance is removed or the agent shuts down.
async fn stream_logs(
    inst: Arc<Instance>,
    logs_dir: std::path::PathBuf,
    services: Vec<String>,
    query: logs::Query,
    tx: tokio::sync::mpsc::Sender<Result<pb::StreamLogsResponse>>,
    detach: CancellationToken,
) {
    let mut offsets: HashMap<std::path::PathBuf, u64> = HashMap::new();
    let mut history = Vec::new();
    for file in logs::log_files(&logs_dir, &services) {
        offsets.insert(file.path.clone(), logs::file_len(&file.path));
        for e in logs::select(logs::read_all(&file.path), &query) {
            history.push((e.time, logs::to_pb(&file, e)));
        }
    }
    history.sort_by_key(|(t, _)| *t);
    for (_, item) in history {
        if tx.send(Ok(item)).await.is_err() {
            return;
        }
    }
    if !query.follow {
        return;
    }
    loop {
        tokio::select! {
            () = detach.cancelled() => return,
            () = tx.closed() => return,
            () = tokio::time::sleep(logs::FOLLOW_POLL) => {}
        }
        if inst.is_gone() {
            return;
        }
        let mut batch = Vec::new();
        for file in logs::log_files(&logs_dir, &services) {
            let offset = offsets.entry(file.path.clone()).or_insert(0);
            for e in logs::read_new(&file.path, offset) {
                if query.since.is_none_or(|s| e.time >= s) {
                    batch.push((e.time, logs::to_pb(&file, e)));
                }
            }
        }
        batch.sort_by_key(|(t, _)| *t);
        for (_, item) in batch {
            if tx.send(Ok(item)).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runnable_checks_name_the_fields() {
        let services = vec![pb::ServiceSpec {
            name: "main".to_string(),
            config_files: vec![pb::ConfigFile {
                name: "c".to_string(),
                path: "/etc/app.yaml".to_string(),
                ..Default::default()
            }],
            secrets: vec![pb::SecretRef {
                key: "../x".to_string(),
                ..Default::default()
            }],
            ..Default::default()
        }];
        let v = check_runnable(&services);
        let fields: Vec<&str> = v.iter().map(|f| f.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "services[0].command",
                "services[0].config_files[0].path",
                "services[0].secrets[0].key"
            ]
        );
    }
}
