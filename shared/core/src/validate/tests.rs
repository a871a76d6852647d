//! Unit tests of the validation rules: each rule with a failing and a
//! passing case, exact field paths, and dependency cycle detection.

use super::*;
use ctrlplane_proto::provider::v1::ResourceSpec;

fn run(f: impl FnOnce(&mut Violations)) -> Vec<(String, String)> {
    let mut v = Violations::new();
    f(&mut v);
    v.into_vec()
        .into_iter()
        .map(|f| (f.field, f.description))
        .collect()
}

fn fields(f: impl FnOnce(&mut Violations)) -> Vec<String> {
    run(f).into_iter().map(|(field, _)| field).collect()
}

/// Asserts exactly one violation, on `field`, whose description contains
/// `needle`.
#[track_caller]
fn one(got: Vec<(String, String)>, field: &str, needle: &str) {
    assert_eq!(got.len(), 1, "{got:#?}");
    assert_eq!(got[0].0, field, "{got:#?}");
    assert!(got[0].1.contains(needle), "{:?} lacks {needle:?}", got[0].1);
}

fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn svc(name: &str) -> ServiceSpec {
    ServiceSpec {
        name: name.into(),
        image: "registry.example.com/app:1".into(),
        ..Default::default()
    }
}

fn with_role(name: &str, role: ServiceRole) -> ServiceSpec {
    ServiceSpec {
        role: role as i32,
        ..svc(name)
    }
}

fn depends(mut s: ServiceSpec, deps: &[&str]) -> ServiceSpec {
    s.depends_on = deps.iter().map(|d| d.to_string()).collect();
    s
}

/// Validates a single main service after `edit`.
fn one_service(edit: impl FnOnce(&mut ServiceSpec)) -> Vec<(String, String)> {
    let mut s = svc("app");
    edit(&mut s);
    run(|v| service_specs(v, "s", &[s]))
}

fn bws(name: &str) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        name: name.into(),
        kind: WorkloadKind::Deployment as i32,
        replicas: 1,
        services: vec![svc("main")],
        ..Default::default()
    }
}

fn bws_deps(name: &str, deps: &[&str]) -> BootstrapServiceSpec {
    BootstrapServiceSpec {
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        ..bws(name)
    }
}

fn secs(seconds: i64, nanos: i32) -> Option<Duration> {
    Some(Duration { seconds, nanos })
}

// ---------------------------------------------------------------- dns_label

#[test]
fn dns_label_valid() {
    for ok in ["a", "a-1", "0", "frankfurt-1-main", &"a".repeat(63)] {
        assert!(run(|v| dns_label(v, "name", ok)).is_empty(), "{ok}");
    }
}

#[test]
fn dns_label_invalid() {
    one(run(|v| dns_label(v, "name", "")), "name", "is required");
    one(run(|v| dns_label(v, "name", "Ab")), "name", "lowercase");
    one(run(|v| dns_label(v, "name", "a_b")), "name", "lowercase");
    one(run(|v| dns_label(v, "name", "a.b")), "name", "lowercase");
    one(run(|v| dns_label(v, "name", "-a")), "name", "start and end");
    one(run(|v| dns_label(v, "name", "a-")), "name", "start and end");
    one(
        run(|v| dns_label(v, "name", &"a".repeat(64))),
        "name",
        "at most 63 characters, got 64",
    );
    // Every failing rule is reported.
    assert_eq!(
        run(|v| dns_label(v, "name", &format!("-{}X", "a".repeat(70)))).len(),
        3
    );
    assert_eq!(run(|v| dns_label(v, "name", "-A-")).len(), 2);
}

// ------------------------------------------------------------------- labels

#[test]
fn labels_valid() {
    let ok = map(&[
        ("team", "infra"),
        ("example.com/tier", "gold"),
        ("a.b_c-D", ""),
        ("k", "Gold.1_x-Y"),
        (&"k".repeat(63), &"v".repeat(63)),
    ]);
    assert!(run(|v| labels(v, "labels", &ok)).is_empty());
}

#[test]
fn labels_invalid_keys() {
    let long_prefix = format!("{}.com/x", "a".repeat(250));
    for (k, needle) in [
        ("", "key must not be empty"),
        ("-a", "key name must consist of"),
        ("a b", "key name must consist of"),
        ("Example.com/x", "key prefix must be a DNS subdomain"),
        ("/x", "key prefix must be a DNS subdomain"),
        ("x/", "key name must not be empty"),
        ("a/b/c", "at most one '/'"),
        (
            &"k".repeat(64),
            "key name must be at most 63 characters, got 64",
        ),
        (&long_prefix, "key prefix must be a DNS subdomain"),
    ] {
        let m = map(&[(k, "v")]);
        one(
            run(|v| labels(v, "dc.labels", &m)),
            &crate::violations::key("dc.labels", k),
            needle,
        );
    }
}

