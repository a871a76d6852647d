//! `ctrlplane-agent-docker`: reads configuration, sets up tracing, and runs
//! the Docker agent until SIGTERM or Ctrl-C — joining the control plane
//! first when configured to. Exits non-zero with the reason when joining is
//! refused or the control plane revokes the agent.

#![forbid(unsafe_code)]

use ctrlplane_runtime::config::{LogConfig, Settings, help_text};
use ctrlplane_runtime::{server, telemetry};

#[tokio::main]
async fn main() {
    if let Err(e) = run().await {
        tracing::error!("{e:#}");
        eprintln!("ctrlplane-agent-docker: {e:#}");
        std::process::exit(1);
    }
}

async fn run() -> anyhow::Result<()> {
    telemetry::install_crypto_provider();
    let settings = Settings::from_env_and_args(std::env::args().skip(1))?;
    if settings.help {
        print!(
            "{}",
            help_text(
                "ctrlplane-agent-docker",
                "the Docker agent (runs workloads as containers on a Docker engine)",
                ctrlplane_agent_docker::config::SETTINGS
            )
        );
        return Ok(());
    }
    telemetry::init(&LogConfig::from_settings(&settings)?);
    let config = ctrlplane_agent_docker::Config::from_settings(&settings)?;
    let listener = server::bind(config.server.listen_addr).await?;
    ctrlplane_agent_docker::run(config, listener, server::shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
