//! The whole control plane in one test process, with real components:
//! datacenter, bootstrap, scheduler and the process agent (joined with a
//! join token), each on its own socket. The periodic reconcile is set far
//! longer than the test, so convergence can only come from the watch.

use std::time::Duration;

use ctrlplane_proto::agent::v1::{
    self as agpb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::bootstrap::v1::{
    self as bspb, BootstrapServiceSpec, bootstrap_service_client::BootstrapServiceClient,
};
use ctrlplane_proto::datacenter::v1::{
    self as dcpb, datacenter_service_client::DatacenterServiceClient,
};
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_proto::scheduler::v1::{
    self as scpb, scheduler_service_client::SchedulerServiceClient,
};
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::client::{AuthedChannel, BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::Settings;
use tokio::net::TcpListener;

const SECRET: &str = "e2e-test-secret-e2e-test-secret-";
const WAIT: Duration = Duration::from_secs(60);

struct Stack {
    dc: String,
    dc_listen: std::net::SocketAddr,
    dc_db: String,
    dc_stop: Option<tokio::sync::oneshot::Sender<()>>,
    dc_task: Option<DcTask>,
    bootstrap: String,
    scheduler: String,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    _dir: tempfile::TempDir,
}

async fn listener() -> (TcpListener, String) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = format!("http://{}", l.local_addr().unwrap());
    (l, addr)
}

fn stopper(
    stops: &mut Vec<tokio::sync::oneshot::Sender<()>>,
) -> impl std::future::Future<Output = ()> + use<> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    stops.push(tx);
    async move {
        let _ = rx.await;
    }
}

fn channel(addr: &str) -> AuthedChannel {
    let token = Authenticator::new(SECRET.as_bytes()).mint(&Claims::new(
        "e2e-admin",
        "",
        vec![ROLE_ADMIN.to_string()],
        Duration::from_secs(600),
    ));
    authed_channel(addr, BearerInterceptor::fixed(&token).unwrap()).unwrap()
}

type DcTask = tokio::task::JoinHandle<Result<(), ctrlplane_datacenter::RunError>>;

fn start_datacenter(l: TcpListener, db: &str) -> (tokio::sync::oneshot::Sender<()>, DcTask) {
    let s = Settings::from_map([
        ("CP_AUTH_SECRET", SECRET.to_string()),
        ("CP_DATABASE_URL", db.to_string()),
    ]);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(ctrlplane_datacenter::run(
        ctrlplane_datacenter::Config::from_settings(&s).unwrap(),
        l,
        async {
            let _ = rx.await;
        },
    ));
    (tx, task)
}

