//! The control plane in this process: the real datacenter, bootstrap and
//! scheduler services (each from its library `run`, on its own socket and
//! database) and the [`FastAgent`] joined through the registry's real join
//! flow. The scheduler's periodic workers are set to an hour, so
//! convergence comes from its watch and the resync runs only when asked.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use ctrlplane_proto::agent::v1::{
    self as agpb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_proto::bootstrap::v1::bootstrap_service_client::BootstrapServiceClient;
use ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient;
use ctrlplane_proto::scheduler::v1::{
    self as scpb, scheduler_service_client::SchedulerServiceClient,
};
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::client::{AuthedChannel, BearerInterceptor, authed_channel};
use ctrlplane_runtime::config::Settings;
use tokio::net::TcpListener;

use crate::agent::FastAgent;

/// The provider name the fast agent joins as.
pub const PROVIDER: &str = "bench";

const SECRET: &str = "ctrlplane-bench-secret-ctrlplane-bench-secret";

/// Where the services keep their tables.
#[derive(Debug, Clone)]
pub enum Database {
    /// One SQLite file per service in a temporary directory.
    Sqlite,
    /// A fresh database per service, created on this server (the URL's
    /// database is used only to run `CREATE DATABASE`).
    Postgres(String),
}

impl Database {
    /// Parses `sqlite` or a `postgres://` URL.
    ///
    /// # Errors
    /// Anything else.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        if s == "sqlite" {
            Ok(Database::Sqlite)
        } else if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            Ok(Database::Postgres(s.to_string()))
        } else {
            bail!("--database must be `sqlite` or a postgres:// URL, got {s:?}")
        }
    }

    /// How it is shown in the report (no credentials).
    pub fn describe(&self) -> String {
        match self {
            Database::Sqlite => "sqlite (temp files, one per service)".into(),
            Database::Postgres(url) => {
                let host = url.rsplit_once('@').map_or(url.as_str(), |(_, h)| h);
                format!("postgres ({host}, a fresh database per service)")
            }
        }
    }

    async fn url(&self, dir: &std::path::Path, service: &str) -> anyhow::Result<String> {
        match self {
            Database::Sqlite => Ok(format!(
                "sqlite://{}",
                dir.join(format!("{service}.db")).display()
            )),
            Database::Postgres(admin) => {
                use sea_orm::ConnectionTrait;
                let name = format!(
                    "ctrlplane_bench_{service}_{}",
                    uuid::Uuid::now_v7().simple()
                );
                let conn = sea_orm::Database::connect(admin.as_str())
                    .await
                    .with_context(|| format!("connecting to {}", self.describe()))?;
                conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                    .await
                    .context("CREATE DATABASE")?;
                conn.close().await?;
                let (base, _) = admin
                    .split('?')
                    .next()
                    .unwrap_or(admin)
                    .rsplit_once('/')
                    .context("a postgres URL with a database path")?;
                Ok(format!("{base}/{name}"))
            }
        }
    }
}

