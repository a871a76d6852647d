//! Where commands get their peers' addresses, their token and their gRPC
//! clients from.
//!
//! Each setting is taken from the first place that has it:
//! 1. the command-line flag,
//! 2. the environment variable (clap reads both, flags winning),
//! 3. the config file (`--config`, `CP_CONFIG`, else
//!    `$XDG_CONFIG_HOME/ctrlplane/config.json` or
//!    `~/.config/ctrlplane/config.json`),
//! 4. the built-in default (`http://127.0.0.1:<port>`; no default token).
//!
//! An empty value counts as unset at every level. Commands that talk to a
//! service build a [`Context`] once and ask it for clients; the token is
//! required only when a client is actually made, so commands that need no
//! server never fail over a missing token or config.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient;
use ctrlplane_proto::bootstrap::v1::bootstrap_service_client::BootstrapServiceClient;
use ctrlplane_proto::datacenter::v1::datacenter_service_client::DatacenterServiceClient;
use ctrlplane_proto::scheduler::v1::scheduler_service_client::SchedulerServiceClient;
use ctrlplane_runtime::client::{AuthedChannel, BearerInterceptor, authed_channel, normalize_addr};
use ctrlplane_runtime::config::ports;
use serde::Deserialize;

use crate::cli::GlobalOpts;
use crate::error::CliError;

/// The config file (`config.json`). Every key is optional; unknown keys are
/// an error so that a misspelt key is not silently ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// Datacenter service address.
    #[serde(default)]
    pub datacenter_addr: Option<String>,
    /// Bootstrap service address.
    #[serde(default)]
    pub bootstrap_addr: Option<String>,
    /// Scheduler service address.
    #[serde(default)]
    pub scheduler_addr: Option<String>,
    /// Bearer token.
    #[serde(default)]
    pub token: Option<String>,
}

impl ConfigFile {
    /// Parses the file's text.
    ///
    /// # Errors
    /// [`CliError::Input`] naming `path`.
    pub fn parse(path: &Path, text: &str) -> Result<Self, CliError> {
        serde_json::from_str(text).map_err(|e| CliError::Input {
            path: path.display().to_string(),
            message: format!(
                "invalid config file: {e} (expected {{\"datacenter_addr\": …, \"bootstrap_addr\": …, \
                 \"scheduler_addr\": …, \"token\": …}})"
            ),
        })
    }
}

/// Which config file to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigPath {
    /// Named by `--config` or `CP_CONFIG`: it must exist.
    Explicit(PathBuf),
    /// The per-user default: read when it exists.
    Default(PathBuf),
    /// No explicit file and no home directory to look in.
    None,
}

impl ConfigPath {
    /// Picks the file: `explicit` if given, else the per-user default
    /// computed from `env` (`XDG_CONFIG_HOME`, then `HOME`). `env` is a
    /// lookup so tests need not touch the process environment.
    pub fn choose(explicit: Option<PathBuf>, env: impl Fn(&str) -> Option<String>) -> Self {
        if let Some(p) = explicit.filter(|p| !p.as_os_str().is_empty()) {
            return ConfigPath::Explicit(p);
        }
        let non_empty = |name: &str| env(name).filter(|v| !v.is_empty());
        // XDG: a relative XDG_CONFIG_HOME is invalid and must be ignored.
        if let Some(xdg) = non_empty("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
        {
            return ConfigPath::Default(xdg.join("ctrlplane").join("config.json"));
        }
        match non_empty("HOME") {
            Some(home) => ConfigPath::Default(
                PathBuf::from(home)
                    .join(".config")
                    .join("ctrlplane")
                    .join("config.json"),
            ),
            None => ConfigPath::None,
        }
    }

    /// The file's path, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            ConfigPath::Explicit(p) | ConfigPath::Default(p) => Some(p),
            ConfigPath::None => None,
        }
    }

    /// Reads and parses the file; a missing default file is an empty
    /// config.
    ///
    /// # Errors
    /// A missing explicit file, an unreadable file, or bad JSON.
    pub fn load(&self) -> Result<ConfigFile, CliError> {
        let (path, must_exist) = match self {
            ConfigPath::Explicit(p) => (p, true),
            ConfigPath::Default(p) => (p, false),
            ConfigPath::None => return Ok(ConfigFile::default()),
        };
        match std::fs::read_to_string(path) {
            Ok(text) => ConfigFile::parse(path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must_exist => {
                Ok(ConfigFile::default())
            }
            Err(e) => Err(CliError::Input {
                path: path.display().to_string(),
                message: format!("cannot read config file: {e}"),
            }),
        }
    }
}

/// A service the CLI talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// `DatacenterService` and `AgentRegistryService`.
    Datacenter,
    /// `BootstrapService`.
    Bootstrap,
    /// `SchedulerService`.
    Scheduler,
}

