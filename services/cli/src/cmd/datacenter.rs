//! `ctrlplane datacenter …` (alias `dc`): create, get, list, update,
//! set-status and delete datacenters through `DatacenterService`.
//!
//! Requests are built from the arguments by pure functions
//! ([`build_create`], [`build_list`], [`build_update`]) before any client is
//! made, so bad flags or files are reported before a token is even needed,
//! and the flag → request mapping (above all the update mask) is
//! unit-tested without a server.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use ctrlplane_proto::datacenter::v1::{
    CreateDatacenterRequest, Datacenter, DatacenterStatus, DeleteDatacenterRequest,
    GetDatacenterBySlugRequest, GetDatacenterRequest, ListDatacentersRequest,
    ListDatacentersResponse, SetDatacenterStatusRequest, UpdateDatacenterRequest,
};
use ctrlplane_proto::pbjson_types::FieldMask;

use crate::context::{Context, Peer};
use crate::error::CliError;
use crate::input::{
    pairs_to_map, parse_bootstrap_specs, parse_datacenter, parse_key_value, read_input,
};
use crate::output::{self, OutputFormat, or_dash};

/// Arguments of `ctrlplane datacenter`.
#[derive(Debug, Clone, Args)]
pub struct DatacenterArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: DatacenterCommand,
}

/// The datacenter subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum DatacenterCommand {
    /// Register a datacenter; its bootstrap services are installed from then on
    Create(CreateArgs),
    /// Show one datacenter, by id or by slug
    Get(GetArgs),
    /// List datacenters, filtered and paginated
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// Change fields of a datacenter; only the fields named by flags are touched
    Update(UpdateArgs),
    /// Move a datacenter to another status (active, maintenance, draining, offline)
    SetStatus(SetStatusArgs),
    /// Delete a datacenter: it turns DELETING, its bootstrap services are retired, then it is purged
    Delete(DeleteArgs),
}

const CREATE_AFTER_HELP: &str = "\
BOOTSTRAP FILE is JSON: an array of BootstrapServiceSpec in proto JSON, e.g.
  [{\"name\": \"logs\", \"services\": [{\"name\": \"vector\", \"image\": \"timberio/vector:0.40\"}]}]
or an object {\"bootstrapServices\": [...]}. Use - to read stdin.

Examples:
  ctrlplane dc create --name \"Berlin 1\" --provider process --region eu-central --label env=prod
  ctrlplane dc create --name edge --provider docker --bootstrap-file bootstrap.json
  ctrlplane dc get dc_01h… -o json > dc.json && ctrlplane dc create --from-file dc.json --name copy";

/// Arguments of `ctrlplane datacenter create`.
#[derive(Debug, Clone, Args)]
#[command(after_help = CREATE_AFTER_HELP)]
pub struct CreateArgs {
    /// Display name (1-100 characters); the slug is derived from it
    #[arg(long, required_unless_present = "from_file")]
    pub name: Option<String>,

    /// Provider backing the datacenter, e.g. process, docker, kubernetes, nomad
    #[arg(long, value_name = "PROVIDER", required_unless_present = "from_file")]
    pub provider: Option<String>,

    /// Region, e.g. eu-central
    #[arg(long)]
    pub region: Option<String>,

    /// Zone within the region
    #[arg(long)]
    pub zone: Option<String>,

    /// Label (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,

    /// Metadata entry (repeatable)
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,

    /// Owning tenant (system:admin only; "" = platform-shared) [default: the token's tenant]
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,

    /// Bootstrap services to declare, from a JSON file (see below)
    #[arg(long, value_name = "FILE")]
    pub bootstrap_file: Option<PathBuf>,

    /// Start from a whole Datacenter in proto JSON (e.g. `dc get -o json`
    /// output); the other flags override its fields, labels and metadata are
    /// merged
    #[arg(long, value_name = "FILE")]
    pub from_file: Option<PathBuf>,

    /// After creating, show each bootstrap service's state live until all
    /// run (exit 0) or one fails (exit 1)
    #[arg(long)]
    pub wait: bool,

    /// With --wait: give up after this long (exit 1)
    #[arg(long, default_value = "5m", value_name = "DURATION", requires = "wait",
          value_parser = crate::input::parse_positive_duration)]
    pub wait_timeout: std::time::Duration,
}

/// Arguments of `ctrlplane datacenter get`.
#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).args(["id", "slug"]))]
pub struct GetArgs {
    /// Datacenter id (dc_…)
    pub id: Option<String>,

    /// Look up by slug instead of id
    #[arg(long, conflicts_with = "id")]
    pub slug: Option<String>,

    /// With --slug: the tenant whose slug to look up (system:admin only)
    #[arg(long, conflicts_with = "id", value_name = "TENANT")]
    pub tenant: Option<String>,
}

/// A status to filter by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    /// Serving.
    Active,
    /// Paused for maintenance.
    Maintenance,
    /// Winding down.
    Draining,
    /// Switched off or unreachable.
    Offline,
    /// Being deleted.
    Deleting,
}

