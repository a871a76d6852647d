//! The worker framework.
//!
//! A worker has a name, an interval with jitter, an optional per-run
//! timeout and a job. Its loop runs the job once at start (while this
//! replica leads), then every interval (± jitter). Guarantees:
//! - never two runs of one worker at once: periodic ticks skip while a run
//!   (e.g. one asked for by `RunWorker`) is in progress, `RunWorker` waits;
//! - a run past its timeout is cancelled and recorded as that run's error;
//! - a panic in a job is caught and recorded as that run's error;
//! - `WorkerInfo` (last run, duration, error, counts, next run) is kept for
//!   `ListWorkers`/`GetWorker`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use rand::Rng;
use tokio::sync::watch;

/// What a run is about: everything, or one datacenter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunScope {
    /// Only this datacenter (workers that act per datacenter).
    pub datacenter_id: Option<String>,
}

/// A job's future.
pub type JobFuture = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// A worker's job.
pub trait Job: Send + Sync + 'static {
    /// One run.
    fn run(&self, scope: RunScope) -> JobFuture;
}

impl<F, Fut> Job for F
where
    F: Fn(RunScope) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    fn run(&self, scope: RunScope) -> JobFuture {
        Box::pin(self(scope))
    }
}

/// A worker's static settings.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Name.
    pub name: String,
    /// Time between runs.
    pub interval: Duration,
    /// Random spread of each interval, as a fraction (0.1 = ±10%).
    pub jitter: f64,
    /// A run longer than this is cancelled (`None`: no limit, for workers
    /// that hold a stream).
    pub timeout: Option<Duration>,
}

/// A worker's state, as `WorkerInfo` reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Info {
    /// Name.
    pub name: String,
    /// Interval.
    pub interval: Duration,
    /// A run is in progress.
    pub running: bool,
    /// Start of the last finished run.
    pub last_run_time: Option<DateTime<Utc>>,
    /// Error of the last finished run (empty on success).
    pub last_error: String,
    /// Finished runs.
    pub run_count: i64,
    /// Finished runs that failed.
    pub error_count: i64,
    /// Duration of the last finished run.
    pub last_duration: Duration,
    /// When the next periodic run is due.
    pub next_run_time: Option<DateTime<Utc>>,
}

/// Why `run_now` could not run a worker.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RunError {
    /// No such worker.
    #[error("worker {0:?} not found")]
    NotFound(String),
    /// This replica does not lead.
    #[error("this scheduler replica is a standby; the leader runs the workers")]
    NotLeader,
}

struct Entry {
    spec: WorkerSpec,
    job: Arc<dyn Job>,
    info: Mutex<Info>,
    gate: tokio::sync::Mutex<()>,
}

/// The set of workers of this process.
#[derive(Clone)]
pub struct Workers {
    entries: Arc<BTreeMap<String, Arc<Entry>>>,
    leader: watch::Receiver<bool>,
}

fn jittered(spec: &WorkerSpec) -> Duration {
    let j = spec.jitter.clamp(0.0, 0.9);
    if j == 0.0 {
        return spec.interval;
    }
    let factor = rand::rng().random_range(1.0 - j..=1.0 + j);
    spec.interval.mul_f64(factor)
}

impl Workers {
    /// Workers that run while `leader` is true.
    pub fn new(workers: Vec<(WorkerSpec, Arc<dyn Job>)>, leader: watch::Receiver<bool>) -> Self {
        let entries = workers
            .into_iter()
            .map(|(spec, job)| {
                let info = Info {
                    name: spec.name.clone(),
                    interval: spec.interval,
                    ..Default::default()
                };
                (
                    spec.name.clone(),
                    Arc::new(Entry {
                        spec,
                        job,
                        info: Mutex::new(info),
                        gate: tokio::sync::Mutex::new(()),
                    }),
                )
            })
            .collect();
        Workers {
            entries: Arc::new(entries),
            leader,
        }
    }

