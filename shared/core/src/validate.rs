//! Validation rules for user-supplied names, labels, metadata, service specs
//! and bootstrap service specs.
//!
//! Every function takes the [`Violations`] to add to, the path of the field
//! being checked (see [`crate::violations`] for the path syntax) and the
//! value. A rule that fails adds a violation and checking goes on: one call
//! reports every problem, never just the first. Nothing here allocates in
//! proportion to anything but the input, and nothing recurses on it, so a
//! hostile request cannot exhaust the stack.
//!
//! Map entries are checked in key order, so the violations of a request come
//! out in the same order every time.
//!
//! Lengths called "characters" count Unicode scalar values; limits named
//! `*_BYTES` count UTF-8 bytes.

use std::collections::{HashMap, HashSet};

use ctrlplane_proto::bootstrap::v1::BootstrapServiceSpec;
use ctrlplane_proto::pbjson_types::Duration;
use ctrlplane_proto::provider::v1::{
    ConfigFile, HealthCheckSpec, HealthCheckType, PortProtocol, PortSpec, ResourceSpec, SecretRef,
    SecretType, ServiceRole, ServiceSpec, VolumeSpec, VolumeType, WorkloadKind,
};

use crate::violations::{Violations, child, index, key, quote};

/// Longest DNS label (names of services, bootstrap services, volumes, ports).
pub const DNS_LABEL_MAX: usize = 63;
/// Longest DNS subdomain (label key prefixes).
pub const DNS_SUBDOMAIN_MAX: usize = 253;

/// Most entries in a label map.
pub const MAX_LABELS: usize = 64;
/// Longest label key name (the part after an optional `prefix/`).
pub const LABEL_NAME_MAX: usize = 63;
/// Longest label value.
pub const LABEL_VALUE_MAX: usize = 63;

/// Most entries in a metadata or annotations map.
pub const MAX_METADATA: usize = 64;
/// Longest metadata key, in characters.
pub const METADATA_KEY_MAX: usize = 253;
/// Longest metadata value, in characters.
pub const METADATA_VALUE_MAX: usize = 4096;

/// Most services in one workload.
pub const MAX_SERVICES: usize = 32;
/// Longest image reference, in characters.
pub const IMAGE_MAX: usize = 512;
/// Most replicas of a service or a bootstrap service.
pub const MAX_REPLICAS: i32 = 100;
/// Most environment variables of a service.
pub const MAX_ENV: usize = 128;
/// Longest environment variable name.
pub const ENV_NAME_MAX: usize = 256;
/// Largest environment variable value.
pub const ENV_VALUE_MAX_BYTES: usize = 32 * 1024;
/// Most ports of a service.
pub const MAX_PORTS: usize = 32;
/// Highest port number.
pub const PORT_MAX: i32 = 65535;
/// Most volumes of a service.
pub const MAX_VOLUMES: usize = 32;
/// Longest health check interval or timeout, in seconds (one hour).
pub const HEALTH_CHECK_DURATION_MAX_SECS: i64 = 3600;
/// Most consecutive failures a health check may be configured to tolerate.
pub const MAX_HEALTH_CHECK_RETRIES: i32 = 100;
/// Most secrets of a service.
pub const MAX_SECRETS: usize = 32;
/// Longest secret key, in characters.
pub const SECRET_KEY_MAX: usize = 253;
/// Most config files of a service.
pub const MAX_CONFIG_FILES: usize = 32;
/// Longest config file name, in characters.
pub const CONFIG_FILE_NAME_MAX: usize = 253;
/// Largest config file content.
pub const CONFIG_FILE_CONTENT_MAX_BYTES: usize = 1024 * 1024;
/// Most entries in a service's `command`, in its `args`, or in a health
/// check's `command`.
pub const MAX_ARGS: usize = 256;
/// Longest single entry of `command` or `args`, in characters.
pub const ARG_MAX: usize = 4096;

/// Most bootstrap service specs in one list (and most `depends_on` entries
/// of one spec).
pub const MAX_BOOTSTRAP_SPECS: usize = 64;

