//! Running an agent as a member of the control plane: serve a [`Provider`]
//! and, when configured to, join the registry and heartbeat — the part
//! every agent binary shares.
//!
//! Joining is on when `CP_DATACENTER_ADDR`, `CP_JOIN_TOKEN` or
//! `CP_AUTO_JOIN=true` is set, or when the state directory already holds an
//! identity (a joined agent always heartbeats). Without any of them the
//! agent runs standalone.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::config::{self, ConfigError, PeersConfig, Settings};
use ctrlplane_runtime::server::ServeError;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Provider;
use crate::join::{self, HeartbeatError, JoinError, JoinOptions};

/// The settings [`JoinConfig::from_settings`] reads.
pub const SETTINGS: &[&str] = &[
    config::DATACENTER_ADDR,
    config::JOIN_TOKEN,
    config::ADVERTISE_ADDR,
    config::AUTO_JOIN,
];

/// Joining the control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinConfig {
    /// Address of the datacenter service (the agent registry).
    pub datacenter_addr: String,
    /// Join token for the first start.
    pub join_token: Option<String>,
    /// Endpoint to advertise; default `http://<bound address>`.
    pub advertise_addr: Option<String>,
    /// Mint a join token with the platform secret when there is none.
    pub auto_join: bool,
}

impl JoinConfig {
    /// Reads the join settings; `None` runs standalone (see the module
    /// docs for when joining is on).
    ///
    /// # Errors
    /// An invalid `CP_ADVERTISE_ADDR` or `CP_AUTO_JOIN`, naming it.
    pub fn from_settings(s: &Settings, state_dir: &Path) -> Result<Option<Self>, ConfigError> {
        let auto_join = s.parse_or(config::AUTO_JOIN, false)?;
        if let Some(addr) = s.get(config::ADVERTISE_ADDR)
            && !(addr.starts_with("http://") || addr.starts_with("https://"))
        {
            return Err(ConfigError::Invalid {
                name: config::ADVERTISE_ADDR.to_string(),
                value: addr.to_string(),
                reason: "expected http://HOST:PORT or https://HOST:PORT".to_string(),
            });
        }
        let joined = state_dir.join(join::IDENTITY_FILE).exists();
        let wants_join = auto_join
            || s.get(config::DATACENTER_ADDR).is_some()
            || s.get(config::JOIN_TOKEN).is_some();
        Ok((joined || wants_join).then(|| JoinConfig {
            datacenter_addr: PeersConfig::from_settings(s).datacenter,
            join_token: s.get(config::JOIN_TOKEN).map(str::to_string),
            advertise_addr: s.get(config::ADVERTISE_ADDR).map(str::to_string),
            auto_join,
        }))
    }
}

/// The endpoint advertised for a bound address: `http://addr`, with an
/// unspecified IP (`0.0.0.0`, `::`) replaced by loopback.
pub fn advertised_endpoint(addr: SocketAddr) -> String {
    let ip = if addr.ip().is_unspecified() {
        std::net::IpAddr::from([127, 0, 0, 1])
    } else {
        addr.ip()
    };
    format!("http://{}", SocketAddr::new(ip, addr.port()))
}

/// How [`serve_member`] runs.
pub struct Member {
    /// The secret tokens are verified with (and auto-join tokens minted
    /// with).
    pub auth: Arc<Authenticator>,
    /// Drain time of the gRPC server on shutdown.
    pub shutdown_grace: Duration,
    /// Joining; `None` runs standalone.
    pub join: Option<JoinConfig>,
    /// State directory (identity file, join key).
    pub state_dir: PathBuf,
    /// Free-form info sent when joining.
    pub info: std::collections::HashMap<String, String>,
}

