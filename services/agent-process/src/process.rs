//! OS processes: spawning into a process group of their own, tracking every
//! group the agent is responsible for, signalling groups, and waiting for a
//! process the agent started or re-adopted.
//!
//! Invariants:
//! - every process the agent starts leads a new process group
//!   (`process_group(0)`), so one `killpg` reaches it and its children;
//! - every spawn goes through [`Processes::spawn`], which records the group
//!   under the same lock that [`Processes::halt`] takes: once halted, no
//!   process can be started any more and every recorded group has been
//!   killed — nothing is left behind (tests rely on this);
//! - a group is signalled through its leader only while the leader is
//!   verifiably the process that was started (pid and start time match);
//!   afterwards only members started no earlier than the leader are
//!   signalled one by one, so a recycled pid is never hit.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

use crate::model::{ProcRef, now_ms};
use crate::procfs;

/// How often a re-adopted process (not our child, so not waitable) is
/// checked for liveness.
pub const ADOPTED_POLL: Duration = Duration::from_millis(200);

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
    /// Ended while watched by /proc polling (re-adopted), so the status is
    /// unknown.
    Unknown,
    /// Was gone when the agent started: it ended while the agent was down.
    WhileDown,
}

impl Exit {
    /// Exit code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }

    /// A shell-style code: the exit code, 128 + signal, or -1 if unknown.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
            Exit::Unknown | Exit::WhileDown => -1,
        }
    }

    /// From a std exit status.
    pub fn from_status(status: std::process::ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (status.code(), status.signal()) {
            (Some(c), _) => Exit::Code(c),
            (None, Some(s)) => Exit::Signal(s),
            (None, None) => Exit::Unknown,
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with code {c}"),
            Exit::Signal(s) => match Signal::try_from(*s) {
                Ok(sig) => write!(f, "was killed by signal {s} ({sig})"),
                Err(_) => write!(f, "was killed by signal {s}"),
            },
            Exit::Unknown => {
                f.write_str("exited (status unknown: re-adopted after an agent restart)")
            }
            Exit::WhileDown => f.write_str("ended while the agent was down"),
        }
    }
}

#[derive(Debug, Default)]
struct Registry {
    halted: bool,
    live: HashMap<i32, ProcRef>,
}

/// Every process group the agent is responsible for.
#[derive(Debug, Default)]
pub struct Processes {
    inner: Mutex<Registry>,
}

/// Why a process could not be started.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The agent is shutting down or was halted.
    #[error("the agent is shutting down")]
    Halted,
    /// The OS refused.
    #[error("cannot start {program:?}: {source}")]
    Io {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
}

impl Processes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Spawns `cmd` as the leader of a new process group and records it.
    ///
    /// # Errors
    /// [`SpawnError`].
    pub fn spawn(
        &self,
        cmd: &mut tokio::process::Command,
    ) -> Result<(tokio::process::Child, ProcRef), SpawnError> {
        let mut reg = self.lock();
        if reg.halted {
            return Err(SpawnError::Halted);
        }
        cmd.process_group(0);
        let program = cmd.as_std().get_program().to_string_lossy().into_owned();
        let child = cmd
            .spawn()
            .map_err(|source| SpawnError::Io { program, source })?;
        // The child is not reaped before we wait for it, so its stat is
        // there even if it has already exited.
        let pid = child.id().map_or(0, |p| p as i32);
        let start_ticks = procfs::stat(pid).map_or(0, |s| s.start_ticks);
        let proc = ProcRef {
            pid,
            start_ticks,
            started_at_ms: now_ms(),
        };
        reg.live.insert(pid, proc);
        Ok((child, proc))
    }

    /// Records a re-adopted group; false once halted.
    pub fn adopt(&self, proc: ProcRef) -> bool {
        let mut reg = self.lock();
        if reg.halted {
            return false;
        }
        reg.live.insert(proc.pid, proc);
        true
    }

    /// Forgets a group that has ended.
    pub fn forget(&self, proc: &ProcRef) {
        let mut reg = self.lock();
        if reg.live.get(&proc.pid) == Some(proc) {
            reg.live.remove(&proc.pid);
        }
    }

    /// Whether [`Processes::halt`] was called.
    pub fn halted(&self) -> bool {
        self.lock().halted
    }

    /// Refuses every further spawn and SIGKILLs every recorded group.
    pub fn halt(&self) {
        let mut reg = self.lock();
        reg.halted = true;
        for proc in reg.live.values() {
            signal_group(proc, Signal::SIGKILL);
        }
        reg.live.clear();
    }

    /// Number of recorded groups.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether no group is recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sends `sig` to the group `proc` leads; see the module invariants.