const LABEL_CHARS: &str =
    "must consist of letters, digits, '-', '_' and '.', starting and ending with a letter or digit";

/// Checks that `value` is a DNS label: required, 1–63 characters of
/// `[a-z0-9-]`, starting and ending with a letter or digit.
pub fn dns_label(v: &mut Violations, field: &str, value: &str) {
    if value.is_empty() {
        v.add(field, "is required");
        return;
    }
    let len = value.chars().count();
    if len > DNS_LABEL_MAX {
        v.add(
            field,
            format!("must be at most {DNS_LABEL_MAX} characters, got {len}"),
        );
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        v.add(field, "must contain only lowercase letters, digits and '-'");
    }
    if value.starts_with('-') || value.ends_with('-') {
        v.add(field, "must start and end with a letter or digit");
    }
}

/// Checks a label map: at most [`MAX_LABELS`] entries; Kubernetes-style keys
/// (`[prefix/]name`, the prefix a DNS subdomain of at most 253 characters,
/// the name 1–63 characters of `[A-Za-z0-9._-]` starting and ending with a
/// letter or digit); values empty or up to 63 characters of the same set
/// with the same ends. So a label never contains `,` or `=`, which label
/// selectors use as separators.
pub fn labels(v: &mut Violations, field: &str, labels: &HashMap<String, String>) {
    count_at_most(v, field, labels.len(), MAX_LABELS, "entries");
    for (k, value) in sorted(labels) {
        let f = key(field, k);
        if let Some(problem) = label_key_problem(k) {
            v.add(&f, format!("key {problem}"));
        }
        if let Some(problem) = label_value_problem(value) {
            v.add(&f, format!("value {problem}"));
        }
    }
}

/// Checks a metadata or annotations map: at most [`MAX_METADATA`] entries,
/// keys 1–253 characters with no control characters, values at most 4096
/// characters.
pub fn metadata(v: &mut Violations, field: &str, map: &HashMap<String, String>) {
    count_at_most(v, field, map.len(), MAX_METADATA, "entries");
    for (k, value) in sorted(map) {
        let f = key(field, k);
        let len = k.chars().count();
        if len == 0 {
            v.add(&f, "key must not be empty");
        } else if len > METADATA_KEY_MAX {
            v.add(
                &f,
                format!("key must be at most {METADATA_KEY_MAX} characters, got {len}"),
            );
        }
        if k.chars().any(char::is_control) {
            v.add(&f, "key must not contain control characters");
        }
        let len = value.chars().count();
        if len > METADATA_VALUE_MAX {
            v.add(
                &f,
                format!("value must be at most {METADATA_VALUE_MAX} characters, got {len}"),
            );
        }
    }
}

/// Checks the services of one workload.
///
/// The list: 1–[`MAX_SERVICES`] services, exactly one of them MAIN (role
/// UNSPECIFIED counts as MAIN), unique names. Each service: name a DNS
/// label; image at most [`IMAGE_MAX`] characters (may be empty); role and
/// every other enum a known value; `depends_on` naming other services of the
/// list, once each, without cycles, an INIT service depending only on INIT
/// services; plus the rules for resources, env, ports, volumes, health
/// check, secrets, config files, annotations, command and args documented
/// on the limits of this module.
pub fn service_specs(v: &mut Violations, field: &str, specs: &[ServiceSpec]) {
    if specs.is_empty() {
        v.add(field, "at least one service is required");
    }
    count_at_most(v, field, specs.len(), MAX_SERVICES, "services");

    for (i, spec) in specs.iter().enumerate() {
        service_spec(v, &index(field, i), spec);
    }
    let first_by_name = unique_names(v, field, specs.iter().map(|s| s.name.as_str()));

    let mains: Vec<String> = specs
        .iter()
        .filter(|s| effective_role(s) == Some(ServiceRole::Main))
        .map(|s| quote(&s.name))
        .collect();
    if !specs.is_empty() && mains.len() != 1 {
        let which = if mains.is_empty() {
            String::new()
        } else {
            format!(": {}", mains.join(", "))
        };
        v.add(
            field,
            format!(
                "must have exactly one MAIN service (role MAIN or unspecified), found {}{which}",
                mains.len()
            ),
        );
    }

    let mut edges = vec![Vec::new(); specs.len()];
    for (i, spec) in specs.iter().enumerate() {
        let mut seen = HashSet::new();
        for (j, dep) in spec.depends_on.iter().enumerate() {
            let f = index(&child(&index(field, i), "depends_on"), j);
            if dep.is_empty() {
                v.add(&f, "must not be empty");
            } else if *dep == spec.name {
                v.add(&f, "a service cannot depend on itself");
            } else if !seen.insert(dep.as_str()) {
                v.add(&f, format!("duplicate entry {}", quote(dep)));
            } else if let Some(&k) = first_by_name.get(dep.as_str()) {
                edges[i].push(k);
                let target = effective_role(&specs[k]);
                if effective_role(spec) == Some(ServiceRole::Init)
                    && target.is_some_and(|r| r != ServiceRole::Init)
                {
                    v.add(
                        &f,
                        format!(
                            "an INIT service may depend only on INIT services, {} is {}",
                            quote(dep),
                            role_name(target)
                        ),
                    );
                }
            } else {
                v.add(
                    &f,
                    format!("names no service of this workload: {}", quote(dep)),
                );
            }
        }
    }
    report_cycles(v, field, &edges, |i| &specs[i].name);
}

