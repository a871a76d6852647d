//! Test harness: a datacenter store on SQLite (temp file) or on the real
//! Postgres the test script starts (`CP_TEST_POSTGRES_URL`; every test gets
//! a database of its own), plus callers with various tokens.

#![allow(dead_code)]

pub mod server;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_datacenter::agents::service::{AgentRegistry, Clock, JoinInput, RegistryConfig};
use ctrlplane_datacenter::agents::store::AgentStore;
use ctrlplane_runtime::auth::Authenticator;

use ctrlplane_datacenter::service::DatacenterService;
use ctrlplane_datacenter::store::Store;
use ctrlplane_runtime::auth::{Caller, Claims, ROLE_ADMIN, ROLE_SERVICE};
use ctrlplane_runtime::config::DatabaseConfig;
use sea_orm::{ConnectionTrait, Database};

/// Which database a test runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database for one test; keeps its temp dir alive.
pub struct TestDb {
    pub config: DatabaseConfig,
    _dir: Option<tempfile::TempDir>,
}

/// A fresh, empty database, or `None` when Postgres is not configured
/// outside CI (in CI a missing Postgres is a failure, never a skip).
pub async fn test_db(backend: Backend) -> Option<TestDb> {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    match backend {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("dc.db").display());
            Some(TestDb {
                config: DatabaseConfig {
                    url,
                    max_connections: 5,
                },
                _dir: Some(dir),
            })
        }
        Backend::Postgres => {
            let Ok(admin) = std::env::var("CP_TEST_POSTGRES_URL") else {
                assert!(
                    std::env::var("CI").is_err(),
                    "CP_TEST_POSTGRES_URL must be set in CI (tests/run.sh starts Postgres)"
                );
                eprintln!("skipping: CP_TEST_POSTGRES_URL is not set (run tests/run.sh)");
                return None;
            };
            let name = format!("dc_test_{}", uuid::Uuid::now_v7().simple());
            let conn = Database::connect(admin.as_str())
                .await
                .expect("connect to test Postgres");
            conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
            conn.close().await.unwrap();
            let (base, _) = admin
                .rsplit_once('/')
                .expect("postgres URL with a database path");
            Some(TestDb {
                config: DatabaseConfig {
                    url: format!("{base}/{name}"),
                    max_connections: 5,
                },
                _dir: None,
            })
        }
    }
}

/// Opens (and migrates) a store on `db`.
pub async fn open_store(db: &TestDb) -> Store {
    let conn = ctrlplane_runtime::db::connect(&db.config).await.unwrap();
    Store::open(conn).await.unwrap()
}

/// A controllable clock for registry tests.
#[derive(Clone)]
pub struct FakeClock(pub Arc<Mutex<DateTime<Utc>>>);

impl FakeClock {
    pub fn new() -> Self {
        FakeClock(Arc::new(Mutex::new(Utc::now())))
    }
    pub fn advance(&self, d: Duration) {
        *self.0.lock().unwrap() += chrono::Duration::from_std(d).unwrap();
    }
    pub fn clock(&self) -> Clock {
        let inner = self.0.clone();
        Arc::new(move || *inner.lock().unwrap())
    }
}

/// A test secret.
pub const SECRET: &[u8] = b"service-test-secret-service-test";

/// A registry over `store` with a fake clock.
pub fn registry(store: &Store, clock: &FakeClock) -> AgentRegistry {
    AgentRegistry::new(
        AgentStore::new(store.db().clone()),
        store.clone(),
        Arc::new(Authenticator::new(SECRET)),
        RegistryConfig::default(),
        clock.clock(),
    )
}

/// Joins an agent for `provider` through the real registry flow.
pub async fn join_agent(registry: &AgentRegistry, provider: &str) -> String {
    let (_, token) = registry
        .create_join_token(&admin(), provider, None, 1)
        .await
        .unwrap();
    registry
        .join(JoinInput {
            token,
            provider_name: provider.to_string(),
            endpoint: "http://127.0.0.1:9".to_string(),
            idempotency_key: uuid::Uuid::now_v7().to_string(),
            ..Default::default()
        })
        .await
        .unwrap()
        .agent
        .id
}

/// Everything a service test needs.
pub struct Env {
    pub svc: DatacenterService,
    pub registry: AgentRegistry,
    pub clock: FakeClock,
    pub db: TestDb,
    pub stop: tokio::sync::watch::Sender<bool>,
}

/// A service over a fresh database with agents joined for the `process`
/// and `docker` providers.
pub async fn env(backend: Backend) -> Option<Env> {
    let db = test_db(backend).await?;
    let store = open_store(&db).await;
    let clock = FakeClock::new();
    let registry = registry(&store, &clock);
    join_agent(&registry, "process").await;
    join_agent(&registry, "docker").await;
    let (stop, rx) = tokio::sync::watch::channel(false);
    Some(Env {
        svc: DatacenterService::new(store, registry.clone(), rx),
        registry,
        clock,
        db,
        stop,
    })
}

/// A service over a fresh database; the sender ends watches.
pub async fn service(
    backend: Backend,
) -> Option<(DatacenterService, TestDb, tokio::sync::watch::Sender<bool>)> {
    let e = env(backend).await?;
    Some((e.svc, e.db, e.stop))
}

fn caller(sub: &str, tenant: &str, roles: &[&str]) -> Caller {
    Caller {
        claims: Claims::new(
            sub,
            tenant,
            roles.iter().map(|r| r.to_string()).collect(),
            Duration::from_secs(600),
        ),
    }
}

/// `system:admin` with no tenant.
pub fn admin() -> Caller {
    caller("admin", "", &[ROLE_ADMIN])
}

/// A `system:service` caller.
pub fn system_service() -> Caller {
    caller("bootstrap", "", &[ROLE_SERVICE])
}

/// A plain tenant user.
pub fn tenant(t: &str) -> Caller {
    caller(&format!("user-of-{t}"), t, &[])
}

/// Generates one `#[tokio::test]` per backend for each listed async fn
/// taking a [`Backend`].
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}
