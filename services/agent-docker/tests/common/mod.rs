//! Starting the Docker agent in-process against the real engine for tests.
//!
//! Every [`TestAgent`] gets its own scope (`cpt-<random>`), so tests running
//! in parallel on one engine never see each other's workloads, and a
//! [`Sweeper`] that removes whatever is left of that scope (containers,
//! networks, volumes) when dropped, passed or failed.
//!
//! The workloads run the test app image `ctrlplane-testapp:dev` (a FROM
//! scratch image of the static `ctrlplane-testapp`), which
//! `deploy/build-images.sh` builds; `tests/run.sh` runs it before the tests.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_agent_docker::{Config, DockerAgent, DockerConfig};
use ctrlplane_conformance::{Harness, TestApp};
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::config::{AuthConfig, ServerConfig};
use rand::Rng;

/// The token secret of test agents.
pub const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
/// The test app image.
pub const TESTAPP_IMAGE: &str = "ctrlplane-testapp:dev";
/// The engine the tests use.
pub const DOCKER_HOST: &str = "unix:///var/run/docker.sock";

/// Panics with what to do when the test app image is missing.
pub fn require_testapp_image() {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", TESTAPP_IMAGE])
        .output()
        .expect("the docker CLI runs");
    assert!(
        out.status.success(),
        "the image {TESTAPP_IMAGE} is not on the Docker engine: build it with \
         `deploy/build-images.sh` (tests/run.sh does) — {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// A fresh scope for one test.
pub fn scope() -> String {
    format!("cpt-{:08x}", rand::rng().random::<u32>())
}

/// Agent settings tuned for tests: short stop grace, quick rollouts.
pub fn docker_config(state_dir: &Path, scope: &str) -> DockerConfig {
    let mut cfg = DockerConfig::new(DOCKER_HOST, state_dir);
    cfg.scope = scope.to_string();
    cfg.stop_grace = Duration::from_secs(2);
    cfg
}

/// An agent served in-process.
pub struct TestAgent {
    /// The agent.
    pub agent: Arc<DockerAgent>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestAgent {
    /// Starts an agent with `cfg` on a free port.
    pub async fn start(cfg: DockerConfig) -> TestAgent {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = Config {
            server: ServerConfig {
                listen_addr: addr,
                shutdown_grace: Duration::from_secs(1),
            },
            auth: AuthConfig {
                secret: SECRET.to_vec(),
            },
            docker: cfg.clone(),
            join: None,
        };
        let agent = DockerAgent::new(cfg);
        agent.start().await;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = agent.clone();
        tokio::spawn(async move {
            let _ = ctrlplane_agent_docker::serve(served, &config, listener, async {
                let _ = stopped.await;
            })
            .await;
        });
        TestAgent {
            agent,
            endpoint: format!("http://{addr}"),
            stop: Some(stop),
        }
    }

    /// A harness whose guard owns `guard`.
    pub fn harness(&self, guard: Box<dyn std::any::Any + Send>) -> Harness {
        Harness {
            endpoint: self.endpoint.clone(),
            auth: Arc::new(Authenticator::new(SECRET)),
            testapp: TestApp {
                image: TESTAPP_IMAGE.to_string(),
                program: "/ctrlplane-testapp".to_string(),
            },
            guard,
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Removes every object of a scope when dropped.
pub struct Sweeper(pub String);

impl Sweeper {
    /// Names (or ids) of the scope's objects of one kind.
    pub fn list(&self, kind: &str) -> Vec<String> {
        let filter = format!("label=ctrlplane.io/scope={}", self.0);
        let args: Vec<&str> = match kind {
            "container" => vec!["ps", "-aq", "--filter", &filter],
            "network" => vec!["network", "ls", "-q", "--filter", &filter],
            _ => vec!["volume", "ls", "-q", "--filter", &filter],
        };
        let out = Command::new("docker").args(&args).output();
        out.map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        for (kind, rm) in [
            ("container", vec!["rm", "-f", "-v"]),
            ("network", vec!["network", "rm"]),
            ("volume", vec!["volume", "rm", "-f"]),
        ] {
            let ids = self.list(kind);
            if !ids.is_empty() {
                let _ = Command::new("docker").args(&rm).args(&ids).output();
            }
        }
    }
}