impl Peer {
    /// Short name used in messages.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Datacenter => "datacenter",
            Peer::Bootstrap => "bootstrap",
            Peer::Scheduler => "scheduler",
        }
    }

    fn default_addr(self) -> String {
        let port = match self {
            Peer::Datacenter => ports::DATACENTER,
            Peer::Bootstrap => ports::BOOTSTRAP,
            Peer::Scheduler => ports::SCHEDULER,
        };
        format!("http://127.0.0.1:{port}")
    }
}

/// Values given on the command line or in the environment (already merged
/// by clap, flag first); `None` or empty = not given.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--endpoint` / `CP_DATACENTER_ADDR`.
    pub datacenter_addr: Option<String>,
    /// `--bootstrap-addr` / `CP_BOOTSTRAP_ADDR`.
    pub bootstrap_addr: Option<String>,
    /// `--scheduler-addr` / `CP_SCHEDULER_ADDR`.
    pub scheduler_addr: Option<String>,
    /// `--token` / `CP_TOKEN`.
    pub token: Option<String>,
}

impl From<&GlobalOpts> for Overrides {
    fn from(g: &GlobalOpts) -> Self {
        Overrides {
            datacenter_addr: g.endpoint.clone(),
            bootstrap_addr: g.bootstrap_addr.clone(),
            scheduler_addr: g.scheduler_addr.clone(),
            token: g.token.clone(),
        }
    }
}

/// Resolved settings and the clients built from them.
#[derive(Debug, Clone)]
pub struct Context {
    datacenter_addr: String,
    bootstrap_addr: String,
    scheduler_addr: String,
    token: Option<String>,
    config_path: Option<PathBuf>,
    timeout: Duration,
}

fn first_non_empty(candidates: [Option<&String>; 2]) -> Option<String> {
    candidates
        .into_iter()
        .flatten()
        .map(|s| s.trim())
        .find(|s| !s.is_empty())
        .map(str::to_string)
}

impl Context {
    /// Builds the context of this process: flags and environment as clap
    /// parsed them, plus the config file they (or the environment) point
    /// to.
    ///
    /// # Errors
    /// An explicit config file that is missing, or any unreadable or
    /// invalid config file.
    pub fn from_global(g: &GlobalOpts) -> Result<Self, CliError> {
        let path = ConfigPath::choose(g.config.clone(), |name| std::env::var(name).ok());
        let file = path.load()?;
        Ok(Context::resolve(
            Overrides::from(g),
            &file,
            path.path(),
            g.timeout,
        ))
    }

    /// Merges overrides over the config file over the defaults (pure).
    pub fn resolve(
        o: Overrides,
        file: &ConfigFile,
        config_path: Option<&Path>,
        timeout: Duration,
    ) -> Self {
        let addr = |flag: Option<&String>, from_file: Option<&String>, peer: Peer| {
            first_non_empty([flag, from_file]).unwrap_or_else(|| peer.default_addr())
        };
        Context {
            datacenter_addr: addr(
                o.datacenter_addr.as_ref(),
                file.datacenter_addr.as_ref(),
                Peer::Datacenter,
            ),
            bootstrap_addr: addr(
                o.bootstrap_addr.as_ref(),
                file.bootstrap_addr.as_ref(),
                Peer::Bootstrap,
            ),
            scheduler_addr: addr(
                o.scheduler_addr.as_ref(),
                file.scheduler_addr.as_ref(),
                Peer::Scheduler,
            ),
            token: first_non_empty([o.token.as_ref(), file.token.as_ref()]),
            config_path: config_path.map(Path::to_path_buf),
            timeout,
        }
    }

    /// The address of a peer, as a URL.
    pub fn addr(&self, peer: Peer) -> String {
        normalize_addr(match peer {
            Peer::Datacenter => &self.datacenter_addr,
            Peer::Bootstrap => &self.bootstrap_addr,
            Peer::Scheduler => &self.scheduler_addr,
        })
    }

    /// The token, if one was given anywhere.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The token.
    ///
    /// # Errors
    /// [`CliError::Config`] telling where a token can be given and how to
    /// mint one.
    pub fn require_token(&self) -> Result<&str, CliError> {
        self.token().ok_or_else(|| {
            let file = match &self.config_path {
                Some(p) => format!("a \"token\" in {}", p.display()),
                None => "a \"token\" in the config file (--config)".to_string(),
            };
            CliError::Config(format!(
                "no token: pass --token, set {}, or put {file}\n\
                 hint: mint one with `ctrlplane token --secret-file <file> --role {}` \
                 (using the secret the services use, {})",
                crate::cli::TOKEN_ENV,
                ctrlplane_runtime::auth::ROLE_ADMIN,
                ctrlplane_runtime::config::AUTH_SECRET,
            ))
        })
    }

