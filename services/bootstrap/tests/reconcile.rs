//! Reconcile scenarios against a fake agent (call counters, failure
//! injection) behind the real datacenter service and registry; the
//! store-heavy ones on SQLite and on Postgres.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::hooks::{RuleHook, Selector};
use ctrlplane_bootstrap::model::State;
use ctrlplane_bootstrap::plan::Kind;
use ctrlplane_proto::datacenter::v1::DatacenterStatus;

fn names(rows: &[(String, String)]) -> Vec<(&str, &str)> {
    rows.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect()
}

async fn declared_services_install_once(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(
        &env,
        "dc one",
        "fake",
        vec![spec("logs", "l:1"), spec("metrics", "m:1")],
    )
    .await;
    for _ in 0..3 {
        reconcile(&env, &dc.id).await;
    }
    assert_eq!(
        names(&states(&env, &dc.id).await),
        [("logs", "running"), ("metrics", "running")]
    );
    assert_eq!(
        agent.count("provision:"),
        2,
        "three reconciles, one provision each: {:?}",
        agent.calls()
    );
    let rows = env.store.workloads(&dc.id).await.unwrap();
    for w in &rows {
        let inst = &agent.instances()[&w.id];
        assert_eq!(inst.request.labels["ctrlplane.io/managed-by"], "bootstrap");
        assert_eq!(inst.request.labels["ctrlplane.io/datacenter"], dc.id);
        assert_eq!(w.provider_ref, format!("fake/{}", w.id));
        assert_eq!(w.endpoints.len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_contribute_and_declared_wins() {
    let rule = |name: &str, provider: &str, specs| RuleHook {
        name: name.into(),
        selector: Selector {
            provider: provider.into(),
            ..Default::default()
        },
        services: specs,
    };
    let env = env_with(Options {
        rules: vec![
            rule(
                "certs",
                "fake",
                vec![spec("cert-manager", "cm:1"), spec("logs", "from-hook")],
            ),
            rule("k8s-only", "kubernetes", vec![spec("k8s-thing", "k:1")]),
        ],
        ..Default::default()
    })
    .await;
    let agent = fake_agent(&env, "fake", true).await;
    // Hook only.
    let only_hook = create_dc(&env, "hook only", "fake", vec![]).await;
    let out = reconcile(&env, &only_hook.id).await;
    assert_eq!(
        names(&states(&env, &only_hook.id).await),
        [("cert-manager", "running"), ("logs", "running")]
    );
    assert!(
        out.actions.iter().all(|a| a.action.source == "certs"),
        "{:?}",
        out.actions
    );
    // Declared + hook, same name: declared wins, and the plan says so.
    let both = create_dc(&env, "both", "fake", vec![spec("logs", "declared")]).await;
    let out = reconcile(&env, &both.id).await;
    let rows = env.store.workloads(&both.id).await.unwrap();
    let logs = rows.iter().find(|w| w.name == "logs").unwrap();
    assert_eq!(
        (logs.source.as_str(), logs.spec.services[0].image.as_str()),
        ("declared", "declared")
    );
    assert!(
        out.notes
            .iter()
            .any(|n| n.name == "logs" && n.message.contains("declared wins")),
        "{:?}",
        out.notes
    );
    // The kubernetes-only rule never touched these fake-provider datacenters.
    assert!(
        agent
            .instances()
            .values()
            .all(|i| i.request.name != "k8s-thing")
    );
}

async fn removed_specs_are_retired(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i"), spec("b", "i")]).await;
    reconcile(&env, &dc.id).await;
    let b = env
        .store
        .workloads(&dc.id)
        .await
        .unwrap()
        .into_iter()
        .find(|w| w.name == "b")
        .unwrap();
    set_specs(&env, &dc.id, vec![spec("a", "i")]).await;
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions
            .iter()
            .any(|a| a.action.name == "b" && a.action.kind == Kind::Retire)
    );
    assert_eq!(names(&states(&env, &dc.id).await), [("a", "running")]);
    assert!(!agent.instances().contains_key(&b.id));
    assert_eq!(agent.count("deprovision:"), 1);
}

async fn failures_record_attempts_back_off_then_succeed(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    agent.state.lock().unwrap().fail_provisions = 3;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;

    let mut delays = Vec::new();
    for attempt in 1..=3 {
        let out = reconcile(&env, &dc.id).await;
        assert!(
            out.actions[0]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("injected"),
            "{:?}",
            out.actions
        );
        let w = &env.store.workloads(&dc.id).await.unwrap()[0];
        assert_eq!((w.state, w.attempts), (State::Failed, attempt));
        assert!(
            w.last_error.contains("injected provision failure"),
            "{}",
            w.last_error
        );
        let wait = w.next_attempt_time.unwrap() - env.clock.now();
        delays.push(wait);
        // Before the backoff elapses nothing is tried.
        let out = reconcile(&env, &dc.id).await;
        assert_eq!(out.actions[0].action.kind, Kind::Skip);
        assert_eq!(agent.count("provision:"), attempt as usize);
        env.clock
            .advance(wait.to_std().unwrap() + Duration::from_millis(1));
    }
    // Exponential growth (1s, 2s, 4s with jitter in [0.5, 1)).
    let secs: Vec<f64> = delays
        .iter()
        .map(|d| d.num_milliseconds() as f64 / 1000.0)
        .collect();
    assert!(
        (0.5..1.0).contains(&secs[0])
            && (1.0..2.0).contains(&secs[1])
            && (2.0..4.0).contains(&secs[2]),
        "{secs:?}"
    );
    reconcile(&env, &dc.id).await;
    let w = &env.store.workloads(&dc.id).await.unwrap()[0];
    assert_eq!(
        (w.state, w.attempts, w.last_error.as_str()),
        (State::Running, 0, "")
    );
    assert_eq!(agent.instances().len(), 1);
}

async fn a_crash_after_the_agent_call_recovers_without_duplicates(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    agent.state.lock().unwrap().hang_provisions = true;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    // The reconcile task dies after the agent created the instance but
    // before the row was updated.
    let task = {
        let svc = env.svc.clone();
        let dcs = env.dcs.clone();
        let id = dc.id.clone();
        tokio::spawn(async move {
            let d = dcs
                .clone()
                .get_datacenter(ctrlplane_proto::datacenter::v1::GetDatacenterRequest { id })
                .await
                .unwrap()
                .into_inner()
                .datacenter
                .unwrap();
            let (info, declared) = ctrlplane_bootstrap::service::snapshot_of(&d);
            svc.reconcile(&admin(), &info, &declared, false).await
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while agent.instances().is_empty() {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let _ = task.await;
    let w = &env.store.workloads(&dc.id).await.unwrap()[0];
    assert_eq!(w.state, State::Provisioning);
    agent.state.lock().unwrap().hang_provisions = false;

    // Once the row's lease expires the interrupted install is retried. (The
    // datacenter lease of the dead task belongs to this same replica, which
    // takes it over; another replica would wait for it to expire.)
    env.clock.advance(Duration::from_secs(61));
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions
            .iter()
            .any(|a| a.action.kind == Kind::Provision && a.action.reason.contains("interrupted")),
        "{:?}",
        out.actions
    );
    let rows = env.store.workloads(&dc.id).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, w.id, "same instance id");
    assert_eq!(rows[0].state, State::Running);
    assert_eq!(agent.instances().len(), 1, "no duplicate at the agent");
    assert_eq!(agent.count("provision:"), 2);
}

async fn image_changes_deploy_in_place_and_structure_changes_replace_without_a_gap(
    backend: Backend,
) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i:1")]).await;
    reconcile(&env, &dc.id).await;
    let first = env.store.workloads(&dc.id).await.unwrap()[0].clone();

    set_specs(&env, &dc.id, vec![spec("a", "i:2")]).await;
    let out = reconcile(&env, &dc.id).await;
    assert_eq!(out.actions[0].action.kind, Kind::Update);
    let rows = env.store.workloads(&dc.id).await.unwrap();
    assert_eq!((rows.len(), rows[0].id.as_str()), (1, first.id.as_str()));
    assert_eq!(
        agent.instances()[&first.id].request.services[0].image,
        "i:2"
    );
    assert_eq!((agent.count("provision:"), agent.count("deploy:")), (1, 1));

    let mut structural = spec("a", "i:2");
    structural.services[0].command = vec!["other".into()];
    set_specs(&env, &dc.id, vec![structural]).await;
    reconcile(&env, &dc.id).await;
    let rows = env.store.workloads(&dc.id).await.unwrap();
    assert_eq!(rows.len(), 1);
    let second = &rows[0];
    assert_ne!(second.id, first.id);
    assert_eq!(second.state, State::Running);
    // New first, then the old one retired: never neither.
    let calls = agent.calls();
    let new_at = calls
        .iter()
        .position(|c| c == &format!("provision:{}", second.id))
        .unwrap();
    let old_gone = calls
        .iter()
        .position(|c| c == &format!("deprovision:{}", first.id))
        .unwrap();
    assert!(new_at < old_gone, "{calls:?}");
    assert_eq!(agent.instances().keys().collect::<Vec<_>>(), [&second.id]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependency_chains_converge_in_order() {
    let env = env().await;
    let agent = fake_agent(&env, "fake", true).await;
    let mut b = spec("b", "i");
    b.depends_on = vec!["a".into()];
    let mut c = spec("c", "i");
    c.depends_on = vec!["b".into()];
    let dc = create_dc(&env, "dc", "fake", vec![c, b, spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    assert_eq!(names(&states(&env, &dc.id).await).len(), 3);
    assert!(
        states(&env, &dc.id)
            .await
            .iter()
            .all(|(_, s)| s == "running")
    );
    let rows = env.store.workloads(&dc.id).await.unwrap();
    let id = |n: &str| rows.iter().find(|w| w.name == n).unwrap().id.clone();
    let order: Vec<String> = agent.calls();
    assert_eq!(
        order,
        [
            format!("provision:{}", id("a")),
            format!("provision:{}", id("b")),
            format!("provision:{}", id("c"))
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn templating_renders_and_unknown_variables_fail_the_spec() {
    let env = env().await;
    let agent = fake_agent(&env, "fake", true).await;
    let mut good = spec("good", "i");
    good.services[0].env.insert(
        "WHERE".into(),
        "${datacenter.slug}/${datacenter.region}".into(),
    );
    let mut bad = spec("bad", "i");
    bad.services[0].args = vec!["${datacenter.nope}".into()];
    let dc = create_dc(&env, "Templated DC", "fake", vec![good, bad]).await;
    let out = reconcile(&env, &dc.id).await;
    let rows = env.store.workloads(&dc.id).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        agent.instances()[&rows[0].id].request.services[0].env["WHERE"],
        "templated-dc/eu"
    );
    let bad_action = out.actions.iter().find(|a| a.action.name == "bad").unwrap();
    assert_eq!(bad_action.action.kind, Kind::Skip);
    assert!(
        bad_action
            .action
            .reason
            .contains("unknown variable ${datacenter.nope}"),
        "{}",
        bad_action.action.reason
    );
}

async fn stale_snapshots_are_ignored(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    let old = get_dc(&env, &dc.id).await.unwrap();
    let newer = set_specs(&env, &dc.id, vec![spec("a", "i"), spec("b", "i")]).await;
    let (info, declared) = ctrlplane_bootstrap::service::snapshot_of(&newer);
    env.svc
        .reconcile(&admin(), &info, &declared, false)
        .await
        .unwrap();
    let (info, declared) = ctrlplane_bootstrap::service::snapshot_of(&old);
    let out = env
        .svc
        .reconcile(&admin(), &info, &declared, false)
        .await
        .unwrap();
    assert!(out.stale);
    assert!(out.actions.is_empty());
    assert_eq!(
        names(&states(&env, &dc.id).await),
        [("a", "running"), ("b", "running")]
    );
    assert_eq!(agent.count("deprovision:"), 0);
}

async fn datacenter_status_governs_what_changes(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i:1")]).await;
    reconcile(&env, &dc.id).await;

    // Maintenance and offline: nothing changes, the plan says paused.
    set_specs(&env, &dc.id, vec![spec("a", "i:2"), spec("b", "i")]).await;
    for status in [DatacenterStatus::Maintenance, DatacenterStatus::Offline] {
        set_status(&env, &dc.id, status).await;
        let out = reconcile(&env, &dc.id).await;
        assert!(out.paused);
        assert!(
            out.actions.iter().all(|a| a.action.kind == Kind::Skip),
            "{:?}",
            out.actions
        );
        assert_eq!(agent.calls().len(), 1);
    }
    // Draining: the update goes on, the new install does not.
    set_status(&env, &dc.id, DatacenterStatus::Active).await;
    set_status(&env, &dc.id, DatacenterStatus::Draining).await;
    reconcile(&env, &dc.id).await;
    assert_eq!((agent.count("deploy:"), agent.count("provision:")), (1, 1));
    assert_eq!(names(&states(&env, &dc.id).await), [("a", "running")]);

    // Deleting: everything is retired, then the datacenter is purged.
    env.dcs
        .clone()
        .delete_datacenter(ctrlplane_proto::datacenter::v1::DeleteDatacenterRequest {
            id: dc.id.clone(),
        })
        .await
        .unwrap();
    let out = reconcile(&env, &dc.id).await;
    assert!(out.purged, "{out:?}");
    assert!(agent.instances().is_empty());
    assert!(env.store.workloads(&dc.id).await.unwrap().is_empty());
    assert!(
        get_dc(&env, &dc.id).await.is_none(),
        "purged at the datacenter service"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_changes_nothing() {
    let env = env().await;
    let agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    let d = get_dc(&env, &dc.id).await.unwrap();
    let (info, declared) = ctrlplane_bootstrap::service::snapshot_of(&d);
    let out = env
        .svc
        .reconcile(&admin(), &info, &declared, true)
        .await
        .unwrap();
    assert_eq!(out.actions.len(), 1);
    assert_eq!(out.actions[0].action.kind, Kind::Provision);
    assert!(agent.calls().is_empty());
    assert!(env.store.workloads(&dc.id).await.unwrap().is_empty());
    assert_eq!(env.store.current_sequence().await.unwrap(), 0);
}

async fn one_reconcile_per_datacenter_at_a_time(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    agent.state.lock().unwrap().hang_provisions = true;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i")]).await;
    let d = get_dc(&env, &dc.id).await.unwrap();
    let (info, declared) = ctrlplane_bootstrap::service::snapshot_of(&d);
    let first = {
        let svc = env.svc.clone();
        let (info, declared) = (info.clone(), declared.clone());
        tokio::spawn(async move { svc.reconcile(&admin(), &info, &declared, false).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while agent.count("provision:") == 0 {
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // While the first is in flight, a second one of the same datacenter is
    // refused (and a dry run is still answered).
    let err = env
        .svc
        .reconcile(&admin(), &info, &declared, false)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ctrlplane_bootstrap::error::Error::Aborted(_)),
        "{err:?}"
    );
    assert!(
        env.svc
            .reconcile(&admin(), &info, &declared, true)
            .await
            .is_ok()
    );
    first.abort();
    let _ = first.await;
    // The cancelled run released its claim.
    agent.state.lock().unwrap().hang_provisions = false;
    env.clock.advance(Duration::from_secs(61));
    reconcile(&env, &dc.id).await;
    assert_eq!(names(&states(&env, &dc.id).await), [("a", "running")]);
}

// The scenarios that lean on the store most also run on Postgres.
on_both_backends!(
    declared_services_install_once,
    removed_specs_are_retired,
    failures_record_attempts_back_off_then_succeed,
    a_crash_after_the_agent_call_recovers_without_duplicates,
    image_changes_deploy_in_place_and_structure_changes_replace_without_a_gap,
    stale_snapshots_are_ignored,
    datacenter_status_governs_what_changes,
    one_reconcile_per_datacenter_at_a_time,
);
