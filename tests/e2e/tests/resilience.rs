//! Resilience end to end, with the real binaries as child processes (see
//! `harness`): the process agent killed and restarted; bootstrap and
//! scheduler killed with SIGKILL at random moments during reconciles of
//! many datacenters; two schedulers on one Postgres database.
//!
//! Needs `cargo build --workspace` first (skipped with a message when a
//! binary is missing, a failure under `CI`). The random test prints its
//! seed; `CP_E2E_SEED=<n>` replays it.

mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ctrlplane_proto::bootstrap::v1 as bspb;
use harness::*;
use rand::{Rng, SeedableRng, rngs::StdRng};

/// The expected world: live datacenters' services (name → VERSION) and
/// deleted datacenters.
#[derive(Default)]
struct World {
    live: BTreeMap<String, BTreeMap<String, u32>>,
    deleted: BTreeSet<String>,
}

impl World {
    fn specs(&self, dc: &str) -> Vec<bspb::BootstrapServiceSpec> {
        self.live[dc].iter().map(|(n, v)| spec(n, *v)).collect()
    }
}

/// `Ok` when the system matches `w`: every live datacenter has exactly its
/// rows, all running at their spec; deleted ones are purged with no rows;
/// exactly one process per row, none for anything else; the agent manages
/// exactly the rows.
async fn check_converged(s: &Stack, w: &World) -> Result<(), String> {
    let mut rows = BTreeSet::new();
    for (dc, want) in &w.live {
        let got = s.rows(dc).await.ok_or("bootstrap not answering")?;
        let names: BTreeMap<String, &bspb::BootstrapWorkload> =
            got.iter().map(|r| (r.name.clone(), r)).collect();
        if names.len() != got.len() {
            return Err(format!("{dc}: duplicate rows {got:?}"));
        }
        for (name, version) in want {
            let Some(r) = names.get(name) else {
                return Err(format!("{dc}: no row {name}"));
            };
            if r.state != RUNNING {
                return Err(format!("{dc}/{name}: state {} ({})", r.state, r.last_error));
            }
            let v = r.services[0]
                .env
                .get("VERSION")
                .cloned()
                .unwrap_or_default();
            if v != version.to_string() {
                return Err(format!("{dc}/{name}: VERSION {v}, want {version}"));
            }
            rows.insert(r.id.clone());
        }
        if got.len() != want.len() {
            return Err(format!(
                "{dc}: rows {:?}, want {:?}",
                names.keys().collect::<Vec<_>>(),
                want.keys().collect::<Vec<_>>()
            ));
        }
    }
    for dc in &w.deleted {
        if !s.purged(dc).await {
            return Err(format!("{dc}: not purged"));
        }
        let left = s.rows(dc).await.ok_or("bootstrap not answering")?;
        if !left.is_empty() {
            return Err(format!("{dc}: purged but rows left: {left:?}"));
        }
    }
    let procs = s.processes();
    for id in &rows {
        let n = procs.get(id).map_or(0, Vec::len);
        if n != 1 {
            return Err(format!("{id}: {n} processes, want 1"));
        }
    }
    let orphans: Vec<_> = procs.keys().filter(|id| !rows.contains(*id)).collect();
    if !orphans.is_empty() {
        return Err(format!("orphan processes of {orphans:?}"));
    }
    let managed = s.managed().await.ok_or("agent not answering")?;
    if managed != rows {
        return Err(format!("agent manages {managed:?}, rows are {rows:?}"));
    }
    Ok(())
}

