//! The agent registry's operations.
//!
//! Join flow (server side): a join token (`jtk_….<secret>`, stored only as
//! a SHA-256 of the secret) admits up to `max_uses` agents of one provider
//! until it expires. `join` checks the token, consumes a use atomically,
//! registers the agent and returns a credential: a bearer token with role
//! `system:agent` bound to the agent id. A retry carrying the same
//! idempotency key returns the same identity without using the token again.
//! Agents renew a lease by heartbeat; an agent past its lease, or whose last
//! health probe failed, is unhealthy and is never resolved to.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use chrono::{DateTime, Utc};
use ctrlplane_core::{Violations, id, page, validate};
use ctrlplane_runtime::auth::{Authenticator, Caller, Claims, ROLE_AGENT};
use rand::RngCore;
use sha2::{Digest, Sha256};

use super::model::{Agent, Health, JoinToken};
use super::store::{AgentStore, RegisterError};
use crate::error::{Error, Result};
use crate::store::Store;

/// A source of the current time (injectable for tests).
pub type Clock = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// Registry settings.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// Interval agents are told to heartbeat at.
    pub heartbeat_interval: Duration,
    /// Lease granted by a heartbeat (a few intervals).
    pub lease_ttl: Duration,
    /// Lifetime of agent credentials.
    pub credential_ttl: Duration,
    /// A heartbeat returns a fresh credential when less than this is left.
    pub credential_refresh: Duration,
    /// Timeout of one health probe.
    pub probe_timeout: Duration,
    /// Join tokens: default and largest ttl.
    pub token_ttl: (Duration, Duration),
}

impl Default for RegistryConfig {
    fn default() -> Self {
        RegistryConfig {
            heartbeat_interval: Duration::from_secs(10),
            lease_ttl: Duration::from_secs(30),
            credential_ttl: Duration::from_secs(30 * 24 * 3600),
            credential_refresh: Duration::from_secs(7 * 24 * 3600),
            probe_timeout: Duration::from_secs(5),
            token_ttl: (
                Duration::from_secs(3600),
                Duration::from_secs(30 * 24 * 3600),
            ),
        }
    }
}

/// Largest `max_uses` of a join token.
pub const MAX_TOKEN_USES: i32 = 10_000;
/// Default and largest page of `ListAgents`.
pub const AGENTS_PAGE: (u32, u32) = (100, 1000);

/// What an agent sends to join.
#[derive(Debug, Clone, Default)]
pub struct JoinInput {
    /// The join token.
    pub token: String,
    /// Provider it serves.
    pub provider_name: String,
    /// Its gRPC endpoint.
    pub endpoint: String,
    /// Its version.
    pub version: String,
    /// Free-form info.
    pub info: BTreeMap<String, String>,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
    /// Retry key.
    pub idempotency_key: String,
}

/// A successful join.
#[derive(Debug, Clone)]
pub struct Joined {
    /// The registered agent.
    pub agent: Agent,
    /// Its credential.
    pub credential: String,
    /// Heartbeat interval to use.
    pub heartbeat_interval: Duration,
}

/// The agent registry.
#[derive(Clone)]
pub struct AgentRegistry {
    store: AgentStore,
    datacenters: Store,
    auth: Arc<Authenticator>,
    config: RegistryConfig,
    clock: Clock,
}

