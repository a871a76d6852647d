//! Persistence of datacenters, their labels and the change log.
//!
//! Tables (owned by this service only):
//! - `datacenters`: one row per datacenter; JSON text columns for nested
//!   values; unique `(tenant_id, slug)`.
//! - `datacenter_labels`: one row per label, so selectors filter in SQL the
//!   same way on SQLite and Postgres.
//! - `datacenter_events`: the change log, keyed by global revision; it
//!   carries a full snapshot so watchers resume after restarts.
//! - `datacenter_revision`: a one-row counter.
//!
//! Invariant: every write transaction starts by incrementing the counter.
//! That takes the database's write lock first (SQLite) or the counter row's
//! lock (Postgres), so writes are serialised and commit in revision order: a
//! watcher that has seen revision N never later finds a committed N-1.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use ctrlplane_proto::datacenter::v1 as pb;
use sea_orm::sea_query::{Expr, Query};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, DatabaseConnection, DatabaseTransaction, DbErr,
    EntityTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use tokio::sync::watch;

use crate::convert;
use crate::error::{Error, Result};
use crate::migration;
use crate::model::{Datacenter, Event, EventKind, ListFilter, Scope, Status};

pub(crate) mod entity {
    //! sea-orm entities of the tables above.

    pub mod datacenters {
        //! `datacenters`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "datacenters")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub tenant_id: String,
            pub name: String,
            pub slug: String,
            pub provider_name: String,
            pub region: String,
            pub zone: String,
            pub status: String,
            pub location: Option<String>,
            pub capacity: Option<String>,
            pub labels: String,
            pub metadata: String,
            pub bootstrap_services: String,
            pub last_checked_at: Option<DateTimeUtc>,
            pub revision: i64,
            pub create_time: DateTimeUtc,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod labels {
        //! `datacenter_labels`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "datacenter_labels")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub datacenter_id: String,
            #[sea_orm(primary_key, auto_increment = false)]
            pub label_key: String,
            pub label_value: String,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod events {
        //! `datacenter_events`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "datacenter_events")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub revision: i64,
            pub id: String,
            pub kind: String,
            pub datacenter_id: String,
            pub tenant_id: String,
            pub snapshot: String,
            pub actor: String,
            pub message: String,
            pub create_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use entity::{datacenters, events, labels};

/// The outcome of a mutation closure: the new state and how to log it.
#[derive(Debug)]
pub struct Mutation {
    /// The datacenter after the change (revision and update_time are set
    /// by the store).
    pub datacenter: Datacenter,
    /// Event kind.
    pub kind: EventKind,
    /// Event message.
    pub message: String,
}

/// The current time, truncated to microseconds so that it round-trips
/// through every backend unchanged.
pub fn now() -> DateTime<Utc> {
    let t = Utc::now();
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Database access of the datacenter service.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    revision_tx: Arc<watch::Sender<i64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

impl Store {
    /// Runs migrations and opens the store.
    ///
    /// # Errors
    /// Migration or database failures.
    pub async fn open(db: DatabaseConnection) -> Result<Self> {
        migration::run(&db).await?;
        let store = Store {
            db,
            revision_tx: Arc::new(watch::channel(0).0),
        };
        let current = store.current_revision().await?;
        store.revision_tx.send_replace(current);
        Ok(store)
    }

    /// The database connection.
    pub fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Receives the latest committed revision of this process's writes.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.revision_tx.subscribe()
    }

    /// The latest revision in the change log.
    ///
    /// # Errors
    /// Database failures.
    pub async fn current_revision(&self) -> Result<i64> {
        Ok(ctrlplane_runtime::db::read_counter(&self.db, "datacenter_revision").await?)
    }

    async fn bump_revision(txn: &DatabaseTransaction) -> Result<i64> {
        Ok(ctrlplane_runtime::db::bump_counter(txn, "datacenter_revision").await?)
    }

    /// One datacenter by id (no visibility check).
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn get(&self, id: &str) -> Result<Option<Datacenter>> {
        datacenters::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
            .map(from_row)
            .transpose()
    }

    /// One datacenter by tenant and slug.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn get_by_slug(&self, tenant_id: &str, slug: &str) -> Result<Option<Datacenter>> {
        datacenters::Entity::find()
            .filter(datacenters::Column::TenantId.eq(tenant_id))
            .filter(datacenters::Column::Slug.eq(slug))
            .one(&self.db)
            .await?
            .map(from_row)
            .transpose()
    }

    /// Up to `limit` datacenters after `after_id` in id (= creation) order.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn list(
        &self,
        scope: &Scope,
        filter: &ListFilter,
        after_id: Option<&str>,
        limit: u64,
    ) -> Result<Vec<Datacenter>> {
        let mut cond = list_condition(scope, filter);
        if let Some(after) = after_id {
            cond = cond.add(datacenters::Column::Id.gt(after));
        }
        datacenters::Entity::find()
            .filter(cond)
            .order_by_asc(datacenters::Column::Id)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(from_row)
            .collect()
    }

    /// Number of datacenters matching `scope` and `filter`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn count(&self, scope: &Scope, filter: &ListFilter) -> Result<u64> {
        Ok(datacenters::Entity::find()
            .filter(list_condition(scope, filter))
            .count(&self.db)
            .await?)
    }

