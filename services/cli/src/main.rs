//! The `ctrlplane` binary: parse, run, map errors to exit codes (0 success,
//! 1 failure, 2 usage error).

#![forbid(unsafe_code)]

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use ctrlplane_cli::{Cli, CliError};

fn main() -> ExitCode {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    // Exits with 2 (and the usage) on a bad command line, 0 for --help.
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut out = std::io::stdout().lock();
    let result = runtime
        .block_on(ctrlplane_cli::run(cli, &mut out))
        .and_then(|()| out.flush().map_err(CliError::from));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
