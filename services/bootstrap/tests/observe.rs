//! Observing running workloads: drift (SyncStatus), resource samples
//! (CollectResources), and RetryBootstrapWorkload.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::error::Error;
use ctrlplane_bootstrap::model::State;
use ctrlplane_bootstrap::plan::Kind;
use ctrlplane_bootstrap::service::ServiceConfig;
use ctrlplane_proto::provider::v1 as pb;

async fn drift_is_detected_and_repaired(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(
        &env,
        "dc",
        "fake",
        vec![spec("gone", "i"), spec("broken", "i"), spec("fine", "i")],
    )
    .await;
    reconcile(&env, &dc.id).await;
    let gone = row(&env, &dc.id, "gone").await;
    let broken = row(&env, &dc.id, "broken").await;
    let fine = row(&env, &dc.id, "fine").await;

    // Nothing drifted yet.
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert_eq!(results.len(), 3);
    assert!(results.iter().all(|r| !r.drifted && r.error.is_none()));
    assert!(
        results
            .iter()
            .all(|r| r.status.as_ref().unwrap().state == pb::InstanceState::Running as i32)
    );

    // One workload vanishes at the agent, another fails there.
    {
        let mut s = agent.state.lock().unwrap();
        s.instances.remove(&gone.id);
        s.instances.get_mut(&broken.id).unwrap().failed = true;
    }
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    let mut drifted: Vec<&str> = results
        .iter()
        .filter(|r| r.drifted)
        .map(|r| r.workload.name.as_str())
        .collect();
    drifted.sort();
    assert_eq!(drifted, ["broken", "gone"]);
    let g = row(&env, &dc.id, "gone").await;
    assert_eq!(g.state, State::Failed);
    assert!(
        g.last_error.starts_with("drift:") && g.last_error.contains("vanished"),
        "{}",
        g.last_error
    );
    let b = row(&env, &dc.id, "broken").await;
    assert_eq!(b.state, State::Failed);
    assert!(
        b.last_error.starts_with("drift:") && b.last_error.contains("crashed"),
        "{}",
        b.last_error
    );
    assert_eq!(row(&env, &dc.id, "fine").await.state, State::Running);
    let mut drift_events: Vec<String> = events(&env, Some(&dc.id))
        .await
        .into_iter()
        .filter(|e| e.kind == "drift")
        .map(|e| e.name)
        .collect();
    drift_events.sort();
    assert_eq!(drift_events, ["broken", "gone"]);

    // The next reconcile repairs both, keeping their instance ids, and
    // leaves the healthy one alone. (No clock advance: drift is due now.)
    let out = reconcile(&env, &dc.id).await;
    for name in ["gone", "broken"] {
        let a = out.actions.iter().find(|a| a.action.name == name).unwrap();
        assert_eq!(a.action.kind, Kind::Provision, "{a:?}");
        assert!(a.error.is_none(), "{a:?}");
        assert!(a.action.reason.contains("repair"), "{a:?}");
    }
    let by_name = |n: &str| out.actions.iter().find(|a| a.action.name == n).unwrap();
    assert_eq!(by_name("fine").action.kind, Kind::Noop);
    for (before, name) in [(&gone, "gone"), (&broken, "broken"), (&fine, "fine")] {
        let w = row(&env, &dc.id, name).await;
        assert_eq!(
            (w.id.as_str(), w.state),
            (before.id.as_str(), State::Running)
        );
        // A repaired drift keeps its count until a sync sees it healthy.
        let want = if name == "fine" { 0 } else { 1 };
        assert_eq!((w.attempts, w.last_error.as_str()), (want, ""), "{name}");
    }
    let instances = agent.instances();
    assert_eq!(instances.len(), 3);
    assert!(instances.values().all(|i| !i.failed), "{instances:?}");
    // Converged: a sync finds nothing more, and the drift counts start over.
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert!(results.iter().all(|r| !r.drifted), "{results:?}");
    for name in ["gone", "broken", "fine"] {
        assert_eq!(row(&env, &dc.id, name).await.attempts, 0, "{name}");
    }

    // A workload that keeps crashing is not reinstalled on every sync:
    // consecutive drifts back off (the first is repaired at once).
    let mut waits = Vec::new();
    for _ in 0..3 {
        agent
            .state
            .lock()
            .unwrap()
            .instances
            .get_mut(&broken.id)
            .unwrap()
            .failed = true;
        env.svc.sync_status(&admin(), &dc.id).await.unwrap();
        let w = row(&env, &dc.id, "broken").await;
        let wait = w.next_attempt_time.unwrap() - env.clock.now();
        waits.push(wait.num_milliseconds());
        env.clock
            .advance(wait.to_std().unwrap_or_default() + std::time::Duration::from_millis(1));
        reconcile(&env, &dc.id).await;
        assert_eq!(row(&env, &dc.id, "broken").await.state, State::Running);
    }
    assert!(
        waits[0] <= 0 && waits[1] > 0 && waits[2] > waits[1],
        "{waits:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_reports_agent_errors_per_row_without_drift() {
    let env = env().await;
    let _agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    // The only agent of the provider is revoked: nothing to ask.
    let agents = env
        .registry
        .clone()
        .list_agents(ctrlplane_proto::agent::v1::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents;
    env.registry
        .clone()
        .revoke_agent(ctrlplane_proto::agent::v1::RevokeAgentRequest {
            id: agents[0].id.clone(),
        })
        .await
        .unwrap();
    let results = env.svc.sync_status(&admin(), &dc.id).await.unwrap();
    assert_eq!(results.len(), 1);
    assert!(!results[0].drifted);
    assert!(results[0].error.is_some());
    assert_eq!(row(&env, &dc.id, "a").await.state, State::Running);
    // Bad input.
    assert!(matches!(
        env.svc.sync_status(&admin(), "nope").await,
        Err(Error::InvalidArgument(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resource_samples_are_recorded_and_pruned() {
    // Long retention: every sample is kept.
    let env = env().await;
    let _agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i"), spec("b", "i")]).await;
    reconcile(&env, &dc.id).await;
    for _ in 0..3 {
        let (samples, errors) = env.svc.collect_resources(&admin(), "").await.unwrap();
        assert_eq!((samples, errors.len()), (2, 0), "{errors:?}");
    }
    for name in ["a", "b"] {
        let w = row(&env, &dc.id, name).await;
        assert_eq!(env.store.sample_count(&w.id).await.unwrap(), 3);
        let usage = w.usage.expect("latest usage on the workload");
        assert_eq!((usage.cpu_percent, usage.memory_bytes), (12.5, 1 << 20));
    }
    // One datacenter only; bad ids are refused.
    let (samples, _) = env.svc.collect_resources(&admin(), &dc.id).await.unwrap();
    assert_eq!(samples, 2);
    assert!(matches!(
        env.svc.collect_resources(&admin(), "dc_bad").await,
        Err(Error::InvalidArgument(_))
    ));
    // A retired row's samples go with it.
    let a = row(&env, &dc.id, "a").await;
    set_specs(&env, &dc.id, vec![spec("b", "i")]).await;
    reconcile(&env, &dc.id).await;
    assert_eq!(env.store.sample_count(&a.id).await.unwrap(), 0);

    // Tiny retention: only the newest sample survives.
    let env = env_with(Options {
        service: ServiceConfig {
            sample_retention: Duration::from_micros(1),
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let _agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    let w = row(&env, &dc.id, "a").await;
    for _ in 0..3 {
        // Samples are stamped with microsecond precision: make sure the
        // next one is stamped later.
        let before = ctrlplane_bootstrap::store::now();
        while ctrlplane_bootstrap::store::now() <= before + chrono::Duration::microseconds(2) {
            tokio::task::yield_now().await;
        }
        let (samples, _) = env.svc.collect_resources(&admin(), "").await.unwrap();
        assert_eq!(samples, 1);
        assert_eq!(env.store.sample_count(&w.id).await.unwrap(), 1);
    }
    assert!(row(&env, &dc.id, "a").await.usage.is_some());
}

async fn retry_clears_the_backoff_and_acts_now(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    agent.state.lock().unwrap().fail_provisions = 2;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    reconcile(&env, &dc.id).await;
    let w = row(&env, &dc.id, "a").await;
    assert_eq!((w.state, w.attempts), (State::Failed, 1));
    assert!(w.next_attempt_time.unwrap() > env.clock.now());
    assert_eq!(agent.count("provision:"), 1, "backing off");

    // Retry: tried at once (and fails again: attempts grow, new backoff).
    let after = env.svc.retry(&admin(), &w.id).await.unwrap();
    assert_eq!((after.state, after.attempts), (State::Failed, 2));
    assert_eq!(agent.count("provision:"), 2);
    // Retry again: succeeds, without the clock moving.
    let after = env.svc.retry(&admin(), &w.id).await.unwrap();
    assert_eq!(after.id, w.id);
    assert_eq!(
        (after.state, after.attempts, after.next_attempt_time),
        (State::Running, 0, None)
    );
    assert_eq!(agent.count("provision:"), 3);
    let kinds: Vec<String> = events(&env, Some(&dc.id))
        .await
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "provisioning",
            "failed",
            "retry",
            "provisioning",
            "failed",
            "retry",
            "provisioning",
            "provisioned"
        ]
    );
    // A running row: retry just reconciles (nothing to do).
    let again = env.svc.retry(&admin(), &w.id).await.unwrap();
    assert_eq!(again.state, State::Running);
    assert_eq!(agent.count("provision:"), 3);
    // Unknown and malformed ids.
    let unknown = ctrlplane_core::id::new_id(ctrlplane_core::id::BOOTSTRAP_WORKLOAD);
    assert!(matches!(
        env.svc.retry(&admin(), &unknown).await,
        Err(Error::NotFound(_))
    ));
    assert!(matches!(
        env.svc.retry(&admin(), "dc_123").await,
        Err(Error::InvalidArgument(_))
    ));
}

on_both_backends!(
    drift_is_detected_and_repaired,
    retry_clears_the_backoff_and_acts_now,
);
