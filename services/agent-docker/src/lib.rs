//! The Docker agent: runs each workload as containers on a Docker engine
//! and serves them as `ctrlplane.provider.v1.ProviderService`, provider
//! name `docker`.
//!
//! Per instance: a bridge network `SCOPE.INSTANCE` where every service is
//! reachable by its name (and `SERVICE-REPLICA`); a container per replica
//! named `SCOPE.INSTANCE.SERVICE.REPLICA`, labelled with instance, service,
//! role, replica, tenant, the spec and the release, plus the request's own
//! labels; named volumes (per replica for `stateful_set`). The engine is the
//! agent's only record: a restarted agent finds everything again from the
//! labels ([`names`]), and resumes start sequences it was cut off in.
//!
//! How specs become containers is in [`spec`], how status is read in
//! [`state`], the calls in [`provider`], logs and exec in [`logs`], usage
//! in [`usage`], the engine connection and error mapping in [`engine`].
//!
//! Limits (documented, not faked): `disk_mb` is not enforced and
//! `disk_bytes` is not reported; GPUs, blue-green and canary deploys are
//! not supported (not advertised: those calls answer `UNIMPLEMENTED`); only
//! the previous release is kept for Rollback; a follow of StreamLogs
//! follows the containers that exist when it starts.

#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod logs;
pub mod names;
pub mod provider;
pub mod spec;
pub mod state;
pub mod usage;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_agent::member::{self, Member, MemberError};
use ctrlplane_runtime::auth::Authenticator;
use tokio::net::TcpListener;

pub use config::{Config, DockerConfig};
pub use provider::{CAPABILITIES, DockerAgent, PROVIDER_NAME};

/// How long shutdown waits for start sequences in flight.
pub const TASKS_GRACE: Duration = Duration::from_secs(5);

/// Runs the agent on `listener` until `shutdown` resolves: checks the
/// engine, serves `ProviderService`, and — when `config.join` is set —
/// joins the control plane and heartbeats. Workloads keep running when the
/// agent stops.
///
/// # Errors
/// See [`MemberError`]; a join refusal or a revoked agent stops the server.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MemberError> {
    let agent = DockerAgent::new(config.docker.clone());
    agent.start().await;
    let result = serve(agent.clone(), &config, listener, shutdown).await;
    agent.shutdown(TASKS_GRACE).await;
    result
}

/// Serves an agent (see [`run`]).
///
/// # Errors
/// See [`MemberError`].
pub async fn serve(
    agent: Arc<DockerAgent>,
    config: &Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MemberError> {
    std::fs::create_dir_all(&config.docker.state_dir).map_err(|source| {
        MemberError::Join(ctrlplane_agent::join::JoinError::Io {
            path: config.docker.state_dir.display().to_string(),
            source,
        })
    })?;
    let member = Member {
        auth: Arc::new(Authenticator::new(&config.auth.secret)),
        shutdown_grace: config.server.shutdown_grace,
        join: config.join.clone(),
        state_dir: config.docker.state_dir.clone(),
        info: [
            ("engine".to_string(), config.docker.host.clone()),
            ("scope".to_string(), config.docker.scope.clone()),
        ]
        .into(),
    };
    member::serve_member(agent, member, listener, shutdown).await
}
