//! Harness for the bootstrap tests: a real datacenter server (SQLite), the
//! bootstrap service assembled in-process with a controllable clock (its
//! store on SQLite, or on the Postgres of `CP_TEST_POSTGRES_URL` with a
//! fresh database per test), and a fake agent — a real `ProviderService`
//! server over a `Provider` that counts calls and fails on demand — joined
//! to the registry like any agent. Also: a remote hook as an extension
//! would write it ([`TestHook`]), and the real bootstrap server on a socket
//! ([`serve_bootstrap`]).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_agent::{Capability, Provider, ProviderError};
use ctrlplane_bootstrap::agents::AgentDirectory;
use ctrlplane_bootstrap::hooks::{Hooks, RuleHook};
use ctrlplane_bootstrap::reconcile::{Clock, Outcome, ReconcileConfig, Reconciler};
use ctrlplane_bootstrap::service::{BootstrapService, ServiceConfig, snapshot_of};
use ctrlplane_bootstrap::store::Store;
use ctrlplane_proto::agent::v1::{
    self as agpb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1::{
    self as dcpb, datacenter_service_client::DatacenterServiceClient,
};
use ctrlplane_proto::pbjson_types::Timestamp;
use ctrlplane_proto::provider::v1 as pb;
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_runtime::auth::{Authenticator, Caller, Claims, ROLE_ADMIN};
use ctrlplane_runtime::client::{AuthedChannel, BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::{AuthConfig, DatabaseConfig, ServerConfig};

pub const SECRET: &[u8] = b"bootstrap-test-secret-bootstrap-";

/// A controllable clock.
#[derive(Clone)]
pub struct FakeClock(pub Arc<Mutex<DateTime<Utc>>>);

impl FakeClock {
    pub fn new() -> Self {
        FakeClock(Arc::new(Mutex::new(Utc::now())))
    }
    pub fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += chrono::Duration::from_std(d).unwrap();
    }
    pub fn clock(&self) -> Clock {
        let inner = self.0.clone();
        Arc::new(move || *inner.lock().unwrap())
    }
}

/// One instance the fake agent holds.
#[derive(Debug, Clone)]
pub struct FakeInstance {
    pub request: pb::ProvisionRequest,
    pub created_at: DateTime<Utc>,
    pub release: String,
    pub failed: bool,
}

/// Shared state of the fake agent.
#[derive(Debug, Default)]
pub struct FakeState {
    pub instances: BTreeMap<String, FakeInstance>,
    /// Every mutating call, in order: "provision:<id>", "deploy:<id>", …
    pub calls: Vec<String>,
    /// Fail the next N provisions.
    pub fail_provisions: u32,
    /// Fail the next N deprovisions.
    pub fail_deprovisions: u32,
    /// Provision records the instance, then never answers (a crash after
    /// the backend did the work).
    pub hang_provisions: bool,
}

/// The fake agent.
#[derive(Clone)]
pub struct FakeAgent {
    pub state: Arc<Mutex<FakeState>>,
    pub deploy: bool,
}

impl FakeAgent {
    pub fn count(&self, prefix: &str) -> usize {
        self.state
            .lock()
            .unwrap()
            .calls
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }
    pub fn instances(&self) -> BTreeMap<String, FakeInstance> {
        self.state.lock().unwrap().instances.clone()
    }
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }
    /// Adds a backend workload nobody created through bootstrap.
    pub fn plant(&self, id: &str, labels: &[(&str, &str)], age: Duration) {
        let request = pb::ProvisionRequest {
            instance_id: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        self.state.lock().unwrap().instances.insert(
            id.into(),
            FakeInstance {
                request,
                created_at: Utc::now() - chrono::Duration::from_std(age).unwrap(),
                release: String::new(),
                failed: false,
            },
        );
    }
}

fn status(id: &str, inst: &FakeInstance) -> pb::InstanceStatus {
    pb::InstanceStatus {
        instance_id: id.into(),
        state: if inst.failed {
            pb::InstanceState::Failed as i32
        } else {
            pb::InstanceState::Running as i32
        },
        ready: !inst.failed,
        message: if inst.failed {
            "crashed".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

#[tonic::async_trait]
impl Provider for FakeAgent {
    fn info(&self) -> pb::GetInfoResponse {
        pb::GetInfoResponse {
            provider_name: "fake".into(),
            version: "test".into(),
            ..Default::default()
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        if self.deploy {
            vec![Capability::Provision, Capability::Deploy]
        } else {
            vec![Capability::Provision]
        }
    }

    async fn provision(
        &self,
        req: pb::ProvisionRequest,
    ) -> Result<pb::ProvisionResponse, ProviderError> {
        let hang = {
            let mut s = self.state.lock().unwrap();
            s.calls.push(format!("provision:{}", req.instance_id));
            if s.fail_provisions > 0 {
                s.fail_provisions -= 1;
                return Err(ProviderError::Unavailable(
                    "injected provision failure".into(),
                ));
            }
            s.instances
                .entry(req.instance_id.clone())
                .or_insert_with(|| FakeInstance {
                    request: req.clone(),
                    created_at: Utc::now(),
                    release: String::new(),
                    failed: false,
                });
            s.hang_provisions
        };
        if hang {
            std::future::pending::<()>().await;
        }
        Ok(pb::ProvisionResponse {
            provider_ref: format!("fake/{}", req.instance_id),
            service_refs: req
                .services
                .iter()
                .map(|s| {
                    (
                        s.name.clone(),
                        format!("fake/{}/{}", req.instance_id, s.name),
                    )
                })
                .collect(),
            endpoints: vec![pb::Endpoint {
                service_name: "main".into(),
                host: "127.0.0.1".into(),
                port: 1234,
                ..Default::default()
            }],
            metadata: Default::default(),
        })
    }

    async fn deprovision(
        &self,
        instance_id: &str,
    ) -> Result<pb::DeprovisionResponse, ProviderError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("deprovision:{instance_id}"));
        if s.fail_deprovisions > 0 {
            s.fail_deprovisions -= 1;
            return Err(ProviderError::Unavailable(
                "injected deprovision failure".into(),
            ));
        }
        Ok(pb::DeprovisionResponse {
            existed: s.instances.remove(instance_id).is_some(),
        })
    }

    /// Like a real agent: (re)starts a failed instance.
    async fn start(&self, id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("start:{id}"));
        let inst = s
            .instances
            .get_mut(id)
            .ok_or_else(|| ProviderError::no_instance(id))?;
        inst.failed = false;
        Ok(status(id, inst))
    }

    async fn stop(&self, id: &str, _grace: Duration) -> Result<pb::InstanceStatus, ProviderError> {
        self.status(id).await
    }

    async fn restart(
        &self,
        id: &str,
        _service: Option<&str>,
    ) -> Result<pb::InstanceStatus, ProviderError> {
        self.start(id).await
    }

    async fn status(&self, id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        let s = self.state.lock().unwrap();
        s.instances
            .get(id)
            .map(|i| status(id, i))
            .ok_or_else(|| ProviderError::no_instance(id))
    }

    async fn deploy(&self, req: pb::DeployRequest) -> Result<pb::DeployResponse, ProviderError> {
        let mut s = self.state.lock().unwrap();
        s.calls.push(format!("deploy:{}", req.instance_id));
        let inst = s
            .instances
            .get_mut(&req.instance_id)
            .ok_or_else(|| ProviderError::no_instance(&req.instance_id))?;
        for d in &req.services {
            if let Some(svc) = inst.request.services.iter_mut().find(|x| x.name == d.name) {
                svc.image = d.image.clone();
                svc.env = d.env.clone();
            }
        }
        inst.release = req.release_id.clone();
        Ok(pb::DeployResponse {
            release_id: req.release_id,
            status: None,
        })
    }

    async fn resources(&self, id: &str) -> Result<pb::ResourceUsage, ProviderError> {
        self.status(id).await?;
        Ok(pb::ResourceUsage {
            cpu_percent: 12.5,
            memory_bytes: 1 << 20,
            ..Default::default()
        })
    }

    async fn check_health(&self) -> Result<pb::CheckHealthResponse, ProviderError> {
        Ok(pb::CheckHealthResponse {
            healthy: true,
            message: String::new(),
            instances: self.state.lock().unwrap().instances.len() as i32,
        })
    }

    async fn list_managed(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListManagedResponse, ProviderError> {
        let s = self.state.lock().unwrap();
        let mut items: Vec<(&String, &FakeInstance)> = s
            .instances
            .iter()
            .filter(|(id, _)| id.as_str() > page_token)
            .collect();
        let more = items.len() > page_size as usize;
        items.truncate(page_size as usize);
        Ok(pb::ListManagedResponse {
            next_page_token: if more {
                items
                    .last()
                    .map(|(id, _)| id.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            },
            workloads: items
                .into_iter()
                .map(|(id, i)| pb::ManagedWorkload {
                    instance_id: id.clone(),
                    labels: i.request.labels.clone(),
                    created_at: Some(Timestamp {
                        seconds: i.created_at.timestamp(),
                        nanos: 0,
                    }),
                    tenant_id: i.request.tenant_id.clone(),
                })
                .collect(),
        })
    }
}

pub fn admin() -> Caller {
    Caller {
        claims: Claims::new(
            "admin",
            "",
            vec![ROLE_ADMIN.into()],
            Duration::from_secs(600),
        ),
    }
}

pub fn admin_token() -> String {
    Authenticator::new(SECRET).mint(&admin().claims)
}

/// Which database the bootstrap store runs on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Backend {
    #[default]
    Sqlite,
    Postgres,
}

/// A fresh bootstrap database URL; `None` when Postgres is not configured
/// outside CI (in CI a missing Postgres is a failure, never a skip).
pub async fn database_url(backend: Backend, dir: &std::path::Path) -> Option<String> {
    match backend {
        Backend::Sqlite => Some(format!("sqlite://{}", dir.join("bs.db").display())),
        Backend::Postgres => {
            let Ok(admin) = std::env::var("CP_TEST_POSTGRES_URL") else {
                assert!(
                    std::env::var("CI").is_err(),
                    "CP_TEST_POSTGRES_URL must be set in CI (tests/run.sh starts Postgres)"
                );
                eprintln!("skipping: CP_TEST_POSTGRES_URL is not set (run tests/run.sh)");
                return None;
            };
            use sea_orm::ConnectionTrait;
            let name = format!("bs_test_{}", uuid::Uuid::now_v7().simple());
            let conn = sea_orm::Database::connect(admin.as_str())
                .await
                .expect("connect to test Postgres");
            conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
            conn.close().await.unwrap();
            let (base, _) = admin
                .rsplit_once('/')
                .expect("postgres URL with a database path");
            Some(format!("{base}/{name}"))
        }
    }
}

/// Everything a bootstrap test needs.
pub struct Env {
    pub dc_addr: String,
    pub svc: BootstrapService,
    pub store: Store,
    pub clock: FakeClock,
    pub dcs: DatacenterServiceClient<AuthedChannel>,
    pub registry: AgentRegistryServiceClient<AuthedChannel>,
    dc_stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Ends the service's watch streams when dropped or set.
    pub stop: tokio::sync::watch::Sender<bool>,
    _dirs: Vec<tempfile::TempDir>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(s) = self.dc_stop.take() {
            let _ = s.send(());
        }
    }
}

pub struct Options {
    pub rules: Vec<RuleHook>,
    pub reconcile: ReconcileConfig,
    pub service: ServiceConfig,
    pub backend: Backend,
    /// Timeout of one agent call.
    pub call_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rules: Vec::new(),
            reconcile: ReconcileConfig::default(),
            service: ServiceConfig::default(),
            backend: Backend::Sqlite,
            call_timeout: Duration::from_secs(5),
        }
    }
}