    /// A channel to a peer carrying the bearer token. Connecting is lazy:
    /// a peer that is down shows up as `UNAVAILABLE` on the first call.
    ///
    /// # Errors
    /// No token, a token not valid as gRPC metadata, or a bad address.
    pub fn channel(&self, peer: Peer) -> Result<AuthedChannel, CliError> {
        let token = self.require_token()?;
        let interceptor = BearerInterceptor::fixed(token).map_err(|_| {
            CliError::Config(
                "the token contains characters not allowed in gRPC metadata".to_string(),
            )
        })?;
        authed_channel(&self.addr(peer), interceptor).map_err(|e| {
            CliError::Config(format!(
                "{e} (the {} service address; expected host:port or http://host:port)",
                peer.name()
            ))
        })
    }

    /// A `DatacenterService` client.
    ///
    /// # Errors
    /// As [`Context::channel`].
    pub fn datacenter(&self) -> Result<DatacenterServiceClient<AuthedChannel>, CliError> {
        Ok(DatacenterServiceClient::new(
            self.channel(Peer::Datacenter)?,
        ))
    }

    /// An `AgentRegistryService` client (served by the datacenter
    /// service, at its address).
    ///
    /// # Errors
    /// As [`Context::channel`].
    pub fn agents(&self) -> Result<AgentRegistryServiceClient<AuthedChannel>, CliError> {
        Ok(AgentRegistryServiceClient::new(
            self.channel(Peer::Datacenter)?,
        ))
    }

    /// A `BootstrapService` client.
    ///
    /// # Errors
    /// As [`Context::channel`].
    pub fn bootstrap(&self) -> Result<BootstrapServiceClient<AuthedChannel>, CliError> {
        Ok(BootstrapServiceClient::new(self.channel(Peer::Bootstrap)?))
    }

    /// A `SchedulerService` client.
    ///
    /// # Errors
    /// As [`Context::channel`].
    pub fn scheduler(&self) -> Result<SchedulerServiceClient<AuthedChannel>, CliError> {
        Ok(SchedulerServiceClient::new(self.channel(Peer::Scheduler)?))
    }