/// A running control plane.
pub struct Stack {
    /// Datacenter service (admin).
    pub datacenters: DatacenterServiceClient<AuthedChannel>,
    /// Bootstrap service (admin).
    pub bootstrap: BootstrapServiceClient<AuthedChannel>,
    /// Scheduler service (admin).
    pub scheduler: SchedulerServiceClient<AuthedChannel>,
    /// The fast agent.
    pub agent: FastAgent,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

async fn listener() -> anyhow::Result<(TcpListener, String)> {
    let l = TcpListener::bind("127.0.0.1:0").await?;
    let addr = format!("http://{}", l.local_addr()?);
    Ok((l, addr))
}

fn admin_channel(addr: &str) -> anyhow::Result<AuthedChannel> {
    let token = Authenticator::new(SECRET.as_bytes()).mint(&Claims::new(
        "ctrlplane-bench",
        "",
        vec![ROLE_ADMIN.to_string()],
        Duration::from_secs(24 * 3600),
    ));
    Ok(authed_channel(addr, BearerInterceptor::fixed(&token)?)?)
}

impl Stack {
    /// Starts every service and joins the fast agent; returns once the
    /// scheduler leads.
    ///
    /// `leader_lease` is the scheduler's `CP_LEADER_LEASE`: every lease
    /// renewal (each third of it) currently wakes every worker loop, which
    /// then runs again at once whatever its interval, so the benchmark
    /// uses a long lease by default to keep periodic runs out of the
    /// measurements.
    ///
    /// # Errors
    /// A service failing to start, or the scheduler not leading within
    /// `wait`.
    pub async fn start(db: &Database, leader_lease: &str, wait: Duration) -> anyhow::Result<Stack> {
        let dir = tempfile::Builder::new()
            .prefix("ctrlplane-bench")
            .tempdir()?;
        let mut stops = Vec::new();
        let mut tasks = Vec::new();
        let mut stopper = || {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            stops.push(tx);
            async move {
                let _ = rx.await;
            }
        };
        let settings = |extra: Vec<(&str, String)>| {
            let mut pairs = vec![("CP_AUTH_SECRET", SECRET.to_string())];
            pairs.extend(extra);
            Settings::from_map(pairs)
        };

        // Datacenter service and agent registry. Agents' leases last the
        // whole run: the fast agent joins but does not heartbeat.
        let (l, dc) = listener().await?;
        let mut config = ctrlplane_datacenter::Config::from_settings(&settings(vec![(
            "CP_DATABASE_URL",
            db.url(dir.path(), "datacenter").await?,
        )]))?;
        config.registry.lease_ttl = Duration::from_secs(24 * 3600);
        let stop = stopper();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ctrlplane_datacenter::run(config, l, stop).await {
                eprintln!("datacenter service stopped: {e}");
            }
        }));

        // The fast agent, joined with a join token like any agent.
        let agent = FastAgent::default();
        let (l, agent_addr) = listener().await?;
        let stop = stopper();
        let served = agent.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ctrlplane_agent::server::serve_provider(
                Arc::new(served),
                l,
                Arc::new(Authenticator::new(SECRET.as_bytes())),
                Duration::from_secs(1),
                stop,
            )
            .await
            {
                eprintln!("fast agent stopped: {e}");
            }
        }));
        let mut registry = AgentRegistryServiceClient::new(admin_channel(&dc)?);
        let token = retry(wait, "the datacenter service to answer", async || {
            registry
                .create_join_token(agpb::CreateJoinTokenRequest {
                    provider_name: PROVIDER.into(),
                    ttl: None,
                    max_uses: 1,
                })
                .await
                .map(|r| r.into_inner().token)
        })
        .await?;
        AgentRegistryServiceClient::new(ctrlplane_runtime::client::channel(&dc)?)
            .join_agent(agpb::JoinAgentRequest {
                token,
                provider_name: PROVIDER.into(),
                endpoint: agent_addr,
                idempotency_key: uuid::Uuid::now_v7().to_string(),
                ..Default::default()
            })
            .await
            .context("joining the fast agent")?;

        let (l, bootstrap) = listener().await?;
        let config = ctrlplane_bootstrap::Config::from_settings(&settings(vec![
            ("CP_DATABASE_URL", db.url(dir.path(), "bootstrap").await?),
            ("CP_DATACENTER_ADDR", dc.clone()),
        ]))?;
        let stop = stopper();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ctrlplane_bootstrap::run(config, l, stop).await {
                eprintln!("bootstrap service stopped: {e}");
            }
        }));

        let (l, scheduler) = listener().await?;
        let config = ctrlplane_scheduler::Config::from_settings(&settings(vec![
            ("CP_DATABASE_URL", db.url(dir.path(), "scheduler").await?),
            ("CP_DATACENTER_ADDR", dc.clone()),
            ("CP_BOOTSTRAP_ADDR", bootstrap.clone()),
            ("CP_RECONCILE_INTERVAL", "1h".into()),
            ("CP_STATUS_SYNC_INTERVAL", "1h".into()),
            ("CP_GC_INTERVAL", "1h".into()),
            ("CP_TELEMETRY_INTERVAL", "1h".into()),
            ("CP_PROVIDER_HEALTH_INTERVAL", "1h".into()),
            ("CP_LEADER_LEASE", leader_lease.to_string()),
        ]))?;
        let stop = stopper();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = ctrlplane_scheduler::run(config, l, stop).await {
                eprintln!("scheduler service stopped: {e}");
            }
        }));

        let mut sched = SchedulerServiceClient::new(admin_channel(&scheduler)?);
        // Leading, and every worker's first run (at start, over nothing) done.
        retry(
            wait,
            "the scheduler to lead and finish its first runs",
            async || {
                let r = sched
                    .list_workers(scpb::ListWorkersRequest {})
                    .await?
                    .into_inner();
                let ready = r.leader
                    && r.workers
                        .iter()
                        .all(|w| w.name == "watch" || (w.run_count > 0 && !w.running));
                if ready {
                    Ok(())
                } else {
                    Err(tonic::Status::unavailable("not ready yet"))
                }
            },
        )
        .await?;

        Ok(Stack {
            datacenters: DatacenterServiceClient::new(admin_channel(&dc)?),
            bootstrap: BootstrapServiceClient::new(admin_channel(&bootstrap)?),
            scheduler: sched,
            agent,
            stops,
            tasks,
            _dir: dir,
        })
    }

    /// Run counts of the scheduler's workers, `name=count` joined.
    ///
    /// # Errors
    /// `ListWorkers` failed.
    pub async fn worker_runs(&self) -> anyhow::Result<String> {
        let r = self
            .scheduler
            .clone()
            .list_workers(scpb::ListWorkersRequest {})
            .await?
            .into_inner();
        Ok(r.workers
            .iter()
            .filter(|w| w.name != "watch")
            .map(|w| format!("{}={}", w.name, w.run_count))
            .collect::<Vec<_>>()
            .join(" "))
    }

    /// Stops every service and waits (boundedly) for them.
    pub async fn stop(mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(15),
            futures::future::join_all(self.tasks.drain(..)),
        )
        .await;
    }
}

/// Calls `f` every 100 ms until it succeeds, for at most `wait`.
///
/// # Errors
/// The last failure, once `wait` has passed.
pub async fn retry<T>(
    wait: Duration,
    what: &str,
    mut f: impl AsyncFnMut() -> Result<T, tonic::Status>,
) -> anyhow::Result<T> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(s) if tokio::time::Instant::now() >= deadline => {
                bail!(
                    "timed out after {wait:?} waiting for {what}: {:?}: {}",
                    s.code(),
                    s.message()
                )
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}