#[test]
fn labels_invalid_values() {
    for (value, needle) in [
        ("a,b", "value must consist of"),
        ("a=b", "value must consist of"),
        ("-a", "value must consist of"),
        ("a.", "value must consist of"),
        ("ü", "value must consist of"),
        (
            &"v".repeat(64),
            "value must be at most 63 characters, got 64",
        ),
    ] {
        let m = map(&[("team", value)]);
        one(
            run(|v| labels(v, "dc.labels", &m)),
            "dc.labels[team]",
            needle,
        );
    }
}

#[test]
fn labels_count_and_both_problems() {
    let many: HashMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    one(
        run(|v| labels(v, "labels", &many)),
        "labels",
        "at most 64 entries, got 65",
    );
    let exactly: HashMap<String, String> = (0..64).map(|i| (format!("k{i}"), "v".into())).collect();
    assert!(run(|v| labels(v, "labels", &exactly)).is_empty());

    let both = map(&[("-k", "-v")]);
    let got = run(|v| labels(v, "labels", &both));
    assert_eq!(got.len(), 2);
    assert!(got[0].1.starts_with("key ") && got[1].1.starts_with("value "));
}

// ----------------------------------------------------------------- metadata

#[test]
fn metadata_rules() {
    let ok = map(&[
        ("anything goes: even spaces/and slashes", &"x".repeat(4096)),
        (&"k".repeat(253), ""),
        ("ünïcødé", "ok"),
    ]);
    assert!(run(|v| metadata(v, "metadata", &ok)).is_empty());

    one(
        run(|v| metadata(v, "m", &map(&[("", "v")]))),
        "m[]",
        "key must not be empty",
    );
    one(
        run(|v| metadata(v, "m", &map(&[("a\nb", "v")]))),
        "m[a\nb]",
        "control characters",
    );
    let long_key = "k".repeat(254);
    let got = run(|v| metadata(v, "m", &map(&[(&long_key, "v")])));
    assert_eq!(got.len(), 1);
    assert!(got[0].1.contains("at most 253 characters, got 254"));
    one(
        run(|v| metadata(v, "m", &map(&[("k", &"x".repeat(4097))]))),
        "m[k]",
        "value must be at most 4096 characters, got 4097",
    );
    let many: HashMap<String, String> = (0..65).map(|i| (format!("k{i}"), "v".into())).collect();
    one(run(|v| metadata(v, "m", &many)), "m", "at most 64 entries");
}

// ------------------------------------------------------------ service list

#[test]
fn a_minimal_service_is_valid() {
    assert!(run(|v| service_specs(v, "s", &[svc("app")])).is_empty());
    // Image may be empty (process backends run commands, not images).
    assert!(one_service(|s| s.image.clear()).is_empty());
}

#[test]
fn service_count() {
    one(
        run(|v| service_specs(v, "s", &[])),
        "s",
        "at least one service",
    );
    let mut many: Vec<ServiceSpec> = (0..33)
        .map(|i| with_role(&format!("s{i}"), ServiceRole::Sidecar))
        .collect();
    many[0].role = ServiceRole::Main as i32;
    one(
        run(|v| service_specs(v, "s", &many)),
        "s",
        "at most 32 services, got 33",
    );
    many.pop();
    assert!(run(|v| service_specs(v, "s", &many)).is_empty());
}

#[test]
fn exactly_one_main() {
    let none = [
        with_role("a", ServiceRole::Sidecar),
        with_role("b", ServiceRole::Init),
    ];
    one(run(|v| service_specs(v, "s", &none)), "s", "found 0");

    let two = [with_role("a", ServiceRole::Main), svc("b")];
    one(
        run(|v| service_specs(v, "s", &two)),
        "s",
        "exactly one MAIN service (role MAIN or unspecified), found 2: \"a\", \"b\"",
    );

    let ok = [
        svc("a"),
        with_role("b", ServiceRole::Sidecar),
        with_role("c", ServiceRole::Init),
    ];
    assert!(run(|v| service_specs(v, "s", &ok)).is_empty());
}

