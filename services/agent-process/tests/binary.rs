//! The `ctrlplane-agent-process` binary end to end: `--help`, joining a
//! real datacenter service (in-process, SQLite) with a join token, the
//! identity lock on restart, and a clear non-zero exit when the join is
//! refused.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_proto::agent::v1 as apb;
use ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient;
use ctrlplane_proto::provider::v1 as pb;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::Settings;
use tokio::io::AsyncReadExt;

const SECRET: &str = "0123456789abcdef0123456789abcdef";
const WAIT: Duration = Duration::from_secs(30);

/// The datacenter service on a free port; stops when the sender drops.
async fn datacenter(dir: &Path) -> (String, tokio::sync::oneshot::Sender<()>) {
    let url = format!("sqlite://{}", dir.join("dc.db").display());
    let settings = Settings::from_map([
        ("CP_AUTH_SECRET", SECRET),
        ("CP_DATABASE_URL", url.as_str()),
    ]);
    let config = ctrlplane_datacenter::Config::from_settings(&settings).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", listener.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        ctrlplane_datacenter::run(config, listener, async {
            let _ = rx.await;
        })
        .await
        .expect("datacenter runs");
    });
    (addr, tx)
}

fn registry(addr: &str) -> AgentRegistryServiceClient<ctrlplane_runtime::client::AuthedChannel> {
    let auth = Authenticator::new(SECRET.as_bytes());
    let token = auth.mint(&Claims::new(
        "test-admin",
        "",
        vec![ROLE_ADMIN.to_string()],
        Duration::from_secs(600),
    ));
    AgentRegistryServiceClient::new(
        authed_channel(addr, BearerInterceptor::fixed(&token).unwrap()).unwrap(),
    )
}

