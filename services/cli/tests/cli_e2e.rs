//! End to end: the real `ctrlplane-datacenter` binary on a temp SQLite file,
//! driven by the real `ctrlplane` binary through token → agents token →
//! (agents join) → agents list/get → create → get → list → update →
//! set-status → delete → agents check/revoke, checking stdout, stderr and
//! exit codes.
//!
//! Datacenters can only be created on a provider some agent has joined for,
//! so the test mints join tokens with `ctrlplane agents token` and joins
//! agents itself, calling `JoinAgent` as `ctrlplane-agent-*` do (no bearer
//! token; the join token is the credential). Nothing serves at the agents'
//! endpoints, so `agents check` finds them unhealthy.
//!
//! The server binary is not a dependency of this crate, so it is looked up
//! next to the `ctrlplane` binary (same target dir and profile), then under
//! `CARGO_TARGET_DIR` / the workspace `target/`. Build it first (`cargo build
//! -p ctrlplane-datacenter`, or test the whole workspace). When it is
//! missing the test is skipped with a message, except in CI (`CI` set),
//! where that is a failure.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient;
use ctrlplane_proto::agent::v1::{
    Agent, AgentHealth, CheckAgentsResponse, CreateJoinTokenResponse, JoinAgentRequest,
    JoinAgentResponse, ListAgentsResponse,
};
use ctrlplane_proto::datacenter::v1::{Datacenter, DatacenterStatus, ListDatacentersResponse};
use ctrlplane_runtime::auth::{Authenticator, ROLE_ADMIN};

const SECRET: &str = "e2e-secret-e2e-secret-e2e-secret-0123";
const CLI: &str = env!("CARGO_BIN_EXE_ctrlplane");

fn server_binary() -> Option<PathBuf> {
    let name = format!("ctrlplane-datacenter{}", std::env::consts::EXE_SUFFIX);
    let mut candidates = Vec::new();
    if let Some(dir) = Path::new(CLI).parent() {
        candidates.push(dir.join(&name));
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    candidates.push(target.join("debug").join(&name));
    candidates.into_iter().find(|p| p.is_file())
}

/// The running server; killed when dropped.
struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// Starts the server on a free port, retrying with another port if one
    /// is taken between choosing and binding it.
    fn start(bin: &Path, dir: &Path) -> Server {
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr = format!("127.0.0.1:{port}");
            let log = dir.join(format!("server-{attempt}.log"));
            let log_file = std::fs::File::create(&log).unwrap();
            let child = Command::new(bin)
                .env("CP_LISTEN_ADDR", &addr)
                .env(
                    "CP_DATABASE_URL",
                    format!("sqlite://{}", dir.join("datacenter.db").display()),
                )
                .env("CP_AUTH_SECRET", SECRET)
                .env_remove("CP_AUTH_SECRET_FILE")
                .env("CP_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            let mut server = Server { child, addr, log };
            if server.wait_ready() {
                return server;
            }
            let text = std::fs::read_to_string(&server.log).unwrap_or_default();
            assert!(
                text.contains("in use"),
                "the datacenter server failed to start:\n{text}"
            );
        }
        panic!("no free port found for the datacenter server");
    }

    /// Waits until the port accepts connections; false if the process
    /// exited first.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            if TcpStream::connect(&self.addr).is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the datacenter server did not listen on {} within 60s:\n{}",
            self.addr,
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }
}

/// Runs `ctrlplane` with a clean environment: no `CP_*` from the caller,
/// HOME and XDG_CONFIG_HOME in the temp dir, plus `env`.
fn run(home: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(CLI);
    for (k, _) in std::env::vars() {
        if k.starts_with("CP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("xdg"));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts success and returns stdout.
#[track_caller]
fn ok(o: Output) -> String {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        stdout(&o),
        stderr(&o)
    );
    stdout(&o)
}

/// Asserts failure with `code` and returns stderr.
#[track_caller]
fn fails(o: Output, code: i32) -> String {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&o),
        stderr(&o)
    );
    stderr(&o)
}

fn datacenter(json: &str) -> Datacenter {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("not a Datacenter ({e}):\n{json}"))
}