#[test]
fn unknown_enum_values() {
    let got = one_service(|s| {
        s.ports.push(PortSpec {
            container: 80,
            protocol: 9,
            ..Default::default()
        });
        s.volumes.push(VolumeSpec {
            name: "data".into(),
            mount_path: "/data".into(),
            r#type: 9,
            ..Default::default()
        });
        s.health_check = Some(HealthCheckSpec {
            r#type: 9,
            ..Default::default()
        });
        s.secrets.push(SecretRef {
            key: "db".into(),
            r#type: 9,
            ..Default::default()
        });
    });
    let want = [
        "s[0].ports[0].protocol",
        "s[0].volumes[0].type",
        "s[0].health_check.type",
        "s[0].secrets[0].type",
    ];
    assert_eq!(got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(), want);
    assert!(got.iter().all(|g| g.1 == "unknown value 9"));

    // An unknown role is reported, and that service counts as no MAIN.
    let got = run(|v| service_specs(v, "s", &[with_role_raw("a", 7)]));
    assert_eq!(
        got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        ["s[0].role", "s"]
    );
}

fn with_role_raw(name: &str, role: i32) -> ServiceSpec {
    ServiceSpec { role, ..svc(name) }
}

#[test]
fn service_names() {
    let got = run(|v| {
        service_specs(
            v,
            "s",
            &[svc("app"), with_role("Bad_Name", ServiceRole::Sidecar)],
        )
    });
    one(got, "s[1].name", "lowercase");
    let got = run(|v| {
        service_specs(
            v,
            "s",
            &[svc("app"), with_role("app", ServiceRole::Sidecar)],
        )
    });
    one(got, "s[1].name", "duplicate name \"app\" (also s[0])");
    one(one_service(|s| s.name.clear()), "s[0].name", "is required");
}

#[test]
fn image_length() {
    one(
        one_service(|s| s.image = "i".repeat(513)),
        "s[0].image",
        "at most 512 characters, got 513",
    );
    assert!(one_service(|s| s.image = "i".repeat(512)).is_empty());
}

// ------------------------------------------------------------- depends_on

#[test]
fn depends_on_rules() {
    let specs = [
        depends(svc("app"), &["db", "nope", "app", "db", ""]),
        with_role("db", ServiceRole::Sidecar),
    ];
    let got = run(|v| service_specs(v, "s", &specs));
    let want = [
        (
            "s[0].depends_on[1]",
            "names no service of this workload: \"nope\"",
        ),
        ("s[0].depends_on[2]", "a service cannot depend on itself"),
        ("s[0].depends_on[3]", "duplicate entry \"db\""),
        ("s[0].depends_on[4]", "must not be empty"),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
}

#[test]
fn init_services_depend_only_on_inits() {
    let specs = [
        depends(svc("app"), &["migrate", "proxy"]),
        with_role("proxy", ServiceRole::Sidecar),
        depends(
            with_role("migrate", ServiceRole::Init),
            &["wait", "proxy", "app"],
        ),
        with_role("wait", ServiceRole::Init),
    ];
    let got = run(|v| service_specs(v, "s", &specs));
    assert_eq!(got.len(), 3, "{got:#?}");
    assert_eq!(got[0].0, "s[2].depends_on[1]");
    assert!(got[0].1.contains("\"proxy\" is SIDECAR"));
    assert_eq!(got[1].0, "s[2].depends_on[2]");
    assert!(got[1].1.contains("\"app\" is MAIN"));
    // app -> migrate -> app closes a cycle too.
    assert_eq!(
        got[2],
        (
            "s[0].depends_on".into(),
            "dependency cycle: app -> migrate -> app".into()
        )
    );

    let ok = [
        depends(svc("app"), &["migrate"]),
        depends(with_role("migrate", ServiceRole::Init), &["wait"]),
        with_role("wait", ServiceRole::Init),
    ];
    assert!(run(|v| service_specs(v, "s", &ok)).is_empty());
}

#[test]
fn two_cycle() {
    let specs = [
        depends(svc("a"), &["b"]),
        depends(with_role("b", ServiceRole::Sidecar), &["a"]),
    ];
    assert_eq!(
        run(|v| service_specs(v, "s", &specs)),
        [(
            "s[0].depends_on".to_string(),
            "dependency cycle: a -> b -> a".to_string()
        )]
    );
}

#[test]
fn three_cycle_reported_once_from_its_first_member() {
    let specs = [
        with_role("x", ServiceRole::Sidecar),
        depends(with_role("c", ServiceRole::Sidecar), &["a"]),
        depends(svc("a"), &["b"]),
        depends(with_role("b", ServiceRole::Sidecar), &["c"]),
    ];
    assert_eq!(
        run(|v| service_specs(v, "s", &specs)),
        [(
            "s[1].depends_on".to_string(),
            "dependency cycle: c -> a -> b -> c".to_string()
        )]
    );
}

#[test]
fn separate_cycles_are_each_reported() {
    let specs = [
        depends(svc("a"), &["b"]),
        depends(with_role("b", ServiceRole::Sidecar), &["a"]),
        depends(with_role("c", ServiceRole::Sidecar), &["d"]),
        depends(with_role("d", ServiceRole::Sidecar), &["c"]),
    ];
    let got = run(|v| service_specs(v, "s", &specs));
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].1, "dependency cycle: a -> b -> a");
    assert_eq!(
        got[1],
        (
            "s[2].depends_on".into(),
            "dependency cycle: c -> d -> c".into()
        )
    );
}

