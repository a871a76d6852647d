//! `ctrlplane bootstrap …`: the bootstrap workloads of datacenters
//! (`list`, `get`, `retry`), a dry-run `plan`, and [`wait_until_settled`],
//! the live progress view shared by `datacenter create --wait` and
//! `up --demo`.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};
use ctrlplane_proto::bootstrap::v1::{
    ActionType, BootstrapState, BootstrapWorkload, GetBootstrapWorkloadRequest,
    ListBootstrapWorkloadsRequest, PlanAction, ReconcileRequest, ReconcileResponse,
    RetryBootstrapWorkloadRequest,
};

use crate::context::{Context, Peer};
use crate::error::CliError;
use crate::output::{self, OutputFormat, or_dash};

/// Arguments of `ctrlplane bootstrap`.
#[derive(Debug, Clone, Args)]
pub struct BootstrapArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: BootstrapCommand,
}

/// The bootstrap subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum BootstrapCommand {
    /// List the bootstrap workloads of a datacenter
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// Show one bootstrap workload
    Get(IdArgs),
    /// Show what a reconcile of a datacenter would do, and why (dry run: nothing changes)
    Plan(PlanArgs),
    /// Retry a failed workload now instead of after its backoff
    Retry(IdArgs),
}

/// Arguments of `ctrlplane bootstrap list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Datacenter id (dc_…)
    #[arg(long, short = 'd', value_name = "ID")]
    pub datacenter: String,
}

/// A workload id.
#[derive(Debug, Clone, Args)]
pub struct IdArgs {
    /// Bootstrap workload id (bws_…)
    pub id: String,
}

/// Arguments of `ctrlplane bootstrap plan`.
#[derive(Debug, Clone, Args)]
pub struct PlanArgs {
    /// Datacenter id (dc_…)
    pub datacenter_id: String,
}

/// `running`, `failed`, … for a state number.
pub fn state_name(state: i32) -> String {
    match BootstrapState::try_from(state) {
        Ok(s) => s
            .as_str_name()
            .trim_start_matches("BOOTSTRAP_STATE_")
            .to_ascii_lowercase(),
        Err(_) => format!("unknown({state})"),
    }
}

/// `provision`, `noop`, … for an action type number.
pub fn action_name(action: i32) -> String {
    match ActionType::try_from(action) {
        Ok(a) => a
            .as_str_name()
            .trim_start_matches("ACTION_TYPE_")
            .to_ascii_lowercase(),
        Err(_) => format!("unknown({action})"),
    }
}

/// Columns of the workload table.
pub const LIST_HEADERS: [&str; 6] = ["ID", "NAME", "STATE", "SOURCE", "ATTEMPTS", "LAST ERROR"];

