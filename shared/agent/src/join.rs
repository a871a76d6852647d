//! The agent side of joining the control plane.
//!
//! Flow (a node bootstrapper's init/join with a one-way lock):
//! 1. If `STATE_DIR/identity.json` exists, the agent has joined: it loads
//!    the identity and never joins again, whatever join token it is given.
//! 2. Otherwise it needs a join token. Before the first attempt it persists
//!    an idempotency key (`STATE_DIR/join-key`), so a retry of a join whose
//!    answer was lost — even across a crash — gets the same identity back.
//! 3. `JoinAgent` is retried with exponential backoff and full jitter while
//!    the control plane is unreachable (`UNAVAILABLE` and friends), and
//!    never on a refusal (bad, expired or used-up token, wrong provider):
//!    that is a [`JoinError::Rejected`] the agent exits on.
//! 4. The identity is written atomically (temp file + rename, mode 0600),
//!    then the key is removed. From then on [`heartbeat_loop`] renews the
//!    lease with the credential.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ctrlplane_proto::agent::v1 as pb;
use ctrlplane_proto::agent::v1::agent_registry_service_client::AgentRegistryServiceClient;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_ADMIN};
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel, channel};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tonic::Code;

/// Name of the identity file in the state directory.
pub const IDENTITY_FILE: &str = "identity.json";
/// Name of the pending-join key file in the state directory.
pub const JOIN_KEY_FILE: &str = "join-key";
/// Name of the file holding a join token the agent minted for itself
/// (auto-join), kept until the join succeeds so that a retry after a crash
/// reuses it (and with the same key gets the same identity back).
pub const AUTO_TOKEN_FILE: &str = "auto-join-token";

/// What the agent tells the registry about itself.
#[derive(Debug, Clone)]
pub struct JoinOptions {
    /// Address of the datacenter service (which serves the registry).
    pub control_plane: String,
    /// Join token (needed only before the first join).
    pub join_token: Option<String>,
    /// State directory holding the identity file.
    pub state_dir: PathBuf,
    /// Provider this agent serves.
    pub provider_name: String,
    /// Endpoint the control plane should call.
    pub endpoint: String,
    /// Agent version.
    pub version: String,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
    /// Free-form info.
    pub info: HashMap<String, String>,
    /// First retry delay.
    pub initial_backoff: Duration,
    /// Largest retry delay.
    pub max_backoff: Duration,
    /// Give up after this many attempts (`None`: never).
    pub max_attempts: Option<u32>,
    /// Auto-join: with no identity and no `join_token`, mint a single-use
    /// join token with this platform secret (which the agent holds anyway to
    /// verify the control plane's tokens) and join with it.
    pub auto_join: Option<std::sync::Arc<Authenticator>>,
}

impl JoinOptions {
    /// Options with default backoff (200ms doubling up to 30s, forever).
    pub fn new(
        control_plane: impl Into<String>,
        state_dir: impl Into<PathBuf>,
        provider_name: impl Into<String>,
        endpoint: impl Into<String>,
    ) -> Self {
        JoinOptions {
            control_plane: control_plane.into(),
            join_token: None,
            state_dir: state_dir.into(),
            provider_name: provider_name.into(),
            endpoint: endpoint.into(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            capabilities: Vec::new(),
            info: HashMap::new(),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(30),
            max_attempts: None,
            auto_join: None,
        }
    }
}

/// A joined agent's identity, as stored in the identity file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Agent id (`agt_…`).
    pub agent_id: String,
    /// Bearer credential (role `system:agent`).
    pub credential: String,
    /// Provider served.
    pub provider_name: String,
    /// Registry address used to join.
    pub control_plane: String,
    /// Heartbeat interval in milliseconds.
    pub heartbeat_interval_ms: u64,
}

impl Identity {
    /// The heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms.max(100))
    }
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// No identity yet and no token to join with.
    #[error(
        "this agent has not joined yet and no join token was given: mint one with `ctrlplane agents token --provider {provider}` (or grpcurl CreateJoinToken) and start the agent with CP_JOIN_TOKEN"
    )]
    NoToken {
        /// Provider name.
        provider: String,
    },
    /// The control plane refused the join: retrying cannot help.
    #[error("the control plane refused to let this agent join ({code:?}): {message}")]
    Rejected {
        /// gRPC code.
        code: Code,
        /// The server's message.
        message: String,
    },
    /// The identity on disk is for another provider.
    #[error(
        "{path} belongs to an agent of provider {found:?}, but this agent serves {wanted:?}; use another state directory"
    )]
    ProviderMismatch {
        /// The identity file.
        path: String,
        /// Provider in the file.
        found: String,
        /// Configured provider.
        wanted: String,
    },
    /// The state directory could not be read or written.
    #[error("state directory {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The identity file does not parse.
    #[error("identity file {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// Gave up after `max_attempts` retryable failures.
    #[error("could not reach the control plane at {addr} after {attempts} attempts: {last}")]
    GaveUp {
        /// Registry address.
        addr: String,
        /// Attempts made.
        attempts: u32,
        /// Last error.
        last: String,
    },
    /// The registry address is not valid.
    #[error("{0}")]
    Address(#[from] ctrlplane_runtime::client::AddressError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> JoinError + '_ {
    move |source| JoinError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Whether a failed call may succeed if retried.
pub fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Unknown
            | Code::Internal
    )
}

