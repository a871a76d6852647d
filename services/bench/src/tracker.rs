//! Follows `BootstrapService.WatchEvents` for every datacenter and records
//! the moment each datacenter has all its bootstrap workloads RUNNING.
//!
//! The stream is persisted and sequenced, so after a disconnect the tracker
//! resumes after the last sequence it saw and misses nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::bail;
use ctrlplane_proto::bootstrap::v1::{self as bspb, BootstrapState};
use tokio::time::Instant;

use crate::stack::Stack;

#[derive(Default)]
struct State {
    /// Datacenter → names of its workloads seen reaching RUNNING.
    running: HashMap<String, HashSet<String>>,
    /// Datacenter → when its last expected workload reached RUNNING.
    done: HashMap<String, Instant>,
    /// Events seen, in total.
    events: u64,
    /// `failed` events seen.
    failed: u64,
    /// When the last event arrived.
    last_event: Option<Instant>,
}

/// Counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Events seen.
    pub events: u64,
    /// `failed` events seen.
    pub failed: u64,
}

/// The event follower.
pub struct Tracker {
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Tracker {
    /// Opens the watch (from "now") and follows it in the background; a
    /// datacenter counts as done once `services` distinct workloads of it
    /// have reached RUNNING.
    ///
    /// # Errors
    /// The watch cannot be opened.
    pub async fn start(stack: &Stack, services: usize) -> anyhow::Result<Tracker> {
        let mut client = stack.bootstrap.clone();
        let first = client
            .watch_events(bspb::WatchEventsRequest {
                datacenter_id: String::new(),
                since_sequence: 0,
            })
            .await?
            .into_inner();
        let state = Arc::new(Mutex::new(State::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            let mut stream = Some(first);
            let mut last = 0i64;
            loop {
                let mut s = match stream.take() {
                    Some(s) => s,
                    None => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        match client
                            .watch_events(bspb::WatchEventsRequest {
                                datacenter_id: String::new(),
                                since_sequence: last,
                            })
                            .await
                        {
                            Ok(r) => r.into_inner(),
                            Err(e) => {
                                eprintln!("bench: reopening WatchEvents failed: {e}");
                                continue;
                            }
                        }
                    }
                };
                loop {
                    match s.message().await {
                        Ok(Some(bspb::WatchEventsResponse { event: Some(e) })) => {
                            last = last.max(e.sequence);
                            record(&shared, &e, services);
                        }
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(e) => {
                            eprintln!("bench: WatchEvents broke ({e}); resuming after {last}");
                            break;
                        }
                    }
                }
            }
        });
        Ok(Tracker { state, task })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When each of `ids` became all-running, waiting at most `timeout` for
    /// all of them; prints progress every few seconds.
    ///
    /// # Errors
    /// Not all converged within `timeout` (says how many did).
    pub async fn wait_done(
        &self,
        ids: &[String],
        timeout: Duration,
    ) -> anyhow::Result<Vec<Instant>> {
        let started = Instant::now();
        let mut next_report = started + Duration::from_secs(5);
        loop {
            let (done, failed) = {
                let s = self.lock();
                let done: Vec<Instant> =
                    ids.iter().filter_map(|i| s.done.get(i).copied()).collect();
                (done, s.failed)
            };
            if done.len() == ids.len() {
                return Ok(done);
            }
            let now = Instant::now();
            if now - started >= timeout {
                bail!(
                    "convergence timed out after {timeout:?}: {} of {} datacenters have all \
                     their bootstrap workloads running ({failed} `failed` events seen)",
                    done.len(),
                    ids.len()
                );
            }
            if now >= next_report {
                eprintln!(
                    "  … {}/{} datacenters converged after {:.0?}",
                    done.len(),
                    ids.len(),
                    now - started
                );
                next_report = now + Duration::from_secs(5);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until no event has arrived for `quiet` (at most `timeout`).
    ///
    /// # Errors
    /// Events kept coming for `timeout`.
    pub async fn wait_quiet(&self, quiet: Duration, timeout: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        loop {
            let last = self.lock().last_event;
            let now = Instant::now();
            if last.is_none_or(|l| now - l >= quiet) {
                return Ok(());
            }
            if now - started >= timeout {
                bail!("bootstrap events kept coming for {timeout:?} after convergence");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The counters now.
    pub fn counts(&self) -> Counts {
        let s = self.lock();
        Counts {
            events: s.events,
            failed: s.failed,
        }
    }
}

fn record(state: &Mutex<State>, e: &bspb::BootstrapEvent, services: usize) {
    let now = Instant::now();
    let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
    s.events += 1;
    s.last_event = Some(now);
    if e.r#type == "failed" {
        s.failed += 1;
    }
    if e.to_state != BootstrapState::Running as i32 {
        return;
    }
    let names = s.running.entry(e.datacenter_id.clone()).or_default();
    names.insert(e.name.clone());
    if names.len() >= services && !s.done.contains_key(&e.datacenter_id) {
        s.done.insert(e.datacenter_id.clone(), now);
    }
}