fn agent(json: &str) -> Agent {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("not an Agent ({e}):\n{json}"))
}

/// The value of `key` in a `Key: value` view.
#[track_caller]
fn field<'a>(view: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}:");
    view.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("no {key:?} in:\n{view}"))
        .trim()
}

/// The table row starting with `id`.
#[track_caller]
fn row<'a>(table: &'a str, id: &str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.starts_with(&format!("{id} ")))
        .unwrap_or_else(|| panic!("no row {id} in:\n{table}"));
    line.split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect()
}

/// An http endpoint on a loopback port nobody listens on (bound, then
/// released), so health probes of an agent "at" it fail fast.
fn closed_endpoint() -> String {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("http://127.0.0.1:{port}")
}

/// Joins an agent as `ctrlplane-agent-*` do: `JoinAgent` with the join
/// token and no bearer token.
fn join_agent(
    addr: &str,
    token: &str,
    provider: &str,
    endpoint: &str,
    idempotency_key: &str,
) -> Result<JoinAgentResponse, tonic::Status> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let channel = ctrlplane_runtime::client::channel(addr).unwrap();
        let mut client = AgentRegistryServiceClient::new(channel);
        let req = JoinAgentRequest {
            token: token.to_string(),
            provider_name: provider.to_string(),
            endpoint: endpoint.to_string(),
            version: "e2e-0.1".to_string(),
            info: [("host".to_string(), "e2e".to_string())].into(),
            capabilities: vec!["provision".to_string(), "logs".to_string()],
            idempotency_key: idempotency_key.to_string(),
        };
        let mut req = tonic::Request::new(req);
        req.set_timeout(Duration::from_secs(30));
        client
            .join_agent(req)
            .await
            .map(tonic::Response::into_inner)
    })
}

