//! End to end: the real `ctrlplane-datacenter` binary on a temp SQLite file,
//! driven by the real `ctrlplane` binary through token → create → get →
//! list → update → set-status → delete, checking stdout, stderr and exit
//! codes.
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