/// The index of each non-empty name's first entry of the list at `field`;
/// a later entry with the same name is a violation on its `name`.
fn unique_names<'a>(
    v: &mut Violations,
    field: &str,
    names: impl Iterator<Item = &'a str>,
) -> HashMap<&'a str, usize> {
    let mut first_by_name: HashMap<&str, usize> = HashMap::new();
    for (i, name) in names.enumerate() {
        if name.is_empty() {
            continue;
        }
        if let Some(&j) = first_by_name.get(name) {
            v.add(
                child(&index(field, i), "name"),
                format!("duplicate name {} (also {})", quote(name), index(field, j)),
            );
        } else {
            first_by_name.insert(name, i);
        }
    }
    first_by_name
}

/// Checks a list of bootstrap service specs: at most
/// [`MAX_BOOTSTRAP_SPECS`], unique names, each spec as [`bootstrap_spec`],
/// and no dependency cycle among the specs of the list.
///
/// A `depends_on` entry naming no spec of the list is *not* an error: the
/// desired set of a datacenter is the declared specs plus those hooks
/// contribute at reconcile time, so the dependency may be satisfied later.
/// Cycles can only be seen among the specs present here; the reconciler
/// checks the merged set again.
pub fn bootstrap_specs(v: &mut Violations, field: &str, specs: &[BootstrapServiceSpec]) {
    count_at_most(
        v,
        field,
        specs.len(),
        MAX_BOOTSTRAP_SPECS,
        "bootstrap services",
    );

    for (i, spec) in specs.iter().enumerate() {
        bootstrap_spec(v, &index(field, i), spec);
    }
    let first_by_name = unique_names(v, field, specs.iter().map(|s| s.name.as_str()));

    let edges: Vec<Vec<usize>> = specs
        .iter()
        .map(|spec| {
            let mut seen = HashSet::new();
            spec.depends_on
                .iter()
                .filter(|dep| **dep != spec.name)
                .filter_map(|dep| first_by_name.get(dep.as_str()).copied())
                .filter(|k| seen.insert(*k))
                .collect()
        })
        .collect();
    report_cycles(v, field, &edges, |i| &specs[i].name);
}

