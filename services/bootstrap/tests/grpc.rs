//! The bootstrap service over a real socket (`ctrlplane_bootstrap::run`
//! next to a real datacenter server): auth, validation with field
//! violations, every read and write RPC, health, and graceful shutdown with
//! an open watch stream.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::service::snapshot_of;
use ctrlplane_proto::bootstrap::v1::{
    self as pb, BootstrapServiceSpec, DatacenterInfo,
    bootstrap_service_client::BootstrapServiceClient,
};
use ctrlplane_proto::pbjson_types;
use ctrlplane_proto::provider::v1::ServiceSpec;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN, ROLE_SERVICE};
use tonic::Code;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_types::StatusExt;

/// Sets the `authorization` header verbatim (or not at all).
#[derive(Clone)]
struct RawAuth(Option<String>);

impl Interceptor for RawAuth {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut()
                .insert("authorization", v.parse().unwrap());
        }
        Ok(req)
    }
}

type Client = BootstrapServiceClient<InterceptedService<Channel, RawAuth>>;

fn channel(s: &BootstrapServer) -> Channel {
    ctrlplane_runtime::client::channel(&s.addr.to_string()).unwrap()
}

fn client_with(s: &BootstrapServer, header: Option<String>) -> Client {
    BootstrapServiceClient::with_interceptor(channel(s), RawAuth(header))
}

fn client(s: &BootstrapServer, tenant: &str, roles: &[&str]) -> Client {
    let token = Authenticator::new(SECRET).mint(&Claims::new(
        "someone",
        tenant,
        roles.iter().map(|r| r.to_string()).collect(),
        Duration::from_secs(600),
    ));
    client_with(s, Some(format!("Bearer {token}")))
}