/// Why a member stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The server failed.
    #[error("{0}")]
    Serve(#[from] ServeError),
    /// Joining the control plane failed for good.
    #[error("{0}")]
    Join(#[from] JoinError),
    /// The control plane stopped accepting the agent.
    #[error("{0}")]
    Heartbeat(#[from] HeartbeatError),
}

/// Serves `provider` on `listener` until `shutdown` resolves and, when
/// `member.join` is set, joins the control plane (provider name and
/// capabilities from the provider itself) and heartbeats. A join refusal or
/// a revoked agent stops the server and is returned.
///
/// # Errors
/// See [`MemberError`].
pub async fn serve_member<P: Provider>(
    provider: Arc<P>,
    member: Member,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), MemberError> {
    let stop = CancellationToken::new();
    let endpoint = match member.join.as_ref().and_then(|j| j.advertise_addr.clone()) {
        Some(e) => e,
        None => advertised_endpoint(listener.local_addr().map_err(|source| ServeError::Bind {
            addr: "<listener>".to_string(),
            source,
        })?),
    };
    let provider_name = provider.info().provider_name;
    let capabilities: Vec<String> = provider
        .capabilities()
        .iter()
        .map(|c| c.as_str().to_string())
        .collect();
    let server_stop = stop.clone();
    let server = crate::server::serve_provider(
        provider,
        listener,
        member.auth.clone(),
        member.shutdown_grace,
        async move {
            tokio::select! {
                () = shutdown => {}
                () = server_stop.cancelled() => {}
            }
            server_stop.cancel();
        },
    );
    let membership = async {
        let Some(join) = &member.join else {
            stop.cancelled().await;
            return Ok(());
        };
        let mut opts = JoinOptions::new(
            join.datacenter_addr.clone(),
            &member.state_dir,
            provider_name,
            endpoint,
        );
        opts.join_token = join.join_token.clone();
        opts.capabilities = capabilities;
        opts.info = member.info.clone();
        if join.auto_join {
            opts.auto_join = Some(member.auth.clone());
        }
        let identity = tokio::select! {
            r = join::ensure_identity(&opts) => r?,
            () = stop.cancelled() => return Ok(()),
        };
        tracing::info!(agent_id = %identity.agent_id, "member of the control plane; heartbeating");
        join::heartbeat_loop(identity, opts, stop.clone().cancelled_owned()).await?;
        Ok::<(), MemberError>(())
    };
    let membership = async {
        let r = membership.await;
        if r.is_err() {
            stop.cancel();
        }
        r
    };
    let (served, joined) = tokio::join!(server, membership);
    joined?;
    served?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_settings() {
        let dir = tempfile::tempdir().unwrap();
        let none = Settings::from_map([("CP_AUTH_SECRET", "x")]);
        assert_eq!(JoinConfig::from_settings(&none, dir.path()).unwrap(), None);
        let s = Settings::from_map([
            (config::JOIN_TOKEN, "tok"),
            (config::ADVERTISE_ADDR, "http://10.0.0.1:7401"),
        ]);
        let j = JoinConfig::from_settings(&s, dir.path()).unwrap().unwrap();
        assert_eq!(j.datacenter_addr, "http://127.0.0.1:7100");
        assert_eq!(j.join_token.as_deref(), Some("tok"));
        assert_eq!(j.advertise_addr.as_deref(), Some("http://10.0.0.1:7401"));
        assert!(!j.auto_join);
        let auto = Settings::from_map([(config::AUTO_JOIN, "true")]);
        assert!(
            JoinConfig::from_settings(&auto, dir.path())
                .unwrap()
                .unwrap()
                .auto_join
        );
        for (name, value) in [
            (config::ADVERTISE_ADDR, "10.0.0.1:7401"),
            (config::AUTO_JOIN, "yes please"),
        ] {
            let bad = Settings::from_map([(name, value)]);
            let err = JoinConfig::from_settings(&bad, dir.path())
                .unwrap_err()
                .to_string();
            assert!(err.contains(name), "{err}");
        }
    }

    #[test]
    fn advertised_endpoints_avoid_unspecified_addresses() {
        assert_eq!(
            advertised_endpoint("0.0.0.0:7401".parse().unwrap()),
            "http://127.0.0.1:7401"
        );
        assert_eq!(
            advertised_endpoint("10.1.2.3:1".parse().unwrap()),
            "http://10.1.2.3:1"
        );
    }
}
