//! Against the real process agent, started in-process with a temp state
//! directory and joined to the real datacenter server with a join token:
//! install, update in place, retire, drift repair, GC of strays, and
//! deletion of the datacenter. Nothing is left running: the guard halts the
//! agent (killing its process groups) and sweeps anything under its state
//! directory.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use ctrlplane_agent::client::{ProviderClient, provider_client};
use ctrlplane_agent_process::supervisor::Backoff;
use ctrlplane_agent_process::{Agent, AgentConfig, Config, JoinConfig, procfs};
use ctrlplane_bootstrap::model::State;
use ctrlplane_bootstrap::plan::Kind;
use ctrlplane_bootstrap::service::ServiceConfig;
use ctrlplane_proto::agent::v1 as agpb;
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1 as dcpb;
use ctrlplane_proto::provider::v1::{self as pb, ServiceRole, ServiceSpec};
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::config::{AuthConfig, ServerConfig};

/// Generous bound for anything a loaded machine does (process start,
/// rollouts, stops).
const SLOW: Duration = Duration::from_secs(60);

/// The process agent served in-process and joined to the control plane.
struct ProcessAgent {
    agent: Arc<Agent>,
    client: ProviderClient,
    state_dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for ProcessAgent {
    fn drop(&mut self) {
        // Kill every process group the agent runs, then sweep whatever
        // else lives under its state directory.
        self.agent.halt();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for p in processes_under(self.state_dir.path()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.0),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Live processes started by an agent with this state directory:
/// (pid, instance id, env var `GREETING`).
fn processes_under(state_dir: &Path) -> Vec<(i32, String, Option<String>)> {
    let prefix: PathBuf =
        std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    procfs::all_processes()
        .into_iter()
        .filter(|s| s.running())
        .filter_map(|s| {
            let root = procfs::environ_var(s.pid, "CP_INSTANCE_ROOT")?;
            if !Path::new(&root).starts_with(&prefix) {
                return None;
            }
            Some((
                s.pid,
                procfs::environ_var(s.pid, "CP_INSTANCE_ID")?,
                procfs::environ_var(s.pid, "GREETING"),
            ))
        })
        .collect()
}

async fn start_agent(env: &Env) -> ProcessAgent {
    let token = env
        .registry
        .clone()
        .create_join_token(agpb::CreateJoinTokenRequest {
            provider_name: "process".into(),
            ttl: None,
            max_uses: 1,
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let state_dir = tempfile::tempdir().unwrap();
    let mut cfg = AgentConfig::new(state_dir.path());
    cfg.backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(2),
        reset_after: Duration::from_secs(30),
    };
    cfg.stop_grace = Duration::from_secs(3);
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
        join: Some(JoinConfig {
            datacenter_addr: env.dc_addr.clone(),
            join_token: Some(token),
            advertise_addr: None,
            auto_join: false,
        }),
    };
    let agent = Agent::open(cfg).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = agent.clone();
    tokio::spawn(async move {
        let r = ctrlplane_agent_process::serve(served, &config, listener, async {
            let _ = stopped.await;
        })
        .await;
        if let Err(e) = r {
            eprintln!("process agent stopped: {e}");
        }
    });
    let endpoint = format!("http://{addr}");
    // Joined once the registry lists it.
    let registry = env.registry.clone();
    eventually("the process agent to join", SLOW, || {
        let mut registry = registry.clone();
        async move {
            let agents = registry
                .list_agents(agpb::ListAgentsRequest {
                    provider_name: "process".into(),
                    ..Default::default()
                })
                .await
                .ok()?
                .into_inner()
                .agents;
            (!agents.is_empty()).then_some(())
        }
    })
    .await;
    let client = provider_client(&endpoint, Arc::new(Authenticator::new(SECRET)), "test").unwrap();
    ProcessAgent {
        agent,
        client,
        state_dir,
        stop: Some(stop),
    }
}

fn looping(name: &str, greeting: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            image: "shell".into(),
            command: vec![
                "sh".into(),
                "-c".into(),
                "while true; do echo \"up $GREETING\"; sleep 1; done".into(),
            ],
            env: [("GREETING".to_string(), greeting.to_string())].into(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn status(agent: &ProcessAgent, id: &str) -> Result<pb::InstanceStatus, tonic::Status> {
    agent
        .client
        .clone()
        .get_status(pb::GetStatusRequest {
            instance_id: id.into(),
        })
        .await
        .map(|r| r.into_inner().status.unwrap())
}

async fn wait_state(agent: &ProcessAgent, id: &str, want: pb::InstanceState) {
    eventually(&format!("{id} to be {want:?}"), SLOW, || async {
        let s = status(agent, id).await.ok()?;
        (s.state == want as i32).then_some(())
    })
    .await
}

async fn wait_gone(agent: &ProcessAgent, id: &str) {
    let err = status(agent, id).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound, "{err:?}");
    let dir = agent.state_dir.path().to_path_buf();
    eventually(&format!("{id}'s processes to end"), SLOW, || async {
        processes_under(&dir)
            .iter()
            .all(|p| p.1 != id)
            .then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_process_agent_converges_updates_retires_and_purges() {
    let env = env_with(Options {
        call_timeout: SLOW,
        service: ServiceConfig::default(),
        ..Default::default()
    })
    .await;
    let agent = start_agent(&env).await;
    let dc = create_dc(
        &env,
        "real dc",
        "process",
        vec![looping("ticker", "hello"), looping("pinger", "ping")],
    )
    .await;

    // Two declared → two running.
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions
            .iter()
            .all(|a| a.action.kind == Kind::Provision && a.error.is_none()),
        "{:?}",
        out.actions
    );
    let ticker = row(&env, &dc.id, "ticker").await;
    let pinger = row(&env, &dc.id, "pinger").await;
    for w in [&ticker, &pinger] {
        assert_eq!(w.state, State::Running);
        wait_state(&agent, &w.id, pb::InstanceState::Running).await;
    }
    let dir = agent.state_dir.path().to_path_buf();
    // The distinct GREETINGs the instance's processes (the shell and its
    // `sleep`) run with.
    let greetings = |id: String| {
        let dir = dir.clone();
        move || {
            processes_under(&dir)
                .into_iter()
                .filter(|p| p.1 == id)
                .filter_map(|p| p.2)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
        }
    };
    let ticker_greetings = greetings(ticker.id.clone());
    eventually("ticker's process", SLOW, || async {
        (ticker_greetings() == ["hello"]).then_some(())
    })
    .await;
    // A reconcile with nothing to do changes nothing at the agent.
    let out = reconcile(&env, &dc.id).await;
    assert!(out.actions.iter().all(|a| a.action.kind == Kind::Noop));

    // Env change → deployed in place: same instance, new process env.
    set_specs(
        &env,
        &dc.id,
        vec![looping("ticker", "bye"), looping("pinger", "ping")],
    )
    .await;
    let out = reconcile(&env, &dc.id).await;
    let t = out
        .actions
        .iter()
        .find(|a| a.action.name == "ticker")
        .unwrap();
    assert_eq!((t.action.kind, &t.error), (Kind::Update, &None), "{t:?}");
    let updated = row(&env, &dc.id, "ticker").await;
    assert_eq!(
        (updated.id.as_str(), updated.state),
        (ticker.id.as_str(), State::Running)
    );
    assert_ne!(updated.spec_hash, ticker.spec_hash);
    eventually("ticker to run with the new env only", SLOW, || async {
        (ticker_greetings() == ["bye"]).then_some(())
    })
    .await;
    wait_state(&agent, &ticker.id, pb::InstanceState::Running).await;
    assert_eq!(row(&env, &dc.id, "pinger").await.id, pinger.id);

    // A structural change (the command) → replaced: a new instance runs,
    // the old one is gone.
    let mut changed = looping("pinger", "ping");
    changed.services[0].command[2] = "while true; do echo pong; sleep 1; done".into();
    set_specs(&env, &dc.id, vec![looping("ticker", "bye"), changed]).await;
    let out = reconcile(&env, &dc.id).await;
    let p = out
        .actions
        .iter()
        .find(|a| a.action.name == "pinger")
        .unwrap();
    assert_eq!((p.action.kind, &p.error), (Kind::Replace, &None), "{out:?}");
    let pinger2 = row(&env, &dc.id, "pinger").await;
    assert_ne!(pinger2.id, pinger.id);
    assert_eq!(pinger2.state, State::Running);
    wait_state(&agent, &pinger2.id, pb::InstanceState::Running).await;
    wait_gone(&agent, &pinger.id).await;
    let pinger = pinger2;

    // Removed → retired: the instance and its processes are gone.
    set_specs(&env, &dc.id, vec![looping("ticker", "bye")]).await;
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions.iter().any(|a| a.action.name == "pinger"
            && a.action.kind == Kind::Retire
            && a.error.is_none()),
        "{:?}",
        out.actions
    );
    assert_eq!(rows(&env, &dc.id).await.len(), 1);
    wait_gone(&agent, &pinger.id).await;

    // Vanished behind bootstrap's back → drift → repaired, same instance.
    agent
        .client
        .clone()
        .deprovision(pb::DeprovisionRequest {
            instance_id: ticker.id.clone(),
        })
        .await
        .unwrap();
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert!(results[0].drifted, "{results:?}");
    reconcile(&env, &dc.id).await;
    let repaired = row(&env, &dc.id, "ticker").await;
    assert_eq!(
        (repaired.id.as_str(), repaired.state),
        (ticker.id.as_str(), State::Running)
    );
    wait_state(&agent, &ticker.id, pb::InstanceState::Running).await;
    eventually("the repaired ticker's process", SLOW, || async {
        (ticker_greetings() == ["bye"]).then_some(())
    })
    .await;

    // A stray labelled as ours with no row: GC removes it; rows' workloads
    // stay.
    let stray = ctrlplane_core::id::new_id(ctrlplane_core::id::BOOTSTRAP_WORKLOAD);
    agent
        .client
        .clone()
        .provision(pb::ProvisionRequest {
            instance_id: stray.clone(),
            name: "stray".into(),
            services: looping("stray", "lost").services,
            labels: [(
                "ctrlplane.io/managed-by".to_string(),
                "bootstrap".to_string(),
            )]
            .into(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_state(&agent, &stray, pb::InstanceState::Running).await;
    let report = env
        .svc
        .collect_garbage(&admin(), Some(Duration::ZERO))
        .await
        .unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.workloads_deprovisioned, 1, "{report:?}");
    wait_gone(&agent, &stray).await;
    wait_state(&agent, &ticker.id, pb::InstanceState::Running).await;

    // Resource samples come from the real agent.
    let (samples, errors) = env.svc.collect_resources(&admin(), &dc.id).await.unwrap();
    assert_eq!((samples, errors.len()), (1, 0), "{errors:?}");
    assert!(row(&env, &dc.id, "ticker").await.usage.is_some());

    // The datacenter is deleted → everything retired, then purged.
    env.dcs
        .clone()
        .delete_datacenter(dcpb::DeleteDatacenterRequest { id: dc.id.clone() })
        .await
        .unwrap();
    let out = reconcile(&env, &dc.id).await;
    assert!(out.purged, "{out:?}");
    assert!(rows(&env, &dc.id).await.is_empty());
    wait_gone(&agent, &ticker.id).await;
    assert!(get_dc(&env, &dc.id).await.is_none(), "purged");
    assert!(processes_under(agent.state_dir.path()).is_empty());
    assert_eq!(agent.agent.process_groups(), 0);
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_failed_at_the_real_agent_is_restarted_by_the_repair() {
    let env = env_with(Options {
        call_timeout: SLOW,
        ..Default::default()
    })
    .await;
    let agent = start_agent(&env).await;
    let marker_dir = tempfile::tempdir().unwrap();
    let marker = marker_dir.path().join("ok");
    std::fs::write(&marker, "").unwrap();
    // An init that passes only while the marker exists.
    let mut guarded = looping("guarded", "hi");
    guarded.services.insert(
        0,
        ServiceSpec {
            name: "check".into(),
            role: ServiceRole::Init as i32,
            command: vec![
                "sh".into(),
                "-c".into(),
                format!("test -e '{}'", marker.display()),
            ],
            ..Default::default()
        },
    );
    let dc = create_dc(&env, "dc", "process", vec![guarded]).await;
    reconcile(&env, &dc.id).await;
    let w = row(&env, &dc.id, "guarded").await;
    wait_state(&agent, &w.id, pb::InstanceState::Running).await;

    // The machine restarts the workload while the precondition is missing:
    // the init fails, the workload fails at the agent.
    std::fs::remove_file(&marker).unwrap();
    agent
        .client
        .clone()
        .restart(pb::RestartRequest {
            instance_id: w.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    wait_state(&agent, &w.id, pb::InstanceState::Failed).await;
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert!(results[0].drifted, "{results:?}");
    let failed = row(&env, &dc.id, "guarded").await;
    assert_eq!(failed.state, State::Failed);
    assert!(
        failed.last_error.contains("failed at the agent"),
        "{}",
        failed.last_error
    );

    // Fixed; the next reconcile repairs it: the same instance runs again.
    std::fs::write(&marker, "").unwrap();
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions[0].action.reason.contains("repair") && out.actions[0].error.is_none(),
        "{:?}",
        out.actions
    );
    wait_state(&agent, &w.id, pb::InstanceState::Running).await;
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert!(!results[0].drifted, "{results:?}");
    assert_eq!(row(&env, &dc.id, "guarded").await.id, w.id);

    // Clean up through bootstrap.
    env.dcs
        .clone()
        .delete_datacenter(dcpb::DeleteDatacenterRequest { id: dc.id.clone() })
        .await
        .unwrap();
    assert!(reconcile(&env, &dc.id).await.purged);
    wait_gone(&agent, &w.id).await;
}