    /// Inserts a new datacenter (its `revision`, `create_time` and
    /// `update_time` are set here) and logs `created`.
    ///
    /// # Errors
    /// `AlreadyExists` / `FailedPrecondition` on a slug conflict, database
    /// failures.
    pub async fn create(&self, mut dc: Datacenter, actor: &str) -> Result<Datacenter> {
        let txn = self.db.begin().await?;
        let revision = Self::bump_revision(&txn).await?;
        check_slug_free(&txn, &dc.tenant_id, &dc.slug, None).await?;
        let t = now();
        dc.revision = revision;
        dc.create_time = t;
        dc.update_time = t;
        datacenters::Entity::insert(to_active(&dc)?)
            .exec_without_returning(&txn)
            .await
            .map_err(|e| slug_conflict_or(e, &dc.slug))?;
        replace_labels(&txn, &dc).await?;
        insert_event(&txn, &dc, EventKind::Created, actor, "created", t).await?;
        txn.commit().await?;
        self.revision_tx.send_replace(revision);
        Ok(dc)
    }

    /// Changes a datacenter in one transaction: `decide` sees the current
    /// row and returns the new state, or `None` for "nothing to change" (the
    /// current row is returned and no revision is used).
    ///
    /// # Errors
    /// `NotFound` when the row does not exist, whatever `decide` returns,
    /// slug conflicts, database failures.
    pub async fn mutate<F>(&self, id: &str, actor: &str, decide: F) -> Result<Datacenter>
    where
        F: FnOnce(&Datacenter) -> Result<Option<Mutation>>,
    {
        let txn = self.db.begin().await?;
        let revision = Self::bump_revision(&txn).await?;
        let current = datacenters::Entity::find_by_id(id.to_string())
            .one(&txn)
            .await?
            .map(from_row)
            .transpose()?
            .ok_or_else(|| Error::not_found(id))?;
        let Some(m) = decide(&current)? else {
            txn.rollback().await?;
            return Ok(current);
        };
        let mut dc = m.datacenter;
        if dc.slug != current.slug || dc.tenant_id != current.tenant_id {
            check_slug_free(&txn, &dc.tenant_id, &dc.slug, Some(&dc.id)).await?;
        }
        let t = now();
        dc.revision = revision;
        dc.update_time = t;
        datacenters::Entity::update(to_active(&dc)?)
            .exec(&txn)
            .await
            .map_err(|e| slug_conflict_or(e, &dc.slug))?;
        if dc.labels != current.labels {
            replace_labels(&txn, &dc).await?;
        }
        insert_event(&txn, &dc, m.kind, actor, &m.message, t).await?;
        txn.commit().await?;
        self.revision_tx.send_replace(revision);
        Ok(dc)
    }

    /// Removes a datacenter for good after `check` approves the current row;
    /// logs `purged` with its last state.
    ///
    /// # Errors
    /// `NotFound`, whatever `check` returns, database failures.
    pub async fn purge<F>(&self, id: &str, actor: &str, check: F) -> Result<Datacenter>
    where
        F: FnOnce(&Datacenter) -> Result<()>,
    {
        let txn = self.db.begin().await?;
        let revision = Self::bump_revision(&txn).await?;
        let mut dc = datacenters::Entity::find_by_id(id.to_string())
            .one(&txn)
            .await?
            .map(from_row)
            .transpose()?
            .ok_or_else(|| Error::not_found(id))?;
        check(&dc)?;
        labels::Entity::delete_many()
            .filter(labels::Column::DatacenterId.eq(id))
            .exec(&txn)
            .await?;
        datacenters::Entity::delete_by_id(id.to_string())
            .exec(&txn)
            .await?;
        let t = now();
        dc.revision = revision;
        dc.update_time = t;
        insert_event(&txn, &dc, EventKind::Purged, actor, "purged", t).await?;
        txn.commit().await?;
        self.revision_tx.send_replace(revision);
        Ok(dc)
    }

