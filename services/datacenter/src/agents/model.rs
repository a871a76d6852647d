//! Entities of the agent registry.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// A registered provider agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Agent {
    /// TypeID `agt_…`.
    pub id: String,
    /// Provider it serves.
    pub provider_name: String,
    /// gRPC endpoint the control plane calls.
    pub endpoint: String,
    /// Agent software version.
    pub version: String,
    /// Advertised capabilities.
    pub capabilities: Vec<String>,
    /// Free-form info.
    pub info: BTreeMap<String, String>,
    /// Join token it joined with.
    pub join_token_id: String,
    /// Key that makes a retried join return this identity.
    pub idempotency_key: String,
    /// Revoked by an operator.
    pub revoked: bool,
    /// Last heartbeat (or the join).
    pub last_heartbeat_time: DateTime<Utc>,
    /// The lease ends here unless renewed.
    pub lease_expire_time: DateTime<Utc>,
    /// Last health probe.
    pub last_checked_at: Option<DateTime<Utc>>,
    /// Latency of the last probe.
    pub last_latency: Option<Duration>,
    /// Outcome of the last probe (`None`: never probed).
    pub probe_ok: Option<bool>,
    /// Error of the last failed probe.
    pub last_error: String,
    /// Join time.
    pub create_time: DateTime<Utc>,
    /// Last change.
    pub update_time: DateTime<Utc>,
}

/// Derived health of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Lease current and last probe (if any) succeeded.
    Healthy,
    /// Lease expired or last probe failed.
    Unhealthy,
    /// Revoked.
    Revoked,
}

impl Agent {
    /// Health at `now`.
    pub fn health(&self, now: DateTime<Utc>) -> Health {
        if self.revoked {
            Health::Revoked
        } else if self.lease_expire_time <= now || self.probe_ok == Some(false) {
            Health::Unhealthy
        } else {
            Health::Healthy
        }
    }

    /// Why the agent is not healthy, for error messages.
    pub fn unhealthy_reason(&self, now: DateTime<Utc>) -> Option<String> {
        match self.health(now) {
            Health::Healthy => None,
            Health::Revoked => Some(format!("{} is revoked", self.id)),
            Health::Unhealthy if self.lease_expire_time <= now => Some(format!(
                "{}: lease expired {}s ago (no heartbeat)",
                self.id,
                (now - self.lease_expire_time).num_seconds()
            )),
            Health::Unhealthy => Some(format!(
                "{}: last health probe failed: {}",
                self.id, self.last_error
            )),
        }
    }
}

/// A join token's stored form (the secret is only hashed).
#[derive(Debug, Clone, PartialEq)]
pub struct JoinToken {
    /// TypeID `jtk_…`.
    pub id: String,
    /// SHA-256 (hex) of the secret part.
    pub token_hash: String,
    /// Provider the token admits.
    pub provider_name: String,
    /// Expiry.
    pub expire_time: DateTime<Utc>,
    /// Allowed joins.
    pub max_uses: i32,
    /// Joins so far.
    pub uses: i32,
    /// Subject that minted it.
    pub created_by: String,
    /// Mint time.
    pub create_time: DateTime<Utc>,
}
