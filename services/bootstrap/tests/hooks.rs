//! Remote hooks: real `BootstrapHookService` servers written in the test,
//! registered through the service like any extension.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::error::Error;
use ctrlplane_bootstrap::hooks::{RuleHook, Selector};
use ctrlplane_bootstrap::model::State;
use ctrlplane_bootstrap::plan::Kind;

/// A timeout that a healthy hook on a loaded machine always meets, and a
/// delay far beyond it.
const HOOK_TIMEOUT: Duration = Duration::from_secs(3);
const HUNG: Duration = Duration::from_secs(120);

async fn remote_hooks_keep_their_last_known_specs(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let hook = test_hook("inventory", vec![spec("inv-agent", "inv:1")]).await;
    let registered = env
        .svc
        .register_hook(&admin(), "inventory", &hook.endpoint, Some(HOOK_TIMEOUT))
        .await
        .unwrap();
    assert_eq!(registered.timeout, HOOK_TIMEOUT);
    let dc = create_dc(&env, "dc", "fake", vec![spec("logs", "l:1")]).await;

    // Its specs get installed, next to the declared ones.
    let out = reconcile(&env, &dc.id).await;
    assert!(out.hook_failures.is_empty(), "{:?}", out.hook_failures);
    let inv = row(&env, &dc.id, "inv-agent").await;
    assert_eq!(
        (inv.state, inv.source.as_str()),
        (State::Running, "inventory")
    );
    assert_eq!(row(&env, &dc.id, "logs").await.state, State::Running);
    {
        let s = hook.state.lock().unwrap();
        assert_eq!(s.asked.len(), 1);
        assert_eq!(s.asked[0], dc.id);
        assert!(
            s.all_calls_authenticated,
            "hooks are called with a system token"
        );
    }
    let (_, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    assert_eq!(remote.len(), 1);
    assert_eq!(remote[0].last_error, "");
    assert!(remote[0].last_success_time.is_some());

    // The hook hangs past its timeout: its last known specs are kept.
    hook.set(|s| s.delay = Some(HUNG));
    let started = tokio::time::Instant::now();
    let out = reconcile(&env, &dc.id).await;
    assert!(
        started.elapsed() < HUNG / 2,
        "the reconcile did not wait for the hung hook"
    );
    assert_eq!(out.hook_failures.len(), 1, "{:?}", out.hook_failures);
    assert_eq!(out.hook_failures[0].hook, "inventory");
    assert_eq!(out.hook_failures[0].fallback, 1);
    assert!(
        out.actions
            .iter()
            .all(|a| a.action.kind == Kind::Noop && a.error.is_none()),
        "{:?}",
        out.actions
    );
    assert_eq!(row(&env, &dc.id, "inv-agent").await.id, inv.id);
    assert_eq!(agent.count("deprovision:"), 0);
    let (_, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    assert!(
        remote[0].last_error.contains("no answer within"),
        "{:?}",
        remote[0]
    );
    let failed: Vec<_> = events(&env, Some(&dc.id))
        .await
        .into_iter()
        .filter(|e| e.kind == "hook_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].message.contains("inventory") && failed[0].message.contains("last known"),
        "{}",
        failed[0].message
    );

    // The hook answers with an error: the same.
    hook.set(|s| {
        s.delay = None;
        s.fail = true;
    });
    let out = reconcile(&env, &dc.id).await;
    assert_eq!(out.hook_failures.len(), 1);
    assert_eq!(
        rows(&env, &dc.id).await.len(),
        2,
        "nothing retired while the hook is down"
    );
    assert_eq!(agent.count("deprovision:"), 0);
    let (_, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    assert!(
        remote[0].last_error.contains("inventory database is down"),
        "{:?}",
        remote[0]
    );
    assert_eq!(
        events(&env, Some(&dc.id))
            .await
            .iter()
            .filter(|e| e.kind == "hook_failed")
            .count(),
        2
    );

    // Healthy again: the error clears; nothing was reinstalled.
    hook.set(|s| s.fail = false);
    let out = reconcile(&env, &dc.id).await;
    assert!(out.hook_failures.is_empty());
    let (_, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    assert_eq!(remote[0].last_error, "");
    assert_eq!(agent.count("provision:"), 2);

    // Unregistered: its specs are retired on the next reconcile.
    env.svc
        .unregister_hook(&admin(), "inventory")
        .await
        .unwrap();
    let calls = hook.calls();
    let out = reconcile(&env, &dc.id).await;
    assert!(
        out.actions
            .iter()
            .any(|a| a.action.name == "inv-agent" && a.action.kind == Kind::Retire),
        "{:?}",
        out.actions
    );
    assert_eq!(hook.calls(), calls, "an unregistered hook is not called");
    let left: Vec<String> = rows(&env, &dc.id)
        .await
        .into_iter()
        .map(|w| w.name)
        .collect();
    assert_eq!(left, ["logs"]);
    assert!(!agent.instances().contains_key(&inv.id));
    assert!(matches!(
        env.svc.unregister_hook(&admin(), "inventory").await,
        Err(Error::NotFound(_))
    ));
}

async fn a_hook_failing_from_the_start_contributes_nothing(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let agent = fake_agent(&env, "fake", true).await;
    let hook = test_hook("flaky", vec![spec("flaky-thing", "f:1")]).await;
    hook.set(|s| s.fail = true);
    env.svc
        .register_hook(&admin(), "flaky", &hook.endpoint, Some(HOOK_TIMEOUT))
        .await
        .unwrap();
    let dc = create_dc(&env, "dc", "fake", vec![spec("logs", "l:1")]).await;
    let out = reconcile(&env, &dc.id).await;
    assert_eq!(out.hook_failures.len(), 1);
    assert_eq!(out.hook_failures[0].fallback, 0);
    assert_eq!(
        names(&states(&env, &dc.id).await),
        [("logs".to_string(), "running".to_string())]
    );
    // It recovers: its specs arrive.
    hook.set(|s| s.fail = false);
    reconcile(&env, &dc.id).await;
    assert_eq!(row(&env, &dc.id, "flaky-thing").await.state, State::Running);
    assert_eq!(agent.count("provision:"), 2);
}

fn names(rows: &[(String, String)]) -> Vec<(String, String)> {
    rows.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_are_ordered_by_name_not_by_registration() {
    let env = env().await;
    let agent = fake_agent(&env, "fake", true).await;
    // Registered z first, then a; both contribute "shared".
    let zeta = test_hook(
        "zeta",
        vec![spec("shared", "from-zeta"), spec("z-only", "z:1")],
    )
    .await;
    let alpha = test_hook("alpha", vec![spec("shared", "from-alpha")]).await;
    for (name, h) in [("zeta", &zeta), ("alpha", &alpha)] {
        env.svc
            .register_hook(&admin(), name, &h.endpoint, Some(HOOK_TIMEOUT))
            .await
            .unwrap();
    }
    let dc = create_dc(&env, "dc", "fake", vec![]).await;
    for _ in 0..3 {
        let out = reconcile(&env, &dc.id).await;
        assert!(
            out.notes.iter().any(|n| n.name == "shared"
                && n.source == "zeta"
                && n.message.contains("hook \"alpha\" sorts first")),
            "{:?}",
            out.notes
        );
    }
    let shared = row(&env, &dc.id, "shared").await;
    assert_eq!(
        (
            shared.source.as_str(),
            shared.spec.services[0].image.as_str()
        ),
        ("alpha", "from-alpha")
    );
    assert_eq!(row(&env, &dc.id, "z-only").await.source, "zeta");
    assert_eq!(
        agent.count("provision:"),
        2,
        "stable ordering: nothing reinstalled across reconciles: {:?}",
        agent.calls()
    );
    // ListHooks lists them by name too.
    let (_, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    let listed: Vec<&str> = remote.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(listed, ["alpha", "zeta"]);

    // The first in name order going away hands the name to the next one:
    // a replacement (new instance first), since the spec changed.
    env.svc.unregister_hook(&admin(), "alpha").await.unwrap();
    reconcile(&env, &dc.id).await;
    let shared2 = row(&env, &dc.id, "shared").await;
    assert_eq!(
        (
            shared2.source.as_str(),
            shared2.spec.services[0].image.as_str()
        ),
        ("zeta", "from-zeta")
    );
    assert_eq!(shared2.state, State::Running);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hook_registration_is_validated() {
    let env = env_with(Options {
        rules: vec![RuleHook {
            name: "certs".into(),
            selector: Selector::default(),
            services: vec![spec("cert-manager", "cm:1")],
        }],
        ..Default::default()
    })
    .await;
    let fields = |e: Error| match e {
        Error::InvalidArgument(v) => v.iter().map(|i| i.field.clone()).collect::<Vec<_>>(),
        other => panic!("expected InvalidArgument, got {other:?}"),
    };
    let err = env
        .svc
        .register_hook(&admin(), "Bad Name", "localhost:9", Some(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(fields(err), ["name", "endpoint", "timeout"]);
    let err = env
        .svc
        .register_hook(
            &admin(),
            "ok",
            "http://127.0.0.1:9",
            Some(Duration::from_secs(3600)),
        )
        .await
        .unwrap_err();
    assert_eq!(fields(err), ["timeout"]);
    // A rule hook's name is taken.
    let err = env
        .svc
        .register_hook(&admin(), "certs", "http://127.0.0.1:9", None)
        .await
        .unwrap_err();
    assert_eq!(fields(err), ["name"]);
    // Default timeout; re-registering re-points it.
    let h = env
        .svc
        .register_hook(&admin(), "inv", "http://127.0.0.1:9", None)
        .await
        .unwrap();
    assert_eq!(h.timeout, ctrlplane_bootstrap::hooks::DEFAULT_HOOK_TIMEOUT);
    let h2 = env
        .svc
        .register_hook(&admin(), "inv", "https://hooks.example:443", None)
        .await
        .unwrap();
    assert_eq!(h2.endpoint, "https://hooks.example:443");
    assert_eq!(h2.create_time, h.create_time);
    let (rules, remote) = env.svc.list_hooks(&admin()).await.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(remote.len(), 1);
}

on_both_backends!(
    remote_hooks_keep_their_last_known_specs,
    a_hook_failing_from_the_start_contributes_nothing,
);
