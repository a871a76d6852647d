//! The scheduler: workers that move the system forward on timers and on
//! change events, run by one leader among the replicas.
//!
//! - [`worker`]: the framework (interval with jitter, first run at start,
//!   never two runs at once, per-run timeout, panics caught);
//! - [`leader`]: leader election through a lease row;
//! - [`jobs`]: the workers (reconciler, watch, status_sync, gc, telemetry,
//!   provider_health);
//! - [`grpc`]: the `SchedulerService` API.

#![forbid(unsafe_code)]

pub mod grpc;
pub mod jobs;
pub mod leader;
pub mod migration;
pub mod worker;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient;
use ctrlplane_proto::bootstrap::v1::bootstrap_service_client::BootstrapServiceClient;
use ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient;
use ctrlplane_proto::scheduler::v1::scheduler_service_server::SchedulerServiceServer;
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::{
    self, AuthConfig, ConfigError, DatabaseConfig, PeersConfig, ServerConfig, Settings,
};
use ctrlplane_runtime::server::{self, ServeError, ServeOptions};
use tokio::net::TcpListener;

use crate::worker::{Job, WorkerSpec, Workers};

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
    config::BOOTSTRAP_ADDR,
    config::RECONCILE_INTERVAL,
    config::STATUS_SYNC_INTERVAL,
    config::GC_INTERVAL,
    config::TELEMETRY_INTERVAL,
    config::PROVIDER_HEALTH_INTERVAL,
    config::LEADER_LEASE,
];

/// Default bind address.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], config::ports::SCHEDULER))
}

/// Worker intervals.
#[derive(Debug, Clone)]
pub struct Intervals {
    /// Periodic reconcile of every datacenter.
    pub reconcile: Duration,
    /// Status sync.
    pub status_sync: Duration,
    /// Garbage collection.
    pub gc: Duration,
    /// Resource samples.
    pub telemetry: Duration,
    /// Agent health probes.
    pub provider_health: Duration,
}

/// Configuration of the scheduler process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server settings.
    pub server: ServerConfig,
    /// Token secret.
    pub auth: AuthConfig,
    /// Database (the leader lease).
    pub database: DatabaseConfig,
    /// Peer addresses.
    pub peers: PeersConfig,
    /// Worker intervals.
    pub intervals: Intervals,
    /// Leader lease length.
    pub leader_lease: Duration,
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
            database: DatabaseConfig::from_settings(s, "scheduler.db")?,
            peers: PeersConfig::from_settings(s),
            intervals: Intervals {
                reconcile: s.duration_or(config::RECONCILE_INTERVAL, Duration::from_secs(60))?,
                status_sync: s
                    .duration_or(config::STATUS_SYNC_INTERVAL, Duration::from_secs(30))?,
                gc: s.duration_or(config::GC_INTERVAL, Duration::from_secs(300))?,
                telemetry: s.duration_or(config::TELEMETRY_INTERVAL, Duration::from_secs(60))?,
                provider_health: s
                    .duration_or(config::PROVIDER_HEALTH_INTERVAL, Duration::from_secs(15))?,
            },
            leader_lease: s.duration_or(config::LEADER_LEASE, Duration::from_secs(15))?,
        })
    }
}

/// Why the process stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Opening or migrating the database failed.
    #[error("database: {0}")]
    Database(#[from] sea_orm::DbErr),
    /// A peer address is invalid.
    #[error("{0}")]
    Address(#[from] ctrlplane_runtime::client::AddressError),
    /// The server failed.
    #[error("{0}")]
    Serve(#[from] ServeError),
}

/// The workers with their specs, over `peers`.
pub fn workers(peers: jobs::Peers, intervals: &Intervals) -> Vec<(WorkerSpec, Arc<dyn Job>)> {
    let spec = |name: &str, interval: Duration, timeout: Option<Duration>| WorkerSpec {
        name: name.to_string(),
        interval,
        jitter: 0.1,
        timeout,
    };
    let long = |i: Duration| Some(i.max(Duration::from_secs(60)) * 5);
    vec![
        (
            spec("reconciler", intervals.reconcile, long(intervals.reconcile)),
            jobs::reconciler(peers.clone()),
        ),
        (
            WorkerSpec {
                name: "watch".into(),
                interval: Duration::from_secs(1),
                jitter: 0.0,
                timeout: None,
            },
            Arc::new(jobs::Watcher::new(peers.clone())) as Arc<dyn Job>,
        ),
        (
            spec(
                "status_sync",
                intervals.status_sync,
                long(intervals.status_sync),
            ),
            jobs::status_sync(peers.clone()),
        ),
        (
            spec("gc", intervals.gc, long(intervals.gc)),
            jobs::gc(peers.clone()),
        ),
        (
            spec("telemetry", intervals.telemetry, long(intervals.telemetry)),
            jobs::telemetry(peers.clone()),
        ),
        (
            spec(
                "provider_health",
                intervals.provider_health,
                long(intervals.provider_health),
            ),
            jobs::provider_health(peers),
        ),
    ]
}

/// Runs the scheduler on `listener` until `shutdown` resolves.
///
/// # Errors
/// Database or server failures.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let db = ctrlplane_runtime::db::connect(&config.database).await?;
    migration::run(&db).await?;
    let auth = Arc::new(Authenticator::new(&config.auth.secret));
    let token = || BearerInterceptor::service(auth.clone(), "scheduler");
    let dc_channel = authed_channel(&config.peers.datacenter, token())?;
    let peers = jobs::Peers {
        datacenters: DatacenterServiceClient::new(dc_channel.clone()),
        registry: AgentRegistryServiceClient::new(dc_channel),
        bootstrap: BootstrapServiceClient::new(authed_channel(&config.peers.bootstrap, token())?),
        call_timeout: Duration::from_secs(60),
        concurrency: 16,
    };
    let replica = format!(
        "{}-{}-{}",
        std::env::var("HOSTNAME").unwrap_or_else(|_| "scheduler".into()),
        std::process::id(),
        ctrlplane_core::id::new_id("r")
    );
    let election = leader::Election::new(db, replica, config.leader_lease);
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(false);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let workers = Workers::new(workers(peers, &config.intervals), leader_rx);
    let campaign = tokio::spawn(election.clone().campaign(leader_tx, stop_rx.clone()));
    let mut loops = workers.spawn(stop_rx);

    let routes = tonic::service::Routes::new(SchedulerServiceServer::new(
        grpc::SchedulerGrpc::new(workers, election),
    ));
    let options = ServeOptions {
        auth,
        service_names: vec!["ctrlplane.scheduler.v1.SchedulerService"],
        grace: config.server.shutdown_grace,
        public_methods: Vec::new(),
    };
    let stop = stop_tx.clone();
    let result = server::serve(listener, options, routes, async move {
        shutdown.await;
        let _ = stop.send(true);
    })
    .await;
    let _ = stop_tx.send(true);
    // Background tasks are joined: the lease is given up, loops end.
    let _ = tokio::time::timeout(Duration::from_secs(10), campaign).await;
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        while loops.join_next().await.is_some() {}
    })
    .await;
    result?;
    Ok(())
}
