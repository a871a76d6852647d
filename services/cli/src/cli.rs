//! The command tree: global options and the top-level commands.
//!
//! Each command's own arguments live next to its code in [`crate::cmd`].
//! Global options may be given before or after the subcommand.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use ctrlplane_runtime::config::{BOOTSTRAP_ADDR, DATACENTER_ADDR, SCHEDULER_ADDR};

use crate::cmd::agents::AgentsArgs;
use crate::cmd::bootstrap::BootstrapArgs;
use crate::cmd::datacenter::DatacenterArgs;
use crate::cmd::events::EventsArgs;
use crate::cmd::health::HealthArgs;
use crate::cmd::token::TokenArgs;
use crate::cmd::up::UpArgs;
use crate::cmd::workers::WorkersArgs;
use crate::output::OutputFormat;

/// Environment variable holding the bearer token.
pub const TOKEN_ENV: &str = "CP_TOKEN";
/// Environment variable naming the config file.
pub const CONFIG_ENV: &str = "CP_CONFIG";

const AFTER_HELP: &str = "\
Settings are taken from the flag, else the environment variable, else the config file, else the default.
The config file is JSON: {\"datacenter_addr\": \"…\", \"bootstrap_addr\": \"…\", \"scheduler_addr\": \"…\", \"token\": \"…\"}

Getting started (everything on this machine):
  ctrlplane up --demo
  ctrlplane dc list

Or against services you run yourself:
  export CP_TOKEN=$(ctrlplane token --secret-file secret.txt --role system:admin)
  CP_JOIN_TOKEN=$(ctrlplane agents token --provider process) ctrlplane-agent-process &
  ctrlplane agents list
  ctrlplane dc create --name \"Berlin 1\" --provider process --region eu-central
  ctrlplane dc list";

/// Command-line client of the ctrlplane control plane.
#[derive(Debug, Parser)]
#[command(name = "ctrlplane", version, propagate_version = true, after_help = AFTER_HELP)]
pub struct Cli {
    /// Options every command understands.
    #[command(flatten)]
    pub global: GlobalOpts,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command understands.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Global options")]
pub struct GlobalOpts {
    /// Address of the datacenter service (and its agent registry) [default: http://127.0.0.1:7100]
    #[arg(long, global = true, env = DATACENTER_ADDR, value_name = "ADDR")]
    pub endpoint: Option<String>,

    /// Address of the bootstrap service [default: http://127.0.0.1:7200]
    #[arg(long, global = true, env = BOOTSTRAP_ADDR, value_name = "ADDR", hide_short_help = true)]
    pub bootstrap_addr: Option<String>,

    /// Address of the scheduler service [default: http://127.0.0.1:7300]
    #[arg(long, global = true, env = SCHEDULER_ADDR, value_name = "ADDR", hide_short_help = true)]
    pub scheduler_addr: Option<String>,

    /// Bearer token for the services (mint one with `ctrlplane token`)
    #[arg(long, global = true, env = TOKEN_ENV, hide_env_values = true, value_name = "TOKEN")]
    pub token: Option<String>,

    /// Config file [default: $XDG_CONFIG_HOME/ctrlplane/config.json or ~/.config/ctrlplane/config.json]
    #[arg(long, global = true, env = CONFIG_ENV, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Output format
    #[arg(short, long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// Deadline of each call to a service (e.g. 500ms, 10s, 1m)
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s",
          value_parser = crate::input::parse_positive_duration)]
    pub timeout: Duration,
}

/// Top-level commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Mint a bearer token (JWT) from the services' shared secret
    Token(TokenArgs),
    /// Manage datacenters: deployment locations, each backed by one provider
    #[command(visible_alias = "dc")]
    Datacenter(DatacenterArgs),
    /// Manage provider agents: join tokens, registered agents, health checks
    #[command(visible_alias = "agent")]
    Agents(AgentsArgs),
    /// Bootstrap workloads: list, get, plan (dry run), retry
    #[command(visible_alias = "bs")]
    Bootstrap(BootstrapArgs),
    /// The scheduler's workers: list, run now
    #[command(visible_alias = "worker")]
    Workers(WorkersArgs),
    /// Stream bootstrap events
    Events(EventsArgs),
    /// Run the whole control plane on this machine (SQLite, process agent) until Ctrl-C
    Up(UpArgs),
    /// Check a service's gRPC health (exit 0 iff SERVING); needs no token
    Health(HealthArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_tree_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = Cli::try_parse_from(["ctrlplane", "-o", "json", "dc", "list", "--timeout", "5s"])
            .unwrap();
        assert_eq!(cli.global.output, OutputFormat::Json);
        assert_eq!(cli.global.timeout, Duration::from_secs(5));
        let cli =
            Cli::try_parse_from(["ctrlplane", "datacenter", "get", "dc_1", "-o", "json"]).unwrap();
        assert_eq!(cli.global.output, OutputFormat::Json);
    }

    #[test]
    fn usage_errors_are_exit_code_2() {
        let err = Cli::try_parse_from(["ctrlplane", "dc", "list", "--timeout", "0s"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let err = Cli::try_parse_from(["ctrlplane", "dc", "create", "--name", "x"]).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        let err = Cli::try_parse_from([
            "ctrlplane",
            "dc",
            "create",
            "--name",
            "x",
            "--provider",
            "p",
            "--label",
            "oops",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("expected KEY=VALUE"), "{err}");
    }
}