impl From<StatusFilter> for DatacenterStatus {
    fn from(s: StatusFilter) -> Self {
        match s {
            StatusFilter::Active => DatacenterStatus::Active,
            StatusFilter::Maintenance => DatacenterStatus::Maintenance,
            StatusFilter::Draining => DatacenterStatus::Draining,
            StatusFilter::Offline => DatacenterStatus::Offline,
            StatusFilter::Deleting => DatacenterStatus::Deleting,
        }
    }
}

const LIST_AFTER_HELP: &str = "\
Examples:
  ctrlplane dc list --status active --selector env=prod,team=infra
  ctrlplane dc list --all -o json | jq -r '.datacenters[].id'";

/// Arguments of `ctrlplane datacenter list`.
#[derive(Debug, Clone, Args)]
#[command(after_help = LIST_AFTER_HELP)]
pub struct ListArgs {
    /// Only datacenters with this status
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,

    /// Only datacenters of this provider
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,

    /// Only datacenters in this region
    #[arg(long)]
    pub region: Option<String>,

    /// Only datacenters carrying every one of these labels
    #[arg(short = 'l', long, value_name = "K=V,K2=V2")]
    pub selector: Option<String>,

    /// Only this tenant's datacenters (system:admin; others see their own and shared ones)
    #[arg(long, value_name = "TENANT")]
    pub tenant: Option<String>,

    /// Datacenters per page (1-1000) [default: the server's, 50]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub page_size: Option<i32>,

    /// Continue from a previous page (its next page token)
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,

    /// Follow the page tokens and print every page
    #[arg(long)]
    pub all: bool,
}

const UPDATE_AFTER_HELP: &str = "\
Only the fields named by flags change (the request's update mask lists exactly them).
--label and --metadata replace the whole map: labels not given are removed.

Examples:
  ctrlplane dc update dc_01h… --region eu-west --zone b
  ctrlplane dc update dc_01h… --label env=prod --label team=infra
  ctrlplane dc update dc_01h… --clear-bootstrap";

/// Arguments of `ctrlplane datacenter update`.
#[derive(Debug, Clone, Args)]
#[command(after_help = UPDATE_AFTER_HELP)]
pub struct UpdateArgs {
    /// Datacenter id (dc_…)
    pub id: String,

    /// New display name (the slug follows it)
    #[arg(long)]
    pub name: Option<String>,

    /// New provider
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,

    /// New region ("" clears it)
    #[arg(long)]
    pub region: Option<String>,

    /// New zone ("" clears it)
    #[arg(long)]
    pub zone: Option<String>,

    /// Replace all labels with these (repeatable)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,

    /// Remove all labels
    #[arg(long, conflicts_with = "labels")]
    pub clear_labels: bool,

    /// Replace all metadata with these entries (repeatable)
    #[arg(long = "metadata", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub metadata: Vec<(String, String)>,

    /// Remove all metadata
    #[arg(long, conflicts_with = "metadata")]
    pub clear_metadata: bool,

    /// Replace the declared bootstrap services with those in this JSON file
    /// (same format as for create)
    #[arg(long, value_name = "FILE")]
    pub bootstrap_file: Option<PathBuf>,

    /// Remove every declared bootstrap service (they are retired)
    #[arg(long, conflicts_with = "bootstrap_file")]
    pub clear_bootstrap: bool,
}

/// A status to move to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TargetStatus {
    /// Serving; bootstrap services are installed and kept.
    Active,
    /// Paused for maintenance: nothing is changed on it.
    Maintenance,
    /// Winding down: no new installs; updates and retirements go on.
    Draining,
    /// Unreachable or switched off: nothing is changed on it.
    Offline,
}

impl From<TargetStatus> for DatacenterStatus {
    fn from(s: TargetStatus) -> Self {
        match s {
            TargetStatus::Active => DatacenterStatus::Active,
            TargetStatus::Maintenance => DatacenterStatus::Maintenance,
            TargetStatus::Draining => DatacenterStatus::Draining,
            TargetStatus::Offline => DatacenterStatus::Offline,
        }
    }
}

/// Arguments of `ctrlplane datacenter set-status`.
#[derive(Debug, Clone, Args)]
#[command(
    after_help = "Allowed moves: active → maintenance|draining|offline; maintenance → active|draining|offline;\n\
                        draining → offline|active; offline → active|maintenance."
)]
pub struct SetStatusArgs {
    /// Datacenter id (dc_…)
    pub id: String,