#[test]
fn self_dependency_is_not_a_cycle_report() {
    let got = run(|v| service_specs(v, "s", &[depends(svc("a"), &["a"])]));
    one(got, "s[0].depends_on[0]", "cannot depend on itself");
}

#[test]
fn diamond_is_fine() {
    let specs = [
        depends(svc("a"), &["b", "c"]),
        depends(with_role("b", ServiceRole::Sidecar), &["d"]),
        depends(with_role("c", ServiceRole::Sidecar), &["d"]),
        with_role("d", ServiceRole::Sidecar),
    ];
    assert!(run(|v| service_specs(v, "s", &specs)).is_empty());
}

#[test]
fn find_cycles_directly() {
    // 0 -> 1 -> 2 -> 0 and 1 -> 0: two back edges, two distinct cycles.
    let edges = vec![vec![1], vec![2, 0], vec![0]];
    let cycles = find_cycles(&edges);
    assert_eq!(cycles, vec![vec![0, 1, 2], vec![0, 1]]);
    // A long chain does not recurse.
    let chain: Vec<Vec<usize>> = (0..100_000)
        .map(|i| {
            if i + 1 < 100_000 {
                vec![i + 1]
            } else {
                vec![0]
            }
        })
        .collect();
    let cycles = find_cycles(&chain);
    assert_eq!(cycles.len(), 1);
    assert_eq!(cycles[0].len(), 100_000);
}

// ---------------------------------------------------------------- resources

#[test]
fn resources() {
    let got = one_service(|s| {
        s.resources = Some(ResourceSpec {
            cpu_millis: -1,
            memory_mb: -2,
            disk_mb: -3,
            replicas: -4,
            gpu: -5,
        })
    });
    assert_eq!(
        got.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        [
            "s[0].resources.cpu_millis",
            "s[0].resources.memory_mb",
            "s[0].resources.disk_mb",
            "s[0].resources.gpu",
            "s[0].resources.replicas",
        ]
    );
    assert!(got.iter().all(|g| g.1.starts_with("must not be negative")));

    one(
        one_service(|s| {
            s.resources = Some(ResourceSpec {
                replicas: 101,
                ..Default::default()
            })
        }),
        "s[0].resources.replicas",
        "at most 100, got 101",
    );
    assert!(
        one_service(|s| {
            s.resources = Some(ResourceSpec {
                cpu_millis: 500,
                memory_mb: 256,
                disk_mb: 1024,
                replicas: 100,
                gpu: 1,
            })
        })
        .is_empty()
    );
}

// ---------------------------------------------------------------------- env

#[test]
fn env_rules() {
    assert!(
        one_service(
            |s| s.env = map(&[("PATH", "/bin"), ("_x1", ""), ("a", &"v".repeat(32 * 1024))])
        )
        .is_empty()
    );
    for (k, needle) in [
        ("1ABC", "name must match"),
        ("A-B", "name must match"),
        ("", "name must not be empty"),
        (&"A".repeat(257), "name must be at most 256 characters"),
    ] {
        let key = k.to_string();
        one(
            one_service(|s| s.env = map(&[(&key, "v")])),
            &crate::violations::key("s[0].env", &key),
            needle,
        );
    }
    one(
        one_service(|s| s.env = map(&[("BIG", &"v".repeat(32 * 1024 + 1))])),
        "s[0].env[BIG]",
        "value must be at most 32768 bytes, got 32769",
    );
    one(
        one_service(|s| s.env = (0..129).map(|i| (format!("V{i}"), String::new())).collect()),
        "s[0].env",
        "at most 128 entries, got 129",
    );
}

// -------------------------------------------------------------------- ports

fn port(container: i32, host: i32, protocol: PortProtocol, name: &str) -> PortSpec {
    PortSpec {
        container,
        host,
        protocol: protocol as i32,
        name: name.into(),
    }
}

