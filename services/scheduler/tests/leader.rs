//! Leader election on SQLite and on the test Postgres: one holder at a
//! time, release hands over at once, an expired lease is taken over.

use std::time::Duration;

use ctrlplane_runtime::config::DatabaseConfig;
use ctrlplane_scheduler::leader::Election;
use sea_orm::{ConnectionTrait, Database};

async fn db_config(postgres: bool) -> Option<(DatabaseConfig, Option<tempfile::TempDir>)> {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    if !postgres {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        return Some((
            DatabaseConfig {
                url,
                max_connections: 5,
            },
            Some(dir),
        ));
    }
    let Ok(admin) = std::env::var("CP_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("CI").is_err(),
            "CP_TEST_POSTGRES_URL must be set in CI"
        );
        eprintln!("skipping: CP_TEST_POSTGRES_URL is not set (run tests/run.sh)");
        return None;
    };
    let name = format!("sched_test_{}", uuid::Uuid::now_v7().simple());
    let conn = Database::connect(admin.as_str()).await.unwrap();
    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let (base, _) = admin.rsplit_once('/').unwrap();
    Some((
        DatabaseConfig {
            url: format!("{base}/{name}"),
            max_connections: 5,
        },
        None,
    ))
}

async fn one_leader_at_a_time(postgres: bool) {
    let Some((cfg, _dir)) = db_config(postgres).await else {
        return;
    };
    let db = ctrlplane_runtime::db::connect(&cfg).await.unwrap();
    ctrlplane_scheduler::migration::run(&db).await.unwrap();
    let ttl = Duration::from_millis(600);
    let a = Election::new(db.clone(), "a".into(), ttl);
    let b = Election::new(db.clone(), "b".into(), ttl);
    assert!(a.try_acquire().await.unwrap());
    assert!(
        !b.try_acquire().await.unwrap(),
        "b must not win while a holds the lease"
    );
    assert!(a.try_acquire().await.unwrap(), "a renews");
    assert_eq!(a.holder().await.unwrap(), "a");
    // Release hands over at once.
    a.release().await.unwrap();
    assert!(b.try_acquire().await.unwrap());
    assert!(!a.try_acquire().await.unwrap());
    // b stops renewing (crash): a takes over once the lease expired.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if a.try_acquire().await.unwrap() {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "a never took over");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(a.holder().await.unwrap(), "a");
}

#[tokio::test]
async fn one_leader_at_a_time_sqlite() {
    one_leader_at_a_time(false).await;
}

#[tokio::test]
async fn one_leader_at_a_time_postgres() {
    one_leader_at_a_time(true).await;
}

#[tokio::test]
async fn racing_replicas_never_both_lead() {
    for postgres in [false, true] {
        let Some((cfg, _dir)) = db_config(postgres).await else {
            continue;
        };
        let db = ctrlplane_runtime::db::connect(&cfg).await.unwrap();
        ctrlplane_scheduler::migration::run(&db).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..8 {
            let e = Election::new(db.clone(), format!("r{i}"), Duration::from_secs(30));
            tasks.push(tokio::spawn(async move { e.try_acquire().await.unwrap() }));
        }
        let mut winners = 0;
        for t in tasks {
            winners += usize::from(t.await.unwrap());
        }
        assert_eq!(winners, 1, "postgres={postgres}");
    }
}
