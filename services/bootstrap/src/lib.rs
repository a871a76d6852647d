//! The bootstrap service: converges every datacenter to its desired set of
//! bootstrap services and keeps it there.
//!
//! - [`model`]: workload rows and states;
//! - [`desired`]: declared ∪ hook specs, templated and hashed (pure);
//! - [`plan`]: the pure planner;
//! - [`reconcile`]: the executor (leases, backoff, purge);
//! - [`hooks`]: rule hooks and remote hooks with last-known fallback;
//! - [`agents`]: resolving and calling a datacenter's agent;
//! - [`store`], [`migration`]: persistence; [`service`], [`grpc`]: the API.

#![forbid(unsafe_code)]

pub mod agents;
pub mod desired;
pub mod error;
pub mod grpc;
pub mod hooks;
pub mod migration;
pub mod model;
pub mod plan;
pub mod reconcile;
pub mod service;
pub mod store;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use ctrlplane_proto::bootstrap::v1::bootstrap_service_server::BootstrapServiceServer;
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::{
    self, AuthConfig, ConfigError, DatabaseConfig, PeersConfig, ServerConfig, Settings,
};
use ctrlplane_runtime::server::{self, ServeError, ServeOptions};
use tokio::net::TcpListener;

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
    config::DATACENTER_ADDR,
    config::BOOTSTRAP_HOOKS_FILE,
    config::GC_GRACE,
    config::BOOTSTRAP_LEASE_TTL,
];

/// Default bind address.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], config::ports::BOOTSTRAP))
}

/// Configuration of the bootstrap process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server settings.
    pub server: ServerConfig,
    /// Token secret.
    pub auth: AuthConfig,
    /// Database.
    pub database: DatabaseConfig,
    /// Peer addresses (the datacenter service).
    pub peers: PeersConfig,
    /// Hooks file.
    pub hooks_file: Option<std::path::PathBuf>,
    /// Executor settings.
    pub reconcile: reconcile::ReconcileConfig,
    /// GC and telemetry settings.
    pub service: service::ServiceConfig,
}

impl Config {
    /// Reads every setting.
    ///
    /// # Errors
    /// Missing or invalid settings, naming the variable.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        s.check_known(SETTINGS)?;
        let defaults = service::ServiceConfig::default();
        let reconcile_defaults = reconcile::ReconcileConfig::default();
        Ok(Config {
            server: ServerConfig::from_settings(s, default_addr())?,
            auth: AuthConfig::from_settings(s)?,
            database: DatabaseConfig::from_settings(s, "bootstrap.db")?,
            peers: PeersConfig::from_settings(s),
            hooks_file: s
                .get(config::BOOTSTRAP_HOOKS_FILE)
                .map(std::path::PathBuf::from),
            reconcile: reconcile::ReconcileConfig {
                lease_ttl: s
                    .duration_or(config::BOOTSTRAP_LEASE_TTL, reconcile_defaults.lease_ttl)?,
                ..reconcile_defaults
            },
            service: service::ServiceConfig {
                gc_grace: s.duration_or(config::GC_GRACE, defaults.gc_grace)?,
                ..defaults
            },
        })
    }
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening or migrating the database failed.
    #[error("database: {0}")]
    Database(#[from] error::Error),
    /// The hooks file is invalid.
    #[error("hooks file: {0}")]
    Hooks(String),
    /// A peer address is invalid.
    #[error("{0}")]
    Address(#[from] ctrlplane_runtime::client::AddressError),
    /// The server failed.
    #[error("{0}")]
    Serve(#[from] ServeError),
}

/// A replica identity for leases: host, pid and a random suffix.
fn replica_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "bootstrap".into());
    format!(
        "{host}-{}-{}",
        std::process::id(),
        ctrlplane_core::id::new_id("r")
    )
}

/// Runs the service on `listener` until `shutdown` resolves.
///
/// # Errors
/// Database, hooks-file or server failures.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let db = ctrlplane_runtime::db::connect(&config.database)
        .await
        .map_err(error::Error::from)?;
    let store = store::Store::open(db).await?;
    let hooks_file = match &config.hooks_file {
        Some(p) => hooks::HooksFile::load(p).map_err(RunError::Hooks)?,
        None => hooks::HooksFile::default(),
    };
    for r in &hooks_file.remote {
        let timeout = r
            .timeout
            .as_deref()
            .map(config::parse_duration)
            .transpose()
            .map_err(RunError::Hooks)?;
        let timeout = hooks::check_registration(&r.name, &r.endpoint, timeout)
            .map_err(|e| RunError::Hooks(e.to_string()))?;
        store.upsert_hook(&r.name, &r.endpoint, timeout).await?;
    }
    let auth = Arc::new(Authenticator::new(&config.auth.secret));
    let channel = authed_channel(
        &config.peers.datacenter,
        BearerInterceptor::service(auth.clone(), "bootstrap"),
    )?;
    let agents =
        agents::AgentDirectory::new(channel, auth.clone(), std::time::Duration::from_secs(30));
    let hooks = hooks::Hooks::new(hooks_file.rules, store.clone(), auth.clone());
    let reconciler = reconcile::Reconciler::new(
        store.clone(),
        agents,
        hooks.clone(),
        config.reconcile.clone(),
        replica_id(),
        Arc::new(chrono::Utc::now),
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let service =
        service::BootstrapService::new(store, reconciler, hooks, config.service.clone(), stop_rx);
    let routes = tonic::service::Routes::new(BootstrapServiceServer::new(
        grpc::BootstrapGrpc::new(service),
    ));
    let options = ServeOptions {
        auth,
        service_names: vec!["ctrlplane.bootstrap.v1.BootstrapService"],
        grace: config.server.shutdown_grace,
        public_methods: Vec::new(),
    };
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    server::serve(listener, options, routes, shutdown).await?;
    Ok(())
}
