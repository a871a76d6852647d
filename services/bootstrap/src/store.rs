//! Persistence of the bootstrap service.
//!
//! Every change of a workload row is written together with its event in one
//! transaction that first increments `bootstrap_sequence`: writes are
//! serialised and commit in sequence order, so an event watcher that has
//! seen sequence N never later finds a committed N-1.
//!
//! `bootstrap_reconciles` holds, per datacenter, the last revision acted on
//! (older snapshots are ignored) and a lease: one reconcile per datacenter
//! at a time, also across replicas.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::provider::v1::{Endpoint, ResourceUsage};

use sea_orm::ActiveValue::Set;
use sea_orm::sea_query::Expr;
use sea_orm::{
    ColumnTrait, Condition, DatabaseConnection, DatabaseTransaction, EntityTrait, QueryFilter,
    QueryOrder, QuerySelect, TransactionTrait,
};
use tokio::sync::watch;

use crate::error::{Error, Result};
use crate::model::{Event, NewEvent, RemoteHook, State, Workload};

pub(crate) mod entity {
    //! sea-orm entities.

    pub mod workloads {
        //! `bootstrap_workloads`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_workloads")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub datacenter_id: String,
            pub tenant_id: String,
            pub provider_name: String,
            pub name: String,
            pub source: String,
            pub spec: String,
            pub spec_hash: String,
            pub structure_hash: String,
            pub applied_hash: Option<String>,
            pub retire: bool,
            pub state: String,
            pub provider_ref: String,
            pub service_refs: String,
            pub endpoints: String,
            pub last_error: String,
            pub attempts: i32,
            pub next_attempt_time: Option<DateTimeUtc>,
            pub lease_expire_time: Option<DateTimeUtc>,
            pub replaces: Option<String>,
            pub usage: Option<String>,
            pub create_time: DateTimeUtc,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod events {
        //! `bootstrap_events`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_events")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub sequence: i64,
            pub id: String,
            pub datacenter_id: String,
            pub workload_id: String,
            pub name: String,
            pub kind: String,
            pub from_state: String,
            pub to_state: String,
            pub message: String,
            pub create_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod reconciles {
        //! `bootstrap_reconciles`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_reconciles")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub datacenter_id: String,
            pub last_revision: i64,
            pub lease_owner: String,
            pub lease_expire_time: Option<DateTimeUtc>,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod hooks {
        //! `bootstrap_hooks`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_hooks")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub name: String,
            pub endpoint: String,
            pub timeout_ms: i64,
            pub last_error: String,
            pub last_success_time: Option<DateTimeUtc>,
            pub create_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod hook_cache {
        //! `bootstrap_hook_cache`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_hook_cache")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub hook_name: String,
            #[sea_orm(primary_key, auto_increment = false)]
            pub datacenter_id: String,
            pub specs: String,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod samples {
        //! `bootstrap_resource_samples`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_resource_samples")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub id: String,
            pub workload_id: String,
            pub datacenter_id: String,
            pub cpu_percent: f64,
            pub memory_bytes: i64,
            pub disk_bytes: i64,
            pub sample_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }

    pub mod gc_cursors {
        //! `bootstrap_gc_cursors`.
        use sea_orm::entity::prelude::*;

        #[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
        #[sea_orm(table_name = "bootstrap_gc_cursors")]
        pub struct Model {
            #[sea_orm(primary_key, auto_increment = false)]
            pub agent_id: String,
            pub page_token: String,
            pub update_time: DateTimeUtc,
        }

        #[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
        pub enum Relation {}

        impl ActiveModelBehavior for ActiveModel {}
    }
}

use entity::{events, gc_cursors, hook_cache, hooks, reconciles, samples, workloads};

/// The current time truncated to microseconds (round-trips every backend).
pub fn now() -> DateTime<Utc> {
    let t = Utc::now();
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Outcome of trying to take a datacenter's reconcile lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// Taken: go ahead.
    Acquired,
    /// The snapshot is older than one already acted on.
    Stale {
        /// The newest revision acted on.
        last_revision: i64,
    },
    /// Another reconcile holds the lease.
    Busy,
}

/// Database access of the bootstrap service.
#[derive(Clone)]
pub struct Store {
    db: DatabaseConnection,
    sequence_tx: Arc<watch::Sender<i64>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn corrupt(what: &str, id: &str, e: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{what} of {id}: {e}"))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("plain data serializes")
}

fn from_row(m: workloads::Model) -> Result<Workload> {
    let state = State::parse(&m.state).ok_or_else(|| corrupt("state", &m.id, &m.state))?;
    let spec: BootstrapServiceSpec =
        serde_json::from_str(&m.spec).map_err(|e| corrupt("spec", &m.id, e))?;
    let service_refs: BTreeMap<String, String> =
        serde_json::from_str(&m.service_refs).map_err(|e| corrupt("service_refs", &m.id, e))?;
    let endpoints =
        serde_json::from_str(&m.endpoints).map_err(|e| corrupt("endpoints", &m.id, e))?;
    Ok(Workload {
        id: m.id,
        datacenter_id: m.datacenter_id,
        tenant_id: m.tenant_id,
        provider_name: m.provider_name,
        name: m.name,
        source: m.source,
        spec,
        spec_hash: m.spec_hash,
        structure_hash: m.structure_hash,
        applied_hash: m.applied_hash,
        retire: m.retire,
        state,
        provider_ref: m.provider_ref,
        service_refs,
        last_error: m.last_error,
        attempts: m.attempts,
        next_attempt_time: m.next_attempt_time,
        lease_expire_time: m.lease_expire_time,
        replaces: m.replaces,
        endpoints,
        usage: m
            .usage
            .as_deref()
            .and_then(|u| serde_json::from_str(u).ok()),
        create_time: m.create_time,
        update_time: m.update_time,
    })
}

fn to_active(w: &Workload) -> workloads::ActiveModel {
    workloads::ActiveModel {
        id: Set(w.id.clone()),
        datacenter_id: Set(w.datacenter_id.clone()),
        tenant_id: Set(w.tenant_id.clone()),
        provider_name: Set(w.provider_name.clone()),
        name: Set(w.name.clone()),
        source: Set(w.source.clone()),
        spec: Set(json(&w.spec)),
        spec_hash: Set(w.spec_hash.clone()),
        structure_hash: Set(w.structure_hash.clone()),
        applied_hash: Set(w.applied_hash.clone()),
        retire: Set(w.retire),
        state: Set(w.state.as_str().to_string()),
        provider_ref: Set(w.provider_ref.clone()),
        service_refs: Set(json(&w.service_refs)),
        last_error: Set(w.last_error.clone()),
        attempts: Set(w.attempts),
        next_attempt_time: Set(w.next_attempt_time),
        lease_expire_time: Set(w.lease_expire_time),
        replaces: Set(w.replaces.clone()),
        create_time: Set(w.create_time),
        update_time: Set(w.update_time),
        ..Default::default()
    }
}

fn event_from_row(m: events::Model) -> Event {
    Event {
        sequence: m.sequence,
        id: m.id,
        datacenter_id: m.datacenter_id,
        workload_id: m.workload_id,
        name: m.name,
        kind: m.kind,
        from_state: State::parse(&m.from_state),
        to_state: State::parse(&m.to_state),
        message: m.message,
        create_time: m.create_time,
    }
}

fn hook_from_row(m: hooks::Model) -> RemoteHook {
    RemoteHook {
        name: m.name,
        endpoint: m.endpoint,
        timeout: Duration::from_millis(u64::try_from(m.timeout_ms).unwrap_or(0)),
        last_error: m.last_error,
        last_success_time: m.last_success_time,
        create_time: m.create_time,
    }
}

impl Store {
    /// Runs migrations and opens the store.
    ///
    /// # Errors
    /// Migration or database failures.
    pub async fn open(db: DatabaseConnection) -> Result<Self> {
        crate::migration::run(&db).await?;
        let store = Store {
            db,
            sequence_tx: Arc::new(watch::channel(0).0),
        };
        let current = store.current_sequence().await?;
        store.sequence_tx.send_replace(current);
        Ok(store)
    }

    /// Receives the newest sequence this process committed.
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.sequence_tx.subscribe()
    }

    /// The newest event sequence.
    ///
    /// # Errors
    /// Database failures.
    pub async fn current_sequence(&self) -> Result<i64> {
        Ok(ctrlplane_runtime::db::read_counter(&self.db, "bootstrap_sequence").await?)
    }

    async fn bump(txn: &DatabaseTransaction) -> Result<i64> {
        Ok(ctrlplane_runtime::db::bump_counter(txn, "bootstrap_sequence").await?)
    }

    async fn insert_event(
        txn: &DatabaseTransaction,
        sequence: i64,
        datacenter_id: &str,
        workload_id: &str,
        name: &str,
        e: &NewEvent,
    ) -> Result<()> {
        events::Entity::insert(events::ActiveModel {
            sequence: Set(sequence),
            id: Set(ctrlplane_core::id::new_id(ctrlplane_core::id::EVENT)),
            datacenter_id: Set(datacenter_id.to_string()),
            workload_id: Set(workload_id.to_string()),
            name: Set(name.to_string()),
            kind: Set(e.kind.clone()),
            from_state: Set(e.from_state.map(State::as_str).unwrap_or("").to_string()),
            to_state: Set(e.to_state.map(State::as_str).unwrap_or("").to_string()),
            message: Set(e.message.clone()),
            create_time: Set(now()),
        })
        .exec_without_returning(txn)
        .await?;
        Ok(())
    }

    /// Every row of a datacenter (including retired ones not yet deleted).
    ///
    /// # Errors
    /// Database failures or corrupt rows.
    pub async fn workloads(&self, datacenter_id: &str) -> Result<Vec<Workload>> {
        workloads::Entity::find()
            .filter(workloads::Column::DatacenterId.eq(datacenter_id))
            .order_by_asc(workloads::Column::Id)
            .all(&self.db)
            .await?
            .into_iter()
            .map(from_row)
            .collect()
    }

    /// A page of a datacenter's rows in id order.
    ///
    /// # Errors
    /// Database failures or corrupt rows.
    pub async fn workloads_page(
        &self,
        datacenter_id: &str,
        after: Option<&str>,
        limit: u64,
    ) -> Result<Vec<Workload>> {
        let mut q =
            workloads::Entity::find().filter(workloads::Column::DatacenterId.eq(datacenter_id));
        if let Some(a) = after {
            q = q.filter(workloads::Column::Id.gt(a));
        }
        q.order_by_asc(workloads::Column::Id)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(from_row)
            .collect()
    }

    /// One row.
    ///
    /// # Errors
    /// Database failures or a corrupt row.
    pub async fn workload(&self, id: &str) -> Result<Option<Workload>> {
        workloads::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
            .map(from_row)
            .transpose()
    }

    fn notify(&self, sequence: i64) {
        self.sequence_tx.send_replace(sequence);
    }

    /// Inserts a row and its event.
    ///
    /// # Errors
    /// Database failures.
    pub async fn insert(&self, w: &Workload, event: &NewEvent) -> Result<()> {
        let txn = self.db.begin().await?;
        let seq = Self::bump(&txn).await?;
        let mut active = to_active(w);
        active.endpoints = Set("[]".to_string());
        workloads::Entity::insert(active)
            .exec_without_returning(&txn)
            .await?;
        Self::insert_event(&txn, seq, &w.datacenter_id, &w.id, &w.name, event).await?;
        txn.commit().await?;
        self.notify(seq);
        Ok(())
    }

    /// Saves a row (and its event, if any). `endpoints` replaces the stored
    /// endpoints when given.
    ///
    /// # Errors
    /// Database failures; `NotFound` when the row is gone.
    pub async fn update(
        &self,
        w: &Workload,
        endpoints: Option<&[Endpoint]>,
        event: Option<&NewEvent>,
    ) -> Result<()> {
        let txn = self.db.begin().await?;
        let seq = if event.is_some() {
            Some(Self::bump(&txn).await?)
        } else {
            None
        };
        let mut active = to_active(w);
        active.endpoints = match endpoints {
            Some(e) => Set(json(&e)),
            None => sea_orm::ActiveValue::NotSet,
        };
        let res = workloads::Entity::update_many()
            .set(active)
            .filter(workloads::Column::Id.eq(w.id.as_str()))
            .exec(&txn)
            .await?;
        if res.rows_affected == 0 {
            return Err(Error::NotFound(format!(
                "bootstrap workload {} not found",
                w.id
            )));
        }
        if let (Some(seq), Some(e)) = (seq, event) {
            Self::insert_event(&txn, seq, &w.datacenter_id, &w.id, &w.name, e).await?;
        }
        txn.commit().await?;
        if let Some(seq) = seq {
            self.notify(seq);
        }
        Ok(())
    }

    /// Records the latest usage sample on a row and in the samples table,
    /// dropping samples older than `retention`.
    ///
    /// # Errors
    /// Database failures.
    pub async fn record_usage(
        &self,
        w: &Workload,
        usage: &ResourceUsage,
        retention: Duration,
    ) -> Result<()> {
        let t = now();
        let txn = self.db.begin().await?;
        workloads::Entity::update_many()
            .col_expr(
                workloads::Column::Usage,
                sea_orm::sea_query::Expr::value(json(usage)),
            )
            .filter(workloads::Column::Id.eq(w.id.as_str()))
            .exec(&txn)
            .await?;
        samples::Entity::insert(samples::ActiveModel {
            id: Set(ctrlplane_core::id::new_id("smp")),
            workload_id: Set(w.id.clone()),
            datacenter_id: Set(w.datacenter_id.clone()),
            cpu_percent: Set(usage.cpu_percent),
            memory_bytes: Set(usage.memory_bytes),
            disk_bytes: Set(usage.disk_bytes),
            sample_time: Set(t),
        })
        .exec_without_returning(&txn)
        .await?;
        let cutoff = t - chrono::Duration::from_std(retention).unwrap_or_default();
        samples::Entity::delete_many()
            .filter(samples::Column::SampleTime.lt(cutoff))
            .exec(&txn)
            .await?;
        txn.commit().await?;
        Ok(())
    }

    /// Number of samples kept for a row.
    ///
    /// # Errors
    /// Database failures.
    pub async fn sample_count(&self, workload_id: &str) -> Result<u64> {
        use sea_orm::PaginatorTrait;
        Ok(samples::Entity::find()
            .filter(samples::Column::WorkloadId.eq(workload_id))
            .count(&self.db)
            .await?)
    }

    /// Deletes a row (its workload is gone) and records the event.
    ///
    /// # Errors
    /// Database failures.
    pub async fn delete(&self, w: &Workload, event: &NewEvent) -> Result<()> {
        let txn = self.db.begin().await?;
        let seq = Self::bump(&txn).await?;
        workloads::Entity::delete_by_id(w.id.clone())
            .exec(&txn)
            .await?;
        samples::Entity::delete_many()
            .filter(samples::Column::WorkloadId.eq(w.id.as_str()))
            .exec(&txn)
            .await?;
        Self::insert_event(&txn, seq, &w.datacenter_id, &w.id, &w.name, event).await?;
        txn.commit().await?;
        self.notify(seq);
        Ok(())
    }

    /// Records a datacenter-level event (hook failures, GC, purge).
    ///
    /// # Errors
    /// Database failures.
    pub async fn record_event(
        &self,
        datacenter_id: &str,
        name: &str,
        event: &NewEvent,
    ) -> Result<()> {
        let txn = self.db.begin().await?;
        let seq = Self::bump(&txn).await?;
        Self::insert_event(&txn, seq, datacenter_id, "", name, event).await?;
        txn.commit().await?;
        self.notify(seq);
        Ok(())
    }

    /// Events after `after`, optionally of one datacenter, oldest first.
    ///
    /// # Errors
    /// Database failures.
    pub async fn events_after(
        &self,
        datacenter_id: Option<&str>,
        after: i64,
        limit: u64,
    ) -> Result<Vec<Event>> {
        let mut cond = Condition::all().add(events::Column::Sequence.gt(after));
        if let Some(dc) = datacenter_id {
            cond = cond.add(events::Column::DatacenterId.eq(dc));
        }
        Ok(events::Entity::find()
            .filter(cond)
            .order_by_asc(events::Column::Sequence)
            .limit(limit)
            .all(&self.db)
            .await?
            .into_iter()
            .map(event_from_row)
            .collect())
    }

    /// Takes a datacenter's reconcile lease for `owner` until `now + ttl`,
    /// unless `revision` is older than the last acted on or another owner
    /// holds an unexpired lease.
    ///
    /// # Errors
    /// Database failures.
    pub async fn acquire(
        &self,
        datacenter_id: &str,
        owner: &str,
        revision: i64,
        ttl: Duration,
    ) -> Result<Acquire> {
        let t = now();
        let until = t + chrono::Duration::from_std(ttl).unwrap_or_default();
        // The row exists from the first reconcile on.
        let fresh = reconciles::ActiveModel {
            datacenter_id: Set(datacenter_id.to_string()),
            last_revision: Set(0),
            lease_owner: Set(String::new()),
            lease_expire_time: Set(None),
            update_time: Set(t),
        };
        match reconciles::Entity::insert(fresh)
            .on_conflict(
                sea_orm::sea_query::OnConflict::column(reconciles::Column::DatacenterId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(&self.db)
            .await
        {
            Ok(_) | Err(sea_orm::DbErr::RecordNotInserted) => {}
            Err(e) => return Err(e.into()),
        }
        // One conditional UPDATE takes the lease: not stale, and free,
        // expired or already ours. Atomic on SQLite and Postgres alike, and
        // it touches only this datacenter's row (no global serialisation).
        let res = reconciles::Entity::update_many()
            .col_expr(
                reconciles::Column::LeaseOwner,
                Expr::value(owner.to_string()),
            )
            .col_expr(reconciles::Column::LeaseExpireTime, Expr::value(until))
            .col_expr(reconciles::Column::UpdateTime, Expr::value(t))
            .filter(reconciles::Column::DatacenterId.eq(datacenter_id))
            .filter(reconciles::Column::LastRevision.lte(revision))
            .filter(
                Condition::any()
                    .add(reconciles::Column::LeaseOwner.eq(owner))
                    .add(reconciles::Column::LeaseOwner.eq(""))
                    .add(reconciles::Column::LeaseExpireTime.lt(t)),
            )
            .exec(&self.db)
            .await?;
        if res.rows_affected == 1 {
            return Ok(Acquire::Acquired);
        }
        let row = reconciles::Entity::find_by_id(datacenter_id.to_string())
            .one(&self.db)
            .await?;
        Ok(match row {
            Some(r) if r.last_revision > revision => Acquire::Stale {
                last_revision: r.last_revision,
            },
            _ => Acquire::Busy,
        })
    }

    /// Releases the lease and records `revision` as acted on.
    ///
    /// # Errors
    /// Database failures.
    pub async fn release(&self, datacenter_id: &str, owner: &str, revision: i64) -> Result<()> {
        let t = now();
        let row = reconciles::Entity::find_by_id(datacenter_id.to_string())
            .one(&self.db)
            .await?;
        if let Some(r) = row
            && r.lease_owner == owner
        {
            reconciles::Entity::update(reconciles::ActiveModel {
                datacenter_id: Set(datacenter_id.to_string()),
                last_revision: Set(r.last_revision.max(revision)),
                lease_owner: Set(String::new()),
                lease_expire_time: Set(None),
                update_time: Set(t),
            })
            .exec(&self.db)
            .await?;
        }
        Ok(())
    }

    /// Forgets a purged datacenter's reconcile bookkeeping and hook cache.
    ///
    /// # Errors
    /// Database failures.
    pub async fn forget_datacenter(&self, datacenter_id: &str) -> Result<()> {
        reconciles::Entity::delete_by_id(datacenter_id.to_string())
            .exec(&self.db)
            .await?;
        hook_cache::Entity::delete_many()
            .filter(hook_cache::Column::DatacenterId.eq(datacenter_id))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// Distinct datacenter ids that have rows.
    ///
    /// # Errors
    /// Database failures.
    pub async fn datacenters_with_rows(&self) -> Result<Vec<String>> {
        let rows: Vec<String> = workloads::Entity::find()
            .select_only()
            .column(workloads::Column::DatacenterId)
            .distinct()
            .into_tuple()
            .all(&self.db)
            .await?;
        Ok(rows)
    }

    /// Whether a row with this id exists.
    ///
    /// # Errors
    /// Database failures.
    pub async fn exists(&self, id: &str) -> Result<bool> {
        Ok(workloads::Entity::find_by_id(id.to_string())
            .one(&self.db)
            .await?
            .is_some())
    }

    /// Registered remote hooks in name order.
    ///
    /// # Errors
    /// Database failures.
    pub async fn hooks(&self) -> Result<Vec<RemoteHook>> {
        Ok(hooks::Entity::find()
            .order_by_asc(hooks::Column::Name)
            .all(&self.db)
            .await?
            .into_iter()
            .map(hook_from_row)
            .collect())
    }

    /// Registers or re-points a remote hook.
    ///
    /// # Errors
    /// Database failures.
    pub async fn upsert_hook(
        &self,
        name: &str,
        endpoint: &str,
        timeout: Duration,
    ) -> Result<RemoteHook> {
        let t = now();
        let existing = hooks::Entity::find_by_id(name.to_string())
            .one(&self.db)
            .await?;
        let model = hooks::ActiveModel {
            name: Set(name.to_string()),
            endpoint: Set(endpoint.to_string()),
            timeout_ms: Set(timeout.as_millis().min(i64::MAX as u128) as i64),
            last_error: Set(String::new()),
            last_success_time: Set(existing.as_ref().and_then(|h| h.last_success_time)),
            create_time: Set(existing.as_ref().map(|h| h.create_time).unwrap_or(t)),
        };
        if existing.is_some() {
            hooks::Entity::update(model).exec(&self.db).await?;
        } else {
            hooks::Entity::insert(model)
                .exec_without_returning(&self.db)
                .await?;
        }
        Ok(hooks::Entity::find_by_id(name.to_string())
            .one(&self.db)
            .await?
            .map(hook_from_row)
            .expect("just written"))
    }

    /// Removes a remote hook and its cached contributions. Returns whether
    /// it existed.
    ///
    /// # Errors
    /// Database failures.
    pub async fn delete_hook(&self, name: &str) -> Result<bool> {
        let res = hooks::Entity::delete_by_id(name.to_string())
            .exec(&self.db)
            .await?;
        hook_cache::Entity::delete_many()
            .filter(hook_cache::Column::HookName.eq(name))
            .exec(&self.db)
            .await?;
        Ok(res.rows_affected > 0)
    }

    /// Records the outcome of a hook call.
    ///
    /// # Errors
    /// Database failures.
    pub async fn hook_outcome(&self, name: &str, error: Option<&str>) -> Result<()> {
        let mut q = hooks::Entity::update_many().col_expr(
            hooks::Column::LastError,
            sea_orm::sea_query::Expr::value(error.unwrap_or("").to_string()),
        );
        if error.is_none() {
            q = q.col_expr(
                hooks::Column::LastSuccessTime,
                sea_orm::sea_query::Expr::value(now()),
            );
        }
        q.filter(hooks::Column::Name.eq(name))
            .exec(&self.db)
            .await?;
        Ok(())
    }

    /// The last specs a hook contributed for a datacenter.
    ///
    /// # Errors
    /// Database failures or a corrupt cache row.
    pub async fn cached_specs(
        &self,
        hook: &str,
        datacenter_id: &str,
    ) -> Result<Option<Vec<BootstrapServiceSpec>>> {
        let row = hook_cache::Entity::find_by_id((hook.to_string(), datacenter_id.to_string()))
            .one(&self.db)
            .await?;
        row.map(|r| serde_json::from_str(&r.specs).map_err(|e| corrupt("hook cache", hook, e)))
            .transpose()
    }

    /// Stores a hook's latest specs for a datacenter.
    ///
    /// # Errors
    /// Database failures.
    pub async fn cache_specs(
        &self,
        hook: &str,
        datacenter_id: &str,
        specs: &[BootstrapServiceSpec],
    ) -> Result<()> {
        let model = hook_cache::ActiveModel {
            hook_name: Set(hook.to_string()),
            datacenter_id: Set(datacenter_id.to_string()),
            specs: Set(json(&specs)),
            update_time: Set(now()),
        };
        let exists = hook_cache::Entity::find_by_id((hook.to_string(), datacenter_id.to_string()))
            .one(&self.db)
            .await?
            .is_some();
        if exists {
            hook_cache::Entity::update(model).exec(&self.db).await?;
        } else {
            hook_cache::Entity::insert(model)
                .exec_without_returning(&self.db)
                .await?;
        }
        Ok(())
    }

    /// The GC cursor of an agent's ListManaged pages.
    ///
    /// # Errors
    /// Database failures.
    pub async fn gc_cursor(&self, agent_id: &str) -> Result<String> {
        Ok(gc_cursors::Entity::find_by_id(agent_id.to_string())
            .one(&self.db)
            .await?
            .map(|r| r.page_token)
            .unwrap_or_default())
    }

    /// Saves the GC cursor of an agent.
    ///
    /// # Errors
    /// Database failures.
    pub async fn set_gc_cursor(&self, agent_id: &str, token: &str) -> Result<()> {
        let model = gc_cursors::ActiveModel {
            agent_id: Set(agent_id.to_string()),
            page_token: Set(token.to_string()),
            update_time: Set(now()),
        };
        if gc_cursors::Entity::find_by_id(agent_id.to_string())
            .one(&self.db)
            .await?
            .is_some()
        {
            gc_cursors::Entity::update(model).exec(&self.db).await?;
        } else {
            gc_cursors::Entity::insert(model)
                .exec_without_returning(&self.db)
                .await?;
        }
        Ok(())
    }
}