    /// The new status
    #[arg(value_enum)]
    pub status: TargetStatus,

    /// Why (recorded on the change event)
    #[arg(long)]
    pub reason: Option<String>,
}

/// Arguments of `ctrlplane datacenter delete`.
#[derive(Debug, Clone, Args)]
pub struct DeleteArgs {
    /// Datacenter id (dc_…)
    pub id: String,
}

/// The datacenter a create request carries.
///
/// # Errors
/// Unreadable or invalid files, duplicate keys.
pub fn build_create(a: &CreateArgs) -> Result<Datacenter, CliError> {
    let mut dc = match &a.from_file {
        Some(path) => parse_datacenter(&path.display().to_string(), &read_input(path)?)?,
        None => Datacenter::default(),
    };
    let set = |field: &mut String, value: &Option<String>| {
        if let Some(v) = value {
            field.clone_from(v);
        }
    };
    set(&mut dc.name, &a.name);
    set(&mut dc.provider_name, &a.provider);
    set(&mut dc.region, &a.region);
    set(&mut dc.zone, &a.zone);
    set(&mut dc.tenant_id, &a.tenant);
    dc.labels.extend(pairs_to_map("label", &a.labels)?);
    dc.metadata.extend(pairs_to_map("metadata", &a.metadata)?);
    if let Some(path) = &a.bootstrap_file {
        dc.bootstrap_services =
            parse_bootstrap_specs(&path.display().to_string(), &read_input(path)?)?;
    }
    Ok(dc)
}

/// The first list request.
pub fn build_list(a: &ListArgs) -> ListDatacentersRequest {
    ListDatacentersRequest {
        page_size: a.page_size.unwrap_or(0),
        page_token: a.page_token.clone().unwrap_or_default(),
        status: a.status.map_or(DatacenterStatus::Unspecified, Into::into) as i32,
        provider_name: a.provider.clone().unwrap_or_default(),
        region: a.region.clone().unwrap_or_default(),
        label_selector: a.selector.clone().unwrap_or_default(),
        tenant_id: a.tenant.clone().unwrap_or_default(),
    }
}

/// The update request: the datacenter carries the id and the new values,
/// the mask names exactly the fields whose flags were given (in proto field
/// order).
///
/// # Errors
/// [`CliError::Usage`] when no field flag is given (the server rejects an
/// empty mask); unreadable or invalid files; duplicate keys.
pub fn build_update(a: &UpdateArgs) -> Result<UpdateDatacenterRequest, CliError> {
    let mut dc = Datacenter {
        id: a.id.clone(),
        ..Default::default()
    };
    let mut paths: Vec<&str> = Vec::new();
    let mut set = |path: &'static str, field: &mut String, value: &Option<String>| {
        if let Some(v) = value {
            field.clone_from(v);
            paths.push(path);
        }
    };
    set("name", &mut dc.name, &a.name);
    set("provider_name", &mut dc.provider_name, &a.provider);
    set("region", &mut dc.region, &a.region);
    set("zone", &mut dc.zone, &a.zone);
    if a.clear_labels || !a.labels.is_empty() {
        dc.labels = pairs_to_map("label", &a.labels)?;
        paths.push("labels");
    }
    if a.clear_metadata || !a.metadata.is_empty() {
        dc.metadata = pairs_to_map("metadata", &a.metadata)?;
        paths.push("metadata");
    }
    if a.clear_bootstrap {
        paths.push("bootstrap_services");
    } else if let Some(path) = &a.bootstrap_file {
        dc.bootstrap_services =
            parse_bootstrap_specs(&path.display().to_string(), &read_input(path)?)?;
        paths.push("bootstrap_services");
    }
    if paths.is_empty() {
        return Err(CliError::Usage(
            "nothing to update: give at least one of --name, --provider, --region, --zone, --label, \
             --clear-labels, --metadata, --clear-metadata, --bootstrap-file, --clear-bootstrap"
                .to_string(),
        ));
    }
    Ok(UpdateDatacenterRequest {
        datacenter: Some(dc),
        update_mask: Some(FieldMask {
            paths: paths.into_iter().map(str::to_string).collect(),
        }),
    })
}

pub use super::paging::list_pages;

/// `active`, `maintenance`, … for a status number.
pub fn status_name(status: i32) -> String {
    match DatacenterStatus::try_from(status) {
        Ok(s) => s
            .as_str_name()
            .trim_start_matches("DATACENTER_STATUS_")
            .to_ascii_lowercase(),
        Err(_) => format!("unknown({status})"),
    }
}

