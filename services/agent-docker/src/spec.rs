//! From a service spec to a container: the create body (image, command,
//! env, ports, volumes, limits, health check, restart policy, network
//! aliases, labels) and the files written into it before it starts.
//!
//! Mapping choices:
//! - `command` replaces the image's entrypoint and `args` its command;
//!   with no `command`, `args` are passed to the image's entrypoint;
//! - ports are published on every host address, on the given host port or
//!   on one the engine picks (reported as endpoints);
//! - `cpu_millis` → `NanoCpus`, `memory_mb` → `Memory`; `disk_mb` is not
//!   enforced (the engine has no portable per-container disk limit);
//! - volumes are named volumes labelled with the instance, one per replica
//!   for `stateful_set` workloads, shared by the replicas otherwise;
//! - COMMAND health checks become the container's Docker health check (the
//!   engine runs them inside the container); HTTP and TCP checks are probed
//!   by the agent on the container's address in the instance network, so
//!   images need no curl or shell;
//! - main and sidecar containers restart `unless-stopped` (the engine
//!   restarts them with its own backoff), inits never restart;
//! - every container runs under the engine's init (`--init`), so PID 1
//!   forwards signals and reaps zombies whatever the image;
//! - config files and file secrets are copied into the container before it
//!   starts; relative paths are relative to the image's working directory.

use std::collections::HashMap;

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HealthConfig, HostConfig, Mount, MountType,
    NetworkingConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum,
};
use ctrlplane_agent::ProviderError;
use ctrlplane_agent::workload::{Role, role};
use ctrlplane_proto::provider::v1 as pb;
use sha2::{Digest, Sha256};

use crate::names::{self, Names};

/// What a container needs to know about its instance.
#[derive(Debug, Clone)]
pub struct Meta {
    /// Instance id.
    pub instance_id: String,
    /// Tenant id.
    pub tenant_id: String,
    /// Instance name.
    pub name: String,
    /// Stateful (a volume per replica) or not.
    pub stateful: bool,
    /// The request's labels.
    pub labels: HashMap<String, String>,
}

impl Meta {
    /// From a Provision request.
    pub fn of(req: &pb::ProvisionRequest) -> Self {
        Meta {
            instance_id: req.instance_id.clone(),
            tenant_id: req.tenant_id.clone(),
            name: req.name.clone(),
            stateful: req.kind == pb::WorkloadKind::StatefulSet as i32,
            labels: req.labels.clone(),
        }
    }

    /// Labels of the instance's network (and the base of every other
    /// object's labels).
    pub fn labels(&self, names: &Names) -> HashMap<String, String> {
        let mut l = self.labels.clone();
        l.insert(names::AGENT.to_string(), names::AGENT_VALUE.to_string());
        l.insert(names::SCOPE.to_string(), names.scope().to_string());
        l.insert(names::INSTANCE.to_string(), self.instance_id.clone());
        l.insert(names::TENANT.to_string(), self.tenant_id.clone());
        l.insert(names::NAME.to_string(), self.name.clone());
        l.insert(
            names::KIND.to_string(),
            if self.stateful {
                "stateful_set"
            } else {
                "deployment"
            }
            .to_string(),
        );
        l
    }

    /// Network labels: the base labels plus the request's labels as JSON.
    pub fn network_labels(&self, names: &Names) -> HashMap<String, String> {
        let mut l = self.labels(names);
        l.insert(
            names::REQUEST_LABELS.to_string(),
            canonical_json(&serde_json::to_value(&self.labels).unwrap_or_default()),
        );
        l
    }

