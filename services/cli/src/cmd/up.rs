//! `ctrlplane up`: the embedded default. Runs datacenter, bootstrap,
//! scheduler and the process agent as child processes on SQLite under one
//! data directory, until Ctrl-C.
//!
//! Layout of the data directory (everything is reused by the next `up`):
//! - `secret`: the shared token secret (64 hex characters, mode 0600),
//!   generated on the first run;
//! - `datacenter.db`, `bootstrap.db`, `scheduler.db`: the services'
//!   databases (`CP_DATA_DIR` = the data directory);
//! - `agent/`: the process agent's state directory (`identity.json` once it
//!   has joined: a join token is minted only while it is missing);
//! - `logs/<service>.log`: each child's output, appended to.
//!
//! Ports: datacenter `BASE`, bootstrap `BASE+100`, scheduler `BASE+200`,
//! agent `BASE+301` — with the default base 7100 exactly the services' own
//! defaults (7100, 7200, 7300, 7401).
//!
//! Children run in process groups of their own, so a Ctrl-C in the
//! terminal reaches only `up`, which then stops them in order: scheduler
//! (nothing new is driven), bootstrap, agent, datacenter — SIGTERM, then
//! SIGKILL after the grace period. Workloads the process agent runs keep
//! running while it is down (that is what the agent is built for); the next
//! `up` re-adopts them.

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use ctrlplane_proto::agent::v1::CreateJoinTokenRequest;
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::datacenter::v1::{
    CreateDatacenterRequest, Datacenter, GetDatacenterBySlugRequest,
};
use ctrlplane_proto::provider::v1::{HealthCheckSpec, HealthCheckType, PortSpec, ServiceSpec};
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::config::{self as cfg, AuthConfig, Settings};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::cli::GlobalOpts;
use crate::cmd::bootstrap::wait_until_settled;
use crate::context::{ConfigPath, Context, Overrides, Peer};
use crate::error::CliError;

const AFTER_HELP: &str = "\
Ports: datacenter BASE, bootstrap BASE+100, scheduler BASE+200, process agent BASE+301
(7100, 7200, 7300, 7401 by default). Service binaries are looked up next to `ctrlplane`, then on PATH.

Examples:
  ctrlplane up --demo                 # the whole system plus a demo datacenter, until Ctrl-C
  ctrlplane dc list                   # in another terminal: the config file was written by `up`
  ctrlplane up --data-dir /tmp/cp --base-port 17100";

/// Arguments of `ctrlplane up`.
#[derive(Debug, Clone, Args)]
#[command(after_help = AFTER_HELP)]
pub struct UpArgs {
    /// Where databases, secret, agent state and logs live
    /// [default: $XDG_DATA_HOME/ctrlplane or ~/.local/share/ctrlplane]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Also create a datacenter "demo" with a few bootstrap services and
    /// show them coming up
    #[arg(long)]
    pub demo: bool,

    /// First port; the services use BASE, BASE+100, BASE+200 and BASE+301
    #[arg(long, default_value_t = 7100, value_name = "PORT",
          value_parser = clap::value_parser!(u16).range(1..=65234))]
    pub base_port: u16,

    /// How long each service may take to report SERVING (and the demo to run)
    #[arg(long, default_value = "60s", value_name = "DURATION",
          value_parser = crate::input::parse_positive_duration)]
    pub start_timeout: Duration,

    /// Time each service gets to stop after SIGTERM before it is killed
    #[arg(long, default_value = "10s", value_name = "DURATION",
          value_parser = crate::input::parse_positive_duration)]
    pub grace: Duration,

    /// Validity of the admin token that is printed and written to the config file
    #[arg(long, default_value = "720h", value_name = "DURATION",
          value_parser = crate::input::parse_positive_duration)]
    pub token_ttl: Duration,

    /// Do not write the CLI config file
    #[arg(long)]
    pub no_config: bool,
}