    /// Change-log entries after `after_revision` visible in `scope`
    /// (optionally of one datacenter), oldest first, at most `limit`.
    ///
    /// # Errors
    /// Database failures or a corrupt snapshot.
    pub async fn events_after(
        &self,
        scope: &Scope,
        datacenter_id: Option<&str>,
        after_revision: i64,
        limit: u64,
    ) -> Result<Vec<Event>> {
        let mut cond = Condition::all().add(events::Column::Revision.gt(after_revision));
        cond = match scope {
            Scope::All => cond,
            Scope::Only(t) => cond.add(events::Column::TenantId.eq(t.as_str())),
            Scope::TenantAndShared(t) => cond.add(events::Column::TenantId.is_in([t.as_str(), ""])),
        };
        if let Some(id) = datacenter_id {
            cond = cond.add(events::Column::DatacenterId.eq(id));
        }
        events::Entity::find()
            .filter(cond)
            .order_by_asc(events::Column::Revision)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(event_from_row)
            .collect()
    }

    /// Stamps `last_checked_at` on every datacenter of a provider. This is
    /// bookkeeping, not a change of the datacenter: no revision, no event.
    ///
    /// # Errors
    /// Database failures.
    pub async fn touch_checked(&self, provider_name: &str, at: DateTime<Utc>) -> Result<u64> {
        let res = datacenters::Entity::update_many()
            .col_expr(datacenters::Column::LastCheckedAt, Expr::value(at))
            .filter(datacenters::Column::ProviderName.eq(provider_name))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected)
    }
}

fn list_condition(scope: &Scope, filter: &ListFilter) -> Condition {
    let mut cond = Condition::all();
    cond = match scope {
        Scope::All => cond,
        Scope::Only(t) => cond.add(datacenters::Column::TenantId.eq(t.as_str())),
        Scope::TenantAndShared(t) => {
            cond.add(datacenters::Column::TenantId.is_in([t.as_str(), ""]))
        }
    };
    if let Some(s) = filter.status {
        cond = cond.add(datacenters::Column::Status.eq(s.as_str()));
    }
    if let Some(p) = &filter.provider_name {
        cond = cond.add(datacenters::Column::ProviderName.eq(p.as_str()));
    }
    if let Some(r) = &filter.region {
        cond = cond.add(datacenters::Column::Region.eq(r.as_str()));
    }
    for (k, v) in &filter.labels {
        let sub = Query::select()
            .column(labels::Column::DatacenterId)
            .from(labels::Entity)
            .and_where(labels::Column::LabelKey.eq(k.as_str()))
            .and_where(labels::Column::LabelValue.eq(v.as_str()))
            .to_owned();
        cond = cond.add(datacenters::Column::Id.in_subquery(sub));
    }
    cond
}

async fn check_slug_free(
    txn: &DatabaseTransaction,
    tenant_id: &str,
    slug: &str,
    except_id: Option<&str>,
) -> Result<()> {
    let mut q = datacenters::Entity::find()
        .filter(datacenters::Column::TenantId.eq(tenant_id))
        .filter(datacenters::Column::Slug.eq(slug));
    if let Some(id) = except_id {
        q = q.filter(datacenters::Column::Id.ne(id));
    }
    let Some(existing) = q.one(txn).await? else {
        return Ok(());
    };
    if existing.status == Status::Deleting.as_str() {
        Err(Error::FailedPrecondition(format!(
            "a datacenter with slug {slug:?} ({}) is still being deleted; wait until it is purged or choose another name",
            existing.id
        )))
    } else {
        Err(Error::AlreadyExists(format!(
            "a datacenter with slug {slug:?} already exists ({})",
            existing.id
        )))
    }
}

/// Maps a unique violation (a racing insert from another replica) to the
/// same `AlreadyExists` the pre-check gives.
fn slug_conflict_or(e: DbErr, slug: &str) -> Error {
    match e.sql_err() {
        Some(sea_orm::SqlErr::UniqueConstraintViolation(_)) => {
            Error::AlreadyExists(format!("a datacenter with slug {slug:?} already exists"))
        }
        _ => Error::Database(e),
    }
}

async fn replace_labels(txn: &DatabaseTransaction, dc: &Datacenter) -> Result<()> {
    labels::Entity::delete_many()
        .filter(labels::Column::DatacenterId.eq(dc.id.as_str()))
        .exec(txn)
        .await?;
    if dc.labels.is_empty() {
        return Ok(());
    }
    let rows = dc.labels.iter().map(|(k, v)| labels::ActiveModel {
        datacenter_id: Set(dc.id.clone()),
        label_key: Set(k.clone()),
        label_value: Set(v.clone()),
    });
    labels::Entity::insert_many(rows)
        .exec_without_returning(txn)
        .await?;
    Ok(())
}