    /// The call deadline (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Wraps a request message with the call deadline (sent to the server
    /// as `grpc-timeout`).
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut req = tonic::Request::new(message);
        req.set_timeout(self.timeout);
        req
    }

    /// Awaits a unary call, enforcing the deadline locally too (a peer that
    /// accepts the connection but never answers must not hang the CLI), and
    /// turns a failure into [`CliError::Rpc`].
    ///
    /// # Errors
    /// The call's status, or `DEADLINE_EXCEEDED`.
    pub async fn call<T>(
        &self,
        peer: Peer,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, CliError> {
        let result = match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {:?} (raise it with --timeout)",
                self.timeout
            ))),
        };
        result
            .map(tonic::Response::into_inner)
            .map_err(|status| CliError::Rpc {
                status,
                service: peer.name(),
                addr: self.addr(peer),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    const T: Duration = Duration::from_secs(30);

    #[test]
    fn flag_or_env_beats_file_beats_default() {
        let file = ConfigFile {
            datacenter_addr: s("dc.file:7100"),
            bootstrap_addr: s("http://bs.file:7200"),
            scheduler_addr: None,
            token: s("file-token"),
        };
        let o = Overrides {
            datacenter_addr: s("dc.flag:9"),
            token: s("flag-token"),
            ..Default::default()
        };
        let ctx = Context::resolve(o, &file, None, T);
        assert_eq!(ctx.addr(Peer::Datacenter), "http://dc.flag:9");
        assert_eq!(ctx.addr(Peer::Bootstrap), "http://bs.file:7200");
        assert_eq!(ctx.addr(Peer::Scheduler), "http://127.0.0.1:7300");
        assert_eq!(ctx.token(), Some("flag-token"));

        let ctx = Context::resolve(Overrides::default(), &file, None, T);
        assert_eq!(ctx.addr(Peer::Datacenter), "http://dc.file:7100");
        assert_eq!(ctx.token(), Some("file-token"));

        let ctx = Context::resolve(Overrides::default(), &ConfigFile::default(), None, T);
        assert_eq!(ctx.addr(Peer::Datacenter), "http://127.0.0.1:7100");
        assert_eq!(ctx.addr(Peer::Bootstrap), "http://127.0.0.1:7200");
        assert_eq!(ctx.token(), None);
    }

    #[test]
    fn empty_values_count_as_unset() {
        let file = ConfigFile {
            token: s("file-token"),
            datacenter_addr: s(""),
            ..Default::default()
        };
        let o = Overrides {
            token: s(""),
            datacenter_addr: s("  "),
            ..Default::default()
        };
        let ctx = Context::resolve(o, &file, None, T);
        assert_eq!(ctx.token(), Some("file-token"));
        assert_eq!(ctx.addr(Peer::Datacenter), "http://127.0.0.1:7100");
    }

    #[test]
    fn parsed_flags_reach_the_context() {
        use clap::Parser;
        // Only the parse is checked here; the process environment is left
        // alone (tests run in parallel), so this covers the flag side.
        let cli = crate::cli::Cli::try_parse_from([
            "ctrlplane",
            "dc",
            "list",
            "--endpoint",
            "h:1",
            "--token",
            "x",
        ])
        .unwrap();
        let ctx = Context::resolve(
            Overrides::from(&cli.global),
            &ConfigFile::default(),
            None,
            T,
        );
        assert_eq!(ctx.addr(Peer::Datacenter), "http://h:1");
        assert_eq!(ctx.token(), Some("x"));
    }

    #[test]
    fn missing_token_says_how_to_get_one() {
        let ctx = Context::resolve(
            Overrides::default(),
            &ConfigFile::default(),
            Some(Path::new("/c/config.json")),
            T,
        );
        let err = ctx.datacenter().unwrap_err().to_string();
        assert_eq!(ctx.agents().unwrap_err().to_string(), err);
        assert!(
            err.contains("no token: pass --token, set CP_TOKEN"),
            "{err}"
        );
        assert!(err.contains("/c/config.json"), "{err}");
        assert!(err.contains("ctrlplane token"), "{err}");
    }

    #[tokio::test]
    async fn clients_are_made_lazily_and_bad_addresses_are_reported() {
        let o = Overrides {
            token: s("t"),
            ..Default::default()
        };
        let ctx = Context::resolve(o.clone(), &ConfigFile::default(), None, T);
        assert!(
            ctx.datacenter().is_ok() && ctx.agents().is_ok(),
            "nothing listens there, but connecting is lazy"
        );
        let bad = Overrides {
            datacenter_addr: s("http://[bad"),
            ..o
        };
        let err = Context::resolve(bad, &ConfigFile::default(), None, T)
            .datacenter()
            .unwrap_err();
        assert!(
            err.to_string().contains("datacenter service address"),
            "{err}"
        );
    }

    #[test]
    fn config_path_choice() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            ConfigPath::choose(Some("/x/c.json".into()), env(&[("HOME", "/home/a")])),
            ConfigPath::Explicit("/x/c.json".into())
        );
        assert_eq!(
            ConfigPath::choose(
                None,
                env(&[("XDG_CONFIG_HOME", "/xdg"), ("HOME", "/home/a")])
            ),
            ConfigPath::Default("/xdg/ctrlplane/config.json".into())
        );
        assert_eq!(
            ConfigPath::choose(
                None,
                env(&[("XDG_CONFIG_HOME", "rel"), ("HOME", "/home/a")])
            ),
            ConfigPath::Default("/home/a/.config/ctrlplane/config.json".into())
        );
        assert_eq!(
            ConfigPath::choose(Some("".into()), env(&[("HOME", "/home/a")])),
            ConfigPath::Default("/home/a/.config/ctrlplane/config.json".into())
        );
        assert_eq!(ConfigPath::choose(None, env(&[])), ConfigPath::None);
    }

    #[test]
    fn config_files_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");

        // A missing default file is fine; a missing explicit one is not.
        assert_eq!(
            ConfigPath::Default(path.clone()).load().unwrap(),
            ConfigFile::default()
        );
        let err = ConfigPath::Explicit(path.clone())
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot read config file"), "{err}");

        std::fs::write(
            &path,
            r#"{"datacenter_addr":"10.0.0.1:7100","token":"tok"}"#,
        )
        .unwrap();
        let file = ConfigPath::Explicit(path.clone()).load().unwrap();
        assert_eq!(file.datacenter_addr.as_deref(), Some("10.0.0.1:7100"));
        assert_eq!(file.token.as_deref(), Some("tok"));

        std::fs::write(&path, r#"{"datacenter_address":"x"}"#).unwrap();
        let err = ConfigPath::Default(path.clone())
            .load()
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `datacenter_address`"), "{err}");
        assert!(err.starts_with(&path.display().to_string()), "{err}");
    }

    #[tokio::test]
    async fn calls_time_out_locally() {
        let ctx = Context::resolve(
            Overrides::default(),
            &ConfigFile::default(),
            None,
            Duration::from_millis(20),
        );
        let never = std::future::pending::<Result<tonic::Response<()>, tonic::Status>>();
        let err = ctx.call(Peer::Datacenter, never).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("DEADLINE_EXCEEDED: no answer within 20ms"),
            "{err}"
        );
    }
}