/// Full-jitter exponential backoff: a random delay in `[0, min(max, base·2ⁿ)]`.
pub fn backoff(attempt: u32, base: Duration, max: Duration) -> Duration {
    let cap = base
        .saturating_mul(2u32.saturating_pow(attempt.min(20)))
        .min(max);
    let ms = cap.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(rand::rng().random_range(0..=ms))
}

/// Loads the identity file, if the agent has joined.
///
/// # Errors
/// Unreadable or corrupt file.
pub fn load_identity(state_dir: &Path) -> Result<Option<Identity>, JoinError> {
    let path = state_dir.join(IDENTITY_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| JoinError::Corrupt {
                path: path.display().to_string(),
                reason: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(&path)(e)),
    }
}

/// Writes a file atomically with mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), JoinError> {
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&tmp).map_err(io_err(&tmp))?;
        f.write_all(bytes).map_err(io_err(&tmp))?;
        f.sync_all().map_err(io_err(&tmp))?;
    }
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// Stores the identity (also used when a heartbeat refreshes the
/// credential).
///
/// # Errors
/// The file cannot be written.
pub fn store_identity(state_dir: &Path, identity: &Identity) -> Result<(), JoinError> {
    let bytes = serde_json::to_vec_pretty(identity).expect("identity serializes");
    write_private(&state_dir.join(IDENTITY_FILE), &bytes)
}

fn join_key(state_dir: &Path) -> Result<String, JoinError> {
    let path = state_dir.join(JOIN_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => return Ok(k.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&path)(e)),
    }
    let key: String = (0..32)
        .map(|_| format!("{:x}", rand::rng().random_range(0..16u8)))
        .collect();
    write_private(&path, key.as_bytes())?;
    Ok(key)
}

/// The join token of an auto-join: the one minted earlier (persisted before
/// first use), else a new single-use token from `CreateJoinToken`, called
/// with a short-lived `system:admin` token minted from the platform secret
/// and retried like the join itself while the registry is unreachable.
async fn auto_join_token(opts: &JoinOptions, auth: &Authenticator) -> Result<String, JoinError> {
    let path = opts.state_dir.join(AUTO_TOKEN_FILE);
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(t.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&path)(e)),
    }
    let client = AgentRegistryServiceClient::new(channel(&opts.control_plane)?);
    let token = with_retries(opts, "auto-join: CreateJoinToken", || {
        // A fresh short-lived admin token per attempt.
        let admin = auth.mint(&Claims::new(
            format!("agent-auto-join:{}", opts.provider_name),
            "",
            vec![ROLE_ADMIN.to_string()],
            Duration::from_secs(60),
        ));
        let mut req = tonic::Request::new(pb::CreateJoinTokenRequest {
            provider_name: opts.provider_name.clone(),
            ttl: Some(ctrlplane_proto::pbjson_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            max_uses: 1,
        });
        req.set_timeout(Duration::from_secs(10));
        let bearer = format!("Bearer {admin}").parse();
        let mut client = client.clone();
        async move {
            let bearer = bearer.map_err(|_| tonic::Status::internal("a JWT is valid metadata"))?;
            req.metadata_mut().insert("authorization", bearer);
            Ok(client.create_join_token(req).await?.into_inner().token)
        }
    })
    .await
    .map_err(|e| match e {
        JoinError::Rejected { code, message } => JoinError::Rejected {
            code,
            message: format!(
                "auto-join: CreateJoinToken refused (is CP_AUTH_SECRET the control plane's secret?): {message}"
            ),
        },
        e => e,
    })?;
    write_private(&path, token.as_bytes())?;
    tracing::info!("auto-join: minted a single-use join token");
    Ok(token)
}

