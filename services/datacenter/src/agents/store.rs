//! Persistence of the agent registry: `join_tokens` and `agents`, owned by
//! the datacenter process.
//!
//! Joining consumes a token use with one conditional `UPDATE … WHERE uses <
//! max_uses AND expire_time > now`, so two agents racing for a single-use
//! token cannot both win, on SQLite or Postgres. A unique index on
//! `(join_token_id, idempotency_key)` makes a retried join find its first
//! answer instead of registering twice.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::ActiveValue::Set;
use sea_orm::sea_query::{Expr, ExprTrait};
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DbErr, EntityTrait, QueryFilter, QueryOrder,
    QuerySelect, TransactionTrait,
};

use super::model::{Agent, JoinToken};
use crate::error::{Error, Result};

pub(crate) mod entity {
    //! sea-orm entities.

    pub mod join_tokens {
        //! `join_tokens`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "join_tokens")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub token_hash: String,
            pub provider_name: String,
            pub expire_time: DateTimeUtc,
            pub max_uses: i32,
            pub uses: i32,
            pub created_by: String,
            pub create_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod agents {
        //! `agents`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "agents")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub provider_name: String,
            pub endpoint: String,
            pub version: String,
            pub capabilities: String,
            pub info: String,
            pub join_token_id: String,
            pub idempotency_key: String,
            pub revoked: bool,
            pub last_heartbeat_time: DateTimeUtc,
            pub lease_expire_time: DateTimeUtc,
            pub last_checked_at: Option<DateTimeUtc>,
            pub last_latency_ms: Option<i64>,
            pub probe_ok: Option<bool>,
            pub last_error: String,
            pub create_time: DateTimeUtc,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use entity::{agents, join_tokens};

/// Why a join could not register.
#[derive(Debug)]
pub enum RegisterError {
    /// The token has no use left or has expired (re-read it for the reason).
    TokenUnusable,
    /// Another join with the same idempotency key won a race.
    DuplicateKey,
    /// Anything else.
    Other(Error),
}

impl From<DbErr> for RegisterError {
    fn from(e: DbErr) -> Self {
        RegisterError::Other(Error::Database(e))
    }
}

/// Registry persistence.
#[derive(Clone, Debug)]
pub struct AgentStore {
    db: DatabaseConnection,
}

fn corrupt(what: &str, id: &str, e: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("agent {id}: {what}: {e}"))
}

fn from_row(m: agents::Model) -> Result<Agent> {
    Ok(Agent {
        capabilities: serde_json::from_str(&m.capabilities)
            .map_err(|e| corrupt("capabilities", &m.id, e))?,
        info: serde_json::from_str(&m.info).map_err(|e| corrupt("info", &m.id, e))?,
        last_latency: m
            .last_latency_ms
            .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
        id: m.id,
        provider_name: m.provider_name,
        endpoint: m.endpoint,
        version: m.version,
        join_token_id: m.join_token_id,
        idempotency_key: m.idempotency_key,
        revoked: m.revoked,
        last_heartbeat_time: m.last_heartbeat_time,
        lease_expire_time: m.lease_expire_time,
        last_checked_at: m.last_checked_at,
        probe_ok: m.probe_ok,
        last_error: m.last_error,
        create_time: m.create_time,
        update_time: m.update_time,
    })
}

fn to_active(a: &Agent) -> agents::ActiveModel {
    agents::ActiveModel {
        id: Set(a.id.clone()),
        provider_name: Set(a.provider_name.clone()),
        endpoint: Set(a.endpoint.clone()),
        version: Set(a.version.clone()),
        capabilities: Set(serde_json::to_string(&a.capabilities).expect("strings serialize")),
        info: Set(serde_json::to_string(&a.info).expect("strings serialize")),
        join_token_id: Set(a.join_token_id.clone()),
        idempotency_key: Set(a.idempotency_key.clone()),
        revoked: Set(a.revoked),
        last_heartbeat_time: Set(a.last_heartbeat_time),
        lease_expire_time: Set(a.lease_expire_time),
        last_checked_at: Set(a.last_checked_at),
        last_latency_ms: Set(a
            .last_latency
            .map(|d| d.as_millis().min(i64::MAX as u128) as i64)),
        probe_ok: Set(a.probe_ok),
        last_error: Set(a.last_error.clone()),
        create_time: Set(a.create_time),
        update_time: Set(a.update_time),
    }
}

fn token_from_row(m: join_tokens::Model) -> JoinToken {
    JoinToken {
        id: m.id,
        token_hash: m.token_hash,
        provider_name: m.provider_name,
        expire_time: m.expire_time,
        max_uses: m.max_uses,
        uses: m.uses,
        created_by: m.created_by,
        create_time: m.create_time,
    }
}

impl AgentStore {
    /// A store over `db` (migrated by the datacenter store).
    pub fn new(db: DatabaseConnection) -> Self {
        AgentStore { db }
    }

