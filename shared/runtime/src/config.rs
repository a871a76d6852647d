//! Every `CP_*` setting in one place.
//!
//! Settings come from the environment (`CP_LISTEN_ADDR=…`) and from command
//! line flags that mirror them (`--listen-addr …` or `--listen-addr=…`); a
//! flag wins over the environment. [`Settings`] holds the raw strings and is
//! built from any lookup, so tests construct it from a map. Typed
//! per-subsystem structs ([`ServerConfig`], [`AuthConfig`], …) parse from it
//! and name the offending variable in every error.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// gRPC bind address, e.g. `127.0.0.1:7100`.
pub const LISTEN_ADDR: &str = "CP_LISTEN_ADDR";
/// Database URL: `sqlite://path/to/file.db` or `postgres://user:pw@host/db`.
pub const DATABASE_URL: &str = "CP_DATABASE_URL";
/// Directory for files a service keeps (SQLite databases by default).
pub const DATA_DIR: &str = "CP_DATA_DIR";
/// Shared HS256 secret for bearer tokens.
pub const AUTH_SECRET: &str = "CP_AUTH_SECRET";
/// File holding the shared secret (used when `CP_AUTH_SECRET` is unset).
pub const AUTH_SECRET_FILE: &str = "CP_AUTH_SECRET_FILE";
/// `tracing` filter, e.g. `info,ctrlplane=debug`.
pub const LOG: &str = "CP_LOG";
/// `human` (default) or `json`.
pub const LOG_FORMAT: &str = "CP_LOG_FORMAT";
/// Address of the datacenter service.
pub const DATACENTER_ADDR: &str = "CP_DATACENTER_ADDR";
/// Address of the bootstrap service.
pub const BOOTSTRAP_ADDR: &str = "CP_BOOTSTRAP_ADDR";
/// Address of the scheduler service.
pub const SCHEDULER_ADDR: &str = "CP_SCHEDULER_ADDR";
/// Agents: join token for the first start.
pub const JOIN_TOKEN: &str = "CP_JOIN_TOKEN";
/// Agents: endpoint the control plane should call.
pub const ADVERTISE_ADDR: &str = "CP_ADVERTISE_ADDR";
/// Agents: directory for the identity file and workload state.
pub const STATE_DIR: &str = "CP_STATE_DIR";
/// Time in-flight calls get to finish after SIGTERM, e.g. `10s`.
pub const SHUTDOWN_GRACE: &str = "CP_SHUTDOWN_GRACE";
/// Maximum database connections of a service's pool.
pub const DB_MAX_CONNECTIONS: &str = "CP_DB_MAX_CONNECTIONS";
/// Bootstrap: JSON file with rule hooks (and remote hooks to register).
pub const BOOTSTRAP_HOOKS_FILE: &str = "CP_BOOTSTRAP_HOOKS_FILE";
/// Bootstrap: age after which unowned backend workloads are removed.
pub const GC_GRACE: &str = "CP_GC_GRACE";
/// Bootstrap: lease of a datacenter reconcile and of a row while an agent
/// call is in flight (a crashed replica's work is taken over after it).
pub const BOOTSTRAP_LEASE_TTL: &str = "CP_BOOTSTRAP_LEASE_TTL";
/// Scheduler: periodic reconcile of every datacenter.
pub const RECONCILE_INTERVAL: &str = "CP_RECONCILE_INTERVAL";
/// Scheduler: status sync interval.
pub const STATUS_SYNC_INTERVAL: &str = "CP_STATUS_SYNC_INTERVAL";
/// Scheduler: garbage collection interval.
pub const GC_INTERVAL: &str = "CP_GC_INTERVAL";
/// Scheduler: resource sampling interval.
pub const TELEMETRY_INTERVAL: &str = "CP_TELEMETRY_INTERVAL";
/// Scheduler: agent health probe interval.
pub const PROVIDER_HEALTH_INTERVAL: &str = "CP_PROVIDER_HEALTH_INTERVAL";
/// Scheduler: leader lease length.
pub const LEADER_LEASE: &str = "CP_LEADER_LEASE";
/// Agents: join with a token minted from the platform secret (`true`).
pub const AUTO_JOIN: &str = "CP_AUTO_JOIN";
/// Docker agent: the engine, `unix:///var/run/docker.sock` (default),
/// `tcp://HOST:PORT` or `http://HOST:PORT`.
pub const DOCKER_HOST: &str = "CP_DOCKER_HOST";
/// Docker agent: the scope its objects are named and labelled with, so
/// several agents can share one engine (default `ctrlplane`).
pub const DOCKER_SCOPE: &str = "CP_DOCKER_SCOPE";
/// Docker agent: the host name reported in endpoints (default `127.0.0.1`).
pub const DOCKER_ENDPOINT_HOST: &str = "CP_DOCKER_ENDPOINT_HOST";

