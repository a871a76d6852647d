//! `ctrlplane health ADDR`: ask a service's `grpc.health.v1.Health/Check`.
//!
//! Exit 0 iff the answer is `SERVING`; anything else (`NOT_SERVING`, an
//! unknown service name, nothing listening, a deadline) is an error naming
//! the address and what was seen. No token is needed (health is open), so it
//! works as a container health check: the images are `FROM scratch`, with
//! no shell and no curl, and `ctrlplane health 127.0.0.1:7100` is the probe.

use std::io::Write;
use std::time::Duration;

use clap::Args;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::error::{CliError, code_name};

const AFTER_HELP: &str = "\
Examples:
  ctrlplane health 127.0.0.1:7100
  ctrlplane health http://bootstrap:7200 --timeout 3s
  ctrlplane health localhost:7300 --service ctrlplane.scheduler.v1.SchedulerService

Exit status: 0 when the service answers SERVING, 1 otherwise (the reason is printed).";

/// Arguments of `ctrlplane health`.
#[derive(Debug, Clone, Args)]
#[command(after_help = AFTER_HELP)]
pub struct HealthArgs {
    /// The server to ask: host:port or http://host:port
    #[arg(value_name = "ADDR")]
    pub addr: String,

    /// The service to ask about; empty (the default) is the whole server
    #[arg(
        long,
        default_value = "",
        hide_default_value = true,
        value_name = "NAME"
    )]
    pub service: String,
}

/// What a health check found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The server answered `SERVING`.
    Serving,
    /// The server answered with another status (`NOT_SERVING`, `UNKNOWN`, …).
    NotServing(String),
}

/// Calls `Health/Check` on `addr` for `service`, within `timeout`.
///
/// # Errors
/// A bad address, a failed call (nothing listening, the deadline, an
/// unknown service name: `NOT_FOUND`), shown with the address.
pub async fn check(addr: &str, service: &str, timeout: Duration) -> Result<Health, CliError> {
    let url = ctrlplane_runtime::client::normalize_addr(addr);
    let channel = ctrlplane_runtime::client::channel(addr)
        .map_err(|e| CliError::Config(format!("bad address: {e}")))?;
    let mut client = HealthClient::new(channel);
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: service.to_string(),
    });
    req.set_timeout(timeout);
    let what = if service.is_empty() {
        String::new()
    } else {
        format!(" (service {service:?})")
    };
    let answer = match tokio::time::timeout(timeout, client.check(req)).await {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(status)) => {
            let mut msg = format!(
                "health check of {url}{what} failed: {}: {}",
                code_name(status.code()),
                status.message()
            );
            // A transport failure keeps its cause ("Connection refused")
            // out of the message.
            let mut source = std::error::Error::source(&status);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !text.is_empty() && !msg.contains(&text) {
                    msg.push_str(": ");
                    msg.push_str(&text);
                }
                source = cause.source();
            }
            return Err(CliError::Unhealthy(msg));
        }
        Err(_) => {
            return Err(CliError::Unhealthy(format!(
                "health check of {url}{what} failed: no answer within {timeout:?}"
            )));
        }
    };
    match ServingStatus::try_from(answer.status) {
        Ok(ServingStatus::Serving) => Ok(Health::Serving),
        Ok(other) => Ok(Health::NotServing(other.as_str_name().to_string())),
        Err(_) => Ok(Health::NotServing(format!("status {}", answer.status))),
    }
}

/// Runs `ctrlplane health`: prints `SERVING` and succeeds, or fails with
/// what the server said.
///
/// # Errors
/// As [`check`], and [`CliError::Unhealthy`] for any answer but `SERVING`.
pub async fn run(
    args: &HealthArgs,
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match check(&args.addr, &args.service, timeout).await? {
        Health::Serving => {
            writeln!(out, "SERVING")?;
            Ok(())
        }
        Health::NotServing(status) => {
            let url = ctrlplane_runtime::client::normalize_addr(&args.addr);
            let what = if args.service.is_empty() {
                String::new()
            } else {
                format!(" (service {:?})", args.service)
            };
            Err(CliError::Unhealthy(format!("{url}{what} is {status}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use tonic_health::server::health_reporter;

    fn parse(args: &[&str]) -> (HealthArgs, Duration) {
        let argv = ["ctrlplane", "health"].iter().chain(args).copied();
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        match cli.command {
            crate::cli::Command::Health(h) => (h, cli.global.timeout),
            other => panic!("parsed {other:?}"),
        }
    }

    /// A health server on a free loopback port; the reporter sets its
    /// status. Stops when the test's runtime ends.
    async fn server() -> (tonic_health::server::HealthReporter, String) {
        let (reporter, service) = health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(incoming),
        );
        (reporter, addr)
    }

    #[test]
    fn arguments() {
        let (args, timeout) = parse(&["127.0.0.1:7100", "--timeout", "3s"]);
        assert_eq!(args.addr, "127.0.0.1:7100");
        assert_eq!(args.service, "");
        assert_eq!(timeout, Duration::from_secs(3));
        let (args, _) = parse(&["http://bootstrap:7200", "--service", "x.y.Z"]);
        assert_eq!(args.service, "x.y.Z");
        assert!(crate::cli::Cli::try_parse_from(["ctrlplane", "health"]).is_err());
    }

    #[tokio::test]
    async fn serving_succeeds_and_anything_else_fails_with_the_reason() {
        let (reporter, addr) = server().await;
        let t = Duration::from_secs(5);
        let args = HealthArgs {
            addr: addr.clone(),
            service: String::new(),
        };
        let mut out = Vec::new();
        run(&args, t, &mut out).await.unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "SERVING\n");

        // A service the server reports on.
        reporter
            .set_service_status("a.B", tonic_health::ServingStatus::NotServing)
            .await;
        let args = HealthArgs {
            addr: format!("http://{addr}"),
            service: "a.B".to_string(),
        };
        let err = run(&args, t, &mut Vec::new())
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!("http://{addr} (service \"a.B\") is NOT_SERVING")
        );
        reporter
            .set_service_status("a.B", tonic_health::ServingStatus::Serving)
            .await;
        run(&args, t, &mut Vec::new()).await.unwrap();

        // A service it does not know.
        let args = HealthArgs {
            addr: addr.clone(),
            service: "no.Such".to_string(),
        };
        let err = run(&args, t, &mut Vec::new()).await.unwrap_err();
        assert_eq!(err.exit_code(), 1);
        let err = err.to_string();
        assert!(
            err.starts_with(&format!(
                "health check of http://{addr} (service \"no.Such\") failed: NOT_FOUND"
            )),
            "{err}"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_an_error_naming_the_address() {
        // Port 1 on loopback: nothing listens there, the connect is refused.
        let args = HealthArgs {
            addr: "127.0.0.1:1".to_string(),
            service: String::new(),
        };
        let err = run(&args, Duration::from_secs(5), &mut Vec::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("health check of http://127.0.0.1:1 failed: UNAVAILABLE"),
            "{err}"
        );

        let args = HealthArgs {
            addr: "not a uri".to_string(),
            service: String::new(),
        };
        let err = run(&args, Duration::from_secs(5), &mut Vec::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("bad address: "), "{err}");
    }
}