pub async fn env() -> Env {
    env_with(Options::default()).await
}

pub async fn env_with(opts: Options) -> Env {
    assert_eq!(opts.backend, Backend::Sqlite, "use try_env_with");
    try_env_with(opts).await.unwrap()
}

/// An environment on `backend`, or `None` (skip) when Postgres is not
/// configured outside CI.
pub async fn env_on(backend: Backend) -> Option<Env> {
    try_env_with(Options {
        backend,
        ..Default::default()
    })
    .await
}

/// Starts a datacenter server (agents' leases long enough that a fake
/// agent, which never heartbeats, stays healthy for the whole test).
pub async fn start_datacenter(dir: &std::path::Path) -> (String, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dc_addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(ctrlplane_datacenter::run(
        ctrlplane_datacenter::Config {
            server: ServerConfig {
                listen_addr: listener.local_addr().unwrap(),
                shutdown_grace: Duration::from_secs(1),
            },
            auth: AuthConfig {
                secret: SECRET.to_vec(),
            },
            database: DatabaseConfig {
                url: format!("sqlite://{}", dir.join("dc.db").display()),
                max_connections: 5,
            },
            registry: ctrlplane_datacenter::agents::service::RegistryConfig {
                lease_ttl: Duration::from_secs(3600),
                ..Default::default()
            },
        },
        listener,
        async {
            let _ = rx.await;
        },
    ));
    (dc_addr, tx)
}

