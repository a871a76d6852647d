#![allow(dead_code)]

//! A real datacenter server on a free port with a temp SQLite file, and
//! clients carrying whatever `authorization` header a test wants.

use std::time::Duration;

use ctrlplane_datacenter::{Config, run};
use ctrlplane_proto::agent::v1::{
    self as pb_agent, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::config::{AuthConfig, DatabaseConfig, ServerConfig};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub const SECRET: &[u8] = b"grpc-test-secret-grpc-test-secret";

pub struct Server {
    pub addr: std::net::SocketAddr,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub handle: tokio::task::JoinHandle<Result<(), ctrlplane_datacenter::RunError>>,
    _dir: tempfile::TempDir,
}

pub async fn start() -> Server {
    start_at(tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap()).await
}

/// Starts a server on `listener` (and joins a `process` agent).
pub async fn start_at(listener: tokio::net::TcpListener) -> Server {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let addr = listener.local_addr().unwrap();
    let config = Config {
        server: ServerConfig {
            listen_addr: addr,
            shutdown_grace: Duration::from_secs(5),
        },
        auth: AuthConfig {
            secret: SECRET.to_vec(),
        },
        database: DatabaseConfig {
            url: format!("sqlite://{}", dir.path().join("dc.db").display()),
            max_connections: 5,
        },
        registry: Default::default(),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let handle = tokio::spawn(run(config, listener, async {
        let _ = rx.await;
    }));
    let server = Server {
        addr,
        stop: Some(tx),
        handle,
        _dir: dir,
    };
    join(&server, "process", "http://127.0.0.1:7401").await;
    server
}

/// Joins an agent for `provider` the way agents do: an admin mints a join
/// token, the agent calls JoinAgent with it and no bearer token.
pub async fn join(s: &Server, provider: &str, endpoint: &str) -> pb_agent::JoinAgentResponse {
    let mut admin = AgentRegistryServiceClient::with_interceptor(
        channel(s),
        RawAuth(Some(format!(
            "Bearer {}",
            token("admin", "", &[ROLE_ADMIN])
        ))),
    );
    let minted = admin
        .create_join_token(pb_agent::CreateJoinTokenRequest {
            provider_name: provider.into(),
            ttl: None,
            max_uses: 1,
        })
        .await
        .unwrap()
        .into_inner();
    let mut anonymous = AgentRegistryServiceClient::new(channel(s));
    anonymous
        .join_agent(pb_agent::JoinAgentRequest {
            token: minted.token,
            provider_name: provider.into(),
            endpoint: endpoint.into(),
            version: "test".into(),
            idempotency_key: format!("key-{provider}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// Sets the `authorization` header verbatim (or not at all).
#[derive(Clone)]
pub struct RawAuth(pub Option<String>);

impl Interceptor for RawAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut()
                .insert("authorization", v.parse().unwrap());
        }
        Ok(req)
    }
}

pub type Client = DatacenterServiceClient<InterceptedService<Channel, RawAuth>>;

pub fn channel(s: &Server) -> Channel {
    ctrlplane_runtime::client::channel(&s.addr.to_string()).unwrap()
}

pub fn client_with(s: &Server, header: Option<String>) -> Client {
    DatacenterServiceClient::with_interceptor(channel(s), RawAuth(header))
}

pub fn token(sub: &str, tenant: &str, roles: &[&str]) -> String {
    Authenticator::new(SECRET).mint(&Claims::new(
        sub,
        tenant,
        roles.iter().map(|r| r.to_string()).collect(),
        Duration::from_secs(600),
    ))
}

pub fn client(s: &Server, sub: &str, tenant: &str, roles: &[&str]) -> Client {
    client_with(s, Some(format!("Bearer {}", token(sub, tenant, roles))))
}

pub fn admin(s: &Server) -> Client {
    client(s, "admin", "", &[ROLE_ADMIN])
}