/// Runs `call` until it succeeds, retrying with backoff while the failure
/// is [`retryable`] (up to `opts.max_attempts`); any other failure is a
/// final [`JoinError::Rejected`].
async fn with_retries<T, F>(
    opts: &JoinOptions,
    what: &str,
    mut call: impl FnMut() -> F,
) -> Result<T, JoinError>
where
    F: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        match call().await {
            Ok(v) => return Ok(v),
            Err(status) if retryable(status.code()) => {
                if opts.max_attempts.is_some_and(|max| attempt >= max) {
                    return Err(JoinError::GaveUp {
                        addr: opts.control_plane.clone(),
                        attempts: attempt,
                        last: format!("{:?}: {}", status.code(), status.message()),
                    });
                }
                let delay = backoff(attempt - 1, opts.initial_backoff, opts.max_backoff);
                tracing::warn!(attempt, ?delay, code = ?status.code(), message = status.message(), "{what} failed; retrying");
                tokio::time::sleep(delay).await;
            }
            Err(status) => {
                return Err(JoinError::Rejected {
                    code: status.code(),
                    message: status.message().to_string(),
                });
            }
        }
    }
}

/// Returns the agent's identity, joining first if it has none.
///
/// # Errors
/// See [`JoinError`]; `Rejected` and `NoToken` are final.
pub async fn ensure_identity(opts: &JoinOptions) -> Result<Identity, JoinError> {
    std::fs::create_dir_all(&opts.state_dir).map_err(io_err(&opts.state_dir))?;
    if let Some(identity) = load_identity(&opts.state_dir)? {
        if identity.provider_name != opts.provider_name {
            return Err(JoinError::ProviderMismatch {
                path: opts.state_dir.join(IDENTITY_FILE).display().to_string(),
                found: identity.provider_name,
                wanted: opts.provider_name.clone(),
            });
        }
        if opts.join_token.is_some() {
            tracing::info!(agent_id = %identity.agent_id, "already joined; ignoring the join token");
        }
        return Ok(identity);
    }
    let token = match (&opts.join_token, &opts.auto_join) {
        (Some(t), _) => t.clone(),
        (None, Some(auth)) => auto_join_token(opts, auth).await?,
        (None, None) => {
            return Err(JoinError::NoToken {
                provider: opts.provider_name.clone(),
            });
        }
    };
    let key = join_key(&opts.state_dir)?;
    let client = AgentRegistryServiceClient::new(channel(&opts.control_plane)?);
    let request = pb::JoinAgentRequest {
        token,
        provider_name: opts.provider_name.clone(),
        endpoint: opts.endpoint.clone(),
        version: opts.version.clone(),
        info: opts.info.clone(),
        capabilities: opts.capabilities.clone(),
        idempotency_key: key,
    };
    let r = with_retries(opts, "join", || {
        let mut req = tonic::Request::new(request.clone());
        req.set_timeout(Duration::from_secs(10));
        let mut client = client.clone();
        async move { Ok(client.join_agent(req).await?.into_inner()) }
    })
    .await
    .inspect_err(|e| {
        // A minted token that was refused (expired while the agent was
        // down, say) is dropped, so the next start mints a fresh one.
        if matches!(e, JoinError::Rejected { .. }) && opts.join_token.is_none() {
            let _ = std::fs::remove_file(opts.state_dir.join(AUTO_TOKEN_FILE));
        }
    })?;
    let identity = Identity {
        agent_id: r.agent_id,
        credential: r.credential,
        provider_name: opts.provider_name.clone(),
        control_plane: opts.control_plane.clone(),
        heartbeat_interval_ms: r
            .heartbeat_interval
            .map(|d| (d.seconds.max(0) as u64) * 1000 + (d.nanos.max(0) as u64) / 1_000_000)
            .unwrap_or(10_000),
    };
    store_identity(&opts.state_dir, &identity)?;
    let _ = std::fs::remove_file(opts.state_dir.join(JOIN_KEY_FILE));
    let _ = std::fs::remove_file(opts.state_dir.join(AUTO_TOKEN_FILE));
    tracing::info!(agent_id = %identity.agent_id, "joined the control plane");
    Ok(identity)
}

/// Why the heartbeat loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum HeartbeatError {
    /// The registry no longer accepts this agent (revoked or unknown).
    #[error(
        "the control plane no longer accepts this agent ({code:?}: {message}); remove {state_dir}/identity.json and join again with a new token"
    )]
    Refused {
        /// gRPC code.
        code: Code,
        /// Server message.
        message: String,
        /// State directory.
        state_dir: String,
    },
    /// Writing a refreshed credential failed.
    #[error(transparent)]
    Join(#[from] JoinError),
}

