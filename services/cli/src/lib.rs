//! The `ctrlplane` command-line client.
//!
//! `main.rs` only parses the command line, runs [`run`] on a current-thread
//! runtime and maps errors to exit codes; everything else lives here so that
//! it can be unit-tested:
//!
//! - [`cli`]: the command tree and the global options;
//! - [`context`]: addresses, token and config file resolution, and the gRPC
//!   clients every server-facing command gets from it;
//! - [`cmd`]: the commands (`token`, `datacenter`, `agents`, `bootstrap`,
//!   `workers`, `events`, `up`, `health`);
//! - [`input`]: `KEY=VALUE` flags and proto-JSON input files;
//! - [`output`]: tables, `Key: value` views, proto JSON;
//! - [`error`]: the error type and how failures (gRPC statuses with their
//!   field violations included) are shown.

#![forbid(unsafe_code)]

pub mod cli;
pub mod cmd;
pub mod context;
pub mod error;
pub mod input;
pub mod output;

use std::io::Write;

pub use cli::Cli;
pub use error::CliError;

use crate::cli::Command;
use crate::context::Context;

/// Runs a parsed command line, writing results to `out`.
///
/// The config file is read and the token required only by commands that
/// talk to a service.
///
/// # Errors
/// Whatever the command fails with; see [`CliError::exit_code`].
pub async fn run(cli: Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match cli.command {
        Command::Token(args) => cmd::token::run(&args, out),
        Command::Datacenter(args) => {
            let ctx = Context::from_global(&cli.global)?;
            cmd::datacenter::run(&ctx, args, cli.global.output, out).await
        }
        Command::Agents(args) => {
            let ctx = Context::from_global(&cli.global)?;
            let mut err = std::io::stderr().lock();
            cmd::agents::run(&ctx, args, cli.global.output, out, &mut err).await
        }
        Command::Bootstrap(args) => {
            let ctx = Context::from_global(&cli.global)?;
            cmd::bootstrap::run(&ctx, args, cli.global.output, out).await
        }
        Command::Workers(args) => {
            let ctx = Context::from_global(&cli.global)?;
            cmd::workers::run(&ctx, args, cli.global.output, out).await
        }
        Command::Events(args) => {
            let ctx = Context::from_global(&cli.global)?;
            cmd::events::run(&ctx, args, cli.global.output, out).await
        }
        Command::Up(args) => cmd::up::run(&cli.global, args, out).await,
        Command::Health(args) => cmd::health::run(&args, cli.global.timeout, out).await,
    }
}
