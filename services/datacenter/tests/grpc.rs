//! The datacenter service over a real socket: every RPC, every error path,
//! auth, health, and graceful shutdown with an open watch stream.

mod common;

use common::server::*;

use std::time::Duration;

use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1 as pb;
use ctrlplane_proto::pbjson_types::FieldMask;
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN, ROLE_SERVICE};
use tonic::Code;
use tonic_types::StatusExt;

fn dc(name: &str) -> pb::Datacenter {
    pb::Datacenter {
        name: name.into(),
        provider_name: "process".into(),
        region: "eu".into(),
        ..Default::default()
    }
}

fn spec(name: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        services: vec![ServiceSpec {
            name: "main".into(),
            command: vec!["sleep".into(), "100".into()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn create(c: &mut Client, d: pb::Datacenter) -> pb::Datacenter {
    c.create_datacenter(pb::CreateDatacenterRequest {
        datacenter: Some(d),
    })
    .await
    .unwrap()
    .into_inner()
    .datacenter
    .unwrap()
}

fn bad_fields(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    status
        .get_details_bad_request()
        .expect("google.rpc.BadRequest details")
        .field_violations
        .into_iter()
        .map(|v| v.field)
        .collect()
}

#[tokio::test]
async fn every_rpc_over_a_socket() {
    let s = start().await;
    let mut c = admin(&s);

    let created = create(
        &mut c,
        pb::Datacenter {
            bootstrap_services: vec![spec("logs")],
            labels: [("tier".to_string(), "gold".to_string())].into(),
            ..dc("Main DC")
        },
    )
    .await;
    assert_eq!(created.slug, "main-dc");
    assert_eq!(created.status, pb::DatacenterStatus::Active as i32);
    assert!(created.revision > 0 && created.create_time.is_some());

    // Watch from the creation on.
    let mut stream = c
        .watch_datacenters(pb::WatchDatacentersRequest {
            since_revision: created.revision,
        })
        .await
        .unwrap()
        .into_inner();

    let got = c
        .get_datacenter(pb::GetDatacenterRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert_eq!(got, created);
    let by_slug = c
        .get_datacenter_by_slug(pb::GetDatacenterBySlugRequest {
            slug: "main-dc".into(),
            tenant_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_slug.datacenter.unwrap().id, created.id);

    let listed = c
        .list_datacenters(pb::ListDatacentersRequest {
            label_selector: "tier=gold".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.total_size, 1);
    assert_eq!(listed.datacenters[0].id, created.id);
    assert!(listed.next_page_token.is_empty());

    let updated = c
        .update_datacenter(pb::UpdateDatacenterRequest {
            datacenter: Some(pb::Datacenter {
                id: created.id.clone(),
                zone: "z9".into(),
                region: "ignored-because-not-in-mask".into(),
                ..Default::default()
            }),
            update_mask: Some(FieldMask {
                paths: vec!["zone".into(), "bootstrap_services".into()],
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert_eq!(updated.zone, "z9");
    assert_eq!(updated.region, "eu");
    assert!(
        updated.bootstrap_services.is_empty(),
        "explicit empty list under the mask clears"
    );
    assert!(updated.revision > created.revision);

    let moved = c
        .set_datacenter_status(pb::SetDatacenterStatusRequest {
            id: created.id.clone(),
            status: pb::DatacenterStatus::Maintenance as i32,
            reason: "kernel upgrade".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert_eq!(moved.status, pb::DatacenterStatus::Maintenance as i32);

    // The agent joined in start() serves "process".
    let resolved = c
        .resolve_provider(pb::ResolveProviderRequest {
            datacenter_id: created.id.clone(),
            provider_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resolved.provider_name, "process");
    assert_eq!(resolved.agent_endpoint, "http://127.0.0.1:7401");
    assert!(resolved.agent_id.starts_with("agt_"));
    // Platform callers may resolve a provider by name (for rows whose
    // datacenter is gone); tenants may not.
    let by_name = c
        .resolve_provider(pb::ResolveProviderRequest {
            datacenter_id: String::new(),
            provider_name: "process".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_name.agent_id, resolved.agent_id);
    let err = client(&s, "u", "t1", &[])
        .resolve_provider(pb::ResolveProviderRequest {
            datacenter_id: String::new(),
            provider_name: "process".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);

    let deleted = c
        .delete_datacenter(pb::DeleteDatacenterRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .datacenter
        .unwrap();
    assert_eq!(deleted.status, pb::DatacenterStatus::Deleting as i32);

    // Only platform callers purge; a service token may.
    let mut svc = client(&s, "bootstrap", "", &[ROLE_SERVICE]);
    svc.purge_datacenter(pb::PurgeDatacenterRequest {
        id: created.id.clone(),
    })
    .await
    .unwrap();
    let err = c
        .get_datacenter(pb::GetDatacenterRequest {
            id: created.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // The watch saw every change in order.
    use pb::DatacenterEventType as T;
    let mut kinds = Vec::new();
    let mut last = created.revision;
    for _ in 0..4 {
        let ev = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
            .event
            .unwrap();
        assert!(ev.revision > last);
        last = ev.revision;
        kinds.push(T::try_from(ev.r#type).unwrap());
    }
    assert_eq!(kinds, [T::Updated, T::StatusChanged, T::Deleted, T::Purged]);

    let events = c
        .list_datacenter_events(pb::ListDatacenterEventsRequest {
            datacenter_id: created.id.clone(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(events.events.len(), 2);
    assert_eq!(events.events[0].r#type, T::Created as i32);
    assert!(!events.next_page_token.is_empty());
}

#[tokio::test]
async fn bad_input_names_every_field() {
    let s = start().await;
    let mut c = admin(&s);
    let err = c
        .create_datacenter(pb::CreateDatacenterRequest {
            datacenter: Some(pb::Datacenter {
                name: String::new(),
                provider_name: "UPPER".into(),
                labels: [("bad key!".to_string(), "v".to_string())].into(),
                bootstrap_services: vec![BootstrapServiceSpec {
                    name: "logs".into(),
                    services: vec![ServiceSpec {
                        name: "Main_1".into(),
                        ports: vec![ctrlplane_proto::provider::v1::PortSpec {
                            container: 70000,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    let fields = bad_fields(&err);
    for want in [
        "datacenter.name",
        "datacenter.provider_name",
        "datacenter.labels[bad key!]",
        "datacenter.bootstrap_services[0].services[0].name",
        "datacenter.bootstrap_services[0].services[0].ports[0].container",
    ] {
        assert!(
            fields.iter().any(|f| f == want),
            "{want} missing from {fields:?}"
        );
    }

    assert_eq!(
        bad_fields(
            &c.create_datacenter(pb::CreateDatacenterRequest { datacenter: None })
                .await
                .unwrap_err()
        ),
        ["datacenter"]
    );
    let created = create(&mut c, dc("ok")).await;
    let err = c
        .update_datacenter(pb::UpdateDatacenterRequest {
            datacenter: Some(pb::Datacenter {
                id: created.id.clone(),
                ..Default::default()
            }),
            update_mask: Some(FieldMask {
                paths: vec!["zone".into(), "status".into(), "slug".into()],
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(
        bad_fields(&err),
        ["update_mask.paths[1]", "update_mask.paths[2]"]
    );
    let err = c
        .update_datacenter(pb::UpdateDatacenterRequest {
            datacenter: Some(pb::Datacenter {
                id: created.id.clone(),
                ..Default::default()
            }),
            update_mask: None,
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["update_mask"]);
    let err = c
        .get_datacenter(pb::GetDatacenterRequest { id: "nope".into() })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["id"]);
    let err = c
        .list_datacenters(pb::ListDatacentersRequest {
            page_size: -5,
            status: 42,
            label_selector: "=x".into(),
            page_token: "!!".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        bad_fields(&err),
        ["page_size", "label_selector", "status", "page_token"]
    );
    let err = c
        .watch_datacenters(pb::WatchDatacentersRequest { since_revision: -1 })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["since_revision"]);

    // Nothing was written by any of the failed calls.
    let all = c
        .list_datacenters(pb::ListDatacentersRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.total_size, 1);
    assert_eq!(all.datacenters[0].revision, created.revision);
}

#[tokio::test]
async fn domain_errors_map_to_their_codes() {
    let s = start().await;
    let mut c = admin(&s);
    let a = create(&mut c, dc("Alpha")).await;
    let err = c
        .create_datacenter(pb::CreateDatacenterRequest {
            datacenter: Some(dc("alpha")),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);

    let err = c
        .set_datacenter_status(pb::SetDatacenterStatusRequest {
            id: a.id.clone(),
            status: pb::DatacenterStatus::Draining as i32,
            reason: String::new(),
        })
        .await
        .and(
            c.set_datacenter_status(pb::SetDatacenterStatusRequest {
                id: a.id.clone(),
                status: pb::DatacenterStatus::Maintenance as i32,
                reason: String::new(),
            })
            .await,
        )
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("from draining to maintenance"),
        "{}",
        err.message()
    );

    let err = c
        .get_datacenter(pb::GetDatacenterRequest {
            id: "dc_01h455vb4pex5vsknk084sn02q".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Tenancy over the wire.
    let mut t1 = client(&s, "u1", "t1", &[]);
    let mut t2 = client(&s, "u2", "t2", &[]);
    let own = create(&mut t1, dc("own")).await;
    assert_eq!(own.tenant_id, "t1");
    let err = t2
        .get_datacenter(pb::GetDatacenterRequest { id: own.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::NotFound,
        "cross-tenant reads are NOT_FOUND"
    );
    let err = t2
        .delete_datacenter(pb::DeleteDatacenterRequest { id: own.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    // `a` is shared (created by an admin without tenant): readable, not writable.
    t1.get_datacenter(pb::GetDatacenterRequest { id: a.id.clone() })
        .await
        .unwrap();
    let err = t1
        .delete_datacenter(pb::DeleteDatacenterRequest { id: a.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = t1
        .purge_datacenter(pb::PurgeDatacenterRequest { id: own.id.clone() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn tokens_are_checked_and_health_is_open() {
    let s = start().await;
    let mut expired = Claims::new("old", "", vec![ROLE_ADMIN.into()], Duration::from_secs(1));
    expired.exp -= 3600;
    let forged = Authenticator::new(b"not-the-secret-not-the-secret-xx").mint(&Claims::new(
        "mallory",
        "",
        vec![ROLE_ADMIN.into()],
        Duration::from_secs(600),
    ));
    let cases = [
        (None, "missing authorization"),
        (
            Some(format!(
                "Bearer {}",
                Authenticator::new(SECRET).mint(&expired)
            )),
            "expired",
        ),
        (Some(format!("Bearer {forged}")), "invalid token"),
        (Some("Basic YWRtaW46YWRtaW4=".to_string()), "malformed"),
        (Some("Bearer not-a-jwt".to_string()), "invalid token"),
    ];
    for (header, want) in cases {
        let mut c = client_with(&s, header.clone());
        let err = c
            .list_datacenters(pb::ListDatacentersRequest::default())
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::Unauthenticated, "{header:?}");
        assert!(
            err.message().contains(want),
            "{header:?}: {}",
            err.message()
        );
    }

    // Health needs no token and reports the service.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&s));
    for service in ["", "ctrlplane.datacenter.v1.DatacenterService"] {
        let resp = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            resp.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
    }
}

#[tokio::test]
async fn shutdown_drains_and_ends_watches() {
    let mut s = start().await;
    let mut c = admin(&s);
    create(&mut c, dc("one")).await;
    let mut stream = c
        .watch_datacenters(pb::WatchDatacentersRequest { since_revision: 0 })
        .await
        .unwrap()
        .into_inner();
    s.stop.take().unwrap().send(()).unwrap();
    // The server returns well within its grace period, and the open watch
    // ends instead of holding the drain.
    let res = tokio::time::timeout(Duration::from_secs(4), &mut s.handle)
        .await
        .expect("server stopped within the grace period");
    res.unwrap().unwrap();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message())
        .await
        .unwrap();
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}
