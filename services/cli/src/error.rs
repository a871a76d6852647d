//! The CLI's one error type and how it is shown to the user.
//!
//! Every command returns [`CliError`]; `main` prints it as `error: …` on
//! stderr and exits with [`CliError::exit_code`]. A failed gRPC call keeps
//! its [`tonic::Status`] so that the canonical code, the message and every
//! `google.rpc.BadRequest` field violation reach the user, one per line.

use std::fmt;

use tonic::Code;
use tonic_types::StatusExt;

/// Anything that makes a command fail.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The command line is inconsistent in a way clap cannot check
    /// (e.g. `update` without anything to change). Exit code 2, like clap's
    /// own usage errors.
    #[error("{0}")]
    Usage(String),
    /// Local configuration is missing or bad: token, secret, config file,
    /// address.
    #[error("{0}")]
    Config(String),
    /// An input file could not be read or parsed.
    #[error("{path}: {message}")]
    Input {
        /// The file as the user named it (`-` is stdin).
        path: String,
        /// What is wrong with it.
        message: String,
    },
    /// A gRPC call failed (including "could not connect").
    #[error("{}", RpcDisplay { status, service, addr })]
    Rpc {
        /// The status the call ended with.
        status: tonic::Status,
        /// Which service was called, e.g. `datacenter`.
        service: &'static str,
        /// The address it was called at.
        addr: String,
    },
    /// A health check found the service not serving (or could not ask it).
    #[error("{0}")]
    Unhealthy(String),
    /// Writing the output failed.
    #[error("cannot write output: {0}")]
    Io(#[from] std::io::Error),
}

impl CliError {
    /// The process exit code for this error: 2 for usage errors, 1 for
    /// everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// The reader of our output went away (`ctrlplane dc list | head`): not
    /// worth an error message.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, CliError::Io(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }
}

/// The canonical upper-case name of a gRPC code (`INVALID_ARGUMENT`), as
/// grpcurl and the gRPC docs spell it. tonic's `Display` gives a sentence
/// instead.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Renders a failed call: `CODE: message`, then one `  - field: description`
/// line per field violation, then a hint for the codes a user can act on.
struct RpcDisplay<'a> {
    status: &'a tonic::Status,
    service: &'a str,
    addr: &'a str,
}

impl fmt::Display for RpcDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = self.status;
        write!(f, "{}: {}", code_name(status.code()), status.message())?;
        // tonic keeps the cause of a transport failure (e.g. "Connection
        // refused") out of the message; show the chain.
        let mut source = std::error::Error::source(status);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !text.is_empty() && !status.message().contains(&text) {
                write!(f, ": {text}")?;
            }
            source = cause.source();
        }
        if let Some(bad) = status.get_details_bad_request() {
            for v in &bad.field_violations {
                write!(f, "\n  - {}: {}", v.field, v.description)?;
            }
        }
        match status.code() {
            // A status the server sent has no source; one tonic made up
            // because the connection failed has the transport error.
            Code::Unavailable if std::error::Error::source(status).is_some() => {
                write!(
                    f,
                    "\nhint: is the {} service running at {}? (see --help for how to set its address)",
                    self.service, self.addr
                )?;
            }
            Code::FailedPrecondition => {
                if let Some(provider) = unregistered_provider(status.message()) {
                    write!(
                        f,
                        "\nhint: mint a join token with `ctrlplane agents token --provider {provider}` \
                         and start the provider's agent with it ({}); \
                         `ctrlplane agents list` shows the agents that joined",
                        ctrlplane_runtime::config::JOIN_TOKEN
                    )?;
                }
            }
            Code::Unauthenticated => {
                write!(
                    f,
                    "\nhint: the token was refused; mint a fresh one with `ctrlplane token` \
                     using the same secret as the services"
                )?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// The provider named by the datacenter service's refusal to use a
/// provider no agent has joined for (`no agent has registered for provider
/// "nomad": …`).
fn unregistered_provider(message: &str) -> Option<&str> {
    let rest = message.strip_prefix("no agent has registered for provider \"")?;
    rest.split('"').next().filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    fn rpc(status: tonic::Status) -> CliError {
        CliError::Rpc {
            status,
            service: "datacenter",
            addr: "http://127.0.0.1:7100".to_string(),
        }
    }

    #[test]
    fn field_violations_are_listed_one_per_line() {
        let mut details = ErrorDetails::new();
        details
            .add_bad_request_violation("datacenter.name", "must not be empty")
            .add_bad_request_violation("datacenter.provider_name", "unknown provider \"x\"");
        let status =
            tonic::Status::with_error_details(Code::InvalidArgument, "invalid datacenter", details);
        assert_eq!(
            rpc(status).to_string(),
            "INVALID_ARGUMENT: invalid datacenter\n  - datacenter.name: must not be empty\n  \
             - datacenter.provider_name: unknown provider \"x\""
        );
    }

    #[tokio::test]
    async fn connection_failures_name_the_service_and_address() {
        // Port 1 on loopback: nothing listens there, the connect is refused.
        let ch = ctrlplane_runtime::client::authed_channel(
            "127.0.0.1:1",
            ctrlplane_runtime::client::BearerInterceptor::fixed("t").unwrap(),
        )
        .unwrap();
        let mut client = ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient::new(ch);
        let status = client
            .get_datacenter(ctrlplane_proto::datacenter::v1::GetDatacenterRequest::default())
            .await
            .unwrap_err();
        let err = rpc(status).to_string();
        assert!(err.starts_with("UNAVAILABLE: "), "{err}");
        assert!(
            err.contains("\nhint: is the datacenter service running at http://127.0.0.1:7100?"),
            "{err}"
        );
    }

    #[test]
    fn server_statuses_get_no_connection_hint() {
        let err = rpc(tonic::Status::unavailable(
            "no healthy agent for provider \"docker\"",
        ))
        .to_string();
        assert_eq!(err, "UNAVAILABLE: no healthy agent for provider \"docker\"");
        assert_eq!(
            rpc(tonic::Status::not_found("datacenter dc_x not found")).to_string(),
            "NOT_FOUND: datacenter dc_x not found"
        );
        assert!(
            rpc(tonic::Status::unauthenticated("token expired"))
                .to_string()
                .contains("ctrlplane token")
        );
    }

    #[test]
    fn unregistered_providers_get_a_join_hint() {
        let err = rpc(tonic::Status::failed_precondition(
            "no agent has registered for provider \"nomad\": start one with a join token \
             (CreateJoinToken) before creating datacenters on it",
        ))
        .to_string();
        assert!(
            err.starts_with(
                "FAILED_PRECONDITION: no agent has registered for provider \"nomad\": "
            ),
            "{err}"
        );
        assert!(
            err.contains(
                "\nhint: mint a join token with `ctrlplane agents token --provider nomad` \
                          and start the provider's agent with it (CP_JOIN_TOKEN)"
            ),
            "{err}"
        );
        // Other failed preconditions get no hint.
        assert_eq!(
            rpc(tonic::Status::failed_precondition(
                "cannot move draining → maintenance"
            ))
            .to_string(),
            "FAILED_PRECONDITION: cannot move draining → maintenance"
        );
    }

    #[test]
    fn exit_codes() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
        assert_eq!(CliError::Config("x".into()).exit_code(), 1);
        assert_eq!(rpc(tonic::Status::internal("x")).exit_code(), 1);
        let pipe = CliError::Io(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
        assert!(pipe.is_broken_pipe());
    }
}