/// Every name above with a one-line description, for `--help` output.
pub const ALL: &[(&str, &str)] = &[
    (LISTEN_ADDR, "gRPC bind address"),
    (DATABASE_URL, "sqlite://FILE or postgres://USER:PW@HOST/DB"),
    (DATA_DIR, "directory for the service's files"),
    (AUTH_SECRET, "shared HS256 token secret"),
    (AUTH_SECRET_FILE, "file holding the token secret"),
    (LOG, "log filter (tracing EnvFilter syntax)"),
    (LOG_FORMAT, "human | json"),
    (DATACENTER_ADDR, "datacenter service address"),
    (BOOTSTRAP_ADDR, "bootstrap service address"),
    (SCHEDULER_ADDR, "scheduler service address"),
    (JOIN_TOKEN, "agent join token (first start only)"),
    (
        ADVERTISE_ADDR,
        "agent endpoint advertised to the control plane",
    ),
    (STATE_DIR, "agent state directory"),
    (SHUTDOWN_GRACE, "drain time after SIGTERM, e.g. 10s"),
    (DB_MAX_CONNECTIONS, "database pool size"),
    (
        BOOTSTRAP_HOOKS_FILE,
        "bootstrap rule/remote hooks file (JSON)",
    ),
    (
        GC_GRACE,
        "grace period before unowned workloads are removed, e.g. 15m",
    ),
    (
        BOOTSTRAP_LEASE_TTL,
        "bootstrap: reconcile and in-flight row lease (60s)",
    ),
    (
        RECONCILE_INTERVAL,
        "scheduler: periodic reconcile of every datacenter (60s)",
    ),
    (
        STATUS_SYNC_INTERVAL,
        "scheduler: status sync interval (30s)",
    ),
    (GC_INTERVAL, "scheduler: garbage collection interval (5m)"),
    (
        TELEMETRY_INTERVAL,
        "scheduler: resource sampling interval (60s)",
    ),
    (
        PROVIDER_HEALTH_INTERVAL,
        "scheduler: agent health probe interval (15s)",
    ),
    (LEADER_LEASE, "scheduler: leader lease length (15s)"),
    (
        AUTO_JOIN,
        "agents: join with a token minted from the platform secret (true/false)",
    ),
    (
        DOCKER_HOST,
        "docker agent: engine address (unix:///var/run/docker.sock)",
    ),
    (
        DOCKER_SCOPE,
        "docker agent: name/label scope of its objects (ctrlplane)",
    ),
    (
        DOCKER_ENDPOINT_HOST,
        "docker agent: host reported in endpoints (127.0.0.1)",
    ),
];