/// One row of the workload table.
pub fn list_row(w: &BootstrapWorkload) -> Vec<String> {
    vec![
        w.id.clone(),
        w.name.clone(),
        state_name(w.state),
        or_dash(&w.source),
        w.attempts.to_string(),
        or_dash(&first_line(&w.last_error)),
    ]
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// The workload table (sorted by name), or a line saying there are none.
pub fn list_table(workloads: &[BootstrapWorkload]) -> String {
    if workloads.is_empty() {
        return "No bootstrap workloads.\n".to_string();
    }
    let mut sorted: Vec<_> = workloads.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let rows: Vec<_> = sorted.into_iter().map(list_row).collect();
    output::table(&LIST_HEADERS, &rows)
}

/// The `Key: value` view of one workload.
pub fn details(w: &BootstrapWorkload) -> String {
    let endpoints = w
        .endpoints
        .iter()
        .map(|e| format!("{e:?}"))
        .collect::<Vec<_>>()
        .join("\n");
    let services = w
        .services
        .iter()
        .map(|s| {
            let cmd = s
                .command
                .iter()
                .chain(&s.args)
                .cloned()
                .collect::<Vec<_>>()
                .join(" ");
            if cmd.is_empty() {
                s.name.clone()
            } else {
                format!("{}: {cmd}", s.name)
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    output::key_values(&[
        ("ID", w.id.clone()),
        ("Datacenter", w.datacenter_id.clone()),
        ("Name", w.name.clone()),
        ("State", state_name(w.state)),
        ("Source", or_dash(&w.source)),
        ("Services", or_dash(&services)),
        ("Depends on", or_dash(&w.depends_on.join(","))),
        ("Provider ref", or_dash(&w.provider_ref)),
        ("Endpoints", or_dash(&endpoints)),
        ("Attempts", w.attempts.to_string()),
        ("Last error", or_dash(&w.last_error)),
        (
            "Next attempt",
            output::timestamp(w.next_attempt_time.as_ref()),
        ),
        ("Spec hash", or_dash(&w.spec_hash)),
        ("Labels", output::pairs(&w.labels)),
        ("Created", output::timestamp(w.create_time.as_ref())),
        ("Updated", output::timestamp(w.update_time.as_ref())),
    ])
}

/// The plan view: one row per action with its reason, then a note when the
/// reconcile would be skipped.
pub fn plan_table(resp: &ReconcileResponse) -> String {
    let mut out = if resp.actions.is_empty() {
        "Nothing to do: no bootstrap services are declared or contributed.\n".to_string()
    } else {
        let rows: Vec<_> = resp.actions.iter().map(plan_row).collect();
        output::table(&["NAME", "ACTION", "SOURCE", "REASON"], &rows)
    };
    if resp.paused {
        out.push_str("Note: the datacenter's status pauses changes; nothing would be done now.\n");
    }
    if resp.stale {
        out.push_str("Note: the snapshot was stale; a newer revision exists.\n");
    }
    out.push_str("(dry run: nothing was changed)\n");
    out
}

fn plan_row(a: &PlanAction) -> Vec<String> {
    let reason = if a.error.is_empty() {
        a.reason.clone()
    } else {
        format!("{} (error: {})", a.reason, a.error)
    };
    vec![
        a.name.clone(),
        action_name(a.r#type),
        or_dash(&a.source),
        or_dash(&reason),
    ]
}

fn one(w: Option<BootstrapWorkload>) -> Result<BootstrapWorkload, CliError> {
    w.ok_or_else(|| CliError::Rpc {
        status: tonic::Status::internal("the response carried no workload"),
        service: Peer::Bootstrap.name(),
        addr: String::new(),
    })
}

fn print_one(
    out: &mut dyn Write,
    format: OutputFormat,
    w: &BootstrapWorkload,
) -> Result<(), CliError> {
    match format {
        OutputFormat::Table => out.write_all(details(w).as_bytes())?,
        OutputFormat::Json => out.write_all(output::json(w)?.as_bytes())?,
    }
    Ok(())
}

/// Every workload of a datacenter (all pages).
///
/// # Errors
/// The failed call.
pub async fn list_all(
    ctx: &Context,
    datacenter_id: &str,
) -> Result<Vec<BootstrapWorkload>, CliError> {
    let mut client = ctx.bootstrap()?;
    let mut req = ListBootstrapWorkloadsRequest {
        datacenter_id: datacenter_id.to_string(),
        page_size: 0,
        page_token: String::new(),
    };
    let mut all = Vec::new();
    loop {
        let resp = ctx
            .call(
                Peer::Bootstrap,
                client.list_bootstrap_workloads(ctx.request(req.clone())),
            )
            .await?;
        all.extend(resp.workloads);
        if resp.next_page_token.is_empty() || resp.next_page_token == req.page_token {
            return Ok(all);
        }
        req.page_token = resp.next_page_token;
    }
}

/// Runs a bootstrap subcommand.
///
/// # Errors
/// No token, or the failed call.
pub async fn run(
    ctx: &Context,
    args: BootstrapArgs,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    const BS: Peer = Peer::Bootstrap;
    match args.command {
        BootstrapCommand::List(a) => {
            let workloads = list_all(ctx, &a.datacenter).await?;
            let text = match format {
                OutputFormat::Table => list_table(&workloads),
                OutputFormat::Json => output::json_value(serde_json::json!({
                    "workloads": serde_json::to_value(&workloads)
                        .map_err(|e| CliError::Config(format!("cannot encode JSON: {e}")))?,
                }))?,
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
        BootstrapCommand::Get(a) => {
            let mut client = ctx.bootstrap()?;
            let resp = ctx
                .call(
                    BS,
                    client.get_bootstrap_workload(
                        ctx.request(GetBootstrapWorkloadRequest { id: a.id }),
                    ),
                )
                .await?;
            print_one(out, format, &one(resp.workload)?)
        }
        BootstrapCommand::Retry(a) => {
            let mut client = ctx.bootstrap()?;
            let resp = ctx
                .call(
                    BS,
                    client.retry_bootstrap_workload(
                        ctx.request(RetryBootstrapWorkloadRequest { id: a.id }),
                    ),
                )
                .await?;
            let w = one(resp.workload)?;
            match format {
                OutputFormat::Table => writeln!(
                    out,
                    "Workload {} ({}) is {}: it is retried now.",
                    w.id,
                    w.name,
                    state_name(w.state)
                )?,
                OutputFormat::Json => out.write_all(output::json(&w)?.as_bytes())?,
            }
            Ok(())
        }
        BootstrapCommand::Plan(a) => {
            let mut client = ctx.bootstrap()?;
            let resp = ctx
                .call(
                    BS,
                    client.reconcile(ctx.request(ReconcileRequest {
                        datacenter_id: a.datacenter_id,
                        dry_run: true,
                        ..Default::default()
                    })),
                )
                .await?;
            let text = match format {
                OutputFormat::Table => plan_table(&resp),
                OutputFormat::Json => output::json(&resp)?,
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
    }
}

/// Where a set of workloads stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// Every expected workload exists and runs.
    AllRunning,
    /// This one failed (name, last error).
    Failed(String, String),
    /// Still moving.
    Pending,
}

/// Judges a snapshot: `expected` names must all be present and running
/// (when `expected` is empty, every listed workload — and at least one —
/// must be running). Retiring/retired workloads are ignored.
pub fn settled(workloads: &[BootstrapWorkload], expected: &[String]) -> Settled {
    let live: Vec<_> = workloads
        .iter()
        .filter(|w| {
            !matches!(
                BootstrapState::try_from(w.state),
                Ok(BootstrapState::Retiring | BootstrapState::Retired)
            )
        })
        .collect();
    if let Some(f) = live
        .iter()
        .find(|w| w.state == BootstrapState::Failed as i32)
    {
        return Settled::Failed(f.name.clone(), f.last_error.clone());
    }
    let running = |name: &str| {
        live.iter()
            .any(|w| w.name == name && w.state == BootstrapState::Running as i32)
    };
    let done = if expected.is_empty() {
        !live.is_empty()
            && live
                .iter()
                .all(|w| w.state == BootstrapState::Running as i32)
    } else {
        expected.iter().all(|n| running(n))
    };
    if done {
        Settled::AllRunning
    } else {
        Settled::Pending
    }
}

/// How long a datacenter without declared services may show no workloads
/// (hooks may still contribute some) before there is nothing to wait for.
const NOTHING_DECLARED: Duration = Duration::from_secs(5);

/// Polls the workloads of `datacenter_id`, printing a line whenever one
/// changes state (`  web   pending → provisioning`), until every expected
/// one runs or one fails, or `timeout` passes.
///
/// # Errors
/// A workload failed, the timeout passed (both [`CliError::Config`], exit
/// 1), or a call failed.
pub async fn wait_until_settled(
    ctx: &Context,
    datacenter_id: &str,
    expected: &[String],
    timeout: Duration,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let start = Instant::now();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    let width = expected.iter().map(String::len).max().unwrap_or(8).max(8);
    writeln!(
        out,
        "Waiting for the bootstrap services of {datacenter_id} (timeout {}s):",
        timeout.as_secs()
    )?;
    out.flush()?;
    loop {
        // A transient failure (a service restarting) is retried until the
        // timeout.
        let snapshot = list_all(ctx, datacenter_id).await;
        if let Ok(workloads) = &snapshot {
            let mut sorted: Vec<_> = workloads.iter().collect();
            sorted.sort_by(|a, b| a.name.cmp(&b.name));
            for w in sorted {
                let state = state_name(w.state);
                let before = seen.insert(w.name.clone(), state.clone());
                if before.as_deref() != Some(state.as_str()) {
                    let from = before.map(|b| format!("{b} → ")).unwrap_or_default();
                    let err = if w.last_error.is_empty() {
                        String::new()
                    } else {
                        format!("  ({})", first_line(&w.last_error))
                    };
                    writeln!(
                        out,
                        "  [{:>5.1}s] {:<width$}  {from}{state}{err}",
                        start.elapsed().as_secs_f64(),
                        w.name
                    )?;
                    out.flush()?;
                }
            }
            match settled(workloads, expected) {
                Settled::AllRunning => {
                    writeln!(
                        out,
                        "All {} bootstrap services are running ({:.1}s).",
                        seen.len(),
                        start.elapsed().as_secs_f64()
                    )?;
                    return Ok(());
                }
                Settled::Failed(name, error) => {
                    return Err(CliError::Config(format!(
                        "bootstrap service {name:?} of {datacenter_id} failed: {error}\n\
                         hint: `ctrlplane bootstrap list --datacenter {datacenter_id}` shows the workloads; \
                         `ctrlplane bootstrap retry ID` retries one now"
                    )));
                }
                Settled::Pending => {}
            }
            if expected.is_empty() && workloads.is_empty() && start.elapsed() >= NOTHING_DECLARED {
                writeln!(
                    out,
                    "No bootstrap services are declared or contributed: nothing to wait for."
                )?;
                return Ok(());
            }
        }
        if start.elapsed() >= timeout {
            let last = match snapshot {
                Ok(_) => String::new(),
                Err(e) => format!(" (last error: {e})"),
            };
            return Err(CliError::Config(format!(
                "timed out after {}s waiting for the bootstrap services of {datacenter_id} to run{last}",
                timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> BootstrapCommand {
        let argv = ["ctrlplane", "bootstrap"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv) {
            Ok(cli) => match cli.command {
                crate::cli::Command::Bootstrap(b) => b.command,
                other => panic!("parsed {other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    fn w(name: &str, state: BootstrapState) -> BootstrapWorkload {
        BootstrapWorkload {
            id: format!("bws_{name}"),
            name: name.into(),
            state: state as i32,
            source: "declared".into(),
            ..Default::default()
        }
    }

    #[test]
    fn commands_parse() {
        assert!(
            matches!(parse(&["list", "--datacenter", "dc_1"]), BootstrapCommand::List(a) if a.datacenter == "dc_1")
        );
        assert!(matches!(
            parse(&["ls", "-d", "dc_1"]),
            BootstrapCommand::List(_)
        ));
        assert!(matches!(parse(&["get", "bws_1"]), BootstrapCommand::Get(a) if a.id == "bws_1"));
        assert!(
            matches!(parse(&["retry", "bws_1"]), BootstrapCommand::Retry(a) if a.id == "bws_1")
        );
        assert!(
            matches!(parse(&["plan", "dc_1"]), BootstrapCommand::Plan(a) if a.datacenter_id == "dc_1")
        );
        assert!(crate::cli::Cli::try_parse_from(["ctrlplane", "bootstrap", "list"]).is_err());
    }

    #[test]
    fn names() {
        assert_eq!(state_name(BootstrapState::Running as i32), "running");
        assert_eq!(state_name(99), "unknown(99)");
        assert_eq!(action_name(ActionType::Provision as i32), "provision");
    }

    #[test]
    fn list_layout_is_sorted() {
        let mut b = w("b", BootstrapState::Failed);
        b.last_error = "boom\nmore".into();
        b.attempts = 2;
        let text = list_table(&[b, w("a", BootstrapState::Running)]);
        assert_eq!(
            text,
            "ID      NAME   STATE     SOURCE     ATTEMPTS   LAST ERROR\n\
             bws_a   a      running   declared   0          -\n\
             bws_b   b      failed    declared   2          boom\n"
        );
        assert_eq!(list_table(&[]), "No bootstrap workloads.\n");
    }

    #[test]
    fn plan_layout() {
        let resp = ReconcileResponse {
            actions: vec![PlanAction {
                name: "web".into(),
                r#type: ActionType::Provision as i32,
                reason: "declared, no workload yet".into(),
                source: "declared".into(),
                ..Default::default()
            }],
            paused: true,
            ..Default::default()
        };
        let text = plan_table(&resp);
        assert!(
            text.starts_with(
                "NAME   ACTION      SOURCE     REASON\nweb    provision   declared   declared, no workload yet\n"
            ),
            "{text}"
        );
        assert!(text.contains("pauses"));
        assert!(text.ends_with("(dry run: nothing was changed)\n"));
    }

    #[test]
    fn details_view() {
        let text = details(&w("web", BootstrapState::Running));
        assert!(text.contains("State:         running\n"), "{text}");
        assert!(text.contains("Name:          web\n"), "{text}");
    }

    #[test]
    fn settling() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let all = [
            w("a", BootstrapState::Running),
            w("b", BootstrapState::Pending),
        ];
        assert_eq!(settled(&all, &names(&["a", "b"])), Settled::Pending);
        assert_eq!(settled(&all, &names(&["a"])), Settled::AllRunning);
        assert_eq!(settled(&all, &[]), Settled::Pending);
        assert_eq!(settled(&[], &[]), Settled::Pending);
        assert_eq!(settled(&[], &names(&["a"])), Settled::Pending);
        let mut f = w("c", BootstrapState::Failed);
        f.last_error = "exit 1".into();
        assert_eq!(
            settled(&[w("a", BootstrapState::Running), f], &[]),
            Settled::Failed("c".into(), "exit 1".into())
        );
        let done = [
            w("a", BootstrapState::Running),
            w("old", BootstrapState::Retiring),
        ];
        assert_eq!(settled(&done, &[]), Settled::AllRunning);
    }
}
