//! Database connections for services that own tables.
//!
//! SQLite (one file per service) is the embedded default: the file and its
//! directory are created, WAL journaling and a busy timeout are on, so
//! readers never block the writer. Postgres is selected by a `postgres://`
//! URL. Each service runs its own migrations with a migration table of its
//! own, so several services can share one Postgres database.

use std::time::Duration;

use sea_orm::{ConnectOptions, Database, DatabaseConnection, DbErr};

use crate::config::{DatabaseConfig, redact_url};

/// Opens the pool for `cfg`.
///
/// # Errors
/// The directory cannot be created or the database cannot be reached; the
/// message carries the URL without its password.
pub async fn connect(cfg: &DatabaseConfig) -> Result<DatabaseConnection, DbErr> {
    let mut url = cfg.url.clone();
    let is_sqlite = url.starts_with("sqlite:");
    if is_sqlite {
        let path = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let path = path.split('?').next().unwrap_or_default();
        if path != ":memory:"
            && let Some(dir) = std::path::Path::new(path).parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| DbErr::Custom(format!("cannot create {}: {e}", dir.display())))?;
        }
        if !url.contains('?') {
            url.push_str("?mode=rwc");
        }
    }
    let mut opts = ConnectOptions::new(url);
    opts.max_connections(cfg.max_connections.max(1))
        .connect_timeout(Duration::from_secs(10))
        .acquire_timeout(Duration::from_secs(30))
        .sqlx_logging(false);
    if is_sqlite {
        opts.map_sqlx_sqlite_opts(|o| {
            o.journal_mode(sea_orm::sqlx::sqlite::SqliteJournalMode::Wal)
                .synchronous(sea_orm::sqlx::sqlite::SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(30))
                .foreign_keys(true)
                .create_if_missing(true)
        });
    }
    Database::connect(opts).await.map_err(|e| {
        DbErr::Custom(format!(
            "cannot open database {}: {e}",
            redact_url(&cfg.url)
        ))
    })
}

/// Reads a one-row counter table (`id = 1`, `value`), as the services use
/// for change revisions and event sequences.
///
/// # Errors
/// Database failures, or the row is missing.
pub async fn read_counter(conn: &impl sea_orm::ConnectionTrait, table: &str) -> Result<i64, DbErr> {
    counter(
        conn,
        &format!("SELECT value FROM {table} WHERE id = 1"),
        table,
    )
    .await
}

/// Increments a one-row counter table and returns the new value. Run as the
/// first statement of a write transaction it serialises writers: SQLite
/// takes its write lock, Postgres the row's lock, so transactions commit in
/// counter order.
///
/// # Errors
/// Database failures, or the row is missing.
pub async fn bump_counter(conn: &impl sea_orm::ConnectionTrait, table: &str) -> Result<i64, DbErr> {
    counter(
        conn,
        &format!("UPDATE {table} SET value = value + 1 WHERE id = 1 RETURNING value"),
        table,
    )
    .await
}

async fn counter(
    conn: &impl sea_orm::ConnectionTrait,
    sql: &str,
    table: &str,
) -> Result<i64, DbErr> {
    let row = conn
        .query_one_raw(sea_orm::Statement::from_string(
            conn.get_database_backend(),
            sql,
        ))
        .await?
        .ok_or_else(|| DbErr::Custom(format!("counter row of {table} is missing")))?;
    row.try_get_by_index::<i64>(0)
}