/// Columns of the list table.
pub const LIST_HEADERS: [&str; 8] = [
    "ID", "NAME", "SLUG", "TENANT", "PROVIDER", "REGION", "STATUS", "REVISION",
];

/// One row of the list table.
pub fn list_row(dc: &Datacenter) -> Vec<String> {
    vec![
        dc.id.clone(),
        or_dash(&dc.name),
        or_dash(&dc.slug),
        or_dash(&dc.tenant_id),
        or_dash(&dc.provider_name),
        or_dash(&dc.region),
        status_name(dc.status),
        dc.revision.to_string(),
    ]
}

/// The list view: the table and a footer with the total (and how to get
/// the next page, if there is one).
pub fn list_table(resp: &ListDatacentersResponse) -> String {
    if resp.datacenters.is_empty() {
        return format!("No datacenters found (total: {}).\n", resp.total_size);
    }
    let rows: Vec<_> = resp.datacenters.iter().map(list_row).collect();
    let mut out = output::table(&LIST_HEADERS, &rows);
    if resp.next_page_token.is_empty() {
        out.push_str(&format!("Total: {}\n", resp.total_size));
    } else {
        out.push_str(&format!(
            "Showing {} of {}. Next page: --page-token {} (or --all)\n",
            rows.len(),
            resp.total_size,
            resp.next_page_token
        ));
    }
    out
}

/// The list as JSON: the `ListDatacentersResponse` in proto JSON, with all
/// three fields always present (proto JSON leaves out empty ones, which
/// makes `jq '.datacenters[]'` fail on an empty list).
///
/// # Errors
/// A response the JSON encoder refuses.
pub fn list_json(resp: &ListDatacentersResponse) -> Result<String, CliError> {
    let mut value = serde_json::to_value(resp)
        .map_err(|e| CliError::Config(format!("cannot encode JSON: {e}")))?;
    if let Some(obj) = value.as_object_mut() {
        obj.entry("datacenters")
            .or_insert_with(|| serde_json::json!([]));
        obj.entry("nextPageToken")
            .or_insert_with(|| serde_json::json!(""));
        obj.entry("totalSize")
            .or_insert_with(|| serde_json::json!(0));
    }
    output::json_value(value)
}