#[test]
fn ports_valid() {
    assert!(
        one_service(|s| {
            s.ports = vec![
                port(80, 0, PortProtocol::Unspecified, "http"),
                port(80, 8080, PortProtocol::Udp, ""),
                port(65535, 65535, PortProtocol::Tcp, ""),
                port(1, 0, PortProtocol::Tcp, "x"),
            ]
        })
        .is_empty()
    );
}

#[test]
fn ports_invalid() {
    let got = one_service(|s| {
        s.ports = vec![
            port(0, -1, PortProtocol::Tcp, "Web"),
            port(65536, 65536, PortProtocol::Tcp, ""),
            port(80, 0, PortProtocol::Unspecified, "http"),
            port(80, 0, PortProtocol::Tcp, "http"),
        ]
    });
    let want = [
        ("s[0].ports[0].container", "must be 1-65535, got 0"),
        ("s[0].ports[0].host", "must be 0-65535, got -1"),
        (
            "s[0].ports[0].name",
            "must contain only lowercase letters, digits and '-'",
        ),
        ("s[0].ports[1].container", "must be 1-65535, got 65536"),
        ("s[0].ports[1].host", "must be 0-65535, got 65536"),
        (
            "s[0].ports[3].container",
            "duplicate port 80/tcp (also s[0].ports[2])",
        ),
        (
            "s[0].ports[3].name",
            "duplicate name \"http\" (also s[0].ports[2])",
        ),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );

    let many = (1..=33)
        .map(|p| port(p, 0, PortProtocol::Tcp, ""))
        .collect();
    one(
        one_service(|s| s.ports = many),
        "s[0].ports",
        "at most 32 ports, got 33",
    );
}

// ------------------------------------------------------------------ volumes

fn volume(name: &str, path: &str, size_mb: i32) -> VolumeSpec {
    VolumeSpec {
        name: name.into(),
        mount_path: path.into(),
        size_mb,
        r#type: VolumeType::Persistent as i32,
    }
}

