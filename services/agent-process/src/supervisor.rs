//! Supervision of one replica: start it, wait for it to end, restart it
//! with capped exponential backoff, stop it gracefully on request, or let
//! go of it (leaving it running) when the agent shuts down.
//!
//! The loop is generic over how a process is launched ([`Launch`]) and
//! reports everything through an [`Observer`], so its timing is tested
//! under `tokio::time::pause()` with a fake launcher; the agent plugs in
//! real OS processes. All waiting uses `tokio::time`.
//!
//! Backoff: the n-th consecutive failure waits `initial · 2ⁿ⁻¹`, at most
//! `max`; a process that ran at least `reset_after` resets the count.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::process::Exit;

/// Restart delays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Largest delay.
    pub max: Duration,
    /// A run at least this long resets the failure count.
    pub reset_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            reset_after: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay after `consecutive` failures in a row (from 1).
    pub fn delay(&self, consecutive: u32) -> Duration {
        let exp = consecutive.saturating_sub(1).min(30);
        self.initial.saturating_mul(1u32 << exp).min(self.max)
    }
}

/// Why a launch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaunchError {
    /// The agent refuses new processes (halted): supervision ends.
    Halted,
    /// The process could not be started; retried with backoff.
    Failed(String),
}

/// A process being supervised.
pub trait Supervised: Send {
    /// Waits for it to end. Must be cancel-safe.
    fn wait(&mut self) -> impl Future<Output = Exit> + Send;
    /// Stops it: graceful signal, forced kill after `grace`.
    fn terminate(&mut self, grace: Duration) -> impl Future<Output = Exit> + Send;
    /// Cleans up after it ended on its own (kills what it left behind).
    fn cleanup(&mut self);
}

/// Starts processes.
pub trait Launch: Send + Sync {
    /// The process type.
    type Proc: Supervised;
    /// Starts one process.
    fn launch(&self) -> impl Future<Output = Result<Self::Proc, LaunchError>> + Send;
}

/// Receives what happens to the replica.
pub trait Observer<P>: Send + Sync {
    /// A process runs (`restart`: not the first of this supervision).
    fn started(&self, proc: &P, restart: bool);
    /// It ended on its own after running `ran`.
    fn exited(&self, exit: Exit, ran: Duration);
    /// Launching failed.
    fn launch_failed(&self, error: &str);
    /// Waiting `delay` before the next launch.
    fn backing_off(&self, delay: Duration);
    /// Stopped on request (`exit`: how the process ended, if one ran).
    fn stopped(&self, exit: Option<Exit>);
}

/// How supervision begins.
#[derive(Debug)]
pub enum Start<P> {
    /// Launch a new process.
    Fresh,
    /// Keep watching a process that already runs.
    Adopt(P),
    /// The previous process ended while nobody watched: count it as an
    /// exit and restart after the backoff.
    Ended(Exit),
    /// The previous process ended and its exit was already reported: only
    /// the restart (after the backoff) is due.
    Restart,
}

/// How supervision ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stopped on request; nothing runs.
    Stopped,
    /// The agent let go; the process (if any) keeps running.
    Detached,
    /// The agent was halted; nothing may be started.
    Halted,
}

/// Asks supervisors to stop (with a grace period) or to let go.
#[derive(Debug, Clone)]
pub struct Control {
    /// `Some(grace)` requests a stop.
    pub stop: watch::Receiver<Option<Duration>>,
    /// Fires on agent shutdown.
    pub detach: CancellationToken,
}

/// Resolves with the grace period once a stop is requested (never if the
/// sender is gone without asking).
pub async fn stop_requested(stop: &mut watch::Receiver<Option<Duration>>) -> Duration {
    let grace = stop
        .wait_for(Option::is_some)
        .await
        .map(|v| v.unwrap_or_default());
    match grace {
        Ok(grace) => grace,
        Err(_) => std::future::pending().await,
    }
}

enum Next<P> {
    Launch,
    Run(P, bool),
    Ended(Exit, Duration),
    Failed,
    Wait(Duration),
}