async fn wait_converged(s: &Stack, w: &World, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match check_converged(s, w).await {
            Ok(()) => return,
            Err(why) => assert!(
                tokio::time::Instant::now() < deadline,
                "not converged after {wait:?}: {why}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn wait_leader(s: &Stack, i: usize) {
    let mut c = s.sched(i);
    eventually(
        "the scheduler to lead",
        Duration::from_secs(30),
        async || workers(&mut c).await.filter(|(l, _)| *l).map(|_| ()),
    )
    .await;
}

/// Kill -9 the process agent: its workloads keep running (they outlive the
/// agent by design) while the rows stay `running` and status sync reports
/// the agent unreachable; a change made meanwhile fails and is retried with
/// growing backoff; a datacenter left alone keeps its rows untouched.
/// Restarted with the same state dir, the agent re-adopts its processes and
/// everything converges, one process per row.
///
/// The process agent's provider name is fixed (`process`), so a second
/// datacenter "on another provider" cannot be served by a second process
/// agent; "untouched" is checked for a datacenter on the same agent that
/// needed no agent call meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_process_agent() {
    let Some(bins) = bin_dir() else { return };
    let mut s = Stack::start(
        bins,
        Options {
            db: Db::Sqlite,
            scheduler_env: vec![
                ("CP_RECONCILE_INTERVAL", "1s"),
                ("CP_STATUS_SYNC_INTERVAL", "1s"),
                ("CP_PROVIDER_HEALTH_INTERVAL", "1s"),
                ("CP_GC_INTERVAL", "1h"),
                ("CP_TELEMETRY_INTERVAL", "1h"),
                ("CP_LEADER_LEASE", "2s"),
            ],
            bootstrap_env: vec![("CP_BOOTSTRAP_LEASE_TTL", "3s")],
            schedulers: 1,
        },
    )
    .await;
    wait_leader(&s, 0).await;
    let mut w = World::default();
    for name in ["one", "two"] {
        let id = s.create_dc(name, vec![spec("a", 1), spec("b", 1)]).await;
        w.live.insert(id, [("a".into(), 1), ("b".into(), 1)].into());
    }
    wait_converged(&s, &w, Duration::from_secs(30)).await;
    let ids: Vec<String> = w.live.keys().cloned().collect();
    let (one, two) = (&ids[0], &ids[1]);
    let two_before = s.rows(two).await.unwrap();

    s.agent.kill9();
    let procs = s.processes();
    assert_eq!(procs.len(), 4, "workloads outlive the agent: {procs:?}");

    // Status sync cannot reach the agent: reported per row, rows unchanged.
    let sync = s
        .bs()
        .sync_status(bspb::SyncStatusRequest {
            datacenter_id: one.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .results;
    assert_eq!(sync.len(), 2, "{sync:?}");
    assert!(
        sync.iter().all(|r| !r.error.is_empty() && !r.drifted),
        "{sync:?}"
    );

    // A change while the agent is down fails and is retried with backoff.
    w.live.get_mut(one).unwrap().insert("c".into(), 1);
    s.set_specs(one, w.specs(one)).await;
    let mut seen: Vec<(i32, i64)> = Vec::new();
    eventually(
        "c failed with growing backoff",
        Duration::from_secs(30),
        async || {
            let rows = s.rows(one).await?;
            let c = rows.iter().find(|r| r.name == "c")?;
            if c.state != FAILED {
                return None;
            }
            assert!(!c.last_error.is_empty());
            let next = c.next_attempt_time.as_ref().expect("next_attempt_time");
            let upd = c.update_time.as_ref().expect("update_time");
            let delay_ms =
                (next.seconds - upd.seconds) * 1000 + i64::from(next.nanos - upd.nanos) / 1_000_000;
            if seen.last().is_none_or(|(a, _)| *a != c.attempts) {
                seen.push((c.attempts, delay_ms));
            }
            (c.attempts >= 3).then_some(())
        },
    )
    .await;
    eprintln!("attempts and backoff delays (ms): {seen:?}");
    assert!(seen.iter().all(|(_, d)| *d > 0), "{seen:?}");
    assert!(
        seen.last().unwrap().1 > seen.first().unwrap().1,
        "backoff grows: {seen:?}"
    );
    // The other datacenter needed nothing from the agent: untouched.
    let two_now = s.rows(two).await.unwrap();
    for (a, b) in two_before.iter().zip(&two_now) {
        assert_eq!(
            (&a.id, a.state, &a.spec_hash),
            (&b.id, b.state, &b.spec_hash)
        );
        assert_eq!(b.attempts, 0, "{b:?}");
    }

    // Restart with the same state dir (identity kept; the token is ignored).
    s.agent.spawn();
    wait_serving(&s.agent).await;
    wait_converged(&s, &w, Duration::from_secs(40)).await;
}

/// Kill -9 bootstrap or the scheduler at random moments while datacenters
/// are created, changed and deleted, 20 rounds; then the system converges:
/// no duplicate processes, no orphans, no row stuck, deleted ones purged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_minus_9_during_reconciles() {
    let Some(bins) = bin_dir() else { return };
    let seed: u64 = std::env::var("CP_E2E_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!("kill_minus_9_during_reconciles: seed {seed} (replay with CP_E2E_SEED={seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut s = Stack::start(
        bins,
        Options {
            db: Db::Sqlite,
            scheduler_env: vec![
                ("CP_RECONCILE_INTERVAL", "1s"),
                ("CP_STATUS_SYNC_INTERVAL", "2s"),
                ("CP_PROVIDER_HEALTH_INTERVAL", "2s"),
                ("CP_GC_INTERVAL", "2s"),
                ("CP_TELEMETRY_INTERVAL", "1h"),
                ("CP_LEADER_LEASE", "2s"),
            ],
            bootstrap_env: vec![("CP_BOOTSTRAP_LEASE_TTL", "3s"), ("CP_GC_GRACE", "5s")],
            schedulers: 1,
        },
    )
    .await;
    wait_leader(&s, 0).await;
    let mut w = World::default();
    let mut n = 0;
    for _ in 0..12 {
        n += 1;
        let id = s
            .create_dc(&format!("dc{n}"), vec![spec("a", 1), spec("b", 1)])
            .await;
        w.live.insert(id, [("a".into(), 1), ("b".into(), 1)].into());
    }
    wait_converged(&s, &w, Duration::from_secs(60)).await;

    for round in 0..20 {
        let victim_bootstrap = rng.random_bool(0.5);
        let delay = Duration::from_millis(rng.random_range(0..500));
        // A batch of changes: create one, change one, maybe delete one.
        n += 1;
        let id = s
            .create_dc(&format!("dc{n}"), vec![spec("a", 1), spec("b", 1)])
            .await;
        w.live.insert(id, [("a".into(), 1), ("b".into(), 1)].into());
        let live: Vec<String> = w.live.keys().cloned().collect();
        let target = live[rng.random_range(0..live.len())].clone();
        {
            let svcs = w.live.get_mut(&target).unwrap();
            // Updates in place (Deploy at the agent) are included: a caller
            // killed mid-Deploy must not leave the agent between releases
            // (the agent's server finishes backend changes on its own).
            match rng.random_range(0..3) {
                // New VERSION of one (update in place).
                0 => {
                    if let Some(v) = svcs.get_mut("a") {
                        *v += 1;
                    } else {
                        svcs.insert("a".into(), 1);
                    }
                }
                // Add one.
                1 => {
                    svcs.insert(format!("x{round}"), 1);
                }
                // Remove one (keep at least one).
                _ => {
                    if svcs.len() > 1 {
                        let k = svcs.keys().next().unwrap().clone();
                        svcs.remove(&k);
                    }
                }
            }
        }
        s.set_specs(&target, w.specs(&target)).await;
        if rng.random_bool(0.4) && w.live.len() > 8 {
            let live: Vec<String> = w.live.keys().cloned().collect();
            let gone = live[rng.random_range(0..live.len())].clone();
            s.delete_dc(&gone).await;
            w.live.remove(&gone);
            w.deleted.insert(gone);
        }
        tokio::time::sleep(delay).await;
        let victim = if victim_bootstrap {
            &mut s.bootstrap
        } else {
            &mut s.schedulers[0]
        };
        eprintln!("round {round}: kill -9 {} after {delay:?}", victim.name);
        victim.kill9();
        victim.spawn();
        if victim_bootstrap {
            wait_serving(&s.bootstrap).await;
        } else {
            wait_serving(&s.schedulers[0]).await;
        }
    }
    let t0 = std::time::Instant::now();
    wait_converged(&s, &w, Duration::from_secs(90)).await;
    eprintln!(
        "converged {:?} after the last kill ({} live, {} deleted datacenters)",
        t0.elapsed(),
        w.live.len(),
        w.deleted.len()
    );
    // Nothing stuck: every remaining row is running (checked above), and
    // none is pending/provisioning/retiring.
    for dc in w.live.keys() {
        for r in s.rows(dc).await.unwrap() {
            assert_eq!(r.state, RUNNING, "{r:?}");
        }
    }
    assert!(s.bootstrap.alive() && s.schedulers[0].alive());
}

/// Two schedulers on one Postgres database: exactly one leads and runs
/// workers; SIGTERM it and the other takes over. Then the main flow on
/// Postgres (all services share the database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_schedulers_on_postgres() {
    let Some(bins) = bin_dir() else { return };
    let Some(base) = std::env::var("CP_TEST_POSTGRES_URL")
        .ok()
        .filter(|v| !v.is_empty())
    else {
        assert!(!ci(), "CP_TEST_POSTGRES_URL is required under CI");
        eprintln!("SKIPPED: CP_TEST_POSTGRES_URL is not set");
        return;
    };
    let url = fresh_database(&base).await;
    let mut s = Stack::start(
        bins,
        Options {
            db: Db::Postgres(url),
            scheduler_env: vec![
                ("CP_RECONCILE_INTERVAL", "1h"),
                ("CP_STATUS_SYNC_INTERVAL", "1s"),
                ("CP_PROVIDER_HEALTH_INTERVAL", "1s"),
                ("CP_GC_INTERVAL", "1s"),
                ("CP_TELEMETRY_INTERVAL", "1s"),
                ("CP_LEADER_LEASE", "2s"),
            ],
            bootstrap_env: vec![("CP_BOOTSTRAP_LEASE_TTL", "3s")],
            schedulers: 2,
        },
    )
    .await;
    let (mut c0, mut c1) = (s.sched(0), s.sched(1));
    let leader = eventually("exactly one leader", Duration::from_secs(30), async || {
        let (l0, _) = workers(&mut c0).await?;
        let (l1, _) = workers(&mut c1).await?;
        match (l0, l1) {
            (true, false) => Some(0),
            (false, true) => Some(1),
            (true, true) => panic!("two leaders"),
            _ => None,
        }
    })
    .await;
    let standby = 1 - leader;
    // A few lease periods: the leader's workers run, the standby's never.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut cs = [c0, c1];
    let (l, runs) = workers(&mut cs[leader]).await.unwrap();
    assert!(l);
    assert!(
        runs.values().any(|n| *n > 0),
        "leader ran nothing: {runs:?}"
    );
    assert!(runs["status_sync"] > 1, "{runs:?}");
    let (l, runs) = workers(&mut cs[standby]).await.unwrap();
    assert!(!l);
    assert!(runs.values().all(|n| *n == 0), "standby ran: {runs:?}");

    let t0 = std::time::Instant::now();
    s.schedulers[leader].term(Duration::from_secs(15));
    eventually(
        "the standby to take over",
        Duration::from_secs(10),
        async || {
            let (l, runs) = workers(&mut cs[standby]).await?;
            (l && runs.values().any(|n| *n > 0)).then_some(())
        },
    )
    .await;
    eprintln!("takeover after {:?}", t0.elapsed());

    // The main flow on Postgres, driven by the new leader's watch.
    let dc = s.create_dc("pg", vec![spec("a", 1), spec("b", 1)]).await;
    let mut w = World::default();
    w.live
        .insert(dc.clone(), [("a".into(), 1), ("b".into(), 1)].into());
    wait_converged(&s, &w, Duration::from_secs(30)).await;
    s.delete_dc(&dc).await;
    w.live.clear();
    w.deleted.insert(dc);
    wait_converged(&s, &w, Duration::from_secs(30)).await;
}

/// Creates a new database on the server of `base` and returns its URL.
async fn fresh_database(base: &str) -> String {
    use sea_orm::ConnectionTrait;
    let name = format!(
        "cp_e2e_{}_{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis()
    );
    let db = sea_orm::Database::connect(base).await.unwrap();
    db.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    db.close().await.unwrap();
    // Replace the path (database name), keep any query string.
    let (head, query) = match base.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (base, None),
    };
    let scheme_end = head.find("://").unwrap() + 3;
    let path_start = head[scheme_end..]
        .find('/')
        .map_or(head.len(), |i| scheme_end + i);
    let mut url = format!("{}/{name}", &head[..path_start]);
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    url
}
