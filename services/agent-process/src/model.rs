//! The persisted record of one instance and pure helpers over service specs.
//!
//! An [`InstanceRecord`] is everything the agent must know to find an
//! instance's processes again after it restarts: the effective service specs
//! (as provisioned, deployed and scaled), the desired state, the progress of
//! the current run (which inits completed), and for every replica the pid and
//! kernel start time of its process group leader (the start time tells a live
//! process from a recycled pid). It is written atomically on every change by
//! [`crate::state::Store`].
//!
//! Nothing here does I/O.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use ctrlplane_proto::provider::v1 as pb;
use serde::{Deserialize, Serialize};

/// Most earlier releases kept for Rollback.
pub const MAX_RELEASES: usize = 10;

/// Release id of the specs given at Provision.
pub const INITIAL_RELEASE: &str = "initial";

/// What the operator last asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Desired {
    /// Provisioned, started or restarted: keep the services running.
    Running,
    /// Stopped: nothing may run.
    Stopped,
}

/// A process group the agent started: the leader's pid (= the pgid) and its
/// start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcRef {
    /// Pid of the leader, which is also the process group id.
    pub pid: i32,
    /// Kernel start time of the leader, to detect pid reuse.
    pub start_ticks: u64,
    /// Wall-clock start, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
}

/// A host port handed to one replica for one declared port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortAlloc {
    /// The declared (container) port.
    pub container: i32,
    /// The host port the process must listen on.
    pub host: i32,
    /// `PortProtocol` value.
    pub protocol: i32,
    /// The port's name, if declared.
    pub name: String,
}

/// Persisted facts about one replica of a main or sidecar service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    /// The current process group, if one was started.
    pub proc: Option<ProcRef>,
    /// Automatic restarts after the process ended.
    pub restarts: u32,
    /// How the previous process ended, for status messages.
    pub last_exit: Option<String>,
}

/// Progress of the current run (from Provision, Start or Restart of the
/// whole instance).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunRecord {
    /// When the run began, milliseconds since the Unix epoch.
    pub started_at_ms: i64,
    /// Exit codes of the inits that finished.
    pub inits: BTreeMap<String, i32>,
    /// The init currently running.
    pub init_proc: Option<(String, ProcRef)>,
    /// Every init completed: main and sidecars may run.
    pub inits_done: bool,
    /// Why the run failed (a failed init).
    pub failure: Option<String>,
}

/// An earlier release, kept for Rollback.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Release {
    /// The caller's release id.
    pub id: String,
    /// The specs of that release.
    pub services: Vec<pb::ServiceSpec>,
}

/// Everything persisted about one instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceRecord {
    /// The instance id.
    pub instance_id: String,
    /// Owning tenant ("" for platform-shared).
    pub tenant_id: String,
    /// Human-readable name.
    pub name: String,
    /// `WorkloadKind` value.
    pub kind: i32,
    /// The request's labels.
    pub labels: BTreeMap<String, String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// The effective specs (after deploys and scaling).
    pub services: Vec<pb::ServiceSpec>,
    /// What should be running.
    pub desired: Desired,
    /// Deprovision began; finish it.
    #[serde(default)]
    pub deleting: bool,
    /// The current run.
    pub run: RunRecord,
    /// Replicas of main and sidecar services by [`ReplicaKey`] text.
    pub replicas: BTreeMap<String, ReplicaRecord>,
    /// Host ports by [`ReplicaKey`] text.
    pub ports: BTreeMap<String, Vec<PortAlloc>>,
    /// The current release id.
    pub release: String,
    /// Earlier releases, oldest first.
    pub releases: Vec<Release>,
}

impl InstanceRecord {
    /// The spec of a service.
    pub fn service(&self, name: &str) -> Option<&pb::ServiceSpec> {
        self.services.iter().find(|s| s.name == name)
    }

    /// Whether this is a stateful set (volumes per replica).
    pub fn stateful(&self) -> bool {
        self.kind == pb::WorkloadKind::StatefulSet as i32
    }