impl Stack {
    /// Stops the datacenter service and starts it again on the same
    /// address and database.
    async fn restart_datacenter(&mut self) {
        let _ = self.dc_stop.take().unwrap().send(());
        self.dc_task.take().unwrap().await.unwrap().unwrap();
        let deadline = tokio::time::Instant::now() + WAIT;
        let l = loop {
            match TcpListener::bind(self.dc_listen).await {
                Ok(l) => break l,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "cannot rebind {}: {e}",
                        self.dc_listen
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let (stop, task) = start_datacenter(l, &self.dc_db);
        self.dc_stop = Some(stop);
        self.dc_task = Some(task);
    }

    fn stop_all(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
        if let Some(stop) = self.dc_stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn start() -> Stack {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let mut stops = Vec::new();
    let db = |name: &str| format!("sqlite://{}", dir.path().join(name).display());

    let (l, dc) = listener().await;
    let dc_listen = l.local_addr().unwrap();
    let dc_db = db("dc.db");
    let (dc_stop, dc_task) = start_datacenter(l, &dc_db);

    let token = AgentRegistryServiceClient::new(channel(&dc))
        .create_join_token(agpb::CreateJoinTokenRequest {
            provider_name: "process".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .token;
    let (l, _agent) = listener().await;
    let s = Settings::from_map([
        ("CP_AUTH_SECRET", SECRET.to_string()),
        (
            "CP_STATE_DIR",
            dir.path().join("agent").display().to_string(),
        ),
        ("CP_DATACENTER_ADDR", dc.clone()),
        ("CP_JOIN_TOKEN", token),
    ]);
    tokio::spawn(ctrlplane_agent_process::run(
        ctrlplane_agent_process::Config::from_settings(&s).unwrap(),
        l,
        stopper(&mut stops),
    ));

    let (l, bootstrap) = listener().await;
    let s = Settings::from_map([
        ("CP_AUTH_SECRET", SECRET.to_string()),
        ("CP_DATABASE_URL", db("bs.db")),
        ("CP_DATACENTER_ADDR", dc.clone()),
    ]);
    tokio::spawn(ctrlplane_bootstrap::run(
        ctrlplane_bootstrap::Config::from_settings(&s).unwrap(),
        l,
        stopper(&mut stops),
    ));

    let (l, scheduler) = listener().await;
    let s = Settings::from_map([
        ("CP_AUTH_SECRET", SECRET.to_string()),
        ("CP_DATABASE_URL", db("sched.db")),
        ("CP_DATACENTER_ADDR", dc.clone()),
        ("CP_BOOTSTRAP_ADDR", bootstrap.clone()),
        ("CP_RECONCILE_INTERVAL", "1h".to_string()),
        ("CP_STATUS_SYNC_INTERVAL", "1h".to_string()),
        ("CP_GC_INTERVAL", "1h".to_string()),
        ("CP_TELEMETRY_INTERVAL", "1h".to_string()),
        ("CP_LEADER_LEASE", "3s".to_string()),
    ]);
    tokio::spawn(ctrlplane_scheduler::run(
        ctrlplane_scheduler::Config::from_settings(&s).unwrap(),
        l,
        stopper(&mut stops),
    ));
    Stack {
        dc,
        dc_listen,
        dc_db,
        dc_stop: Some(dc_stop),
        dc_task: Some(dc_task),
        bootstrap,
        scheduler,
        stops,
        _dir: dir,
    }
}

async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Option<T>) -> T {
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

fn spec(name: &str, env: &[(&str, &str)]) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            command: vec!["sleep".into(), "300".into()],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn workloads(s: &Stack, dc: &str) -> Vec<bspb::BootstrapWorkload> {
    BootstrapServiceClient::new(channel(&s.bootstrap))
        .list_bootstrap_workloads(bspb::ListBootstrapWorkloadsRequest {
            datacenter_id: dc.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().workloads)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_drives_convergence() {
    let mut s = start().await;
    let mut dcs = DatacenterServiceClient::new(channel(&s.dc));
    // Wait for the agent to join before creating a datacenter on it.
    eventually("the process agent to join", async || {
        let r = AgentRegistryServiceClient::new(channel(&s.dc))
            .list_agents(agpb::ListAgentsRequest::default())
            .await
            .ok()?
            .into_inner();
        (!r.agents.is_empty()).then_some(())
    })
    .await;
    // The scheduler leads and has run its first rounds.
    let mut sched = SchedulerServiceClient::new(channel(&s.scheduler));
    let list = eventually("the scheduler to lead", async || {
        let r = sched
            .list_workers(scpb::ListWorkersRequest {})
            .await
            .ok()?
            .into_inner();
        r.leader.then_some(r)
    })
    .await;
    let names: Vec<&str> = list.workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "gc",
            "provider_health",
            "reconciler",
            "status_sync",
            "telemetry",
            "watch"
        ]
    );

    let dc = dcs
        .create_datacenter(dcpb::CreateDatacenterRequest {
            datacenter: Some(dcpb::Datacenter {
                name: "e2e".into(),
                provider_name: "process".into(),
                bootstrap_services: vec![spec("a", &[]), spec("b", &[])],
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    let running = bspb::BootstrapState::Running as i32;
    let first = eventually("both services running (watch-driven)", async || {
        let w = workloads(&s, &dc.id).await;
        (w.len() == 2 && w.iter().all(|w| w.state == running)).then_some(w)
    })
    .await;

    // Change a spec: updated in place (same instance, new hash).
    let a_before = first.iter().find(|w| w.name == "a").unwrap().clone();
    dcs.update_datacenter(dcpb::UpdateDatacenterRequest {
        datacenter: Some(dcpb::Datacenter {
            id: dc.id.clone(),
            bootstrap_services: vec![spec("a", &[("VERSION", "2")])],
            ..Default::default()
        }),
        update_mask: Some(ctrlplane_proto::pbjson_types::FieldMask {
            paths: vec!["bootstrap_services".into()],
        }),
    })
    .await
    .unwrap();
    let after = eventually("a updated and b retired", async || {
        let w = workloads(&s, &dc.id).await;
        (w.len() == 1
            && w[0].name == "a"
            && w[0].spec_hash != a_before.spec_hash
            && w[0].state == running)
            .then_some(w)
    })
    .await;
    assert_eq!(after[0].id, a_before.id, "env change deploys in place");
    assert_eq!(after[0].services[0].env["VERSION"], "2");

    // RunWorker for one datacenter answers with the run's info.
    let run = sched
        .run_worker(scpb::RunWorkerRequest {
            name: "reconciler".into(),
            datacenter_id: dc.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .worker
        .unwrap();
    assert_eq!(run.last_error, "");
    assert!(run.run_count >= 2);

    // Delete: everything retired, the datacenter purged.
    dcs.delete_datacenter(dcpb::DeleteDatacenterRequest { id: dc.id.clone() })
        .await
        .unwrap();
    eventually("the datacenter purged", async || {
        let r = dcs
            .get_datacenter(dcpb::GetDatacenterRequest { id: dc.id.clone() })
            .await;
        matches!(r, Err(ref st) if st.code() == tonic::Code::NotFound).then_some(())
    })
    .await;
    assert!(workloads(&s, &dc.id).await.is_empty());
    s.stop_all();
}

/// The watch reconnects after the datacenter service restarts (resuming
/// from the last revision it saw), so a datacenter created right after the
/// restart converges although the periodic reconcile is an hour away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_resumes_after_the_datacenter_service_restarts() {
    let mut s = start().await;
    eventually("the process agent to join", async || {
        let r = AgentRegistryServiceClient::new(channel(&s.dc))
            .list_agents(agpb::ListAgentsRequest::default())
            .await
            .ok()?
            .into_inner();
        (!r.agents.is_empty()).then_some(())
    })
    .await;
    let mut sched = SchedulerServiceClient::new(channel(&s.scheduler));
    eventually("the scheduler to lead", async || {
        let r = sched
            .list_workers(scpb::ListWorkersRequest {})
            .await
            .ok()?
            .into_inner();
        r.leader.then_some(())
    })
    .await;
    let running = bspb::BootstrapState::Running as i32;
    let first = create(&s.dc, "before restart").await;
    eventually("the first datacenter's service running", async || {
        let w = workloads(&s, &first.id).await;
        (w.len() == 1 && w[0].state == running).then_some(())
    })
    .await;

    s.restart_datacenter().await;
    let second = eventually(
        "the restarted datacenter service to take a create",
        async || try_create(&s.dc, "after restart").await,
    )
    .await;
    eventually(
        "the second datacenter's service running (watch resumed)",
        async || {
            let w = workloads(&s, &second.id).await;
            (w.len() == 1 && w[0].state == running).then_some(())
        },
    )
    .await;

    // Clean up the workloads: delete both and wait for the purges.
    let mut dcs = DatacenterServiceClient::new(channel(&s.dc));
    for dc in [&first, &second] {
        dcs.delete_datacenter(dcpb::DeleteDatacenterRequest { id: dc.id.clone() })
            .await
            .unwrap();
    }
    for dc in [&first, &second] {
        eventually("the datacenter purged", async || {
            let r = dcs
                .get_datacenter(dcpb::GetDatacenterRequest { id: dc.id.clone() })
                .await;
            matches!(r, Err(ref st) if st.code() == tonic::Code::NotFound).then_some(())
        })
        .await;
    }
    s.stop_all();
}

async fn try_create(addr: &str, name: &str) -> Option<dcpb::Datacenter> {
    DatacenterServiceClient::new(channel(addr))
        .create_datacenter(dcpb::CreateDatacenterRequest {
            datacenter: Some(dcpb::Datacenter {
                name: name.into(),
                provider_name: "process".into(),
                bootstrap_services: vec![spec("a", &[])],
                ..Default::default()
            }),
        })
        .await
        .ok()?
        .into_inner()
        .datacenter
}

async fn create(addr: &str, name: &str) -> dcpb::Datacenter {
    try_create(addr, name).await.expect("CreateDatacenter")
}