    /// Saves a new join token.
    ///
    /// # Errors
    /// Database failures.
    pub async fn insert_token(&self, t: &JoinToken) -> Result<()> {
        join_tokens::Entity::insert(join_tokens::ActiveModel {
            id: Set(t.id.clone()),
            token_hash: Set(t.token_hash.clone()),
            provider_name: Set(t.provider_name.clone()),
            expire_time: Set(t.expire_time),
            max_uses: Set(t.max_uses),
            uses: Set(t.uses),
            created_by: Set(t.created_by.clone()),
            create_time: Set(t.create_time),
        })
        .exec_without_returning(&self.db)
        .await?;
        Ok(())
    }

    /// One join token.
    ///
    /// # Errors
    /// Database failures.
    pub async fn get_token(&self, id: &str) -> Result<Option<JoinToken>> {
        Ok(join_tokens::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
            .map(token_from_row))
    }

    /// Consumes one use of the token (if it has one left and has not
    /// expired at `now`) and registers the agent, atomically.
    ///
    /// # Errors
    /// [`RegisterError`].
    pub async fn consume_and_register(
        &self,
        token_id: &str,
        now: DateTime<Utc>,
        agent: &Agent,
    ) -> Result<(), RegisterError> {
        let txn = self.db.begin().await?;
        let res = join_tokens::Entity::update_many()
            .col_expr(
                join_tokens::Column::Uses,
                Expr::col(join_tokens::Column::Uses).add(1),
            )
            .filter(join_tokens::Column::Id.eq(token_id))
            .filter(
                Expr::col(join_tokens::Column::Uses).lt(Expr::col(join_tokens::Column::MaxUses)),
            )
            .filter(join_tokens::Column::ExpireTime.gt(now))
            .exec(&txn)
            .await?;
        if res.rows_affected != 1 {
            txn.rollback().await?;
            return Err(RegisterError::TokenUnusable);
        }
        if let Err(e) = agents::Entity::insert(to_active(agent))
            .exec_without_returning(&txn)
            .await
        {
            let _ = txn.rollback().await;
            return Err(match e.sql_err() {
                Some(sea_orm::SqlErr::UniqueConstraintViolation(_)) => RegisterError::DuplicateKey,
                _ => e.into(),
            });
        }
        txn.commit().await?;
        Ok(())
    }

    /// The agent a join with this token and key registered, if any.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn find_by_join_key(&self, token_id: &str, key: &str) -> Result<Option<Agent>> {
        agents::Entity::find()
            .filter(agents::Column::JoinTokenId.eq(token_id))
            .filter(agents::Column::IdempotencyKey.eq(key))
            .one(&self.db)
            .await?
            .map(from_row)
            .transpose()
    }

    /// One agent.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn get(&self, id: &str) -> Result<Option<Agent>> {
        agents::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
            .map(from_row)
            .transpose()
    }

    /// Agents in id order after `after`, optionally of one provider;
    /// `include_revoked` false leaves revoked ones out.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn list(
        &self,
        provider: Option<&str>,
        include_revoked: bool,
        after: Option<&str>,
        limit: u64,
    ) -> Result<Vec<Agent>> {
        let mut cond = Condition::all();
        if let Some(p) = provider {
            cond = cond.add(agents::Column::ProviderName.eq(p));
        }
        if !include_revoked {
            cond = cond.add(agents::Column::Revoked.eq(false));
        }
        if let Some(a) = after {
            cond = cond.add(agents::Column::Id.gt(a));
        }
        agents::Entity::find()
            .filter(cond)
            .order_by_asc(agents::Column::Id)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(from_row)
            .collect()
    }

    /// Whether any unrevoked agent has registered for `provider`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn has_agent(&self, provider: &str) -> Result<bool> {
        Ok(agents::Entity::find()
            .filter(agents::Column::ProviderName.eq(provider))
            .filter(agents::Column::Revoked.eq(false))
            .one(&self.db)
            .await?
            .is_some())
    }

    /// Saves an agent's changed fields (whole row).
    ///
    /// # Errors
    /// Database failures.
    pub async fn save(&self, a: &Agent) -> Result<()> {
        agents::Entity::update(to_active(a)).exec(&self.db).await?;
        Ok(())
    }
}
