//! Harness for the bootstrap tests: a real datacenter server (SQLite), the
//! bootstrap service assembled in-process with a controllable clock, and a
//! fake agent — a real `ProviderService` server over a `Provider` that
//! counts calls and fails on demand — joined to the registry like any
//! agent.

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

    async fn start(&self, id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        self.status(id).await
    }

    async fn stop(&self, id: &str, _grace: Duration) -> Result<pb::InstanceStatus, ProviderError> {
        self.status(id).await
    }

    async fn restart(
        &self,
        id: &str,
        _service: Option<&str>,
    ) -> Result<pb::InstanceStatus, ProviderError> {
        self.status(id).await
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

fn admin_token() -> String {
    Authenticator::new(SECRET).mint(&admin().claims)
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
    _dirs: Vec<tempfile::TempDir>,
}

impl Drop for Env {
    fn drop(&mut self) {
        if let Some(s) = self.dc_stop.take() {
            let _ = s.send(());
        }
    }
}

#[derive(Default)]
pub struct Options {
    pub rules: Vec<RuleHook>,
    pub reconcile: ReconcileConfig,
    pub service: ServiceConfig,
}

pub async fn env() -> Env {
    env_with(Options::default()).await
}

pub async fn env_with(opts: Options) -> Env {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let dc_dir = tempfile::tempdir().unwrap();
    let bs_dir = tempfile::tempdir().unwrap();
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
                url: format!("sqlite://{}", dc_dir.path().join("dc.db").display()),
                max_connections: 5,
            },
            registry: Default::default(),
        },
        listener,
        async {
            let _ = rx.await;
        },
    ));
    let auth = Arc::new(Authenticator::new(SECRET));
    let db = ctrlplane_runtime::db::connect(&DatabaseConfig {
        url: format!("sqlite://{}", bs_dir.path().join("bs.db").display()),
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
    let agents = AgentDirectory::new(channel, auth.clone(), Duration::from_secs(5));
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
    let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let svc = BootstrapService::new(store.clone(), reconciler, hooks, opts.service, stop_rx);
    let admin_channel =
        authed_channel(&dc_addr, BearerInterceptor::fixed(&admin_token()).unwrap()).unwrap();
    Env {
        dc_addr,
        svc,
        store,
        clock,
        dcs: DatacenterServiceClient::new(admin_channel.clone()),
        registry: AgentRegistryServiceClient::new(admin_channel),
        dc_stop: Some(tx),
        _dirs: vec![dc_dir, bs_dir],
    }
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
