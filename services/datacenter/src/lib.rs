//! The datacenter service: datacenters (tenant-scoped, paginated,
//! watchable), their persisted change log and events.
//!
//! Layout follows the project's scheme: [`model`] (entities), [`service`]
//! (operations, no gRPC types), [`grpc`] (thin adapter), [`store`]
//! (persistence), [`transitions`] (the status table), [`migration`],
//! [`convert`] (domain ↔ protobuf) and [`error`].

#![forbid(unsafe_code)]

pub mod agents;
pub mod convert;
pub mod error;
pub mod grpc;
pub mod migration;
pub mod model;
pub mod service;
pub mod store;
pub mod transitions;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use ctrlplane_proto::agent::v1::agent_registry_service_server::AgentRegistryServiceServer;
use ctrlplane_proto::datacenter::v1::datacenter_service_server::DatacenterServiceServer;
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::config::{
    self, AuthConfig, ConfigError, DatabaseConfig, ServerConfig, Settings,
};
use ctrlplane_runtime::server::{self, ServeError, ServeOptions};
use tokio::net::TcpListener;

pub use error::Error;

/// Settings this process reads.
pub const SETTINGS: &[&str] = &[
    config::LISTEN_ADDR,
    config::DATABASE_URL,
    config::DATA_DIR,
    config::AUTH_SECRET,
    config::AUTH_SECRET_FILE,
    config::LOG,
    config::LOG_FORMAT,
    config::SHUTDOWN_GRACE,
    config::DB_MAX_CONNECTIONS,
];

/// Default bind address.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], config::ports::DATACENTER))
}

/// Configuration of the datacenter process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server settings.
    pub server: ServerConfig,
    /// Token secret.
    pub auth: AuthConfig,
    /// Database.
    pub database: DatabaseConfig,
    /// Agent registry settings.
    pub registry: agents::service::RegistryConfig,
}

impl Config {
    /// Reads every setting.
    ///
    /// # Errors
    /// Missing or invalid settings, naming the variable.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        s.check_known(SETTINGS)?;
        Ok(Config {
            server: ServerConfig::from_settings(s, default_addr())?,
            auth: AuthConfig::from_settings(s)?,
            database: DatabaseConfig::from_settings(s, "datacenter.db")?,
            registry: agents::service::RegistryConfig::default(),
        })
    }
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening or migrating the database failed.
    #[error("database: {0}")]
    Database(#[from] Error),
    /// The server failed.
    #[error("{0}")]
    Serve(#[from] ServeError),
}

/// Runs the service on `listener` until `shutdown` resolves.
///
/// # Errors
/// Database or server failures.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let db = ctrlplane_runtime::db::connect(&config.database)
        .await
        .map_err(Error::from)?;
    let store = store::Store::open(db).await?;
    let auth = Arc::new(Authenticator::new(&config.auth.secret));
    let registry = agents::service::AgentRegistry::new(
        agents::store::AgentStore::new(store.db().clone()),
        store.clone(),
        auth.clone(),
        config.registry.clone(),
        Arc::new(chrono::Utc::now),
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service = service::DatacenterService::new(store, registry.clone(), stop_rx);
    let routes = tonic::service::Routes::new(DatacenterServiceServer::new(
        grpc::DatacenterGrpc::new(service),
    ))
    .add_service(AgentRegistryServiceServer::new(
        agents::grpc::AgentRegistryGrpc::new(registry),
    ));
    let options = ServeOptions {
        auth,
        service_names: vec![
            "ctrlplane.datacenter.v1.DatacenterService",
            "ctrlplane.agent.v1.AgentRegistryService",
        ],
        grace: config.server.shutdown_grace,
        public_methods: vec![agents::grpc::JOIN_AGENT_PATH],
    };
    let shutdown = async move {
        shutdown.await;
        // End watch streams so the drain does not wait for them.
        let _ = stop_tx.send(true);
    };
    server::serve(listener, options, routes, shutdown).await?;
    Ok(())
}