/// The `Key: value` view of one datacenter.
pub fn details(dc: &Datacenter) -> String {
    let mut rows: Vec<(&str, String)> = vec![
        ("ID", dc.id.clone()),
        ("Name", dc.name.clone()),
        ("Slug", dc.slug.clone()),
        (
            "Tenant",
            if dc.tenant_id.is_empty() {
                "- (platform-shared)".to_string()
            } else {
                dc.tenant_id.clone()
            },
        ),
        ("Provider", dc.provider_name.clone()),
        ("Region", or_dash(&dc.region)),
        ("Zone", or_dash(&dc.zone)),
        ("Status", status_name(dc.status)),
        ("Revision", dc.revision.to_string()),
        ("Labels", output::pairs(&dc.labels)),
        ("Metadata", output::pairs(&dc.metadata)),
    ];
    if let Some(l) = &dc.location {
        let place = [l.city.as_str(), l.country.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(", ");
        rows.push((
            "Location",
            format!("{place} ({}, {})", l.latitude, l.longitude)
                .trim()
                .to_string(),
        ));
    }
    if let Some(c) = &dc.capacity {
        let limit = |n: i64, unit: &str| {
            if n == 0 {
                "unlimited".to_string()
            } else {
                format!("{n}{unit}")
            }
        };
        rows.push((
            "Capacity",
            format!(
                "instances={} cpu={} memory={}",
                limit(c.max_instances.into(), ""),
                limit(c.max_cpu_millis, "m"),
                limit(c.max_memory_mb, "Mi")
            ),
        ));
    }
    let bootstrap = if dc.bootstrap_services.is_empty() {
        "-".to_string()
    } else {
        dc.bootstrap_services
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    };
    rows.push(("Bootstrap services", bootstrap));
    rows.push((
        "Last checked",
        output::timestamp(dc.last_checked_at.as_ref()),
    ));
    rows.push(("Created", output::timestamp(dc.create_time.as_ref())));
    rows.push(("Updated", output::timestamp(dc.update_time.as_ref())));
    output::key_values(&rows)
}

fn one(dc: Option<Datacenter>) -> Result<Datacenter, CliError> {
    dc.ok_or_else(|| CliError::Rpc {
        status: tonic::Status::internal("the response carried no datacenter"),
        service: Peer::Datacenter.name(),
        addr: String::new(),
    })
}

fn print_one(out: &mut dyn Write, format: OutputFormat, dc: &Datacenter) -> Result<(), CliError> {
    match format {
        OutputFormat::Table => out.write_all(details(dc).as_bytes())?,
        OutputFormat::Json => out.write_all(output::json(dc)?.as_bytes())?,
    }
    Ok(())
}

/// Runs a datacenter subcommand.
///
/// # Errors
/// Bad arguments or files, no token, or the failed call.
pub async fn run(
    ctx: &Context,
    args: DatacenterArgs,
    format: OutputFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    const DC: Peer = Peer::Datacenter;
    match args.command {
        DatacenterCommand::Create(a) => {
            let req = CreateDatacenterRequest {
                datacenter: Some(build_create(&a)?),
            };
            let mut client = ctx.datacenter()?;
            let resp = ctx
                .call(DC, client.create_datacenter(ctx.request(req)))
                .await?;
            let dc = one(resp.datacenter)?;
            print_one(out, format, &dc)?;
            if a.wait {
                let expected: Vec<String> = dc
                    .bootstrap_services
                    .iter()
                    .map(|s| s.name.clone())
                    .collect();
                // In JSON mode the progress goes to stderr, keeping stdout
                // one JSON document.
                let mut stderr = std::io::stderr().lock();
                let progress: &mut dyn Write = match format {
                    OutputFormat::Table => out,
                    OutputFormat::Json => &mut stderr,
                };
                crate::cmd::bootstrap::wait_until_settled(
                    ctx,
                    &dc.id,
                    &expected,
                    a.wait_timeout,
                    progress,
                )
                .await?;
            }
            Ok(())
        }
        DatacenterCommand::Get(a) => {
            let mut client = ctx.datacenter()?;
            let dc = match (a.id, a.slug) {
                (Some(id), _) => {
                    let req = GetDatacenterRequest { id };
                    ctx.call(DC, client.get_datacenter(ctx.request(req)))
                        .await?
                        .datacenter
                }
                (None, Some(slug)) => {
                    let req = GetDatacenterBySlugRequest {
                        slug,
                        tenant_id: a.tenant.unwrap_or_default(),
                    };
                    ctx.call(DC, client.get_datacenter_by_slug(ctx.request(req)))
                        .await?
                        .datacenter
                }
                (None, None) => {
                    return Err(CliError::Usage(
                        "give a datacenter id or --slug".to_string(),
                    ));
                }
            };
            print_one(out, format, &one(dc)?)
        }
        DatacenterCommand::List(a) => {
            let first = build_list(&a);
            let mut client = ctx.datacenter()?;
            let resp = list_pages(first, a.all, async |req| {
                ctx.call(DC, client.list_datacenters(ctx.request(req)))
                    .await
            })
            .await?;
            let text = match format {
                OutputFormat::Table => list_table(&resp),
                OutputFormat::Json => list_json(&resp)?,
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
        DatacenterCommand::Update(a) => {
            let req = build_update(&a)?;
            let mut client = ctx.datacenter()?;
            let resp = ctx
                .call(DC, client.update_datacenter(ctx.request(req)))
                .await?;
            print_one(out, format, &one(resp.datacenter)?)
        }
        DatacenterCommand::SetStatus(a) => {
            let req = SetDatacenterStatusRequest {
                id: a.id,
                status: DatacenterStatus::from(a.status) as i32,
                reason: a.reason.unwrap_or_default(),
            };
            let mut client = ctx.datacenter()?;
            let resp = ctx
                .call(DC, client.set_datacenter_status(ctx.request(req)))
                .await?;
            print_one(out, format, &one(resp.datacenter)?)
        }
        DatacenterCommand::Delete(a) => {
            let mut client = ctx.datacenter()?;
            let resp = ctx
                .call(
                    DC,
                    client.delete_datacenter(ctx.request(DeleteDatacenterRequest { id: a.id })),
                )
                .await?;
            let dc = one(resp.datacenter)?;
            match format {
                OutputFormat::Table => writeln!(
                    out,
                    "Datacenter {} ({}) is {}: its bootstrap services are retired, then it is purged.",
                    dc.id,
                    dc.name,
                    status_name(dc.status)
                )?,
                OutputFormat::Json => out.write_all(output::json(&dc)?.as_bytes())?,
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
    use ctrlplane_proto::datacenter::v1::{Capacity, Location};

    fn parse(args: &[&str]) -> DatacenterCommand {
        let argv = ["ctrlplane", "dc"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv) {
            Ok(cli) => match cli.command {
                crate::cli::Command::Datacenter(d) => d.command,
                other => panic!("parsed {other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    fn parse_err(args: &[&str]) -> clap::Error {
        let argv = ["ctrlplane", "dc"].iter().chain(args).copied();
        crate::cli::Cli::try_parse_from(argv).unwrap_err()
    }

    fn update(args: &[&str]) -> Result<UpdateDatacenterRequest, CliError> {
        let mut argv = vec!["update", "dc_1"];
        argv.extend_from_slice(args);
        match parse(&argv) {
            DatacenterCommand::Update(a) => build_update(&a),
            other => panic!("parsed {other:?}"),
        }
    }

    fn mask(req: &UpdateDatacenterRequest) -> Vec<&str> {
        req.update_mask
            .as_ref()
            .unwrap()
            .paths
            .iter()
            .map(String::as_str)
            .collect()
    }

    fn write_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn update_mask_names_exactly_the_flags_given() {
        let req = update(&["--region", "eu-west"]).unwrap();
        assert_eq!(mask(&req), ["region"]);
        let dc = req.datacenter.unwrap();
        assert_eq!(
            (dc.id.as_str(), dc.region.as_str(), dc.name.as_str()),
            ("dc_1", "eu-west", "")
        );

        let req = update(&["--zone", "b", "--name", "N", "--provider", "docker"]).unwrap();
        assert_eq!(mask(&req), ["name", "provider_name", "zone"]);

        // An explicitly empty value is still a change (clears the field).
        let req = update(&["--zone", ""]).unwrap();
        assert_eq!(mask(&req), ["zone"]);

        let req = update(&[
            "--label",
            "env=prod",
            "--label",
            "team=a",
            "--metadata",
            "owner=x",
        ])
        .unwrap();
        assert_eq!(mask(&req), ["labels", "metadata"]);
        let dc = req.datacenter.unwrap();
        assert_eq!(dc.labels.len(), 2);
        assert_eq!(dc.metadata["owner"], "x");
    }

    #[test]
    fn clearing_sends_the_path_with_an_empty_value() {
        let req = update(&["--clear-labels", "--clear-metadata", "--clear-bootstrap"]).unwrap();
        assert_eq!(mask(&req), ["labels", "metadata", "bootstrap_services"]);
        let dc = req.datacenter.unwrap();
        assert!(dc.labels.is_empty() && dc.metadata.is_empty() && dc.bootstrap_services.is_empty());
    }

    #[test]
    fn update_with_bootstrap_file() {
        let dir = tempfile::tempdir().unwrap();
        let f = write_file(&dir, "b.json", r#"[{"name":"logs"},{"name":"metrics"}]"#);
        let req = update(&["--bootstrap-file", &f]).unwrap();
        assert_eq!(mask(&req), ["bootstrap_services"]);
        let names: Vec<_> = req
            .datacenter
            .unwrap()
            .bootstrap_services
            .into_iter()
            .map(|s| s.name)
            .collect();
        assert_eq!(names, ["logs", "metrics"]);
    }

    #[test]
    fn update_usage_errors() {
        assert!(
            matches!(update(&[]), Err(CliError::Usage(m)) if m.starts_with("nothing to update"))
        );
        assert!(matches!(
            update(&["--label", "a=1", "--label", "a=2"]),
            Err(CliError::Usage(_))
        ));
        for conflicting in [
            &["update", "dc_1", "--label", "a=1", "--clear-labels"][..],
            &["update", "dc_1", "--metadata", "a=1", "--clear-metadata"],
            &[
                "update",
                "dc_1",
                "--bootstrap-file",
                "f",
                "--clear-bootstrap",
            ],
        ] {
            assert_eq!(
                parse_err(conflicting).kind(),
                clap::error::ErrorKind::ArgumentConflict
            );
        }
        assert!(parse_err(&["update"]).to_string().contains("<ID>"));
    }

    #[test]
    fn create_from_flags() {
        let dir = tempfile::tempdir().unwrap();
        let f = write_file(&dir, "b.json", r#"{"bootstrapServices":[{"name":"logs"}]}"#);
        let DatacenterCommand::Create(a) = parse(&[
            "create",
            "--name",
            "Berlin 1",
            "--provider",
            "process",
            "--region",
            "eu",
            "--label",
            "env=prod",
            "--metadata",
            "k=v",
            "--tenant",
            "t1",
            "--bootstrap-file",
            &f,
        ]) else {
            panic!()
        };
        let dc = build_create(&a).unwrap();
        assert_eq!(dc.name, "Berlin 1");
        assert_eq!(dc.provider_name, "process");
        assert_eq!(dc.region, "eu");
        assert_eq!(dc.zone, "");
        assert_eq!(dc.tenant_id, "t1");
        assert_eq!(dc.labels["env"], "prod");
        assert_eq!(dc.metadata["k"], "v");
        assert_eq!(dc.bootstrap_services[0].name, "logs");
    }

    #[test]
    fn create_from_file_with_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let f = write_file(
            &dir,
            "dc.json",
            r#"{"name":"old","providerName":"docker","labels":{"env":"dev","team":"a"},
                "capacity":{"maxInstances":5}}"#,
        );
        let DatacenterCommand::Create(a) = parse(&[
            "create",
            "--from-file",
            &f,
            "--name",
            "new",
            "--label",
            "env=prod",
        ]) else {
            panic!()
        };
        let dc = build_create(&a).unwrap();
        assert_eq!(dc.name, "new");
        assert_eq!(dc.provider_name, "docker");
        assert_eq!(dc.labels["env"], "prod");
        assert_eq!(dc.labels["team"], "a");
        assert_eq!(dc.capacity.unwrap().max_instances, 5);
    }

    #[test]
    fn create_needs_name_and_provider_unless_from_file() {
        assert_eq!(
            parse_err(&["create", "--name", "x"]).kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert!(matches!(
            parse(&["create", "--from-file", "x.json"]),
            DatacenterCommand::Create(_)
        ));
        let DatacenterCommand::Create(a) = parse(&["create", "--from-file", "/nonexistent.json"])
        else {
            panic!()
        };
        assert!(
            build_create(&a)
                .unwrap_err()
                .to_string()
                .starts_with("/nonexistent.json: cannot read")
        );
    }

    #[test]
    fn get_takes_an_id_or_a_slug() {
        assert!(matches!(
            parse(&["get", "dc_1"]),
            DatacenterCommand::Get(GetArgs {
                id: Some(_),
                slug: None,
                ..
            })
        ));
        assert!(matches!(
            parse(&["get", "--slug", "berlin-1", "--tenant", "t1"]),
            DatacenterCommand::Get(GetArgs {
                id: None,
                slug: Some(_),
                tenant: Some(_)
            })
        ));
        assert_eq!(
            parse_err(&["get"]).kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse_err(&["get", "dc_1", "--slug", "x"]).kind(),
            clap::error::ErrorKind::ArgumentConflict
        );
        assert_eq!(
            parse_err(&["get", "dc_1", "--tenant", "t"]).kind(),
            clap::error::ErrorKind::ArgumentConflict
        );
        assert_eq!(
            parse_err(&["get", "--tenant", "t"]).kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
    }

    #[test]
    fn list_request_from_flags() {
        let DatacenterCommand::List(a) = parse(&[
            "list",
            "--status",
            "draining",
            "--provider",
            "docker",
            "--region",
            "eu",
            "-l",
            "env=prod,team=a",
            "--page-size",
            "10",
            "--tenant",
            "t1",
        ]) else {
            panic!()
        };
        let req = build_list(&a);
        assert_eq!(req.status, DatacenterStatus::Draining as i32);
        assert_eq!(req.provider_name, "docker");
        assert_eq!(req.region, "eu");
        assert_eq!(req.label_selector, "env=prod,team=a");
        assert_eq!(req.page_size, 10);
        assert_eq!(req.tenant_id, "t1");
        let DatacenterCommand::List(a) = parse(&["ls"]) else {
            panic!()
        };
        assert_eq!(build_list(&a), ListDatacentersRequest::default());
        assert!(
            parse_err(&["list", "--page-size", "0"])
                .to_string()
                .contains("0")
        );
        assert!(
            parse_err(&["list", "--status", "deleted"])
                .to_string()
                .contains("possible values")
        );
    }

    #[test]
    fn set_status_values() {
        let DatacenterCommand::SetStatus(a) =
            parse(&["set-status", "dc_1", "maintenance", "--reason", "rack swap"])
        else {
            panic!()
        };
        assert_eq!(
            DatacenterStatus::from(a.status),
            DatacenterStatus::Maintenance
        );
        assert_eq!(a.reason.as_deref(), Some("rack swap"));
        assert!(
            parse_err(&["set-status", "dc_1", "deleting"])
                .to_string()
                .contains("possible values")
        );
    }

    fn dc(n: u32) -> Datacenter {
        Datacenter {
            id: format!("dc_{n}"),
            name: format!("DC {n}"),
            slug: format!("dc-{n}"),
            provider_name: "process".into(),
            status: DatacenterStatus::Active as i32,
            revision: i64::from(n),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn all_follows_every_page() {
        // A fake server: five datacenters, two per page, token = offset.
        let pages = |req: &ListDatacentersRequest| {
            let start: usize = req.page_token.parse().unwrap_or(0);
            let end = (start + 2).min(5);
            ListDatacentersResponse {
                datacenters: (start..end).map(|i| dc(i as u32)).collect(),
                next_page_token: if end < 5 {
                    end.to_string()
                } else {
                    String::new()
                },
                total_size: 5,
            }
        };
        let mut calls = 0;
        let resp = list_pages(ListDatacentersRequest::default(), true, async |req| {
            calls += 1;
            Ok(pages(&req))
        })
        .await
        .unwrap();
        assert_eq!(calls, 3);
        assert_eq!(resp.datacenters.len(), 5);
        assert_eq!(resp.next_page_token, "");
        assert_eq!(resp.total_size, 5);

        let mut calls = 0;
        let resp = list_pages(ListDatacentersRequest::default(), false, async |req| {
            calls += 1;
            Ok(pages(&req))
        })
        .await
        .unwrap();
        assert_eq!(
            (calls, resp.datacenters.len(), resp.next_page_token.as_str()),
            (1, 2, "2")
        );
    }

    #[tokio::test]
    async fn a_repeated_page_token_stops_the_loop() {
        let err = list_pages(ListDatacentersRequest::default(), true, async |_req| {
            Ok(ListDatacentersResponse {
                datacenters: vec![dc(1)],
                next_page_token: "same".into(),
                total_size: 9,
            })
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    #[test]
    fn list_table_layout() {
        let mut shared = dc(1);
        shared.region = "eu-central".into();
        let mut owned = dc(22);
        owned.tenant_id = "t1".into();
        owned.status = DatacenterStatus::Maintenance as i32;
        let resp = ListDatacentersResponse {
            datacenters: vec![shared, owned],
            next_page_token: String::new(),
            total_size: 2,
        };
        assert_eq!(
            list_table(&resp),
            "\
ID      NAME    SLUG    TENANT   PROVIDER   REGION       STATUS        REVISION
dc_1    DC 1    dc-1    -        process    eu-central   active        1
dc_22   DC 22   dc-22   t1       process    -            maintenance   22
Total: 2
"
        );
        let more = ListDatacentersResponse {
            next_page_token: "abc".into(),
            total_size: 7,
            ..resp.clone()
        };
        assert!(
            list_table(&more).ends_with("Showing 2 of 7. Next page: --page-token abc (or --all)\n")
        );
        assert_eq!(
            list_table(&ListDatacentersResponse::default()),
            "No datacenters found (total: 0).\n"
        );
    }

    #[test]
    fn list_json_always_has_all_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&list_json(&ListDatacentersResponse::default()).unwrap()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"datacenters": [], "nextPageToken": "", "totalSize": 0})
        );
        let resp = ListDatacentersResponse {
            datacenters: vec![dc(1)],
            next_page_token: "n".into(),
            total_size: 3,
        };
        let text = list_json(&resp).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["datacenters"][0]["id"], "dc_1");
        assert_eq!(v["datacenters"][0]["status"], "DATACENTER_STATUS_ACTIVE");
        assert_eq!(v["nextPageToken"], "n");
        assert_eq!(v["totalSize"], 3);
        // What -o json prints parses back as the proto message.
        let back: ListDatacentersResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(back, resp);
    }

    #[test]
    fn details_view() {
        let mut d = dc(1);
        d.labels.insert("env".into(), "prod".into());
        d.location = Some(Location {
            latitude: 52.5,
            longitude: 13.4,
            country: "DE".into(),
            city: "Berlin".into(),
        });
        d.capacity = Some(Capacity {
            max_instances: 10,
            max_cpu_millis: 0,
            max_memory_mb: 8192,
        });
        d.bootstrap_services = vec![
            BootstrapServiceSpec {
                name: "logs".into(),
                ..Default::default()
            },
            BootstrapServiceSpec {
                name: "metrics".into(),
                ..Default::default()
            },
        ];
        d.create_time = Some(ctrlplane_proto::pbjson_types::Timestamp {
            seconds: 1_714_564_803,
            nanos: 0,
        });
        assert_eq!(
            details(&d),
            "\
ID:                  dc_1
Name:                DC 1
Slug:                dc-1
Tenant:              - (platform-shared)
Provider:            process
Region:              -
Zone:                -
Status:              active
Revision:            1
Labels:              env=prod
Metadata:            -
Location:            Berlin, DE (52.5, 13.4)
Capacity:            instances=10 cpu=unlimited memory=8192Mi
Bootstrap services:  logs
                     metrics
Last checked:        -
Created:             2024-05-01T12:00:03Z
Updated:             -
"
        );
    }

    #[test]
    fn status_names() {
        assert_eq!(status_name(DatacenterStatus::Draining as i32), "draining");
        assert_eq!(status_name(0), "unspecified");
        assert_eq!(status_name(42), "unknown(42)");
    }
}
