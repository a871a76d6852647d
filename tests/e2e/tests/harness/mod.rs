//! The harness: the service binaries as child processes under one temp
//! directory, gRPC clients with minted tokens, `/proc` scans for workload
//! processes, and polling with deadlines.
//!
//! Everything started here is killed when the [`Stack`] is dropped: the
//! service processes (SIGKILL) and every workload process whose
//! `CP_INSTANCE_ROOT` lies under the stack's directory (the process agent's
//! workloads outlive the agent by design). When the test is panicking the
//! tail of every service log is printed first.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ctrlplane_proto::agent::v1::{
    self as agpb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::bootstrap::v1::{
    self as bspb, BootstrapServiceSpec, bootstrap_service_client::BootstrapServiceClient,
};
use ctrlplane_proto::datacenter::v1::{
    self as dcpb, datacenter_service_client::DatacenterServiceClient,
};
use ctrlplane_proto::provider::v1::{
    self as pvpb, ServiceSpec, provider_service_client::ProviderServiceClient,
};
use ctrlplane_proto::scheduler::v1::{
    self as scpb, scheduler_service_client::SchedulerServiceClient,
};
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN, ROLE_SERVICE};
use ctrlplane_runtime::client::{AuthedChannel, BearerInterceptor, authed_channel};

pub const SECRET: &str = "e2e-resilience-secret-0123456789abcdef";
pub const BINARIES: [&str; 4] = [
    "ctrlplane-datacenter",
    "ctrlplane-bootstrap",
    "ctrlplane-scheduler",
    "ctrlplane-agent-process",
];
pub const RUNNING: i32 = bspb::BootstrapState::Running as i32;
pub const FAILED: i32 = bspb::BootstrapState::Failed as i32;

