//! Leader election through a lease row in the scheduler's database.
//!
//! One row (`scheduler_leader`, id 1) names the holder and when its lease
//! ends. A replica takes or renews the lease with one conditional UPDATE —
//! `WHERE holder = me OR expire_time < now` — so two replicas can never
//! both win, on SQLite or Postgres. The leader renews every third of the
//! lease; a standby tries at the same pace and takes over once the lease
//! has expired. On shutdown the leader gives the lease up at once.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbErr, Statement, Value};
use tokio::sync::watch;

/// The current time truncated to microseconds (round-trips every backend).
fn now() -> DateTime<Utc> {
    let t = Utc::now();
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Leader election of one replica.
#[derive(Clone, Debug)]
pub struct Election {
    db: DatabaseConnection,
    /// This replica's identity.
    pub id: String,
    /// Lease length.
    pub ttl: Duration,
}

impl Election {
    /// An election for replica `id`.
    pub fn new(db: DatabaseConnection, id: String, ttl: Duration) -> Self {
        Election { db, id, ttl }
    }

    fn stmt(&self, sql: &str, values: Vec<Value>) -> Statement {
        let backend = self.db.get_database_backend();
        let sql = match backend {
            sea_orm::DatabaseBackend::Postgres => {
                let mut out = String::new();
                let mut n = 0;
                for c in sql.chars() {
                    if c == '?' {
                        n += 1;
                        out.push_str(&format!("${n}"));
                    } else {
                        out.push(c);
                    }
                }
                out
            }
            _ => sql.to_string(),
        };
        Statement::from_sql_and_values(backend, sql, values)
    }

    /// Takes or renews the lease. Returns whether this replica leads.
    ///
    /// # Errors
    /// Database failures.
    pub async fn try_acquire(&self) -> Result<bool, DbErr> {
        let t = now();
        let until = t + chrono::Duration::from_std(self.ttl).unwrap_or_default();
        let res = self
            .db
            .execute_raw(self.stmt(
                "UPDATE scheduler_leader SET holder = ?, expire_time = ? WHERE id = 1 AND (holder = ? OR expire_time < ?)",
                vec![self.id.clone().into(), until.into(), self.id.clone().into(), t.into()],
            ))
            .await?;
        Ok(res.rows_affected() == 1)
    }

    /// Gives the lease up if this replica holds it.
    ///
    /// # Errors
    /// Database failures.
    pub async fn release(&self) -> Result<(), DbErr> {
        self.db
            .execute_raw(self.stmt(
                "UPDATE scheduler_leader SET holder = '', expire_time = ? WHERE id = 1 AND holder = ?",
                vec![DateTime::<Utc>::UNIX_EPOCH.into(), self.id.clone().into()],
            ))
            .await?;
        Ok(())
    }

    /// The current holder (may be expired).
    ///
    /// # Errors
    /// Database failures.
    pub async fn holder(&self) -> Result<String, DbErr> {
        let row = self
            .db
            .query_one_raw(self.stmt("SELECT holder FROM scheduler_leader WHERE id = 1", vec![]))
            .await?;
        Ok(row
            .map(|r| r.try_get_by_index::<String>(0))
            .transpose()?
            .unwrap_or_default())
    }

    /// Campaigns until `shutdown` turns true, publishing leadership on
    /// `leader`; gives the lease up on the way out.
    pub async fn campaign(self, leader: watch::Sender<bool>, mut shutdown: watch::Receiver<bool>) {
        let period = self.ttl / 3;
        loop {
            let leads = match self.try_acquire().await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "leader election failed; acting as standby");
                    false
                }
            };
            // Publish changes only: a renewal is not news to the workers.
            leader.send_if_modified(|current| {
                let changed = *current != leads;
                if changed {
                    tracing::info!(replica = %self.id, leads, "leadership changed");
                    *current = leads;
                }
                changed
            });
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                _ = shutdown.changed() => break,
            }
        }
        leader.send_replace(false);
        if let Err(e) = self.release().await {
            tracing::warn!(error = %e, "could not release the leader lease");
        }
    }
}
