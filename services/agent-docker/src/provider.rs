//! The [`Provider`] implementation: workloads as containers.
//!
//! Invariants:
//! - the engine is the only record: every object is named and labelled
//!   from the instance (see [`crate::names`]), and everything the agent
//!   needs later (the spec, the release, the request's labels) is in those
//!   labels, so a restarted agent carries on from the engine alone;
//! - calls that change an instance hold its lock, so two of them never
//!   interleave; the start sequence (inits to completion in `depends_on`
//!   order, then mains and sidecars, each dependency up before its
//!   dependents) runs as a task the caller waits for up to `start_wait`,
//!   and Stop, Restart, Deploy and Deprovision cancel it first;
//! - Provision checks every image (pulling missing ones) and secret before
//!   it creates anything, and creates only what is missing, so a repeated
//!   Provision returns the same refs and restarts nothing;
//! - Deploy, Rollback and resource changes recreate the changed services
//!   one replica at a time; the replaced container is kept, stopped, as the
//!   replica's previous generation (`.prev`) for its logs and for Rollback.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use bollard::models::{NetworkConnectRequest, NetworkCreateRequest, VolumeCreateRequest};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RenameContainerOptionsBuilder};
use ctrlplane_agent::provider::Result;
use ctrlplane_agent::workload::{Role, dependency_order, replicas, role};
use ctrlplane_agent::{Capability, LogStream, Provider, ProviderError};
use ctrlplane_proto::provider::v1 as pb;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared, join_all};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::config::DockerConfig;
use crate::engine::Engine;
use crate::names::{self, Names};
use crate::spec::{self, Check, Meta};
use crate::state::{self, Container, Instance, Probes};
use crate::{logs, usage};

/// Provider name.
pub const PROVIDER_NAME: &str = "docker";

/// What this agent really supports.
pub const CAPABILITIES: &[Capability] = &[
    Capability::Provision,
    Capability::Deploy,
    Capability::Scale,
    Capability::Logs,
    Capability::Exec,
    Capability::Volumes,
    Capability::StrategyRolling,
];

/// Resolves when a start sequence ends.
type Done = Shared<BoxFuture<'static, ()>>;

/// Time between two looks at a container while waiting for it.
const POLL: Duration = Duration::from_millis(100);

/// The Docker agent.
pub struct DockerAgent {
    cfg: DockerConfig,
    names: Names,
    engine: Engine,
    locks: StdMutex<HashMap<String, Arc<Mutex<()>>>>,
    sequences: StdMutex<HashMap<String, (CancellationToken, Done)>>,
    self_container: tokio::sync::OnceCell<Option<String>>,
    engine_version: StdMutex<String>,
    /// Why the last start sequence of an instance failed (cleared by the
    /// next one that succeeds).
    start_errors: StdMutex<HashMap<String, String>>,
    me: std::sync::Weak<DockerAgent>,
}