fn admin_client(s: &BootstrapServer) -> Client {
    client(s, "", &[ROLE_ADMIN])
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

fn has_fields(status: &tonic::Status, want: &[&str]) {
    let got = bad_fields(status);
    for w in want {
        assert!(
            got.iter()
                .any(|g| g == w || g.starts_with(&format!("{w}."))),
            "{w} missing from {got:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_and_validation() {
    let env = env().await;
    let _agent = fake_agent(&env, "fake", true).await;
    let server = serve_bootstrap(&env).await;
    let mut c = admin_client(&server);
    wait_serving(&server).await;

    // No token, a tenant's token, a garbage token.
    let err = client_with(&server, None)
        .list_hooks(pb::ListHooksRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = client_with(&server, Some("Bearer nope".into()))
        .list_hooks(pb::ListHooksRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let mut tenant = client(&server, "acme", &[]);
    let err = tenant
        .list_hooks(pb::ListHooksRequest {})
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = tenant
        .list_bootstrap_workloads(pb::ListBootstrapWorkloadsRequest {
            datacenter_id: ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    let (info, declared) = snapshot_of(&dc);
    let err = tenant
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(info),
            declared_services: declared,
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // Refused before any input is looked at.
    let err = tenant
        .reconcile(pb::ReconcileRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = tenant
        .collect_garbage(pb::CollectGarbageRequest {
            grace_period: Some(pbjson_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let err = tenant
        .register_hook(pb::RegisterHookRequest {
            timeout: Some(pbjson_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    // A service token is a platform caller.
    client(&server, "", &[ROLE_SERVICE])
        .list_hooks(pb::ListHooksRequest {})
        .await
        .unwrap();

    // Reconcile: no datacenter; then every field wrong at once.
    let err = c
        .reconcile(pb::ReconcileRequest::default())
        .await
        .unwrap_err();
    has_fields(&err, &["datacenter"]);
    let err = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(DatacenterInfo {
                id: "agt_01h455vb4pex5vsknk084sn02q".into(),
                provider_name: "Not A Label".into(),
                phase: 42,
                revision: -1,
                ..Default::default()
            }),
            declared_services: vec![BootstrapServiceSpec {
                name: "Bad Name".into(),
                services: vec![ServiceSpec {
                    name: "main".into(),
                    command: vec!["x".into()],
                    ..Default::default()
                }],
                depends_on: vec!["Bad Name".into()],
                ..Default::default()
            }],
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    has_fields(
        &err,
        &[
            "datacenter.id",
            "datacenter.provider_name",
            "datacenter.phase",
            "datacenter.revision",
            "declared_services[0].name",
            "declared_services[0].depends_on[0]",
        ],
    );

    // By id instead of a snapshot: not both, a valid id, an existing one.
    let err = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(snapshot_of(&dc).0),
            datacenter_id: dc.id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["datacenter_id"]);
    let err = c
        .reconcile(pb::ReconcileRequest {
            datacenter_id: "dc_bad".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["datacenter_id"]);
    let err = c
        .reconcile(pb::ReconcileRequest {
            datacenter_id: ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let plan = c
        .reconcile(pb::ReconcileRequest {
            datacenter_id: dc.id.clone(),
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plan.actions.len(), 1);
    assert_eq!(plan.actions[0].r#type, pb::ActionType::Provision as i32);

    // Reads with bad ids; unknown ids.
    let err = c
        .get_bootstrap_workload(pb::GetBootstrapWorkloadRequest { id: "dc_x".into() })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["id"]);
    let err = c
        .get_bootstrap_workload(pb::GetBootstrapWorkloadRequest {
            id: ctrlplane_core::id::new_id(ctrlplane_core::id::BOOTSTRAP_WORKLOAD),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = c
        .list_bootstrap_workloads(pb::ListBootstrapWorkloadsRequest {
            datacenter_id: "nope".into(),
            page_size: -1,
            page_token: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["datacenter_id", "page_size"]);
    let err = c
        .retry_bootstrap_workload(pb::RetryBootstrapWorkloadRequest { id: String::new() })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["id"]);
    let err = c
        .sync_status(pb::SyncStatusRequest {
            datacenter_id: "x".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["datacenter_id"]);
    let err = c
        .collect_garbage(pb::CollectGarbageRequest {
            grace_period: Some(pbjson_types::Duration {
                seconds: -5,
                nanos: 0,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["grace_period"]);
    let err = c
        .list_events(pb::ListEventsRequest {
            datacenter_id: String::new(),
            page_size: 5,
            page_token: "not a token".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["page_token"]);
    let err = c
        .watch_events(pb::WatchEventsRequest {
            datacenter_id: String::new(),
            since_sequence: -1,
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["since_sequence"]);

    // Hook registration.
    let err = c
        .register_hook(pb::RegisterHookRequest {
            name: "Bad Name".into(),
            endpoint: "127.0.0.1:9000".into(),
            timeout: Some(pbjson_types::Duration {
                seconds: 0,
                nanos: 0,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["name", "endpoint", "timeout"]);
    let err = c
        .register_hook(pb::RegisterHookRequest {
            name: "inv".into(),
            endpoint: "http://127.0.0.1:9000".into(),
            timeout: Some(pbjson_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["timeout"]);
    let err = c
        .unregister_hook(pb::UnregisterHookRequest { name: "inv".into() })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let hook = c
        .register_hook(pb::RegisterHookRequest {
            name: "inv".into(),
            endpoint: "http://127.0.0.1:9000".into(),
            timeout: None,
        })
        .await
        .unwrap()
        .into_inner()
        .hook
        .unwrap();
    assert_eq!(hook.kind, pb::HookKind::Remote as i32);
    assert_eq!(hook.timeout.unwrap().seconds, 5);
    let hooks = c
        .list_hooks(pb::ListHooksRequest {})
        .await
        .unwrap()
        .into_inner()
        .hooks;
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].endpoint, "http://127.0.0.1:9000");
    c.unregister_hook(pb::UnregisterHookRequest { name: "inv".into() })
        .await
        .unwrap();
    assert!(
        c.list_hooks(pb::ListHooksRequest {})
            .await
            .unwrap()
            .into_inner()
            .hooks
            .is_empty()
    );
    server.stop().await;
}

async fn wait_serving(server: &BootstrapServer) {
    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
    };
    eventually(
        "bootstrap health SERVING",
        Duration::from_secs(20),
        || async {
            let mut h = HealthClient::new(channel(server));
            let r = h
                .check(HealthCheckRequest {
                    service: "ctrlplane.bootstrap.v1.BootstrapService".into(),
                })
                .await
                .ok()?;
            (r.into_inner().status == ServingStatus::Serving as i32).then_some(())
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_over_a_socket() {
    let env = env().await;
    let agent = fake_agent(&env, "fake", true).await;
    let server = serve_bootstrap(&env).await;
    wait_serving(&server).await;
    let mut c = admin_client(&server);
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i"), spec("b", "i")]).await;
    let (info, declared) = snapshot_of(&dc);

    // Dry run: the plan, nothing done.
    let plan = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(info.clone()),
            declared_services: declared.clone(),
            dry_run: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut planned: Vec<(String, i32)> = plan
        .actions
        .iter()
        .map(|a| (a.name.clone(), a.r#type))
        .collect();
    planned.sort();
    let provision = pb::ActionType::Provision as i32;
    assert_eq!(
        planned,
        [("a".to_string(), provision), ("b".to_string(), provision)]
    );
    assert!(plan.workloads.is_empty());
    assert!(agent.calls().is_empty());

    // For real.
    let done = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(info.clone()),
            declared_services: declared.clone(),
            dry_run: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!done.stale && !done.paused && !done.purged);
    assert!(
        done.actions
            .iter()
            .all(|a| a.r#type == provision && a.error.is_empty()),
        "{:?}",
        done.actions
    );
    assert_eq!(done.workloads.len(), 2);
    assert!(
        done.workloads
            .iter()
            .all(|w| w.state == pb::BootstrapState::Running as i32 && w.source == "declared")
    );
    // The same snapshot again: nothing to do.
    let again = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(info.clone()),
            declared_services: declared.clone(),
            dry_run: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        again
            .actions
            .iter()
            .all(|a| a.r#type == pb::ActionType::Noop as i32)
    );
    assert_eq!(agent.count("provision:"), 2);

    // List (paged) and Get.
    let first = c
        .list_bootstrap_workloads(pb::ListBootstrapWorkloadsRequest {
            datacenter_id: dc.id.clone(),
            page_size: 1,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.workloads.len(), 1);
    assert!(!first.next_page_token.is_empty());
    let second = c
        .list_bootstrap_workloads(pb::ListBootstrapWorkloadsRequest {
            datacenter_id: dc.id.clone(),
            page_size: 1,
            page_token: first.next_page_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.workloads.len(), 1);
    assert!(second.next_page_token.is_empty());
    assert_ne!(first.workloads[0].id, second.workloads[0].id);
    // A token of another datacenter is refused.
    let err = c
        .list_bootstrap_workloads(pb::ListBootstrapWorkloadsRequest {
            datacenter_id: ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER),
            page_size: 1,
            page_token: first.next_page_token.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_fields(&err), ["page_token"]);
    let got = c
        .get_bootstrap_workload(pb::GetBootstrapWorkloadRequest {
            id: first.workloads[0].id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .workload
        .unwrap();
    assert_eq!(got, first.workloads[0]);
    assert_eq!(got.datacenter_id, dc.id);
    assert_eq!(got.provider_ref, format!("fake/{}", got.id));
    assert_eq!(got.endpoints.len(), 1);
    assert!(got.create_time.is_some() && got.update_time.is_some());

    // Observe.
    let synced = c
        .sync_status(pb::SyncStatusRequest {
            datacenter_id: dc.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(synced.results.len(), 2);
    assert!(
        synced
            .results
            .iter()
            .all(|r| !r.drifted && r.error.is_empty() && r.status.is_some())
    );
    let sampled = c
        .collect_resources(pb::CollectResourcesRequest {
            datacenter_id: dc.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((sampled.samples, sampled.errors.len()), (2, 0));
    let got = c
        .get_bootstrap_workload(pb::GetBootstrapWorkloadRequest { id: got.id.clone() })
        .await
        .unwrap()
        .into_inner()
        .workload
        .unwrap();
    assert_eq!(got.usage.unwrap().cpu_percent, 12.5);
    let gc = c
        .collect_garbage(pb::CollectGarbageRequest { grace_period: None })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            gc.rows_retired,
            gc.workloads_deprovisioned,
            gc.workloads_examined
        ),
        (0, 0, 2)
    );
    assert!(gc.errors.is_empty(), "{:?}", gc.errors);
    let retried = c
        .retry_bootstrap_workload(pb::RetryBootstrapWorkloadRequest { id: got.id.clone() })
        .await
        .unwrap()
        .into_inner()
        .workload
        .unwrap();
    assert_eq!(retried.state, pb::BootstrapState::Running as i32);

    // Events: listed, then watched from the first one on.
    let listed = c
        .list_events(pb::ListEventsRequest {
            datacenter_id: dc.id.clone(),
            page_size: 0,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.events.len(), 4, "{:?}", listed.events);
    let mut stream = c
        .watch_events(pb::WatchEventsRequest {
            datacenter_id: dc.id.clone(),
            since_sequence: listed.events[0].sequence,
        })
        .await
        .unwrap()
        .into_inner();
    for want in &listed.events[1..] {
        let got = tokio::time::timeout(Duration::from_secs(20), stream.message())
            .await
            .expect("event in time")
            .unwrap()
            .unwrap()
            .event
            .unwrap();
        assert_eq!(&got, want);
    }
    // A change arrives on the open stream.
    let mut dcs = env.dcs.clone();
    dcs.delete_datacenter(ctrlplane_proto::datacenter::v1::DeleteDatacenterRequest {
        id: dc.id.clone(),
    })
    .await
    .unwrap();
    let purged = c
        .reconcile(pb::ReconcileRequest {
            datacenter: Some(snapshot_of(&get_dc(&env, &dc.id).await.unwrap()).0),
            declared_services: Vec::new(),
            dry_run: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(purged.purged, "{purged:?}");
    assert!(purged.workloads.is_empty());
    let got = tokio::time::timeout(Duration::from_secs(20), stream.message())
        .await
        .expect("event in time")
        .unwrap()
        .unwrap()
        .event
        .unwrap();
    assert_eq!(got.r#type, "retiring");

    // Graceful shutdown with the watch still open.
    tokio::time::timeout(Duration::from_secs(30), server.stop())
        .await
        .expect("shutdown within its grace");
}