/// Supervises one replica until stopped, detached or halted.
pub async fn supervise<L: Launch, O: Observer<L::Proc>>(
    launcher: &L,
    backoff: Backoff,
    start: Start<L::Proc>,
    mut ctl: Control,
    observer: &O,
) -> Outcome {
    let mut consecutive = 0u32;
    // A process that replaces an earlier one counts as a restart.
    let mut launched_before = matches!(start, Start::Ended(_) | Start::Restart);
    let mut next = match start {
        Start::Fresh => Next::Launch,
        Start::Adopt(p) => Next::Run(p, false),
        Start::Ended(exit) => Next::Ended(exit, Duration::ZERO),
        Start::Restart => Next::Failed,
    };
    loop {
        next = match next {
            Next::Launch => {
                if ctl.stop.borrow().is_some() {
                    observer.stopped(None);
                    return Outcome::Stopped;
                }
                if ctl.detach.is_cancelled() {
                    return Outcome::Detached;
                }
                match launcher.launch().await {
                    Ok(p) => Next::Run(p, launched_before),
                    Err(LaunchError::Halted) => return Outcome::Halted,
                    Err(LaunchError::Failed(e)) => {
                        observer.launch_failed(&e);
                        Next::Failed
                    }
                }
            }
            Next::Run(mut p, restart) => {
                launched_before = true;
                observer.started(&p, restart);
                let t0 = Instant::now();
                tokio::select! {
                    biased;
                    () = ctl.detach.cancelled() => return Outcome::Detached,
                    grace = stop_requested(&mut ctl.stop) => {
                        let exit = p.terminate(grace).await;
                        observer.stopped(Some(exit));
                        return Outcome::Stopped;
                    }
                    exit = p.wait() => {
                        p.cleanup();
                        Next::Ended(exit, t0.elapsed())
                    }
                }
            }
            Next::Ended(exit, ran) => {
                observer.exited(exit, ran);
                if ran >= backoff.reset_after {
                    consecutive = 0;
                }
                consecutive += 1;
                Next::Wait(backoff.delay(consecutive))
            }
            Next::Failed => {
                consecutive += 1;
                Next::Wait(backoff.delay(consecutive))
            }
            Next::Wait(delay) => {
                observer.backing_off(delay);
                tokio::select! {
                    biased;
                    () = ctl.detach.cancelled() => return Outcome::Detached,
                    _ = stop_requested(&mut ctl.stop) => {
                        observer.stopped(None);
                        return Outcome::Stopped;
                    }
                    () = tokio::time::sleep(delay) => Next::Launch,
                }
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(1000),
            reset_after: Duration::from_secs(10),
        };
        let delays: Vec<u128> = (1..=6).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), b.max);
    }

    /// A process that "runs" for a fixed virtual time, then exits 1.
    struct FakeProc {
        runs_for: Duration,
    }

    impl Supervised for FakeProc {
        async fn wait(&mut self) -> Exit {
            tokio::time::sleep(self.runs_for).await;
            Exit::Code(1)
        }
        async fn terminate(&mut self, _grace: Duration) -> Exit {
            Exit::Signal(15)
        }
        fn cleanup(&mut self) {}
    }

    struct FakeLauncher {
        runs_for: Mutex<Vec<Duration>>,
        launches: Mutex<Vec<Instant>>,
    }

    impl Launch for FakeLauncher {
        type Proc = FakeProc;
        async fn launch(&self) -> Result<FakeProc, LaunchError> {
            self.launches.lock().unwrap().push(Instant::now());
            let mut runs = self.runs_for.lock().unwrap();
            let runs_for = if runs.len() > 1 {
                runs.remove(0)
            } else {
                runs[0]
            };
            Ok(FakeProc { runs_for })
        }
    }

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);

    impl Observer<FakeProc> for Log {
        fn started(&self, _: &FakeProc, restart: bool) {
            self.0
                .lock()
                .unwrap()
                .push(format!("started restart={restart}"));
        }
        fn exited(&self, exit: Exit, _: Duration) {
            self.0
                .lock()
                .unwrap()
                .push(format!("exited {}", exit.code()));
        }
        fn launch_failed(&self, e: &str) {
            self.0.lock().unwrap().push(format!("failed {e}"));
        }
        fn backing_off(&self, d: Duration) {
            self.0
                .lock()
                .unwrap()
                .push(format!("backoff {}", d.as_millis()));
        }
        fn stopped(&self, exit: Option<Exit>) {
            self.0
                .lock()
                .unwrap()
                .push(format!("stopped {:?}", exit.map(Exit::code)));
        }
    }

    fn backoff() -> Backoff {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
            reset_after: Duration::from_secs(10),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn crashes_restart_after_exponential_capped_delays() {
        let launcher = FakeLauncher {
            runs_for: Mutex::new(vec![Duration::from_millis(50)]),
            launches: Mutex::new(Vec::new()),
        };
        let (stop_tx, stop_rx) = watch::channel(None);
        let ctl = Control {
            stop: stop_rx,
            detach: CancellationToken::new(),
        };
        let log = Log::default();
        let t0 = Instant::now();
        let sup = supervise(&launcher, backoff(), Start::Fresh, ctl, &log);
        tokio::pin!(sup);
        // Let it run until the fifth process runs (1300..1350 ms), then stop.
        tokio::select! {
            _ = &mut sup => panic!("supervision ended by itself"),
            () = tokio::time::sleep(Duration::from_millis(1320)) => {}
        }
        stop_tx.send(Some(Duration::from_secs(1))).unwrap();
        assert_eq!(sup.await, Outcome::Stopped);
        let at: Vec<u128> = launcher
            .launches
            .lock()
            .unwrap()
            .iter()
            .map(|t| (*t - t0).as_millis())
            .collect();
        // run 50 ms, then wait 100, 200, 400, 400 (capped).
        assert_eq!(at, [0, 150, 400, 850, 1300]);
        let log = log.0.lock().unwrap();
        assert_eq!(log[0], "started restart=false");
        assert_eq!(log[1], "exited 1");
        assert_eq!(log[2], "backoff 100");
        assert_eq!(log[3], "started restart=true");
        assert_eq!(log.last().unwrap(), "stopped Some(143)");
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_run_resets_the_backoff_and_detach_lets_go() {
        let launcher = FakeLauncher {
            runs_for: Mutex::new(vec![
                Duration::from_millis(10),
                Duration::from_millis(10),
                Duration::from_secs(20),
                Duration::from_millis(10),
            ]),
            launches: Mutex::new(Vec::new()),
        };
        let (_stop_tx, stop_rx) = watch::channel(None);
        let detach = CancellationToken::new();
        let ctl = Control {
            stop: stop_rx,
            detach: detach.clone(),
        };
        let log = Log::default();
        let sup = supervise(
            &launcher,
            backoff(),
            Start::Ended(Exit::WhileDown),
            ctl,
            &log,
        );
        tokio::pin!(sup);
        tokio::select! {
            _ = &mut sup => panic!("ended by itself"),
            () = tokio::time::sleep(Duration::from_secs(25)) => {}
        }
        detach.cancel();
        assert_eq!(sup.await, Outcome::Detached);
        let backoffs: Vec<String> = log
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("backoff"))
            .cloned()
            .collect();
        // WhileDown counts as the first failure; then 2 short runs; then a
        // 20 s run resets the count.
        assert_eq!(
            backoffs[..4],
            ["backoff 100", "backoff 200", "backoff 400", "backoff 100"]
        );
        let log = log.0.lock().unwrap();
        assert_eq!(log[0], "exited -1");
        assert_eq!(
            log[2], "started restart=true",
            "replacing a dead process is a restart"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stop_during_backoff_launches_nothing_more() {
        let launcher = FakeLauncher {
            runs_for: Mutex::new(vec![Duration::from_millis(10)]),
            launches: Mutex::new(Vec::new()),
        };
        let (stop_tx, stop_rx) = watch::channel(None);
        let ctl = Control {
            stop: stop_rx,
            detach: CancellationToken::new(),
        };
        let log = Log::default();
        let sup = supervise(&launcher, backoff(), Start::Fresh, ctl, &log);
        tokio::pin!(sup);
        tokio::select! {
            _ = &mut sup => panic!("ended by itself"),
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        stop_tx.send(Some(Duration::ZERO)).unwrap();
        assert_eq!(sup.await, Outcome::Stopped);
        assert_eq!(launcher.launches.lock().unwrap().len(), 1);
        assert_eq!(log.0.lock().unwrap().last().unwrap(), "stopped None");
    }
}
