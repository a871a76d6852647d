//! What the engine says an instance is: its containers (read back from
//! their labels and inspect data) and the status computed from them.
//!
//! Status rules:
//! - a replica's state comes from its container: `created` → STARTING
//!   (not started yet), `running` → RUNNING, `restarting` → STARTING with
//!   the restart count, `exited` → for inits STOPPED with exit code 0 and
//!   FAILED otherwise; for mains and sidecars STOPPED (they restart
//!   `unless-stopped`, so only a Stop leaves them exited), `dead` → FAILED;
//! - a service is the worst of its replicas (FAILED > STARTING > STOPPED >
//!   RUNNING); a failed init makes the instance FAILED with a message naming
//!   it; otherwise the instance is the worst of its mains and sidecars;
//! - ready: running and passing its health check (the engine's for COMMAND
//!   checks, the agent's probe for HTTP/TCP, none: running); the instance is
//!   ready when it is RUNNING and every main and sidecar replica is ready.

use std::collections::{BTreeMap, HashMap};

use bollard::models::{ContainerInspectResponse, ContainerStateStatusEnum, HealthStatusEnum};
use chrono::{DateTime, Utc};
use ctrlplane_agent::workload::{Role, dependency_order, role};
use ctrlplane_proto::pbjson_types::Timestamp;
use ctrlplane_proto::provider::v1 as pb;

use crate::names;
use crate::spec::{self, Check, Meta};

/// One container of an instance.
#[derive(Debug, Clone)]
pub struct Container {
    /// Container name (no leading `/`).
    pub name: String,
    /// Service name.
    pub service: String,
    /// Replica index.
    pub replica: u32,
    /// A previous generation (kept after a Deploy).
    pub prev: bool,
    /// The spec it was created from.
    pub spec: pb::ServiceSpec,
    /// Hash of that spec.
    pub hash: String,
    /// Release label.
    pub release: String,
    /// Inspect data.
    pub inspect: ContainerInspectResponse,
}

impl Container {
    /// Reads a container back from its inspect data; `None` for a
    /// container without our labels.
    pub fn from_inspect(inspect: ContainerInspectResponse) -> Option<Self> {
        let labels = inspect.config.as_ref()?.labels.clone()?;
        let name = inspect
            .name
            .clone()
            .unwrap_or_default()
            .trim_start_matches('/')
            .to_string();
        Some(Container {
            prev: names::is_prev(&name),
            service: labels.get(names::SERVICE)?.clone(),
            replica: labels.get(names::REPLICA)?.parse().ok()?,
            spec: spec::parse_spec(labels.get(names::SPEC)?)?,
            hash: labels.get(names::SPEC_HASH).cloned().unwrap_or_default(),
            release: labels.get(names::RELEASE).cloned().unwrap_or_default(),
            name,
            inspect,
        })
    }

    /// The engine's state.
    pub fn status(&self) -> ContainerStateStatusEnum {
        self.inspect
            .state
            .as_ref()
            .and_then(|s| s.status)
            .unwrap_or(ContainerStateStatusEnum::EMPTY)
    }

    /// Whether it runs.
    pub fn running(&self) -> bool {
        self.status() == ContainerStateStatusEnum::RUNNING
    }

    /// Exit code of the last run.
    pub fn exit_code(&self) -> i64 {
        self.inspect
            .state
            .as_ref()
            .and_then(|s| s.exit_code)
            .unwrap_or(0)
    }

    /// Automatic restarts by the engine.
    pub fn restarts(&self) -> i64 {
        self.inspect.restart_count.unwrap_or(0)
    }

    /// When the current run started (`None` before the first start).
    pub fn started_at(&self) -> Option<DateTime<Utc>> {
        parse_time(self.inspect.state.as_ref()?.started_at.as_deref()?)
    }

    /// When the container was created.
    pub fn created_at(&self) -> Option<DateTime<Utc>> {
        parse_time(self.inspect.created.as_deref()?)
    }

    /// The engine's health status (COMMAND checks).
    pub fn health(&self) -> Option<HealthStatusEnum> {
        self.inspect.state.as_ref()?.health.as_ref()?.status
    }