/// The data directory when none is given: `$XDG_DATA_HOME/ctrlplane`
/// (absolute only), else `~/.local/share/ctrlplane`.
pub fn default_data_dir(env: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let non_empty = |n: &str| env(n).filter(|v| !v.is_empty());
    if let Some(x) = non_empty("XDG_DATA_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
    {
        return Some(x.join("ctrlplane"));
    }
    non_empty("HOME").map(|h| PathBuf::from(h).join(".local/share/ctrlplane"))
}

/// The four ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// Datacenter service.
    pub datacenter: u16,
    /// Bootstrap service.
    pub bootstrap: u16,
    /// Scheduler service.
    pub scheduler: u16,
    /// Process agent.
    pub agent: u16,
}

impl Ports {
    /// Ports derived from the base (which clap keeps ≤ 65234).
    pub fn from_base(base: u16) -> Self {
        Ports {
            datacenter: base,
            bootstrap: base + 100,
            scheduler: base + 200,
            agent: base + 301,
        }
    }
}

fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The four children, in start order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Svc {
    /// `ctrlplane-datacenter`.
    Datacenter,
    /// `ctrlplane-agent-process`.
    Agent,
    /// `ctrlplane-bootstrap`.
    Bootstrap,
    /// `ctrlplane-scheduler`.
    Scheduler,
}

impl Svc {
    /// Short name (log file stem).
    pub fn name(self) -> &'static str {
        match self {
            Svc::Datacenter => "datacenter",
            Svc::Agent => "agent-process",
            Svc::Bootstrap => "bootstrap",
            Svc::Scheduler => "scheduler",
        }
    }

    /// The binary's name.
    pub fn binary(self) -> String {
        format!("ctrlplane-{}", self.name())
    }

    fn port(self, p: &Ports) -> u16 {
        match self {
            Svc::Datacenter => p.datacenter,
            Svc::Agent => p.agent,
            Svc::Bootstrap => p.bootstrap,
            Svc::Scheduler => p.scheduler,
        }
    }

    /// The child's `CP_*` environment.
    pub fn env(
        self,
        dir: &Path,
        ports: &Ports,
        join_token: Option<&str>,
    ) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (cfg::LISTEN_ADDR, format!("127.0.0.1:{}", self.port(ports))),
            (
                cfg::AUTH_SECRET_FILE,
                dir.join("secret").display().to_string(),
            ),
            (cfg::LOG_FORMAT, "human".to_string()),
        ];
        let dc = (cfg::DATACENTER_ADDR, url(ports.datacenter));
        match self {
            Svc::Datacenter => {
                env.push((cfg::DATA_DIR, dir.display().to_string()));
            }
            Svc::Bootstrap => {
                env.push((cfg::DATA_DIR, dir.display().to_string()));
                env.push(dc);
            }
            Svc::Scheduler => {
                env.push((cfg::DATA_DIR, dir.display().to_string()));
                env.push(dc);
                env.push((cfg::BOOTSTRAP_ADDR, url(ports.bootstrap)));
            }
            Svc::Agent => {
                env.push((cfg::STATE_DIR, dir.join("agent").display().to_string()));
                env.push(dc);
                if let Some(t) = join_token {
                    env.push((cfg::JOIN_TOKEN, t.to_string()));
                }
            }
        }
        env
    }
}