    /// Every worker's info, by name.
    pub fn list(&self) -> Vec<Info> {
        self.entries
            .values()
            .map(|e| e.info.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .collect()
    }

    /// One worker's info.
    pub fn get(&self, name: &str) -> Option<Info> {
        self.entries
            .get(name)
            .map(|e| e.info.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Whether this replica leads.
    pub fn is_leader(&self) -> bool {
        *self.leader.borrow()
    }

    /// Runs a worker now (waiting for a run in progress to finish first) and
    /// returns its info afterwards.
    ///
    /// # Errors
    /// [`RunError`].
    pub async fn run_now(&self, name: &str, scope: RunScope) -> Result<Info, RunError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| RunError::NotFound(name.to_string()))?;
        if !self.is_leader() {
            return Err(RunError::NotLeader);
        }
        let _gate = entry.gate.lock().await;
        run_once(entry, scope).await;
        Ok(entry.info.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    /// Spawns every worker's loop; they end when `shutdown` turns true.
    pub fn spawn(&self, shutdown: watch::Receiver<bool>) -> tokio::task::JoinSet<()> {
        let mut set = tokio::task::JoinSet::new();
        for entry in self.entries.values() {
            let entry = entry.clone();
            let mut leader = self.leader.clone();
            let mut shutdown = shutdown.clone();
            set.spawn(async move {
                loop {
                    // Wait until this replica leads.
                    while !*leader.borrow_and_update() {
                        tokio::select! {
                            r = leader.changed() => if r.is_err() { return },
                            _ = shutdown.changed() => return,
                        }
                    }
                    if *shutdown.borrow() {
                        return;
                    }
                    // Skip the tick if a run (asked for by RunWorker) is in
                    // progress: never two runs at once.
                    if let Ok(_gate) = entry.gate.try_lock() {
                        tokio::select! {
                            () = run_once(&entry, RunScope::default()) => {}
                            _ = shutdown.changed() => return,
                        }
                    }
                    let wait = jittered(&entry.spec);
                    entry
                        .info
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .next_run_time =
                        Some(Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default());
                    let deadline = tokio::time::Instant::now() + wait;
                    loop {
                        tokio::select! {
                            () = tokio::time::sleep_until(deadline) => break,
                            _ = shutdown.changed() => return,
                            // Losing the lead stops the schedule until it is
                            // won back; a renewal (still leading) changes
                            // nothing.
                            r = leader.changed() => {
                                if r.is_err() {
                                    return;
                                }
                                if !*leader.borrow_and_update() {
                                    break;
                                }
                            }
                        }
                    }
                }
            });
        }
        set
    }
}

/// One run: spawned so a panic is caught, bounded by the timeout.
async fn run_once(entry: &Entry, scope: RunScope) {
    let started = Utc::now();
    let clock = tokio::time::Instant::now();
    entry.info.lock().unwrap_or_else(|p| p.into_inner()).running = true;
    let mut task = tokio::spawn(entry.job.run(scope));
    let outcome = match entry.spec.timeout {
        Some(limit) => match tokio::time::timeout(limit, &mut task).await {
            Ok(joined) => joined,
            Err(_) => {
                task.abort();
                Ok(Err(format!("timed out after {limit:?}")))
            }
        },
        None => (&mut task).await,
    };
    let error = match outcome {
        Ok(Ok(())) => String::new(),
        Ok(Err(e)) => e,
        Err(join) if join.is_panic() => {
            let payload = join.into_panic();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".to_string());
            format!("panicked: {msg}")
        }
        Err(_) => "cancelled".to_string(),
    };
    if !error.is_empty() {
        tracing::warn!(worker = %entry.spec.name, %error, "worker run failed");
    }
    let mut info = entry.info.lock().unwrap_or_else(|p| p.into_inner());
    info.running = false;
    info.last_run_time = Some(started);
    info.last_duration = clock.elapsed();
    info.run_count += 1;
    if !error.is_empty() {
        info.error_count += 1;
    }
    info.last_error = error;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn spec(name: &str, interval_ms: u64, timeout_ms: Option<u64>) -> WorkerSpec {
        WorkerSpec {
            name: name.into(),
            interval: Duration::from_millis(interval_ms),
            jitter: 0.0,
            timeout: timeout_ms.map(Duration::from_millis),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn runs_at_start_then_every_interval_and_only_while_leading() {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let job: Arc<dyn Job> = Arc::new(move |_s: RunScope| {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        });
        let (leader_tx, leader_rx) = watch::channel(false);
        let (stop_tx, stop_rx) = watch::channel(false);
        let workers = Workers::new(vec![(spec("tick", 1000, Some(500)), job)], leader_rx);
        let mut set = workers.spawn(stop_rx);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(count.load(Ordering::SeqCst), 0, "a standby runs nothing");
        leader_tx.send(true).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(count.load(Ordering::SeqCst), 1, "first run at once");
        // Lease renewals re-announce the lead: they must not trigger runs.
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            leader_tx.send_replace(true);
        }
        assert_eq!(count.load(Ordering::SeqCst), 4);
        let info = workers.get("tick").unwrap();
        assert_eq!((info.run_count, info.error_count), (4, 0));
        assert!(info.next_run_time.is_some() && info.last_run_time.is_some());
        leader_tx.send(false).unwrap();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            count.load(Ordering::SeqCst),
            4,
            "losing the lead stops runs"
        );
        stop_tx.send(true).unwrap();
        while set.join_next().await.is_some() {}
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_and_panics_are_recorded_as_errors() {
        let slow: Arc<dyn Job> = Arc::new(|_s: RunScope| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        });
        let boom: Arc<dyn Job> = Arc::new(|_s: RunScope| async { panic!("kaboom") });
        let fails: Arc<dyn Job> = Arc::new(|_s: RunScope| async { Err("nope".to_string()) });
        let (_l, leader) = watch::channel(true);
        let workers = Workers::new(
            vec![
                (spec("slow", 1000, Some(100)), slow),
                (spec("boom", 1000, Some(100)), boom),
                (spec("fails", 1000, None), fails),
            ],
            leader,
        );
        let info = workers.run_now("slow", RunScope::default()).await.unwrap();
        assert_eq!(info.last_error, "timed out after 100ms");
        let info = workers.run_now("boom", RunScope::default()).await.unwrap();
        assert_eq!(info.last_error, "panicked: kaboom");
        let info = workers.run_now("fails", RunScope::default()).await.unwrap();
        assert_eq!(
            (info.last_error.as_str(), info.error_count, info.running),
            ("nope", 1, false)
        );
        assert_eq!(
            workers
                .run_now("nope", RunScope::default())
                .await
                .unwrap_err(),
            RunError::NotFound("nope".into())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn never_two_runs_at_once() {
        let active = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let (a, p) = (active.clone(), peak.clone());
        let job: Arc<dyn Job> = Arc::new(move |_s: RunScope| {
            let (a, p) = (a.clone(), p.clone());
            async move {
                let now = a.fetch_add(1, Ordering::SeqCst) + 1;
                p.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(300)).await;
                a.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        });
        let (_l, leader) = watch::channel(true);
        let (_s, stop) = watch::channel(false);
        let workers = Workers::new(vec![(spec("w", 100, None), job)], leader);
        let _set = workers.spawn(stop);
        let mut asks = Vec::new();
        for _ in 0..5 {
            let w = workers.clone();
            asks.push(tokio::spawn(async move {
                w.run_now("w", RunScope::default()).await
            }));
        }
        for a in asks {
            a.await.unwrap().unwrap();
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(peak.load(Ordering::SeqCst), 1);
        assert!(workers.get("w").unwrap().run_count >= 5);
    }

    #[tokio::test]
    async fn a_standby_refuses_run_now() {
        let job: Arc<dyn Job> = Arc::new(|_s: RunScope| async { Ok(()) });
        let (_l, leader) = watch::channel(false);
        let workers = Workers::new(vec![(spec("w", 100, None), job)], leader);
        assert_eq!(
            workers.run_now("w", RunScope::default()).await.unwrap_err(),
            RunError::NotLeader
        );
    }
}
