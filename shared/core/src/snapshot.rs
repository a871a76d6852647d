//! The bootstrap view of a datacenter: what the bootstrap service and the
//! scheduler hand each other (`ctrlplane.bootstrap.v1.DatacenterInfo` plus
//! the declared specs), built from a `ctrlplane.datacenter.v1.Datacenter`.

use ctrlplane_proto::bootstrap::v1::{BootstrapServiceSpec, DatacenterInfo};
use ctrlplane_proto::datacenter::v1::Datacenter;

/// The snapshot of a datacenter at its current revision, and its declared
/// bootstrap services.
pub fn bootstrap_snapshot(dc: &Datacenter) -> (DatacenterInfo, Vec<BootstrapServiceSpec>) {
    (
        DatacenterInfo {
            id: dc.id.clone(),
            tenant_id: dc.tenant_id.clone(),
            name: dc.name.clone(),
            slug: dc.slug.clone(),
            provider_name: dc.provider_name.clone(),
            region: dc.region.clone(),
            zone: dc.zone.clone(),
            labels: dc.labels.clone(),
            // DatacenterPhase mirrors DatacenterStatus number for number.
            phase: dc.status,
            revision: dc.revision,
        },
        dc.bootstrap_services.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctrlplane_proto::bootstrap::v1::DatacenterPhase;
    use ctrlplane_proto::datacenter::v1::DatacenterStatus;

    #[test]
    fn phases_mirror_statuses_number_for_number() {
        let pairs = [
            (DatacenterStatus::Unspecified, DatacenterPhase::Unspecified),
            (DatacenterStatus::Active, DatacenterPhase::Active),
            (DatacenterStatus::Maintenance, DatacenterPhase::Maintenance),
            (DatacenterStatus::Draining, DatacenterPhase::Draining),
            (DatacenterStatus::Offline, DatacenterPhase::Offline),
            (DatacenterStatus::Deleting, DatacenterPhase::Deleting),
        ];
        for (status, phase) in pairs {
            let dc = Datacenter {
                status: status as i32,
                revision: 7,
                ..Default::default()
            };
            let (info, _) = bootstrap_snapshot(&dc);
            assert_eq!(info.phase, phase as i32, "{status:?}");
            assert_eq!(info.revision, 7);
        }
    }
}