#[test]
fn token_create_get_list_update_set_status_delete() {
    let Some(bin) = server_binary() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "ctrlplane-datacenter binary not found next to {CLI}; CI must build the workspace first"
        );
        eprintln!(
            "skipping: no ctrlplane-datacenter binary next to {CLI} (cargo build -p ctrlplane-datacenter)"
        );
        return;
    };
    eprintln!("using {}", bin.display());
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path();
    let server = Server::start(&bin, home);

    // token: minted from the secret, verifiable by the services.
    let token = ok(run(
        home,
        &[],
        &[
            "token",
            "--secret",
            SECRET,
            "--role",
            ROLE_ADMIN,
            "--subject",
            "e2e",
        ],
    ));
    let token = token.trim().to_string();
    let claims = Authenticator::new(SECRET.as_bytes())
        .verify(&token)
        .unwrap();
    assert_eq!(
        (claims.sub.as_str(), claims.roles.as_slice()),
        ("e2e", [ROLE_ADMIN.to_string()].as_slice())
    );
    let env = [
        ("CP_DATACENTER_ADDR", server.addr.as_str()),
        ("CP_TOKEN", token.as_str()),
    ];
    let cli = |args: &[&str]| run(home, &env, args);

    // No token anywhere: a clear error saying how to get one.
    let err = fails(
        run(
            home,
            &[("CP_DATACENTER_ADDR", &server.addr)],
            &["dc", "list"],
        ),
        1,
    );
    assert!(
        err.starts_with("error: no token") && err.contains("ctrlplane token"),
        "{err}"
    );
    // A token signed with another secret.
    let bad = ok(run(
        home,
        &[],
        &["token", "--secret", "another-secret-another-secret-another"],
    ));
    let err = fails(
        run(
            home,
            &[
                ("CP_DATACENTER_ADDR", &server.addr),
                ("CP_TOKEN", bad.trim()),
            ],
            &["dc", "list"],
        ),
        1,
    );
    assert!(err.starts_with("error: UNAUTHENTICATED: "), "{err}");

    // agents token: only the token on stdout (for $(…)), a hint on stderr.
    let o = cli(&["agents", "token", "--provider", "process"]);
    let hint = stderr(&o);
    let process_token = ok(o);
    assert_eq!(process_token.lines().count(), 1, "{process_token}");
    let process_token = process_token.trim().to_string();
    assert!(
        process_token.starts_with("jtk_") && process_token.contains('.'),
        "{process_token}"
    );
    assert!(
        hint.contains(&format!(
            "\n  CP_JOIN_TOKEN=<token> CP_DATACENTER_ADDR=http://{} ctrlplane-agent-process\n",
            server.addr
        )),
        "{hint}"
    );
    assert!(hint.contains("single use"), "{hint}");
    assert!(
        !hint.contains(&process_token),
        "the token is printed once: {hint}"
    );
    // -o json: the whole response, in proto JSON.
    let text = ok(cli(&[
        "agent",
        "token",
        "--provider",
        "docker",
        "--ttl",
        "10m",
        "--max-uses",
        "2",
        "-o",
        "json",
    ]));
    let minted: CreateJoinTokenResponse =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let jt = minted.join_token.as_ref().unwrap();
    assert!(jt.id.starts_with("jtk_"), "{text}");
    assert_eq!(
        (jt.provider_name.as_str(), jt.max_uses),
        ("docker", 2),
        "{text}"
    );
    let lifetime = jt.expire_time.unwrap().seconds - jt.create_time.unwrap().seconds;
    assert!((595..=605).contains(&lifetime), "{text}");
    assert!(minted.token.starts_with(&format!("{}.", jt.id)), "{text}");
    let docker_token = minted.token.clone();
    // Bad input: the server's field violations; no --provider: usage.
    let err = fails(cli(&["agents", "token", "--provider", "Not A Label"]), 1);
    assert!(err.starts_with("error: INVALID_ARGUMENT: "), "{err}");
    assert!(err.contains("\n  - provider_name: "), "{err}");
    fails(cli(&["agents", "token"]), 2);

    // Agents join with the tokens (no bearer token).
    let process_endpoint = closed_endpoint();
    let docker_endpoint = closed_endpoint();
    let joined = join_agent(
        &server.addr,
        &process_token,
        "process",
        &process_endpoint,
        "e2e-process-1",
    )
    .unwrap();
    let process_id = joined.agent_id.clone();
    assert!(process_id.starts_with("agt_"), "{joined:?}");
    assert!(!joined.credential.is_empty());
    // A retry whose answer was lost gets the same identity …
    let again = join_agent(
        &server.addr,
        &process_token,
        "process",
        &process_endpoint,
        "e2e-process-1",
    )
    .unwrap();
    assert_eq!(again.agent_id, process_id);
    // … but a single-use token admits no second agent.
    let refused = join_agent(
        &server.addr,
        &process_token,
        "process",
        &closed_endpoint(),
        "e2e-process-2",
    )
    .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    let docker_id = join_agent(
        &server.addr,
        &docker_token,
        "docker",
        &docker_endpoint,
        "e2e-docker-1",
    )
    .unwrap()
    .agent_id;

    // agents list / get.
    let out = ok(cli(&["agents", "list"]));
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap()
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "ID",
            "PROVIDER",
            "ENDPOINT",
            "HEALTH",
            "VERSION",
            "LAST HEARTBEAT",
            "CAPABILITIES"
        ],
        "{out}"
    );
    let cells = row(&out, &process_id);
    assert_eq!(
        (cells[1], cells[2], cells[3], cells[4], cells[6]),
        (
            "process",
            process_endpoint.as_str(),
            "healthy",
            "e2e-0.1",
            "provision,logs"
        ),
        "{out}"
    );
    assert!(cells[5].ends_with('Z'), "{out}");
    assert_eq!(row(&out, &docker_id)[1], "docker", "{out}");
    assert!(out.ends_with("Total: 2\n"), "{out}");
    let text = ok(cli(&[
        "agents",
        "ls",
        "--provider",
        "process",
        "-o",
        "json",
    ]));
    let list: ListAgentsResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(list.agents.len(), 1, "{text}");
    assert_eq!(list.agents[0].id, process_id);
    assert_eq!(list.agents[0].health, AgentHealth::Healthy as i32, "{text}");
    assert_eq!(
        list.agents[0].info.get("host").map(String::as_str),
        Some("e2e")
    );
    let out = ok(cli(&["agents", "list", "--page-size", "1"]));
    assert!(out.contains("Showing 1. Next page: --page-token "), "{out}");
    let out = ok(cli(&["agents", "list", "--page-size", "1", "--all"]));
    assert!(out.ends_with("Total: 2\n"), "{out}");
    let out = ok(cli(&["agents", "list", "--provider", "nomad"]));
    assert!(
        out.starts_with("No agents found for provider \"nomad\""),
        "{out}"
    );
    let out = ok(cli(&["agents", "get", &process_id]));
    assert_eq!(field(&out, "ID"), process_id);
    assert_eq!(field(&out, "Provider"), "process");
    assert_eq!(field(&out, "Endpoint"), process_endpoint);
    assert_eq!(field(&out, "Health"), "healthy");
    assert_eq!(field(&out, "Info"), "host=e2e");
    assert_eq!(field(&out, "Last checked"), "-");
    let a = agent(&ok(cli(&["agent", "get", &docker_id, "-o", "json"])));
    assert_eq!(
        (a.id.as_str(), a.provider_name.as_str(), a.endpoint.as_str()),
        (docker_id.as_str(), "docker", docker_endpoint.as_str())
    );
    let err = fails(cli(&["agents", "get", "agt_00000000000000000000000000"]), 1);
    assert!(err.starts_with("error: NOT_FOUND: "), "{err}");
    let err = fails(cli(&["agents", "get", "dc_00000000000000000000000000"]), 1);
    assert!(err.starts_with("error: INVALID_ARGUMENT: "), "{err}");
    assert!(err.contains("\n  - id: "), "{err}");

    // No agent has joined for nomad: its datacenters are refused, with a
    // hint on how to join one.
    let err = fails(
        cli(&["dc", "create", "--name", "Nowhere", "--provider", "nomad"]),
        1,
    );
    assert!(err.starts_with("error: FAILED_PRECONDITION: "), "{err}");
    assert!(err.contains("provider \"nomad\""), "{err}");
    assert!(
        err.contains("hint: mint a join token with `ctrlplane agents token --provider nomad`"),
        "{err}"
    );

    // create, with labels and a bootstrap file; table view.
    let bootstrap = home.join("bootstrap.json");
    std::fs::write(
        &bootstrap,
        r#"[{"name":"logs","services":[{"name":"vector","image":"timberio/vector:0.40"}]},
            {"name":"metrics","services":[{"name":"node","image":"prom/node-exporter:v1"}]}]"#,
    )
    .unwrap();
    let out = ok(cli(&[
        "dc",
        "create",
        "--name",
        "Berlin 1",
        "--provider",
        "process",
        "--region",
        "eu-central",
        "--label",
        "env=prod",
        "--label",
        "team=infra",
        "--bootstrap-file",
        bootstrap.to_str().unwrap(),
    ]));
    assert!(out.contains("Name:                Berlin 1\n"), "{out}");
    assert!(out.contains("Slug:                berlin-1\n"), "{out}");
    assert!(out.contains("Status:              active\n"), "{out}");
    assert!(
        out.contains("Labels:              env=prod,team=infra\n"),
        "{out}"
    );
    assert!(
        out.contains("Bootstrap services:  logs\n                     metrics\n"),
        "{out}"
    );
    let id = out
        .lines()
        .next()
        .unwrap()
        .trim_start_matches("ID:")
        .trim()
        .to_string();
    assert!(id.starts_with("dc_"), "{out}");

    // Two more, as JSON, for paging.
    for name in ["Paris 1", "Oslo 1"] {
        let dc = datacenter(&ok(cli(&[
            "dc",
            "create",
            "--name",
            name,
            "--provider",
            "docker",
            "-o",
            "json",
        ])));
        assert_eq!(dc.status, DatacenterStatus::Active as i32);
    }

    // Invalid input: the server's field violations, one per line; exit 1.
    let err = fails(cli(&["dc", "create", "--name", "", "--provider", ""]), 1);
    assert!(err.starts_with("error: INVALID_ARGUMENT: "), "{err}");
    assert!(err.contains("\n  - datacenter.name: "), "{err}");
    assert!(err.contains("\n  - datacenter.provider_name: "), "{err}");
    // Usage errors: exit 2.
    fails(cli(&["dc", "create", "--name", "x"]), 2);
    let err = fails(cli(&["dc", "update", &id]), 2);
    assert!(err.contains("nothing to update"), "{err}");

    // get by id (JSON) and by slug (table).
    let dc = datacenter(&ok(cli(&["dc", "get", &id, "-o", "json"])));
    assert_eq!(
        (dc.id.as_str(), dc.name.as_str(), dc.region.as_str()),
        (id.as_str(), "Berlin 1", "eu-central")
    );
    assert_eq!(dc.bootstrap_services.len(), 2);
    assert_eq!(
        dc.bootstrap_services[0].services[0].image,
        "timberio/vector:0.40"
    );
    let out = ok(cli(&["dc", "get", "--slug", "berlin-1"]));
    assert!(
        out.starts_with(&format!("ID:                  {id}\n")),
        "{out}"
    );
    let err = fails(cli(&["dc", "get", "dc_00000000000000000000000000"]), 1);
    assert!(err.starts_with("error: NOT_FOUND: "), "{err}");

    // list: JSON with all fields, filters, table, paging.
    let list: ListDatacentersResponse =
        serde_json::from_str(&ok(cli(&["dc", "list", "-o", "json"]))).unwrap();
    assert_eq!((list.datacenters.len(), list.total_size), (3, 3));
    let text = ok(cli(&[
        "dc",
        "list",
        "-o",
        "json",
        "--provider",
        "process",
        "--selector",
        "env=prod",
    ]));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["totalSize"], 1, "{text}");
    assert_eq!(v["nextPageToken"], "", "{text}");
    assert_eq!(v["datacenters"][0]["id"], id.as_str(), "{text}");
    let out = ok(cli(&["dc", "list", "--status", "offline"]));
    assert_eq!(out, "No datacenters found (total: 0).\n");
    let out = ok(cli(&["dc", "ls", "--page-size", "2"]));
    assert!(out.starts_with("ID "), "{out}");
    assert_eq!(out.lines().count(), 4, "{out}");
    assert!(
        out.contains("Showing 2 of 3. Next page: --page-token "),
        "{out}"
    );
    let all: ListDatacentersResponse = serde_json::from_str(&ok(cli(&[
        "dc",
        "list",
        "--page-size",
        "2",
        "--all",
        "-o",
        "json",
    ])))
    .unwrap();
    assert_eq!(
        (
            all.datacenters.len(),
            all.total_size,
            all.next_page_token.as_str()
        ),
        (3, 3, "")
    );
    let out = ok(cli(&["dc", "list", "--page-size", "1", "--all"]));
    assert!(out.ends_with("Total: 3\n"), "{out}");

    // update: only the masked fields change.
    let before = datacenter(&ok(cli(&["dc", "get", &id, "-o", "json"])));
    let after = datacenter(&ok(cli(&[
        "dc",
        "update",
        &id,
        "--zone",
        "b",
        "--clear-labels",
        "-o",
        "json",
    ])));
    assert_eq!(after.zone, "b");
    assert!(after.labels.is_empty());
    assert_eq!(after.region, "eu-central");
    assert_eq!(after.bootstrap_services.len(), 2);
    assert!(after.revision > before.revision);
    let after = datacenter(&ok(cli(&[
        "dc",
        "update",
        &id,
        "--clear-bootstrap",
        "--label",
        "env=stage",
        "-o",
        "json",
    ])));
    assert!(after.bootstrap_services.is_empty());
    assert_eq!(after.labels.get("env").map(String::as_str), Some("stage"));

    // set-status, including a forbidden move.
    let out = ok(cli(&[
        "dc",
        "set-status",
        &id,
        "draining",
        "--reason",
        "rack swap",
    ]));
    assert!(out.contains("Status:              draining\n"), "{out}");
    let err = fails(cli(&["dc", "set-status", &id, "maintenance"]), 1);
    assert!(err.starts_with("error: FAILED_PRECONDITION: "), "{err}");
    fails(cli(&["dc", "set-status", &id, "deleting"]), 2);

    // delete: DELETING until purged.
    let out = ok(cli(&["dc", "delete", &id]));
    assert!(
        out.starts_with(&format!("Datacenter {id} (Berlin 1) is deleting")),
        "{out}"
    );
    let dc = datacenter(&ok(cli(&["dc", "get", &id, "-o", "json"])));
    assert_eq!(dc.status, DatacenterStatus::Deleting as i32);

    // agents check: nothing serves at the agents' endpoints, so every probe
    // fails; the command reports it and succeeds.
    let out = ok(cli(&["agents", "check"]));
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap()
        .split("   ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        ["ID", "PROVIDER", "ENDPOINT", "HEALTH", "LATENCY", "ERROR"],
        "{out}"
    );
    for agent_id in [&process_id, &docker_id] {
        let cells = row(&out, agent_id);
        assert_eq!(cells[3], "unhealthy", "{out}");
        assert_ne!(cells[4], "-", "{out}");
        assert!(cells.len() == 6 && cells[5] != "-", "{out}");
    }
    assert!(
        out.ends_with("Checked 2 agents: 0 healthy, 2 not.\n"),
        "{out}"
    );
    let text = ok(cli(&["agents", "check", "-o", "json"]));
    let checked: CheckAgentsResponse = serde_json::from_str(&text).unwrap();
    assert_eq!(checked.agents.len(), 2, "{text}");
    for a in &checked.agents {
        assert_eq!(a.health, AgentHealth::Unhealthy as i32, "{text}");
        assert!(
            a.last_checked_at.is_some() && a.last_latency.is_some(),
            "{text}"
        );
        assert!(!a.last_error.is_empty(), "{text}");
    }
    let out = ok(cli(&["agents", "get", &process_id]));
    assert_eq!(field(&out, "Health"), "unhealthy");
    assert_ne!(field(&out, "Last error"), "-", "{out}");

    // revoke: the agent is REVOKED, listed as such, and never probed again;
    // with no agent left for process, its datacenters are refused.
    let out = ok(cli(&["agents", "revoke", &process_id]));
    assert!(
        out.starts_with(&format!(
            "Agent {process_id} (process at {process_endpoint}) is revoked: "
        )),
        "{out}"
    );
    let a = agent(&ok(cli(&["agents", "get", &process_id, "-o", "json"])));
    assert_eq!(a.health, AgentHealth::Revoked as i32);
    let out = ok(cli(&["agents", "list"]));
    assert_eq!(row(&out, &process_id)[3], "revoked", "{out}");
    let a = agent(&ok(cli(&["agents", "revoke", &process_id, "-o", "json"])));
    assert_eq!(
        a.health,
        AgentHealth::Revoked as i32,
        "revoking twice changes nothing"
    );
    let out = ok(cli(&["agents", "check"]));
    assert!(!out.contains(&process_id), "{out}");
    assert!(
        out.ends_with("Checked 1 agent: 0 healthy, 1 not.\n"),
        "{out}"
    );
    let err = fails(
        cli(&["dc", "create", "--name", "Late", "--provider", "process"]),
        1,
    );
    assert!(
        err.starts_with("error: FAILED_PRECONDITION: ") && err.contains("\"process\""),
        "{err}"
    );

    // The config file supplies address and token when flags and env do not;
    // a flag beats it.
    let cfg_dir = home.join("xdg").join("ctrlplane");
    std::fs::create_dir_all(&cfg_dir).unwrap();
    std::fs::write(
        cfg_dir.join("config.json"),
        serde_json::json!({"datacenter_addr": server.addr, "token": token}).to_string(),
    )
    .unwrap();
    let out = ok(run(home, &[], &["dc", "list", "--status", "deleting"]));
    assert!(out.contains(&id) && out.ends_with("Total: 1\n"), "{out}");
    let err = fails(
        run(home, &[], &["dc", "list", "--endpoint", "127.0.0.1:1"]),
        1,
    );
    assert!(
        err.starts_with("error: UNAVAILABLE: ") && err.contains("127.0.0.1:1"),
        "{err}"
    );
}