/// Finds a service binary next to `exe` (the running `ctrlplane`), else on
/// `path` (a `PATH`-style list).
///
/// # Errors
/// [`CliError::Config`] naming the binary and where it was looked for.
pub fn find_binary(
    name: &str,
    exe: Option<&Path>,
    path: Option<&str>,
) -> Result<PathBuf, CliError> {
    let mut looked = Vec::new();
    if let Some(dir) = exe.and_then(Path::parent) {
        let p = dir.join(name);
        if is_executable(&p) {
            return Ok(p);
        }
        looked.push(dir.display().to_string());
    }
    for dir in std::env::split_paths(path.unwrap_or("")) {
        if dir.as_os_str().is_empty() {
            continue;
        }
        let p = dir.join(name);
        if is_executable(&p) {
            return Ok(p);
        }
    }
    looked.push("PATH".to_string());
    Err(CliError::Config(format!(
        "cannot find the {name} binary (looked in {}); build it with `cargo build --workspace` \
         or install it next to ctrlplane",
        looked.join(" and ")
    )))
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Reads the secret file, creating it (32 random bytes, hex, mode 0600)
/// when missing. Returns the secret as the services read it and whether it
/// was generated now.
///
/// # Errors
/// The file cannot be written or read, or holds an unusable secret.
pub fn ensure_secret(dir: &Path) -> Result<(Vec<u8>, bool), CliError> {
    let path = dir.join("secret");
    let mut created = false;
    if !path.exists() {
        let bytes: [u8; 32] = rand::random();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        write_private(&path, format!("{hex}\n").as_bytes())?;
        created = true;
    }
    let settings = Settings::from_map([(cfg::AUTH_SECRET_FILE, path.display().to_string())]);
    let auth = AuthConfig::from_settings(&settings)
        .map_err(|e| CliError::Config(format!("unusable secret file {}: {e}", path.display())))?;
    Ok((auth.secret, created))
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let io = |e: std::io::Error| CliError::Config(format!("cannot write {}: {e}", path.display()));
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)
}

