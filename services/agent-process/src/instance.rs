//! One instance at run time: the init phase, a supervisor per replica, the
//! status derived from both, and re-adoption after an agent restart.
//!
//! Flow of a run (Provision, Start, Restart of the whole instance):
//! 1. config files and file secrets are written under the instance root;
//! 2. inits run one at a time in `depends_on` order, each to completion; a
//!    non-zero exit fails the run (state FAILED, message naming the init)
//!    and nothing else starts;
//! 3. main and sidecars start in `depends_on` order: a service starts once
//!    every replica of each service it depends on is running and ready
//!    (health check passed, or — without a check — alive for
//!    `dependency_settle`); each replica is its own process group under its
//!    own supervisor, restarted with backoff when it ends.
//!
//! Concurrency: API operations on an instance hold its `op` lock, so they
//! never overlap; the runner and the supervisors are tasks that share the
//! state (`St`) behind a short-held mutex with the status readers. Every
//! change that matters after a restart is persisted at once.
//!
//! Re-adoption ([`Instance::adopt`]): a replica whose recorded group leader
//! is still alive (pid and start time match) is watched again, and its
//! output pipes are drained again; one whose process ended while the agent
//! was down is restarted after the backoff and counted as a restart; a run
//! whose inits had not all completed is started over (its leftovers
//! killed), since an init's exit code cannot be learnt after the fact; a
//! stopped instance has any leftovers killed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ctrlplane_agent::ProviderError;
use ctrlplane_proto::provider::v1 as pb;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::AgentConfig;
use crate::health;
use crate::logs::{self, Sink};
use crate::model::{
    Desired, InstanceRecord, PortAlloc, ProcRef, ReplicaKey, Role, RunRecord, dependency_order,
    now_ms, replicas, role, timestamp,
};
use crate::ports;
use crate::process::{self, Exit, OsProc, Processes, SpawnError};
use crate::procfs;
use crate::state::Store;
use crate::supervisor::{
    Control, Launch, LaunchError, Observer, Start, Supervised, stop_requested, supervise,
};
use crate::workdir;

/// How often waits on replica state re-check it.
const POLL: Duration = Duration::from_millis(50);

/// What every instance shares: configuration, the state directory, the
/// process registry and the agent's lifetime.
#[derive(Debug)]
pub struct Shared {
    /// Configuration.
    pub cfg: AgentConfig,
    /// The state directory.
    pub store: Store,
    /// Every process group the agent is responsible for.
    pub procs: Arc<Processes>,
    /// Fires on agent shutdown: tasks end, processes keep running.
    pub detach: CancellationToken,
    /// Every task the agent spawned.
    pub tracker: TaskTracker,
    /// Host ports handed out.
    pub taken_ports: Mutex<HashSet<i32>>,
    /// The environment every process starts from.
    pub base_env: Vec<(String, String)>,
}

impl Shared {
    fn release_ports(&self, allocs: &[PortAlloc]) {
        let mut taken = self.taken_ports.lock().unwrap_or_else(|e| e.into_inner());
        for a in allocs {
            taken.remove(&a.host);
        }
    }
}

/// Where a replica is in its life.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    Starting,
    Running,
    Exited,
    Backoff,
    Failed(String),
    Stopped,
}

#[derive(Debug)]
struct ReplicaRt {
    phase: Phase,
    ready: bool,
    has_check: bool,
    pid: Option<i32>,
    running_since: Option<Instant>,
    message: String,
    stop: watch::Sender<Option<Duration>>,
    task: Option<JoinHandle<()>>,
    probe: Option<CancellationToken>,
}

impl ReplicaRt {
    /// Running, ready, and (without a health check) up for `settle`.
    fn settled(&self, settle: Duration) -> bool {
        self.phase == Phase::Running
            && self.ready
            && (self.has_check || self.running_since.is_some_and(|t| t.elapsed() >= settle))
    }
}

#[derive(Debug)]
struct Runner {
    stop: watch::Sender<Option<Duration>>,
    task: JoinHandle<()>,
}

#[derive(Debug)]
struct St {
    rec: InstanceRecord,
    gone: bool,
    init_running: Option<String>,
    runner: Option<Runner>,
    launched: BTreeSet<String>,
    replicas: BTreeMap<ReplicaKey, ReplicaRt>,
    cpu: HashMap<ReplicaKey, (std::time::Instant, i32, u64)>,
}

/// One instance.
#[derive(Debug)]
pub struct Instance {
    /// The instance id.
    pub id: String,
    /// The instance root.
    pub root: PathBuf,
    shared: Arc<Shared>,
    op: Arc<tokio::sync::Mutex<()>>,
    st: Mutex<St>,
    sinks: Mutex<HashMap<ReplicaKey, Arc<Sink>>>,
}

impl Instance {
    /// An instance for a record (nothing is started).
    pub fn new(shared: Arc<Shared>, rec: InstanceRecord) -> Arc<Instance> {
        {
            let mut taken = shared.taken_ports.lock().unwrap_or_else(|e| e.into_inner());
            taken.extend(rec.ports.values().flatten().map(|a| a.host));
        }
        Arc::new(Instance {
            id: rec.instance_id.clone(),
            root: shared.store.instance_root(&rec.instance_id),
            shared,
            op: Arc::new(tokio::sync::Mutex::new(())),
            st: Mutex::new(St {
                rec,
                gone: false,
                init_running: None,
                runner: None,
                launched: BTreeSet::new(),
                replicas: BTreeMap::new(),
                cpu: HashMap::new(),
            }),
            sinks: Mutex::new(HashMap::new()),
        })
    }

