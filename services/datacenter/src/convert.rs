//! Conversions between the domain model and the protobuf contract.
//!
//! Decoding a request never validates values (the service does that and
//! reports every bad field); it only maps representations.

use chrono::{DateTime, Utc};
use ctrlplane_proto::datacenter::v1 as pb;
use ctrlplane_proto::pbjson_types::Timestamp;

use crate::model::{Datacenter, Event, EventKind, Status};

/// Protobuf timestamp of a UTC time.
pub fn timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// UTC time of a protobuf timestamp, if in range.
pub fn from_timestamp(t: &Timestamp) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)
}

/// Protobuf status of a domain status.
pub fn status_to_proto(s: Status) -> pb::DatacenterStatus {
    match s {
        Status::Active => pb::DatacenterStatus::Active,
        Status::Maintenance => pb::DatacenterStatus::Maintenance,
        Status::Draining => pb::DatacenterStatus::Draining,
        Status::Offline => pb::DatacenterStatus::Offline,
        Status::Deleting => pb::DatacenterStatus::Deleting,
    }
}

/// Domain status of a protobuf enum number; `None` for UNSPECIFIED or an
/// unknown number.
pub fn status_from_proto(v: i32) -> Option<Status> {
    match pb::DatacenterStatus::try_from(v).ok()? {
        pb::DatacenterStatus::Unspecified => None,
        pb::DatacenterStatus::Active => Some(Status::Active),
        pb::DatacenterStatus::Maintenance => Some(Status::Maintenance),
        pb::DatacenterStatus::Draining => Some(Status::Draining),
        pb::DatacenterStatus::Offline => Some(Status::Offline),
        pb::DatacenterStatus::Deleting => Some(Status::Deleting),
    }
}

impl From<&Datacenter> for pb::Datacenter {
    fn from(d: &Datacenter) -> Self {
        pb::Datacenter {
            id: d.id.clone(),
            tenant_id: d.tenant_id.clone(),
            name: d.name.clone(),
            slug: d.slug.clone(),
            provider_name: d.provider_name.clone(),
            region: d.region.clone(),
            zone: d.zone.clone(),
            status: status_to_proto(d.status) as i32,
            location: d.location.clone(),
            capacity: d.capacity,
            labels: d.labels.clone().into_iter().collect(),
            metadata: d.metadata.clone().into_iter().collect(),
            bootstrap_services: d.bootstrap_services.clone(),
            last_checked_at: d.last_checked_at.map(timestamp),
            revision: d.revision,
            create_time: Some(timestamp(d.create_time)),
            update_time: Some(timestamp(d.update_time)),
        }
    }
}

/// Rebuilds a domain datacenter from a stored protobuf snapshot.
///
/// # Errors
/// A snapshot with an unknown status or missing times.
pub fn datacenter_from_proto(d: pb::Datacenter) -> Result<Datacenter, String> {
    let status =
        status_from_proto(d.status).ok_or_else(|| format!("unknown status {}", d.status))?;
    let time = |t: &Option<Timestamp>, what: &str| {
        t.as_ref()
            .and_then(from_timestamp)
            .ok_or_else(|| format!("missing {what}"))
    };
    Ok(Datacenter {
        create_time: time(&d.create_time, "create_time")?,
        update_time: time(&d.update_time, "update_time")?,
        last_checked_at: d.last_checked_at.as_ref().and_then(from_timestamp),
        id: d.id,
        tenant_id: d.tenant_id,
        name: d.name,
        slug: d.slug,
        provider_name: d.provider_name,
        region: d.region,
        zone: d.zone,
        status,
        location: d.location,
        capacity: d.capacity,
        labels: d.labels.into_iter().collect(),
        metadata: d.metadata.into_iter().collect(),
        bootstrap_services: d.bootstrap_services,
        revision: d.revision,
    })
}

/// Protobuf event type of an event kind.
pub fn event_kind_to_proto(k: EventKind) -> pb::DatacenterEventType {
    match k {
        EventKind::Created => pb::DatacenterEventType::Created,
        EventKind::Updated => pb::DatacenterEventType::Updated,
        EventKind::StatusChanged => pb::DatacenterEventType::StatusChanged,
        EventKind::Deleted => pb::DatacenterEventType::Deleted,
        EventKind::Purged => pb::DatacenterEventType::Purged,
    }
}

impl From<&Event> for pb::DatacenterEvent {
    fn from(e: &Event) -> Self {
        pb::DatacenterEvent {
            id: e.id.clone(),
            revision: e.revision,
            r#type: event_kind_to_proto(e.kind) as i32,
            datacenter_id: e.datacenter.id.clone(),
            tenant_id: e.datacenter.tenant_id.clone(),
            datacenter: Some((&e.datacenter).into()),
            actor: e.actor.clone(),
            message: e.message.clone(),
            create_time: Some(timestamp(e.create_time)),
        }
    }
}