/// Checks one bootstrap service spec: name a DNS label, kind a known value,
/// replicas 0–[`MAX_REPLICAS`], services as [`service_specs`], labels as
/// [`labels`], `depends_on` entries DNS labels, not the spec itself, each
/// once. Whether dependencies exist and form no cycle needs the other specs:
/// see [`bootstrap_specs`].
pub fn bootstrap_spec(v: &mut Violations, field: &str, spec: &BootstrapServiceSpec) {
    dns_label(v, &child(field, "name"), &spec.name);
    known::<WorkloadKind>(v, &child(field, "kind"), spec.kind);
    replicas(v, &child(field, "replicas"), spec.replicas);
    service_specs(v, &child(field, "services"), &spec.services);
    labels(v, &child(field, "labels"), &spec.labels);

    let deps_field = child(field, "depends_on");
    count_at_most(
        v,
        &deps_field,
        spec.depends_on.len(),
        MAX_BOOTSTRAP_SPECS,
        "entries",
    );
    let mut seen = HashSet::new();
    for (j, dep) in spec.depends_on.iter().enumerate() {
        let f = index(&deps_field, j);
        dns_label(v, &f, dep);
        if !dep.is_empty() && *dep == spec.name {
            v.add(&f, "a bootstrap service cannot depend on itself");
        } else if !seen.insert(dep.as_str()) {
            v.add(&f, format!("duplicate entry {}", quote(dep)));
        }
    }
}

/// The rules of one service that need no sibling.
fn service_spec(v: &mut Violations, field: &str, spec: &ServiceSpec) {
    dns_label(v, &child(field, "name"), &spec.name);
    chars_at_most(v, &child(field, "image"), &spec.image, IMAGE_MAX);
    known::<ServiceRole>(v, &child(field, "role"), spec.role);
    if let Some(resources) = &spec.resources {
        resource_spec(v, &child(field, "resources"), resources);
    }
    env(v, &child(field, "env"), &spec.env);
    ports(v, &child(field, "ports"), &spec.ports);
    volumes(v, &child(field, "volumes"), &spec.volumes);
    if let Some(check) = &spec.health_check {
        health_check(v, &child(field, "health_check"), check);
    }
    secrets(v, &child(field, "secrets"), &spec.secrets);
    config_files(v, &child(field, "config_files"), &spec.config_files);
    metadata(v, &child(field, "annotations"), &spec.annotations);
    string_list(v, &child(field, "command"), &spec.command);
    string_list(v, &child(field, "args"), &spec.args);
}

fn resource_spec(v: &mut Violations, field: &str, r: &ResourceSpec) {
    for (name, value) in [
        ("cpu_millis", r.cpu_millis),
        ("memory_mb", r.memory_mb),
        ("disk_mb", r.disk_mb),
        ("gpu", r.gpu),
    ] {
        non_negative(v, &child(field, name), value);
    }
    replicas(v, &child(field, "replicas"), r.replicas);
}

fn env(v: &mut Violations, field: &str, env: &HashMap<String, String>) {
    count_at_most(v, field, env.len(), MAX_ENV, "entries");
    for (name, value) in sorted(env) {
        let f = key(field, name);
        if let Some(problem) = env_name_problem(name) {
            v.add(&f, format!("name {problem}"));
        }
        if value.len() > ENV_VALUE_MAX_BYTES {
            v.add(
                &f,
                format!(
                    "value must be at most {ENV_VALUE_MAX_BYTES} bytes, got {}",
                    value.len()
                ),
            );
        }
    }
}

fn ports(v: &mut Violations, field: &str, ports: &[PortSpec]) {
    count_at_most(v, field, ports.len(), MAX_PORTS, "ports");
    let mut by_port: HashMap<(i32, PortProtocol), usize> = HashMap::new();
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (j, port) in ports.iter().enumerate() {
        let f = index(field, j);
        let container_ok = (1..=PORT_MAX).contains(&port.container);
        if !container_ok {
            v.add(
                child(&f, "container"),
                format!("must be 1-{PORT_MAX}, got {}", port.container),
            );
        }
        if !(0..=PORT_MAX).contains(&port.host) {
            v.add(
                child(&f, "host"),
                format!("must be 0-{PORT_MAX}, got {}", port.host),
            );
        }
        let protocol = known::<PortProtocol>(v, &child(&f, "protocol"), port.protocol).map(|p| {
            if p == PortProtocol::Unspecified {
                PortProtocol::Tcp
            } else {
                p
            }
        });
        if let (true, Some(protocol)) = (container_ok, protocol) {
            if let Some(&k) = by_port.get(&(port.container, protocol)) {
                let proto = if protocol == PortProtocol::Udp {
                    "udp"
                } else {
                    "tcp"
                };
                v.add(
                    child(&f, "container"),
                    format!(
                        "duplicate port {}/{proto} (also {})",
                        port.container,
                        index(field, k)
                    ),
                );
            } else {
                by_port.insert((port.container, protocol), j);
            }
        }
        if !port.name.is_empty() {
            let nf = child(&f, "name");
            dns_label(v, &nf, &port.name);
            if let Some(&k) = by_name.get(port.name.as_str()) {
                v.add(
                    nf,
                    format!(
                        "duplicate name {} (also {})",
                        quote(&port.name),
                        index(field, k)
                    ),
                );
            } else {
                by_name.insert(&port.name, j);
            }
        }
    }
}

