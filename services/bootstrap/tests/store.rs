//! The store's guarantees, on SQLite and on Postgres: reconcile leases are
//! exclusive across replicas, expire, and remember the revision acted on;
//! concurrent writers commit events in sequence order, so a watcher never
//! misses one.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use ctrlplane_bootstrap::model::NewEvent;
use ctrlplane_bootstrap::store::Acquire;

const TTL: Duration = Duration::from_secs(60);

async fn reconcile_leases_are_exclusive_and_expire(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    let s = &env.store;
    let dc = ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER);
    assert_eq!(
        s.acquire(&dc, "r1", 5, TTL).await.unwrap(),
        Acquire::Acquired
    );
    // Another replica waits; the holder may take it again.
    assert_eq!(s.acquire(&dc, "r2", 5, TTL).await.unwrap(), Acquire::Busy);
    assert_eq!(
        s.acquire(&dc, "r1", 5, TTL).await.unwrap(),
        Acquire::Acquired
    );
    // Releasing records the revision: older snapshots are stale from now on.
    s.release(&dc, "r1", 5).await.unwrap();
    assert_eq!(
        s.acquire(&dc, "r2", 4, TTL).await.unwrap(),
        Acquire::Stale { last_revision: 5 }
    );
    assert_eq!(
        s.acquire(&dc, "r2", 5, TTL).await.unwrap(),
        Acquire::Acquired
    );
    // A release by someone who does not hold it changes nothing.
    s.release(&dc, "r1", 9).await.unwrap();
    assert_eq!(s.acquire(&dc, "r3", 6, TTL).await.unwrap(), Acquire::Busy);
    // A failed run releases without recording (revision 0 keeps 5).
    s.release(&dc, "r2", 0).await.unwrap();
    assert_eq!(
        s.acquire(&dc, "r3", 4, TTL).await.unwrap(),
        Acquire::Stale { last_revision: 5 }
    );
    // A crashed holder's lease expires.
    let short = Duration::from_millis(50);
    assert_eq!(
        s.acquire(&dc, "crashed", 6, short).await.unwrap(),
        Acquire::Acquired
    );
    assert_eq!(s.acquire(&dc, "r3", 6, TTL).await.unwrap(), Acquire::Busy);
    eventually("the crashed holder's lease to expire", TTL, || async {
        (s.acquire(&dc, "r3", 6, TTL).await.unwrap() == Acquire::Acquired).then_some(())
    })
    .await;
    // Datacenters are independent.
    let other = ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER);
    assert_eq!(
        s.acquire(&other, "r1", 1, TTL).await.unwrap(),
        Acquire::Acquired
    );
}

async fn concurrent_writers_commit_events_in_sequence_order(backend: Backend) {
    let Some(env) = env_on(backend).await else {
        return;
    };
    const WRITERS: usize = 8;
    const EACH: usize = 15;
    let dc = ctrlplane_core::id::new_id(ctrlplane_core::id::DATACENTER);
    let start = env.store.current_sequence().await.unwrap();
    let mut rx = env.svc.watch(&admin(), &dc, 0).await.unwrap();
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let store = env.store.clone();
            let dc = dc.clone();
            tokio::spawn(async move {
                for i in 0..EACH {
                    store
                        .record_event(
                            &dc,
                            &format!("w{w}"),
                            &NewEvent::transition("test", None, None, format!("{w}/{i}")),
                        )
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    // The watcher sees every event once, in increasing order, while the
    // writers race.
    let mut seen = Vec::new();
    while seen.len() < WRITERS * EACH {
        let e = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("stalled after {} events", seen.len()))
            .unwrap()
            .unwrap();
        seen.push(e);
    }
    for w in writers {
        w.await.unwrap();
    }
    for pair in seen.windows(2) {
        assert!(pair[0].sequence < pair[1].sequence);
    }
    assert!(seen[0].sequence > start);
    let messages: BTreeSet<&str> = seen.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages.len(), WRITERS * EACH);
    // Each writer's events in its own order.
    for w in 0..WRITERS {
        let mine: Vec<String> = seen
            .iter()
            .filter(|e| e.name == format!("w{w}"))
            .map(|e| e.message.clone())
            .collect();
        let want: Vec<String> = (0..EACH).map(|i| format!("{w}/{i}")).collect();
        assert_eq!(mine, want);
    }
    assert_eq!(seen, events(&env, Some(&dc)).await);
    assert_eq!(
        tokio::time::timeout(Duration::from_millis(200), rx.recv())
            .await
            .ok()
            .flatten()
            .map(|e| e.unwrap().sequence),
        None,
        "nothing more"
    );
}

on_both_backends!(
    reconcile_leases_are_exclusive_and_expire,
    concurrent_writers_commit_events_in_sequence_order,
);
