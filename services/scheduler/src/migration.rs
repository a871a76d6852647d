//! Schema of the scheduler (its own migration table,
//! `scheduler_migrations`): the leader lease row.

use sea_orm::{ConnectionTrait, DatabaseBackend, DbErr};
use sea_orm_migration::sea_query::{Alias, IntoIden};
use sea_orm_migration::{MigrationName, MigrationTrait, MigratorTrait, SchemaManager, async_trait};

/// The migrator.
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![Box::new(M0001Leader)]
    }

    fn migration_table_name() -> sea_orm::DynIden {
        Alias::new("scheduler_migrations").into_iden()
    }
}

/// Applies every pending migration.
///
/// # Errors
/// Database failures.
pub async fn run(db: &sea_orm::DatabaseConnection) -> Result<(), DbErr> {
    Migrator::up(db, None).await
}

struct M0001Leader;

impl MigrationName for M0001Leader {
    fn name(&self) -> &str {
        "m0001_leader"
    }
}

#[async_trait::async_trait]
impl MigrationTrait for M0001Leader {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let conn = manager.get_connection();
        let ts = match conn.get_database_backend() {
            DatabaseBackend::Postgres => "TIMESTAMPTZ",
            _ => "TEXT",
        };
        conn.execute_unprepared(&format!(
            "CREATE TABLE scheduler_leader (id INTEGER PRIMARY KEY, holder TEXT NOT NULL, expire_time {ts} NOT NULL)"
        ))
        .await?;
        // The epoch, written the way both backends read a UTC timestamp.
        conn.execute_unprepared(
            "INSERT INTO scheduler_leader (id, holder, expire_time) VALUES (1, '', '1970-01-01T00:00:00+00:00')",
        )
        .await?;
        Ok(())
    }
}