#[test]
fn volumes_rules() {
    assert!(
        one_service(|s| s.volumes = vec![
            volume("data", "/data", 0),
            volume("cache", "/var/cache", 512)
        ])
        .is_empty()
    );
    let got = one_service(|s| {
        s.volumes = vec![
            volume("data", "data", -1),
            volume("data", "/data", 0),
            volume("Cache", "/data", 0),
            volume("logs", "/var/../etc", 0),
            volume("tmp", "", 0),
        ]
    });
    let want = [
        ("s[0].volumes[0].mount_path", "must be an absolute path"),
        ("s[0].volumes[0].size_mb", "must not be negative, got -1"),
        (
            "s[0].volumes[1].name",
            "duplicate name \"data\" (also s[0].volumes[0])",
        ),
        (
            "s[0].volumes[2].name",
            "must contain only lowercase letters, digits and '-'",
        ),
        (
            "s[0].volumes[2].mount_path",
            "duplicate mount path \"/data\" (also s[0].volumes[1])",
        ),
        (
            "s[0].volumes[3].mount_path",
            "must not contain a '..' component",
        ),
        ("s[0].volumes[4].mount_path", "is required"),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
    let many = (0..33)
        .map(|i| volume(&format!("v{i}"), &format!("/v{i}"), 0))
        .collect();
    one(
        one_service(|s| s.volumes = many),
        "s[0].volumes",
        "at most 32 volumes",
    );
}

// ------------------------------------------------------------- health check

fn hc(edit: impl FnOnce(&mut HealthCheckSpec)) -> Vec<(String, String)> {
    let mut check = HealthCheckSpec::default();
    edit(&mut check);
    one_service(|s| s.health_check = Some(check))
}

#[test]
fn health_check_valid() {
    // Inferred HTTP, TCP and COMMAND; explicit types.
    assert!(
        hc(|c| {
            c.path = "/healthz".into();
            c.port = 8080
        })
        .is_empty()
    );
    assert!(hc(|c| c.port = 5432).is_empty());
    assert!(hc(|c| c.command = vec!["pg_isready".into()]).is_empty());
    assert!(
        hc(|c| {
            c.r#type = HealthCheckType::Tcp as i32;
            c.port = 1;
            c.interval = secs(3600, 0);
            c.timeout = secs(0, 500_000_000);
            c.retries = 100;
        })
        .is_empty()
    );
}

#[test]
fn health_check_invalid() {
    one(
        hc(|_| {}),
        "s[0].health_check",
        "cannot tell the check type",
    );
    one(
        hc(|c| c.path = "/healthz".into()),
        "s[0].health_check.port",
        "is required for HTTP checks",
    );
    one(
        hc(|c| {
            c.path = "healthz".into();
            c.port = 80
        }),
        "s[0].health_check.path",
        "must start with \"/\"",
    );
    one(
        hc(|c| {
            c.r#type = HealthCheckType::Http as i32;
            c.port = 80
        }),
        "s[0].health_check.path",
        "is required for HTTP checks",
    );
    one(
        hc(|c| c.r#type = HealthCheckType::Tcp as i32),
        "s[0].health_check.port",
        "is required for TCP checks",
    );
    one(
        hc(|c| c.port = 70000),
        "s[0].health_check.port",
        "must be 1-65535, got 70000",
    );
    one(
        hc(|c| {
            c.r#type = HealthCheckType::Command as i32;
            c.port = 80
        }),
        "s[0].health_check.command",
        "is required for COMMAND checks",
    );
    let got = hc(|c| {
        c.port = 80;
        c.interval = secs(-1, 0);
        c.timeout = secs(3600, 1);
        c.retries = 101;
    });
    let want = [
        ("s[0].health_check.interval", "must not be negative"),
        (
            "s[0].health_check.timeout",
            "must be at most 3600s (one hour)",
        ),
        ("s[0].health_check.retries", "must be 0-100, got 101"),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
    one(
        hc(|c| {
            c.port = 80;
            c.retries = -1
        }),
        "s[0].health_check.retries",
        "must be 0-100, got -1",
    );
    one(
        hc(|c| {
            c.port = 80;
            c.interval = secs(1, -5)
        }),
        "s[0].health_check.interval",
        "is not a valid duration",
    );
    one(
        hc(|c| {
            c.port = 80;
            c.timeout = secs(0, -5)
        }),
        "s[0].health_check.timeout",
        "must not be negative",
    );
}

// ------------------------------------------------------------------ secrets

fn secret(key: &str, kind: SecretType, target: &str) -> SecretRef {
    SecretRef {
        key: key.into(),
        r#type: kind as i32,
        target: target.into(),
    }
}

#[test]
fn secrets_valid() {
    assert!(
        one_service(|s| {
            s.secrets = vec![
                secret("DB_PASSWORD", SecretType::Unspecified, ""),
                secret("db/password", SecretType::Env, "DB_PASSWORD"),
                secret("tls/cert", SecretType::File, "certs/tls.pem"),
                secret("tls.key", SecretType::File, ""),
            ]
        })
        .is_empty()
    );
}

#[test]
fn secrets_invalid() {
    let got = one_service(|s| {
        s.secrets = vec![
            secret("", SecretType::Env, "X"),
            secret(&"k".repeat(254), SecretType::Env, "X"),
            secret("db/password", SecretType::Env, ""),
            secret("k", SecretType::Env, "1BAD"),
            secret("k", SecretType::File, "/etc/passwd"),
            secret("k", SecretType::File, "a/../../b"),
            secret("/abs", SecretType::File, ""),
        ]
    });
    let want = [
        ("s[0].secrets[0].key", "is required"),
        (
            "s[0].secrets[1].key",
            "must be at most 253 characters, got 254",
        ),
        (
            "s[0].secrets[2].key",
            "is used as the environment variable name (target is empty) and must match \
             [A-Za-z_][A-Za-z0-9_]*",
        ),
        (
            "s[0].secrets[3].target",
            "must match [A-Za-z_][A-Za-z0-9_]*",
        ),
        ("s[0].secrets[4].target", "must be a relative path"),
        (
            "s[0].secrets[5].target",
            "must not contain a '..' component",
        ),
        (
            "s[0].secrets[6].key",
            "is used as the file path (target is empty) and must be a relative path",
        ),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
    let many = (0..33)
        .map(|i| secret(&format!("S{i}"), SecretType::Env, ""))
        .collect();
    one(
        one_service(|s| s.secrets = many),
        "s[0].secrets",
        "at most 32 secrets",
    );
}

// ------------------------------------------------------------- config files

fn file(name: &str, path: &str, content: &str) -> ConfigFile {
    ConfigFile {
        name: name.into(),
        path: path.into(),
        format: "yaml".into(),
        content: content.into(),
    }
}

#[test]
fn config_files_rules() {
    assert!(
        one_service(|s| {
            s.config_files = vec![
                file("main", "conf/app.yaml", "a: 1"),
                file("abs", "/etc/app/extra.yaml", &"x".repeat(1024 * 1024)),
            ]
        })
        .is_empty()
    );
    let got = one_service(|s| {
        s.config_files = vec![
            file("", "", ""),
            file("main", "conf/app.yaml", ""),
            file("main", "conf/app.yaml", ""),
            file(&"n".repeat(254), "../escape", ""),
            file("big", "big.txt", &"x".repeat(1024 * 1024 + 1)),
        ]
    });
    let want = [
        ("s[0].config_files[0].name", "is required"),
        ("s[0].config_files[0].path", "is required"),
        (
            "s[0].config_files[2].name",
            "duplicate name \"main\" (also s[0].config_files[1])",
        ),
        (
            "s[0].config_files[2].path",
            "duplicate path \"conf/app.yaml\" (also s[0].config_files[1])",
        ),
        (
            "s[0].config_files[3].name",
            "must be at most 253 characters, got 254",
        ),
        (
            "s[0].config_files[3].path",
            "must not contain a '..' component",
        ),
        (
            "s[0].config_files[4].content",
            "must be at most 1048576 bytes, got 1048577",
        ),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
    let many = (0..33)
        .map(|i| file(&format!("f{i}"), &format!("f{i}"), ""))
        .collect();
    one(
        one_service(|s| s.config_files = many),
        "s[0].config_files",
        "at most 32 config files",
    );
}

// ------------------------------------------------ annotations, command, args

#[test]
fn annotations_use_metadata_rules() {
    assert!(
        one_service(|s| s.annotations = map(&[("note", "free text, = and , allowed")])).is_empty()
    );
    one(
        one_service(|s| s.annotations = map(&[("", "x")])),
        "s[0].annotations[]",
        "key must not be empty",
    );
}

#[test]
fn command_and_args() {
    assert!(
        one_service(|s| {
            s.command = vec!["/bin/app".into(); 256];
            s.args = vec!["a".repeat(4096)];
        })
        .is_empty()
    );
    let got = one_service(|s| {
        s.command = vec!["x".into(); 257];
        s.args = vec!["ok".into(), "a".repeat(4097)];
    });
    let want = [
        ("s[0].command", "must have at most 256 entries, got 257"),
        ("s[0].args[1]", "must be at most 4096 characters, got 4097"),
    ];
    assert_eq!(
        got,
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );
}

// -------------------------------------------------------- bootstrap specs

#[test]
fn bootstrap_spec_valid() {
    let spec = BootstrapServiceSpec {
        labels: map(&[("team", "platform")]),
        depends_on: vec!["cert-manager".into()],
        ..bws("log-shipper")
    };
    assert!(run(|v| bootstrap_spec(v, "b", &spec)).is_empty());
    // Unspecified kind and zero replicas are fine (defaults).
    let spec = BootstrapServiceSpec {
        kind: 0,
        replicas: 0,
        ..bws("x")
    };
    assert!(run(|v| bootstrap_spec(v, "b", &spec)).is_empty());
}

#[test]
fn bootstrap_spec_invalid() {
    let spec = BootstrapServiceSpec {
        name: "Log Shipper".into(),
        kind: 5,
        replicas: 101,
        services: vec![],
        labels: map(&[("team", "a,b")]),
        depends_on: vec!["dns".into(), "dns".into(), "Bad".into()],
    };
    let want = [
        (
            "b.name",
            "must contain only lowercase letters, digits and '-'",
        ),
        ("b.kind", "unknown value 5"),
        ("b.replicas", "must be at most 100, got 101"),
        ("b.services", "at least one service is required"),
        (
            "b.labels[team]",
            "value must consist of letters, digits, '-', '_' and '.', starting and ending with \
             a letter or digit",
        ),
        ("b.depends_on[1]", "duplicate entry \"dns\""),
        (
            "b.depends_on[2]",
            "must contain only lowercase letters, digits and '-'",
        ),
    ];
    assert_eq!(
        run(|v| bootstrap_spec(v, "b", &spec)),
        want.map(|(f, d)| (f.to_string(), d.to_string())).to_vec()
    );

    one(
        run(|v| {
            bootstrap_spec(
                v,
                "b",
                &BootstrapServiceSpec {
                    replicas: -1,
                    ..bws("x")
                },
            )
        }),
        "b.replicas",
        "must not be negative",
    );
    one(
        run(|v| bootstrap_spec(v, "b", &bws_deps("x", &["x"]))),
        "b.depends_on[0]",
        "cannot depend on itself",
    );
    one(
        run(|v| bootstrap_spec(v, "b", &bws_deps("x", &[""]))),
        "b.depends_on[0]",
        "is required",
    );
    let deps: Vec<String> = (0..65).map(|i| format!("d{i}")).collect();
    let spec = BootstrapServiceSpec {
        depends_on: deps,
        ..bws("x")
    };
    one(
        run(|v| bootstrap_spec(v, "b", &spec)),
        "b.depends_on",
        "at most 64 entries",
    );
}

#[test]
fn bootstrap_specs_list() {
    // Unknown dependency names are allowed: hooks may contribute them.
    let ok = [bws_deps("a", &["b", "from-hook"]), bws("b")];
    assert!(run(|v| bootstrap_specs(v, "dc.bootstrap_services", &ok)).is_empty());
    assert!(run(|v| bootstrap_specs(v, "dc.bootstrap_services", &[])).is_empty());

    let dup = [bws("a"), bws("a")];
    one(
        run(|v| bootstrap_specs(v, "l", &dup)),
        "l[1].name",
        "duplicate name \"a\" (also l[0])",
    );

    let many: Vec<_> = (0..65).map(|i| bws(&format!("b{i}"))).collect();
    one(
        run(|v| bootstrap_specs(v, "l", &many)),
        "l",
        "at most 64 bootstrap services, got 65",
    );
}

#[test]
fn bootstrap_cycles() {
    let two = [bws_deps("a", &["b"]), bws_deps("b", &["a"])];
    assert_eq!(
        run(|v| bootstrap_specs(v, "l", &two)),
        [(
            "l[0].depends_on".to_string(),
            "dependency cycle: a -> b -> a".to_string()
        )]
    );
    let three = [
        bws_deps("a", &["b"]),
        bws_deps("b", &["c"]),
        bws_deps("c", &["a", "a"]),
    ];
    let got = run(|v| bootstrap_specs(v, "l", &three));
    assert_eq!(
        got,
        [
            (
                "l[2].depends_on[1]".to_string(),
                "duplicate entry \"a\"".to_string()
            ),
            (
                "l[0].depends_on".to_string(),
                "dependency cycle: a -> b -> c -> a".to_string()
            ),
        ]
    );
    let self_dep = [bws_deps("a", &["a"])];
    one(
        run(|v| bootstrap_specs(v, "l", &self_dep)),
        "l[0].depends_on[0]",
        "cannot depend on itself",
    );
    let diamond = [
        bws_deps("a", &["b", "c"]),
        bws_deps("b", &["d"]),
        bws_deps("c", &["d"]),
        bws("d"),
    ];
    assert!(run(|v| bootstrap_specs(v, "l", &diamond)).is_empty());
}

// ------------------------------------------------------ everything at once

#[test]
fn many_problems_are_all_reported_with_exact_paths() {
    let broken_service = ServiceSpec {
        name: "web".into(),
        role: ServiceRole::Sidecar as i32,
        depends_on: vec!["ghost".into()],
        ports: vec![
            port(80, 0, PortProtocol::Tcp, ""),
            port(0, 0, PortProtocol::Tcp, ""),
        ],
        env: map(&[("BAD-NAME", "x")]),
        health_check: Some(HealthCheckSpec {
            path: "/".into(),
            ..Default::default()
        }),
        ..svc("web")
    };
    let specs = [
        bws("good"),
        BootstrapServiceSpec {
            name: "metrics".into(),
            replicas: -1,
            services: vec![svc("agent"), broken_service, svc("agent")],
            labels: map(&[("tier", "-x"), ("ok", "fine")]),
            depends_on: vec!["good".into(), "metrics".into()],
            ..bws("metrics")
        },
        bws("good"),
    ];
    let got = fields(|v| bootstrap_specs(v, "datacenter.bootstrap_services", &specs));
    let want = [
        "datacenter.bootstrap_services[1].replicas",
        "datacenter.bootstrap_services[1].services[1].env[BAD-NAME]",
        "datacenter.bootstrap_services[1].services[1].ports[1].container",
        "datacenter.bootstrap_services[1].services[1].health_check.port",
        "datacenter.bootstrap_services[1].services[2].name",
        "datacenter.bootstrap_services[1].services",
        "datacenter.bootstrap_services[1].services[1].depends_on[0]",
        "datacenter.bootstrap_services[1].labels[tier]",
        "datacenter.bootstrap_services[1].depends_on[1]",
        "datacenter.bootstrap_services[2].name",
    ];
    assert_eq!(got, want);

    // And the status built from them names every one.
    let mut v = Violations::new();
    bootstrap_specs(&mut v, "datacenter.bootstrap_services", &specs);
    let status = v.to_status();
    let bad = tonic_types::StatusExt::get_details_bad_request(&status).unwrap();
    let status_fields: Vec<_> = bad
        .field_violations
        .iter()
        .map(|f| f.field.clone())
        .collect();
    assert_eq!(status_fields, want);
}