/// A configuration error; names the variable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A required setting is missing.
    #[error("{0} is required (set the environment variable or --{flag})", flag = flag_name(.0))]
    Missing(String),
    /// A setting has a value that does not parse.
    #[error("{name}: {reason} (got {value:?})")]
    Invalid {
        /// Variable name.
        name: String,
        /// The raw value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A command-line argument is not understood.
    #[error("unknown argument {0:?}; run with --help for the list of settings")]
    UnknownArgument(String),
    /// Reading a referenced file failed.
    #[error("{name}: cannot read {path}: {source}")]
    File {
        /// Variable name.
        name: String,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
}

/// Converts `CP_LISTEN_ADDR` into `listen-addr`.
pub fn flag_name(var: &str) -> String {
    var.trim_start_matches("CP_")
        .to_ascii_lowercase()
        .replace('_', "-")
}

fn var_name(flag: &str) -> String {
    format!("CP_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

/// Raw settings: `CP_*` name → value.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: BTreeMap<String, String>,
    /// Names that came from command-line flags (only these are checked by
    /// [`Settings::check_known`]).
    from_flags: std::collections::BTreeSet<String>,
    /// `--help` was given.
    pub help: bool,
}

impl Settings {
    /// Builds settings from the process environment and arguments
    /// (without the program name).
    ///
    /// # Errors
    /// An argument that is not `--name value`, `--name=value` or `--help`.
    pub fn from_env_and_args(args: impl IntoIterator<Item = String>) -> Result<Self, ConfigError> {
        Self::from_sources(std::env::vars(), args)
    }

    /// Builds settings from explicit environment pairs and arguments.
    ///
    /// # Errors
    /// An argument that is not `--name value`, `--name=value` or `--help`.
    pub fn from_sources(
        env: impl IntoIterator<Item = (String, String)>,
        args: impl IntoIterator<Item = String>,
    ) -> Result<Self, ConfigError> {
        let mut s = Settings {
            values: env
                .into_iter()
                .filter(|(k, _)| k.starts_with("CP_"))
                .collect(),
            from_flags: Default::default(),
            help: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            if arg == "--help" || arg == "-h" {
                s.help = true;
                continue;
            }
            let Some(flag) = arg.strip_prefix("--") else {
                return Err(ConfigError::UnknownArgument(arg));
            };
            let (name, value) = match flag.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => {
                    let v = args
                        .next()
                        .ok_or_else(|| ConfigError::UnknownArgument(arg.clone()))?;
                    (flag.to_string(), v)
                }
            };
            if name.is_empty() {
                return Err(ConfigError::UnknownArgument(arg));
            }
            s.from_flags.insert(var_name(&name));
            s.values.insert(var_name(&name), value);
        }
        Ok(s)
    }

    /// Builds settings from a map (tests).
    pub fn from_map<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Settings {
            values: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            from_flags: Default::default(),
            help: false,
        }
    }

    /// The raw value of a setting; an empty value counts as unset.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values
            .get(name)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A required setting.
    ///
    /// # Errors
    /// [`ConfigError::Missing`].
    pub fn require(&self, name: &str) -> Result<&str, ConfigError> {
        self.get(name)
            .ok_or_else(|| ConfigError::Missing(name.to_string()))
    }

    /// Parses a setting with `FromStr`, falling back to `default`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the variable.
    pub fn parse_or<T>(&self, name: &str, default: T) -> Result<T, ConfigError>
    where
        T: std::str::FromStr,
        T::Err: std::fmt::Display,
    {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e: T::Err| ConfigError::Invalid {
                name: name.to_string(),
                value: v.to_string(),
                reason: e.to_string(),
            }),
        }
    }

    /// A duration setting (`500ms`, `10s`, `5m`, `1h`, or plain seconds).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the variable.
    pub fn duration_or(&self, name: &str, default: Duration) -> Result<Duration, ConfigError> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => parse_duration(v).map_err(|reason| ConfigError::Invalid {
                name: name.to_string(),
                value: v.to_string(),
                reason,
            }),
        }
    }

    /// Rejects any `CP_*` setting given as a flag that this process does not
    /// know, so a typo in a flag is an error rather than silently ignored.
    /// (Unknown environment variables are tolerated: one environment often
    /// serves several processes.)
    ///
    /// # Errors
    /// [`ConfigError::UnknownArgument`].
    pub fn check_known(&self, known: &[&str]) -> Result<(), ConfigError> {
        for name in &self.from_flags {
            let is_known = known.contains(&name.as_str()) || ALL.iter().any(|(n, _)| n == name);
            if !is_known {
                return Err(ConfigError::UnknownArgument(format!(
                    "--{}",
                    flag_name(name)
                )));
            }
        }
        Ok(())
    }
}

/// Parses `500ms`, `10s`, `5m`, `1h` or a plain number of seconds.
///
/// # Errors
/// A human-readable reason.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| "expected a duration like 500ms, 10s, 5m or 1h".to_string())?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => {
            return Err(format!(
                "unknown duration unit {unit:?} (use ms, s, m or h)"
            ));
        }
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err("duration must be a non-negative number".to_string());
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Human,
    /// One JSON object per line.
    Json,
}

/// Logging configuration.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `tracing` filter directives.
    pub filter: String,
    /// Output format.
    pub format: LogFormat,
}

impl LogConfig {
    /// Reads `CP_LOG` and `CP_LOG_FORMAT`.
    ///
    /// # Errors
    /// An unknown format.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        let format = match s.get(LOG_FORMAT).unwrap_or("human") {
            "human" | "text" => LogFormat::Human,
            "json" => LogFormat::Json,
            other => {
                return Err(ConfigError::Invalid {
                    name: LOG_FORMAT.to_string(),
                    value: other.to_string(),
                    reason: "expected human or json".to_string(),
                });
            }
        };
        Ok(LogConfig {
            filter: s.get(LOG).unwrap_or("info").to_string(),
            format,
        })
    }
}

