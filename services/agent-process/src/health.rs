//! Health checks (HTTP, TCP, command) that drive a replica's `ready`.
//!
//! A replica without a health check is ready while its process runs. With
//! one, it becomes ready on the first passing probe and unready after
//! `retries` consecutive failures. Until the first pass, probes run at
//! most every [`STARTUP_PROBE`] (whatever the interval), so a fresh replica
//! is reported ready promptly; afterwards they run at the interval.

use std::path::PathBuf;
use std::time::Duration;

use ctrlplane_proto::provider::v1 as pb;
use tokio_util::sync::CancellationToken;

use crate::model::PortAlloc;
use crate::ports;
use crate::process::{Exit, Processes};

/// Longest pause between probes before the first pass.
pub const STARTUP_PROBE: Duration = Duration::from_millis(250);

/// What a probe does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// `GET path` on a host port; 2xx and 3xx pass.
    Http {
        /// Host port.
        port: i32,
        /// Request path.
        path: String,
    },
    /// A TCP connect to a host port.
    Tcp {
        /// Host port.
        port: i32,
    },
    /// A command run in the service's environment; exit 0 passes.
    Command {
        /// Program and arguments.
        argv: Vec<String>,
    },
}

/// A probe with its timing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The probe.
    pub probe: Probe,
    /// Time between probes.
    pub interval: Duration,
    /// Time one probe may take.
    pub timeout: Duration,
    /// Consecutive failures before unready.
    pub retries: u32,
}

fn duration(d: &Option<ctrlplane_proto::pbjson_types::Duration>, default: Duration) -> Duration {
    match d {
        Some(d) if d.seconds > 0 || d.nanos > 0 => {
            Duration::new(d.seconds.max(0) as u64, d.nanos.max(0) as u32)
        }
        _ => default,
    }
}

/// The plan for a spec's health check, with its port mapped to the
/// replica's host port; `None` when the spec has no check.
pub fn plan(check: Option<&pb::HealthCheckSpec>, allocs: &[PortAlloc]) -> Option<Plan> {
    let check = check?;
    let kind = match pb::HealthCheckType::try_from(check.r#type) {
        Ok(pb::HealthCheckType::Unspecified) | Err(_) => {
            if !check.path.is_empty() {
                pb::HealthCheckType::Http
            } else if !check.command.is_empty() {
                pb::HealthCheckType::Command
            } else {
                pb::HealthCheckType::Tcp
            }
        }
        Ok(k) => k,
    };
    let port = ports::host_port(allocs, check.port);
    let probe = match kind {
        pb::HealthCheckType::Http => Probe::Http {
            port,
            path: if check.path.is_empty() {
                "/".to_string()
            } else {
                check.path.clone()
            },
        },
        pb::HealthCheckType::Command => Probe::Command {
            argv: check.command.clone(),
        },
        _ => Probe::Tcp { port },
    };
    Some(Plan {
        probe,
        interval: duration(&check.interval, Duration::from_secs(10)),
        timeout: duration(&check.timeout, Duration::from_secs(2)),
        retries: if check.retries > 0 {
            check.retries as u32
        } else {
            3
        },
    })
}

/// Where and how a command probe runs.
#[derive(Debug, Clone)]
pub struct CommandContext {
    /// Working directory.
    pub cwd: PathBuf,
    /// Full environment.
    pub env: Vec<(String, String)>,
}

/// Runs one probe; true if it passed within the timeout.
pub async fn probe_once(plan: &Plan, ctx: &CommandContext, procs: &Processes) -> bool {
    let run = async {
        match &plan.probe {
            Probe::Tcp { port } => {
                tokio::net::TcpStream::connect((ports::ENDPOINT_HOST, *port as u16))
                    .await
                    .is_ok()
            }
            Probe::Http { port, path } => {
                ctrlplane_agent::workload::http_ok(
                    ports::ENDPOINT_HOST,
                    *port as u16,
                    path,
                    plan.timeout,
                )
                .await
            }
            Probe::Command { argv } => run_command(argv, ctx, procs, plan.timeout).await,
        }
    };
    tokio::time::timeout(plan.timeout, run)
        .await
        .unwrap_or(false)
}

async fn run_command(
    argv: &[String],
    ctx: &CommandContext,
    procs: &Processes,
    timeout: Duration,
) -> bool {
    let Some(program) = argv.first() else {
        return false;
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&ctx.cwd)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let Ok((mut child, proc)) = procs.spawn(&mut cmd) else {
        return false;
    };
    let ok = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) => Exit::from_status(status).success(),
        _ => {
            crate::process::signal_group(&proc, nix::sys::signal::Signal::SIGKILL);
            let _ = child.wait().await;
            false
        }
    };
    procs.forget(&proc);
    ok
}

/// Probes until `cancel` fires, reporting readiness changes to `set_ready`.
pub async fn run(
    plan: Plan,
    ctx: CommandContext,
    procs: std::sync::Arc<Processes>,
    cancel: CancellationToken,
    set_ready: impl Fn(bool) + Send,
) {
    let mut passed_once = false;
    let mut failures = 0u32;
    loop {
        let ok = tokio::select! {
            () = cancel.cancelled() => return,
            ok = probe_once(&plan, &ctx, &procs) => ok,
        };
        if ok {
            failures = 0;
            passed_once = true;
            set_ready(true);
        } else {
            failures += 1;
            if failures >= plan.retries {
                set_ready(false);
            }
        }
        let pause = if passed_once {
            plan.interval
        } else {
            plan.interval.min(STARTUP_PROBE)
        };
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn allocs() -> Vec<PortAlloc> {
        vec![PortAlloc {
            container: 8080,
            host: 31000,
            protocol: 1,
            name: String::new(),
        }]
    }

    #[test]
    fn plans_map_ports_and_infer_types() {
        let check = pb::HealthCheckSpec {
            path: "/healthz".to_string(),
            port: 8080,
            ..Default::default()
        };
        let p = plan(Some(&check), &allocs()).unwrap();
        assert_eq!(
            p.probe,
            Probe::Http {
                port: 31000,
                path: "/healthz".to_string()
            }
        );
        assert_eq!(p.interval, Duration::from_secs(10));
        assert_eq!(p.retries, 3);
        let tcp = pb::HealthCheckSpec {
            port: 9,
            r#type: pb::HealthCheckType::Tcp as i32,
            ..Default::default()
        };
        assert_eq!(
            plan(Some(&tcp), &allocs()).unwrap().probe,
            Probe::Tcp { port: 9 }
        );
        assert!(plan(None, &allocs()).is_none());
    }

    #[tokio::test]
    async fn probes_pass_and_fail() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port() as i32;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        });
        let procs = Processes::default();
        let ctx = CommandContext {
            cwd: std::env::temp_dir(),
            env: vec![(
                "PATH".to_string(),
                std::env::var("PATH").unwrap_or_default(),
            )],
        };
        let mk = |probe| Plan {
            probe,
            interval: Duration::from_secs(1),
            timeout: Duration::from_secs(10),
            retries: 1,
        };
        let http = mk(Probe::Http {
            port,
            path: "/".to_string(),
        });
        assert!(probe_once(&http, &ctx, &procs).await);
        assert!(probe_once(&mk(Probe::Tcp { port }), &ctx, &procs).await);
        let ok = mk(Probe::Command {
            argv: vec!["true".to_string()],
        });
        assert!(probe_once(&ok, &ctx, &procs).await);
        let bad = mk(Probe::Command {
            argv: vec!["false".to_string()],
        });
        assert!(!probe_once(&bad, &ctx, &procs).await);
        assert!(procs.is_empty(), "probe processes are forgotten");
    }
}
