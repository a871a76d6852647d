//! `ctrlplane agents …` (alias `agent`): mint join tokens and look after the
//! registry of provider agents through `AgentRegistryService`, which the
//! datacenter service serves (same `--endpoint` / `CP_DATACENTER_ADDR`).
//!
//! As in [`crate::cmd::datacenter`], requests are built and results
//! rendered by pure functions, so the flag → request mapping and every view
//! are unit-tested without a server.

use std::io::Write;
use std::time::Duration;

use clap::{Args, Subcommand};
use ctrlplane_proto::agent::v1::{
    Agent, AgentHealth, CheckAgentsRequest, CheckAgentsResponse, CreateJoinTokenRequest,
    CreateJoinTokenResponse, GetAgentRequest, ListAgentsRequest, ListAgentsResponse,
    RevokeAgentRequest,
};
use ctrlplane_proto::pbjson_types;
use ctrlplane_runtime::config::{DATACENTER_ADDR, JOIN_TOKEN};

use crate::context::{Context, Peer};
use crate::error::CliError;
use crate::output::{self, OutputFormat, or_dash};

/// Arguments of `ctrlplane agents`.
#[derive(Debug, Clone, Args)]
pub struct AgentsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: AgentsCommand,
}

/// The agents subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AgentsCommand {
    /// Mint a join token for a provider's agent (printed once: only the token in table mode)
    Token(TokenArgs),
    /// List registered agents (revoked ones included), paginated
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// Show one agent
    Get(IdArgs),
    /// Revoke an agent: its credential stops working at once, it is never used again
    Revoke(IdArgs),
    /// Probe every agent's health now; prints each one's health, latency and error
    Check,
}

const TOKEN_AFTER_HELP: &str = "\
In table mode only the token is printed on stdout (a hint on how to use it goes to stderr), so:
  TOKEN=$(ctrlplane agents token --provider process)
  CP_JOIN_TOKEN=$TOKEN ctrlplane-agent-process
