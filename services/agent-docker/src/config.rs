//! Configuration of the Docker agent.
//!
//! Settings read (all defined in `ctrlplane_runtime::config`):
//! `CP_LISTEN_ADDR` (default `127.0.0.1:7402`), `CP_AUTH_SECRET` /
//! `CP_AUTH_SECRET_FILE`, `CP_STATE_DIR` (default `./data/agent-docker`:
//! the identity file and `secrets/`), `CP_SHUTDOWN_GRACE`, `CP_LOG`,
//! `CP_LOG_FORMAT`, `CP_DOCKER_HOST` (default
//! `unix:///var/run/docker.sock`), `CP_DOCKER_SCOPE` (default `ctrlplane`),
//! `CP_DOCKER_ENDPOINT_HOST` (default `127.0.0.1`), and for joining the
//! control plane `CP_DATACENTER_ADDR`, `CP_JOIN_TOKEN`, `CP_ADVERTISE_ADDR`,
//! `CP_AUTO_JOIN` (see [`ctrlplane_agent::member`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ctrlplane_agent::member::JoinConfig;
use ctrlplane_runtime::config::{self, AuthConfig, ConfigError, ServerConfig, Settings};

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
    config::DOCKER_HOST,
    config::DOCKER_SCOPE,
    config::DOCKER_ENDPOINT_HOST,
];

/// Default state directory.
pub const DEFAULT_STATE_DIR: &str = "./data/agent-docker";
/// Default engine address.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";
/// Default scope.
pub const DEFAULT_SCOPE: &str = "ctrlplane";

/// Default bind address.
pub fn default_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], config::ports::AGENT_DOCKER))
}

/// How the agent drives the engine.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Engine address (`unix://…`, `tcp://…`, `http://…`).
    pub host: String,
    /// Scope of names and labels: agents with different scopes share an
    /// engine without seeing each other's workloads.
    pub scope: String,
    /// Host name reported in endpoints.
    pub endpoint_host: String,
    /// State directory (identity file, `secrets/`).
    pub state_dir: PathBuf,
    /// Grace period of the stops the agent decides on itself (Restart,
    /// Deploy, Scale down, Deprovision).
    pub stop_grace: Duration,
    /// How long Provision, Start and Restart wait for the start sequence
    /// before answering (it goes on in the background after that).
    pub start_wait: Duration,
    /// How long a dependency may take to be up before its dependents start
    /// anyway, and a rolling deploy waits for each new replica.
    pub rollout_timeout: Duration,
    /// A dependency without a health check counts as up once running this
    /// long.
    pub dependency_settle: Duration,
    /// Default Exec timeout.
    pub exec_timeout: Duration,
}

impl DockerConfig {
    /// Production defaults for an engine and a state directory.
    pub fn new(host: impl Into<String>, state_dir: impl Into<PathBuf>) -> Self {
        DockerConfig {
            host: host.into(),
            scope: DEFAULT_SCOPE.to_string(),
            endpoint_host: "127.0.0.1".to_string(),
            state_dir: state_dir.into(),
            stop_grace: Duration::from_secs(10),
            start_wait: Duration::from_secs(30),
            rollout_timeout: Duration::from_secs(60),
            dependency_settle: Duration::from_millis(500),
            exec_timeout: Duration::from_secs(60),
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
    /// The engine.
    pub docker: DockerConfig,
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
        let mut docker = DockerConfig::new(
            s.get(config::DOCKER_HOST).unwrap_or(DEFAULT_DOCKER_HOST),
            state_dir,
        );
        if let Some(scope) = s.get(config::DOCKER_SCOPE) {
            if !valid_scope(scope) {
                return Err(ConfigError::Invalid {
                    name: config::DOCKER_SCOPE.to_string(),
                    value: scope.to_string(),
                    reason: "expected 1-32 characters of a-z, 0-9 and '-', starting with a letter"
                        .to_string(),
                });
            }
            docker.scope = scope.to_string();
        }
        if let Some(host) = s.get(config::DOCKER_ENDPOINT_HOST) {
            docker.endpoint_host = host.to_string();
        }
        let host = &docker.host;
        if !["unix://", "tcp://", "http://"]
            .iter()
            .any(|p| host.starts_with(p))
        {
            return Err(ConfigError::Invalid {
                name: config::DOCKER_HOST.to_string(),
                value: host.clone(),
                reason: "expected unix:///path/to/docker.sock, tcp://HOST:PORT or http://HOST:PORT"
                    .to_string(),
            });
        }
        Ok(Config {
            server: ServerConfig::from_settings(s, default_addr())?,
            auth: AuthConfig::from_settings(s)?,
            docker,
            join,
        })
    }
}

/// Whether a scope is usable in Docker object names and labels.
pub fn valid_scope(scope: &str) -> bool {
    (1..=32).contains(&scope.len())
        && scope.starts_with(|c: char| c.is_ascii_lowercase())
        && scope
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn defaults_and_overrides() {
        let c =
            Config::from_settings(&Settings::from_map([(config::AUTH_SECRET, SECRET)])).unwrap();
        assert_eq!(c.server.listen_addr, default_addr());
        assert_eq!(c.docker.host, DEFAULT_DOCKER_HOST);
        assert_eq!(c.docker.scope, "ctrlplane");
        assert_eq!(c.docker.endpoint_host, "127.0.0.1");
        assert!(c.join.is_none());
        let c = Config::from_settings(&Settings::from_map([
            (config::AUTH_SECRET, SECRET),
            (config::DOCKER_HOST, "tcp://10.0.0.2:2375"),
            (config::DOCKER_SCOPE, "team-a"),
            (config::DOCKER_ENDPOINT_HOST, "10.0.0.2"),
            (config::AUTO_JOIN, "true"),
        ]))
        .unwrap();
        assert_eq!(c.docker.host, "tcp://10.0.0.2:2375");
        assert_eq!(c.docker.scope, "team-a");
        assert_eq!(c.docker.endpoint_host, "10.0.0.2");
        assert!(c.join.unwrap().auto_join);
    }

    #[test]
    fn bad_settings_name_the_variable() {
        for (name, value) in [
            (config::DOCKER_HOST, "/var/run/docker.sock"),
            (config::DOCKER_SCOPE, "Bad Scope"),
        ] {
            let err = Config::from_settings(&Settings::from_map([
                (config::AUTH_SECRET, SECRET),
                (name, value),
            ]))
            .unwrap_err()
            .to_string();
            assert!(err.contains(name), "{err}");
        }
    }
}