async fn insert_event(
    txn: &DatabaseTransaction,
    dc: &Datacenter,
    kind: EventKind,
    actor: &str,
    message: &str,
    at: DateTime<Utc>,
) -> Result<()> {
    let snapshot = serde_json::to_string(&pb::Datacenter::from(dc))
        .map_err(|e| Error::Corrupt(format!("cannot encode snapshot: {e}")))?;
    events::Entity::insert(events::ActiveModel {
        revision: Set(dc.revision),
        id: Set(ctrlplane_core::id::new_id(ctrlplane_core::id::EVENT)),
        kind: Set(kind.as_str().to_string()),
        datacenter_id: Set(dc.id.clone()),
        tenant_id: Set(dc.tenant_id.clone()),
        snapshot: Set(snapshot),
        actor: Set(actor.to_string()),
        message: Set(message.to_string()),
        create_time: Set(at),
    })
    .exec_without_returning(txn)
    .await?;
    Ok(())
}

fn json<T: serde::Serialize>(v: &T) -> Result<String> {
    serde_json::to_string(v).map_err(|e| Error::Corrupt(format!("cannot encode: {e}")))
}

fn parse<T: serde::de::DeserializeOwned>(s: &str, what: &str, id: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|e| Error::Corrupt(format!("datacenter {id}: {what}: {e}")))
}

fn to_active(dc: &Datacenter) -> Result<datacenters::ActiveModel> {
    Ok(datacenters::ActiveModel {
        id: Set(dc.id.clone()),
        tenant_id: Set(dc.tenant_id.clone()),
        name: Set(dc.name.clone()),
        slug: Set(dc.slug.clone()),
        provider_name: Set(dc.provider_name.clone()),
        region: Set(dc.region.clone()),
        zone: Set(dc.zone.clone()),
        status: Set(dc.status.as_str().to_string()),
        location: Set(dc.location.as_ref().map(json).transpose()?),
        capacity: Set(dc.capacity.as_ref().map(json).transpose()?),
        labels: Set(json(&dc.labels)?),
        metadata: Set(json(&dc.metadata)?),
        bootstrap_services: Set(json(&dc.bootstrap_services)?),
        last_checked_at: Set(dc.last_checked_at),
        revision: Set(dc.revision),
        create_time: Set(dc.create_time),
        update_time: Set(dc.update_time),
    })
}

fn from_row(m: datacenters::Model) -> Result<Datacenter> {
    let status = Status::parse(&m.status).ok_or_else(|| {
        Error::Corrupt(format!(
            "datacenter {}: unknown status {:?}",
            m.id, m.status
        ))
    })?;
    Ok(Datacenter {
        location: m
            .location
            .as_deref()
            .map(|s| parse(s, "location", &m.id))
            .transpose()?,
        capacity: m
            .capacity
            .as_deref()
            .map(|s| parse(s, "capacity", &m.id))
            .transpose()?,
        labels: parse(&m.labels, "labels", &m.id)?,
        metadata: parse(&m.metadata, "metadata", &m.id)?,
        bootstrap_services: parse(&m.bootstrap_services, "bootstrap_services", &m.id)?,
        id: m.id,
        tenant_id: m.tenant_id,
        name: m.name,
        slug: m.slug,
        provider_name: m.provider_name,
        region: m.region,
        zone: m.zone,
        status,
        last_checked_at: m.last_checked_at,
        revision: m.revision,
        create_time: m.create_time,
        update_time: m.update_time,
    })
}

fn event_from_row(m: events::Model) -> Result<Event> {
    let kind = EventKind::parse(&m.kind).ok_or_else(|| {
        Error::Corrupt(format!("event {}: unknown kind {:?}", m.revision, m.kind))
    })?;
    let snapshot: pb::Datacenter = serde_json::from_str(&m.snapshot)
        .map_err(|e| Error::Corrupt(format!("event {}: snapshot: {e}", m.revision)))?;
    let datacenter = convert::datacenter_from_proto(snapshot)
        .map_err(|e| Error::Corrupt(format!("event {}: snapshot: {e}", m.revision)))?;
    Ok(Event {
        id: m.id,
        revision: m.revision,
        kind,
        datacenter,
        actor: m.actor,
        message: m.message,
        create_time: m.create_time,
    })
}