fn volumes(v: &mut Violations, field: &str, volumes: &[VolumeSpec]) {
    count_at_most(v, field, volumes.len(), MAX_VOLUMES, "volumes");
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let mut by_path: HashMap<&str, usize> = HashMap::new();
    for (j, volume) in volumes.iter().enumerate() {
        let f = index(field, j);
        let nf = child(&f, "name");
        dns_label(v, &nf, &volume.name);
        if !volume.name.is_empty() {
            if let Some(&k) = by_name.get(volume.name.as_str()) {
                v.add(
                    nf,
                    format!(
                        "duplicate name {} (also {})",
                        quote(&volume.name),
                        index(field, k)
                    ),
                );
            } else {
                by_name.insert(&volume.name, j);
            }
        }
        let pf = child(&f, "mount_path");
        if volume.mount_path.is_empty() {
            v.add(&pf, "is required");
        } else {
            if !volume.mount_path.starts_with('/') {
                v.add(&pf, "must be an absolute path");
            }
            if has_parent_component(&volume.mount_path) {
                v.add(&pf, "must not contain a '..' component");
            }
            if let Some(&k) = by_path.get(volume.mount_path.as_str()) {
                v.add(
                    &pf,
                    format!(
                        "duplicate mount path {} (also {})",
                        quote(&volume.mount_path),
                        index(field, k)
                    ),
                );
            } else {
                by_path.insert(&volume.mount_path, j);
            }
        }
        non_negative(v, &child(&f, "size_mb"), volume.size_mb);
        known::<VolumeType>(v, &child(&f, "type"), volume.r#type);
    }
}

fn health_check(v: &mut Violations, field: &str, check: &HealthCheckSpec) {
    let effective = match known::<HealthCheckType>(v, &child(field, "type"), check.r#type) {
        None => None,
        Some(HealthCheckType::Unspecified) => {
            if !check.path.is_empty() {
                Some(HealthCheckType::Http)
            } else if !check.command.is_empty() {
                Some(HealthCheckType::Command)
            } else if check.port != 0 {
                Some(HealthCheckType::Tcp)
            } else {
                v.add(
                    field,
                    "cannot tell the check type: set type, or path (HTTP), command (COMMAND) \
                     or port (TCP)",
                );
                None
            }
        }
        Some(explicit) => Some(explicit),
    };

    let check_port = |v: &mut Violations, kind: &str| {
        let f = child(field, "port");
        if check.port == 0 {
            v.add(f, format!("is required for {kind} checks"));
        } else if !(1..=PORT_MAX).contains(&check.port) {
            v.add(f, format!("must be 1-{PORT_MAX}, got {}", check.port));
        }
    };
    match effective {
        Some(HealthCheckType::Http) => {
            let f = child(field, "path");
            if check.path.is_empty() {
                v.add(f, "is required for HTTP checks");
            } else if !check.path.starts_with('/') {
                v.add(f, "must start with \"/\"");
            }
            check_port(v, "HTTP");
        }
        Some(HealthCheckType::Tcp) => check_port(v, "TCP"),
        Some(HealthCheckType::Command) if check.command.is_empty() => {
            v.add(child(field, "command"), "is required for COMMAND checks");
        }
        _ => {}
    }

    duration(v, &child(field, "interval"), check.interval.as_ref());
    duration(v, &child(field, "timeout"), check.timeout.as_ref());
    if !(0..=MAX_HEALTH_CHECK_RETRIES).contains(&check.retries) {
        v.add(
            child(field, "retries"),
            format!(
                "must be 0-{MAX_HEALTH_CHECK_RETRIES}, got {}",
                check.retries
            ),
        );
    }
    string_list(v, &child(field, "command"), &check.command);
}

fn secrets(v: &mut Violations, field: &str, secrets: &[SecretRef]) {
    count_at_most(v, field, secrets.len(), MAX_SECRETS, "secrets");
    for (j, secret) in secrets.iter().enumerate() {
        let f = index(field, j);
        let kf = child(&f, "key");
        let key_len = secret.key.chars().count();
        if key_len == 0 {
            v.add(&kf, "is required");
        } else if key_len > SECRET_KEY_MAX {
            v.add(
                &kf,
                format!("must be at most {SECRET_KEY_MAX} characters, got {key_len}"),
            );
        }
        // With an empty target the key doubles as the variable name or path:
        // report a problem with it on the key, saying so.
        let (target_field, target, via_key) = if secret.target.is_empty() {
            (kf, secret.key.as_str(), true)
        } else {
            (child(&f, "target"), secret.target.as_str(), false)
        };
        let explain = |role: &str, problem: String| {
            if via_key {
                format!("is used as the {role} (target is empty) and {problem}")
            } else {
                problem
            }
        };
        let problem = match known::<SecretType>(v, &child(&f, "type"), secret.r#type) {
            _ if target.is_empty() => None,
            Some(SecretType::Unspecified | SecretType::Env) => {
                env_name_problem(target).map(|p| explain("environment variable name", p))
            }
            Some(SecretType::File) => {
                relative_path_problem(target).map(|p| explain("file path", p))
            }
            None => None,
        };
        if let Some(problem) = problem {
            v.add(target_field, problem);
        }
    }
}

fn config_files(v: &mut Violations, field: &str, files: &[ConfigFile]) {
    count_at_most(v, field, files.len(), MAX_CONFIG_FILES, "config files");
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let mut by_path: HashMap<&str, usize> = HashMap::new();
    for (j, file) in files.iter().enumerate() {
        let f = index(field, j);
        let nf = child(&f, "name");
        let len = file.name.chars().count();
        if len == 0 {
            v.add(&nf, "is required");
        } else {
            if len > CONFIG_FILE_NAME_MAX {
                v.add(
                    &nf,
                    format!("must be at most {CONFIG_FILE_NAME_MAX} characters, got {len}"),
                );
            }
            if let Some(&k) = by_name.get(file.name.as_str()) {
                v.add(
                    &nf,
                    format!(
                        "duplicate name {} (also {})",
                        quote(&file.name),
                        index(field, k)
                    ),
                );
            } else {
                by_name.insert(&file.name, j);
            }
        }
        let pf = child(&f, "path");
        if file.path.is_empty() {
            v.add(&pf, "is required");
        } else {
            if has_parent_component(&file.path) {
                v.add(&pf, "must not contain a '..' component");
            }
            if let Some(&k) = by_path.get(file.path.as_str()) {
                v.add(
                    &pf,
                    format!(
                        "duplicate path {} (also {})",
                        quote(&file.path),
                        index(field, k)
                    ),
                );
            } else {
                by_path.insert(&file.path, j);
            }
        }
        if file.content.len() > CONFIG_FILE_CONTENT_MAX_BYTES {
            v.add(
                child(&f, "content"),
                format!(
                    "must be at most {CONFIG_FILE_CONTENT_MAX_BYTES} bytes, got {}",
                    file.content.len()
                ),
            );
        }
    }
}

/// At most [`MAX_ARGS`] entries of at most [`ARG_MAX`] characters each.
fn string_list(v: &mut Violations, field: &str, list: &[String]) {
    count_at_most(v, field, list.len(), MAX_ARGS, "entries");
    for (j, item) in list.iter().enumerate() {
        chars_at_most(v, &index(field, j), item, ARG_MAX);
    }
}

fn duration(v: &mut Violations, field: &str, d: Option<&Duration>) {
    let Some(d) = d else { return };
    let valid_nanos = (-999_999_999..=999_999_999).contains(&d.nanos);
    let signs_agree = !(d.seconds > 0 && d.nanos < 0 || d.seconds < 0 && d.nanos > 0);
    if !valid_nanos || !signs_agree {
        v.add(field, "is not a valid duration");
    } else if d.seconds < 0 || d.nanos < 0 {
        v.add(field, "must not be negative");
    } else if d.seconds > HEALTH_CHECK_DURATION_MAX_SECS
        || d.seconds == HEALTH_CHECK_DURATION_MAX_SECS && d.nanos > 0
    {
        v.add(
            field,
            format!("must be at most {HEALTH_CHECK_DURATION_MAX_SECS}s (one hour)"),
        );
    }
}

fn replicas(v: &mut Violations, field: &str, replicas: i32) {
    non_negative(v, field, replicas);
    if replicas > MAX_REPLICAS {
        v.add(
            field,
            format!("must be at most {MAX_REPLICAS}, got {replicas}"),
        );
    }
}

fn non_negative(v: &mut Violations, field: &str, value: i32) {
    if value < 0 {
        v.add(field, format!("must not be negative, got {value}"));
    }
}

fn count_at_most(v: &mut Violations, field: &str, count: usize, max: usize, what: &str) {
    if count > max {
        v.add(
            field,
            format!("must have at most {max} {what}, got {count}"),
        );
    }
}

fn chars_at_most(v: &mut Violations, field: &str, value: &str, max: usize) {
    let len = value.chars().count();
    if len > max {
        v.add(
            field,
            format!("must be at most {max} characters, got {len}"),
        );
    }
}

/// The enum value for `value`, or `None` (and a violation) when it is not
/// one the contract defines.
fn known<E: TryFrom<i32>>(v: &mut Violations, field: &str, value: i32) -> Option<E> {
    let known = E::try_from(value).ok();
    if known.is_none() {
        v.add(field, format!("unknown value {value}"));
    }
    known
}

/// A service's role with UNSPECIFIED read as MAIN; `None` for unknown values.
fn effective_role(spec: &ServiceSpec) -> Option<ServiceRole> {
    match ServiceRole::try_from(spec.role).ok()? {
        ServiceRole::Unspecified => Some(ServiceRole::Main),
        role => Some(role),
    }
}

fn role_name(role: Option<ServiceRole>) -> &'static str {
    match role {
        Some(ServiceRole::Init) => "INIT",
        Some(ServiceRole::Sidecar) => "SIDECAR",
        Some(ServiceRole::Main | ServiceRole::Unspecified) => "MAIN",
        None => "of unknown role",
    }
}

