//! Test harness: a datacenter store on SQLite (temp file) or on the real
//! Postgres the test script starts (`CP_TEST_POSTGRES_URL`; every test gets
//! a database of its own), plus callers with various tokens.

#![allow(dead_code)]

use std::time::Duration;

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

/// A service over a fresh database; the sender ends watches.
pub async fn service(
    backend: Backend,
) -> Option<(DatacenterService, TestDb, tokio::sync::watch::Sender<bool>)> {
    let db = test_db(backend).await?;
    let store = open_store(&db).await;
    let (tx, rx) = tokio::sync::watch::channel(false);
    Some((DatacenterService::new(store, rx), db, tx))
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