pub async fn try_env_with(opts: Options) -> Option<Env> {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let dc_dir = tempfile::tempdir().unwrap();
    let bs_dir = tempfile::tempdir().unwrap();
    let url = database_url(opts.backend, bs_dir.path()).await?;
    let (dc_addr, tx) = start_datacenter(dc_dir.path()).await;
    let auth = Arc::new(Authenticator::new(SECRET));
    let db = ctrlplane_runtime::db::connect(&DatabaseConfig {
        url,
        max_connections: 5,
    })
    .await
    .unwrap();
    let store = Store::open(db).await.unwrap();
    let channel = authed_channel(
        &dc_addr,
        BearerInterceptor::service(auth.clone(), "bootstrap"),
    )
    .unwrap();
    let agents = AgentDirectory::new(channel, auth.clone(), opts.call_timeout);
    let hooks = Hooks::new(opts.rules, store.clone(), auth.clone());
    let clock = FakeClock::new();
    let reconciler = Reconciler::new(
        store.clone(),
        agents,
        hooks.clone(),
        opts.reconcile,
        "test-replica".into(),
        clock.clock(),
    );
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let svc = BootstrapService::new(store.clone(), reconciler, hooks, opts.service, stop_rx);
    let admin_channel =
        authed_channel(&dc_addr, BearerInterceptor::fixed(&admin_token()).unwrap()).unwrap();
    Some(Env {
        dc_addr,
        svc,
        store,
        clock,
        dcs: DatacenterServiceClient::new(admin_channel.clone()),
        registry: AgentRegistryServiceClient::new(admin_channel),
        dc_stop: Some(tx),
        stop,
        _dirs: vec![dc_dir, bs_dir],
    })
}