/// The agent binary with a clean environment plus `env`.
fn agent(state_dir: &Path, env: &[(&str, &str)]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlplane-agent-process"));
    cmd.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("CP_AUTH_SECRET", SECRET)
        .env("CP_LISTEN_ADDR", "127.0.0.1:0")
        .env("CP_STATE_DIR", state_dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

async fn wait_for<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn agents(addr: &str) -> Vec<apb::Agent> {
    registry(addr)
        .list_agents(apb::ListAgentsRequest {
            provider_name: "process".to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents
}

async fn terminate(child: &mut tokio::process::Child) -> std::process::ExitStatus {
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("the agent exits on SIGTERM")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn help_lists_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let out = agent(dir.path(), &[]).arg("--help").output().await.unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in [
        "--state-dir",
        "--join-token",
        "--datacenter-addr",
        "--advertise-addr",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_join_exits_non_zero_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (dc, _stop) = datacenter(dir.path()).await;
    let state = dir.path().join("agent");
    let out = tokio::time::timeout(
        WAIT,
        agent(
            &state,
            &[
                ("CP_DATACENTER_ADDR", &dc),
                ("CP_JOIN_TOKEN", "not-a-token"),
            ],
        )
        .output(),
    )
    .await
    .expect("the agent gives up at once on a refusal")
    .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("refused"), "{err}");
    assert!(!state.join("identity.json").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joins_with_a_token_then_restarts_with_its_identity() {
    let dir = tempfile::tempdir().unwrap();
    let (dc, _stop) = datacenter(dir.path()).await;
    let token = registry(&dc)
        .create_join_token(apb::CreateJoinTokenRequest {
            provider_name: "process".to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let state = dir.path().join("agent");
    let mut child = agent(
        &state,
        &[("CP_DATACENTER_ADDR", &dc), ("CP_JOIN_TOKEN", &token)],
    )
    .spawn()
    .unwrap();
    let joined = wait_for("the agent to register", async || {
        let a = agents(&dc).await;
        (!a.is_empty()).then_some(a)
    })
    .await;
    assert_eq!(joined.len(), 1);
    let me = &joined[0];
    assert!(
        me.endpoint.starts_with("http://127.0.0.1:"),
        "{}",
        me.endpoint
    );
    assert!(
        me.capabilities.contains(&"exec".to_string()),
        "{:?}",
        me.capabilities
    );
    assert!(state.join("identity.json").is_file());

    // The control plane can call the agent at the endpoint it advertised.
    let mut client = ctrlplane_agent::client::provider_client(
        &me.endpoint,
        Arc::new(Authenticator::new(SECRET.as_bytes())),
        "test",
    )
    .unwrap();
    let info = wait_for("GetInfo", async || {
        client.get_info(pb::GetInfoRequest {}).await.ok()
    })
    .await
    .into_inner();
    assert_eq!(info.provider_name, "process");
    assert!(terminate(&mut child).await.success());

    // Restart with the (single-use, now spent) token still set: the
    // identity file is the lock, so it does not join again.
    let mut child = agent(
        &state,
        &[("CP_DATACENTER_ADDR", &dc), ("CP_JOIN_TOKEN", &token)],
    )
    .spawn()
    .unwrap();
    let first = me
        .last_heartbeat_time
        .as_ref()
        .map(|t| (t.seconds, t.nanos));
    let again = wait_for("a heartbeat from the restarted agent", async || {
        let a = agents(&dc).await;
        let beat = a
            .first()?
            .last_heartbeat_time
            .as_ref()
            .map(|t| (t.seconds, t.nanos));
        (a.len() == 1 && beat > first).then_some(a)
    })
    .await;
    assert_eq!(again[0].id, me.id, "same identity");
    let status = terminate(&mut child).await;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err).await;
    }
    assert!(status.success(), "{err}");
}

/// The registry's health probes and provider resolution against the real
/// agent: `CheckAgents` reaches it (healthy, with a latency) and stamps
/// `last_checked_at` on the datacenters of its provider; once the agent is
/// gone the next probe marks it unhealthy and resolution refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_probes_and_resolution_reach_the_real_agent() {
    use ctrlplane_proto::datacenter::v1 as dpb;
    use ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient;

    let dir = tempfile::tempdir().unwrap();
    let (dc, _stop) = datacenter(dir.path()).await;
    let token = registry(&dc)
        .create_join_token(apb::CreateJoinTokenRequest {
            provider_name: "process".to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let mut child = agent(
        &dir.path().join("agent"),
        &[("CP_DATACENTER_ADDR", &dc), ("CP_JOIN_TOKEN", &token)],
    )
    .spawn()
    .unwrap();
    let me = wait_for("the agent to register", async || {
        agents(&dc).await.into_iter().next()
    })
    .await;

    let admin = Authenticator::new(SECRET.as_bytes()).mint(&Claims::new(
        "test-admin",
        "",
        vec![ROLE_ADMIN.to_string()],
        Duration::from_secs(600),
    ));
    let mut dcs = DatacenterServiceClient::new(
        authed_channel(&dc, BearerInterceptor::fixed(&admin).unwrap()).unwrap(),
    );
    let created = dcs
        .create_datacenter(dpb::CreateDatacenterRequest {
            datacenter: Some(dpb::Datacenter {
                name: "local".into(),
                provider_name: "process".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert!(created.last_checked_at.is_none());

    // The agent answers the probe once its server is up.
    let checked = wait_for("a healthy probe", async || {
        let r = registry(&dc)
            .check_agents(apb::CheckAgentsRequest {})
            .await
            .ok()?
            .into_inner();
        let a = r.agents.into_iter().find(|a| a.id == me.id)?;
        (a.health == apb::AgentHealth::Healthy as i32).then_some(a)
    })
    .await;
    assert!(checked.last_latency.is_some() && checked.last_checked_at.is_some());
    assert!(checked.last_error.is_empty(), "{}", checked.last_error);
    let after = dcs
        .get_datacenter(dpb::GetDatacenterRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert!(
        after.last_checked_at.is_some(),
        "probe stamped the datacenter"
    );
    let resolved = dcs
        .resolve_provider(dpb::ResolveProviderRequest {
            datacenter_id: created.id.clone(),
            provider_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (resolved.agent_id.as_str(), resolved.agent_endpoint.as_str()),
        (me.id.as_str(), me.endpoint.as_str())
    );

    // The agent goes away: the next probe fails and resolution says why.
    assert!(terminate(&mut child).await.success());
    let r = registry(&dc)
        .check_agents(apb::CheckAgentsRequest {})
        .await
        .unwrap()
        .into_inner();
    let a = r.agents.into_iter().find(|a| a.id == me.id).unwrap();
    assert_eq!(a.health, apb::AgentHealth::Unhealthy as i32);
    assert!(!a.last_error.is_empty());
    let err = dcs
        .resolve_provider(dpb::ResolveProviderRequest {
            datacenter_id: created.id.clone(),
            provider_name: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(
        err.message().contains("last health probe failed"),
        "{}",
        err.message()
    );
}
