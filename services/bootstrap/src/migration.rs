//! Schema of the bootstrap service, recorded in its own migration table
//! (`bootstrap_migrations`) so it can share a Postgres database with the
//! other services.

use sea_orm::{ConnectionTrait, DatabaseBackend, DbErr};
use sea_orm_migration::sea_query::{Alias, IntoIden};
use sea_orm_migration::{MigrationName, MigrationTrait, MigratorTrait, SchemaManager, async_trait};

/// The migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(M0001Bootstrap)]
    }

    fn migration_table_name() -> sea_orm::DynIden {
        Alias::new("bootstrap_migrations").into_iden()
    }
}

/// Applies every pending migration.
///
/// # Errors
/// Database failures.
pub async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

struct M0001Bootstrap;

impl MigrationName for M0001Bootstrap {
    fn name(&self) -> &str {
        "m0001_bootstrap"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for M0001Bootstrap {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        let ts = match conn.get_database_backend() {
            DatabaseBackend::Postgres => "TIMESTAMPTZ",
            _ => "TEXT",
        };
        for sql in [
            "CREATE TABLE bootstrap_workloads (
                id TEXT PRIMARY KEY,
                datacenter_id TEXT NOT NULL,
                tenant_id TEXT NOT NULL,
                provider_name TEXT NOT NULL,
                name TEXT NOT NULL,
                source TEXT NOT NULL,
                spec TEXT NOT NULL,
                spec_hash TEXT NOT NULL,
                structure_hash TEXT NOT NULL,
                applied_hash TEXT,
                retire BOOLEAN NOT NULL,
                state TEXT NOT NULL,
                provider_ref TEXT NOT NULL,
                service_refs TEXT NOT NULL,
                endpoints TEXT NOT NULL,
                last_error TEXT NOT NULL,
                attempts INTEGER NOT NULL,
                next_attempt_time {ts},
                lease_expire_time {ts},
                replaces TEXT,
                usage TEXT,
                create_time {ts} NOT NULL,
                update_time {ts} NOT NULL
            )",
            "CREATE INDEX bootstrap_workloads_dc ON bootstrap_workloads (datacenter_id, name)",
            "CREATE TABLE bootstrap_events (
                sequence BIGINT PRIMARY KEY,
                id TEXT NOT NULL,
                datacenter_id TEXT NOT NULL,
                workload_id TEXT NOT NULL,
                name TEXT NOT NULL,
                kind TEXT NOT NULL,
                from_state TEXT NOT NULL,
                to_state TEXT NOT NULL,
                message TEXT NOT NULL,
                create_time {ts} NOT NULL
            )",
            "CREATE INDEX bootstrap_events_dc ON bootstrap_events (datacenter_id, sequence)",
            "CREATE TABLE bootstrap_sequence (id INTEGER PRIMARY KEY, value BIGINT NOT NULL)",
            "INSERT INTO bootstrap_sequence (id, value) VALUES (1, 0)",
            "CREATE TABLE bootstrap_reconciles (
                datacenter_id TEXT PRIMARY KEY,
                last_revision BIGINT NOT NULL,
                lease_owner TEXT NOT NULL,
                lease_expire_time {ts},
                update_time {ts} NOT NULL
            )",
            "CREATE TABLE bootstrap_hooks (
                name TEXT PRIMARY KEY,
                endpoint TEXT NOT NULL,
                timeout_ms BIGINT NOT NULL,
                last_error TEXT NOT NULL,
                last_success_time {ts},
                create_time {ts} NOT NULL
            )",
            "CREATE TABLE bootstrap_hook_cache (
                hook_name TEXT NOT NULL,
                datacenter_id TEXT NOT NULL,
                specs TEXT NOT NULL,
                update_time {ts} NOT NULL,
                PRIMARY KEY (hook_name, datacenter_id)
            )",
            "CREATE TABLE bootstrap_resource_samples (
                id TEXT PRIMARY KEY,
                workload_id TEXT NOT NULL,
                datacenter_id TEXT NOT NULL,
                cpu_percent DOUBLE PRECISION NOT NULL,
                memory_bytes BIGINT NOT NULL,
                disk_bytes BIGINT NOT NULL,
                sample_time {ts} NOT NULL
            )",
            "CREATE INDEX bootstrap_samples_wl ON bootstrap_resource_samples (workload_id, sample_time)",
            "CREATE TABLE bootstrap_gc_cursors (
                agent_id TEXT PRIMARY KEY,
                page_token TEXT NOT NULL,
                update_time {ts} NOT NULL
            )",
        ] {
            conn.execute_unprepared(&sql.replace("{ts}", ts)).await?;
        }
        Ok(())
    }
}