/// The last `lines` lines of a file (at most the last 64 KiB are read).
pub fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = std::fs::File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The agent id in the agent's identity file, once it has joined.
pub fn agent_id(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("agent").join("identity.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v.get("agent_id")?.as_str().map(str::to_string)
}

/// The demo's bootstrap services: a ticker that needs nothing but
/// `/bin/sh`, a status writer with a command health check, and — when
/// `python3` is given — a small HTTP server with an HTTP health check.
pub fn demo_specs(python3: Option<&Path>) -> Vec<BootstrapServiceSpec> {
    let sh = |name: &str, script: &str, check: Option<HealthCheckSpec>, ports: Vec<PortSpec>| {
        BootstrapServiceSpec {
            name: name.to_string(),
            replicas: 1,
            services: vec![ServiceSpec {
                name: name.to_string(),
                image: "sh".to_string(),
                command: vec!["/bin/sh".into(), "-c".into(), script.to_string()],
                health_check: check,
                ports,
                ..Default::default()
            }],
            labels: [("app".to_string(), "demo".to_string())].into(),
            ..Default::default()
        }
    };
    let secs = |s| {
        Some(ctrlplane_proto::pbjson_types::Duration {
            seconds: s,
            nanos: 0,
        })
    };
    let mut specs = vec![
        sh(
            "ticker",
            "while true; do echo \"tick $(date)\"; sleep 2; done",
            None,
            vec![],
        ),
        sh(
            "status",
            "while true; do date > status.txt; sleep 2; done",
            Some(HealthCheckSpec {
                r#type: HealthCheckType::Command as i32,
                command: vec!["/bin/sh".into(), "-c".into(), "test -s status.txt".into()],
                interval: secs(2),
                ..Default::default()
            }),
            vec![],
        ),
    ];
    if let Some(py) = python3 {
        let mut web = sh(
            "web",
            &format!(
                "exec '{}' -m http.server \"$PORT\" --bind 127.0.0.1",
                py.display()
            ),
            Some(HealthCheckSpec {
                r#type: HealthCheckType::Http as i32,
                path: "/".into(),
                port: 8080,
                interval: secs(2),
                ..Default::default()
            }),
            vec![PortSpec {
                container: 8080,
                name: "http".into(),
                ..Default::default()
            }],
        );
        web.depends_on = vec!["status".to_string()];
        specs.push(web);
    }
    specs
}

struct Managed {
    svc: Svc,
    child: Child,
    log: PathBuf,
}

/// The running children and how to stop them.
struct Supervisor {
    children: Vec<Managed>,
    stop: watch::Receiver<bool>,
    grace: Duration,
}

/// Why `up` stops.
enum Stop {
    Signal,
    Died(CliError),
}

impl Supervisor {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// The first child that has exited, as an error with its log's tail.
    fn dead(&mut self) -> Option<CliError> {
        for m in &mut self.children {
            if let Ok(Some(status)) = m.child.try_wait() {
                return Some(CliError::Config(format!(
                    "{} exited unexpectedly ({status}); last lines of {}:\n{}",
                    m.svc.binary(),
                    m.log.display(),
                    tail(&m.log, 20)
                )));
            }
        }
        None
    }

    /// Resolves when a stop is requested or a child dies.
    async fn interrupted(&mut self) -> Stop {
        loop {
            if self.stopping() {
                return Stop::Signal;
            }
            if let Some(e) = self.dead() {
                return Stop::Died(e);
            }
            let mut rx = self.stop.clone();
            tokio::select! {
                _ = rx.changed() => {}
                () = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
        }
    }

    /// Stops every child: scheduler, bootstrap, agent, datacenter.
    async fn shutdown(&mut self, out: &mut dyn Write) {
        let order = [Svc::Scheduler, Svc::Bootstrap, Svc::Agent, Svc::Datacenter];
        for svc in order {
            let Some(m) = self.children.iter_mut().find(|m| m.svc == svc) else {
                continue;
            };
            if let Ok(Some(_)) = m.child.try_wait() {
                continue;
            }
            let _ = write!(out, "  stopping {:<14}", svc.name());
            let _ = out.flush();
            if let Some(pid) = m.child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            }
            match tokio::time::timeout(self.grace, m.child.wait()).await {
                Ok(_) => {
                    let _ = writeln!(out, " stopped");
                }
                Err(_) => {
                    let _ = m.child.start_kill();
                    let _ = m.child.wait().await;
                    let _ = writeln!(out, " killed (did not stop within {:?})", self.grace);
                }
            }
        }
        self.children.clear();
    }
}

fn spawn(
    bin: &Path,
    svc: Svc,
    env: &[(&'static str, String)],
    log: &Path,
) -> Result<Child, CliError> {
    let io = |e: std::io::Error| CliError::Config(format!("cannot start {}: {e}", bin.display()));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| CliError::Config(format!("cannot open {}: {e}", log.display())))?;
    let mut cmd = Command::new(bin);
    // Our own CP_* settings only: none inherited from the caller's shell.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CP_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(io)?)
        .stderr(file)
        .process_group(0)
        .kill_on_drop(true);
    let _ = svc;
    cmd.spawn().map_err(io)
}

async fn serving(addr: &str) -> bool {
    let Ok(ch) = ctrlplane_runtime::client::channel(addr) else {
        return false;
    };
    let mut client = HealthClient::new(ch);
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    req.set_timeout(Duration::from_secs(2));
    match tokio::time::timeout(Duration::from_secs(3), client.check(req)).await {
        Ok(Ok(r)) => r.into_inner().status == ServingStatus::Serving as i32,
        _ => false,
    }
}

fn admin_token(secret: &[u8], ttl: Duration) -> String {
    Authenticator::new(secret).mint(&Claims::new(
        "ctrlplane-up",
        "",
        vec![ROLE_ADMIN.to_string()],
        ttl,
    ))
}

fn find_python3() -> Option<PathBuf> {
    let path = std::env::var("PATH").ok()?;
    std::env::split_paths(&path)
        .map(|d| d.join("python3"))
        .find(|p| is_executable(p))
}

/// Runs `ctrlplane up`.
///
/// # Errors
/// A missing binary, an unwritable data dir, a service that does not come
/// up or dies; the demo failing.
pub async fn run(global: &GlobalOpts, args: UpArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let env = |n: &str| std::env::var(n).ok();
    let dir = match args.data_dir.clone().filter(|d| !d.as_os_str().is_empty()) {
        Some(d) => d,
        None => default_data_dir(env).ok_or_else(|| {
            CliError::Config("no --data-dir given and neither XDG_DATA_HOME nor HOME is set".into())
        })?,
    };
    let dir = std::path::absolute(&dir)
        .map_err(|e| CliError::Config(format!("bad data dir {}: {e}", dir.display())))?;
    let mkdir = |p: &Path| {
        std::fs::create_dir_all(p)
            .map_err(|e| CliError::Config(format!("cannot create {}: {e}", p.display())))
    };
    mkdir(&dir.join("logs"))?;
    mkdir(&dir.join("agent"))?;
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));

    // Binaries first: a missing one is reported before anything starts.
    let exe = std::env::current_exe().ok();
    let path_var = std::env::var("PATH").ok();
    let order = [Svc::Datacenter, Svc::Agent, Svc::Bootstrap, Svc::Scheduler];
    let mut bins = Vec::new();
    for svc in order {
        bins.push(find_binary(
            &svc.binary(),
            exe.as_deref(),
            path_var.as_deref(),
        )?);
    }
    let (secret, generated) = ensure_secret(&dir)?;
    let ports = Ports::from_base(args.base_port);
    let token = admin_token(&secret, args.token_ttl);

    let (tx, rx) = watch::channel(false);
    let signals = tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut int), Ok(mut term)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return;
        };
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        let _ = tx.send(true);
    });

    writeln!(
        out,
        "Starting the control plane in {}{}",
        dir.display(),
        if generated {
            " (first run: generated a new secret)"
        } else {
            ""
        }
    )?;
    out.flush()?;
    let mut sup = Supervisor {
        children: Vec::new(),
        stop: rx,
        grace: args.grace,
    };
    let result = up_and_serve(&mut sup, global, &args, &dir, &bins, ports, &token, out).await;
    if !sup.children.is_empty() {
        writeln!(out, "Stopping…")?;
        sup.shutdown(out).await;
    }
    signals.abort();
    match &result {
        Ok(()) => writeln!(
            out,
            "Stopped. State is kept in {}; run `ctrlplane up` again to continue.",
            dir.display()
        )?,
        Err(_) => writeln!(out, "Stopped after an error.")?,
    }
    result
}