The token is shown only once; the server stores only its hash.
With -o json the whole response is printed: {\"joinToken\": {…}, \"token\": \"…\"}.";

/// Arguments of `ctrlplane agents token`.
#[derive(Debug, Clone, Args)]
#[command(after_help = TOKEN_AFTER_HELP)]
pub struct TokenArgs {
    /// Provider the token admits agents of, e.g. process, docker, kubernetes, nomad
    #[arg(long, value_name = "PROVIDER")]
    pub provider: String,

    /// How long the token can be used (e.g. 10m, 1h, 24h) [default: the server's, 1h]
    #[arg(long, value_name = "DURATION", value_parser = crate::input::parse_positive_duration)]
    pub ttl: Option<Duration>,

    /// How many agents may join with it [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
    pub max_uses: Option<i32>,
}

const LIST_AFTER_HELP: &str = "\
Examples:
  ctrlplane agents list --provider docker
  ctrlplane agents list --all -o json | jq -r '.agents[] | select(.health == \"AGENT_HEALTH_HEALTHY\") | .id'";

/// Arguments of `ctrlplane agents list`.
#[derive(Debug, Clone, Args)]
#[command(after_help = LIST_AFTER_HELP)]
pub struct ListArgs {
    /// Only agents of this provider
    #[arg(long, value_name = "PROVIDER")]
    pub provider: Option<String>,

    /// Agents per page (1-1000) [default: the server's, 100]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1000))]
    pub page_size: Option<i32>,

    /// Continue from a previous page (its next page token)
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,

    /// Follow the page tokens and print every page
    #[arg(long)]
    pub all: bool,
}

/// Arguments of `ctrlplane agents get` and `revoke`.
#[derive(Debug, Clone, Args)]
pub struct IdArgs {
    /// Agent id (agt_…)
    pub id: String,
}

/// Converts a duration to its protobuf form.
pub fn to_proto_duration(d: Duration) -> pbjson_types::Duration {
    pbjson_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Always below 10^9, so it fits.
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The join-token request: unset flags are left to the server's defaults.
pub fn build_token(a: &TokenArgs) -> CreateJoinTokenRequest {
    CreateJoinTokenRequest {
        provider_name: a.provider.clone(),
        ttl: a.ttl.map(to_proto_duration),
        max_uses: a.max_uses.unwrap_or(0),
    }
}

/// The first list request.
pub fn build_list(a: &ListArgs) -> ListAgentsRequest {
    ListAgentsRequest {
        provider_name: a.provider.clone().unwrap_or_default(),
        page_size: a.page_size.unwrap_or(0),
        page_token: a.page_token.clone().unwrap_or_default(),
    }
}

pub use super::paging::list_pages;

/// `healthy`, `unhealthy`, `revoked` for a health number.
pub fn health_name(health: i32) -> String {
    match AgentHealth::try_from(health) {
        Ok(h) => h
            .as_str_name()
            .trim_start_matches("AGENT_HEALTH_")
            .to_ascii_lowercase(),
        Err(_) => format!("unknown({health})"),
    }
}

/// A probe latency, e.g. `850µs`, `12ms`, `1.5s`; `-` when never probed.
pub fn latency(d: Option<&pbjson_types::Duration>) -> String {
    let Some(d) = d else {
        return "-".to_string();
    };
    let micros = i128::from(d.seconds) * 1_000_000 + i128::from(d.nanos) / 1_000;
    if micros < 1_000 {
        format!("{micros}µs")
    } else if micros < 1_000_000 {
        format!("{}ms", micros / 1_000)
    } else {
        // Tenths of a second, rounded down.
        format!("{}.{}s", micros / 1_000_000, micros % 1_000_000 / 100_000)
    }
}

/// Capabilities joined with `,`; `-` for none.
pub fn capabilities(agent: &Agent) -> String {
    or_dash(&agent.capabilities.join(","))
}

/// The command that starts a provider's agent: the project's binary for
/// the providers it ships, a description otherwise.
pub fn agent_binary(provider: &str) -> String {
    match provider {
        "process" | "docker" | "kubernetes" | "nomad" => format!("ctrlplane-agent-{provider}"),
        other => format!("<the {other} agent>"),
    }
}

/// What `agents token` tells the user on stderr: what the token admits and
/// how to start an agent with it. The token itself is not repeated.
pub fn token_hint(resp: &CreateJoinTokenResponse, datacenter_addr: &str) -> String {
    let (id, provider, uses, expires) = match &resp.join_token {
        Some(t) => (
            t.id.as_str(),
            t.provider_name.as_str(),
            t.max_uses,
            output::timestamp(t.expire_time.as_ref()),
        ),
        None => ("?", "?", 1, "-".to_string()),
    };
    let uses = if uses == 1 {
        "single use".to_string()
    } else {
        format!("up to {uses} agents")
    };
    format!(
        "Join token {id} for provider {provider:?} ({uses}, expires {expires}); it is shown only once.\n\
         Start an agent with it:\n  \
         {JOIN_TOKEN}=<token> {DATACENTER_ADDR}={datacenter_addr} {}\n",
        agent_binary(provider)
    )
}

/// What `agents token` prints on stdout: the bare token (table mode, for
/// `$(…)`), or the whole response as proto JSON.
///
/// # Errors
/// A response the JSON encoder refuses.
pub fn token_output(
    resp: &CreateJoinTokenResponse,
    format: OutputFormat,
) -> Result<String, CliError> {
    match format {
        OutputFormat::Table => Ok(format!("{}\n", resp.token)),
        OutputFormat::Json => output::json(resp),
    }
}

/// Columns of the list table.
pub const LIST_HEADERS: [&str; 7] = [
    "ID",
    "PROVIDER",
    "ENDPOINT",
    "HEALTH",
    "VERSION",
    "LAST HEARTBEAT",
    "CAPABILITIES",
];

/// One row of the list table.
pub fn list_row(a: &Agent) -> Vec<String> {
    vec![
        a.id.clone(),
        or_dash(&a.provider_name),
        or_dash(&a.endpoint),
        health_name(a.health),
        or_dash(&a.version),
        output::timestamp(a.last_heartbeat_time.as_ref()),
        capabilities(a),
    ]
}

/// The list view: the table and a footer with the count (and how to get
/// the next page, if there is one).
pub fn list_table(resp: &ListAgentsResponse, provider: Option<&str>) -> String {
    if resp.agents.is_empty() {
        let provider = provider.filter(|p| !p.is_empty());
        let which = provider.map_or(String::new(), |p| format!(" for provider {p:?}"));
        return format!(
            "No agents found{which}. Agents join with a token from `ctrlplane agents token --provider {}`.\n",
            provider.unwrap_or("PROVIDER")
        );
    }
    let rows: Vec<_> = resp.agents.iter().map(list_row).collect();
    let mut out = output::table(&LIST_HEADERS, &rows);
    if resp.next_page_token.is_empty() {
        out.push_str(&format!("Total: {}\n", rows.len()));
    } else {
        out.push_str(&format!(
            "Showing {}. Next page: --page-token {} (or --all)\n",
            rows.len(),
            resp.next_page_token
        ));
    }
    out
}

/// Proto JSON of a response with the listed keys present even when empty
/// (proto JSON leaves out empty fields, which makes `jq '.agents[]'` fail
/// on an empty list).
fn json_with_defaults<T: serde::Serialize>(
    value: &T,
    defaults: &[(&str, serde_json::Value)],
) -> Result<String, CliError> {
    let mut value = serde_json::to_value(value)
        .map_err(|e| CliError::Config(format!("cannot encode JSON: {e}")))?;
    if let Some(obj) = value.as_object_mut() {
        for (key, default) in defaults {
            obj.entry(*key).or_insert_with(|| default.clone());
        }
    }
    output::json_value(value)
}

/// The list as JSON: the `ListAgentsResponse` with both fields always
/// present.
///
/// # Errors
/// A response the JSON encoder refuses.
pub fn list_json(resp: &ListAgentsResponse) -> Result<String, CliError> {
    json_with_defaults(
        resp,
        &[
            ("agents", serde_json::json!([])),
            ("nextPageToken", serde_json::json!("")),
        ],
    )
}

/// The `Key: value` view of one agent.
pub fn details(a: &Agent) -> String {
    let caps = if a.capabilities.is_empty() {
        "-".to_string()
    } else {
        a.capabilities.join("\n")
    };
    let info = a.info.clone().into_iter().collect();
    output::key_values(&[
        ("ID", a.id.clone()),
        ("Provider", or_dash(&a.provider_name)),
        ("Endpoint", or_dash(&a.endpoint)),
        ("Health", health_name(a.health)),
        ("Version", or_dash(&a.version)),
        ("Info", output::pairs(&info)),
        ("Capabilities", caps),
        (
            "Last heartbeat",
            output::timestamp(a.last_heartbeat_time.as_ref()),
        ),
        (
            "Lease expires",
            output::timestamp(a.lease_expire_time.as_ref()),
        ),
        (
            "Last checked",
            output::timestamp(a.last_checked_at.as_ref()),
        ),
        ("Last latency", latency(a.last_latency.as_ref())),
        ("Last error", or_dash(&a.last_error)),
        ("Created", output::timestamp(a.create_time.as_ref())),
        ("Updated", output::timestamp(a.update_time.as_ref())),
    ])
}

/// Columns of the check table.
pub const CHECK_HEADERS: [&str; 6] = ["ID", "PROVIDER", "ENDPOINT", "HEALTH", "LATENCY", "ERROR"];

/// The check view: one row per probed agent (by id) and a summary.
pub fn check_table(resp: &CheckAgentsResponse) -> String {
    if resp.agents.is_empty() {
        return "No agents to check (revoked agents are not probed).\n".to_string();
    }
    let rows: Vec<Vec<String>> = resp
        .agents
        .iter()
        .map(|a| {
            vec![
                a.id.clone(),
                or_dash(&a.provider_name),
                or_dash(&a.endpoint),
                health_name(a.health),
                latency(a.last_latency.as_ref()),
                or_dash(&a.last_error),
            ]
        })
        .collect();
    let healthy = resp
        .agents
        .iter()
        .filter(|a| a.health == AgentHealth::Healthy as i32)
        .count();
    let mut out = output::table(&CHECK_HEADERS, &rows);
    out.push_str(&format!(
        "Checked {}: {healthy} healthy, {} not.\n",
        plural(rows.len(), "agent"),
        rows.len() - healthy
    ));
    out
}

/// The check as JSON: the `CheckAgentsResponse`, `agents` always present.
///
/// # Errors
/// A response the JSON encoder refuses.
pub fn check_json(resp: &CheckAgentsResponse) -> Result<String, CliError> {
    json_with_defaults(resp, &[("agents", serde_json::json!([]))])
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("{n} {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

fn one(agent: Option<Agent>) -> Result<Agent, CliError> {
    agent.ok_or_else(|| CliError::Rpc {
        status: tonic::Status::internal("the response carried no agent"),
        service: Peer::Datacenter.name(),
        addr: String::new(),
    })
}

fn print_one(out: &mut dyn Write, format: OutputFormat, a: &Agent) -> Result<(), CliError> {
    match format {
        OutputFormat::Table => out.write_all(details(a).as_bytes())?,
        OutputFormat::Json => out.write_all(output::json(a)?.as_bytes())?,
    }
    Ok(())
}

/// Runs an agents subcommand. Results go to `out`; the hint of `token`
/// goes to `err`.
///
/// # Errors
/// Bad arguments, no token, or the failed call.
pub async fn run(
    ctx: &Context,
    args: AgentsArgs,
    format: OutputFormat,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError> {
    const DC: Peer = Peer::Datacenter;
    match args.command {
        AgentsCommand::Token(a) => {
            let req = build_token(&a);
            let mut client = ctx.agents()?;
            let resp = ctx
                .call(DC, client.create_join_token(ctx.request(req)))
                .await?;
            out.write_all(token_output(&resp, format)?.as_bytes())?;
            // The hint is a courtesy: a closed stderr must not fail a
            // command whose result was printed.
            let _ = err.write_all(token_hint(&resp, &ctx.addr(DC)).as_bytes());
            Ok(())
        }
        AgentsCommand::List(a) => {
            let first = build_list(&a);
            let mut client = ctx.agents()?;
            let resp = list_pages(first, a.all, async |req| {
                ctx.call(DC, client.list_agents(ctx.request(req))).await
            })
            .await?;
            let text = match format {
                OutputFormat::Table => list_table(&resp, a.provider.as_deref()),
                OutputFormat::Json => list_json(&resp)?,
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
        AgentsCommand::Get(a) => {
            let mut client = ctx.agents()?;
            let resp = ctx
                .call(
                    DC,
                    client.get_agent(ctx.request(GetAgentRequest { id: a.id })),
                )
                .await?;
            print_one(out, format, &one(resp.agent)?)
        }
        AgentsCommand::Revoke(a) => {
            let mut client = ctx.agents()?;
            let resp = ctx
                .call(
                    DC,
                    client.revoke_agent(ctx.request(RevokeAgentRequest { id: a.id })),
                )
                .await?;
            let agent = one(resp.agent)?;
            match format {
                OutputFormat::Table => writeln!(
                    out,
                    "Agent {} ({} at {}) is {}: its credential no longer works and it is never used again.",
                    agent.id,
                    or_dash(&agent.provider_name),
                    or_dash(&agent.endpoint),
                    health_name(agent.health)
                )?,
                OutputFormat::Json => out.write_all(output::json(&agent)?.as_bytes())?,
            }
            Ok(())
        }
        AgentsCommand::Check => {
            let mut client = ctx.agents()?;
            let mut resp = ctx
                .call(DC, client.check_agents(ctx.request(CheckAgentsRequest {})))
                .await?;
            // Probes finish in any order; print them in a stable one.
            resp.agents.sort_by(|a, b| a.id.cmp(&b.id));
            let text = match format {
                OutputFormat::Table => check_table(&resp),
                OutputFormat::Json => check_json(&resp)?,
            };
            out.write_all(text.as_bytes())?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use ctrlplane_proto::agent::v1::JoinToken;
    use ctrlplane_proto::pbjson_types::Timestamp;

    fn parse(args: &[&str]) -> AgentsCommand {
        let argv = ["ctrlplane", "agents"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv) {
            Ok(cli) => match cli.command {
                crate::cli::Command::Agents(a) => a.command,
                other => panic!("parsed {other:?}"),
            },
            Err(e) => panic!("{e}"),
        }
    }

    fn parse_err(args: &[&str]) -> clap::Error {
        let argv = ["ctrlplane", "agents"].iter().chain(args).copied();
        crate::cli::Cli::try_parse_from(argv).unwrap_err()
    }

    fn ts(seconds: i64) -> Option<Timestamp> {
        Some(Timestamp { seconds, nanos: 0 })
    }

    fn agent(n: u32, health: AgentHealth) -> Agent {
        Agent {
            id: format!("agt_{n}"),
            provider_name: "process".into(),
            endpoint: format!("http://10.0.0.{n}:7401"),
            version: "0.1.0".into(),
            capabilities: vec!["provision".into(), "logs".into()],
            health: health as i32,
            last_heartbeat_time: ts(1_714_564_803),
            ..Default::default()
        }
    }

    #[test]
    fn token_request_leaves_unset_flags_to_the_server() {
        let AgentsCommand::Token(a) = parse(&["token", "--provider", "process"]) else {
            panic!()
        };
        assert_eq!(
            build_token(&a),
            CreateJoinTokenRequest {
                provider_name: "process".into(),
                ttl: None,
                max_uses: 0,
            }
        );
        let AgentsCommand::Token(a) = parse(&[
            "token",
            "--provider",
            "docker",
            "--ttl",
            "90m",
            "--max-uses",
            "3",
        ]) else {
            panic!()
        };
        let req = build_token(&a);
        assert_eq!(req.provider_name, "docker");
        assert_eq!(
            req.ttl,
            Some(pbjson_types::Duration {
                seconds: 5400,
                nanos: 0
            })
        );
        assert_eq!(req.max_uses, 3);
    }

    #[test]
    fn token_usage_errors() {
        assert_eq!(
            parse_err(&["token"]).kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        for bad in [
            &["token", "--provider", "p", "--max-uses", "0"][..],
            &["token", "--provider", "p", "--max-uses", "-1"],
            &["token", "--provider", "p", "--ttl", "0s"],
            &["token", "--provider", "p", "--ttl", "soon"],
        ] {
            assert_eq!(parse_err(bad).exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn aliases_and_other_commands_parse() {
        let argv = ["ctrlplane", "agent", "ls", "--provider", "docker", "--all"];
        let cli = crate::cli::Cli::try_parse_from(argv).unwrap();
        let crate::cli::Command::Agents(AgentsArgs {
            command: AgentsCommand::List(a),
        }) = cli.command
        else {
            panic!()
        };
        assert!(a.all);
        assert_eq!(
            build_list(&a),
            ListAgentsRequest {
                provider_name: "docker".into(),
                page_size: 0,
                page_token: String::new(),
            }
        );
        let AgentsCommand::List(a) = parse(&["list", "--page-size", "5", "--page-token", "t"])
        else {
            panic!()
        };
        assert_eq!(
            (build_list(&a).page_size, a.page_token.as_deref()),
            (5, Some("t"))
        );
        assert!(
            parse_err(&["list", "--page-size", "0"])
                .to_string()
                .contains('0')
        );
        assert!(
            matches!(parse(&["get", "agt_1"]), AgentsCommand::Get(IdArgs { id }) if id == "agt_1")
        );
        assert!(matches!(
            parse(&["revoke", "agt_1"]),
            AgentsCommand::Revoke(_)
        ));
        assert!(matches!(parse(&["check"]), AgentsCommand::Check));
        assert_eq!(
            parse_err(&["get"]).kind(),
            clap::error::ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            parse_err(&["check", "extra"]).kind(),
            clap::error::ErrorKind::UnknownArgument
        );
        // The global options work here too.
        let cli = crate::cli::Cli::try_parse_from([
            "ctrlplane",
            "agents",
            "token",
            "--provider",
            "p",
            "-o",
            "json",
            "--endpoint",
            "h:1",
        ])
        .unwrap();
        assert_eq!(cli.global.output, OutputFormat::Json);
        assert_eq!(cli.global.endpoint.as_deref(), Some("h:1"));
    }

    fn token_response() -> CreateJoinTokenResponse {
        CreateJoinTokenResponse {
            join_token: Some(JoinToken {
                id: "jtk_1".into(),
                provider_name: "process".into(),
                expire_time: ts(1_714_568_403),
                max_uses: 1,
                uses: 0,
                create_time: ts(1_714_564_803),
            }),
            token: "jtk_1.c2VjcmV0".into(),
        }
    }

    #[test]
    fn token_table_output_is_just_the_token() {
        assert_eq!(
            token_output(&token_response(), OutputFormat::Table).unwrap(),
            "jtk_1.c2VjcmV0\n"
        );
    }

    #[test]
    fn token_json_output_is_the_response() {
        let text = token_output(&token_response(), OutputFormat::Json).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["token"], "jtk_1.c2VjcmV0");
        assert_eq!(v["joinToken"]["id"], "jtk_1");
        assert_eq!(v["joinToken"]["providerName"], "process");
        assert_eq!(v["joinToken"]["maxUses"], 1);
        assert_eq!(v["joinToken"]["expireTime"], "2024-05-01T13:00:03+00:00");
        let back: CreateJoinTokenResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(back, token_response());
    }

    #[test]
    fn token_hint_says_how_to_start_an_agent() {
        let hint = token_hint(&token_response(), "http://127.0.0.1:7100");
        assert_eq!(
            hint,
            "Join token jtk_1 for provider \"process\" (single use, expires 2024-05-01T13:00:03Z); \
             it is shown only once.\n\
             Start an agent with it:\n  \
             CP_JOIN_TOKEN=<token> CP_DATACENTER_ADDR=http://127.0.0.1:7100 ctrlplane-agent-process\n"
        );
        assert!(
            !hint.contains("c2VjcmV0"),
            "the secret is printed once only"
        );
        let mut resp = token_response();
        let t = resp.join_token.as_mut().unwrap();
        t.provider_name = "edge".into();
        t.max_uses = 5;
        let hint = token_hint(&resp, "http://dc:7100");
        assert!(hint.contains("(up to 5 agents, "), "{hint}");
        assert!(
            hint.ends_with("CP_DATACENTER_ADDR=http://dc:7100 <the edge agent>\n"),
            "{hint}"
        );
    }

    #[test]
    fn durations_and_latencies() {
        assert_eq!(
            to_proto_duration(Duration::from_millis(1500)),
            pbjson_types::Duration {
                seconds: 1,
                nanos: 500_000_000
            }
        );
        let d = |seconds, nanos| latency(Some(&pbjson_types::Duration { seconds, nanos }));
        assert_eq!(latency(None), "-");
        assert_eq!(d(0, 850_000), "850µs");
        assert_eq!(d(0, 12_400_000), "12ms");
        assert_eq!(d(1, 570_000_000), "1.5s");
        assert_eq!(d(5, 0), "5.0s");
    }

    #[test]
    fn health_names() {
        assert_eq!(health_name(AgentHealth::Healthy as i32), "healthy");
        assert_eq!(health_name(AgentHealth::Revoked as i32), "revoked");
        assert_eq!(health_name(0), "unspecified");
        assert_eq!(health_name(9), "unknown(9)");
    }

    #[test]
    fn list_table_layout() {
        let mut bare = agent(22, AgentHealth::Unhealthy);
        bare.capabilities.clear();
        bare.version.clear();
        bare.last_heartbeat_time = None;
        let resp = ListAgentsResponse {
            agents: vec![agent(1, AgentHealth::Healthy), bare],
            next_page_token: String::new(),
        };
        assert_eq!(
            list_table(&resp, None),
            "\
ID       PROVIDER   ENDPOINT                HEALTH      VERSION   LAST HEARTBEAT         CAPABILITIES
agt_1    process    http://10.0.0.1:7401    healthy     0.1.0     2024-05-01T12:00:03Z   provision,logs
agt_22   process    http://10.0.0.22:7401   unhealthy   -         -                      -
Total: 2
"
        );
        let more = ListAgentsResponse {
            next_page_token: "abc".into(),
            ..resp
        };
        assert!(
            list_table(&more, None)
                .ends_with("Showing 2. Next page: --page-token abc (or --all)\n")
        );
        assert_eq!(
            list_table(&ListAgentsResponse::default(), Some("docker")),
            "No agents found for provider \"docker\". Agents join with a token from \
             `ctrlplane agents token --provider docker`.\n"
        );
        assert!(
            list_table(&ListAgentsResponse::default(), None)
                .starts_with("No agents found. Agents join with a token from `ctrlplane agents token --provider PROVIDER`")
        );
    }

    #[test]
    fn list_json_always_has_all_fields() {
        let v: serde_json::Value =
            serde_json::from_str(&list_json(&ListAgentsResponse::default()).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"agents": [], "nextPageToken": ""}));
        let resp = ListAgentsResponse {
            agents: vec![agent(1, AgentHealth::Healthy)],
            next_page_token: "n".into(),
        };
        let text = list_json(&resp).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["agents"][0]["id"], "agt_1");
        assert_eq!(v["agents"][0]["health"], "AGENT_HEALTH_HEALTHY");
        assert_eq!(v["agents"][0]["providerName"], "process");
        let back: ListAgentsResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(back, resp);
    }

    #[tokio::test]
    async fn all_follows_every_page() {
        // A fake server: five agents, two per page, token = offset.
        let pages = |req: &ListAgentsRequest| {
            let start: usize = req.page_token.parse().unwrap_or(0);
            let end = (start + 2).min(5);
            ListAgentsResponse {
                agents: (start..end)
                    .map(|i| agent(i as u32, AgentHealth::Healthy))
                    .collect(),
                next_page_token: if end < 5 {
                    end.to_string()
                } else {
                    String::new()
                },
            }
        };
        let mut calls = 0;
        let resp = list_pages(ListAgentsRequest::default(), true, async |req| {
            calls += 1;
            Ok(pages(&req))
        })
        .await
        .unwrap();
        assert_eq!(
            (calls, resp.agents.len(), resp.next_page_token.as_str()),
            (3, 5, "")
        );
        let mut calls = 0;
        let resp = list_pages(ListAgentsRequest::default(), false, async |req| {
            calls += 1;
            Ok(pages(&req))
        })
        .await
        .unwrap();
        assert_eq!(
            (calls, resp.agents.len(), resp.next_page_token.as_str()),
            (1, 2, "2")
        );
        let err = list_pages(ListAgentsRequest::default(), true, async |_req| {
            Ok(ListAgentsResponse {
                agents: vec![],
                next_page_token: "same".into(),
            })
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("twice"), "{err}");
    }

    #[test]
    fn details_view() {
        let mut a = agent(1, AgentHealth::Unhealthy);
        a.info.insert("os".into(), "linux".into());
        a.info.insert("arch".into(), "x86_64".into());
        a.lease_expire_time = ts(1_714_564_833);
        a.last_checked_at = ts(1_714_564_900);
        a.last_latency = Some(pbjson_types::Duration {
            seconds: 0,
            nanos: 3_000_000,
        });
        a.last_error = "Unavailable: connection refused".into();
        a.create_time = ts(1_714_564_800);
        assert_eq!(
            details(&a),
            "\
ID:              agt_1
Provider:        process
Endpoint:        http://10.0.0.1:7401
Health:          unhealthy
Version:         0.1.0
Info:            arch=x86_64,os=linux
Capabilities:    provision
                 logs
Last heartbeat:  2024-05-01T12:00:03Z
Lease expires:   2024-05-01T12:00:33Z
Last checked:    2024-05-01T12:01:40Z
Last latency:    3ms
Last error:      Unavailable: connection refused
Created:         2024-05-01T12:00:00Z
Updated:         -
"
        );
    }

    #[test]
    fn check_view() {
        let mut down = agent(2, AgentHealth::Unhealthy);
        down.last_latency = Some(pbjson_types::Duration {
            seconds: 0,
            nanos: 420_000,
        });
        down.last_error = "no answer within 5s".into();
        let mut up = agent(1, AgentHealth::Healthy);
        up.last_latency = Some(pbjson_types::Duration {
            seconds: 0,
            nanos: 2_000_000,
        });
        let resp = CheckAgentsResponse {
            agents: vec![up, down],
        };
        assert_eq!(
            check_table(&resp),
            "\
ID      PROVIDER   ENDPOINT               HEALTH      LATENCY   ERROR
agt_1   process    http://10.0.0.1:7401   healthy     2ms       -
agt_2   process    http://10.0.0.2:7401   unhealthy   420µs     no answer within 5s
Checked 2 agents: 1 healthy, 1 not.
"
        );
        assert_eq!(
            check_table(&CheckAgentsResponse::default()),
            "No agents to check (revoked agents are not probed).\n"
        );
        let v: serde_json::Value =
            serde_json::from_str(&check_json(&CheckAgentsResponse::default()).unwrap()).unwrap();
        assert_eq!(v, serde_json::json!({"agents": []}));
        let v: serde_json::Value = serde_json::from_str(&check_json(&resp).unwrap()).unwrap();
        assert_eq!(v["agents"][1]["lastError"], "no answer within 5s");
        assert_eq!(v["agents"][1]["lastLatency"], "0.000420s");
    }
}
