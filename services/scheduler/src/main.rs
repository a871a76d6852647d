//! `ctrlplane-scheduler`: parses configuration, sets up tracing and runs
//! the scheduler until SIGTERM or Ctrl-C.

#![forbid(unsafe_code)]

use ctrlplane_runtime::config::{LogConfig, Settings, help_text};
use ctrlplane_runtime::{server, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::install_crypto_provider();
    let settings = Settings::from_env_and_args(std::env::args().skip(1))?;
    if settings.help {
        print!(
            "{}",
            help_text(
                "ctrlplane-scheduler",
                "the scheduler",
                ctrlplane_scheduler::SETTINGS
            )
        );
        return Ok(());
    }
    telemetry::init(&LogConfig::from_settings(&settings)?);
    let config = ctrlplane_scheduler::Config::from_settings(&settings)?;
    let listener = server::bind(config.server.listen_addr).await?;
    ctrlplane_scheduler::run(config, listener, server::shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