impl DockerAgent {
    /// An agent for the engine in `cfg`. Nothing is contacted yet: call
    /// [`DockerAgent::start`] to check the engine and resume interrupted
    /// start sequences.
    pub fn new(cfg: DockerConfig) -> Arc<Self> {
        Arc::new_cyclic(|me| DockerAgent {
            me: me.clone(),
            names: Names::new(cfg.scope.clone()),
            engine: Engine::new(cfg.host.clone()),
            cfg,
            locks: StdMutex::new(HashMap::new()),
            sequences: StdMutex::new(HashMap::new()),
            self_container: tokio::sync::OnceCell::new(),
            engine_version: StdMutex::new(String::new()),
            start_errors: StdMutex::new(HashMap::new()),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &DockerConfig {
        &self.cfg
    }

    /// Object names.
    pub fn names(&self) -> &Names {
        &self.names
    }

    /// Checks the engine (logging a clear error when it is unreachable;
    /// the agent keeps running and reports itself unhealthy) and, when it
    /// answers, resumes what an earlier agent left half done: its own
    /// container joins every instance network (when the agent runs in a
    /// container), and instances with containers never started get their
    /// start sequence.
    pub async fn start(&self) {
        match self.engine.version().await {
            Ok(v) => {
                tracing::info!(engine = %self.engine.host(), version = %v, "Docker engine reachable");
                *self
                    .engine_version
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = v;
            }
            Err(e) => {
                tracing::error!(
                    "{e}; the agent runs but every backend call fails until the engine answers"
                );
                return;
            }
        }
        let nets = match self.engine.networks(&self.names.scope_filter()).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("listing instances at start-up: {e}");
                return;
            }
        };
        for n in nets {
            self.attach_self(&n.name).await;
            let Some(id) = n.labels.get(names::INSTANCE).cloned() else {
                continue;
            };
            if let Ok(Some(inst)) = self.load(&id).await {
                self.repair(&inst).await;
            }
            if let Ok(Some(inst)) = self.load(&id).await
                && needs_start(&inst)
            {
                tracing::info!(instance = %id, "resuming an interrupted start sequence");
                drop(self.spawn_sequence(&id, false));
            }
        }
    }

    /// Finishes what a replacement cut short by a crash left: a replica
    /// whose current container is missing while its previous generation
    /// exists gets the previous one back under its name (started, unless
    /// it is an init), so no replica is lost between the two steps.
    async fn repair(&self, inst: &Instance) {
        let current: HashSet<&str> = inst.current().map(|c| c.name.as_str()).collect();
        for prev in inst.containers.iter().filter(|c| c.prev) {
            let name = self.names.container(&inst.id, &prev.service, prev.replica);
            if current.contains(name.as_str()) {
                continue;
            }
            tracing::warn!(instance = %inst.id, container = %name, "restoring a replica whose replacement was cut short");
            let Ok(d) = self.engine.client().await else {
                return;
            };
            let renamed = d
                .rename_container(
                    &prev.name,
                    RenameContainerOptionsBuilder::default().name(&name).build(),
                )
                .await;
            if let Err(e) = renamed {
                tracing::warn!(container = %name, "restoring: {e}");
                continue;
            }
            if role(&prev.spec) != Role::Init
                && let Err(e) = self.engine.start(&name).await
            {
                tracing::warn!(container = %name, "restoring: {e}");
            }
        }
    }

    /// Waits for the start sequences still running (at shutdown).
    pub async fn shutdown(&self, grace: Duration) {
        let handles: Vec<_> = {
            let mut seqs = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
            seqs.drain().map(|(_, (c, h))| (c, h)).collect()
        };
        for (cancel, done) in handles {
            cancel.cancel();
            let _ = tokio::time::timeout(grace, done).await;
        }
    }

    fn lock(&self, id: &str) -> Arc<Mutex<()>> {
        self.locks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// The agent's own container, when it runs in one on the same engine.
    async fn self_container(&self) -> Option<String> {
        self.self_container
            .get_or_init(|| async {
                if !std::path::Path::new("/.dockerenv").exists() {
                    return None;
                }
                let host = std::env::var("HOSTNAME").ok()?;
                match self.engine.inspect(&host).await {
                    Ok(Some(c)) => c.id,
                    _ => None,
                }
            })
            .await
            .clone()
    }

    /// Joins the agent's own container to an instance network, so its
    /// HTTP/TCP probes reach the containers (no-op outside a container).
    async fn attach_self(&self, network: &str) {
        let Some(me) = self.self_container().await else {
            return;
        };
        let Ok(d) = self.engine.client().await else {
            return;
        };
        let req = NetworkConnectRequest {
            container: me,
            endpoint_config: None,
        };
        if let Err(e) = d.connect_network(network, req).await {
            let msg = e.to_string();
            if !msg.contains("already exists") {
                tracing::warn!(network, "joining the instance network for probes: {msg}");
            }
        }
    }

    async fn detach_self(&self, network: &str) {
        let Some(me) = self.self_container().await else {
            return;
        };
        let Ok(d) = self.engine.client().await else {
            return;
        };
        let req = bollard::models::NetworkDisconnectRequest {
            container: me,
            force: Some(true),
        };
        let _ = d.disconnect_network(network, req).await;
    }

    /// Reads an instance from the engine; `None` when nothing of it exists.
    pub async fn load(&self, id: &str) -> Result<Option<Instance>> {
        let filter = self.names.instance_filter(id);
        let (nets, summaries) = tokio::try_join!(
            self.engine.networks(&filter),
            self.engine.containers(&filter)
        )?;
        let inspected = join_all(
            summaries
                .iter()
                .filter_map(|s| s.id.as_deref())
                .map(|cid| async move { self.engine.inspect(cid).await }),
        )
        .await;
        let mut containers = Vec::new();
        for c in inspected {
            if let Some(c) = c?.and_then(Container::from_inspect) {
                containers.push(c);
            }
        }
        let network = nets.first();
        if network.is_none() && containers.is_empty() {
            return Ok(None);
        }
        let meta = match network {
            Some(n) => Meta::from_labels(&n.labels),
            None => containers
                .first()
                .and_then(|c| c.inspect.config.as_ref()?.labels.as_ref())
                .map(Meta::from_labels)
                .unwrap_or_else(|| Meta {
                    instance_id: id.to_string(),
                    tenant_id: String::new(),
                    name: String::new(),
                    stateful: false,
                    labels: HashMap::new(),
                }),
        };
        Ok(Some(Instance {
            id: id.to_string(),
            network: network.map(|n| n.name.clone()),
            meta,
            containers,
        }))
    }

    async fn must_load(&self, id: &str) -> Result<Instance> {
        self.load(id)
            .await?
            .ok_or_else(|| ProviderError::no_instance(id))
    }

    /// The agent's probe of one running replica with an HTTP/TCP check
    /// (`None` for other checks or without an address).
    async fn probe(&self, c: &Container) -> Option<bool> {
        let instance = c
            .inspect
            .config
            .as_ref()?
            .labels
            .as_ref()?
            .get(names::INSTANCE)?
            .clone();
        let ip = c.ip(&self.names.network(&instance))?;
        let timeout = spec::check_timeout(&c.spec);
        match spec::check(&c.spec) {
            Check::Http { port, path } => {
                Some(ctrlplane_agent::workload::http_ok(&ip, port, &path, timeout).await)
            }
            Check::Tcp { port } => {
                Some(ctrlplane_agent::workload::tcp_ok(&ip, port, timeout).await)
            }
            _ => None,
        }
    }

    /// Readiness probes (HTTP/TCP checks) of the running replicas.
    async fn probes(&self, inst: &Instance) -> Probes {
        let results = join_all(
            inst.current()
                .filter(|c| c.running())
                .map(|c| async move { (c.name.clone(), self.probe(c).await) }),
        )
        .await;
        results
            .into_iter()
            .filter_map(|(n, r)| Some((n, r?)))
            .collect()
    }

    /// The status; a start sequence that failed (a port already taken, a
    /// bad mount…) while containers wait unstarted makes it FAILED with
    /// the engine's reason.
    async fn status_of(&self, inst: &Instance) -> pb::InstanceStatus {
        let probes = self.probes(inst).await;
        let mut status = state::status(inst, &self.cfg.endpoint_host, &probes);
        let error = self
            .start_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&inst.id)
            .cloned();
        if let Some(e) = error
            && needs_start(inst)
        {
            status.state = pb::InstanceState::Failed as i32;
            status.ready = false;
            status.message = format!("start failed: {e}");
        }
        status
    }

    /// Whether a replica is up: running, ready, and (without a health
    /// check) running for the settle time.
    async fn replica_up(&self, name: &str) -> Result<ReplicaUp> {
        let Some(c) = self
            .engine
            .inspect(name)
            .await?
            .and_then(Container::from_inspect)
        else {
            return Ok(ReplicaUp::Gone);
        };
        if !c.running() {
            return Ok(ReplicaUp::No);
        }
        let ready = match spec::check(&c.spec) {
            Check::None => c.started_at().is_some_and(|t| {
                (chrono::Utc::now() - t).to_std().unwrap_or_default() >= self.cfg.dependency_settle
            }),
            Check::Command => c.health() == Some(bollard::models::HealthStatusEnum::HEALTHY),
            _ => self.probe(&c).await.unwrap_or(false),
        };
        Ok(if ready { ReplicaUp::Yes } else { ReplicaUp::No })
    }

    /// Waits until a replica is up, for at most `timeout`; `false` when it
    /// vanished, the time ran out or `cancel` fired. (A replica that exits
    /// meanwhile is waited for: the engine restarts mains and sidecars.)
    async fn wait_up(&self, name: &str, timeout: Duration, cancel: &CancellationToken) -> bool {
        let until = Instant::now() + timeout;
        loop {
            match self.replica_up(name).await {
                Ok(ReplicaUp::Yes) => return true,
                Ok(ReplicaUp::Gone) => return false,
                Ok(ReplicaUp::No) | Err(_) => {}
            }
            if Instant::now() >= until || cancel.is_cancelled() {
                return false;
            }
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }

    /// Runs an init container to completion: `Ok(exit code)`.
    async fn run_init(&self, name: &str, cancel: &CancellationToken) -> Result<Option<i64>> {
        self.engine.start(name).await?;
        loop {
            let Some(c) = self.engine.inspect(name).await? else {
                return Ok(None);
            };
            let st = c.state.as_ref();
            let running = st.and_then(|s| s.running).unwrap_or(false);
            if !running {
                return Ok(Some(st.and_then(|s| s.exit_code).unwrap_or(0)));
            }
            tokio::select! {
                () = cancel.cancelled() => return Ok(None),
                () = tokio::time::sleep(POLL) => {}
            }
        }
    }

    /// The start sequence: inits to completion in dependency order (all
    /// of them when `rerun_inits`, else those not yet completed), then
    /// mains and sidecars in dependency order, each dependency up before
    /// its dependents start. Stops at the first failed init (the status
    /// then reports the instance FAILED).
    async fn sequence(
        &self,
        id: &str,
        rerun_inits: bool,
        cancel: &CancellationToken,
    ) -> Result<()> {
        let inst = self.must_load(id).await?;
        let specs = inst.specs();
        for i in dependency_order(&specs, |s| role(s) == Role::Init) {
            let spec = &specs[i];
            for c in inst.replicas(&spec.name) {
                let done = c.status() == bollard::models::ContainerStateStatusEnum::EXITED
                    && c.exit_code() == 0
                    && c.started_at().is_some();
                if done && !rerun_inits {
                    continue;
                }
                match self.run_init(&c.name, cancel).await? {
                    Some(0) => {}
                    Some(code) => {
                        tracing::warn!(instance = id, init = %spec.name, code, "init failed; main and sidecars are not started");
                        return Ok(());
                    }
                    None => return Ok(()),
                }
            }
        }
        let order = dependency_order(&specs, |s| role(s) != Role::Init);
        for (pos, &i) in order.iter().enumerate() {
            if cancel.is_cancelled() {
                return Ok(());
            }
            let spec = &specs[i];
            let reps = inst.replicas(&spec.name);
            join_all(reps.iter().map(|c| self.engine.start(&c.name)))
                .await
                .into_iter()
                .collect::<Result<Vec<()>>>()?;
            let has_dependents = order[pos + 1..]
                .iter()
                .any(|&j| specs[j].depends_on.contains(&spec.name));
            if has_dependents {
                for c in &reps {
                    if !self
                        .wait_up(&c.name, self.cfg.rollout_timeout, cancel)
                        .await
                        && !cancel.is_cancelled()
                    {
                        tracing::warn!(instance = id, service = %spec.name, "dependency not up in time; starting its dependents anyway");
                    }
                }
            }
        }
        Ok(())
    }

    /// Starts the start sequence as a task (replacing any running one);
    /// the returned future resolves when it ends.
    fn spawn_sequence(&self, id: &str, rerun_inits: bool) -> Done {
        let cancel = CancellationToken::new();
        let me = self
            .me
            .upgrade()
            .expect("the agent lives while its calls run");
        let id_owned = id.to_string();
        let c = cancel.clone();
        let done: Done = tokio::spawn(async move {
            let r = me.sequence(&id_owned, rerun_inits, &c).await;
            let mut errors = me.start_errors.lock().unwrap_or_else(|p| p.into_inner());
            match r {
                Ok(()) => {
                    errors.remove(&id_owned);
                }
                Err(e) => {
                    tracing::warn!(instance = %id_owned, "start sequence: {e}");
                    errors.insert(id_owned, e.to_string());
                }
            }
        })
        .map(|_| ())
        .boxed()
        .shared();
        let mut seqs = self.sequences.lock().unwrap_or_else(|p| p.into_inner());
        seqs.retain(|_, (_, d)| d.peek().is_none());
        if let Some((old, _)) = seqs.insert(id.to_string(), (cancel, done.clone())) {
            old.cancel();
        }
        done
    }

    /// Cancels the instance's start sequence and waits for it to end.
    async fn cancel_sequence(&self, id: &str) {
        let entry = self
            .sequences
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
        if let Some((cancel, done)) = entry {
            cancel.cancel();
            done.await;
        }
    }

    /// Runs the start sequence, waiting for it up to `start_wait`.
    async fn run_sequence(&self, id: &str, rerun_inits: bool) {
        let done = self.spawn_sequence(id, rerun_inits);
        let _ = tokio::time::timeout(self.cfg.start_wait, done).await;
    }

    /// Image working directories (for relative file paths).
    async fn workdir(&self, image: &str) -> String {
        let Ok(d) = self.engine.client().await else {
            return "/".to_string();
        };
        d.inspect_image(image)
            .await
            .ok()
            .and_then(|i| i.config?.working_dir)
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "/".to_string())
    }

    /// Reads the secrets a set of specs needs.
    fn secrets(&self, specs: &[&pb::ServiceSpec]) -> Result<HashMap<String, Vec<u8>>> {
        let dir = self.cfg.state_dir.join("secrets");
        let mut out = HashMap::new();
        for s in specs {
            for r in &s.secrets {
                if !out.contains_key(&r.key) {
                    out.insert(r.key.clone(), spec::read_secret(&dir, &r.key)?);
                }
            }
        }
        Ok(out)
    }

    /// Creates one replica's container (and its volumes), with its files
    /// copied in; not started.
    async fn create_replica(
        &self,
        meta: &Meta,
        spec: &pb::ServiceSpec,
        replica: u32,
        release: &str,
        secrets: &HashMap<String, Vec<u8>>,
    ) -> Result<String> {
        let d = self.engine.client().await?;
        let name = self.names.container(&meta.instance_id, &spec.name, replica);
        for (vol, _) in spec::volumes(&self.names, meta, spec, replica) {
            let mut labels = meta.labels(&self.names);
            labels.insert(names::SERVICE.to_string(), spec.name.clone());
            d.create_volume(VolumeCreateRequest {
                name: Some(vol.clone()),
                labels: Some(labels),
                ..Default::default()
            })
            .await
            .map_err(|e| self.engine.err(&format!("create volume {vol}"), e))?;
        }
        let r = spec::Replica {
            names: &self.names,
            meta,
            spec,
            replica,
            release,
            secrets,
        };
        let opts = CreateContainerOptionsBuilder::default().name(&name).build();
        d.create_container(Some(opts), r.body())
            .await
            .map_err(|e| self.engine.err(&format!("create container {name}"), e))?;
        let files = r.files(&self.workdir(&spec.image).await);
        if let Err(e) = self.engine.put_files(&name, &files).await {
            let _ = self.engine.remove(&name).await;
            return Err(e);
        }
        Ok(name)
    }

    /// Replaces one replica with a container of `spec`: the previous
    /// generation is dropped, the current one stopped and kept as `.prev`,
    /// the new one created, started and waited for (up to the rollout
    /// timeout) unless `start` is false.
    async fn recreate_replica(
        &self,
        inst: &Instance,
        current: &Container,
        spec: &pb::ServiceSpec,
        release: &str,
        secrets: &HashMap<String, Vec<u8>>,
        start: bool,
    ) -> Result<()> {
        let d = self.engine.client().await?;
        let prev = self
            .names
            .prev_container(&inst.id, &current.service, current.replica);
        self.engine.remove(&prev).await?;
        self.engine
            .stop(&current.name, grace_secs(self.cfg.stop_grace))
            .await?;
        d.rename_container(
            &current.name,
            RenameContainerOptionsBuilder::default().name(&prev).build(),
        )
        .await
        .map_err(|e| self.engine.err(&format!("rename {}", current.name), e))?;
        let name = self
            .create_replica(&inst.meta, spec, current.replica, release, secrets)
            .await?;
        if start {
            self.engine.start(&name).await?;
            let never = CancellationToken::new();
            if !self.wait_up(&name, self.cfg.rollout_timeout, &never).await {
                return Err(ProviderError::FailedPrecondition(format!(
                    "replica {} of {} did not come up within {:?} after the change; \
                     its previous generation is kept (Rollback returns to it)",
                    current.replica, current.service, self.cfg.rollout_timeout
                )));
            }
        }
        Ok(())
    }

    /// Changes services to new specs, replica by replica (`recreate`: stop
    /// every replica of a changed service first).
    async fn roll(
        &self,
        inst: &Instance,
        changes: &[pb::ServiceSpec],
        release: &str,
        recreate: bool,
    ) -> Result<()> {
        let specs: Vec<&pb::ServiceSpec> = changes.iter().collect();
        for s in &specs {
            self.engine.ensure_image(&s.image).await?;
        }
        let secrets = self.secrets(&specs)?;
        for spec in changes {
            let reps = inst.replicas(&spec.name);
            if recreate {
                join_all(
                    reps.iter()
                        .map(|c| self.engine.stop(&c.name, grace_secs(self.cfg.stop_grace))),
                )
                .await;
            }
            let start = role(spec) != Role::Init;
            for c in reps {
                if c.hash == spec::spec_hash(spec) && c.release == release {
                    continue;
                }
                self.recreate_replica(inst, c, spec, release, &secrets, start)
                    .await?;
            }
        }
        Ok(())
    }
}

enum ReplicaUp {
    Yes,
    No,
    Gone,
}

/// Whether an instance has mains or sidecars never started (and no failed
/// init): a start sequence was cut short.
fn needs_start(inst: &Instance) -> bool {
    let failed_init = inst.current().any(|c| {
        role(&c.spec) == Role::Init
            && c.status() == bollard::models::ContainerStateStatusEnum::EXITED
            && c.exit_code() != 0
    });
    !failed_init
        && inst.current().any(|c| {
            role(&c.spec) != Role::Init
                && c.status() == bollard::models::ContainerStateStatusEnum::CREATED
        })
}

/// A grace period in whole seconds for the engine (rounded up, at least 0).
fn grace_secs(d: Duration) -> i32 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i32::try_from(s).unwrap_or(i32::MAX)
}

