//! Events: every transition is persisted; ListEvents pages in sequence
//! order; WatchEvents streams in order and resumes from a sequence.

mod common;

use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::error::Error;
use ctrlplane_bootstrap::model::{Event, State};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(20);

/// The next `n` events of a watch (each within [`WAIT`]).
async fn next(rx: &mut mpsc::Receiver<Result<Event, Error>>, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    for _ in 0..n {
        let e = tokio::time::timeout(WAIT, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no event within {WAIT:?} after {out:?}"))
            .expect("watch open")
            .expect("no error");
        out.push(e);
    }
    out
}

fn strictly_increasing(events: &[Event]) {
    for w in events.windows(2) {
        assert!(w[0].sequence < w[1].sequence, "{events:?}");
    }
}

async fn list_events_pages_in_sequence_order(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let _agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(
        &env,
        "dc",
        "fake",
        vec![spec("a", "i"), spec("b", "i"), spec("c", "i")],
    )
    .await;
    let other = create_dc(&env, "other", "fake", vec![spec("x", "i")]).await;
    reconcile(&env, &dc.id).await;
    reconcile(&env, &other.id).await;
    set_specs(&env, &dc.id, vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;

    // 3 × (provisioning, provisioned) + 2 × (retiring, retired).
    let mut paged = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let (page, next) = env
            .svc
            .list_events(&admin(), &dc.id, 3, &token)
            .await
            .unwrap();
        pages += 1;
        assert!(page.len() <= 3);
        paged.extend(page);
        match next {
            Some(t) => token = t,
            None => break,
        }
    }
    assert_eq!(paged.len(), 10, "{paged:?}");
    assert_eq!(pages, 4);
    strictly_increasing(&paged);
    assert!(paged.iter().all(|e| e.datacenter_id == dc.id));
    assert_eq!(paged, events(&env, Some(&dc.id)).await);
    // Per workload, the transitions in order.
    let rows_before: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    for name in &rows_before {
        let kinds: Vec<&str> = paged
            .iter()
            .filter(|e| &e.name == name)
            .map(|e| e.kind.as_str())
            .collect();
        if name == "a" {
            assert_eq!(kinds, ["provisioning", "provisioned"]);
        } else {
            assert_eq!(
                kinds,
                ["provisioning", "provisioned", "retiring", "retired"]
            );
        }
    }
    let retired = paged.iter().find(|e| e.kind == "retired").unwrap();
    assert_eq!(
        (retired.from_state, retired.to_state),
        (Some(State::Retiring), Some(State::Retired))
    );

    // Unfiltered: both datacenters, still in order.
    let (all, next) = env.svc.list_events(&admin(), "", 1000, "").await.unwrap();
    assert!(next.is_none());
    assert_eq!(all.len(), 12);
    strictly_increasing(&all);

    // A token is bound to its filter; bad sizes and ids are refused.
    let (_, token) = env.svc.list_events(&admin(), &dc.id, 1, "").await.unwrap();
    for (dc_id, size, token) in [
        (other.id.as_str(), 1, token.unwrap()),
        (dc.id.as_str(), 1, "garbage".to_string()),
        (dc.id.as_str(), -1, String::new()),
        ("dc_nope", 1, String::new()),
    ] {
        assert!(
            matches!(
                env.svc.list_events(&admin(), dc_id, size, &token).await,
                Err(Error::InvalidArgument(_))
            ),
            "{dc_id} {size} {token}"
        );
    }
}

async fn watch_streams_transitions_in_order_and_resumes(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let _agent = fake_agent(&env, "fake", true).await;
    let dc = create_dc(&env, "dc", "fake", vec![spec("a", "i"), spec("b", "i")]).await;
    let other = create_dc(&env, "other", "fake", vec![spec("x", "i")]).await;

    // From now on, of one datacenter.
    let mut rx = env.svc.watch(&admin(), &dc.id, 0).await.unwrap();
    let mut everything = env.svc.watch(&admin(), "", 0).await.unwrap();
    reconcile(&env, &other.id).await;
    reconcile(&env, &dc.id).await;
    let seen = next(&mut rx, 4).await;
    strictly_increasing(&seen);
    assert!(seen.iter().all(|e| e.datacenter_id == dc.id), "{seen:?}");
    for name in ["a", "b"] {
        let kinds: Vec<&str> = seen
            .iter()
            .filter(|e| e.name == name)
            .map(|e| e.kind.as_str())
            .collect();
        assert_eq!(kinds, ["provisioning", "provisioned"], "{seen:?}");
    }
    assert_eq!(seen, events(&env, Some(&dc.id)).await);
    let all = next(&mut everything, 6).await;
    strictly_increasing(&all);
    assert_eq!(all, events(&env, None).await);

    // Resume after the first event: the rest, then what happens next.
    let mut resumed = env
        .svc
        .watch(&admin(), &dc.id, seen[0].sequence)
        .await
        .unwrap();
    assert_eq!(next(&mut resumed, 3).await, seen[1..]);
    set_specs(&env, &dc.id, vec![spec("a", "i")]).await;
    reconcile(&env, &dc.id).await;
    let tail = next(&mut resumed, 2).await;
    assert_eq!(
        tail.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["retiring", "retired"]
    );
    assert!(tail[0].sequence > seen[3].sequence);
    assert_eq!(next(&mut rx, 2).await, tail, "the first watch saw it too");

    // Bad input.
    assert!(matches!(
        env.svc.watch(&admin(), &dc.id, -1).await,
        Err(Error::InvalidArgument(_))
    ));
    // Shutting down ends the streams.
    env.stop.send_replace(true);
    let end = tokio::time::timeout(WAIT, rx.recv()).await.unwrap();
    assert!(end.is_none(), "{end:?}");
}

on_both_backends!(
    list_events_pages_in_sequence_order,
    watch_streams_transitions_in_order_and_resumes,
);