/// Renews the lease every heartbeat interval until `shutdown` resolves.
/// Transient failures are logged and retried on the next tick; a refusal
/// (`UNAUTHENTICATED`/`PERMISSION_DENIED`/`NOT_FOUND`) ends the loop.
///
/// # Errors
/// [`HeartbeatError`].
pub async fn heartbeat_loop(
    mut identity: Identity,
    opts: JoinOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), HeartbeatError> {
    tokio::pin!(shutdown);
    let mut failures = 0u32;
    loop {
        let mut client = AgentRegistryServiceClient::new(
            authed_channel(
                &identity.control_plane,
                BearerInterceptor::fixed(&identity.credential).map_err(JoinError::from)?,
            )
            .map_err(JoinError::from)?,
        );
        let mut req = tonic::Request::new(pb::HeartbeatRequest {
            agent_id: identity.agent_id.clone(),
            endpoint: opts.endpoint.clone(),
            capabilities: opts.capabilities.clone(),
        });
        req.set_timeout(Duration::from_secs(10));
        let delay = match client.heartbeat(req).await {
            Ok(resp) => {
                failures = 0;
                let r = resp.into_inner();
                if !r.credential.is_empty() && r.credential != identity.credential {
                    identity.credential = r.credential;
                    store_identity(&opts.state_dir, &identity)?;
                    tracing::info!("credential refreshed");
                }
                if let Some(d) = r.heartbeat_interval {
                    identity.heartbeat_interval_ms =
                        (d.seconds.max(0) as u64) * 1000 + (d.nanos.max(0) as u64) / 1_000_000;
                }
                identity.heartbeat_interval()
            }
            Err(s)
                if matches!(
                    s.code(),
                    Code::Unauthenticated | Code::PermissionDenied | Code::NotFound
                ) =>
            {
                return Err(HeartbeatError::Refused {
                    code: s.code(),
                    message: s.message().to_string(),
                    state_dir: opts.state_dir.display().to_string(),
                });
            }
            Err(s) => {
                failures += 1;
                tracing::warn!(code = ?s.code(), message = s.message(), failures, "heartbeat failed");
                backoff(
                    failures,
                    Duration::from_millis(200),
                    identity.heartbeat_interval(),
                )
                .max(Duration::from_millis(100))
            }
        };
        tokio::select! {
            () = &mut shutdown => return Ok(()),
            () = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_and_jittered() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(2);
        for attempt in 0..30 {
            let d = backoff(attempt, base, max);
            assert!(d <= max, "{attempt}: {d:?}");
            assert!(d <= base * 2u32.pow(attempt.min(20)), "{attempt}: {d:?}");
        }
        // Jitter: not every draw is the same.
        let draws: std::collections::HashSet<_> = (0..50).map(|_| backoff(10, base, max)).collect();
        assert!(draws.len() > 1);
    }

    #[test]
    fn identity_round_trips_privately_and_the_key_is_stable() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load_identity(dir.path()).unwrap(), None);
        let id = Identity {
            agent_id: "agt_x".into(),
            credential: "c".into(),
            provider_name: "process".into(),
            control_plane: "http://127.0.0.1:1".into(),
            heartbeat_interval_ms: 1000,
        };
        store_identity(dir.path(), &id).unwrap();
        assert_eq!(load_identity(dir.path()).unwrap(), Some(id));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(IDENTITY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let k1 = join_key(dir.path()).unwrap();
        assert_eq!(join_key(dir.path()).unwrap(), k1);
        std::fs::write(dir.path().join(IDENTITY_FILE), b"{not json").unwrap();
        assert!(matches!(
            load_identity(dir.path()),
            Err(JoinError::Corrupt { .. })
        ));
    }

    #[tokio::test]
    async fn existing_identity_is_a_one_way_lock() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity {
            agent_id: "agt_x".into(),
            credential: "c".into(),
            provider_name: "process".into(),
            // Nothing listens here: a join attempt would fail.
            control_plane: "http://127.0.0.1:9".into(),
            heartbeat_interval_ms: 1000,
        };
        store_identity(dir.path(), &id).unwrap();
        let mut opts = JoinOptions::new(
            "http://127.0.0.1:9",
            dir.path(),
            "process",
            "http://127.0.0.1:2",
        );
        opts.join_token = Some("a-new-token".into());
        assert_eq!(ensure_identity(&opts).await.unwrap(), id);
        opts.provider_name = "docker".into();
        assert!(matches!(
            ensure_identity(&opts).await,
            Err(JoinError::ProviderMismatch { .. })
        ));
    }

    #[tokio::test]
    async fn no_token_and_unreachable_registry_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = JoinOptions::new(
            "http://127.0.0.1:9",
            dir.path(),
            "process",
            "http://127.0.0.1:2",
        );
        let err = ensure_identity(&opts).await.unwrap_err();
        assert!(err.to_string().contains("CP_JOIN_TOKEN"), "{err}");
        opts.join_token = Some("tok".into());
        opts.max_attempts = Some(3);
        opts.initial_backoff = Duration::from_millis(1);
        opts.max_backoff = Duration::from_millis(5);
        match ensure_identity(&opts).await.unwrap_err() {
            JoinError::GaveUp { attempts, .. } => assert_eq!(attempts, 3),
            other => panic!("{other:?}"),
        }
        // The key survives for the next try.
        assert!(dir.path().join(JOIN_KEY_FILE).exists());
    }
}