    /// The container's address in `network`.
    pub fn ip(&self, network: &str) -> Option<String> {
        let ip = self
            .inspect
            .network_settings
            .as_ref()?
            .networks
            .as_ref()?
            .get(network)?
            .ip_address
            .clone()?;
        (!ip.is_empty()).then_some(ip)
    }

    /// The published host port of a declared port.
    pub fn host_port(&self, p: &pb::PortSpec) -> Option<i32> {
        let ports = self.inspect.network_settings.as_ref()?.ports.as_ref()?;
        let bindings = ports.get(&spec::port_key(p))?.as_ref()?;
        bindings
            .iter()
            .filter_map(|b| b.host_port.as_deref()?.parse().ok())
            .next()
    }
}

/// Parses an engine time; the zero time means "never".
pub fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    let t = DateTime::parse_from_rfc3339(s).ok()?.with_timezone(&Utc);
    (t.timestamp() > 0).then_some(t)
}

/// A proto timestamp.
pub fn timestamp(t: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

/// An instance as the engine has it.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Instance id.
    pub id: String,
    /// Its network, if it exists.
    pub network: Option<String>,
    /// Meta read from the network (or a container).
    pub meta: Meta,
    /// Every container, current and previous generations.
    pub containers: Vec<Container>,
}

impl Instance {
    /// Current-generation containers.
    pub fn current(&self) -> impl Iterator<Item = &Container> {
        self.containers.iter().filter(|c| !c.prev)
    }

    /// Current containers of a service, by replica.
    pub fn replicas(&self, service: &str) -> Vec<&Container> {
        let mut v: Vec<&Container> = self.current().filter(|c| c.service == service).collect();
        v.sort_by_key(|c| c.replica);
        v
    }

    /// The services' specs (from their replica with the lowest index), in
    /// dependency order.
    pub fn specs(&self) -> Vec<pb::ServiceSpec> {
        let mut by_name: BTreeMap<&str, &Container> = BTreeMap::new();
        for c in self.current() {
            let e = by_name.entry(c.service.as_str()).or_insert(c);
            if c.replica < e.replica {
                *e = c;
            }
        }
        let specs: Vec<pb::ServiceSpec> = by_name.values().map(|c| c.spec.clone()).collect();
        dependency_order(&specs, |_| true)
            .into_iter()
            .map(|i| specs[i].clone())
            .collect()
    }

    /// The release the newest current container belongs to.
    pub fn release(&self) -> String {
        self.current()
            .max_by_key(|c| c.created_at())
            .map(|c| c.release.clone())
            .unwrap_or_else(|| names::INITIAL_RELEASE.to_string())
    }
}

fn rank(s: pb::InstanceState) -> u8 {
    match s {
        pb::InstanceState::Failed => 4,
        pb::InstanceState::Starting | pb::InstanceState::Provisioning => 3,
        pb::InstanceState::Stopping => 2,
        pb::InstanceState::Stopped => 1,
        _ => 0,
    }
}

/// The worse of two states.
pub fn worst(a: pb::InstanceState, b: pb::InstanceState) -> pb::InstanceState {
    if rank(b) > rank(a) { b } else { a }
}

/// State and message of one replica.
pub fn replica_state(c: &Container) -> (pb::InstanceState, String) {
    use pb::InstanceState as S;
    let is_init = role(&c.spec) == Role::Init;
    match c.status() {
        ContainerStateStatusEnum::CREATED => (S::Starting, "not started yet".to_string()),
        ContainerStateStatusEnum::RUNNING | ContainerStateStatusEnum::PAUSED => {
            (S::Running, String::new())
        }
        ContainerStateStatusEnum::RESTARTING => (
            S::Starting,
            format!(
                "restarting after exiting with code {} ({} restarts)",
                c.exit_code(),
                c.restarts()
            ),
        ),
        ContainerStateStatusEnum::EXITED if is_init && c.exit_code() != 0 => (
            S::Failed,
            format!("init exited with code {}", c.exit_code()),
        ),
        ContainerStateStatusEnum::EXITED => (S::Stopped, String::new()),
        ContainerStateStatusEnum::REMOVING => (S::Stopping, "being removed".to_string()),
        ContainerStateStatusEnum::STOPPING => (S::Stopping, String::new()),
        ContainerStateStatusEnum::DEAD => (S::Failed, "the container is dead".to_string()),
        ContainerStateStatusEnum::EMPTY => (S::Starting, String::new()),
    }
}

