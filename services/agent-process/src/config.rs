//! Configuration of the process agent.
//!
//! Settings read (all defined in `ctrlplane_runtime::config`):
//! `CP_LISTEN_ADDR` (default `127.0.0.1:7401`), `CP_AUTH_SECRET` /
//! `CP_AUTH_SECRET_FILE`, `CP_STATE_DIR` (default `./data/agent-process`),
//! `CP_SHUTDOWN_GRACE`, `CP_LOG`, `CP_LOG_FORMAT`, and for joining the
//! control plane `CP_DATACENTER_ADDR`, `CP_JOIN_TOKEN`, `CP_ADVERTISE_ADDR`,
//! `CP_AUTO_JOIN` (see [`ctrlplane_agent::member`] for when joining is on).
//!
//! The supervision tunables ([`AgentConfig`]) have no environment
//! variables: their defaults suit production, and tests set them directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ctrlplane_agent::member::JoinConfig;
use ctrlplane_runtime::config::{self, AuthConfig, ConfigError, ServerConfig, Settings};

use crate::supervisor::Backoff;

/// Settings this process reads.
pub const SETTINGS: &[&str] = &[
    config::LISTEN_ADDR,
    config::AUTH_SECRET,
    config::AUTH_SECRET_FILE,
    config::LOG,
    config::LOG_FORMAT,
    config::SHUTDOWN_GRACE,
    config::STATE_DIR,
    config::DATACENTER_ADDR,
    config::JOIN_TOKEN,
    config::ADVERTISE_ADDR,
    config::AUTO_JOIN,
];

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "./data/agent-process";

/// Default bind address.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], config::ports::AGENT_PROCESS))
}

/// How the agent runs workloads.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// State directory (records, instance roots, identity, secrets).
    pub state_dir: PathBuf,
    /// Grace period of the stops the agent decides on itself (Restart,
    /// Deploy, Scale down, Deprovision).
    pub stop_grace: Duration,
    /// Restart delays of crashed processes.
    pub backoff: Backoff,
    /// A dependency without a health check counts as started once its
    /// process has run this long.
    pub dependency_settle: Duration,
    /// How long a rolling deploy waits for each new replica to be ready.
    pub rollout_timeout: Duration,
    /// Default Exec timeout.
    pub exec_timeout: Duration,
    /// Log files rotate past this size.
    pub log_max_bytes: u64,
}

impl AgentConfig {
    /// Production defaults for a state directory.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        AgentConfig {
            state_dir: state_dir.into(),
            stop_grace: Duration::from_secs(10),
            backoff: Backoff::default(),
            dependency_settle: Duration::from_millis(500),
            rollout_timeout: Duration::from_secs(60),
            exec_timeout: Duration::from_secs(60),
            log_max_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Configuration of the agent process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server settings.
    pub server: ServerConfig,
    /// Token secret.
    pub auth: AuthConfig,
    /// Workload supervision.
    pub agent: AgentConfig,
    /// Joining; `None` runs standalone.
    pub join: Option<JoinConfig>,
}

impl Config {
    /// Reads every setting.
    ///
    /// # Errors
    /// Missing or invalid settings, naming the variable.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        s.check_known(SETTINGS)?;
        let state_dir = PathBuf::from(s.get(config::STATE_DIR).unwrap_or(DEFAULT_STATE_DIR));
        let join = JoinConfig::from_settings(s, &state_dir)?;
        Ok(Config {
            server: ServerConfig::from_settings(s, default_addr())?,
            auth: AuthConfig::from_settings(s)?,
            agent: AgentConfig::new(state_dir),
            join,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn defaults_and_standalone() {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings::from_map([
            (config::AUTH_SECRET, SECRET),
            (config::STATE_DIR, dir.path().to_str().unwrap()),
        ]);
        let c = Config::from_settings(&s).unwrap();
        assert_eq!(c.server.listen_addr, default_addr());
        assert_eq!(c.agent.state_dir, dir.path());
        assert!(c.join.is_none());
        let d =
            Config::from_settings(&Settings::from_map([(config::AUTH_SECRET, SECRET)])).unwrap();
        assert_eq!(d.agent.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
    }
}
