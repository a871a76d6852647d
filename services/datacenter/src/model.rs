//! Domain entities of the datacenter service.
//!
//! A [`Datacenter`] is owned by a tenant (`""` = platform-shared). Its
//! `revision` is the global change revision of its last write: revisions
//! come from one counter shared by every datacenter, so a watcher can
//! resume the whole change log from a single number.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1::{Capacity, Location};

/// Lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Serving.
    Active,
    /// Paused for maintenance.
    Maintenance,
    /// Winding down.
    Draining,
    /// Switched off or unreachable.
    Offline,
    /// Being deleted; purged once nothing is left on it.
    Deleting,
}

impl Status {
    /// Every status.
    pub const ALL: [Status; 5] = [
        Status::Active,
        Status::Maintenance,
        Status::Draining,
        Status::Offline,
        Status::Deleting,
    ];

    /// Stable lower-case name, used in storage and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Maintenance => "maintenance",
            Status::Draining => "draining",
            Status::Offline => "offline",
            Status::Deleting => "deleting",
        }
    }

    /// Parses [`Status::as_str`] output.
    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored datacenter.
#[derive(Debug, Clone, PartialEq)]
pub struct Datacenter {
    /// TypeID `dc_…`.
    pub id: String,
    /// Owning tenant; `""` = platform-shared.
    pub tenant_id: String,
    /// Display name.
    pub name: String,
    /// Derived from the name; unique per tenant.
    pub slug: String,
    /// Provider backing it.
    pub provider_name: String,
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Lifecycle status.
    pub status: Status,
    /// Geographic location.
    pub location: Option<Location>,
    /// Capacity limits.
    pub capacity: Option<Capacity>,
    /// Selector labels.
    pub labels: BTreeMap<String, String>,
    /// Free-form metadata.
    pub metadata: BTreeMap<String, String>,
    /// Declared bootstrap services.
    pub bootstrap_services: Vec<BootstrapServiceSpec>,
    /// Last probe of its provider's agent.
    pub last_checked_at: Option<DateTime<Utc>>,
    /// Global revision of its last change.
    pub revision: i64,
    /// Creation time.
    pub create_time: DateTime<Utc>,
    /// Time of the last change.
    pub update_time: DateTime<Utc>,
}

/// Input of a create (validated by the service).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NewDatacenter {
    /// Tenant the caller asked for (`None`: the caller's own).
    pub tenant_id: Option<String>,
    /// Display name.
    pub name: String,
    /// Provider.
    pub provider_name: String,
    /// Region.
    pub region: String,
    /// Zone.
    pub zone: String,
    /// Location.
    pub location: Option<Location>,
    /// Capacity.
    pub capacity: Option<Capacity>,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Metadata.
    pub metadata: BTreeMap<String, String>,
    /// Declared bootstrap services.
    pub bootstrap_services: Vec<BootstrapServiceSpec>,
}

/// A partial update: `Some` fields are replaced, `None` fields are kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DatacenterPatch {
    /// New name (the slug follows).
    pub name: Option<String>,
    /// New provider.
    pub provider_name: Option<String>,
    /// New region.
    pub region: Option<String>,
    /// New zone.
    pub zone: Option<String>,
    /// New location (`Some(None)` clears it).
    pub location: Option<Option<Location>>,
    /// New capacity (`Some(None)` clears it).
    pub capacity: Option<Option<Capacity>>,
    /// New labels (whole map).
    pub labels: Option<BTreeMap<String, String>>,
    /// New metadata (whole map).
    pub metadata: Option<BTreeMap<String, String>>,
    /// New declared bootstrap services (`Some(vec![])` clears them).
    pub bootstrap_services: Option<Vec<BootstrapServiceSpec>>,
}

impl DatacenterPatch {
    /// True when the patch changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == DatacenterPatch::default()
    }
}

/// What happened to a datacenter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Created.
    Created,
    /// Fields changed.
    Updated,
    /// Status changed.
    StatusChanged,
    /// Moved to deleting.
    Deleted,
    /// Row removed.
    Purged,
}

impl EventKind {
    /// Stable name used in storage.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Created => "created",
            EventKind::Updated => "updated",
            EventKind::StatusChanged => "status_changed",
            EventKind::Deleted => "deleted",
            EventKind::Purged => "purged",
        }
    }

    /// Parses [`EventKind::as_str`] output.
    pub fn parse(s: &str) -> Option<EventKind> {
        [
            EventKind::Created,
            EventKind::Updated,
            EventKind::StatusChanged,
            EventKind::Deleted,
            EventKind::Purged,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// One persisted change: an entry of the change log.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// TypeID `evt_…`.
    pub id: String,
    /// Global revision of the change.
    pub revision: i64,
    /// What happened.
    pub kind: EventKind,
    /// The datacenter after the change.
    pub datacenter: Datacenter,
    /// Subject of the caller.
    pub actor: String,
    /// Human-readable detail.
    pub message: String,
    /// When.
    pub create_time: DateTime<Utc>,
}

/// Which datacenters a caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every tenant's (platform callers).
    All,
    /// Exactly one tenant's (platform callers filtering).
    Only(String),
    /// A tenant's own plus the platform-shared ones.
    TenantAndShared(String),
}

impl Scope {
    /// Whether a datacenter of `tenant_id` is visible in this scope.
    pub fn sees(&self, tenant_id: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(t) => t == tenant_id,
            Scope::TenantAndShared(t) => tenant_id.is_empty() || t == tenant_id,
        }
    }
}

/// Filters of a list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this status.
    pub status: Option<Status>,
    /// Only this provider.
    pub provider_name: Option<String>,
    /// Only this region.
    pub region: Option<String>,
    /// Every pair must match.
    pub labels: Vec<(String, String)>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Cursor for the next page, if any.
    pub next_page_token: Option<String>,
    /// Total matching items over all pages.
    pub total_size: u64,
}
