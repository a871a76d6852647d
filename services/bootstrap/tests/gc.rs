//! Garbage collection: unowned backend workloads past the grace period,
//! the per-agent cursor, and rows whose datacenter is gone.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::model::State;
use ctrlplane_bootstrap::service::ServiceConfig;
use ctrlplane_proto::datacenter::v1 as dcpb;

const OURS: (&str, &str) = ("ctrlplane.io/managed-by", "bootstrap");
const MIN: Duration = Duration::from_secs(60);

async fn unowned_workloads_past_the_grace_period_are_removed(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    let owned = row(&env, &dc.id, "a").await;
    // The owned workload is old too: only its row protects it.
    agent
        .state
        .lock()
        .unwrap()
        .instances
        .get_mut(&owned.id)
        .unwrap()
        .created_at -= chrono::Duration::hours(2);
    let dc_label = ("ctrlplane.io/datacenter", dc.id.as_str());
    let svc_label = ("ctrlplane.io/bootstrap-service", "ghost");
    agent.plant("bws_old", &[OURS, dc_label, svc_label], 20 * MIN);
    agent.plant("bws_young", &[OURS, dc_label], MIN);
    agent.plant(
        "bws_foreign",
        &[("ctrlplane.io/managed-by", "someone-else")],
        60 * MIN,
    );
    agent.plant("bws_unlabelled", &[], 60 * MIN);

    // Default grace (15 minutes).
    let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.workloads_examined, 5);
    assert_eq!(report.workloads_deprovisioned, 1);
    assert_eq!(report.rows_retired, 0);
    let left: Vec<String> = agent.instances().into_keys().collect();
    assert_eq!(
        left,
        [
            owned.id.clone(),
            "bws_foreign".into(),
            "bws_unlabelled".into(),
            "bws_young".into()
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
    assert_eq!(row(&env, &dc.id, "a").await.state, State::Running);
    let gc: Vec<_> = events(&env, Some(&dc.id))
        .await
        .into_iter()
        .filter(|e| e.kind == "gc_deprovisioned")
        .collect();
    assert_eq!(gc.len(), 1, "{gc:?}");
    assert_eq!(gc[0].name, "ghost");
    assert!(gc[0].message.contains("bws_old"), "{}", gc[0].message);

    // A shorter grace given with the call reaches the young one; the
    // foreign and unlabelled ones are never ours.
    let report = env
        .svc
        .collect_garbage(&admin(), Some(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(report.workloads_deprovisioned, 1, "{report:?}");
    assert!(!agent.instances().contains_key("bws_young"));
    assert!(agent.instances().contains_key("bws_foreign"));
    assert!(agent.instances().contains_key("bws_unlabelled"));
    assert!(agent.instances().contains_key(&owned.id));
    assert_eq!(agent.count("deprovision:"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cursor_reaches_every_object_eventually() {
    let env = env_with(Options {
        service: ServiceConfig {
            gc_batch: 2,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let agent = fake_agent(&env, "fake", true).await;
    for i in 0..7 {
        // Every other one is someone else's: examined, never removed.
        if i % 2 == 0 {
            agent.plant(&format!("bws_{i}"), &[OURS], 30 * MIN);
        } else {
            agent.plant(&format!("bws_{i}"), &[], 30 * MIN);
        }
    }
    let mut runs = 0;
    let mut removed = 0;
    while agent.instances().len() > 3 {
        runs += 1;
        assert!(runs <= 8, "GC never got to every object");
        let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert!(
            report.workloads_examined <= 2,
            "bounded per run: {report:?}"
        );
        removed += report.workloads_deprovisioned;
    }
    assert_eq!(removed, 4);
    assert_eq!(runs, 4, "7 objects, 2 per run");
    assert_eq!(agent.instances().len(), 3);
    // The cursor wrapped around: the next run starts from the beginning.
    let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
    assert_eq!(report.workloads_examined, 2);
}

async fn rows_of_a_vanished_datacenter_are_retired(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i"), spec("b", "i")]).await;
    let keep = create_dc(&env, "keep", "fake", vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    reconcile(&env, &keep.id).await;
    assert_eq!(agent.instances().len(), 3);

    // The datacenter is purged behind bootstrap's back while its rows
    // still exist.
    let mut dcs = env.dcs.clone();
    dcs.delete_datacenter(dcpb::DeleteDatacenterRequest { id: dc.id.clone() })
        .await
        .unwrap();
    dcs.purge_datacenter(dcpb::PurgeDatacenterRequest { id: dc.id.clone() })
        .await
        .unwrap();
    assert!(get_dc(&env, &dc.id).await.is_none());

    // One deprovision fails: the other row is retired anyway, the failed
    // one on the next run.
    agent.state.lock().unwrap().fail_deprovisions = 1;
    let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
    assert_eq!(report.rows_retired, 1, "{report:?}");
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(
        report.errors[0].contains("injected deprovision failure"),
        "{:?}",
        report.errors
    );
    let stuck = rows(&env, &dc.id).await;
    assert_eq!(stuck.len(), 1);
    assert!(stuck[0].retire);
    assert_eq!(stuck[0].state, State::Failed);

    let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
    assert_eq!(report.rows_retired, 1, "{report:?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert!(rows(&env, &dc.id).await.is_empty());
    // Only the other datacenter's workload is left, untouched.
    let left: Vec<String> = agent.instances().into_keys().collect();
    assert_eq!(left, [row(&env, &keep.id, "a").await.id]);
    let retired = events(&env, Some(&dc.id))
        .await
        .into_iter()
        .filter(|e| e.kind == "retired")
        .count();
    assert_eq!(retired, 2);

    // Nothing left to do.
    let report = env.svc.collect_garbage(&admin(), None).await.unwrap();
    assert_eq!(
        (report.rows_retired, report.workloads_deprovisioned),
        (0, 0)
    );
    assert!(report.errors.is_empty());
}

on_both_backends!(
    unowned_workloads_past_the_grace_period_are_removed,
    rows_of_a_vanished_datacenter_are_retired,
);
