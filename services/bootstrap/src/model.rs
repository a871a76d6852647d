//! Entities of the bootstrap service.
//!
//! A [`Workload`] row is one bootstrap service installed (or being
//! installed, or being retired) on one datacenter; its id is the instance
//! id at the agent. Several rows may share a name while a replacement is in
//! progress: the new row carries `replaces = Some(old id)`, and the old row
//! is retired only once the new one runs — never a window with neither.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;

/// Lifecycle state of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Wanted, not yet acted on.
    Pending,
    /// An agent call to install or change it is in flight (leased).
    Provisioning,
    /// Installed and running.
    Running,
    /// The last attempt failed; retried after `next_attempt_time`.
    Failed,
    /// Being removed (leased).
    Retiring,
    /// Removed (the row is deleted right after).
    Retired,
    /// A `depends_on` service is not running yet.
    Waiting,
}

impl State {
    /// Every state.
    pub const ALL: [State; 7] = [
        State::Pending,
        State::Provisioning,
        State::Running,
        State::Failed,
        State::Retiring,
        State::Retired,
        State::Waiting,
    ];

    /// Stable storage name.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Pending => "pending",
            State::Provisioning => "provisioning",
            State::Running => "running",
            State::Failed => "failed",
            State::Retiring => "retiring",
            State::Retired => "retired",
            State::Waiting => "waiting",
        }
    }

    /// Parses [`State::as_str`] output.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// States whose row holds a lease while an agent call is in flight.
    pub fn leased(self) -> bool {
        matches!(self, State::Provisioning | State::Retiring)
    }
}

impl std::fmt::Display for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a desired spec came from.
pub const SOURCE_DECLARED: &str = "declared";

/// A datacenter's lifecycle phase as bootstrap sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Everything is converged.
    Active,
    /// Paused: nothing changes.
    Maintenance,
    /// No new installs; updates and retirements go on.
    Draining,
    /// Paused: nothing changes.
    Offline,
    /// Desired set is empty; purged once no rows are left.
    Deleting,
}

impl Phase {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Active => "active",
            Phase::Maintenance => "maintenance",
            Phase::Draining => "draining",
            Phase::Offline => "offline",
            Phase::Deleting => "deleting",
        }
    }
}

/// One row of `bootstrap_workloads`.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// TypeID `bws_…`; the instance id at the agent.
    pub id: String,
    /// Datacenter it belongs to.
    pub datacenter_id: String,
    /// Tenant of the datacenter.
    pub tenant_id: String,
    /// Provider of the datacenter (to find an agent after the datacenter
    /// itself is gone).
    pub provider_name: String,
    /// Bootstrap service name.
    pub name: String,
    /// `declared` or the contributing hook's name.
    pub source: String,
    /// The rendered spec this row installs.
    pub spec: BootstrapServiceSpec,
    /// Hash of the rendered spec.
    pub spec_hash: String,
    /// Hash of the spec without the fields `Deploy` can change in place.
    pub structure_hash: String,
    /// Hash of the spec the backend is known to run (`None`: never
    /// installed successfully).
    pub applied_hash: Option<String>,
    /// Marked for retirement: set once, never cleared; the row is deleted
    /// when the agent confirms the workload is gone.
    pub retire: bool,
    /// State.
    pub state: State,
    /// Backend reference.
    pub provider_ref: String,
    /// Backend reference of each service.
    pub service_refs: BTreeMap<String, String>,
    /// Last error.
    pub last_error: String,
    /// Failed attempts since the last success.
    pub attempts: i32,
    /// Not retried before this time.
    pub next_attempt_time: Option<DateTime<Utc>>,
    /// While provisioning/retiring: the executor's lease ends here; after
    /// it, the interrupted call is retried (agent calls are idempotent).
    pub lease_expire_time: Option<DateTime<Utc>>,
    /// The row this one replaces (retired once this one runs).
    pub replaces: Option<String>,
    /// Endpoints the agent reported (read-only here: written with the
    /// provision result).
    pub endpoints: Vec<ctrlplane_proto::provider::v1::Endpoint>,
    /// Latest resource sample (read-only here: written by telemetry).
    pub usage: Option<ctrlplane_proto::provider::v1::ResourceUsage>,
    /// Creation.
    pub create_time: DateTime<Utc>,
    /// Last change.
    pub update_time: DateTime<Utc>,
}

/// A persisted bootstrap event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Strictly increasing sequence number.
    pub sequence: i64,
    /// TypeID `evt_…`.
    pub id: String,
    /// Datacenter.
    pub datacenter_id: String,
    /// Workload row (empty for datacenter-level events such as hook
    /// failures).
    pub workload_id: String,
    /// Bootstrap service name (empty for datacenter-level events).
    pub name: String,
    /// What happened: `provisioned`, `failed`, `retired`, `hook_failed`, …
    pub kind: String,
    /// State before.
    pub from_state: Option<State>,
    /// State after.
    pub to_state: Option<State>,
    /// Detail.
    pub message: String,
    /// When.
    pub create_time: DateTime<Utc>,
}

/// An event to record with a write.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// Kind.
    pub kind: String,
    /// State before.
    pub from_state: Option<State>,
    /// State after.
    pub to_state: Option<State>,
    /// Detail.
    pub message: String,
}

impl NewEvent {
    /// A transition event.
    pub fn transition(
        kind: &str,
        from: Option<State>,
        to: Option<State>,
        message: impl Into<String>,
    ) -> Self {
        NewEvent {
            kind: kind.to_string(),
            from_state: from,
            to_state: to,
            message: message.into(),
        }
    }
}

/// A registered remote hook.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteHook {
    /// Name (DNS label).
    pub name: String,
    /// gRPC endpoint of its `BootstrapHookService`.
    pub endpoint: String,
    /// Per-call timeout.
    pub timeout: std::time::Duration,
    /// Last call's error.
    pub last_error: String,
    /// Last successful call.
    pub last_success_time: Option<DateTime<Utc>>,
    /// Registration time.
    pub create_time: DateTime<Utc>,
}