/// Readiness inputs the status needs from outside (agent probes).
pub type Probes = HashMap<String, bool>;

/// Whether a running replica passes its health check, given the agent's
/// probe results (by container name) for HTTP/TCP checks.
pub fn replica_ready(c: &Container, probes: &Probes) -> bool {
    if !c.running() {
        return false;
    }
    match spec::check(&c.spec) {
        Check::None => true,
        Check::Command => c.health() == Some(HealthStatusEnum::HEALTHY),
        Check::Http { .. } | Check::Tcp { .. } => probes.get(&c.name).copied().unwrap_or(false),
    }
}

/// The instance status.
pub fn status(inst: &Instance, endpoint_host: &str, probes: &Probes) -> pb::InstanceStatus {
    use pb::InstanceState as S;
    let mut services = HashMap::new();
    let mut state = S::Running;
    let mut any_long_running = false;
    let mut ready = true;
    let mut restarts = 0i64;
    let mut started_at: Option<DateTime<Utc>> = None;
    let mut failed_init: Option<String> = None;
    let mut endpoints = Vec::new();
    for spec in inst.specs() {
        let reps = inst.replicas(&spec.name);
        let is_init = role(&spec) == Role::Init;
        let mut s_state = S::Running;
        let mut s_message = String::new();
        let mut s_ready = 0;
        let mut s_restarts = 0i64;
        let mut exit_code = 0i64;
        for c in &reps {
            let (st, msg) = replica_state(c);
            if rank(st) > rank(s_state) || s_message.is_empty() && !msg.is_empty() {
                s_message = msg;
            }
            s_state = worst(s_state, st);
            exit_code = c.exit_code();
            s_restarts += c.restarts();
            let r = replica_ready(c, probes);
            if r {
                s_ready += 1;
            }
            if !is_init {
                ready &= r;
                if c.running() {
                    started_at = started_at.max(c.started_at());
                }
                for p in &c.spec.ports {
                    if let (true, Some(port)) = (c.running(), c.host_port(p)) {
                        endpoints.push(pb::Endpoint {
                            service_name: spec.name.clone(),
                            port_name: if p.name.is_empty() {
                                p.container.to_string()
                            } else {
                                p.name.clone()
                            },
                            protocol: p.protocol,
                            host: endpoint_host.to_string(),
                            port,
                            container_port: p.container,
                            replica: c.replica as i32,
                        });
                    }
                }
            }
        }
        if is_init {
            if s_state == S::Failed && failed_init.is_none() {
                failed_init = Some(format!(
                    "init service {} failed: exit code {exit_code}",
                    spec.name
                ));
            }
        } else {
            any_long_running = true;
            state = worst(state, s_state);
            restarts += s_restarts;
        }
        services.insert(
            spec.name.clone(),
            pb::ServiceStatus {
                name: spec.name.clone(),
                state: s_state as i32,
                ready: s_ready == reps.len() && !reps.is_empty() && !is_init,
                restarts: s_restarts as i32,
                replicas: reps.len() as i32,
                ready_replicas: s_ready as i32,
                message: s_message,
                exit_code: exit_code as i32,
            },
        );
    }
    let message;
    if let Some(m) = failed_init {
        state = S::Failed;
        message = m;
    } else if !any_long_running {
        message = "no main or sidecar containers".to_string();
        state = S::Failed;
    } else {
        message = services
            .values()
            .filter(|s| s.state != S::Running as i32 && !s.message.is_empty())
            .map(|s| format!("{}: {}", s.name, s.message))
            .collect::<Vec<_>>()
            .join("; ");
    }
    endpoints.sort_by(|a, b| {
        (&a.service_name, a.container_port, a.replica).cmp(&(
            &b.service_name,
            b.container_port,
            b.replica,
        ))
    });
    pb::InstanceStatus {
        instance_id: inst.id.clone(),
        state: state as i32,
        ready: state == S::Running && ready,
        restarts: restarts as i32,
        started_at: started_at.map(timestamp),
        message,
        endpoints,
        services,
        metadata: HashMap::from([
            (
                "network".to_string(),
                inst.network.clone().unwrap_or_default(),
            ),
            ("release".to_string(), inst.release()),
        ]),
    }
}