    /// The record of a replica, created empty when missing.
    pub fn replica_mut(&mut self, key: &ReplicaKey) -> &mut ReplicaRecord {
        self.replicas.entry(key.to_string()).or_default()
    }

    /// Every process group the record knows of (inits and replicas).
    pub fn procs(&self) -> Vec<ProcRef> {
        let mut out: Vec<ProcRef> = self.replicas.values().filter_map(|r| r.proc).collect();
        if let Some((_, p)) = &self.run.init_proc {
            out.push(*p);
        }
        out
    }

    /// Labels for ListManaged: the request's plus the instance and tenant.
    pub fn managed_labels(&self) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = self
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        labels.insert(
            "ctrlplane.io/instance".to_string(),
            self.instance_id.clone(),
        );
        labels.insert("ctrlplane.io/tenant".to_string(), self.tenant_id.clone());
        labels
    }
}

/// One replica of one service.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaKey {
    /// Service name.
    pub service: String,
    /// Replica index from 0.
    pub replica: u32,
}

impl ReplicaKey {
    /// A key.
    pub fn new(service: impl Into<String>, replica: u32) -> Self {
        ReplicaKey {
            service: service.into(),
            replica,
        }
    }

    /// Parses `service/replica`.
    pub fn parse(s: &str) -> Option<Self> {
        let (service, replica) = s.rsplit_once('/')?;
        Some(ReplicaKey::new(service, replica.parse().ok()?))
    }

    /// File-name stem used for logs and pipes: `service-replica`.
    pub fn stem(&self) -> String {
        format!("{}-{}", self.service, self.replica)
    }
}

impl fmt::Display for ReplicaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.service, self.replica)
    }
}

pub use ctrlplane_agent::workload::{Role, dependency_order, replicas, role};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A protobuf timestamp from milliseconds since the Unix epoch.
pub fn timestamp(ms: i64) -> ctrlplane_proto::pbjson_types::Timestamp {
    ctrlplane_proto::pbjson_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, role: pb::ServiceRole, deps: &[&str]) -> pb::ServiceSpec {
        pb::ServiceSpec {
            name: name.to_string(),
            role: role as i32,
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn dependency_order_puts_dependencies_first_and_keeps_list_order() {
        let specs = vec![
            spec("side", pb::ServiceRole::Sidecar, &["main"]),
            spec("b", pb::ServiceRole::Init, &["a"]),
            spec("main", pb::ServiceRole::Unspecified, &[]),
            spec("a", pb::ServiceRole::Init, &[]),
            spec("other", pb::ServiceRole::Sidecar, &[]),
        ];
        let names = |idx: Vec<usize>| -> Vec<&str> {
            idx.into_iter().map(|i| specs[i].name.as_str()).collect()
        };
        assert_eq!(
            names(dependency_order(&specs, |s| role(s) == Role::Init)),
            ["a", "b"]
        );
        assert_eq!(
            names(dependency_order(&specs, |s| role(s) != Role::Init)),
            ["main", "side", "other"]
        );
    }

    #[test]
    fn replica_keys_round_trip() {
        let k = ReplicaKey::new("web-1", 3);
        assert_eq!(k.to_string(), "web-1/3");
        assert_eq!(ReplicaKey::parse("web-1/3"), Some(k.clone()));
        assert_eq!(k.stem(), "web-1-3");
        assert_eq!(ReplicaKey::parse("nope"), None);
    }

    #[test]
    fn replicas_default_to_one_and_inits_run_once() {
        let mut s = spec("m", pb::ServiceRole::Main, &[]);
        assert_eq!(replicas(&s), 1);
        s.resources = Some(pb::ResourceSpec {
            replicas: 3,
            ..Default::default()
        });
        assert_eq!(replicas(&s), 3);
        s.role = pb::ServiceRole::Init as i32;
        assert_eq!(replicas(&s), 1);
    }

    #[test]
    fn timestamps_split_milliseconds() {
        let t = timestamp(1_500);
        assert_eq!((t.seconds, t.nanos), (1, 500_000_000));
    }
}
