//! The process agent: runs each service of a workload as local OS
//! processes (like Nomad's `raw_exec`) and serves them as
//! `ctrlplane.provider.v1.ProviderService`, provider name `process`.
//!
//! What it does, in short: `command` + `args` are what runs (the image is
//! only recorded); every instance gets a root directory under the state
//! directory that is its processes' working directory; inits run to
//! completion in `depends_on` order, then main and sidecars start in
//! `depends_on` order; every replica is its own process group, restarted
//! with capped exponential backoff when it ends; ports, volumes, config
//! files, health checks, logs, Exec and resource usage work as described in
//! the modules below. The state directory survives an agent restart: live
//! process groups are re-adopted, ones that ended while the agent was down
//! are restarted and counted, and nothing the agent started is lost track
//! of.
//!
//! Limits of running without containers (documented here because callers
//! may expect them to hold): a volume's `mount_path` cannot be honoured — the
//! process finds its volume directory in `CP_VOLUME_<NAME>`; resource limits
//! (`cpu_millis`, `memory_mb`, `disk_mb`) are recorded, not enforced; config
//! file paths must be relative to the instance root; secrets are read from
//! files under `CP_STATE_DIR/secrets/`.
//!
//! Deliberate choices where the contract leaves room (see also the module
//! docs):
//! - a service that `depends_on` a main or sidecar starts once every replica
//!   of it is running *and ready* — health check passed, or, without one,
//!   alive for `dependency_settle` (500 ms) — rather than merely spawned, so
//!   start order is observable even on a loaded machine;
//! - inits run once per run (their `replicas` is ignored) and again on
//!   Start and on Restart of the whole instance, like a pod's init
//!   containers; an init cut short by an agent restart is run again (its
//!   exit code cannot be learnt afterwards);
//! - `restarts` counts automatic restarts (including a process found dead
//!   after an agent restart), not operator Restarts; a Restart of the whole
//!   instance advances `started_at`, one of a single service replaces its
//!   replicas one by one;
//! - Deploy of a release id already deployed earlier (not the current one)
//!   is FAILED_PRECONDITION (use Rollback); a Deploy naming an unknown
//!   service is NOT_FOUND; Rollback keeps the current replica counts;
//! - processes also get `CP_INSTANCE_ROOT` (the instance root);
//! - to keep workloads running across agent restarts, the agent must not be
//!   run under a supervisor that kills its whole control group on stop
//!   (systemd: `KillMode=process`).
//!
//! Layout: [`config`] (settings), [`provider`] (the [`Provider`]
//! implementation), [`instance`] (one instance at run time), [`supervisor`]
//! (restart loop and backoff), [`process`] (process groups and signals),
//! [`health`] (probes), [`logs`] (capture and StreamLogs), [`ports`],
//! [`workdir`] (instance root and environment), [`state`] and [`model`]
//! (persisted records), [`procfs`] (what is read from `/proc`).
//!
//! [`Provider`]: ctrlplane_agent::Provider

#![forbid(unsafe_code)]

pub mod config;
pub mod health;
pub mod instance;
pub mod logs;
pub mod model;
pub mod ports;
pub mod process;
pub mod procfs;
pub mod provider;
pub mod state;
pub mod supervisor;
pub mod workdir;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_agent::member::{self, Member, MemberError};
use ctrlplane_runtime::auth::Authenticator;
use tokio::net::TcpListener;

pub use config::{AgentConfig, Config};
pub use ctrlplane_agent::member::JoinConfig;
pub use provider::{Agent, CAPABILITIES, OpenError, PROVIDER_NAME};

/// How long shutdown waits for the agent's own tasks.
pub const TASKS_GRACE: Duration = Duration::from_secs(5);

/// Why the agent stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The state directory is unusable.
    #[error("{0}")]
    Open(#[from] OpenError),
    /// Serving, joining or heartbeating failed.
    #[error("{0}")]
    Member(#[from] MemberError),
}

/// Runs the agent on `listener` until `shutdown` resolves: opens the state
/// directory (re-adopting workloads), serves `ProviderService`, and — when
/// `config.join` is set — joins the control plane and heartbeats. On
/// shutdown the workloads keep running for the next agent to re-adopt.
///
/// # Errors
/// See [`RunError`]; a join refusal or a revoked agent stops the server and
/// is returned.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let agent = Agent::open(config.agent.clone())?;
    let result = serve(agent.clone(), &config, listener, shutdown).await;
    agent.shutdown(TASKS_GRACE).await;
    result
}

/// Serves an opened agent (see [`run`]); the agent is not shut down.
///
/// # Errors
/// See [`RunError`].
pub async fn serve(
    agent: Arc<Agent>,
    config: &Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RunError> {
    let member = Member {
        auth: Arc::new(Authenticator::new(&config.auth.secret)),
        shutdown_grace: config.server.shutdown_grace,
        join: config.join.clone(),
        state_dir: agent.state_dir().to_path_buf(),
        info: [(
            "state_dir".to_string(),
            agent.state_dir().display().to_string(),
        )]
        .into(),
    };
    member::serve_member(agent, member, listener, shutdown).await?;
    Ok(())
}
