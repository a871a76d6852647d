//! The operations of the datacenter service, independent of gRPC.
//!
//! Visibility and permissions, in one place:
//! - platform callers (`system:admin`, `system:service`) see and change
//!   every datacenter, of every tenant and the shared ones;
//! - a tenant caller sees its own datacenters and the platform-shared ones
//!   (`tenant_id = ""`), changes only its own, gets `PERMISSION_DENIED` for
//!   a change to a shared one and `NOT_FOUND` for anything of another
//!   tenant — it never learns that another tenant's datacenter exists.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use ctrlplane_core::page;
use ctrlplane_core::selector::LabelSelector;
use ctrlplane_core::{Violations, id, slug, validate};
use ctrlplane_proto::datacenter::v1::{Capacity, Location};
use ctrlplane_runtime::auth::Caller;
use tokio::sync::{mpsc, watch};

use crate::agents::service::AgentRegistry;
use crate::error::{Error, Result};
use crate::model::{
    Datacenter, DatacenterPatch, Event, EventKind, ListFilter, NewDatacenter, Page, Scope, Status,
};
use crate::store::{Mutation, Store};
use crate::transitions;

/// Longest datacenter name.
pub const NAME_MAX: usize = 100;
/// Longest city name.
pub const CITY_MAX: usize = 100;
/// Default and largest page of `ListDatacenters`.
pub const LIST_PAGE: (u32, u32) = (50, 1000);
/// Default and largest page of `ListDatacenterEvents`.
pub const EVENTS_PAGE: (u32, u32) = (100, 1000);
/// How often a watch re-reads the change log when no local write woke it
/// (writes by other replicas on a shared Postgres).
pub const WATCH_POLL: Duration = Duration::from_secs(1);
/// Events read per watch query.
const WATCH_BATCH: u64 = 256;

/// The datacenter service.
#[derive(Clone, Debug)]
pub struct DatacenterService {
    store: Store,
    registry: AgentRegistry,
    shutdown: watch::Receiver<bool>,
}