/// Why `k` is not a valid label key, phrased to follow "key".
pub(crate) fn label_key_problem(k: &str) -> Option<String> {
    if k.is_empty() {
        return Some("must not be empty".to_owned());
    }
    let (prefix, name) = match k.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, k),
    };
    if name.contains('/') {
        return Some("must contain at most one '/'".to_owned());
    }
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Some(format!(
            "prefix must be a DNS subdomain (lowercase letters, digits, '-' and '.') of at most \
             {DNS_SUBDOMAIN_MAX} characters"
        ));
    }
    if name.is_empty() {
        return Some("name must not be empty".to_owned());
    }
    let len = name.chars().count();
    if len > LABEL_NAME_MAX {
        return Some(format!(
            "name must be at most {LABEL_NAME_MAX} characters, got {len}"
        ));
    }
    if !is_label_text(name) {
        return Some(format!("name {LABEL_CHARS}"));
    }
    None
}

/// Why `value` is not a valid label value, phrased to follow "value".
pub(crate) fn label_value_problem(value: &str) -> Option<String> {
    let len = value.chars().count();
    if len > LABEL_VALUE_MAX {
        return Some(format!(
            "must be at most {LABEL_VALUE_MAX} characters, got {len}"
        ));
    }
    if !value.is_empty() && !is_label_text(value) {
        return Some(LABEL_CHARS.to_owned());
    }
    None
}