/// Configuration of a gRPC server process.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Bind address.
    pub listen_addr: SocketAddr,
    /// Drain time after SIGTERM.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    /// Reads `CP_LISTEN_ADDR` (default `default_addr`) and `CP_SHUTDOWN_GRACE`.
    ///
    /// # Errors
    /// Unparsable values.
    pub fn from_settings(s: &Settings, default_addr: SocketAddr) -> Result<Self, ConfigError> {
        Ok(ServerConfig {
            listen_addr: s.parse_or(LISTEN_ADDR, default_addr)?,
            shutdown_grace: s.duration_or(SHUTDOWN_GRACE, Duration::from_secs(10))?,
        })
    }
}

/// Token secret configuration.
#[derive(Clone)]
pub struct AuthConfig {
    /// The HS256 secret.
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// Shortest secret accepted: HS256 wants at least 256 bits.
pub const MIN_SECRET_LEN: usize = 32;

impl AuthConfig {
    /// Reads `CP_AUTH_SECRET`, else the file named by `CP_AUTH_SECRET_FILE`
    /// (trailing whitespace trimmed).
    ///
    /// # Errors
    /// Neither set, the file unreadable, or the secret shorter than
    /// [`MIN_SECRET_LEN`] bytes.
    pub fn from_settings(s: &Settings) -> Result<Self, ConfigError> {
        let (name, secret) = if let Some(v) = s.get(AUTH_SECRET) {
            (AUTH_SECRET, v.to_string())
        } else if let Some(path) = s.get(AUTH_SECRET_FILE) {
            let raw = std::fs::read_to_string(path).map_err(|source| ConfigError::File {
                name: AUTH_SECRET_FILE.to_string(),
                path: path.to_string(),
                source,
            })?;
            (AUTH_SECRET_FILE, raw.trim_end().to_string())
        } else {
            return Err(ConfigError::Missing(AUTH_SECRET.to_string()));
        };
        if secret.len() < MIN_SECRET_LEN {
            return Err(ConfigError::Invalid {
                name: name.to_string(),
                value: "<redacted>".to_string(),
                reason: format!("the secret must be at least {MIN_SECRET_LEN} bytes"),
            });
        }
        Ok(AuthConfig {
            secret: secret.into_bytes(),
        })
    }
}

/// Database configuration.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `sqlite://…` or `postgres://…`.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
}

impl DatabaseConfig {
    /// Reads `CP_DATABASE_URL`; without it, a SQLite file named
    /// `default_file` under `CP_DATA_DIR` (default `./data`).
    ///
    /// # Errors
    /// A URL of another scheme, or an unparsable pool size.
    pub fn from_settings(s: &Settings, default_file: &str) -> Result<Self, ConfigError> {
        let url = match s.get(DATABASE_URL) {
            Some(u) => u.to_string(),
            None => {
                let dir = PathBuf::from(s.get(DATA_DIR).unwrap_or("data"));
                format!("sqlite://{}", dir.join(default_file).display())
            }
        };
        if !(url.starts_with("sqlite:")
            || url.starts_with("postgres://")
            || url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid {
                name: DATABASE_URL.to_string(),
                value: redact_url(&url),
                reason: "expected sqlite://FILE or postgres://…".to_string(),
            });
        }
        Ok(DatabaseConfig {
            url,
            max_connections: s.parse_or(DB_MAX_CONNECTIONS, 10u32)?,
        })
    }
}

/// Replaces the password of a URL with `***` for logs and errors.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Addresses of peer services.
#[derive(Debug, Clone)]
pub struct PeersConfig {
    /// Datacenter service.
    pub datacenter: String,
    /// Bootstrap service.
    pub bootstrap: String,
    /// Scheduler service.
    pub scheduler: String,
}

/// Default ports of the processes.
pub mod ports {
    /// Datacenter service.
    pub const DATACENTER: u16 = 7100;
    /// Bootstrap service.
    pub const BOOTSTRAP: u16 = 7200;
    /// Scheduler service.
    pub const SCHEDULER: u16 = 7300;
    /// Process agent.
    pub const AGENT_PROCESS: u16 = 7401;
    /// Docker agent.
    pub const AGENT_DOCKER: u16 = 7402;
    /// Kubernetes agent.
    pub const AGENT_KUBERNETES: u16 = 7403;
    /// Nomad agent.
    pub const AGENT_NOMAD: u16 = 7404;
}

