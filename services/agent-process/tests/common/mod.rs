//! Starting the process agent in-process for tests, and making sure no test
//! leaves a process behind.
//!
//! [`TestAgent`] serves an [`Agent`] on `127.0.0.1:0`; dropping it halts
//! the agent (every process group it knows is killed, nothing new may
//! start), while [`TestAgent::shutdown`] lets go of the workloads the way a
//! real agent restart does. [`Sweeper`] is the backstop: when dropped it
//! SIGKILLs every process whose `CP_INSTANCE_ROOT` lies under its state
//! directory, whichever agent started it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_agent_process::supervisor::Backoff;
use ctrlplane_agent_process::{Agent, AgentConfig, Config, procfs};
use ctrlplane_conformance::{Harness, TestApp};
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::config::{AuthConfig, ServerConfig};

/// The token secret of test agents.
pub const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

/// Supervision tuned for tests: quick restarts and stops.
pub fn agent_config(state_dir: &Path) -> AgentConfig {
    let mut cfg = AgentConfig::new(state_dir);
    cfg.backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        reset_after: Duration::from_secs(30),
    };
    cfg.stop_grace = Duration::from_secs(3);
    cfg
}

/// An agent served in-process.
pub struct TestAgent {
    /// The agent.
    pub agent: Arc<Agent>,
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

impl TestAgent {
    /// Opens `cfg.state_dir` (re-adopting what it records) and serves.
    pub async fn start(cfg: AgentConfig) -> TestAgent {
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
            agent: cfg.clone(),
            join: None,
        };
        let agent = Agent::open(cfg).expect("open the state dir");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = agent.clone();
        let server = tokio::spawn(async move {
            let _ = ctrlplane_agent_process::serve(served, &config, listener, async {
                let _ = stopped.await;
            })
            .await;
        });
        TestAgent {
            agent,
            endpoint: format!("http://{addr}"),
            stop: Some(stop),
            server: Some(server),
        }
    }

    /// Stops serving and lets go of the workloads (they keep running).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
        self.agent.shutdown(Duration::from_secs(10)).await;
    }

    /// A harness (for the kit's client and helpers) whose guard owns
    /// `guard`.
    pub fn harness(&self, guard: Box<dyn std::any::Any + Send>) -> Harness {
        Harness {
            endpoint: self.endpoint.clone(),
            auth: Arc::new(Authenticator::new(SECRET)),
            testapp: testapp(),
            guard,
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if self.stop.is_some() {
            self.agent.halt();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The test app as the kit describes it.
pub fn testapp() -> TestApp {
    TestApp {
        image: "ctrlplane-testapp:dev".to_string(),
        program: ctrlplane_conformance::testapp_path().display().to_string(),
    }
}

/// A live process of a workload, found through `/proc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Pid.
    pub pid: i32,
    /// Its process group.
    pub pgrp: i32,
    /// `CP_INSTANCE_ID`.
    pub instance: String,
    /// `CP_SERVICE_NAME`.
    pub service: String,
    /// `CP_REPLICA`.
    pub replica: String,
}

/// Every live process whose `CP_INSTANCE_ROOT` is under `state_dir`.
pub fn processes_under(state_dir: &Path) -> Vec<Found> {
    let prefix = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let mut all = procfs::all_processes();
    all.sort_by_key(|s| s.pid);
    all.into_iter()
        .filter(|s| s.running())
        .filter_map(|s| {
            let root = procfs::environ_var(s.pid, "CP_INSTANCE_ROOT")?;
            if !Path::new(&root).starts_with(&prefix) {
                return None;
            }
            Some(Found {
                pid: s.pid,
                pgrp: s.pgrp,
                instance: procfs::environ_var(s.pid, "CP_INSTANCE_ID")?,
                service: procfs::environ_var(s.pid, "CP_SERVICE_NAME")?,
                replica: procfs::environ_var(s.pid, "CP_REPLICA")?,
            })
        })
        .collect()
}

/// The live processes of one instance.
pub fn processes_of(state_dir: &Path, instance: &str) -> Vec<Found> {
    processes_under(state_dir)
        .into_iter()
        .filter(|p| p.instance == instance)
        .collect()
}

/// Kills every process of a state directory when dropped.
pub struct Sweeper(pub PathBuf);

impl Drop for Sweeper {
    fn drop(&mut self) {
        for p in processes_under(&self.0) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Polls `f` every 50 ms until it holds, for at most `timeout`.
pub async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