/// Non-empty `[A-Za-z0-9._-]*` starting and ending with a letter or digit.
fn is_label_text(s: &str) -> bool {
    let bytes = s.as_bytes();
    let ends_ok = match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => first.is_ascii_alphanumeric() && last.is_ascii_alphanumeric(),
        _ => false,
    };
    ends_ok
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= DNS_SUBDOMAIN_MAX
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.len() <= DNS_LABEL_MAX
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

/// Why `name` is not a valid environment variable name.
fn env_name_problem(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("must not be empty".to_owned());
    }
    let len = name.chars().count();
    if len > ENV_NAME_MAX {
        return Some(format!(
            "must be at most {ENV_NAME_MAX} characters, got {len}"
        ));
    }
    let mut bytes = name.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !first_ok || !bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Some("must match [A-Za-z_][A-Za-z0-9_]*".to_owned());
    }
    None
}

/// Why `path` is not a relative path staying inside its root.
fn relative_path_problem(path: &str) -> Option<String> {
    if path.starts_with('/') || path.starts_with('\\') {
        Some("must be a relative path".to_owned())
    } else if has_parent_component(path) {
        Some("must not contain a '..' component".to_owned())
    } else {
        None
    }
}

/// Whether some component of `path` (split at `/` or `\`) is `..`.
fn has_parent_component(path: &str) -> bool {
    path.split(['/', '\\']).any(|c| c == "..")
}