/// Returns whether any process was signalled.
pub fn signal_group(proc: &ProcRef, sig: Signal) -> bool {
    if proc.pid <= 1 {
        return false;
    }
    if procfs::alive(proc.pid, proc.start_ticks) {
        return killpg(Pid::from_raw(proc.pid), sig).is_ok();
    }
    let mut any = false;
    for member in procfs::group_members(proc.pid) {
        if member.start_ticks >= proc.start_ticks {
            any |= kill(Pid::from_raw(member.pid), sig).is_ok();
        }
    }
    any
}

/// Whether anything of the group `proc` leads still runs.
pub fn group_alive(proc: &ProcRef) -> bool {
    procfs::alive(proc.pid, proc.start_ticks)
        || procfs::group_members(proc.pid)
            .iter()
            .any(|m| m.start_ticks >= proc.start_ticks)
}

/// A running process group the agent supervises.
#[derive(Debug)]
pub enum OsProc {
    /// Started by this agent: waitable.
    Child(tokio::process::Child, ProcRef),
    /// Found alive after an agent restart: watched through /proc.
    Adopted(ProcRef),
}

impl OsProc {
    /// The group.
    pub fn proc_ref(&self) -> ProcRef {
        match self {
            OsProc::Child(_, p) | OsProc::Adopted(p) => *p,
        }
    }

    /// Waits for the leader to end. Cancel-safe.
    pub async fn wait(&mut self) -> Exit {
        match self {
            OsProc::Child(child, _) => match child.wait().await {
                Ok(status) => Exit::from_status(status),
                Err(_) => Exit::Unknown,
            },
            OsProc::Adopted(p) => {
                while procfs::alive(p.pid, p.start_ticks) {
                    tokio::time::sleep(ADOPTED_POLL).await;
                }
                Exit::Unknown
            }
        }
    }
}

/// Stops a group: SIGTERM, then SIGKILL once `grace` has passed, then
/// SIGKILL for any member left behind by the leader. Waits for the leader
/// through `wait` and returns how it ended.
pub async fn terminate<F>(proc: &ProcRef, grace: Duration, wait: F) -> Exit
where
    F: std::future::Future<Output = Exit>,
{
    tokio::pin!(wait);
    signal_group(proc, Signal::SIGTERM);
    let exit = match tokio::time::timeout(grace, &mut wait).await {
        Ok(exit) => exit,
        Err(_) => {
            signal_group(proc, Signal::SIGKILL);
            wait.await
        }
    };
    signal_group(proc, Signal::SIGKILL);
    exit
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn spawned_groups_are_tracked_and_halt_kills_them() {
        let procs = Processes::default();
        let mut cmd = tokio::process::Command::new("sleep");
        cmd.arg("30");
        let (mut child, p) = procs.spawn(&mut cmd).unwrap();
        assert!(p.pid > 0 && p.start_ticks > 0);
        assert_eq!(procfs::stat(p.pid).unwrap().pgrp, p.pid, "own group");
        assert!(group_alive(&p));
        procs.halt();
        let status = child.wait().await.unwrap();
        assert_eq!(Exit::from_status(status), Exit::Signal(9));
        assert!(matches!(
            procs.spawn(&mut tokio::process::Command::new("true")),
            Err(SpawnError::Halted)
        ));
    }

    #[tokio::test]
    async fn terminate_escalates_to_sigkill() {
        let procs = Processes::default();
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "trap '' TERM; sleep 30 & wait"]);
        let (mut child, p) = procs.spawn(&mut cmd).unwrap();
        // Let the shell install its trap.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while procfs::group_members(p.pid).len() < 2 && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let exit = terminate(&p, Duration::from_millis(300), async {
            Exit::from_status(child.wait().await.unwrap())
        })
        .await;
        assert_eq!(exit, Exit::Signal(9));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while group_alive(&p) && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!group_alive(&p), "the sleep child is gone too");
    }

    #[test]
    fn exits_describe_themselves() {
        assert_eq!(Exit::Code(3).to_string(), "exited with code 3");
        assert!(Exit::Signal(9).to_string().contains("SIGKILL"));
        assert_eq!(Exit::Signal(15).code(), 143);
        assert!(Exit::Code(0).success());
    }
}