    /// Takes the lock that serialises API operations on this instance.
    pub async fn op_lock(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.op.clone().lock_owned().await
    }

    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn persist(&self, st: &St) {
        if st.gone {
            return;
        }
        if let Err(e) = self.shared.store.save(&st.rec) {
            tracing::error!(instance = %self.id, error = %e, "cannot save the instance record");
        }
    }

    /// A copy of the record.
    pub fn record(&self) -> InstanceRecord {
        self.lock().rec.clone()
    }

    /// Whether the instance was deprovisioned.
    pub fn is_gone(&self) -> bool {
        self.lock().gone
    }

    /// Changes the record and persists it.
    pub fn update(&self, f: impl FnOnce(&mut InstanceRecord)) {
        let mut st = self.lock();
        f(&mut st.rec);
        self.persist(&st);
    }

    fn sink(&self, key: &ReplicaKey) -> Arc<Sink> {
        let mut sinks = self.sinks.lock().unwrap_or_else(|e| e.into_inner());
        sinks
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(Sink::new(
                    workdir::logs_dir(&self.root).join(format!("{}.log", key.stem())),
                    self.shared.cfg.log_max_bytes,
                ))
            })
            .clone()
    }

    // ---- runs -----------------------------------------------------------

    /// Begins a new run: inits, then main and sidecars. The caller holds
    /// `op` and has stopped any previous run.
    pub fn begin_run(self: &Arc<Self>) {
        let (tx, rx) = watch::channel(None);
        let mut st = self.lock();
        st.rec.run = RunRecord {
            started_at_ms: now_ms(),
            ..RunRecord::default()
        };
        for r in st.rec.replicas.values_mut() {
            r.last_exit = None;
        }
        st.launched.clear();
        self.persist(&st);
        let task = self.shared.tracker.spawn(self.clone().runner(rx));
        st.runner = Some(Runner { stop: tx, task });
    }

    fn fail(&self, message: String) {
        tracing::warn!(instance = %self.id, %message, "run failed");
        let mut st = self.lock();
        st.rec.run.failure = Some(message);
        self.persist(&st);
    }

    async fn runner(self: Arc<Self>, mut stop: watch::Receiver<Option<Duration>>) {
        let detach = self.shared.detach.clone();
        let specs = self.lock().rec.services.clone();
        if let Err(e) = workdir::write_files(&self.root, &self.shared.store.secrets_dir(), &specs) {
            self.fail(e);
            return;
        }

        for idx in dependency_order(&specs, |s| role(s) == Role::Init) {
            let name = specs[idx].name.clone();
            let launcher = ReplicaLauncher {
                inst: self.clone(),
                key: ReplicaKey::new(&name, 0),
            };
            let mut proc = match launcher.launch().await {
                Ok(p) => p,
                Err(LaunchError::Halted) => return,
                Err(LaunchError::Failed(e)) => {
                    self.fail(format!("init service {name:?} could not start: {e}"));
                    return;
                }
            };
            {
                let mut st = self.lock();
                st.rec.run.init_proc = Some((name.clone(), proc.proc.proc_ref()));
                st.init_running = Some(name.clone());
                self.persist(&st);
            }
            let exit = tokio::select! {
                biased;
                () = detach.cancelled() => return,
                grace = stop_requested(&mut stop) => {
                    proc.terminate(grace).await;
                    let mut st = self.lock();
                    st.rec.run.init_proc = None;
                    st.init_running = None;
                    self.persist(&st);
                    return;
                }
                exit = proc.wait() => {
                    proc.cleanup();
                    exit
                }
            };
            let mut st = self.lock();
            st.rec.run.init_proc = None;
            st.init_running = None;
            st.rec.run.inits.insert(name.clone(), exit.code());
            if !exit.success() {
                let message = format!("init service {name:?} {exit}");
                tracing::warn!(instance = %self.id, %message, "run failed");
                st.rec.run.failure = Some(message);
                self.persist(&st);
                return;
            }
            self.persist(&st);
        }
        {
            let mut st = self.lock();
            st.rec.run.inits_done = true;
            self.persist(&st);
        }

        for idx in dependency_order(&specs, |s| role(s) != Role::Init) {
            let name = &specs[idx].name;
            loop {
                if stop.borrow().is_some() || detach.is_cancelled() {
                    return;
                }
                if self.deps_started(&name.clone()) {
                    break;
                }
                tokio::select! {
                    () = detach.cancelled() => return,
                    _ = stop_requested(&mut stop) => return,
                    () = tokio::time::sleep(POLL) => {}
                }
            }
            let mut st = self.lock();
            self.launch_service(&mut st, name);
        }
    }

    fn deps_started(&self, service: &str) -> bool {
        let settle = self.shared.cfg.dependency_settle;
        let st = self.lock();
        let Some(spec) = st.rec.service(service) else {
            return true;
        };
        spec.depends_on.iter().all(|dep| {
            let Some(dspec) = st.rec.service(dep) else {
                return true;
            };
            if role(dspec) == Role::Init {
                return true;
            }
            st.launched.contains(dep)
                && (0..replicas(dspec)).all(|r| {
                    st.replicas
                        .get(&ReplicaKey::new(dep.as_str(), r))
                        .is_some_and(|rt| rt.settled(settle))
                })
        })
    }

    fn launch_service(self: &Arc<Self>, st: &mut St, name: &str) {
        let Some(spec) = st.rec.service(name) else {
            return;
        };
        let n = replicas(spec);
        st.launched.insert(name.to_string());
        for r in 0..n {
            let key = ReplicaKey::new(name, r);
            if !st.replicas.contains_key(&key) {
                self.start_replica(st, key, Start::Fresh);
            }
        }
    }

    fn ensure_ports(&self, st: &mut St, key: &ReplicaKey) {
        if st.rec.ports.contains_key(&key.to_string()) {
            return;
        }
        let Some(spec) = st.rec.service(&key.service) else {
            return;
        };
        let mut taken = self
            .shared
            .taken_ports
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match ports::allocate(&spec.ports, &mut taken) {
            Ok(allocs) => {
                st.rec.ports.insert(key.to_string(), allocs);
            }
            Err(e) => {
                tracing::error!(instance = %self.id, replica = %key, error = %e, "cannot allocate host ports");
            }
        }
    }

    /// Allocates the host ports of every replica the specs ask for.
    pub fn allocate_all_ports(&self) {
        let mut st = self.lock();
        let keys: Vec<ReplicaKey> = st
            .rec
            .services
            .iter()
            .flat_map(|s| (0..replicas(s)).map(|r| ReplicaKey::new(s.name.as_str(), r)))
            .collect();
        for key in keys {
            self.ensure_ports(&mut st, &key);
        }
        self.persist(&st);
    }

    fn start_replica(self: &Arc<Self>, st: &mut St, key: ReplicaKey, start: Start<Managed>) {
        self.ensure_ports(st, &key);
        let (tx, rx) = watch::channel(None);
        let ctl = Control {
            stop: rx,
            detach: self.shared.detach.clone(),
        };
        let inst = self.clone();
        let k = key.clone();
        let backoff = self.shared.cfg.backoff;
        let task = self.shared.tracker.spawn(async move {
            let launcher = ReplicaLauncher {
                inst: inst.clone(),
                key: k.clone(),
            };
            let observer = ReplicaObserver { inst, key: k };
            supervise(&launcher, backoff, start, ctl, &observer).await;
        });
        st.replicas.insert(
            key,
            ReplicaRt {
                phase: Phase::Starting,
                ready: false,
                has_check: false,
                pid: None,
                running_since: None,
                message: String::new(),
                stop: tx,
                task: Some(task),
                probe: None,
            },
        );
    }

    /// Stops the run: the runner (killing a running init) and every
    /// replica, each group getting `grace` after SIGTERM.
    pub async fn stop_all(self: &Arc<Self>, grace: Duration) {
        let runner = self.lock().runner.take();
        if let Some(r) = runner {
            let _ = r.stop.send(Some(grace));
            let _ = r.task.await;
        }
        let keys: Vec<ReplicaKey> = self.lock().replicas.keys().cloned().collect();
        self.stop_replicas(keys, grace).await;
        let leftovers = {
            let mut st = self.lock();
            st.launched.clear();
            st.init_running = None;
            let mut procs = Vec::new();
            if let Some((_, p)) = st.rec.run.init_proc.take() {
                procs.push(p);
            }
            for r in st.rec.replicas.values_mut() {
                procs.extend(r.proc.take());
            }
            self.persist(&st);
            procs
        };
        for p in leftovers {
            kill_group(&self.shared.procs, &p);
        }
    }

    /// Stops some replicas (in parallel) and forgets their supervisors.
    pub async fn stop_replicas(self: &Arc<Self>, keys: Vec<ReplicaKey>, grace: Duration) {
        let tasks: Vec<JoinHandle<()>> = {
            let mut st = self.lock();
            keys.iter()
                .filter_map(|k| {
                    let rt = st.replicas.get_mut(k)?;
                    let _ = rt.stop.send(Some(grace));
                    rt.task.take()
                })
                .collect()
        };
        futures::future::join_all(tasks).await;
        let mut st = self.lock();
        for k in &keys {
            if let Some(rt) = st.replicas.remove(k)
                && let Some(p) = rt.probe
            {
                p.cancel();
            }
        }
    }

    /// Whether a run is in progress or its services are supervised.
    pub fn active(&self) -> bool {
        let st = self.lock();
        st.runner.as_ref().is_some_and(|r| !r.task.is_finished()) || !st.replicas.is_empty()
    }

    /// Waits until a replica is settled (see `dependency_settle`) or the
    /// deadline passes.
    pub async fn wait_settled(&self, key: &ReplicaKey, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let settle = self.shared.cfg.dependency_settle;
        loop {
            if self
                .lock()
                .replicas
                .get(key)
                .is_some_and(|rt| rt.settled(settle))
            {
                return true;
            }
            if Instant::now() >= deadline || self.shared.detach.is_cancelled() {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Restarts the replicas of the named services one by one (or all at
    /// once with `recreate`), each new replica having to settle within the
    /// rollout timeout before the next is replaced. Services not yet
    /// launched pick up their new spec when they start.
    ///
    /// # Errors
    /// `DeadlineExceeded` naming the replica that did not become ready
    /// (the rollout stops there).
    pub async fn roll(
        self: &Arc<Self>,
        services: &[String],
        recreate: bool,
    ) -> Result<(), ProviderError> {
        let grace = self.shared.cfg.stop_grace;
        let timeout = self.shared.cfg.rollout_timeout;
        let specs = self.lock().rec.services.clone();
        for idx in dependency_order(&specs, |s| role(s) != Role::Init) {
            let name = &specs[idx].name;
            if !services.contains(name) {
                continue;
            }
            let keys: Vec<ReplicaKey> = {
                let st = self.lock();
                if !st.launched.contains(name) || st.rec.desired != Desired::Running {
                    continue;
                }
                st.replicas
                    .keys()
                    .filter(|k| k.service == *name)
                    .cloned()
                    .collect()
            };
            let batches: Vec<Vec<ReplicaKey>> = if recreate {
                vec![keys]
            } else {
                keys.into_iter().map(|k| vec![k]).collect()
            };
            for batch in batches {
                self.stop_replicas(batch.clone(), grace).await;
                {
                    let mut st = self.lock();
                    for key in &batch {
                        self.start_replica(&mut st, key.clone(), Start::Fresh);
                    }
                }
                for key in &batch {
                    if !self.wait_settled(key, timeout).await {
                        return Err(ProviderError::DeadlineExceeded(format!(
                            "replica {} of service {:?} did not become ready within {}s; the rollout stopped there",
                            key.replica,
                            key.service,
                            timeout.as_secs()
                        )));
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies new resources to services and adds or removes replicas of
    /// the running ones (removed replicas are stopped from the highest
    /// index down; their volumes stay).
    pub async fn scale(self: &Arc<Self>, services: &[String], res: &pb::ResourceSpec) {
        let mut to_stop = Vec::new();
        {
            let mut st = self.lock();
            for name in services {
                let Some(spec) = st.rec.services.iter_mut().find(|s| s.name == *name) else {
                    continue;
                };
                let r = spec.resources.get_or_insert_with(Default::default);
                for (field, value) in [
                    (&mut r.cpu_millis, res.cpu_millis),
                    (&mut r.memory_mb, res.memory_mb),
                    (&mut r.disk_mb, res.disk_mb),
                    (&mut r.replicas, res.replicas),
                    (&mut r.gpu, res.gpu),
                ] {
                    if value > 0 {
                        *field = value;
                    }
                }
                let n = replicas(spec);
                let running = st.launched.contains(name) && st.rec.desired == Desired::Running;
                if running {
                    for r in 0..n {
                        let key = ReplicaKey::new(name.as_str(), r);
                        if !st.replicas.contains_key(&key) {
                            self.start_replica(&mut st, key, Start::Fresh);
                        }
                    }
                }
                to_stop.extend(
                    st.replicas
                        .keys()
                        .filter(|k| k.service == *name && k.replica >= n)
                        .cloned(),
                );
            }
            self.persist(&st);
        }
        to_stop.sort_by(|a, b| b.cmp(a));
        self.stop_replicas(to_stop, self.shared.cfg.stop_grace)
            .await;
        let released = {
            let mut st = self.lock();
            let mut released = Vec::new();
            let counts: HashMap<String, u32> = st
                .rec
                .services
                .iter()
                .map(|s| (s.name.clone(), replicas(s)))
                .collect();
            let beyond = |k: &str| {
                ReplicaKey::parse(k)
                    .is_some_and(|k| counts.get(&k.service).is_some_and(|n| k.replica >= *n))
            };
            st.rec.replicas.retain(|k, _| !beyond(k));
            let gone: Vec<String> = st.rec.ports.keys().filter(|k| beyond(k)).cloned().collect();
            for k in gone {
                released.extend(st.rec.ports.remove(&k).unwrap_or_default());
            }
            self.persist(&st);
            released
        };
        self.shared.release_ports(&released);
    }

    /// Removes everything: stops the run, kills whatever the record still
    /// names, deletes the instance root, then the record. Repeat-safe.
    pub async fn destroy(self: &Arc<Self>) {
        self.update(|rec| rec.deleting = true);
        self.stop_all(self.shared.cfg.stop_grace).await;
        for p in self.record().procs() {
            kill_group(&self.shared.procs, &p);
        }
        if let Err(e) = self.shared.store.remove_root(&self.id) {
            tracing::error!(instance = %self.id, error = %e, "cannot remove the instance root");
        }
        let mut st = self.lock();
        if let Err(e) = self.shared.store.remove(&self.id) {
            tracing::error!(instance = %self.id, error = %e, "cannot remove the instance record");
        }
        st.gone = true;
        let allocs: Vec<PortAlloc> = st.rec.ports.values().flatten().cloned().collect();
        drop(st);
        self.shared.release_ports(&allocs);
    }

    /// Takes over after an agent restart; see the module docs.
    pub fn adopt(self: &Arc<Self>) {
        let mut st = self.lock();
        let rec = st.rec.clone();
        if rec.deleting {
            return;
        }
        let kill_all = |st: &mut St| {
            if let Some((_, p)) = st.rec.run.init_proc.take() {
                kill_group(&self.shared.procs, &p);
            }
            for r in st.rec.replicas.values_mut() {
                if let Some(p) = r.proc.take() {
                    kill_group(&self.shared.procs, &p);
                }
            }
        };
        if rec.desired == Desired::Stopped || rec.run.failure.is_some() {
            kill_all(&mut st);
            self.persist(&st);
            return;
        }
        if !rec.run.inits_done {
            tracing::info!(instance = %self.id, "the agent stopped during the init phase: starting the run over");
            kill_all(&mut st);
            drop(st);
            self.begin_run();
            return;
        }
        if let Some((_, p)) = st.rec.run.init_proc.take() {
            kill_group(&self.shared.procs, &p);
        }
        let mut adopted = 0;
        let mut restarting = 0;
        for idx in dependency_order(&rec.services, |s| role(s) != Role::Init) {
            let name = rec.services[idx].name.as_str();
            st.launched.insert(name.to_string());
            for r in 0..replicas(&rec.services[idx]) {
                let key = ReplicaKey::new(name, r);
                let recorded = rec.replicas.get(&key.to_string()).and_then(|x| x.proc);
                let start = match recorded {
                    Some(p)
                        if procfs::alive(p.pid, p.start_ticks) && self.shared.procs.adopt(p) =>
                    {
                        logs::start_pumps(
                            &self.shared.tracker,
                            &workdir::run_dir(&self.root),
                            &key.stem(),
                            self.sink(&key),
                            self.shared.detach.child_token(),
                        );
                        adopted += 1;
                        Start::Adopt(Managed {
                            proc: OsProc::Adopted(p),
                            procs: self.shared.procs.clone(),
                        })
                    }
                    Some(p) => {
                        kill_group(&self.shared.procs, &p);
                        st.rec.replica_mut(&key).proc = None;
                        restarting += 1;
                        Start::Ended(Exit::WhileDown)
                    }
                    // Ended before the agent stopped and was waiting to be
                    // restarted.
                    None if rec
                        .replicas
                        .get(&key.to_string())
                        .is_some_and(|x| x.last_exit.is_some()) =>
                    {
                        restarting += 1;
                        Start::Restart
                    }
                    None => Start::Fresh,
                };
                self.start_replica(&mut st, key, start);
            }
        }
        // Replicas beyond the desired count (a scale-down cut short).
        let extra: Vec<String> = st
            .rec
            .replicas
            .keys()
            .filter(|k| ReplicaKey::parse(k).is_none_or(|key| !st.replicas.contains_key(&key)))
            .cloned()
            .collect();
        for k in extra {
            if let Some(p) = st.rec.replicas.remove(&k).and_then(|r| r.proc) {
                kill_group(&self.shared.procs, &p);
            }
        }
        self.persist(&st);
        tracing::info!(instance = %self.id, adopted, restarting, "re-adopted instance");
    }

    // ---- views ------------------------------------------------------------

    /// The instance's status.
    pub fn status(&self) -> pb::InstanceStatus {
        let st = self.lock();
        let rec = &st.rec;
        let stopped = rec.desired == Desired::Stopped;
        let mut services = HashMap::new();
        let mut endpoints = Vec::new();
        let mut restarts = 0i32;
        let mut all_ready = true;
        let mut all_running = true;
        let mut any_failed = None;
        let mut any_stopping = false;
        let mut first_message = None;
        for spec in &rec.services {
            let mut s = pb::ServiceStatus {
                name: spec.name.clone(),
                replicas: replicas(spec) as i32,
                ..Default::default()
            };
            if role(spec) == Role::Init {
                s.replicas = 1;
                let (state, message) = match rec.run.inits.get(&spec.name) {
                    Some(0) => (pb::InstanceState::Stopped, "completed".to_string()),
                    Some(code) => {
                        s.exit_code = *code;
                        (
                            pb::InstanceState::Failed,
                            format!("exited with code {code}"),
                        )
                    }
                    None if st.init_running.as_deref() == Some(spec.name.as_str()) => {
                        (pb::InstanceState::Running, "running".to_string())
                    }
                    None if stopped || rec.run.failure.is_some() => {
                        (pb::InstanceState::Stopped, "not run".to_string())
                    }
                    None => (pb::InstanceState::Starting, "waiting to run".to_string()),
                };
                s.state = state as i32;
                s.message = message;
                services.insert(spec.name.clone(), s);
                continue;
            }
            let n = replicas(spec);
            let mut running = 0;
            let mut ready = 0;
            let mut failed = None;
            let mut message = None;
            let mut alive = false;
            for r in 0..n {
                let key = ReplicaKey::new(spec.name.as_str(), r);
                if let Some(rr) = rec.replicas.get(&key.to_string()) {
                    s.restarts += rr.restarts as i32;
                }
                if let Some(allocs) = rec.ports.get(&key.to_string()) {
                    endpoints.extend(ports::endpoints(&key, allocs));
                }
                let Some(rt) = st.replicas.get(&key) else {
                    continue;
                };
                alive |= rt.pid.is_some();
                match &rt.phase {
                    Phase::Running => {
                        running += 1;
                        if rt.ready {
                            ready += 1;
                        }
                    }
                    Phase::Failed(e) => failed = Some(format!("replica {r}: {e}")),
                    _ => {}
                }
                if message.is_none() && !rt.message.is_empty() {
                    message = Some(format!("replica {r}: {}", rt.message));
                }
            }
            s.ready_replicas = ready;
            s.ready = ready == n as i32;
            let state = if stopped {
                if alive || st.replicas.keys().any(|k| k.service == spec.name) {
                    any_stopping = true;
                    pb::InstanceState::Stopping
                } else {
                    pb::InstanceState::Stopped
                }
            } else if running == n {
                pb::InstanceState::Running
            } else if let Some(f) = failed {
                message = Some(f);
                pb::InstanceState::Failed
            } else {
                pb::InstanceState::Starting
            };
            if state == pb::InstanceState::Failed {
                any_failed = Some(format!(
                    "service {:?}: {}",
                    spec.name,
                    message.clone().unwrap_or_default()
                ));
            }
            all_running &= state == pb::InstanceState::Running;
            all_ready &= s.ready;
            s.state = state as i32;
            s.message = message.clone().unwrap_or_else(|| {
                match state {
                    pb::InstanceState::Running => "running",
                    pb::InstanceState::Stopped => "stopped",
                    pb::InstanceState::Stopping => "stopping",
                    _ if !rec.run.inits_done => "waiting for init services",
                    _ if !st.launched.contains(&spec.name) => "waiting for its dependencies",
                    _ => "starting",
                }
                .to_string()
            });
            if first_message.is_none()
                && let Some(m) = message
            {
                first_message = Some(format!("service {:?} {m}", spec.name));
            }
            restarts += s.restarts;
            services.insert(spec.name.clone(), s);
        }
        let (state, message) = if rec.deleting {
            (pb::InstanceState::Destroying, "deprovisioning".to_string())
        } else if stopped {
            if any_stopping {
                (pb::InstanceState::Stopping, "stopping".to_string())
            } else {
                (pb::InstanceState::Stopped, "stopped".to_string())
            }
        } else if let Some(f) = &rec.run.failure {
            (pb::InstanceState::Failed, f.clone())
        } else if let Some(f) = any_failed {
            (pb::InstanceState::Failed, f)
        } else if rec.run.inits_done && all_running {
            (pb::InstanceState::Running, "running".to_string())
        } else if !rec.run.inits_done {
            let m = match &st.init_running {
                Some(name) => format!("running init service {name:?}"),
                None => "running init services".to_string(),
            };
            (pb::InstanceState::Starting, m)
        } else {
            (
                pb::InstanceState::Starting,
                first_message.unwrap_or_else(|| "starting".to_string()),
            )
        };
        let mut metadata = HashMap::new();
        metadata.insert("root".to_string(), self.root.display().to_string());
        metadata.insert("release".to_string(), rec.release.clone());
        pb::InstanceStatus {
            instance_id: rec.instance_id.clone(),
            state: state as i32,
            ready: state == pb::InstanceState::Running && all_ready,
            restarts,
            started_at: (rec.run.started_at_ms > 0).then(|| timestamp(rec.run.started_at_ms)),
            message,
            endpoints,
            services,
            metadata,
        }
    }

    /// The endpoints of every main and sidecar replica.
    pub fn endpoints(&self) -> Vec<pb::Endpoint> {
        let st = self.lock();
        let mut out = Vec::new();
        for spec in &st.rec.services {
            if role(spec) == Role::Init {
                continue;
            }
            for r in 0..replicas(spec) {
                let key = ReplicaKey::new(spec.name.as_str(), r);
                if let Some(allocs) = st.rec.ports.get(&key.to_string()) {
                    out.extend(ports::endpoints(&key, allocs));
                }
            }
        }
        out
    }

    /// The environment and working directory a process of a replica gets
    /// (for Exec).
    ///
    /// # Errors
    /// Unknown service or replica; an unreadable secret.
    pub fn exec_context(
        &self,
        service: &str,
        replica: u32,
    ) -> Result<health::CommandContext, ProviderError> {
        let st = self.lock();
        let spec = st.rec.service(service).ok_or_else(|| {
            ProviderError::NotFound(format!("instance {} has no service {service:?}", self.id))
        })?;
        let n = replicas(spec);
        if replica >= n {
            return Err(ProviderError::invalid(
                "replica",
                format!("service {service:?} has {n} replica(s) (0-{})", n - 1),
            ));
        }
        self.context_in(&st, &ReplicaKey::new(service, replica))
            .map_err(ProviderError::FailedPrecondition)
    }

    /// Current CPU and memory use of every process group, and disk use of
    /// the instance root. CPU is averaged since the previous sample of the
    /// same process (at least a second ago), else over its lifetime.
    pub fn resources(&self) -> pb::ResourceUsage {
        let clk = procfs::clock_ticks() as f64;
        let page = procfs::page_size();
        let uptime = procfs::uptime_secs().unwrap_or(0.0);
        let now = std::time::Instant::now();
        let mut st = self.lock();
        let mut groups: Vec<(ReplicaKey, ProcRef)> = st
            .rec
            .replicas
            .iter()
            .filter_map(|(k, r)| Some((ReplicaKey::parse(k)?, r.proc?)))
            .collect();
        if let Some((name, p)) = &st.rec.run.init_proc {
            groups.push((ReplicaKey::new(name.as_str(), 0), *p));
        }
        let mut usage = pb::ResourceUsage {
            sample_time: Some(timestamp(now_ms())),
            ..Default::default()
        };
        let all: Vec<procfs::Stat> = procfs::all_processes()
            .into_iter()
            .filter(procfs::Stat::running)
            .collect();
        for (key, p) in groups {
            let members: Vec<&procfs::Stat> = all
                .iter()
                .filter(|m| m.pgrp == p.pid && m.start_ticks >= p.start_ticks)
                .collect();
            if members.is_empty() {
                continue;
            }
            let ticks: u64 = members.iter().map(|m| m.utime + m.stime).sum();
            let rss: u64 = members.iter().map(|m| m.rss_pages * page).sum();
            let lifetime = (uptime - p.start_ticks as f64 / clk).max(0.001);
            let mut cpu = ticks as f64 / clk / lifetime * 100.0;
            match st.cpu.get(&key) {
                Some((t, pid, prev))
                    if *pid == p.pid && now.duration_since(*t).as_secs_f64() >= 1.0 =>
                {
                    let secs = now.duration_since(*t).as_secs_f64();
                    cpu = ticks.saturating_sub(*prev) as f64 / clk / secs * 100.0;
                    st.cpu.insert(key.clone(), (now, p.pid, ticks));
                }
                Some((_, pid, _)) if *pid == p.pid => {}
                _ => {
                    st.cpu.insert(key.clone(), (now, p.pid, ticks));
                }
            }
            let mut disk =
                logs::file_len(&workdir::logs_dir(&self.root).join(format!("{}.log", key.stem())));
            if let Some(spec) = st.rec.service(&key.service) {
                for v in &spec.volumes {
                    disk += procfs::disk_usage(&workdir::volume_dir(
                        &self.root,
                        st.rec.stateful(),
                        &v.name,
                        key.replica,
                    ));
                }
            }
            usage.cpu_percent += cpu;
            usage.memory_bytes += rss as i64;
            usage.services.push(pb::ServiceUsage {
                service_name: key.service.clone(),
                replica: key.replica as i32,
                cpu_percent: cpu,
                memory_bytes: rss as i64,
                disk_bytes: disk as i64,
            });
        }
        drop(st);
        usage.disk_bytes = procfs::disk_usage(&self.root) as i64;
        usage
    }
}

/// Kills a group (and forgets it) if anything of it still runs.
fn kill_group(procs: &Processes, p: &ProcRef) {
    if process::group_alive(p) {
        process::signal_group(p, Signal::SIGKILL);
    }
    procs.forget(p);
}

/// A process of an instance under supervision.
#[derive(Debug)]
pub struct Managed {
    proc: OsProc,
    procs: Arc<Processes>,
}

impl Supervised for Managed {
    async fn wait(&mut self) -> Exit {
        self.proc.wait().await
    }

    async fn terminate(&mut self, grace: Duration) -> Exit {
        let p = self.proc.proc_ref();
        let exit = process::terminate(&p, grace, self.proc.wait()).await;
        self.procs.forget(&p);
        exit
    }

    fn cleanup(&mut self) {
        let p = self.proc.proc_ref();
        process::signal_group(&p, Signal::SIGKILL);
        self.procs.forget(&p);
    }
}

struct ReplicaLauncher {
    inst: Arc<Instance>,
    key: ReplicaKey,
}

impl Launch for ReplicaLauncher {
    type Proc = Managed;

    async fn launch(&self) -> Result<Managed, LaunchError> {
        let inst = &self.inst;
        let shared = &inst.shared;
        let failed = |e: String| LaunchError::Failed(e);
        let (spec, allocs, stateful) = {
            let st = inst.lock();
            (
                st.rec.service(&self.key.service).cloned(),
                st.rec
                    .ports
                    .get(&self.key.to_string())
                    .cloned()
                    .unwrap_or_default(),
                st.rec.stateful(),
            )
        };
        let spec = spec.ok_or_else(|| failed("the service no longer exists".to_string()))?;
        let program = spec
            .command
            .first()
            .ok_or_else(|| failed("the service has no command".to_string()))?;
        let volumes = workdir::ensure_volumes(&inst.root, stateful, &spec, self.key.replica)
            .map_err(|e| failed(format!("cannot create volume directories: {e}")))?;
        let who = workdir::Identity {
            instance_id: &inst.id,
            root: &inst.root,
            replica: self.key.replica,
        };
        let env = workdir::process_env(
            &shared.base_env,
            &who,
            &spec,
            &allocs,
            &volumes,
            &shared.store.secrets_dir(),
        )
        .map_err(failed)?;
        let run_dir = workdir::run_dir(&inst.root);
        let stem = self.key.stem();
        let (out, err) = logs::create_pipes(&run_dir, &stem)
            .map_err(|e| failed(format!("cannot create output pipes: {e}")))?;
        // Open the reading ends while this side still holds a writer, so
        // output of a process that exits at once is not lost.
        logs::start_pumps(
            &shared.tracker,
            &run_dir,
            &stem,
            inst.sink(&self.key),
            shared.detach.child_token(),
        );
        let mut cmd = tokio::process::Command::new(program);
        cmd.args(&spec.command[1..])
            .args(&spec.args)
            .env_clear()
            .envs(env)
            .current_dir(&inst.root)
            .stdin(std::process::Stdio::null())
            .stdout(out)
            .stderr(err);
        let spawned = shared.procs.spawn(&mut cmd);
        // Drops this side's writers: the pumps now end with the process.
        drop(cmd);
        match spawned {
            Ok((child, p)) => {
                tracing::debug!(instance = %inst.id, replica = %self.key, pid = p.pid, "started");
                Ok(Managed {
                    proc: OsProc::Child(child, p),
                    procs: shared.procs.clone(),
                })
            }
            Err(SpawnError::Halted) => Err(LaunchError::Halted),
            Err(e) => Err(failed(e.to_string())),
        }
    }
}

struct ReplicaObserver {
    inst: Arc<Instance>,
    key: ReplicaKey,
}

impl ReplicaObserver {
    fn with(&self, f: impl FnOnce(&mut St, &mut ReplicaRt)) {
        let mut st = self.inst.lock();
        let Some(mut rt) = st.replicas.remove(&self.key) else {
            return;
        };
        f(&mut st, &mut rt);
        st.replicas.insert(self.key.clone(), rt);
        self.inst.persist(&st);
    }
}

impl Observer<Managed> for ReplicaObserver {
    fn started(&self, proc: &Managed, restart: bool) {
        let p = proc.proc.proc_ref();
        let inst = self.inst.clone();
        let key = self.key.clone();
        self.with(|st, rt| {
            rt.phase = Phase::Running;
            rt.pid = Some(p.pid);
            rt.running_since = Some(Instant::now());
            rt.message.clear();
            let record = st.rec.replica_mut(&key);
            record.proc = Some(p);
            if restart {
                record.restarts += 1;
            }
            let allocs = st
                .rec
                .ports
                .get(&key.to_string())
                .cloned()
                .unwrap_or_default();
            let plan = st
                .rec
                .service(&key.service)
                .and_then(|s| health::plan(s.health_check.as_ref(), &allocs));
            rt.has_check = plan.is_some();
            rt.ready = plan.is_none();
            if let Some(old) = rt.probe.take() {
                old.cancel();
            }
            if let Some(plan) = plan {
                let Ok(ctx) = inst.context_in(st, &key) else {
                    return;
                };
                let token = inst.shared.detach.child_token();
                rt.probe = Some(token.clone());
                let procs = inst.shared.procs.clone();
                let target = inst.clone();
                let k = key.clone();
                let pid = p.pid;
                inst.shared
                    .tracker
                    .spawn(health::run(plan, ctx, procs, token, move |ready| {
                        let mut st = target.lock();
                        if let Some(rt) = st.replicas.get_mut(&k)
                            && rt.pid == Some(pid)
                        {
                            rt.ready = ready;
                        }
                    }));
            }
        });
    }

    fn exited(&self, exit: Exit, ran: Duration) {
        let key = self.key.clone();
        tracing::info!(instance = %self.inst.id, replica = %key, %exit, ran = ?ran, "process ended");
        self.with(|st, rt| {
            rt.phase = Phase::Exited;
            rt.ready = false;
            rt.pid = None;
            rt.running_since = None;
            if let Some(p) = rt.probe.take() {
                p.cancel();
            }
            let record = st.rec.replica_mut(&key);
            record.proc = None;
            record.last_exit = Some(exit.to_string());
        });
    }

    fn launch_failed(&self, error: &str) {
        let key = self.key.clone();
        tracing::warn!(instance = %self.inst.id, replica = %key, error, "cannot start");
        self.with(|st, rt| {
            rt.phase = Phase::Failed(error.to_string());
            st.rec.replica_mut(&key).last_exit = Some(error.to_string());
        });
    }

    fn backing_off(&self, delay: Duration) {
        let key = self.key.clone();
        self.with(|st, rt| {
            let last = st
                .rec
                .replica_mut(&key)
                .last_exit
                .clone()
                .unwrap_or_default();
            if !matches!(rt.phase, Phase::Failed(_)) {
                rt.phase = Phase::Backoff;
            }
            rt.message = format!("{last}; restarting in {:.1}s", delay.as_secs_f64());
        });
    }

    fn stopped(&self, exit: Option<Exit>) {
        let key = self.key.clone();
        self.with(|st, rt| {
            rt.phase = Phase::Stopped;
            rt.ready = false;
            rt.pid = None;
            rt.running_since = None;
            if let Some(p) = rt.probe.take() {
                p.cancel();
            }
            let record = st.rec.replica_mut(&key);
            record.proc = None;
            if let Some(exit) = exit {
                record.last_exit = Some(format!("stopped: {exit}"));
            }
        });
    }
}

impl Instance {
    /// The environment and cwd of a replica's processes.
    fn context_in(&self, st: &St, key: &ReplicaKey) -> Result<health::CommandContext, String> {
        let spec = st
            .rec
            .service(&key.service)
            .ok_or_else(|| format!("no service {:?}", key.service))?;
        let allocs = st
            .rec
            .ports
            .get(&key.to_string())
            .cloned()
            .unwrap_or_default();
        let volumes: Vec<(String, PathBuf)> = spec
            .volumes
            .iter()
            .map(|v| {
                (
                    v.name.clone(),
                    workdir::volume_dir(&self.root, st.rec.stateful(), &v.name, key.replica),
                )
            })
            .collect();
        let who = workdir::Identity {
            instance_id: &self.id,
            root: &self.root,
            replica: key.replica,
        };
        let env = workdir::process_env(
            &self.shared.base_env,
            &who,
            spec,
            &allocs,
            &volumes,
            &self.shared.store.secrets_dir(),
        )?;
        Ok(health::CommandContext {
            cwd: self.root.clone(),
            env,
        })
    }
}