#[allow(clippy::too_many_arguments)]
async fn up_and_serve(
    sup: &mut Supervisor,
    global: &GlobalOpts,
    args: &UpArgs,
    dir: &Path,
    bins: &[PathBuf],
    ports: Ports,
    token: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let order = [Svc::Datacenter, Svc::Agent, Svc::Bootstrap, Svc::Scheduler];
    let ctx = Context::resolve(
        Overrides {
            datacenter_addr: Some(url(ports.datacenter)),
            bootstrap_addr: Some(url(ports.bootstrap)),
            scheduler_addr: Some(url(ports.scheduler)),
            token: Some(token.to_string()),
        },
        &Default::default(),
        None,
        global.timeout,
    );
    for (svc, bin) in order.into_iter().zip(bins) {
        let mut join_token = None;
        if svc == Svc::Agent && agent_id(dir).is_none() {
            let mut client = ctx.agents()?;
            let resp = ctx
                .call(
                    Peer::Datacenter,
                    client.create_join_token(ctx.request(CreateJoinTokenRequest {
                        provider_name: "process".into(),
                        ..Default::default()
                    })),
                )
                .await?;
            writeln!(
                out,
                "  minted a join token for the process agent (first run)"
            )?;
            join_token = Some(resp.token);
        }
        let log = dir.join("logs").join(format!("{}.log", svc.name()));
        let addr = url(svc.port(&ports));
        write!(out, "  starting {:<14} {addr}  …", svc.name())?;
        out.flush()?;
        let child = spawn(bin, svc, &svc.env(dir, &ports, join_token.as_deref()), &log)?;
        sup.children.push(Managed {
            svc,
            child,
            log: log.clone(),
        });
        let start = Instant::now();
        loop {
            if sup.stopping() {
                writeln!(out, " interrupted")?;
                return Ok(());
            }
            if let Some(e) = sup.dead() {
                writeln!(out, " failed")?;
                return Err(e);
            }
            // The agent counts as up once it serves and has joined.
            if serving(&addr).await && (svc != Svc::Agent || agent_id(dir).is_some()) {
                writeln!(out, " serving ({:.1}s)", start.elapsed().as_secs_f64())?;
                out.flush()?;
                break;
            }
            if start.elapsed() > args.start_timeout {
                writeln!(out, " timed out")?;
                return Err(CliError::Config(format!(
                    "{} did not report SERVING at {addr} within {:?}; last lines of {}:\n{}",
                    svc.binary(),
                    args.start_timeout,
                    log.display(),
                    tail(&log, 20)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    let config_note = if args.no_config {
        "not written (--no-config)".to_string()
    } else {
        write_config(global, &ports, token)?
    };
    let ttl_days = args.token_ttl.as_secs() / 86_400;
    let ttl = if ttl_days >= 1 {
        format!("{ttl_days} days")
    } else {
        format!("{}s", args.token_ttl.as_secs())
    };
    writeln!(out)?;
    writeln!(out, "The control plane is up:")?;
    writeln!(out, "  datacenter   {}", url(ports.datacenter))?;
    writeln!(out, "  bootstrap    {}", url(ports.bootstrap))?;
    writeln!(out, "  scheduler    {}", url(ports.scheduler))?;
    writeln!(
        out,
        "  agent        {} (provider process, agent {})",
        url(ports.agent),
        agent_id(dir).unwrap_or_else(|| "?".into())
    )?;
    writeln!(out, "  logs         {}", dir.join("logs").display())?;
    writeln!(out, "  config file  {config_note}")?;
    writeln!(out, "Admin token (valid {ttl}):\n  {token}")?;
    writeln!(
        out,
        "Try: ctrlplane dc list; ctrlplane agents list; ctrlplane workers list"
    )?;
    out.flush()?;

    if args.demo {
        let dc = tokio::select! {
            r = ensure_demo(&ctx, out) => r?,
            s = sup.interrupted() => return stop_result(s),
        };
        let expected: Vec<String> = dc
            .bootstrap_services
            .iter()
            .map(|s| s.name.clone())
            .collect();
        tokio::select! {
            r = wait_until_settled(&ctx, &dc.id, &expected, args.start_timeout, out) => r?,
            s = sup.interrupted() => return stop_result(s),
        }
        writeln!(
            out,
            "Demo datacenter {} is running: ctrlplane bootstrap list --datacenter {}",
            dc.id, dc.id
        )?;
    }
    writeln!(out, "Press Ctrl-C to stop.")?;
    out.flush()?;
    stop_result(sup.interrupted().await)
}

fn stop_result(s: Stop) -> Result<(), CliError> {
    match s {
        Stop::Signal => Ok(()),
        Stop::Died(e) => Err(e),
    }
}

/// Writes the CLI config file (addresses + token) where `Context` reads
/// it; returns its path for display.
fn write_config(global: &GlobalOpts, ports: &Ports, token: &str) -> Result<String, CliError> {
    let path = ConfigPath::choose(global.config.clone(), |n| std::env::var(n).ok());
    let Some(path) = path.path() else {
        return Ok("not written (no HOME; pass --config FILE)".into());
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| CliError::Config(format!("cannot create {}: {e}", parent.display())))?;
    }
    let text = config_json(ports, token);
    write_private(path, text.as_bytes())?;
    Ok(path.display().to_string())
}

/// The config file's content.
pub fn config_json(ports: &Ports, token: &str) -> String {
    let v = serde_json::json!({
        "datacenter_addr": url(ports.datacenter),
        "bootstrap_addr": url(ports.bootstrap),
        "scheduler_addr": url(ports.scheduler),
        "token": token,
    });
    format!("{}\n", serde_json::to_string_pretty(&v).unwrap_or_default())
}

/// Finds the platform-shared datacenter with slug `demo`, creating it when
/// missing.
async fn ensure_demo(ctx: &Context, out: &mut dyn Write) -> Result<Datacenter, CliError> {
    let mut client = ctx.datacenter()?;
    let got = client
        .get_datacenter_by_slug(ctx.request(GetDatacenterBySlugRequest {
            slug: "demo".into(),
            tenant_id: String::new(),
        }))
        .await;
    match got {
        Ok(r) => {
            if let Some(dc) = r.into_inner().datacenter {
                writeln!(out, "\nDemo datacenter {} already exists.", dc.id)?;
                return Ok(dc);
            }
        }
        Err(s) if s.code() == tonic::Code::NotFound => {}
        Err(status) => {
            return Err(CliError::Rpc {
                status,
                service: "datacenter",
                addr: ctx.addr(Peer::Datacenter),
            });
        }
    }
    let python = find_python3();
    let dc = Datacenter {
        name: "demo".into(),
        provider_name: "process".into(),
        region: "local".into(),
        labels: [("demo".to_string(), "true".to_string())].into(),
        bootstrap_services: demo_specs(python.as_deref()),
        ..Default::default()
    };
    let resp = ctx
        .call(
            Peer::Datacenter,
            client.create_datacenter(ctx.request(CreateDatacenterRequest {
                datacenter: Some(dc),
            })),
        )
        .await?;
    let dc = resp.datacenter.unwrap_or_default();
    writeln!(
        out,
        "\nCreated demo datacenter {} with bootstrap services: {}{}",
        dc.id,
        dc.bootstrap_services
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        if python.is_none() {
            " (no python3 on PATH: the HTTP service \"web\" is left out)"
        } else {
            ""
        }
    )?;
    Ok(dc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> UpArgs {
        let argv = ["ctrlplane", "up"].iter().chain(args).copied();
        match crate::cli::Cli::try_parse_from(argv).unwrap().command {
            crate::cli::Command::Up(a) => a,
            other => panic!("parsed {other:?}"),
        }
    }

    #[test]
    fn arguments() {
        let a = parse(&[]);
        assert_eq!(a.base_port, 7100);
        assert!(!a.demo && a.data_dir.is_none() && !a.no_config);
        assert_eq!(a.start_timeout, Duration::from_secs(60));
        let a = parse(&["--demo", "--data-dir", "/tmp/x", "--base-port", "20000"]);
        assert!(a.demo);
        assert_eq!(a.data_dir, Some(PathBuf::from("/tmp/x")));
        assert_eq!(a.base_port, 20000);
        assert!(
            crate::cli::Cli::try_parse_from(["ctrlplane", "up", "--base-port", "65300"]).is_err()
        );
    }

    #[test]
    fn ports_match_the_service_defaults() {
        assert_eq!(
            Ports::from_base(7100),
            Ports {
                datacenter: 7100,
                bootstrap: 7200,
                scheduler: 7300,
                agent: 7401
            }
        );
    }

    #[test]
    fn data_dir_defaults() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |n: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            default_data_dir(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.local/share/ctrlplane"))
        );
        assert_eq!(
            default_data_dir(env(&[("HOME", "/h"), ("XDG_DATA_HOME", "/x")])),
            Some(PathBuf::from("/x/ctrlplane"))
        );
        assert_eq!(
            default_data_dir(env(&[("HOME", "/h"), ("XDG_DATA_HOME", "rel")])),
            Some(PathBuf::from("/h/.local/share/ctrlplane"))
        );
        assert_eq!(default_data_dir(env(&[])), None);
    }

    #[test]
    fn child_environments() {
        let p = Ports::from_base(7100);
        let d = Path::new("/d");
        let get = |env: &[(&str, String)], k: &str| {
            env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone())
        };
        let e = Svc::Scheduler.env(d, &p, None);
        assert_eq!(get(&e, "CP_LISTEN_ADDR").as_deref(), Some("127.0.0.1:7300"));
        assert_eq!(get(&e, "CP_DATA_DIR").as_deref(), Some("/d"));
        assert_eq!(
            get(&e, "CP_BOOTSTRAP_ADDR").as_deref(),
            Some("http://127.0.0.1:7200")
        );
        assert_eq!(get(&e, "CP_AUTH_SECRET_FILE").as_deref(), Some("/d/secret"));
        let e = Svc::Agent.env(d, &p, Some("jt"));
        assert_eq!(get(&e, "CP_STATE_DIR").as_deref(), Some("/d/agent"));
        assert_eq!(get(&e, "CP_JOIN_TOKEN").as_deref(), Some("jt"));
        assert_eq!(get(&e, "CP_DATA_DIR"), None);
        assert_eq!(get(&Svc::Agent.env(d, &p, None), "CP_JOIN_TOKEN"), None);
        assert_eq!(Svc::Agent.binary(), "ctrlplane-agent-process");
    }

    #[test]
    fn binaries_are_found_next_to_the_exe_then_on_path() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let mk = |dir: &Path| {
            let p = dir.join("ctrlplane-x");
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let in_b = mk(b.path());
        let exe = a.path().join("ctrlplane");
        let path = b.path().display().to_string();
        assert_eq!(
            find_binary("ctrlplane-x", Some(&exe), Some(&path)).unwrap(),
            in_b
        );
        let in_a = mk(a.path());
        assert_eq!(
            find_binary("ctrlplane-x", Some(&exe), Some(&path)).unwrap(),
            in_a
        );
        let err = find_binary("ctrlplane-y", Some(&exe), Some(&path))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot find the ctrlplane-y binary"), "{err}");
    }

    #[test]
    fn secrets_are_generated_once() {
        let d = tempfile::tempdir().unwrap();
        let (s1, gen1) = ensure_secret(d.path()).unwrap();
        let (s2, gen2) = ensure_secret(d.path()).unwrap();
        assert!(gen1 && !gen2);
        assert_eq!(s1, s2);
        assert_eq!(s1.len(), 64);
        let mode = std::fs::metadata(d.path().join("secret"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn tails_and_identities() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("x.log");
        std::fs::write(&log, "a\nb\nc\n").unwrap();
        assert_eq!(tail(&log, 2), "b\nc");
        assert_eq!(tail(&d.path().join("none"), 2), "");
        assert_eq!(agent_id(d.path()), None);
        std::fs::create_dir_all(d.path().join("agent")).unwrap();
        std::fs::write(
            d.path().join("agent/identity.json"),
            r#"{"agent_id":"agt_1"}"#,
        )
        .unwrap();
        assert_eq!(agent_id(d.path()).as_deref(), Some("agt_1"));
    }

    #[test]
    fn demo_specs_need_only_sh_unless_python_is_there() {
        let names =
            |v: Vec<BootstrapServiceSpec>| v.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(demo_specs(None)), ["ticker", "status"]);
        let with = demo_specs(Some(Path::new("/usr/bin/python3")));
        assert_eq!(with.len(), 3);
        let web = &with[2].services[0];
        assert!(web.command[2].contains("/usr/bin/python3"));
        assert_eq!(web.health_check.as_ref().unwrap().port, 8080);
    }

    #[test]
    fn config_json_is_what_context_reads() {
        let text = config_json(&Ports::from_base(7100), "tok");
        let f = crate::context::ConfigFile::parse(Path::new("c"), &text).unwrap();
        assert_eq!(f.token.as_deref(), Some("tok"));
        assert_eq!(f.bootstrap_addr.as_deref(), Some("http://127.0.0.1:7200"));
    }
}
