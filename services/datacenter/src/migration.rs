//! Schema migrations of the datacenter service, recorded in its own
//! migration table (`datacenter_migrations`) so that several services can
//! share one Postgres database.

use sea_orm::{ConnectionTrait, DatabaseBackend, DbErr};
use sea_orm_migration::sea_query::{Alias, IntoIden};
use sea_orm_migration::{MigrationName, MigrationTrait, MigratorTrait, SchemaManager, async_trait};

/// The migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(M0001Datacenters), Box::new(M0002Agents)]
    }

    fn migration_table_name() -> sea_orm::DynIden {
        Alias::new("datacenter_migrations").into_iden()
    }
}

/// Applies every pending migration.
///
/// # Errors
/// Database failures.
pub async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

/// Runs DDL written once for both backends: `{ts}` becomes the backend's
/// timestamp type.
async fn ddl(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
    let conn = manager.get_connection();
    let ts = match conn.get_database_backend() {
        DatabaseBackend::Postgres => "TIMESTAMPTZ",
        _ => "TEXT",
    };
    for s in statements {
        conn.execute_unprepared(&s.replace("{ts}", ts)).await?;
    }
    Ok(())
}

struct M0001Datacenters;

impl MigrationName for M0001Datacenters {
    fn name(&self) -> &str {
        "m0001_datacenters"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for M0001Datacenters {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        ddl(
            manager,
            &[
                "CREATE TABLE datacenters (
                    id TEXT PRIMARY KEY,
                    tenant_id TEXT NOT NULL,
                    name TEXT NOT NULL,
                    slug TEXT NOT NULL,
                    provider_name TEXT NOT NULL,
                    region TEXT NOT NULL,
                    zone TEXT NOT NULL,
                    status TEXT NOT NULL,
                    location TEXT,
                    capacity TEXT,
                    labels TEXT NOT NULL,
                    metadata TEXT NOT NULL,
                    bootstrap_services TEXT NOT NULL,
                    last_checked_at {ts},
                    revision BIGINT NOT NULL,
                    create_time {ts} NOT NULL,
                    update_time {ts} NOT NULL
                )",
                "CREATE UNIQUE INDEX datacenters_tenant_slug ON datacenters (tenant_id, slug)",
                "CREATE INDEX datacenters_provider ON datacenters (provider_name)",
                "CREATE TABLE datacenter_labels (
                    datacenter_id TEXT NOT NULL,
                    label_key TEXT NOT NULL,
                    label_value TEXT NOT NULL,
                    PRIMARY KEY (datacenter_id, label_key)
                )",
                "CREATE INDEX datacenter_labels_kv ON datacenter_labels (label_key, label_value)",
                "CREATE TABLE datacenter_events (
                    revision BIGINT PRIMARY KEY,
                    id TEXT NOT NULL,
                    kind TEXT NOT NULL,
                    datacenter_id TEXT NOT NULL,
                    tenant_id TEXT NOT NULL,
                    snapshot TEXT NOT NULL,
                    actor TEXT NOT NULL,
                    message TEXT NOT NULL,
                    create_time {ts} NOT NULL
                )",
                "CREATE INDEX datacenter_events_dc ON datacenter_events (datacenter_id, revision)",
                "CREATE TABLE datacenter_revision (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)",
                "INSERT INTO datacenter_revision (id, value) VALUES (1, 0)",
            ],
        )
        .await
    }
}

struct M0002Agents;

impl MigrationName for M0002Agents {
    fn name(&self) -> &str {
        "m0002_agents"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for M0002Agents {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        ddl(
            manager,
            &[
                "CREATE TABLE join_tokens (
                    id TEXT PRIMARY KEY,
                    token_hash TEXT NOT NULL,
                    provider_name TEXT NOT NULL,
                    expire_time {ts} NOT NULL,
                    max_uses INTEGER NOT NULL,
                    uses INTEGER NOT NULL,
                    created_by TEXT NOT NULL,
                    create_time {ts} NOT NULL
                )",
                "CREATE TABLE agents (
                    id TEXT PRIMARY KEY,
                    provider_name TEXT NOT NULL,
                    endpoint TEXT NOT NULL,
                    version TEXT NOT NULL,
                    capabilities TEXT NOT NULL,
                    info TEXT NOT NULL,
                    join_token_id TEXT NOT NULL,
                    idempotency_key TEXT NOT NULL,
                    revoked BOOLEAN NOT NULL,
                    last_heartbeat_time {ts} NOT NULL,
                    lease_expire_time {ts} NOT NULL,
                    last_checked_at {ts},
                    last_latency_ms BIGINT,
                    probe_ok BOOLEAN,
                    last_error TEXT NOT NULL,
                    create_time {ts} NOT NULL,
                    update_time {ts} NOT NULL
                )",
                "CREATE UNIQUE INDEX agents_join_key ON agents (join_token_id, idempotency_key)",
                "CREATE INDEX agents_provider ON agents (provider_name)",
            ],
        )
        .await
    }
}
