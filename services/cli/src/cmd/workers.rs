//! `ctrlplane workers …`: the scheduler's workers (`list`, `run`).

use std::io::Write;

use clap::{Args, Subcommand};
use ctrlplane_proto::pbjson_types;
use ctrlplane_proto::scheduler::v1::{
    ListWorkersRequest, ListWorkersResponse, RunWorkerRequest, WorkerInfo,
};

use crate::context::{Context, Peer};
use crate::error::CliError;
use crate::output::{self, OutputFormat, or_dash};

/// Arguments of `ctrlplane workers`.
#[derive(Debug, Clone, Args)]
pub struct WorkersArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: WorkersCommand,
}

/// The workers subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum WorkersCommand {
    /// List the scheduler's workers and who leads
    #[command(visible_alias = "ls")]
    List,
    /// Run a worker now (e.g. reconciler, status_sync, gc, telemetry, provider_health)
    Run(RunArgs),
}

/// Arguments of `ctrlplane workers run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Worker name
    pub name: String,
    /// Only this datacenter (workers that act per datacenter)
    #[arg(long, short = 'd', value_name = "ID")]
    pub datacenter: Option<String>,
}

/// A duration as `1.5s` / `250ms`; `-` when unset.
pub fn duration(d: Option<&pbjson_types::Duration>) -> String {
    let Some(d) = d else {
        return "-".to_string();
    };
    let ms = d.seconds.saturating_mul(1000) + i64::from(d.nanos) / 1_000_000;
    if ms < 1000 {
        format!("{ms}ms")
    } else if ms % 60_000 == 0 {
        format!("{}m", ms / 60_000)
    } else if ms % 1000 == 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

/// Columns of the workers table.
pub const HEADERS: [&str; 8] = [
    "NAME",
    "INTERVAL",
    "RUNNING",
    "RUNS",
    "ERRORS",
    "LAST RUN",
    "LAST DURATION",
    "LAST ERROR",
];

/// One row of the workers table.
pub fn row(w: &WorkerInfo) -> Vec<String> {
    vec![
        w.name.clone(),
        duration(w.interval.as_ref()),
        if w.running { "yes" } else { "no" }.to_string(),
        w.run_count.to_string(),
        w.error_count.to_string(),
        output::timestamp(w.last_run_time.as_ref()),
        duration(w.last_duration.as_ref()),
        or_dash(w.last_error.lines().next().unwrap_or("")),
    ]
}

/// The leader line and the table.
pub fn list_table(resp: &ListWorkersResponse) -> String {
    let mut out = if resp.leader {
        format!("Leader: this scheduler ({})\n", or_dash(&resp.leader_id))
    } else if resp.leader_id.is_empty() {
        "Leader: none (this scheduler is on standby)\n".to_string()
    } else {
        format!(
            "Leader: {} (this scheduler is on standby)\n",
            resp.leader_id
        )
    };
    let rows: Vec<_> = resp.workers.iter().map(row).collect();
    out.push_str(&output::table(&HEADERS, &rows));
    out
}

/// Runs a workers subcommand.
///
/// # Errors
/// No token, or the failed call.
pub async fn run(
    ctx: &Context,
    args: WorkersArgs,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    const SC: Peer = Peer::Scheduler;
    let mut client = ctx.scheduler()?;
    match args.command {
        WorkersCommand::List => {
            let resp = ctx
                .call(SC, client.list_workers(ctx.request(ListWorkersRequest {})))
                .await?;
            let text = match format {
                OutputFormat::Table => list_table(&resp),
                OutputFormat::Json => output::json(&resp)?,
            };
            out.write_all(text.as_bytes())?;
        }
        WorkersCommand::Run(a) => {
            let resp = ctx
                .call(
                    SC,
                    client.run_worker(ctx.request(RunWorkerRequest {
                        name: a.name,
                        datacenter_id: a.datacenter.unwrap_or_default(),
                    })),
                )
                .await?;
            let w = resp.worker.unwrap_or_default();
            match format {
                OutputFormat::Table => {
                    out.write_all(output::table(&HEADERS, &[row(&w)]).as_bytes())?
                }
                OutputFormat::Json => out.write_all(output::json(&w)?.as_bytes())?,
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> WorkersCommand {
        let argv = ["ctrlplane", "workers"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Workers(w) => w.command,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn commands_parse() {
        assert!(matches!(parse(&["list"]), WorkersCommand::List));
        assert!(matches!(parse(&["ls"]), WorkersCommand::List));
        assert!(
            matches!(parse(&["run", "gc"]), WorkersCommand::Run(a) if a.name == "gc" && a.datacenter.is_none())
        );
        assert!(
            matches!(parse(&["run", "reconciler", "--datacenter", "dc_1"]), WorkersCommand::Run(a) if a.datacenter.as_deref() == Some("dc_1"))
        );
    }

    #[test]
    fn durations() {
        let d = |seconds, nanos| Some(pbjson_types::Duration { seconds, nanos });
        assert_eq!(duration(None), "-");
        assert_eq!(duration(d(0, 250_000_000).as_ref()), "250ms");
        assert_eq!(duration(d(60, 0).as_ref()), "1m");
        assert_eq!(duration(d(15, 0).as_ref()), "15s");
        assert_eq!(duration(d(1, 500_000_000).as_ref()), "1.5s");
    }

    #[test]
    fn table_shows_the_leader() {
        let resp = ListWorkersResponse {
            workers: vec![WorkerInfo {
                name: "gc".into(),
                run_count: 3,
                ..Default::default()
            }],
            leader: true,
            leader_id: "sched-1".into(),
        };
        let text = list_table(&resp);
        assert!(
            text.starts_with("Leader: this scheduler (sched-1)\nNAME"),
            "{text}"
        );
        assert!(text.contains("\ngc     -          no        3"), "{text}");
        let standby = ListWorkersResponse::default();
        assert!(list_table(&standby).starts_with("Leader: none"));
    }
}