fn sorted(map: &HashMap<String, String>) -> Vec<(&String, &String)> {
    let mut entries: Vec<_> = map.iter().collect();
    entries.sort_unstable();
    entries
}

/// Adds one violation per dependency cycle in `edges` (node → the nodes it
/// depends on; self-edges already removed), on the `depends_on` of the
/// cycle's first member in list order, e.g. `dependency cycle: a -> b -> a`.
fn report_cycles<'a>(
    v: &mut Violations,
    field: &str,
    edges: &[Vec<usize>],
    name: impl Fn(usize) -> &'a str,
) {
    for cycle in find_cycles(edges) {
        let mut names: Vec<String> = cycle.iter().map(|&i| name(i).to_owned()).collect();
        names.push(name(cycle[0]).to_owned());
        v.add(
            child(&index(field, cycle[0]), "depends_on"),
            format!("dependency cycle: {}", names.join(" -> ")),
        );
    }
}

/// Dependency cycles of a directed graph, each reported once, rotated to
/// start at its smallest node.
///
/// An iterative depth-first search (no recursion, so no depth limit): every
/// back edge closes exactly one cycle (the path on the stack from its target
/// plus the edge), and distinct back edges give distinct cycles. Every
/// strongly connected component with a cycle has at least one back edge, so
/// no cyclic group goes unreported; cycles made only of tree and cross edges
/// are covered by the report on their component.
fn find_cycles(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnStack,
        Done,
    }
    let mut mark = vec![Mark::New; edges.len()];
    let mut cycles = Vec::new();
    // (node, index of the next edge to follow)
    let mut stack: Vec<(usize, usize)> = Vec::new();
    for root in 0..edges.len() {
        if mark[root] != Mark::New {
            continue;
        }
        mark[root] = Mark::OnStack;
        stack.push((root, 0));
        while let Some(top) = stack.last_mut() {
            let node = top.0;
            let Some(&to) = edges[node].get(top.1) else {
                mark[node] = Mark::Done;
                stack.pop();
                continue;
            };
            top.1 += 1;
            match mark[to] {
                Mark::New => {
                    mark[to] = Mark::OnStack;
                    stack.push((to, 0));
                }
                Mark::OnStack => {
                    if let Some(pos) = stack.iter().position(|&(n, _)| n == to) {
                        let mut cycle: Vec<usize> = stack[pos..].iter().map(|&(n, _)| n).collect();
                        let min_at = (0..cycle.len()).min_by_key(|&i| cycle[i]).unwrap_or(0);
                        cycle.rotate_left(min_at);
                        cycles.push(cycle);
                    }
                }
                Mark::Done => {}
            }
        }
    }
    cycles
}

#[cfg(test)]
mod tests;