/// Serves a fake agent and joins it for `provider`.
pub async fn fake_agent(env: &Env, provider: &str, deploy: bool) -> FakeAgent {
    let agent = FakeAgent {
        state: Default::default(),
        deploy,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(ctrlplane_agent::server::serve_provider(
        Arc::new(agent.clone()),
        listener,
        Arc::new(Authenticator::new(SECRET)),
        Duration::from_secs(1),
        std::future::pending(),
    ));
    join(env, provider, &endpoint).await;
    agent
}

/// Registers an agent endpoint for `provider` through the real join flow.
pub async fn join(env: &Env, provider: &str, endpoint: &str) {
    let token = env
        .registry
        .clone()
        .create_join_token(agpb::CreateJoinTokenRequest {
            provider_name: provider.into(),
            ttl: None,
            max_uses: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let channel = ctrlplane_runtime::client::channel(&env.dc_addr).unwrap();
    AgentRegistryServiceClient::new(channel)
        .join_agent(agpb::JoinAgentRequest {
            token,
            provider_name: provider.into(),
            endpoint: endpoint.into(),
            idempotency_key: uuid::Uuid::now_v7().to_string(),
            ..Default::default()
        })
        .await
        .unwrap();
}

pub fn spec(name: &str, image: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            image: image.into(),
            command: vec!["sleep".into(), "1000".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

pub async fn create_dc(
    env: &Env,
    name: &str,
    provider: &str,
    specs: Vec<BootstrapServiceSpec>,
) -> dcpb::Datacenter {
    env.dcs
        .clone()
        .create_datacenter(dcpb::CreateDatacenterRequest {
            datacenter: Some(dcpb::Datacenter {
                name: name.into(),
                provider_name: provider.into(),
                region: "eu".into(),
                bootstrap_services: specs,
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap()
}

pub async fn get_dc(env: &Env, id: &str) -> Option<dcpb::Datacenter> {
    match env
        .dcs
        .clone()
        .get_datacenter(dcpb::GetDatacenterRequest { id: id.into() })
        .await
    {
        Ok(r) => r.into_inner().datacenter,
        Err(s) if s.code() == tonic::Code::NotFound => None,
        Err(s) => panic!("{s:?}"),
    }
}

pub async fn set_specs(env: &Env, id: &str, specs: Vec<BootstrapServiceSpec>) -> dcpb::Datacenter {
    env.dcs
        .clone()
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
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap()
}

pub async fn set_status(env: &Env, id: &str, status: dcpb::DatacenterStatus) {
    env.dcs
        .clone()
        .set_datacenter_status(dcpb::SetDatacenterStatusRequest {
            id: id.into(),
            status: status as i32,
            reason: String::new(),
        })
        .await
        .unwrap();
}

/// Reconciles the datacenter's current snapshot.
pub async fn reconcile(env: &Env, id: &str) -> Outcome {
    let dc = get_dc(env, id).await.expect("datacenter exists");
    let (info, declared) = snapshot_of(&dc);
    env.svc
        .reconcile(&admin(), &info, &declared, false)
        .await
        .unwrap()
}

/// Rows by name → state.
pub async fn states(env: &Env, id: &str) -> Vec<(String, String)> {
    env.store
        .workloads(id)
        .await
        .unwrap()
        .into_iter()
        .map(|w| (w.name, w.state.as_str().to_string()))
        .collect()
}

/// Rows of a datacenter.
pub async fn rows(env: &Env, id: &str) -> Vec<ctrlplane_bootstrap::model::Workload> {
    env.store.workloads(id).await.unwrap()
}

/// The row of a name (panics when there is none or several).
pub async fn row(env: &Env, dc: &str, name: &str) -> ctrlplane_bootstrap::model::Workload {
    let mut found: Vec<_> = rows(env, dc)
        .await
        .into_iter()
        .filter(|w| w.name == name)
        .collect();
    assert_eq!(found.len(), 1, "rows named {name}: {found:?}");
    found.remove(0)
}

/// Every event (of one datacenter, or all), oldest first.
pub async fn events(env: &Env, dc: Option<&str>) -> Vec<ctrlplane_bootstrap::model::Event> {
    env.store.events_after(dc, 0, 100_000).await.unwrap()
}

/// Polls `f` every 50 ms until it yields `Some`, for at most `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// How a [`TestHook`] answers `ContributeServices`.
#[derive(Debug, Clone, Default)]
pub struct HookState {
    /// What it contributes.
    pub specs: Vec<BootstrapServiceSpec>,
    /// Answer UNAVAILABLE.
    pub fail: bool,
    /// Sleep this long before answering.
    pub delay: Option<Duration>,
    /// Calls received.
    pub calls: usize,
    /// Every call carried a valid system token (a real hook would check).
    pub all_calls_authenticated: bool,
    /// The datacenters asked about, in order.
    pub asked: Vec<String>,
}

/// A remote hook as any extension would write it: a tonic server
/// implementing `BootstrapHookService`.
pub struct TestHook {
    pub endpoint: String,
    pub state: Arc<Mutex<HookState>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestHook {
    pub fn set(&self, f: impl FnOnce(&mut HookState)) {
        f(&mut self.state.lock().unwrap())
    }
    pub fn calls(&self) -> usize {
        self.state.lock().unwrap().calls
    }
}

impl Drop for TestHook {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

#[derive(Clone)]
struct HookImpl {
    name: String,
    state: Arc<Mutex<HookState>>,
}

#[tonic::async_trait]
impl ctrlplane_proto::bootstrap::v1::bootstrap_hook_service_server::BootstrapHookService
    for HookImpl
{
    async fn get_hook_info(
        &self,
        _req: tonic::Request<ctrlplane_proto::bootstrap::v1::GetHookInfoRequest>,
    ) -> Result<tonic::Response<ctrlplane_proto::bootstrap::v1::GetHookInfoResponse>, tonic::Status>
    {
        Ok(tonic::Response::new(
            ctrlplane_proto::bootstrap::v1::GetHookInfoResponse {
                name: self.name.clone(),
                version: "test".into(),
                description: "a test hook".into(),
            },
        ))
    }

    async fn contribute_services(
        &self,
        req: tonic::Request<ctrlplane_proto::bootstrap::v1::ContributeServicesRequest>,
    ) -> Result<
        tonic::Response<ctrlplane_proto::bootstrap::v1::ContributeServicesResponse>,
        tonic::Status,
    > {
        let authed = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|t| Authenticator::new(SECRET).verify(t).ok())
            .is_some_and(|claims| Caller { claims }.is_system());
        let (specs, fail, delay) = {
            let mut s = self.state.lock().unwrap();
            s.all_calls_authenticated &= authed;
            s.calls += 1;
            s.asked.push(
                req.get_ref()
                    .datacenter
                    .as_ref()
                    .map(|d| d.id.clone())
                    .unwrap_or_default(),
            );
            (s.specs.clone(), s.fail, s.delay)
        };
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        if fail {
            return Err(tonic::Status::unavailable("inventory database is down"));
        }
        Ok(tonic::Response::new(
            ctrlplane_proto::bootstrap::v1::ContributeServicesResponse { services: specs },
        ))
    }
}

/// Serves a hook contributing `specs` on a free port.
pub async fn test_hook(name: &str, specs: Vec<BootstrapServiceSpec>) -> TestHook {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let state = Arc::new(Mutex::new(HookState {
        specs,
        all_calls_authenticated: true,
        ..Default::default()
    }));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let service = ctrlplane_proto::bootstrap::v1::bootstrap_hook_service_server::BootstrapHookServiceServer::new(
        HookImpl {
            name: name.to_string(),
            state: state.clone(),
        },
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::TcpListenerStream::new(listener),
                async {
                    let _ = rx.await;
                },
            ),
    );
    TestHook {
        endpoint,
        state,
        stop: Some(tx),
    }
}

/// The real bootstrap server (`ctrlplane_bootstrap::run`) on a free port,
/// talking to the environment's datacenter server.
pub struct BootstrapServer {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub handle: Option<tokio::task::JoinHandle<Result<(), ctrlplane_bootstrap::RunError>>>,
    _dir: tempfile::TempDir,
}

impl BootstrapServer {
    /// Stops the server and waits for it.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(h) = self.handle.take() {
            h.await.unwrap().unwrap();
        }
    }
}

impl Drop for BootstrapServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

pub async fn serve_bootstrap(env: &Env) -> BootstrapServer {
    let dir = tempfile::tempdir().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let config = ctrlplane_bootstrap::Config {
        server: ServerConfig {
            listen_addr: addr,
            shutdown_grace: Duration::from_secs(2),
        },
        auth: AuthConfig {
            secret: SECRET.to_vec(),
        },
        database: DatabaseConfig {
            url: format!("sqlite://{}", dir.path().join("bs.db").display()),
            max_connections: 5,
        },
        peers: ctrlplane_runtime::config::PeersConfig {
            datacenter: env.dc_addr.clone(),
            bootstrap: String::new(),
            scheduler: String::new(),
        },
        hooks_file: None,
        reconcile: ReconcileConfig::default(),
        service: ServiceConfig::default(),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(ctrlplane_bootstrap::run(config, listener, async {
        let _ = rx.await;
    }));
    BootstrapServer {
        addr,
        stop: Some(tx),
        handle: Some(handle),
        _dir: dir,
    }
}

/// Generates one `#[tokio::test]` per backend for each listed async fn
/// taking a [`Backend`].
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}