impl PeersConfig {
    /// Reads `CP_DATACENTER_ADDR`, `CP_BOOTSTRAP_ADDR`, `CP_SCHEDULER_ADDR`
    /// with loopback defaults.
    pub fn from_settings(s: &Settings) -> Self {
        let addr = |name: &str, port: u16| {
            s.get(name)
                .map(str::to_string)
                .unwrap_or_else(|| format!("http://127.0.0.1:{port}"))
        };
        PeersConfig {
            datacenter: addr(DATACENTER_ADDR, ports::DATACENTER),
            bootstrap: addr(BOOTSTRAP_ADDR, ports::BOOTSTRAP),
            scheduler: addr(SCHEDULER_ADDR, ports::SCHEDULER),
        }
    }
}

/// Text for `--help`: usage line plus every setting.
pub fn help_text(program: &str, about: &str, names: &[&str]) -> String {
    let mut out = format!(
        "{program} — {about}\n\nUsage: {program} [--setting value]...\n\nSettings (flag / environment variable):\n"
    );
    for (name, desc) in ALL.iter().filter(|(n, _)| names.contains(n)) {
        out.push_str(&format!(
            "  --{:<22} {:<24} {desc}\n",
            flag_name(name),
            name
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_env() {
        let s = Settings::from_sources(
            [
                ("CP_LISTEN_ADDR".to_string(), "127.0.0.1:1".to_string()),
                ("HOME".to_string(), "/x".to_string()),
            ],
            [
                "--listen-addr=127.0.0.1:2".to_string(),
                "--log".to_string(),
                "debug".to_string(),
            ],
        )
        .unwrap();
        assert_eq!(s.get(LISTEN_ADDR), Some("127.0.0.1:2"));
        assert_eq!(s.get(LOG), Some("debug"));
        assert_eq!(s.get("HOME"), None);
    }

    #[test]
    fn bad_arguments_are_rejected() {
        assert!(Settings::from_sources(Vec::new(), ["positional".to_string()]).is_err());
        assert!(Settings::from_sources(Vec::new(), ["--listen-addr".to_string()]).is_err());
        let s = Settings::from_sources(Vec::new(), ["--lisen-addr=x".to_string()]).unwrap();
        let err = s.check_known(&[]).unwrap_err().to_string();
        assert!(err.contains("--lisen-addr"), "{err}");
        // Unrelated CP_* variables in the environment are tolerated: one
        // environment often serves several processes (and the CLI).
        let s = Settings::from_sources(
            [
                ("CP_TOKEN".to_string(), "x".to_string()),
                ("CP_TEST_POSTGRES_URL".to_string(), "y".to_string()),
            ],
            Vec::new(),
        )
        .unwrap();
        s.check_known(&[]).unwrap();
    }

    #[test]
    fn typed_configs_name_the_variable() {
        let s = Settings::from_map([(LISTEN_ADDR, "nope")]);
        let err = ServerConfig::from_settings(&s, "127.0.0.1:1".parse().unwrap()).unwrap_err();
        assert!(err.to_string().starts_with("CP_LISTEN_ADDR"), "{err}");

        let err = AuthConfig::from_settings(&Settings::default()).unwrap_err();
        assert!(
            err.to_string().contains("CP_AUTH_SECRET is required"),
            "{err}"
        );
        let err =
            AuthConfig::from_settings(&Settings::from_map([(AUTH_SECRET, "short")])).unwrap_err();
        assert!(err.to_string().contains("at least 32"), "{err}");
        assert!(!err.to_string().contains("short"), "secret leaked: {err}");

        let err = LogConfig::from_settings(&Settings::from_map([(LOG_FORMAT, "xml")])).unwrap_err();
        assert!(err.to_string().contains("CP_LOG_FORMAT"));
    }

    #[test]
    fn secret_from_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        let s = Settings::from_map([(AUTH_SECRET_FILE, path.to_str().unwrap())]);
        assert_eq!(
            AuthConfig::from_settings(&s).unwrap().secret,
            b"0123456789abcdef0123456789abcdef"
        );
    }

    #[test]
    fn database_defaults_to_sqlite_under_data_dir() {
        let s = Settings::from_map([(DATA_DIR, "/var/lib/cp")]);
        let db = DatabaseConfig::from_settings(&s, "datacenter.db").unwrap();
        assert_eq!(db.url, "sqlite:///var/lib/cp/datacenter.db");
        let bad = Settings::from_map([(DATABASE_URL, "mysql://u:pw@h/db")]);
        let err = DatabaseConfig::from_settings(&bad, "x.db")
            .unwrap_err()
            .to_string();
        assert!(err.contains("u:***@h") && !err.contains("pw"), "{err}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("10").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("10d").is_err());
        assert!(parse_duration("abc").is_err());
    }
}
