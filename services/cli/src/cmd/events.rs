//! `ctrlplane events watch`: streams bootstrap events until Ctrl-C.

use std::io::Write;

use clap::{Args, Subcommand};
use ctrlplane_proto::bootstrap::v1::{BootstrapEvent, WatchEventsRequest};

use crate::cmd::bootstrap::state_name;
use crate::context::{Context, Peer};
use crate::error::CliError;
use crate::output::{self, OutputFormat, or_dash};

/// Arguments of `ctrlplane events`.
#[derive(Debug, Clone, Args)]
pub struct EventsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: EventsCommand,
}

/// The events subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum EventsCommand {
    /// Stream bootstrap events as they happen, until Ctrl-C
    Watch(WatchArgs),
}

/// Arguments of `ctrlplane events watch`.
#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Only events of this datacenter
    #[arg(long, short = 'd', value_name = "ID")]
    pub datacenter: Option<String>,
    /// Resume after this event sequence number (0 = only new events)
    #[arg(long, default_value_t = 0, value_name = "SEQ")]
    pub since: i64,
}

/// One event as a line: time, sequence, datacenter, workload, transition,
/// message.
pub fn line(e: &BootstrapEvent) -> String {
    let transition = if e.from_state == 0 && e.to_state == 0 {
        String::new()
    } else if e.from_state == 0 {
        format!(" → {}", state_name(e.to_state))
    } else {
        format!(" {} → {}", state_name(e.from_state), state_name(e.to_state))
    };
    let msg = if e.message.is_empty() {
        String::new()
    } else {
        format!(": {}", e.message)
    };
    format!(
        "{} #{} {} {} {}{transition}{msg}",
        output::timestamp(e.create_time.as_ref()),
        e.sequence,
        or_dash(&e.datacenter_id),
        or_dash(&e.name),
        or_dash(&e.r#type),
    )
}

/// Runs an events subcommand. Ends cleanly (exit 0) on Ctrl-C; a stream
/// the server ends is an error.
///
/// # Errors
/// No token, the failed call, or the stream ending.
pub async fn run(
    ctx: &Context,
    args: EventsArgs,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let EventsCommand::Watch(a) = args.command;
    let mut client = ctx.bootstrap()?;
    // No deadline: the stream runs until Ctrl-C.
    let req = tonic::Request::new(WatchEventsRequest {
        datacenter_id: a.datacenter.unwrap_or_default(),
        since_sequence: a.since,
    });
    let err = |status| CliError::Rpc {
        status,
        service: Peer::Bootstrap.name(),
        addr: ctx.addr(Peer::Bootstrap),
    };
    let mut stream = tokio::select! {
        r = client.watch_events(req) => r.map_err(err)?.into_inner(),
        _ = tokio::signal::ctrl_c() => return Ok(()),
    };
    loop {
        let msg = tokio::select! {
            m = stream.message() => m.map_err(err)?,
            _ = tokio::signal::ctrl_c() => return Ok(()),
        };
        let Some(msg) = msg else {
            return Err(CliError::Config(
                "the bootstrap service ended the event stream".to_string(),
            ));
        };
        let Some(e) = msg.event else { continue };
        match format {
            OutputFormat::Table => writeln!(out, "{}", line(&e))?,
            OutputFormat::Json => {
                let v = serde_json::to_value(&e)
                    .map_err(|x| CliError::Config(format!("cannot encode JSON: {x}")))?;
                writeln!(out, "{v}")?;
            }
        }
        out.flush()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ctrlplane_proto::bootstrap::v1::BootstrapState;

    #[test]
    fn parse_and_render() {
        let cli = crate::cli::Cli::try_parse_from(["ctrlplane", "events", "watch", "-d", "dc_1"])
            .unwrap();
        let crate::cli::Command::Events(EventsArgs {
            command: EventsCommand::Watch(a),
        }) = cli.command
        else {
            panic!()
        };
        assert_eq!(a.datacenter.as_deref(), Some("dc_1"));
        assert_eq!(a.since, 0);
        let e = BootstrapEvent {
            sequence: 7,
            datacenter_id: "dc_1".into(),
            name: "web".into(),
            r#type: "state_changed".into(),
            from_state: BootstrapState::Provisioning as i32,
            to_state: BootstrapState::Running as i32,
            ..Default::default()
        };
        assert_eq!(
            line(&e),
            "- #7 dc_1 web state_changed provisioning → running"
        );
    }
}