/// The directory of the built binaries (`target/<profile>`, the parent of
/// this test executable's `deps` directory), or `None` (skip) when one is
/// missing — a failure under `CI`.
pub fn bin_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !dir.join(b).exists())
        .collect();
    if missing.is_empty() {
        return Some(dir);
    }
    let msg = format!(
        "missing binaries {missing:?} in {} (run `cargo build --workspace`)",
        dir.display()
    );
    if ci() {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

/// Running under CI (`CI` set, not empty or `false`)?
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false")
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A token for `role`.
pub fn token(role: &str) -> String {
    Authenticator::new(SECRET.as_bytes()).mint(&Claims::new(
        "e2e",
        "",
        vec![role.to_string()],
        Duration::from_secs(3600),
    ))
}

pub fn channel(addr: &str, role: &str) -> AuthedChannel {
    authed_channel(addr, BearerInterceptor::fixed(&token(role)).unwrap()).unwrap()
}

/// One service binary: its environment and port survive restarts.
pub struct Proc {
    pub name: String,
    bin: PathBuf,
    env: Vec<(String, String)>,
    pub port: u16,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    pub fn addr(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} already running", self.name);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(&self.bin);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("CP_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("CP_LISTEN_ADDR", format!("127.0.0.1:{}", self.port))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.child = Some(cmd.spawn().unwrap());
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then SIGKILL after `grace`.
    pub fn term(&mut self, grace: Duration) {
        if let Some(mut c) = self.child.take() {
            signal(c.id() as i32, "-TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Still alive (not exited)?
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

pub fn signal(pid: i32, s: &str) {
    let _ = Command::new("kill")
        .args([s, "--", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// Live (non-zombie) processes whose `CP_INSTANCE_ROOT` lies under `root`,
/// grouped by their `CP_INSTANCE_ID`.
pub fn workload_processes(root: &Path) -> BTreeMap<String, Vec<i32>> {
    let needle = format!("CP_INSTANCE_ROOT={}/", root.display());
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    let me = std::process::id() as i32;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<String> = env
            .split(|b| *b == 0)
            .map(|kv| String::from_utf8_lossy(kv).into_owned())
            .collect();
        if !vars.iter().any(|v| v.starts_with(&needle)) {
            continue;
        }
        let id = vars
            .iter()
            .find_map(|v| v.strip_prefix("CP_INSTANCE_ID="))
            .unwrap_or("")
            .to_string();
        out.entry(id).or_default().push(pid);
    }
    out
}

/// Where the services keep their data.
#[derive(Clone)]
pub enum Db {
    Sqlite,
    Postgres(String),
}

pub struct Stack {
    pub dir: tempfile::TempDir,
    bins: PathBuf,
    db: Db,
    pub datacenter: Proc,
    pub bootstrap: Proc,
    pub schedulers: Vec<Proc>,
    pub agent: Proc,
}

pub struct Options {
    pub db: Db,
    /// Extra scheduler settings (intervals).
    pub scheduler_env: Vec<(&'static str, &'static str)>,
    /// Extra bootstrap settings.
    pub bootstrap_env: Vec<(&'static str, &'static str)>,
    pub schedulers: usize,
}

impl Stack {
    fn proc(&self, name: &str, bin: &str, env: Vec<(String, String)>) -> Proc {
        let mut env = env;
        env.push(("CP_AUTH_SECRET".into(), SECRET.into()));
        env.push(("CP_LOG".into(), "info".into()));
        Proc {
            name: name.into(),
            bin: self.bins.join(bin),
            env,
            port: free_port(),
            child: None,
            log: self.dir.path().join(format!("{name}.log")),
        }
    }

    fn db_url(&self, file: &str) -> String {
        match &self.db {
            Db::Sqlite => format!("sqlite://{}", self.dir.path().join(file).display()),
            Db::Postgres(url) => url.clone(),
        }
    }

    /// The agent's state dir; workloads' instance roots lie under it.
    pub fn agent_root(&self) -> PathBuf {
        self.dir.path().join("agent")
    }

    /// Starts datacenter, the process agent (joined with a fresh token),
    /// bootstrap and the schedulers, each waited for until SERVING.
    pub async fn start(bins: PathBuf, o: Options) -> Stack {
        ctrlplane_runtime::telemetry::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let placeholder = |name: &str| Proc {
            name: name.into(),
            bin: PathBuf::new(),
            env: vec![],
            port: 0,
            child: None,
            log: PathBuf::new(),
        };
        let mut s = Stack {
            dir,
            bins,
            db: o.db,
            datacenter: placeholder("datacenter"),
            bootstrap: placeholder("bootstrap"),
            schedulers: vec![],
            agent: placeholder("agent"),
        };
        s.datacenter = s.proc(
            "datacenter",
            "ctrlplane-datacenter",
            vec![("CP_DATABASE_URL".into(), s.db_url("dc.db"))],
        );
        s.datacenter.spawn();
        wait_serving(&s.datacenter).await;
        let dc = s.datacenter.addr();

        let join = AgentRegistryServiceClient::new(channel(&dc, ROLE_ADMIN))
            .create_join_token(agpb::CreateJoinTokenRequest {
                provider_name: "process".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .token;
        s.agent = s.proc(
            "agent",
            "ctrlplane-agent-process",
            vec![
                ("CP_STATE_DIR".into(), s.agent_root().display().to_string()),
                ("CP_DATACENTER_ADDR".into(), dc.clone()),
                ("CP_JOIN_TOKEN".into(), join),
            ],
        );
        s.agent.spawn();
        wait_serving(&s.agent).await;
        eventually(
            "the process agent to join",
            Duration::from_secs(30),
            async || {
                let r = AgentRegistryServiceClient::new(channel(&dc, ROLE_ADMIN))
                    .list_agents(agpb::ListAgentsRequest::default())
                    .await
                    .ok()?
                    .into_inner();
                (!r.agents.is_empty()).then_some(())
            },
        )
        .await;

        let mut env = vec![
            ("CP_DATABASE_URL".into(), s.db_url("bs.db")),
            ("CP_DATACENTER_ADDR".into(), dc.clone()),
        ];
        env.extend(
            o.bootstrap_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        s.bootstrap = s.proc("bootstrap", "ctrlplane-bootstrap", env);
        s.bootstrap.spawn();
        wait_serving(&s.bootstrap).await;

        for i in 0..o.schedulers {
            let mut env = vec![
                ("CP_DATABASE_URL".into(), s.db_url(&format!("sched{i}.db"))),
                ("CP_DATACENTER_ADDR".into(), dc.clone()),
                ("CP_BOOTSTRAP_ADDR".into(), s.bootstrap.addr()),
            ];
            if matches!(s.db, Db::Sqlite) && i > 0 {
                // Replicas on SQLite share the first one's file.
                env[0].1 = s.db_url("sched0.db");
            }
            env.extend(
                o.scheduler_env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
            let mut p = s.proc(&format!("scheduler{i}"), "ctrlplane-scheduler", env);
            p.spawn();
            wait_serving(&p).await;
            s.schedulers.push(p);
        }
        s
    }

    pub fn dcs(&self) -> DatacenterServiceClient<AuthedChannel> {
        DatacenterServiceClient::new(channel(&self.datacenter.addr(), ROLE_ADMIN))
    }

    pub fn bs(&self) -> BootstrapServiceClient<AuthedChannel> {
        BootstrapServiceClient::new(channel(&self.bootstrap.addr(), ROLE_ADMIN))
    }

    pub fn sched(&self, i: usize) -> SchedulerServiceClient<AuthedChannel> {
        SchedulerServiceClient::new(channel(&self.schedulers[i].addr(), ROLE_ADMIN))
    }

    pub fn provider(&self) -> ProviderServiceClient<AuthedChannel> {
        ProviderServiceClient::new(channel(&self.agent.addr(), ROLE_SERVICE))
    }

    /// Rows of a datacenter, `None` when bootstrap does not answer.
    pub async fn rows(&self, dc: &str) -> Option<Vec<bspb::BootstrapWorkload>> {
        let mut out = Vec::new();
        let mut page_token = String::new();
        for _ in 0..100 {
            let r = self
                .bs()
                .list_bootstrap_workloads(bspb::ListBootstrapWorkloadsRequest {
                    datacenter_id: dc.into(),
                    page_size: 100,
                    page_token: page_token.clone(),
                })
                .await
                .ok()?
                .into_inner();
            out.extend(r.workloads);
            if r.next_page_token.is_empty() {
                return Some(out);
            }
            page_token = r.next_page_token;
        }
        panic!("too many pages");
    }

    /// Instance ids the agent manages, `None` when it does not answer.
    pub async fn managed(&self) -> Option<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        let mut page_token = String::new();
        for _ in 0..100 {
            let r = self
                .provider()
                .list_managed(pvpb::ListManagedRequest {
                    page_size: 100,
                    page_token: page_token.clone(),
                })
                .await
                .ok()?
                .into_inner();
            out.extend(r.workloads.into_iter().map(|w| w.instance_id));
            if r.next_page_token.is_empty() {
                return Some(out);
            }
            page_token = r.next_page_token;
        }
        panic!("too many pages");
    }

    /// Workload processes of this stack by instance id.
    pub fn processes(&self) -> BTreeMap<String, Vec<i32>> {
        workload_processes(&self.agent_root())
    }

    pub async fn create_dc(&self, name: &str, specs: Vec<BootstrapServiceSpec>) -> String {
        self.dcs()
            .create_datacenter(dcpb::CreateDatacenterRequest {
                datacenter: Some(dcpb::Datacenter {
                    name: name.into(),
                    provider_name: "process".into(),
                    bootstrap_services: specs,
                    ..Default::default()
                }),
            })
            .await
            .unwrap()
            .into_inner()
            .datacenter
            .unwrap()
            .id
    }

    pub async fn set_specs(&self, id: &str, specs: Vec<BootstrapServiceSpec>) {
        self.dcs()
            .update_datacenter(dcpb::UpdateDatacenterRequest {
                datacenter: Some(dcpb::Datacenter {
                    id: id.into(),
                    bootstrap_services: specs,
                    ..Default::default()
                }),
                update_mask: Some(ctrlplane_proto::pbjson_types::FieldMask {
                    paths: vec!["bootstrap_services".into()],
                }),
            })
            .await
            .unwrap();
    }

    pub async fn delete_dc(&self, id: &str) {
        self.dcs()
            .delete_datacenter(dcpb::DeleteDatacenterRequest { id: id.into() })
            .await
            .unwrap();
    }

    /// Is the datacenter gone (NOT_FOUND)?
    pub async fn purged(&self, id: &str) -> bool {
        matches!(
            self.dcs()
                .get_datacenter(dcpb::GetDatacenterRequest { id: id.into() })
                .await,
            Err(ref st) if st.code() == tonic::Code::NotFound
        )
    }

    fn kill_workloads(&self) {
        for pids in self.processes().values() {
            for pid in pids {
                signal(*pid, "-KILL");
            }
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        let mut procs: Vec<&mut Proc> = vec![&mut self.datacenter, &mut self.bootstrap];
        procs.extend(self.schedulers.iter_mut());
        procs.push(&mut self.agent);
        for p in procs {
            if panicking && !p.log.as_os_str().is_empty() {
                eprintln!("----- {} log (tail) -----\n{}", p.name, p.tail(40));
            }
            p.kill9();
        }
        // Twice: a workload restarting at the moment of the first pass.
        self.kill_workloads();
        std::thread::sleep(Duration::from_millis(200));
        self.kill_workloads();
    }
}

/// Waits until the process answers the gRPC health check with SERVING.
pub async fn wait_serving(p: &Proc) {
    let addr = p.addr();
    eventually(
        &format!("{} to serve on {addr}", p.name),
        Duration::from_secs(30),
        async || {
            let ch = tonic::transport::Endpoint::from_shared(addr.clone())
                .ok()?
                .connect_timeout(Duration::from_millis(500))
                .connect()
                .await
                .ok()?;
            let r = tonic_health::pb::health_client::HealthClient::new(ch)
                .check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await
                .ok()?
                .into_inner();
            (r.status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32)
                .then_some(())
        },
    )
    .await;
}

/// Polls `f` every 100 ms until it yields, failing after `wait`.
pub async fn eventually<T>(what: &str, wait: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {wait:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A bootstrap service of one `sleep 300` process, with `VERSION=version`.
pub fn spec(name: &str, version: u32) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            command: vec!["sleep".into(), "300".into()],
            env: [("VERSION".to_string(), version.to_string())].into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Leader flag and per-worker run counts of a scheduler (`None`: no answer).
pub async fn workers(
    c: &mut SchedulerServiceClient<AuthedChannel>,
) -> Option<(bool, BTreeMap<String, i64>)> {
    let r = c
        .list_workers(scpb::ListWorkersRequest {})
        .await
        .ok()?
        .into_inner();
    Some((
        r.leader,
        r.workers
            .into_iter()
            .map(|w| (w.name, w.run_count))
            .collect(),
    ))
}
