//! The datacenter service's semantics on both SQLite and a real Postgres:
//! slugs, tenancy, pagination, masks, transitions, delete/purge, the change
//! log and watches. Every test runs once per backend.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::{Backend, admin, open_store, service, system_service, tenant};
use ctrlplane_datacenter::Error;
use ctrlplane_datacenter::model::{DatacenterPatch, EventKind, NewDatacenter, Status};
use ctrlplane_datacenter::service::{DatacenterService, ListFilterInput};
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_runtime::auth::Caller;

fn new_dc(name: &str) -> NewDatacenter {
    NewDatacenter {
        name: name.to_string(),
        provider_name: "process".to_string(),
        region: "eu-central".to_string(),
        ..Default::default()
    }
}

fn spec(name: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.to_string(),
        services: vec![ServiceSpec {
            name: "main".to_string(),
            command: vec!["sleep".to_string(), "1000".to_string()],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn fields(e: &Error) -> Vec<String> {
    match e {
        Error::InvalidArgument(v) => v.iter().map(|f| f.field.clone()).collect(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

async fn list_all(
    svc: &DatacenterService,
    caller: &Caller,
    filter: ListFilterInput,
    page_size: i32,
) -> (Vec<String>, u64) {
    let mut ids = Vec::new();
    let mut token = String::new();
    let mut total;
    loop {
        let page = svc
            .list(caller, "", filter.clone(), page_size, &token)
            .await
            .unwrap();
        assert!(page.items.len() <= page_size as usize);
        total = page.total_size;
        ids.extend(page.items.into_iter().map(|d| d.id));
        match page.next_page_token {
            Some(t) => token = t,
            None => break,
        }
    }
    (ids, total)
}

async fn create_get_and_slugs(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let t1 = tenant("t1");
    let dc = svc.create(&t1, new_dc("Frankfurt 1 (Main)")).await.unwrap();
    assert!(dc.id.starts_with("dc_"));
    assert_eq!(dc.slug, "frankfurt-1-main");
    assert_eq!(dc.tenant_id, "t1");
    assert_eq!(dc.status, Status::Active);
    assert!(dc.revision > 0);
    assert_eq!(svc.get(&t1, &dc.id).await.unwrap(), dc);
    assert_eq!(
        svc.get_by_slug(&t1, "frankfurt-1-main", "")
            .await
            .unwrap()
            .id,
        dc.id
    );

    // Same slug in the same tenant: AlreadyExists; in another tenant: fine.
    let err = svc
        .create(&t1, new_dc("frankfurt 1 main"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::AlreadyExists(ref m) if m.contains("frankfurt-1-main")),
        "{err:?}"
    );
    let other = svc
        .create(&tenant("t2"), new_dc("Frankfurt 1 (Main)"))
        .await
        .unwrap();
    assert_eq!(other.slug, dc.slug);

    // Rename follows the slug, and a rename onto a taken slug is refused
    // (the case the Go original forgot).
    let second = svc.create(&t1, new_dc("Berlin")).await.unwrap();
    let rename = DatacenterPatch {
        name: Some("Frankfurt-1 Main".to_string()),
        ..Default::default()
    };
    let err = svc
        .update(&t1, &second.id, rename, Default::default())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::AlreadyExists(_)), "{err:?}");
    let renamed = svc
        .update(
            &t1,
            &second.id,
            DatacenterPatch {
                name: Some("Berlin Two".to_string()),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(renamed.slug, "berlin-two");
    assert!(renamed.revision > second.revision);
    // The old slug is free again.
    svc.create(&t1, new_dc("Berlin")).await.unwrap();

    let err = svc
        .get(&t1, "dc_00000000000000000000000000")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotFound(_)), "{err:?}");
    assert_eq!(
        fields(
            &svc.get(&t1, "agt_01h455vb4pex5vsknk084sn02q")
                .await
                .unwrap_err()
        ),
        ["id"]
    );
}

async fn tenancy(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let (a, bt) = (tenant("a"), tenant("b"));
    let mine = svc.create(&a, new_dc("mine")).await.unwrap();
    let theirs = svc.create(&bt, new_dc("theirs")).await.unwrap();
    let shared = svc.create(&admin(), new_dc("shared")).await.unwrap();
    assert_eq!(shared.tenant_id, "");
    let for_b = svc
        .create(
            &admin(),
            NewDatacenter {
                tenant_id: Some("b".into()),
                ..new_dc("made-for-b")
            },
        )
        .await
        .unwrap();
    assert_eq!(for_b.tenant_id, "b");

    // Another tenant's datacenter does not exist for `a`.
    for res in [
        svc.get(&a, &theirs.id).await,
        svc.delete(&a, &theirs.id).await,
        svc.set_status(&a, &theirs.id, Some(Status::Offline), "")
            .await,
        svc.update(
            &a,
            &theirs.id,
            DatacenterPatch {
                region: Some("x".into()),
                ..Default::default()
            },
            Default::default(),
        )
        .await,
    ] {
        assert!(matches!(res, Err(Error::NotFound(_))), "{res:?}");
    }
    assert!(matches!(
        svc.get_by_slug(&a, "theirs", "").await,
        Err(Error::NotFound(_))
    ));

    // Shared: readable, not writable.
    assert_eq!(svc.get(&a, &shared.id).await.unwrap().id, shared.id);
    assert_eq!(
        svc.get_by_slug(&a, "shared", "").await.unwrap().id,
        shared.id
    );
    for res in [
        svc.delete(&a, &shared.id).await,
        svc.set_status(&a, &shared.id, Some(Status::Offline), "")
            .await,
    ] {
        assert!(matches!(res, Err(Error::PermissionDenied(_))), "{res:?}");
    }

    // Lists: own + shared for a tenant, everything for admin and services.
    let (ids, total) = list_all(&svc, &a, Default::default(), 10).await;
    assert_eq!(total, 2);
    assert_eq!(
        ids.iter().collect::<HashSet<_>>(),
        [&mine.id, &shared.id].into_iter().collect()
    );
    let (ids, total) = list_all(&svc, &system_service(), Default::default(), 10).await;
    assert_eq!((ids.len(), total), (4, 4));
    // Admin filtering one tenant.
    let page = svc
        .list(&admin(), "b", Default::default(), 10, "")
        .await
        .unwrap();
    assert_eq!(page.total_size, 2);
    // A tenant may not list another tenant.
    let err = svc
        .list(&a, "b", Default::default(), 10, "")
        .await
        .unwrap_err();
    assert_eq!(fields(&err), ["tenant_id"]);

    // Tenants cannot create for others, nor shared ones.
    let err = svc
        .create(
            &a,
            NewDatacenter {
                tenant_id: Some("b".into()),
                ..new_dc("sneaky")
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let err = svc
        .create(&tenant(""), new_dc("no-tenant"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    // Only platform callers purge.
    let err = svc.purge(&a, &mine.id).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
}

async fn pagination_and_filters(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let mut created = Vec::new();
    for i in 0..57 {
        let mut labels = BTreeMap::new();
        labels.insert(
            "tier".to_string(),
            if i % 3 == 0 { "gold" } else { "silver" }.to_string(),
        );
        labels.insert(
            "team".to_string(),
            if i % 2 == 0 { "a" } else { "b" }.to_string(),
        );
        let dc = svc
            .create(
                &admin(),
                NewDatacenter {
                    tenant_id: Some(if i % 4 == 0 { "t1" } else { "t2" }.to_string()),
                    provider_name: if i % 5 == 0 { "docker" } else { "process" }.to_string(),
                    region: if i < 30 { "eu" } else { "us" }.to_string(),
                    labels,
                    ..new_dc(&format!("dc {i}"))
                },
            )
            .await
            .unwrap();
        created.push(dc);
    }
    for dc in created.iter().filter(|d| d.name.ends_with('7')) {
        svc.set_status(&admin(), &dc.id, Some(Status::Maintenance), "")
            .await
            .unwrap();
    }

    // Every id exactly once, in creation order.
    let (ids, total) = list_all(&svc, &admin(), Default::default(), 10).await;
    assert_eq!(total, 57);
    assert_eq!(
        ids,
        created.iter().map(|d| d.id.clone()).collect::<Vec<_>>()
    );

    let check = |filter: ListFilterInput,
                 pred: &dyn Fn(&ctrlplane_datacenter::model::Datacenter) -> bool| {
        let want: Vec<String> = created
            .iter()
            .filter(|d| pred(d))
            .map(|d| d.id.clone())
            .collect();
        (filter, want)
    };
    let cases = vec![
        check(
            ListFilterInput {
                provider_name: "docker".into(),
                ..Default::default()
            },
            &|d| d.provider_name == "docker",
        ),
        check(
            ListFilterInput {
                region: "us".into(),
                ..Default::default()
            },
            &|d| d.region == "us",
        ),
        check(
            ListFilterInput {
                label_selector: "tier=gold, team=a".into(),
                ..Default::default()
            },
            &|d| d.labels["tier"] == "gold" && d.labels["team"] == "a",
        ),
        check(
            ListFilterInput {
                status: Some(Status::Maintenance),
                ..Default::default()
            },
            &|d| d.name.ends_with('7'),
        ),
        check(
            ListFilterInput {
                label_selector: "tier=platinum".into(),
                ..Default::default()
            },
            &|_| false,
        ),
    ];
    for (filter, want) in cases {
        let (ids, total) = list_all(&svc, &admin(), filter.clone(), 4).await;
        assert_eq!(ids, want, "{filter:?}");
        assert_eq!(total, want.len() as u64, "{filter:?}");
    }

    // A token only works with the filters that produced it.
    let first = svc
        .list(&admin(), "", Default::default(), 5, "")
        .await
        .unwrap();
    let token = first.next_page_token.unwrap();
    let err = svc
        .list(
            &admin(),
            "",
            ListFilterInput {
                region: "us".into(),
                ..Default::default()
            },
            5,
            &token,
        )
        .await
        .unwrap_err();
    assert_eq!(fields(&err), ["page_token"]);
    let err = svc
        .list(&admin(), "", Default::default(), 5, "garbage!")
        .await
        .unwrap_err();
    assert_eq!(fields(&err), ["page_token"]);
    let err = svc
        .list(
            &admin(),
            "",
            ListFilterInput {
                label_selector: "novalue".into(),
                ..Default::default()
            },
            -1,
            "",
        )
        .await
        .unwrap_err();
    assert_eq!(fields(&err), ["page_size", "label_selector"]);

    // The token survives concurrent inserts: continuing after new rows
    // appear yields the rest once, then the new rows.
    let page1 = svc
        .list(&admin(), "", Default::default(), 50, "")
        .await
        .unwrap();
    let newer = svc.create(&admin(), new_dc("newer")).await.unwrap();
    let page2 = svc
        .list(
            &admin(),
            "",
            Default::default(),
            50,
            &page1.next_page_token.unwrap(),
        )
        .await
        .unwrap();
    let mut seen: Vec<String> = page1
        .items
        .iter()
        .chain(page2.items.iter())
        .map(|d| d.id.clone())
        .collect();
    assert_eq!(seen.pop().unwrap(), newer.id);
    assert_eq!(
        seen,
        created.iter().map(|d| d.id.clone()).collect::<Vec<_>>()
    );
    assert_eq!(page2.total_size, 58);
}

async fn update_masks(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let t = tenant("t");
    let mut labels = BTreeMap::new();
    labels.insert("a".to_string(), "1".to_string());
    let dc = svc
        .create(
            &t,
            NewDatacenter {
                labels,
                bootstrap_services: vec![spec("logs"), spec("metrics")],
                zone: "z1".into(),
                ..new_dc("masked")
            },
        )
        .await
        .unwrap();

    // Only masked fields change.
    let patch = DatacenterPatch {
        region: Some("us-west".into()),
        ..Default::default()
    };
    let after = svc
        .update(&t, &dc.id, patch, Default::default())
        .await
        .unwrap();
    assert_eq!(after.region, "us-west");
    assert_eq!(after.zone, "z1");
    assert_eq!(after.labels, dc.labels);
    assert_eq!(after.bootstrap_services.len(), 2);
    assert!(after.revision > dc.revision);

    // An explicit empty list under the mask clears it.
    let cleared = svc
        .update(
            &t,
            &dc.id,
            DatacenterPatch {
                bootstrap_services: Some(vec![]),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    assert!(cleared.bootstrap_services.is_empty());
    assert!(cleared.revision > after.revision);

    // Setting a field to what it is changes nothing and uses no revision.
    let same = svc
        .update(
            &t,
            &dc.id,
            DatacenterPatch {
                region: Some("us-west".into()),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(same.revision, cleared.revision);

    // Validation names every bad field and changes nothing.
    let mut bad_labels = BTreeMap::new();
    bad_labels.insert("bad key!".to_string(), "v".to_string());
    let err = svc
        .update(
            &t,
            &dc.id,
            DatacenterPatch {
                name: Some("".into()),
                provider_name: Some("Not A Label".into()),
                labels: Some(bad_labels),
                bootstrap_services: Some(vec![BootstrapServiceSpec {
                    name: "x".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap_err();
    let f = fields(&err);
    for want in [
        "datacenter.name",
        "datacenter.provider_name",
        "datacenter.labels[bad key!]",
        "datacenter.bootstrap_services[0].services",
    ] {
        assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
    }
    assert_eq!(svc.get(&t, &dc.id).await.unwrap(), same);

    // A deleting datacenter can no longer be updated.
    svc.delete(&t, &dc.id).await.unwrap();
    let err = svc
        .update(
            &t,
            &dc.id,
            DatacenterPatch {
                zone: Some("z2".into()),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
}

async fn status_transitions(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let t = tenant("t");
    let dc = svc.create(&t, new_dc("moving")).await.unwrap();
    let d = svc
        .set_status(&t, &dc.id, Some(Status::Draining), "rack swap")
        .await
        .unwrap();
    assert_eq!(d.status, Status::Draining);
    assert!(d.revision > dc.revision);
    // draining -> maintenance is not in the table.
    let err = svc
        .set_status(&t, &dc.id, Some(Status::Maintenance), "")
        .await
        .unwrap_err();
    match err {
        Error::FailedPrecondition(m) => assert!(m.contains("from draining to maintenance"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Same status: a no-op.
    let same = svc
        .set_status(&t, &dc.id, Some(Status::Draining), "")
        .await
        .unwrap();
    assert_eq!(same.revision, d.revision);
    // Deleting is reached only through DeleteDatacenter; unspecified is bad.
    assert_eq!(
        fields(
            &svc.set_status(&t, &dc.id, Some(Status::Deleting), "")
                .await
                .unwrap_err()
        ),
        ["status"]
    );
    assert_eq!(
        fields(&svc.set_status(&t, &dc.id, None, "").await.unwrap_err()),
        ["status"]
    );
    let off = svc
        .set_status(&t, &dc.id, Some(Status::Offline), "")
        .await
        .unwrap();
    assert_eq!(off.status, Status::Offline);
    // The event carries from, to and the reason.
    let (events, _) = svc.list_events(&t, &dc.id, 0, 10, "").await.unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EventKind::Created,
            EventKind::StatusChanged,
            EventKind::StatusChanged
        ]
    );
    assert_eq!(events[1].message, "active -> draining: rack swap");
    assert_eq!(events[1].actor, "user-of-t");
}

async fn delete_and_purge(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let t = tenant("t");
    let dc = svc.create(&t, new_dc("doomed")).await.unwrap();
    let err = svc.purge(&system_service(), &dc.id).await.unwrap_err();
    assert!(
        matches!(err, Error::FailedPrecondition(ref m) if m.contains("only a deleting")),
        "{err:?}"
    );

    let deleting = svc.delete(&t, &dc.id).await.unwrap();
    assert_eq!(deleting.status, Status::Deleting);
    // Deleting again is a no-op; moving out of deleting is refused.
    assert_eq!(
        svc.delete(&t, &dc.id).await.unwrap().revision,
        deleting.revision
    );
    let err = svc
        .set_status(&t, &dc.id, Some(Status::Active), "")
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    // Re-creating the slug while it is deleting: a clear error.
    let err = svc.create(&t, new_dc("Doomed")).await.unwrap_err();
    match err {
        Error::FailedPrecondition(m) => assert!(
            m.contains("still being deleted") && m.contains(&dc.id),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    svc.purge(&system_service(), &dc.id).await.unwrap();
    assert!(matches!(svc.get(&t, &dc.id).await, Err(Error::NotFound(_))));
    assert!(matches!(
        svc.purge(&admin(), &dc.id).await,
        Err(Error::NotFound(_))
    ));
    // Now the slug is free.
    let again = svc.create(&t, new_dc("Doomed")).await.unwrap();
    assert_eq!(again.slug, "doomed");
    // The change log keeps the whole story.
    let (events, _) = svc.list_events(&t, &dc.id, 0, 10, "").await.unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [EventKind::Created, EventKind::Deleted, EventKind::Purged]
    );
}

async fn change_log_and_watch(b: Backend) {
    let Some((svc, db, stop)) = service(b).await else {
        return;
    };
    let t = tenant("t");
    let first = svc.create(&t, new_dc("w1")).await.unwrap();
    let mut rx = svc.watch(&t, first.revision).await.unwrap();
    let other_tenant = svc
        .create(&tenant("other"), new_dc("hidden"))
        .await
        .unwrap();
    let second = svc.create(&t, new_dc("w2")).await.unwrap();
    svc.set_status(&t, &second.id, Some(Status::Offline), "")
        .await
        .unwrap();
    let shared = svc.create(&admin(), new_dc("shared")).await.unwrap();

    let mut got = Vec::new();
    for _ in 0..3 {
        let e = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("watch event")
            .unwrap()
            .unwrap();
        got.push((e.kind, e.datacenter.id.clone(), e.revision));
    }
    assert_eq!(
        got.iter()
            .map(|(k, id, _)| (*k, id.as_str()))
            .collect::<Vec<_>>(),
        [
            (EventKind::Created, second.id.as_str()),
            (EventKind::StatusChanged, second.id.as_str()),
            (EventKind::Created, shared.id.as_str()),
        ]
    );
    assert!(
        got.windows(2).all(|w| w[0].2 < w[1].2),
        "revisions ascend: {got:?}"
    );
    assert!(
        got.iter().all(|(_, id, _)| *id != other_tenant.id),
        "other tenant leaked"
    );

    // Ending the service ends the stream.
    stop.send(true).unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .unwrap();
    assert!(end.is_none());

    // After a "restart" (a new store over the same database) a watch resumes
    // from a revision and replays what followed, from the persisted log.
    let store = open_store(&db).await;
    let (_tx, rx2) = tokio::sync::watch::channel(false);
    let registry = common::registry(&store, &common::FakeClock::new());
    let restarted = DatacenterService::new(store, registry, rx2);
    let mut rx = restarted.watch(&admin(), first.revision).await.unwrap();
    let mut revs = Vec::new();
    for _ in 0..4 {
        let e = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        revs.push(e.revision);
    }
    let (all, _) = restarted
        .list_events(&admin(), "", first.revision, 100, "")
        .await
        .unwrap();
    assert_eq!(revs, all.iter().map(|e| e.revision).collect::<Vec<_>>());

    // Events list pages by revision.
    let (p1, tok) = restarted.list_events(&admin(), "", 0, 2, "").await.unwrap();
    let (p2, _) = restarted
        .list_events(&admin(), "", 0, 2, &tok.unwrap())
        .await
        .unwrap();
    assert!(p1[1].revision < p2[0].revision);
}

async fn concurrent_writes_get_distinct_ordered_revisions(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let mut tasks = Vec::new();
    for i in 0..16 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.create(&admin(), new_dc(&format!("concurrent {i}")))
                .await
                .unwrap()
        }));
    }
    let mut revs = Vec::new();
    for t in tasks {
        revs.push(t.await.unwrap().revision);
    }
    revs.sort_unstable();
    assert_eq!(revs, (1..=16).collect::<Vec<i64>>());
    let (events, _) = svc.list_events(&admin(), "", 0, 100, "").await.unwrap();
    assert_eq!(events.iter().map(|e| e.revision).collect::<Vec<_>>(), revs);
}

async fn create_validation_reports_every_field(b: Backend) {
    let Some((svc, _db, _stop)) = service(b).await else {
        return;
    };
    let mut labels = BTreeMap::new();
    labels.insert("ok".to_string(), "has space".to_string());
    let input = NewDatacenter {
        name: "   ".into(),
        provider_name: "".into(),
        region: "Bad Region".into(),
        location: Some(ctrlplane_proto::datacenter::v1::Location {
            latitude: 91.0,
            longitude: 0.0,
            country: "germany".into(),
            city: String::new(),
        }),
        capacity: Some(ctrlplane_proto::datacenter::v1::Capacity {
            max_instances: -1,
            ..Default::default()
        }),
        labels,
        bootstrap_services: vec![spec("dup"), spec("dup")],
        ..Default::default()
    };
    let err = svc.create(&admin(), input).await.unwrap_err();
    let f = fields(&err);
    for want in [
        "datacenter.name",
        "datacenter.provider_name",
        "datacenter.region",
        "datacenter.location.latitude",
        "datacenter.location.country",
        "datacenter.capacity.max_instances",
        "datacenter.labels[ok]",
        "datacenter.bootstrap_services[1].name",
    ] {
        assert!(f.iter().any(|x| x == want), "{want} missing from {f:?}");
    }
    // Nothing was written.
    let page = svc
        .list(&admin(), "", Default::default(), 10, "")
        .await
        .unwrap();
    assert_eq!(page.total_size, 0);
    assert_eq!(svc.store().current_revision().await.unwrap(), 0);
}

on_both_backends!(
    create_get_and_slugs,
    tenancy,
    pagination_and_filters,
    update_masks,
    status_transitions,
    delete_and_purge,
    change_log_and_watch,
    concurrent_writes_get_distinct_ordered_revisions,
    create_validation_reports_every_field,
);