impl DatacenterService {
    /// A service over `store`; watches end when `shutdown` turns true.
    pub fn new(store: Store, registry: AgentRegistry, shutdown: watch::Receiver<bool>) -> Self {
        DatacenterService {
            store,
            registry,
            shutdown,
        }
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Registers a datacenter.
    ///
    /// # Errors
    /// `InvalidArgument` naming every bad field, `PermissionDenied` for a
    /// tenant acting for another tenant or the platform, `AlreadyExists` /
    /// `FailedPrecondition` for a slug in use or still being deleted.
    pub async fn create(&self, caller: &Caller, input: NewDatacenter) -> Result<Datacenter> {
        deny_agents(caller)?;
        let tenant_id = match input.tenant_id.as_deref().filter(|t| !t.is_empty()) {
            Some(t) if caller.is_system() => t.to_string(),
            Some(t) if t == caller.tenant_id() => t.to_string(),
            Some(_) => {
                return Err(Error::PermissionDenied(
                    "only system:admin may create datacenters for another tenant".into(),
                ));
            }
            None => caller.tenant_id().to_string(),
        };
        if tenant_id.is_empty() && !caller.is_system() {
            return Err(Error::PermissionDenied(
                "the token has no tenant_id; only system:admin may create platform-shared datacenters".into(),
            ));
        }

        let mut v = Violations::new();
        let slug = check_name(&mut v, "datacenter.name", &input.name);
        validate::dns_label(&mut v, "datacenter.provider_name", &input.provider_name);
        check_optional_label(&mut v, "datacenter.region", &input.region);
        check_optional_label(&mut v, "datacenter.zone", &input.zone);
        check_location(&mut v, "datacenter.location", input.location.as_ref());
        check_capacity(&mut v, "datacenter.capacity", input.capacity.as_ref());
        validate::labels(&mut v, "datacenter.labels", &hash(&input.labels));
        validate::metadata(&mut v, "datacenter.metadata", &hash(&input.metadata));
        validate::bootstrap_specs(
            &mut v,
            "datacenter.bootstrap_services",
            &input.bootstrap_services,
        );
        v.into_result()?;
        self.registry
            .require_registered(&input.provider_name)
            .await?;

        let now = crate::store::now();
        let dc = Datacenter {
            id: id::new_id(id::DATACENTER),
            tenant_id,
            name: input.name,
            slug: slug.unwrap_or_default(),
            provider_name: input.provider_name,
            region: input.region,
            zone: input.zone,
            status: Status::Active,
            location: input.location,
            capacity: input.capacity,
            labels: input.labels,
            metadata: input.metadata,
            bootstrap_services: input.bootstrap_services,
            last_checked_at: None,
            revision: 0,
            create_time: now,
            update_time: now,
        };
        let dc = self.store.create(dc, caller.subject()).await?;
        tracing::info!(id = %dc.id, slug = %dc.slug, tenant = %dc.tenant_id, revision = dc.revision, "datacenter created");
        Ok(dc)
    }

    /// One datacenter by id.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed id, `NotFound` when it does not
    /// exist or is not visible.
    pub async fn get(&self, caller: &Caller, id: &str) -> Result<Datacenter> {
        let scope = scope(caller)?;
        check_id(id, "id")?;
        match self.store.get(id).await? {
            Some(dc) if scope.sees(&dc.tenant_id) => Ok(dc),
            _ => Err(Error::not_found(id)),
        }
    }

    /// One datacenter by slug: for a tenant caller its own, else a shared
    /// one; for a platform caller the one of `tenant_id` ("" = shared).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty slug, `NotFound`.
    pub async fn get_by_slug(
        &self,
        caller: &Caller,
        slug: &str,
        tenant_id: &str,
    ) -> Result<Datacenter> {
        let scope = scope(caller)?;
        if slug.is_empty() {
            let mut v = Violations::new();
            v.add("slug", "is required");
            return Err(v.into());
        }
        let candidates: Vec<&str> = match scope {
            Scope::All => vec![tenant_id],
            _ => {
                if !tenant_id.is_empty() && tenant_id != caller.tenant_id() {
                    return Err(Error::PermissionDenied(
                        "only system:admin may look up another tenant's slugs".into(),
                    ));
                }
                if caller.tenant_id().is_empty() {
                    vec![""]
                } else {
                    vec![caller.tenant_id(), ""]
                }
            }
        };
        for tenant in candidates {
            if let Some(dc) = self.store.get_by_slug(tenant, slug).await? {
                return Ok(dc);
            }
        }
        Err(Error::NotFound(format!(
            "datacenter with slug {slug:?} not found"
        )))
    }

    /// A page of datacenters in creation order.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad page size, selector or token.
    pub async fn list(
        &self,
        caller: &Caller,
        tenant_id: &str,
        filter: ListFilterInput,
        page_size: i32,
        page_token: &str,
    ) -> Result<Page<Datacenter>> {
        let mut scope = scope(caller)?;
        let mut v = Violations::new();
        if !tenant_id.is_empty() {
            match scope {
                Scope::All => scope = Scope::Only(tenant_id.to_string()),
                _ if tenant_id == caller.tenant_id() => {}
                _ => v.add(
                    "tenant_id",
                    "only system:admin may list another tenant's datacenters",
                ),
            }
        }
        let size = page::page_size(page_size, LIST_PAGE.0, LIST_PAGE.1)
            .map_err(|e| v.add("page_size", e))
            .unwrap_or(LIST_PAGE.0);
        let selector = LabelSelector::parse(&filter.label_selector)
            .map_err(|e| v.add("label_selector", e))
            .unwrap_or_default();
        if filter.status_invalid {
            v.add("status", "unknown status value");
        }
        let filter = ListFilter {
            status: filter.status,
            provider_name: Some(filter.provider_name).filter(|p| !p.is_empty()),
            region: Some(filter.region).filter(|r| !r.is_empty()),
            labels: selector.pairs().to_vec(),
        };
        let fp = fingerprint_list(&scope, &filter);
        let after: Option<String> = page::decode_bound(
            &mut v,
            "page_token",
            page_token,
            &fp,
            "was issued for a request with other filters",
        );
        v.into_result()?;

        let mut items = self
            .store
            .list(&scope, &filter, after.as_deref(), u64::from(size) + 1)
            .await?;
        let more = items.len() > size as usize;
        items.truncate(size as usize);
        let next_page_token = match items.last() {
            Some(last) if more => Some(page::encode_bound(last.id.clone(), &fp)),
            _ => None,
        };
        let total_size = self.store.count(&scope, &filter).await?;
        Ok(Page {
            items,
            next_page_token,
            total_size,
        })
    }

    /// Applies a partial update.
    ///
    /// # Errors
    /// `InvalidArgument` (including an empty patch), `NotFound`,
    /// `PermissionDenied`, `FailedPrecondition` while deleting, slug
    /// conflicts on rename.
    pub async fn update(
        &self,
        caller: &Caller,
        id: &str,
        patch: DatacenterPatch,
        mut v: Violations,
    ) -> Result<Datacenter> {
        let scope = scope(caller)?;
        id::check_id(&mut v, "datacenter.id", id::DATACENTER, id);
        let new_slug = match &patch.name {
            Some(name) => check_name(&mut v, "datacenter.name", name),
            None => None,
        };
        if let Some(p) = &patch.provider_name {
            validate::dns_label(&mut v, "datacenter.provider_name", p);
        }
        if let Some(r) = &patch.region {
            check_optional_label(&mut v, "datacenter.region", r);
        }
        if let Some(z) = &patch.zone {
            check_optional_label(&mut v, "datacenter.zone", z);
        }
        if let Some(l) = &patch.location {
            check_location(&mut v, "datacenter.location", l.as_ref());
        }
        if let Some(c) = &patch.capacity {
            check_capacity(&mut v, "datacenter.capacity", c.as_ref());
        }
        if let Some(l) = &patch.labels {
            validate::labels(&mut v, "datacenter.labels", &hash(l));
        }
        if let Some(m) = &patch.metadata {
            validate::metadata(&mut v, "datacenter.metadata", &hash(m));
        }
        if let Some(b) = &patch.bootstrap_services {
            validate::bootstrap_specs(&mut v, "datacenter.bootstrap_services", b);
        }
        v.into_result()?;
        if let Some(p) = &patch.provider_name {
            self.registry.require_registered(p).await?;
        }

        self.store
            .mutate(id, caller.subject(), |current| {
                check_write(caller, &scope, current)?;
                if current.status == Status::Deleting {
                    return Err(Error::FailedPrecondition(format!(
                        "datacenter {id} is being deleted and can no longer be changed"
                    )));
                }
                let mut next = current.clone();
                let mut changed = Vec::new();
                if let Some(name) = patch.name {
                    set(&mut next.name, name, "name", &mut changed);
                    if let Some(slug) = new_slug {
                        set(&mut next.slug, slug, "slug", &mut changed);
                    }
                }
                if let Some(p) = patch.provider_name {
                    set(&mut next.provider_name, p, "provider_name", &mut changed);
                }
                if let Some(r) = patch.region {
                    set(&mut next.region, r, "region", &mut changed);
                }
                if let Some(z) = patch.zone {
                    set(&mut next.zone, z, "zone", &mut changed);
                }
                if let Some(l) = patch.location {
                    set(&mut next.location, l, "location", &mut changed);
                }
                if let Some(c) = patch.capacity {
                    set(&mut next.capacity, c, "capacity", &mut changed);
                }
                if let Some(l) = patch.labels {
                    set(&mut next.labels, l, "labels", &mut changed);
                }
                if let Some(m) = patch.metadata {
                    set(&mut next.metadata, m, "metadata", &mut changed);
                }
                if let Some(b) = patch.bootstrap_services {
                    set(
                        &mut next.bootstrap_services,
                        b,
                        "bootstrap_services",
                        &mut changed,
                    );
                }
                if changed.is_empty() {
                    return Ok(None);
                }
                Ok(Some(Mutation {
                    datacenter: next,
                    kind: EventKind::Updated,
                    message: format!("changed {}", changed.join(", ")),
                }))
            })
            .await
    }

    /// Moves a datacenter along the transition table. Asking for the status
    /// it already has changes nothing and succeeds.
    ///
    /// # Errors
    /// `InvalidArgument` for an unspecified or deleting target,
    /// `FailedPrecondition` naming from and to for a forbidden move,
    /// `NotFound`, `PermissionDenied`.
    pub async fn set_status(
        &self,
        caller: &Caller,
        id: &str,
        to: Option<Status>,
        reason: &str,
    ) -> Result<Datacenter> {
        let scope = scope(caller)?;
        let mut v = Violations::new();
        id::check_id(&mut v, "id", id::DATACENTER, id);
        match to {
            None => v.add(
                "status",
                "must be one of active, maintenance, draining, offline",
            ),
            Some(Status::Deleting) => {
                v.add("status", "use DeleteDatacenter to delete a datacenter")
            }
            Some(_) => {}
        }
        if reason.chars().count() > 1024 {
            v.add("reason", "must be at most 1024 characters");
        }
        v.into_result()?;
        let to = to.unwrap_or(Status::Active);
        self.store
            .mutate(id, caller.subject(), |current| {
                check_write(caller, &scope, current)?;
                let from = current.status;
                if from == to {
                    return Ok(None);
                }
                if !transitions::allowed(from, to) {
                    return Err(Error::FailedPrecondition(format!(
                        "datacenter {id} cannot move from {from} to {to}"
                    )));
                }
                let mut next = current.clone();
                next.status = to;
                let message = if reason.is_empty() {
                    format!("{from} -> {to}")
                } else {
                    format!("{from} -> {to}: {reason}")
                };
                Ok(Some(Mutation {
                    datacenter: next,
                    kind: EventKind::StatusChanged,
                    message,
                }))
            })
            .await
    }

    /// Moves a datacenter to deleting; the bootstrap service retires its
    /// workloads and then purges it. Deleting a deleting datacenter changes
    /// nothing and succeeds.
    ///
    /// # Errors
    /// `InvalidArgument`, `NotFound`, `PermissionDenied`.
    pub async fn delete(&self, caller: &Caller, id: &str) -> Result<Datacenter> {
        let scope = scope(caller)?;
        check_id(id, "id")?;
        self.store
            .mutate(id, caller.subject(), |current| {
                check_write(caller, &scope, current)?;
                if !transitions::deletable(current.status) {
                    return Ok(None);
                }
                let mut next = current.clone();
                next.status = Status::Deleting;
                Ok(Some(Mutation {
                    message: format!("{} -> deleting", current.status),
                    datacenter: next,
                    kind: EventKind::Deleted,
                }))
            })
            .await
    }

    /// Removes a deleting datacenter for good (platform callers only; the
    /// bootstrap service calls it once nothing is left on the datacenter).
    ///
    /// # Errors
    /// `PermissionDenied` for other callers, `NotFound`,
    /// `FailedPrecondition` when it is not deleting.
    pub async fn purge(&self, caller: &Caller, id: &str) -> Result<Datacenter> {
        if !caller.is_system() {
            return Err(Error::PermissionDenied(
                "PurgeDatacenter needs a system:admin or system:service token".into(),
            ));
        }
        check_id(id, "id")?;
        let dc = self
            .store
            .purge(id, caller.subject(), |current| {
                if current.status == Status::Deleting {
                    Ok(())
                } else {
                    Err(Error::FailedPrecondition(format!(
                        "datacenter {id} is {}; only a deleting datacenter can be purged",
                        current.status
                    )))
                }
            })
            .await?;
        tracing::info!(id = %dc.id, "datacenter purged");
        Ok(dc)
    }

    /// Finds a healthy agent for the datacenter's provider.
    ///
    /// # Errors
    /// `NotFound`; `Unavailable` naming the provider when no agent serves
    /// it.
    pub async fn resolve_provider(
        &self,
        caller: &Caller,
        datacenter_id: &str,
    ) -> Result<(Datacenter, ResolvedAgent)> {
        let dc = self.get(caller, datacenter_id).await.map_err(|e| match e {
            Error::InvalidArgument(_) => {
                let mut v = Violations::new();
                v.add("datacenter_id", "must be a datacenter id (dc_…)");
                Error::InvalidArgument(v)
            }
            other => other,
        })?;
        let agent = self.registry.resolve(&dc.provider_name).await?;
        Ok((
            dc,
            ResolvedAgent {
                agent_id: agent.id,
                endpoint: agent.endpoint,
            },
        ))
    }

    /// Finds a healthy agent for a provider by name (platform callers).
    ///
    /// # Errors
    /// `PermissionDenied` for tenants; `Unavailable` saying why no agent
    /// qualifies.
    pub async fn resolve_provider_name(
        &self,
        caller: &Caller,
        provider_name: &str,
    ) -> Result<ResolvedAgent> {
        if !caller.is_system() {
            return Err(Error::PermissionDenied(
                "resolving a provider by name needs a system:admin or system:service token".into(),
            ));
        }
        let agent = self.registry.resolve(provider_name).await?;
        Ok(ResolvedAgent {
            agent_id: agent.id,
            endpoint: agent.endpoint,
        })
    }

    /// A page of change-log events, oldest first.
    ///
    /// # Errors
    /// `InvalidArgument` for a bad id, page size or token.
    pub async fn list_events(
        &self,
        caller: &Caller,
        datacenter_id: &str,
        since_revision: i64,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Event>, Option<String>)> {
        let scope = scope(caller)?;
        let mut v = Violations::new();
        if !datacenter_id.is_empty() {
            id::check_id(&mut v, "datacenter_id", id::DATACENTER, datacenter_id);
        }
        if since_revision < 0 {
            v.add("since_revision", "must not be negative");
        }
        let size = page::page_size(page_size, EVENTS_PAGE.0, EVENTS_PAGE.1)
            .map_err(|e| v.add("page_size", e))
            .unwrap_or(EVENTS_PAGE.0);
        let fp = page::fingerprint(&[&scope_key(&scope), datacenter_id]);
        let after = page::decode_bound::<i64>(
            &mut v,
            "page_token",
            page_token,
            &fp,
            "was issued for a request with other filters",
        )
        .map_or(since_revision, |a| a.max(since_revision));
        v.into_result()?;
        let dc_filter = Some(datacenter_id).filter(|d| !d.is_empty());
        let mut events = self
            .store
            .events_after(&scope, dc_filter, after, u64::from(size) + 1)
            .await?;
        let more = events.len() > size as usize;
        events.truncate(size as usize);
        let next = match events.last() {
            Some(last) if more => Some(page::encode_bound(last.revision, &fp)),
            _ => None,
        };
        Ok((events, next))
    }

    /// Streams change-log events after `since_revision` (0 = from now on)
    /// in revision order until the receiver is dropped or the service shuts
    /// down. A spawned producer reads the log whenever this process commits
    /// a write, and at least every [`WATCH_POLL`] for writes of other
    /// replicas.
    ///
    /// # Errors
    /// `InvalidArgument` for a negative revision; later errors arrive on the
    /// stream.
    pub async fn watch(
        &self,
        caller: &Caller,
        since_revision: i64,
    ) -> Result<mpsc::Receiver<Result<Event>>> {
        let scope = scope(caller)?;
        if since_revision < 0 {
            let mut v = Violations::new();
            v.add("since_revision", "must not be negative");
            return Err(v.into());
        }
        let mut last = if since_revision > 0 {
            since_revision
        } else {
            self.store.current_revision().await?
        };
        let (tx, rx) = mpsc::channel(64);
        let store = self.store.clone();
        let mut shutdown = self.shutdown.clone();
        let mut wake = store.subscribe();
        tokio::spawn(async move {
            loop {
                if *shutdown.borrow() {
                    return;
                }
                // Mark the current value seen before reading, so a commit
                // racing with the read wakes the next wait.
                wake.borrow_and_update();
                let batch = match store.events_after(&scope, None, last, WATCH_BATCH).await {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                };
                let full = batch.len() as u64 == WATCH_BATCH;
                for event in batch {
                    last = event.revision;
                    if tx.send(Ok(event)).await.is_err() {
                        return;
                    }
                }
                if full {
                    continue;
                }
                tokio::select! {
                    _ = wake.changed() => {}
                    () = tokio::time::sleep(WATCH_POLL) => {}
                    () = tx.closed() => return,
                    _ = shutdown.changed() => return,
                }
            }
        });
        Ok(rx)
    }
}

/// Raw list filters as the request gave them.
#[derive(Debug, Clone, Default)]
pub struct ListFilterInput {
    /// Status filter (`None` = any).
    pub status: Option<Status>,
    /// The request carried an unknown status number.
    pub status_invalid: bool,
    /// Provider filter ("" = any).
    pub provider_name: String,
    /// Region filter ("" = any).
    pub region: String,
    /// `k=v,k2=v2`.
    pub label_selector: String,
}

/// The agent a datacenter's provider resolves to.
#[derive(Debug, Clone)]
pub struct ResolvedAgent {
    /// Agent id.
    pub agent_id: String,
    /// Its gRPC endpoint.
    pub endpoint: String,
}

fn deny_agents(caller: &Caller) -> Result<()> {
    if caller.is_agent() && !caller.is_system() {
        return Err(Error::PermissionDenied(
            "agent credentials cannot use the datacenter API".into(),
        ));
    }
    Ok(())
}

fn scope(caller: &Caller) -> Result<Scope> {
    deny_agents(caller)?;
    Ok(if caller.is_system() {
        Scope::All
    } else {
        Scope::TenantAndShared(caller.tenant_id().to_string())
    })
}

/// Write permission on a visible-or-not row; see the module docs.
fn check_write(caller: &Caller, scope: &Scope, dc: &Datacenter) -> Result<()> {
    if !scope.sees(&dc.tenant_id) {
        return Err(Error::not_found(&dc.id));
    }
    if caller.is_system() || (!dc.tenant_id.is_empty() && dc.tenant_id == caller.tenant_id()) {
        return Ok(());
    }
    Err(Error::PermissionDenied(format!(
        "datacenter {} is platform-shared; only system:admin may change it",
        dc.id
    )))
}

fn check_id(value: &str, field: &str) -> Result<()> {
    let mut v = Violations::new();
    id::check_id(&mut v, field, id::DATACENTER, value);
    Ok(v.into_result()?)
}

/// Validates a name and returns its slug.
fn check_name(v: &mut Violations, field: &str, name: &str) -> Option<String> {
    let trimmed = name.trim();
    if trimmed.is_empty() {
        v.add(field, "is required");
        return None;
    }
    if trimmed != name {
        v.add(field, "must not start or end with whitespace");
    }
    if name.chars().count() > NAME_MAX {
        v.add(field, format!("must be at most {NAME_MAX} characters"));
    }
    if name.chars().any(char::is_control) {
        v.add(field, "must not contain control characters");
    }
    let slug = slug::slugify(name);
    if slug.is_none() {
        v.add(
            field,
            "must contain at least one ASCII letter or digit (the slug is derived from it)",
        );
    }
    slug
}

fn check_optional_label(v: &mut Violations, field: &str, value: &str) {
    if !value.is_empty() {
        validate::dns_label(v, field, value);
    }
}

fn check_location(v: &mut Violations, field: &str, loc: Option<&Location>) {
    let Some(loc) = loc else { return };
    if !(loc.latitude.is_finite() && (-90.0..=90.0).contains(&loc.latitude)) {
        v.add(format!("{field}.latitude"), "must be between -90 and 90");
    }
    if !(loc.longitude.is_finite() && (-180.0..=180.0).contains(&loc.longitude)) {
        v.add(format!("{field}.longitude"), "must be between -180 and 180");
    }
    let country_ok = loc.country.is_empty()
        || (loc.country.len() == 2 && loc.country.chars().all(|c| c.is_ascii_uppercase()));
    if !country_ok {
        v.add(
            format!("{field}.country"),
            "must be an ISO 3166-1 alpha-2 code such as \"DE\"",
        );
    }
    if loc.city.chars().count() > CITY_MAX {
        v.add(
            format!("{field}.city"),
            format!("must be at most {CITY_MAX} characters"),
        );
    }
}

fn check_capacity(v: &mut Violations, field: &str, cap: Option<&Capacity>) {
    let Some(cap) = cap else { return };
    if cap.max_instances < 0 {
        v.add(format!("{field}.max_instances"), "must not be negative");
    }
    if cap.max_cpu_millis < 0 {
        v.add(format!("{field}.max_cpu_millis"), "must not be negative");
    }
    if cap.max_memory_mb < 0 {
        v.add(format!("{field}.max_memory_mb"), "must not be negative");
    }
}

fn hash(m: &BTreeMap<String, String>) -> HashMap<String, String> {
    m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

fn set<T: PartialEq>(slot: &mut T, value: T, name: &'static str, changed: &mut Vec<&'static str>) {
    if *slot != value {
        *slot = value;
        changed.push(name);
    }
}

fn scope_key(scope: &Scope) -> String {
    match scope {
        Scope::All => "all".to_string(),
        Scope::Only(t) => format!("only:{t}"),
        Scope::TenantAndShared(t) => format!("tenant:{t}"),
    }
}

fn fingerprint_list(scope: &Scope, f: &ListFilter) -> String {
    let labels: Vec<String> = f.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    page::fingerprint(&[
        &scope_key(scope),
        f.status.map(Status::as_str).unwrap_or(""),
        f.provider_name.as_deref().unwrap_or(""),
        f.region.as_deref().unwrap_or(""),
        &labels.join(","),
    ])
}