#[tonic::async_trait]
impl Provider for DockerAgent {
    fn info(&self) -> pb::GetInfoResponse {
        let version = self
            .engine_version
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        pb::GetInfoResponse {
            provider_name: PROVIDER_NAME.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            backend: format!("docker engine at {}", self.engine.host()),
            metadata: HashMap::from([
                ("engine".to_string(), version),
                ("scope".to_string(), self.names.scope().to_string()),
            ]),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        CAPABILITIES.to_vec()
    }

    async fn provision(&self, req: pb::ProvisionRequest) -> Result<pb::ProvisionResponse> {
        let id = req.instance_id.clone();
        let lock = self.lock(&id);
        let _g = lock.lock().await;
        let meta = Meta::of(&req);
        let existing = self.load(&id).await?;
        let have: HashSet<String> = existing
            .as_ref()
            .map(|i| i.current().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        let missing: Vec<(&pb::ServiceSpec, u32)> = req
            .services
            .iter()
            .flat_map(|s| (0..replicas(s)).map(move |r| (s, r)))
            .filter(|(s, r)| !have.contains(&self.names.container(&id, &s.name, *r)))
            .collect();
        // Check before creating anything: images (pulled when missing) and
        // secrets.
        let mut images: Vec<&str> = missing.iter().map(|(s, _)| s.image.as_str()).collect();
        images.sort_unstable();
        images.dedup();
        for image in images {
            if image.is_empty() {
                return Err(ProviderError::invalid(
                    "services.image",
                    "the docker agent needs an image for every service",
                ));
            }
            self.engine.ensure_image(image).await?;
        }
        let specs: Vec<&pb::ServiceSpec> = missing.iter().map(|(s, _)| *s).collect();
        let secrets = self.secrets(&specs)?;
        let network = self.names.network(&id);
        if existing.as_ref().and_then(|i| i.network.as_ref()).is_none() {
            let d = self.engine.client().await?;
            d.create_network(NetworkCreateRequest {
                name: network.clone(),
                driver: Some("bridge".to_string()),
                labels: Some(meta.network_labels(&self.names)),
                ..Default::default()
            })
            .await
            .map_err(|e| self.engine.err(&format!("create network {network}"), e))?;
        }
        self.attach_self(&network).await;
        let existing_meta = existing.as_ref().map(|i| i.meta.clone());
        let meta = existing_meta.unwrap_or(meta);
        let mut created = false;
        for (spec, r) in &missing {
            self.create_replica(&meta, spec, *r, names::INITIAL_RELEASE, &secrets)
                .await?;
            created = true;
        }
        let inst = self.must_load(&id).await?;
        if created || needs_start(&inst) {
            self.run_sequence(&id, false).await;
        }
        let inst = self.must_load(&id).await?;
        let status = self.status_of(&inst).await;
        let service_refs = inst
            .specs()
            .iter()
            .map(|s| (s.name.clone(), self.names.container(&id, &s.name, 0)))
            .collect();
        Ok(pb::ProvisionResponse {
            provider_ref: network,
            service_refs,
            endpoints: status.endpoints,
            metadata: HashMap::from([("scope".to_string(), self.names.scope().to_string())]),
        })
    }

    async fn deprovision(&self, instance_id: &str) -> Result<pb::DeprovisionResponse> {
        let lock = self.lock(instance_id);
        let _g = lock.lock().await;
        self.cancel_sequence(instance_id).await;
        self.start_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(instance_id);
        let filter = self.names.instance_filter(instance_id);
        let (nets, containers, volumes) = tokio::try_join!(
            self.engine.networks(&filter),
            self.engine.containers(&filter),
            self.engine.volumes(&filter)
        )?;
        let existed = !nets.is_empty() || !containers.is_empty();
        join_all(
            containers
                .iter()
                .filter_map(|c| c.id.as_deref())
                .map(|id| self.engine.remove(id)),
        )
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
        for v in volumes {
            self.engine.remove_volume(&v).await?;
        }
        for n in nets {
            self.detach_self(&n.name).await;
            self.engine.remove_network(&n.name).await?;
        }
        Ok(pb::DeprovisionResponse { existed })
    }

    async fn start(&self, instance_id: &str) -> Result<pb::InstanceStatus> {
        let lock = self.lock(instance_id);
        let _g = lock.lock().await;
        self.must_load(instance_id).await?;
        self.cancel_sequence(instance_id).await;
        self.run_sequence(instance_id, true).await;
        Ok(self.status_of(&self.must_load(instance_id).await?).await)
    }

    async fn stop(&self, instance_id: &str, grace: Duration) -> Result<pb::InstanceStatus> {
        let lock = self.lock(instance_id);
        let _g = lock.lock().await;
        let inst = self.must_load(instance_id).await?;
        self.cancel_sequence(instance_id).await;
        let secs = grace_secs(grace);
        join_all(inst.current().map(|c| self.engine.stop(&c.name, secs)))
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        Ok(self.status_of(&self.must_load(instance_id).await?).await)
    }

    async fn restart(
        &self,
        instance_id: &str,
        service: Option<&str>,
    ) -> Result<pb::InstanceStatus> {
        let lock = self.lock(instance_id);
        let _g = lock.lock().await;
        let inst = self.must_load(instance_id).await?;
        let secs = grace_secs(self.cfg.stop_grace);
        match service {
            None => {
                self.cancel_sequence(instance_id).await;
                join_all(inst.current().map(|c| self.engine.stop(&c.name, secs)))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<()>>>()?;
                self.run_sequence(instance_id, true).await;
            }
            Some(name) => {
                let reps = inst.replicas(name);
                if reps.is_empty() {
                    return Err(ProviderError::NotFound(format!(
                        "instance {instance_id} has no service {name}"
                    )));
                }
                let never = CancellationToken::new();
                for c in reps {
                    self.engine.stop(&c.name, secs).await?;
                    self.engine.start(&c.name).await?;
                    if role(&c.spec) != Role::Init {
                        self.wait_up(&c.name, self.cfg.rollout_timeout, &never)
                            .await;
                    }
                }
            }
        }
        Ok(self.status_of(&self.must_load(instance_id).await?).await)
    }

    async fn status(&self, instance_id: &str) -> Result<pb::InstanceStatus> {
        Ok(self.status_of(&self.must_load(instance_id).await?).await)
    }

    async fn deploy(&self, req: pb::DeployRequest) -> Result<pb::DeployResponse> {
        let id = req.instance_id.clone();
        let lock = self.lock(&id);
        let _g = lock.lock().await;
        let inst = self.must_load(&id).await?;
        let specs: BTreeMap<String, pb::ServiceSpec> = inst
            .specs()
            .into_iter()
            .map(|s| (s.name.clone(), s))
            .collect();
        let mut changes = Vec::new();
        for d in &req.services {
            let Some(old) = specs.get(&d.name) else {
                return Err(ProviderError::NotFound(format!(
                    "instance {id} has no service {}",
                    d.name
                )));
            };
            let mut new = old.clone();
            ctrlplane_agent::workload::apply_deploy(&mut new, d);
            changes.push(new);
        }
        // The services as they would run must still be valid.
        let mut after: Vec<pb::ServiceSpec> = specs.values().cloned().collect();
        for new in &changes {
            if let Some(s) = after.iter_mut().find(|s| s.name == new.name) {
                *s = new.clone();
            }
        }
        let mut v = ctrlplane_core::Violations::new();
        ctrlplane_core::validate::service_specs(&mut v, "services", &after);
        v.into_result()?;
        let current = inst.release();
        let all_same = changes.iter().all(|s| {
            inst.replicas(&s.name)
                .iter()
                .all(|c| c.hash == spec::spec_hash(s))
        });
        if all_same {
            // Nothing runs differently: a repeated Deploy is a no-op.
            let status = self.status_of(&inst).await;
            return Ok(pb::DeployResponse {
                release_id: req.release_id,
                status: Some(status),
            });
        }
        let earlier: HashSet<&str> = inst
            .containers
            .iter()
            .filter(|c| c.prev)
            .map(|c| c.release.as_str())
            .collect();
        // The current release again: a retry of a rollout cut short (it
        // goes on where it stopped) when it carries the same services, an
        // error when it carries other ones.
        let same_content = changes.iter().all(|s| {
            inst.replicas(&s.name)
                .iter()
                .filter(|c| c.release == req.release_id)
                .all(|c| c.hash == spec::spec_hash(s))
        });
        if req.release_id == current && !same_content {
            return Err(ProviderError::FailedPrecondition(format!(
                "release {:?} is the current release with other services; \
                 deploy a change under a new release id",
                req.release_id
            )));
        }
        if earlier.contains(req.release_id.as_str()) {
            return Err(ProviderError::FailedPrecondition(format!(
                "release {:?} was deployed before; use Rollback to return to it",
                req.release_id
            )));
        }
        self.cancel_sequence(&id).await;
        let recreate = req.strategy == pb::DeployStrategy::Recreate as i32;
        // Only changed services are touched.
        let changes: Vec<_> = changes
            .into_iter()
            .filter(|s| {
                inst.replicas(&s.name)
                    .iter()
                    .any(|c| c.hash != spec::spec_hash(s))
            })
            .collect();
        self.roll(&inst, &changes, &req.release_id, recreate)
            .await?;
        let status = self.status_of(&self.must_load(&id).await?).await;
        Ok(pb::DeployResponse {
            release_id: req.release_id,
            status: Some(status),
        })
    }

    async fn rollback(&self, req: pb::RollbackRequest) -> Result<pb::RollbackResponse> {
        let id = req.instance_id.clone();
        let lock = self.lock(&id);
        let _g = lock.lock().await;
        let inst = self.must_load(&id).await?;
        // The release to return to: the one named (kept by a current or a
        // previous container: a Rollback cut short is finished by naming
        // it again), else the newest previous generation's.
        let target = if req.release_id.is_empty() {
            inst.containers
                .iter()
                .filter(|c| c.prev)
                .max_by_key(|c| c.created_at())
                .map(|c| c.release.clone())
                .ok_or_else(|| {
                    ProviderError::FailedPrecondition(format!(
                        "instance {id} has no earlier release to return to"
                    ))
                })?
        } else {
            req.release_id.clone()
        };
        let mut keeping: Vec<&Container> = inst
            .containers
            .iter()
            .filter(|c| c.release == target)
            .collect();
        if keeping.is_empty() {
            return Err(ProviderError::FailedPrecondition(format!(
                "release {target:?} is not kept (only the current and the previous \
                 generation of each replica are); it cannot be returned to"
            )));
        }
        // Current containers first: their spec is the release's as it ran.
        keeping.sort_by_key(|c| c.prev);
        let mut changes = Vec::new();
        let mut seen = HashSet::new();
        for c in keeping {
            if seen.insert(c.service.clone()) {
                changes.push(c.spec.clone());
            }
        }
        self.cancel_sequence(&id).await;
        self.roll(&inst, &changes, &target, false).await?;
        let status = self.status_of(&self.must_load(&id).await?).await;
        Ok(pb::RollbackResponse {
            release_id: target,
            status: Some(status),
        })
    }

    async fn scale(&self, req: pb::ScaleRequest) -> Result<pb::InstanceStatus> {
        let id = req.instance_id.clone();
        let lock = self.lock(&id);
        let _g = lock.lock().await;
        let inst = self.must_load(&id).await?;
        let res = req.resources.unwrap_or_default();
        let targets: Vec<pb::ServiceSpec> = if req.service_name.is_empty() {
            inst.specs()
                .into_iter()
                .filter(|s| role(s) != Role::Init)
                .collect()
        } else {
            let s = inst
                .specs()
                .into_iter()
                .find(|s| s.name == req.service_name)
                .ok_or_else(|| {
                    ProviderError::NotFound(format!(
                        "instance {id} has no service {}",
                        req.service_name
                    ))
                })?;
            if role(&s) == Role::Init {
                return Err(ProviderError::invalid(
                    "service_name",
                    "init services run once and cannot be scaled",
                ));
            }
            vec![s]
        };
        self.cancel_sequence(&id).await;
        let release = inst.release();
        for old in targets {
            let mut new = old.clone();
            let mut r = new.resources.unwrap_or_default();
            if res.cpu_millis > 0 {
                r.cpu_millis = res.cpu_millis;
            }
            if res.memory_mb > 0 {
                r.memory_mb = res.memory_mb;
            }
            if res.disk_mb > 0 {
                r.disk_mb = res.disk_mb;
            }
            let reps = inst.replicas(&old.name);
            let want = if res.replicas > 0 {
                res.replicas as u32
            } else {
                reps.len() as u32
            };
            r.replicas = want as i32;
            new.resources = Some(r);
            let limits = |s: &pb::ServiceSpec| {
                s.resources
                    .as_ref()
                    .map_or((0, 0), |x| (x.cpu_millis, x.memory_mb))
            };
            let secrets = self.secrets(&[&new])?;
            // Fewer: the highest replicas go first.
            for c in reps.iter().filter(|c| c.replica >= want) {
                self.engine
                    .stop(&c.name, grace_secs(self.cfg.stop_grace))
                    .await?;
                self.engine.remove(&c.name).await?;
                self.engine
                    .remove(&self.names.prev_container(&id, &c.service, c.replica))
                    .await?;
            }
            // New limits: the kept replicas without them are recreated one
            // by one (per replica, so a retried Scale finishes the job).
            for c in reps
                .iter()
                .filter(|c| c.replica < want && limits(&c.spec) != limits(&new))
            {
                self.recreate_replica(&inst, c, &new, &release, &secrets, true)
                    .await?;
            }
            // More: new replicas are created and started.
            let have: HashSet<u32> = reps.iter().map(|c| c.replica).collect();
            for n in (0..want).filter(|n| !have.contains(n)) {
                let name = self
                    .create_replica(&inst.meta, &new, n, &release, &secrets)
                    .await?;
                self.engine.start(&name).await?;
            }
        }
        Ok(self.status_of(&self.must_load(&id).await?).await)
    }

    async fn resources(&self, instance_id: &str) -> Result<pb::ResourceUsage> {
        let inst = self.must_load(instance_id).await?;
        usage::collect(&self.engine, &inst).await
    }

    async fn logs(&self, req: pb::StreamLogsRequest) -> Result<LogStream> {
        let inst = self.must_load(&req.instance_id).await?;
        if !req.service_name.is_empty()
            && !inst
                .containers
                .iter()
                .any(|c| c.service == req.service_name)
        {
            return Err(ProviderError::NotFound(format!(
                "instance {} has no service {}",
                req.instance_id, req.service_name
            )));
        }
        logs::stream(self.engine.client().await?, &self.engine, inst, req).await
    }

    async fn exec(&self, req: pb::ExecRequest) -> Result<pb::ExecResponse> {
        let inst = self.must_load(&req.instance_id).await?;
        let c = inst
            .replicas(&req.service_name)
            .into_iter()
            .find(|c| c.replica as i32 == req.replica)
            .ok_or_else(|| {
                ProviderError::NotFound(format!(
                    "instance {} has no replica {} of service {}",
                    req.instance_id, req.replica, req.service_name
                ))
            })?;
        if !c.running() {
            return Err(ProviderError::FailedPrecondition(format!(
                "replica {} of {} is not running",
                c.replica, c.service
            )));
        }
        let timeout = req
            .timeout
            .as_ref()
            .map(|d| Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32))
            .filter(|d| !d.is_zero())
            .unwrap_or(self.cfg.exec_timeout);
        logs::exec(&self.engine, &c.name, req.command, req.stdin, timeout).await
    }

    async fn check_health(&self) -> Result<pb::CheckHealthResponse> {
        match self.engine.version().await {
            Ok(v) => {
                *self
                    .engine_version
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = v.clone();
                let instances = self
                    .engine
                    .networks(&self.names.scope_filter())
                    .await?
                    .len();
                Ok(pb::CheckHealthResponse {
                    healthy: true,
                    message: format!("{v} at {}", self.engine.host()),
                    instances: instances as i32,
                })
            }
            Err(e) => Ok(pb::CheckHealthResponse {
                healthy: false,
                message: e.to_string(),
                instances: 0,
            }),
        }
    }

    async fn list_managed(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListManagedResponse> {
        let mut nets = self.engine.networks(&self.names.scope_filter()).await?;
        nets.sort_by(|a, b| {
            a.labels
                .get(names::INSTANCE)
                .cmp(&b.labels.get(names::INSTANCE))
        });
        let after = ctrlplane_agent::provider::managed_page_start(page_token)?;
        let size = page_size as usize;
        let mut workloads: Vec<pb::ManagedWorkload> = Vec::new();
        let mut next = String::new();
        for n in nets {
            let Some(id) = n.labels.get(names::INSTANCE).cloned() else {
                continue;
            };
            if after.as_ref().is_some_and(|a| id <= *a) {
                continue;
            }
            if let Some(last) = workloads.last().filter(|_| workloads.len() == size) {
                next = ctrlplane_agent::provider::managed_page_token(&last.instance_id);
                break;
            }
            let meta = Meta::from_labels(&n.labels);
            workloads.push(pb::ManagedWorkload {
                instance_id: id,
                labels: meta.labels,
                created_at: n
                    .created
                    .as_deref()
                    .and_then(state::parse_time)
                    .map(state::timestamp),
                tenant_id: meta.tenant_id,
            });
        }
        Ok(pb::ListManagedResponse {
            workloads,
            next_page_token: next,
        })
    }
}
