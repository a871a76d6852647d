//! Configuration of the process agent.
//!
//! Settings read (all defined in `ctrlplane_runtime::config`):
//! `CP_LISTEN_ADDR` (default `127.0.0.1:7401`), `CP_AUTH_SECRET` /
//! `CP_AUTH_SECRET_FILE`, `CP_STATE_DIR` (default `./data/agent-process`),
//! `CP_SHUTDOWN_GRACE`, `CP_LOG`, `CP_LOG_FORMAT`, and for joining the
//! control plane `CP_DATACENTER_ADDR`, `CP_JOIN_TOKEN`, `CP_ADVERTISE_ADDR`.
//!
//! Joining is on when `CP_DATACENTER_ADDR` or `CP_JOIN_TOKEN` is set, or
//! when the state directory already holds an identity (a joined agent
//! always heartbeats). Without any of them the agent runs standalone.
//!
//! The supervision tunables ([`AgentConfig`]) have no environment
//! variables: their defaults suit production, and tests set them directly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ctrlplane_runtime::config::{
    self, AuthConfig, ConfigError, PeersConfig, ServerConfig, Settings,
};

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

/// Joining the control plane.
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// Address of the datacenter service (the agent registry).
    pub datacenter_addr: String,
    /// Join token for the first start.
    pub join_token: Option<String>,
    /// Endpoint to advertise; default `http://<bound address>`.
    pub advertise_addr: Option<String>,
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
        let joined = state_dir
            .join(ctrlplane_agent::join::IDENTITY_FILE)
            .exists();
        let wants_join =
            s.get(config::DATACENTER_ADDR).is_some() || s.get(config::JOIN_TOKEN).is_some();
        let join = (joined || wants_join).then(|| JoinConfig {
            datacenter_addr: PeersConfig::from_settings(s).datacenter,
            join_token: s.get(config::JOIN_TOKEN).map(str::to_string),
            advertise_addr: s.get(config::ADVERTISE_ADDR).map(str::to_string),
        });
        if let Some(addr) = s.get(config::ADVERTISE_ADDR)
            && !(addr.starts_with("http://") || addr.starts_with("https://"))
        {
            return Err(ConfigError::Invalid {
                name: config::ADVERTISE_ADDR.to_string(),
                value: addr.to_string(),
                reason: "expected http://HOST:PORT or https://HOST:PORT".to_string(),
            });
        }
        Ok(Config {
            server: ServerConfig::from_settings(s, default_addr())?,
            auth: AuthConfig::from_settings(s)?,
            agent: AgentConfig::new(state_dir),
            join,
        })
    }
}

/// The endpoint advertised for a bound address: `http://addr`, with an
/// unspecified IP (`0.0.0.0`, `::`) replaced by loopback.
pub fn advertised_endpoint(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        addr.ip()
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
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

    #[test]
    fn join_settings() {
        let s = Settings::from_map([
            (config::AUTH_SECRET, SECRET),
            (config::JOIN_TOKEN, "tok"),
            (config::ADVERTISE_ADDR, "http://10.0.0.1:7401"),
        ]);
        let j = Config::from_settings(&s).unwrap().join.unwrap();
        assert_eq!(j.datacenter_addr, "http://127.0.0.1:7100");
        assert_eq!(j.join_token.as_deref(), Some("tok"));
        assert_eq!(j.advertise_addr.as_deref(), Some("http://10.0.0.1:7401"));
        let bad = Settings::from_map([
            (config::AUTH_SECRET, SECRET),
            (config::ADVERTISE_ADDR, "10.0.0.1:7401"),
        ]);
        let err = Config::from_settings(&bad).unwrap_err().to_string();
        assert!(err.contains("CP_ADVERTISE_ADDR"), "{err}");
        let unknown = Settings::from_map([(config::AUTH_SECRET, SECRET), ("CP_DATABASE_URL", "x")]);
        assert!(
            Config::from_settings(&unknown).is_ok(),
            "known elsewhere is tolerated"
        );
    }

    #[test]
    fn advertised_endpoints_avoid_unspecified_addresses() {
        assert_eq!(
            advertised_endpoint("0.0.0.0:7401".parse().unwrap()),
            "http://127.0.0.1:7401"
        );
        assert_eq!(
            advertised_endpoint("10.1.2.3:1".parse().unwrap()),
            "http://10.1.2.3:1"
        );
    }
}