    /// Reads the meta back from a network's (or container's) labels.
    pub fn from_labels(labels: &HashMap<String, String>) -> Self {
        let get = |k: &str| labels.get(k).cloned().unwrap_or_default();
        let request_labels = labels
            .get(names::REQUEST_LABELS)
            .and_then(|j| serde_json::from_str(j).ok())
            .unwrap_or_else(|| {
                labels
                    .iter()
                    .filter(|(k, _)| !k.starts_with("ctrlplane.io/"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            });
        Meta {
            instance_id: get(names::INSTANCE),
            tenant_id: get(names::TENANT),
            name: get(names::NAME),
            stateful: get(names::KIND) == "stateful_set",
            labels: request_labels,
        }
    }
}

/// JSON with object keys sorted at every level (stable hashes whatever
/// the map iteration order).
pub fn canonical_json(v: &serde_json::Value) -> String {
    fn sorted(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for k in keys {
                    out.insert(k.clone(), sorted(&m[k]));
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    let s = sorted(v);
    // serde_json may preserve insertion order (feature `preserve_order`):
    // the map above is built in sorted order either way.
    serde_json::to_string(&s).unwrap_or_default()
}

/// The spec as canonical JSON (the [`names::SPEC`] label).
pub fn spec_json(spec: &pb::ServiceSpec) -> String {
    canonical_json(&serde_json::to_value(spec).unwrap_or_default())
}

/// Hash of a spec (the [`names::SPEC_HASH`] label).
pub fn spec_hash(spec: &pb::ServiceSpec) -> String {
    let digest = Sha256::digest(spec_json(spec).as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// Parses the [`names::SPEC`] label.
pub fn parse_spec(json: &str) -> Option<pb::ServiceSpec> {
    serde_json::from_str(json).ok()
}

/// The role label value.
pub fn role_name(spec: &pb::ServiceSpec) -> &'static str {
    match role(spec) {
        Role::Init => "init",
        Role::Main => "main",
        Role::Sidecar => "sidecar",
    }
}

/// The Docker port key of a port spec (`8080/tcp`).
pub fn port_key(p: &pb::PortSpec) -> String {
    let proto = if p.protocol == pb::PortProtocol::Udp as i32 {
        "udp"
    } else {
        "tcp"
    };
    format!("{}/{proto}", p.container)
}

/// Nanoseconds of an optional proto duration, or `default_ns`.
fn nanos(d: Option<&ctrlplane_proto::pbjson_types::Duration>, default_ns: i64) -> i64 {
    d.map(|d| d.seconds.saturating_mul(1_000_000_000) + i64::from(d.nanos))
        .filter(|n| *n > 0)
        .unwrap_or(default_ns)
}

/// The health check kind of a spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// No health check: up when running.
    None,
    /// The engine runs the command (Docker health check).
    Command,
    /// The agent probes `GET path` on the container port.
    Http {
        /// Container port.
        port: u16,
        /// Path.
        path: String,
    },
    /// The agent opens a TCP connection to the container port.
    Tcp {
        /// Container port.
        port: u16,
    },
}

/// How a spec's health check is carried out.
pub fn check(spec: &pb::ServiceSpec) -> Check {
    let Some(h) = &spec.health_check else {
        return Check::None;
    };
    let kind = pb::HealthCheckType::try_from(h.r#type).unwrap_or(pb::HealthCheckType::Unspecified);
    let port = u16::try_from(h.port).unwrap_or(0);
    match kind {
        pb::HealthCheckType::Command => Check::Command,
        pb::HealthCheckType::Http => Check::Http {
            port,
            path: h.path.clone(),
        },
        pb::HealthCheckType::Tcp => Check::Tcp { port },
        pb::HealthCheckType::Unspecified if !h.command.is_empty() => Check::Command,
        pb::HealthCheckType::Unspecified if !h.path.is_empty() => Check::Http {
            port,
            path: h.path.clone(),
        },
        pb::HealthCheckType::Unspecified if port != 0 => Check::Tcp { port },
        pb::HealthCheckType::Unspecified => Check::None,
    }
}

/// The probe timeout of a spec's health check (default 2 s).
pub fn check_timeout(spec: &pb::ServiceSpec) -> std::time::Duration {
    let ns = nanos(
        spec.health_check.as_ref().and_then(|h| h.timeout.as_ref()),
        2_000_000_000,
    );
    std::time::Duration::from_nanos(ns as u64)
}

/// Volume names a replica mounts: `(docker volume name, mount path)`.
pub fn volumes(
    names: &Names,
    meta: &Meta,
    spec: &pb::ServiceSpec,
    replica: u32,
) -> Vec<(String, String)> {
    spec.volumes
        .iter()
        .map(|v| {
            (
                names.volume(
                    &meta.instance_id,
                    &spec.name,
                    &v.name,
                    meta.stateful.then_some(replica),
                ),
                v.mount_path.clone(),
            )
        })
        .collect()
}

/// Reads secrets from `secrets_dir/KEY`.
///
/// # Errors
/// `FAILED_PRECONDITION` naming the missing secret.
pub fn read_secret(secrets_dir: &std::path::Path, key: &str) -> Result<Vec<u8>, ProviderError> {
    let path = secrets_dir.join(key);
    std::fs::read(&path).map_err(|e| {
        ProviderError::FailedPrecondition(format!(
            "secret {key:?} cannot be read from {}: {e}",
            path.display()
        ))
    })
}

/// Everything needed to create one replica.
pub struct Replica<'a> {
    /// Object names.
    pub names: &'a Names,
    /// The instance.
    pub meta: &'a Meta,
    /// The service.
    pub spec: &'a pb::ServiceSpec,
    /// Replica index.
    pub replica: u32,
    /// Release label.
    pub release: &'a str,
    /// Secret values by key.
    pub secrets: &'a HashMap<String, Vec<u8>>,
}

impl Replica<'_> {
    /// The container create body.
    pub fn body(&self) -> ContainerCreateBody {
        let spec = self.spec;
        let meta = self.meta;
        let network = self.names.network(&meta.instance_id);
        let mut labels = meta.labels(self.names);
        labels.insert(names::SERVICE.to_string(), spec.name.clone());
        labels.insert(names::ROLE.to_string(), role_name(spec).to_string());
        labels.insert(names::REPLICA.to_string(), self.replica.to_string());
        labels.insert(names::SPEC.to_string(), spec_json(spec));
        labels.insert(names::SPEC_HASH.to_string(), spec_hash(spec));
        labels.insert(names::RELEASE.to_string(), self.release.to_string());

        let mut env: Vec<String> = spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for s in &spec.secrets {
            if s.r#type != pb::SecretType::File as i32 {
                let var = if s.target.is_empty() {
                    &s.key
                } else {
                    &s.target
                };
                let value = self
                    .secrets
                    .get(&s.key)
                    .map(|v| String::from_utf8_lossy(v).trim_end().to_string())
                    .unwrap_or_default();
                env.push(format!("{var}={value}"));
            }
        }
        env.sort();

        let mut exposed = Vec::new();
        let mut bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        for p in &spec.ports {
            let key = port_key(p);
            exposed.push(key.clone());
            bindings.insert(
                key,
                Some(vec![PortBinding {
                    host_ip: Some(String::new()),
                    host_port: Some(if p.host > 0 {
                        p.host.to_string()
                    } else {
                        String::new()
                    }),
                }]),
            );
        }

        let mounts: Vec<Mount> = volumes(self.names, meta, spec, self.replica)
            .into_iter()
            .map(|(source, target)| Mount {
                source: Some(source),
                target: Some(target),
                typ: Some(MountType::VOLUME),
                ..Default::default()
            })
            .collect();

        let res = spec.resources.unwrap_or_default();
        let is_init = role(spec) == Role::Init;
        let healthcheck = match (check(spec), &spec.health_check) {
            (Check::Command, Some(h)) => {
                let mut test = vec!["CMD".to_string()];
                test.extend(h.command.iter().cloned());
                Some(HealthConfig {
                    test: Some(test),
                    interval: Some(nanos(h.interval.as_ref(), 10_000_000_000)),
                    timeout: Some(nanos(h.timeout.as_ref(), 2_000_000_000)),
                    retries: Some(if h.retries > 0 {
                        i64::from(h.retries)
                    } else {
                        3
                    }),
                    start_period: None,
                    start_interval: None,
                })
            }
            _ => None,
        };

        let (entrypoint, cmd) = if spec.command.is_empty() {
            (None, (!spec.args.is_empty()).then(|| spec.args.clone()))
        } else {
            (Some(spec.command.clone()), Some(spec.args.clone()))
        };

        ContainerCreateBody {
            hostname: Some(format!("{}-{}", spec.name, self.replica)),
            image: Some(spec.image.clone()),
            entrypoint,
            cmd,
            env: Some(env),
            labels: Some(labels),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            healthcheck,
            host_config: Some(HostConfig {
                port_bindings: (!bindings.is_empty()).then_some(bindings),
                mounts: (!mounts.is_empty()).then_some(mounts),
                nano_cpus: (res.cpu_millis > 0).then(|| i64::from(res.cpu_millis) * 1_000_000),
                memory: (res.memory_mb > 0).then(|| i64::from(res.memory_mb) * 1024 * 1024),
                restart_policy: Some(RestartPolicy {
                    name: Some(if is_init {
                        RestartPolicyNameEnum::NO
                    } else {
                        RestartPolicyNameEnum::UNLESS_STOPPED
                    }),
                    maximum_retry_count: None,
                }),
                init: Some(true),
                network_mode: Some(network.clone()),
                ..Default::default()
            }),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    network,
                    EndpointSettings {
                        aliases: Some(vec![
                            spec.name.clone(),
                            format!("{}-{}", spec.name, self.replica),
                        ]),
                        ..Default::default()
                    },
                )])),
            }),
            ..Default::default()
        }
    }

    /// Files to copy in before the first start: config files and file
    /// secrets, relative paths resolved against `workdir`.
    pub fn files(&self, workdir: &str) -> Vec<(String, Vec<u8>)> {
        let abs = |p: &str| {
            if p.starts_with('/') {
                p.to_string()
            } else {
                let base = if workdir.is_empty() { "/" } else { workdir };
                format!("{}/{}", base.trim_end_matches('/'), p)
            }
        };
        let mut files: Vec<(String, Vec<u8>)> = self
            .spec
            .config_files
            .iter()
            .map(|f| (abs(&f.path), f.content.clone().into_bytes()))
            .collect();
        for s in &self.spec.secrets {
            if s.r#type == pb::SecretType::File as i32 {
                let target = if s.target.is_empty() {
                    &s.key
                } else {
                    &s.target
                };
                if let Some(v) = self.secrets.get(&s.key) {
                    files.push((abs(target), v.clone()));
                }
            }
        }
        files
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> pb::ServiceSpec {
        pb::ServiceSpec {
            name: "web".into(),
            image: "img:1".into(),
            role: pb::ServiceRole::Main as i32,
            env: HashMap::from([("B".into(), "2".into()), ("A".into(), "1".into())]),
            ports: vec![
                pb::PortSpec {
                    container: 8080,
                    host: 0,
                    protocol: 0,
                    name: String::new(),
                },
                pb::PortSpec {
                    container: 53,
                    host: 5353,
                    protocol: pb::PortProtocol::Udp as i32,
                    name: "dns".into(),
                },
            ],
            volumes: vec![pb::VolumeSpec {
                name: "data".into(),
                mount_path: "/data".into(),
                size_mb: 0,
                r#type: 0,
            }],
            resources: Some(pb::ResourceSpec {
                cpu_millis: 500,
                memory_mb: 64,
                replicas: 2,
                ..Default::default()
            }),
            command: vec!["/bin/app".into()],
            args: vec!["serve".into()],
            config_files: vec![pb::ConfigFile {
                name: "c".into(),
                path: "conf/app.yaml".into(),
                format: "yaml".into(),
                content: "x: 1\n".into(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_body_carries_the_spec() {
        let names = Names::new("cp");
        let meta = Meta {
            instance_id: "wl_1".into(),
            tenant_id: "t1".into(),
            name: "web".into(),
            stateful: true,
            labels: HashMap::from([("team".into(), "a".into())]),
        };
        let s = spec();
        let secrets = HashMap::new();
        let r = Replica {
            names: &names,
            meta: &meta,
            spec: &s,
            replica: 1,
            release: "r1",
            secrets: &secrets,
        };
        let b = r.body();
        assert_eq!(b.image.as_deref(), Some("img:1"));
        assert_eq!(b.entrypoint, Some(vec!["/bin/app".to_string()]));
        assert_eq!(b.cmd, Some(vec!["serve".to_string()]));
        assert_eq!(b.env, Some(vec!["A=1".to_string(), "B=2".to_string()]));
        let l = b.labels.unwrap();
        assert_eq!(l["ctrlplane.io/instance"], "wl_1");
        assert_eq!(l["ctrlplane.io/service"], "web");
        assert_eq!(l["ctrlplane.io/role"], "main");
        assert_eq!(l["ctrlplane.io/replica"], "1");
        assert_eq!(l["ctrlplane.io/tenant"], "t1");
        assert_eq!(l["ctrlplane.io/release"], "r1");
        assert_eq!(l["team"], "a");
        assert_eq!(parse_spec(&l["ctrlplane.io/spec"]).unwrap(), s);
        let h = b.host_config.unwrap();
        assert_eq!(h.nano_cpus, Some(500_000_000));
        assert_eq!(h.memory, Some(64 * 1024 * 1024));
        assert_eq!(h.init, Some(true));
        assert_eq!(h.network_mode.as_deref(), Some("cp.wl_1"));
        let pb = h.port_bindings.unwrap();
        assert_eq!(
            pb["8080/tcp"].as_ref().unwrap()[0].host_port.as_deref(),
            Some("")
        );
        assert_eq!(
            pb["53/udp"].as_ref().unwrap()[0].host_port.as_deref(),
            Some("5353")
        );
        let m = h.mounts.unwrap();
        assert_eq!(m[0].source.as_deref(), Some("cp.wl_1.web.data.1"));
        assert_eq!(
            h.restart_policy.unwrap().name,
            Some(RestartPolicyNameEnum::UNLESS_STOPPED)
        );
        let aliases = b.networking_config.unwrap().endpoints_config.unwrap()["cp.wl_1"]
            .aliases
            .clone()
            .unwrap();
        assert_eq!(aliases, vec!["web".to_string(), "web-1".to_string()]);
        assert_eq!(
            r.files("/srv"),
            vec![("/srv/conf/app.yaml".to_string(), b"x: 1\n".to_vec())]
        );
        assert_eq!(r.files("")[0].0, "/conf/app.yaml");
    }

    #[test]
    fn hashes_are_stable_and_change_with_the_spec() {
        let a = spec();
        assert_eq!(spec_hash(&a), spec_hash(&a.clone()));
        let mut b = a.clone();
        b.env.insert("C".into(), "3".into());
        assert_ne!(spec_hash(&a), spec_hash(&b));
    }

    #[test]
    fn health_checks_map_by_type() {
        let mut s = spec();
        assert_eq!(check(&s), Check::None);
        s.health_check = Some(pb::HealthCheckSpec {
            path: "/healthz".into(),
            port: 8080,
            ..Default::default()
        });
        assert_eq!(
            check(&s),
            Check::Http {
                port: 8080,
                path: "/healthz".into()
            }
        );
        s.health_check = Some(pb::HealthCheckSpec {
            command: vec!["/bin/check".into()],
            ..Default::default()
        });
        assert_eq!(check(&s), Check::Command);
        let secrets = HashMap::new();
        let names = Names::new("cp");
        let meta = Meta {
            instance_id: "i".into(),
            tenant_id: String::new(),
            name: "i".into(),
            stateful: false,
            labels: HashMap::new(),
        };
        let body = Replica {
            names: &names,
            meta: &meta,
            spec: &s,
            replica: 0,
            release: "initial",
            secrets: &secrets,
        }
        .body();
        assert_eq!(
            body.healthcheck.unwrap().test.unwrap(),
            vec!["CMD".to_string(), "/bin/check".to_string()]
        );
    }
}