impl std::fmt::Debug for AgentRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRegistry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn hash_secret(secret: &str) -> String {
    let digest = Sha256::digest(secret.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Constant-time comparison of two hex digests.
fn same_digest(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn denied(msg: impl Into<String>) -> Error {
    Error::PermissionDenied(msg.into())
}

fn check_endpoint(v: &mut Violations, field: &str, endpoint: &str) {
    let ok = endpoint
        .parse::<tonic::codegen::http::Uri>()
        .ok()
        .is_some_and(|u| {
            matches!(u.scheme_str(), Some("http" | "https"))
                && u.authority().is_some_and(|a| a.port_u16().is_some())
        });
    if !ok {
        v.add(
            field,
            "must be an http(s) URL with host and port, e.g. http://10.0.0.5:7401",
        );
    }
}

fn check_capabilities(v: &mut Violations, field: &str, caps: &[String]) {
    if caps.len() > 32 {
        v.add(field, "at most 32 capabilities");
    }
    for (i, c) in caps.iter().enumerate() {
        if c.is_empty()
            || c.len() > 64
            || !c
                .chars()
                .all(|ch| ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-' || ch == ':')
        {
            v.add(
                format!("{field}[{i}]"),
                "must be 1-64 characters of a-z, 0-9, '-' and ':'",
            );
        }
    }
}

impl AgentRegistry {
    /// A registry over `store`; `datacenters` is stamped by health checks.
    pub fn new(
        store: AgentStore,
        datacenters: Store,
        auth: Arc<Authenticator>,
        config: RegistryConfig,
        clock: Clock,
    ) -> Self {
        AgentRegistry {
            store,
            datacenters,
            auth,
            config,
            clock,
        }
    }

    /// The registry's settings.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    /// The registry's current time.
    pub fn now(&self) -> DateTime<Utc> {
        (self.clock)()
    }

    fn require_admin(caller: &Caller) -> Result<()> {
        if caller.is_admin() {
            Ok(())
        } else {
            Err(denied("this call needs a system:admin token"))
        }
    }

    fn require_platform(caller: &Caller) -> Result<()> {
        if caller.is_system() {
            Ok(())
        } else {
            Err(denied(
                "this call needs a system:admin or system:service token",
            ))
        }
    }

    fn credential(&self, agent_id: &str) -> (String, u64) {
        let mut claims = Claims::new(
            agent_id,
            "",
            vec![ROLE_AGENT.to_string()],
            self.config.credential_ttl,
        );
        claims.agent_id = Some(agent_id.to_string());
        let exp = claims.exp;
        (self.auth.mint(&claims), exp)
    }

    /// Mints a join token. Returns its metadata and the secret token, which
    /// is never stored or shown again.
    ///
    /// # Errors
    /// `PermissionDenied` for non-admins, `InvalidArgument`.
    pub async fn create_join_token(
        &self,
        caller: &Caller,
        provider_name: &str,
        ttl: Option<Duration>,
        max_uses: i32,
    ) -> Result<(JoinToken, String)> {
        Self::require_admin(caller)?;
        let mut v = Violations::new();
        validate::dns_label(&mut v, "provider_name", provider_name);
        let (default_ttl, max_ttl) = self.config.token_ttl;
        let ttl = ttl.unwrap_or(default_ttl);
        if ttl.is_zero() || ttl > max_ttl {
            v.add(
                "ttl",
                format!("must be between 1s and {}s", max_ttl.as_secs()),
            );
        }
        if !(0..=MAX_TOKEN_USES).contains(&max_uses) {
            v.add(
                "max_uses",
                format!("must be between 1 and {MAX_TOKEN_USES} (0 = 1)"),
            );
        }
        v.into_result()?;
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
        let now = self.now();
        let token = JoinToken {
            id: id::new_id(id::JOIN_TOKEN),
            token_hash: hash_secret(&secret),
            provider_name: provider_name.to_string(),
            expire_time: now
                + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::hours(1)),
            max_uses: max_uses.max(1),
            uses: 0,
            created_by: caller.subject().to_string(),
            create_time: now,
        };
        self.store.insert_token(&token).await?;
        let plain = format!("{}.{}", token.id, secret);
        tracing::info!(token = %token.id, provider = %token.provider_name, max_uses = token.max_uses, "join token created");
        Ok((token, plain))
    }

    /// Registers an agent with a join token (or returns the identity an
    /// earlier attempt with the same idempotency key got).
    ///
    /// # Errors
    /// `InvalidArgument`; `Unauthenticated`-like refusals are reported as
    /// [`Error::Unauthenticated`] (unknown, forged or expired token) and
    /// `PermissionDenied` (wrong provider, no uses left).
    pub async fn join(&self, input: JoinInput) -> Result<Joined> {
        let mut v = Violations::new();
        if input.token.is_empty() {
            v.add("token", "is required");
        }
        validate::dns_label(&mut v, "provider_name", &input.provider_name);
        check_endpoint(&mut v, "endpoint", &input.endpoint);
        if input.version.len() > 64 {
            v.add("version", "must be at most 64 characters");
        }
        validate::metadata(&mut v, "info", &input.info.clone().into_iter().collect());
        check_capabilities(&mut v, "capabilities", &input.capabilities);
        if input.idempotency_key.len() > 128 {
            v.add("idempotency_key", "must be at most 128 characters");
        }
        v.into_result()?;

        let invalid = || Error::Unauthenticated("invalid join token".into());
        let (token_id, secret) = input.token.split_once('.').ok_or_else(invalid)?;
        if id::parse_id(id::JOIN_TOKEN, token_id).is_err() {
            return Err(invalid());
        }
        let token = self.store.get_token(token_id).await?.ok_or_else(invalid)?;
        if !same_digest(&token.token_hash, &hash_secret(secret)) {
            return Err(invalid());
        }

        loop {
            if !input.idempotency_key.is_empty()
                && let Some(agent) = self
                    .store
                    .find_by_join_key(&token.id, &input.idempotency_key)
                    .await?
            {
                if agent.revoked {
                    return Err(Error::Unauthenticated(format!(
                        "agent {} was revoked",
                        agent.id
                    )));
                }
                if agent.provider_name != input.provider_name {
                    return Err(denied(format!(
                        "this join was made for provider {:?}, not {:?}",
                        agent.provider_name, input.provider_name
                    )));
                }
                tracing::info!(agent = %agent.id, "join retried; returning the same identity");
                let (credential, _) = self.credential(&agent.id);
                return Ok(Joined {
                    agent,
                    credential,
                    heartbeat_interval: self.config.heartbeat_interval,
                });
            }
            if token.provider_name != input.provider_name {
                return Err(denied(format!(
                    "join token {} is for provider {:?}, not {:?}",
                    token.id, token.provider_name, input.provider_name
                )));
            }
            let now = self.now();
            let agent = Agent {
                id: id::new_id(id::AGENT),
                provider_name: input.provider_name.clone(),
                endpoint: input.endpoint.clone(),
                version: input.version.clone(),
                capabilities: input.capabilities.clone(),
                info: input.info.clone(),
                join_token_id: token.id.clone(),
                idempotency_key: if input.idempotency_key.is_empty() {
                    // No retry key: make the key unique so the index never
                    // matches another agent.
                    id::new_id("nokey")
                } else {
                    input.idempotency_key.clone()
                },
                revoked: false,
                last_heartbeat_time: now,
                lease_expire_time: now
                    + chrono::Duration::from_std(self.config.lease_ttl).unwrap_or_default(),
                last_checked_at: None,
                last_latency: None,
                probe_ok: None,
                last_error: String::new(),
                create_time: now,
                update_time: now,
            };
            match self
                .store
                .consume_and_register(&token.id, now, &agent)
                .await
            {
                Ok(()) => {
                    tracing::info!(agent = %agent.id, provider = %agent.provider_name, endpoint = %agent.endpoint, "agent joined");
                    let (credential, _) = self.credential(&agent.id);
                    return Ok(Joined {
                        agent,
                        credential,
                        heartbeat_interval: self.config.heartbeat_interval,
                    });
                }
                // A concurrent retry with the same key registered first:
                // loop to return its identity.
                Err(RegisterError::DuplicateKey) => continue,
                // The token's last use went to a concurrent retry with the
                // same key, which has committed by now: return its identity.
                Err(RegisterError::TokenUnusable)
                    if !input.idempotency_key.is_empty()
                        && self
                            .store
                            .find_by_join_key(&token.id, &input.idempotency_key)
                            .await?
                            .is_some() =>
                {
                    continue;
                }
                Err(RegisterError::TokenUnusable) => {
                    let current = self.store.get_token(&token.id).await?.ok_or_else(invalid)?;
                    return Err(if current.expire_time <= now {
                        Error::Unauthenticated(format!(
                            "join token {} expired at {}",
                            current.id,
                            current.expire_time.to_rfc3339()
                        ))
                    } else {
                        denied(format!(
                            "join token {} has no uses left ({} of {} used)",
                            current.id, current.uses, current.max_uses
                        ))
                    });
                }
                Err(RegisterError::Other(e)) => return Err(e),
            }
        }
    }

    async fn calling_agent(&self, caller: &Caller, agent_id: &str) -> Result<Agent> {
        let bound = caller.claims.agent_id.as_deref();
        if !caller.is_agent() || bound != Some(agent_id) {
            return Err(denied(
                "Heartbeat needs the credential of the agent named in agent_id",
            ));
        }
        let agent =
            self.store.get(agent_id).await?.ok_or_else(|| {
                Error::Unauthenticated(format!("agent {agent_id} is not registered"))
            })?;
        if agent.revoked {
            return Err(Error::Unauthenticated(format!(
                "agent {agent_id} was revoked"
            )));
        }
        Ok(agent)
    }

    /// Renews the calling agent's lease; returns the agent, the interval and
    /// a fresh credential when the current one nears expiry.
    ///
    /// # Errors
    /// `Unauthenticated` for revoked or unknown agents, `PermissionDenied`
    /// for other callers, `InvalidArgument`.
    pub async fn heartbeat(
        &self,
        caller: &Caller,
        agent_id: &str,
        endpoint: &str,
        capabilities: &[String],
    ) -> Result<(Agent, Option<String>)> {
        let mut v = Violations::new();
        if !endpoint.is_empty() {
            check_endpoint(&mut v, "endpoint", endpoint);
        }
        check_capabilities(&mut v, "capabilities", capabilities);
        v.into_result()?;
        let mut agent = self.calling_agent(caller, agent_id).await?;
        let now = self.now();
        agent.last_heartbeat_time = now;
        agent.lease_expire_time =
            now + chrono::Duration::from_std(self.config.lease_ttl).unwrap_or_default();
        if !endpoint.is_empty() {
            agent.endpoint = endpoint.to_string();
        }
        if !capabilities.is_empty() {
            agent.capabilities = capabilities.to_vec();
        }
        agent.update_time = now;
        self.store.save(&agent).await?;
        let left = caller
            .claims
            .exp
            .saturating_sub(now.timestamp().max(0) as u64);
        let fresh =
            (left < self.config.credential_refresh.as_secs()).then(|| self.credential(&agent.id).0);
        Ok((agent, fresh))
    }

    /// A page of agents (platform callers).
    ///
    /// # Errors
    /// `PermissionDenied`, `InvalidArgument`.
    pub async fn list(
        &self,
        caller: &Caller,
        provider: &str,
        page_size: i32,
        page_token: &str,
    ) -> Result<(Vec<Agent>, Option<String>)> {
        Self::require_platform(caller)?;
        let mut v = Violations::new();
        let size = page::page_size(page_size, AGENTS_PAGE.0, AGENTS_PAGE.1)
            .map_err(|e| v.add("page_size", e))
            .unwrap_or(AGENTS_PAGE.0);
        let fp = page::fingerprint(&[provider]);
        let after: Option<String> = page::decode_bound(
            &mut v,
            "page_token",
            page_token,
            &fp,
            "was issued for a request with other filters",
        );
        v.into_result()?;
        let provider = Some(provider).filter(|p| !p.is_empty());
        let mut agents = self
            .store
            .list(provider, true, after.as_deref(), u64::from(size) + 1)
            .await?;
        let more = agents.len() > size as usize;
        agents.truncate(size as usize);
        let next = match agents.last() {
            Some(last) if more => Some(page::encode_bound(last.id.clone(), &fp)),
            _ => None,
        };
        Ok((agents, next))
    }

    /// One agent (platform callers).
    ///
    /// # Errors
    /// `PermissionDenied`, `InvalidArgument`, `NotFound`.
    pub async fn get(&self, caller: &Caller, agent_id: &str) -> Result<Agent> {
        Self::require_platform(caller)?;
        let mut v = Violations::new();
        id::check_id(&mut v, "id", id::AGENT, agent_id);
        v.into_result()?;
        self.store
            .get(agent_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("agent {agent_id} not found")))
    }

    /// Revokes an agent; its credential stops working at once. Revoking a
    /// revoked agent changes nothing.
    ///
    /// # Errors
    /// As [`AgentRegistry::get`].
    pub async fn revoke(&self, caller: &Caller, agent_id: &str) -> Result<Agent> {
        Self::require_admin(caller)?;
        let mut agent = self.get(caller, agent_id).await?;
        if !agent.revoked {
            agent.revoked = true;
            agent.update_time = self.now();
            self.store.save(&agent).await?;
            tracing::warn!(agent = %agent.id, by = %caller.subject(), "agent revoked");
        }
        Ok(agent)
    }

    /// Probes every unrevoked agent's `CheckHealth` now (bounded
    /// concurrency), records health and latency, and stamps
    /// `last_checked_at` on the datacenters of providers with a healthy
    /// agent.
    ///
    /// # Errors
    /// `PermissionDenied` for non-platform callers; database failures.
    pub async fn check_agents(&self, caller: &Caller) -> Result<Vec<Agent>> {
        if !caller.is_system() {
            return Err(denied(
                "CheckAgents needs a system:admin or system:service token",
            ));
        }
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let batch = self.store.list(None, false, after.as_deref(), 500).await?;
            let done = batch.len() < 500;
            after = batch.last().map(|a| a.id.clone());
            all.extend(batch);
            if done {
                break;
            }
        }
        use futures::StreamExt;
        let probed: Vec<Agent> = futures::stream::iter(all)
            .map(|agent| self.probe(agent))
            .buffer_unordered(16)
            .collect()
            .await;
        let mut healthy_providers = std::collections::BTreeSet::new();
        let now = self.now();
        for agent in &probed {
            self.store.save(agent).await?;
            if agent.health(now) == Health::Healthy {
                healthy_providers.insert(agent.provider_name.clone());
            }
        }
        for provider in healthy_providers {
            self.datacenters.touch_checked(&provider, now).await?;
        }
        Ok(probed)
    }

    async fn probe(&self, mut agent: Agent) -> Agent {
        let started = std::time::Instant::now();
        let outcome = match ctrlplane_agent::client::provider_client(
            &agent.endpoint,
            self.auth.clone(),
            "datacenter",
        ) {
            Err(e) => Err(e.to_string()),
            Ok(mut client) => {
                let mut req =
                    tonic::Request::new(ctrlplane_proto::provider::v1::CheckHealthRequest {});
                req.set_timeout(self.config.probe_timeout);
                match tokio::time::timeout(self.config.probe_timeout, client.check_health(req))
                    .await
                {
                    Err(_) => Err(format!("no answer within {:?}", self.config.probe_timeout)),
                    Ok(Err(s)) => Err(format!("{:?}: {}", s.code(), s.message())),
                    Ok(Ok(r)) if r.get_ref().healthy => Ok(()),
                    Ok(Ok(r)) => Err(format!("agent reports unhealthy: {}", r.get_ref().message)),
                }
            }
        };
        let now = self.now();
        agent.last_checked_at = Some(now);
        agent.last_latency = Some(started.elapsed());
        agent.update_time = now;
        match outcome {
            Ok(()) => {
                agent.probe_ok = Some(true);
                agent.last_error.clear();
            }
            Err(e) => {
                tracing::warn!(agent = %agent.id, error = %e, "agent health probe failed");
                agent.probe_ok = Some(false);
                agent.last_error = e;
            }
        }
        agent
    }

    /// Fails unless an unrevoked agent has joined for `provider`.
    ///
    /// # Errors
    /// `FailedPrecondition` naming the provider.
    pub async fn require_registered(&self, field_provider: &str) -> Result<()> {
        if self.store.has_agent(field_provider).await? {
            Ok(())
        } else {
            Err(Error::FailedPrecondition(format!(
                "no agent has registered for provider {field_provider:?}: start one with a join token (CreateJoinToken) before creating datacenters on it"
            )))
        }
    }

    /// A healthy agent for `provider`: the one with the latest heartbeat.
    ///
    /// # Errors
    /// `Unavailable` saying why none qualifies.
    pub async fn resolve(&self, provider: &str) -> Result<Agent> {
        let agents = self.store.list(Some(provider), false, None, 1000).await?;
        let now = self.now();
        if agents.is_empty() {
            return Err(Error::Unavailable(format!(
                "no agent has joined for provider {provider:?}"
            )));
        }
        let best = agents
            .iter()
            .filter(|a| a.health(now) == Health::Healthy)
            .max_by_key(|a| a.last_heartbeat_time);
        match best {
            Some(a) => Ok(a.clone()),
            None => {
                let reasons: Vec<String> = agents
                    .iter()
                    .filter_map(|a| a.unhealthy_reason(now))
                    .collect();
                Err(Error::Unavailable(format!(
                    "no healthy agent for provider {provider:?} ({} registered): {}",
                    agents.len(),
                    reasons.join("; ")
                )))
            }
        }
    }
}
