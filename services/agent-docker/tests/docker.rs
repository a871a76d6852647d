//! What the Docker agent does on the real engine beyond the conformance
//! kit: names, labels, aliases, limits, restart policies, volumes per
//! replica, Docker health checks, images that cannot be pulled, Deploy and
//! Rollback through kept generations, a restarted agent finding its
//! workloads, and a missing engine.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{DOCKER_HOST, Sweeper, TESTAPP_IMAGE, docker_config, require_testapp_image, scope};
use ctrlplane_agent::{Provider, ProviderError};
use ctrlplane_agent_docker::{DockerAgent, DockerConfig};
use ctrlplane_proto::provider::v1 as pb;
use serde_json::Value;

fn svc(name: &str, role: pb::ServiceRole, args: &[&str]) -> pb::ServiceSpec {
    pb::ServiceSpec {
        name: name.into(),
        image: TESTAPP_IMAGE.into(),
        role: role as i32,
        command: vec!["/ctrlplane-testapp".into()],
        args: args.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

fn request(
    id: &str,
    kind: pb::WorkloadKind,
    services: Vec<pb::ServiceSpec>,
) -> pb::ProvisionRequest {
    pb::ProvisionRequest {
        instance_id: id.into(),
        tenant_id: "tenant-1".into(),
        name: id.replace('_', "-"),
        kind: kind as i32,
        services,
        labels: HashMap::from([
            ("team".into(), "platform".into()),
            ("ctrlplane.io/managed-by".into(), "bootstrap".into()),
        ]),
    }
}

/// `docker inspect` of one object as JSON.
fn inspect(what: &str, name: &str) -> Value {
    let out = std::process::Command::new("docker")
        .args([what, "inspect", name])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker {what} inspect {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()[0].clone()
}

async fn wait_for(what: &str, mut f: impl AsyncFnMut() -> Result<(), String>) {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match f().await {
            Ok(()) => return,
            Err(last) if Instant::now() > until => panic!("{what}: still {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(150)).await,
        }
    }
}

async fn running_ready(agent: &DockerAgent, id: &str) -> pb::InstanceStatus {
    let mut last = None;
    wait_for(&format!("{id} running and ready"), async || {
        let s = agent.status(id).await.map_err(|e| e.to_string())?;
        let ok = s.state == pb::InstanceState::Running as i32 && s.ready;
        last = Some(s.clone());
        if ok { Ok(()) } else { Err(format!("{s:?}")) }
    })
    .await;
    last.unwrap()
}

/// Provisions `id` as one sleeping main and waits until it runs.
async fn provision_sleeper(agent: &DockerAgent, id: &str) -> pb::InstanceStatus {
    agent
        .provision(request(
            id,
            pb::WorkloadKind::Deployment,
            vec![svc("main", pb::ServiceRole::Main, &["sleep"])],
        ))
        .await
        .unwrap();
    running_ready(agent, id).await
}

fn setup() -> (tempfile::TempDir, String, Sweeper) {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    require_testapp_image();
    let dir = tempfile::tempdir().unwrap();
    let scope = scope();
    let sweeper = Sweeper(scope.clone());
    (dir, scope, sweeper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_are_named_labelled_limited_and_aliased() {
    let (dir, scope, sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_shape";
    let mut main = svc("main", pb::ServiceRole::Main, &["serve"]);
    main.resources = Some(pb::ResourceSpec {
        cpu_millis: 250,
        memory_mb: 64,
        replicas: 2,
        ..Default::default()
    });
    main.ports = vec![pb::PortSpec {
        container: 8080,
        ..Default::default()
    }];
    main.volumes = vec![pb::VolumeSpec {
        name: "data".into(),
        mount_path: "/data".into(),
        ..Default::default()
    }];
    let init = svc("setup", pb::ServiceRole::Init, &["exit", "0"]);
    let r = agent
        .provision(request(id, pb::WorkloadKind::StatefulSet, vec![main, init]))
        .await
        .unwrap();
    assert_eq!(r.provider_ref, format!("{scope}.{id}"));
    assert_eq!(r.service_refs["main"], format!("{scope}.{id}.main.0"));
    let s = running_ready(&agent, id).await;
    assert_eq!(s.services["main"].replicas, 2);
    assert_eq!(s.endpoints.len(), 2, "{s:?}");
    assert_eq!(s.services["setup"].state, pb::InstanceState::Stopped as i32);

    let c = inspect("container", &format!("{scope}.{id}.main.1"));
    let labels = &c["Config"]["Labels"];
    for (k, v) in [
        ("ctrlplane.io/instance", id),
        ("ctrlplane.io/service", "main"),
        ("ctrlplane.io/role", "main"),
        ("ctrlplane.io/replica", "1"),
        ("ctrlplane.io/tenant", "tenant-1"),
        ("ctrlplane.io/agent", "ctrlplane-agent-docker"),
        ("ctrlplane.io/managed-by", "bootstrap"),
        ("team", "platform"),
    ] {
        assert_eq!(labels[k], v, "label {k}: {labels}");
    }
    assert_eq!(c["HostConfig"]["NanoCpus"], 250_000_000);
    assert_eq!(c["HostConfig"]["Memory"], 64 * 1024 * 1024);
    assert_eq!(c["HostConfig"]["RestartPolicy"]["Name"], "unless-stopped");
    let aliases = &c["NetworkSettings"]["Networks"][format!("{scope}.{id}")]["Aliases"];
    assert!(
        aliases.as_array().unwrap().iter().any(|a| a == "main"),
        "aliases: {aliases}"
    );
    // A volume per replica (stateful_set), labelled with the instance.
    let v = inspect("volume", &format!("{scope}.{id}.main.data.1"));
    assert_eq!(v["Labels"]["ctrlplane.io/instance"], id);
    let init = inspect("container", &format!("{scope}.{id}.setup.0"));
    assert_eq!(init["HostConfig"]["RestartPolicy"]["Name"], "no");

    // Deprovision leaves nothing of the instance.
    assert!(agent.deprovision(id).await.unwrap().existed);
    for kind in ["container", "network", "volume"] {
        assert!(
            sweeper.list(kind).is_empty(),
            "{kind}s left: {:?}",
            sweeper.list(kind)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_health_checks_are_docker_health_checks() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_health";
    let mut main = svc("main", pb::ServiceRole::Main, &["sleep"]);
    main.health_check = Some(pb::HealthCheckSpec {
        command: vec!["/ctrlplane-testapp".into(), "exit".into(), "0".into()],
        interval: Some(ctrlplane_proto::pbjson_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        r#type: pb::HealthCheckType::Command as i32,
        ..Default::default()
    });
    agent
        .provision(request(id, pb::WorkloadKind::Deployment, vec![main]))
        .await
        .unwrap();
    running_ready(&agent, id).await;
    let c = inspect("container", &format!("{scope}.{id}.main.0"));
    assert_eq!(c["State"]["Health"]["Status"], "healthy", "{}", c["State"]);
    assert_eq!(
        c["Config"]["Healthcheck"]["Test"],
        serde_json::json!(["CMD", "/ctrlplane-testapp", "exit", "0"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_is_a_clear_error_and_creates_nothing() {
    let (dir, scope, sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let mut main = svc("main", pb::ServiceRole::Main, &["sleep"]);
    main.image = "ctrlplane-no-such-image:never".into();
    let err = agent
        .provision(request(
            "wl_noimage",
            pb::WorkloadKind::Deployment,
            vec![main],
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::FailedPrecondition(_)),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("ctrlplane-no-such-image:never"),
        "{err}"
    );
    for kind in ["container", "network", "volume"] {
        assert!(
            sweeper.list(kind).is_empty(),
            "{kind}s created: {:?}",
            sweeper.list(kind)
        );
    }
    assert!(matches!(
        agent.status("wl_noimage").await,
        Err(ProviderError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_keeps_the_previous_generation_and_rollback_returns_to_it() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_deploy";
    let mut main = svc("main", pb::ServiceRole::Main, &["env"]);
    main.env = HashMap::from([("VERSION".into(), "1".into())]);
    main.resources = Some(pb::ResourceSpec {
        replicas: 2,
        ..Default::default()
    });
    agent
        .provision(request(id, pb::WorkloadKind::Deployment, vec![main]))
        .await
        .unwrap();
    running_ready(&agent, id).await;
    let env_of = |name: &str| {
        inspect("container", name)["Config"]["Env"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .find(|e| e.starts_with("VERSION="))
    };
    let deploy = pb::DeployRequest {
        instance_id: id.into(),
        release_id: "r2".into(),
        services: vec![pb::DeployService {
            name: "main".into(),
            env: HashMap::from([("VERSION".into(), "2".into())]),
            ..Default::default()
        }],
        strategy: 0,
    };
    agent.deploy(deploy.clone()).await.unwrap();
    for r in 0..2 {
        let cur = format!("{scope}.{id}.main.{r}");
        assert_eq!(env_of(&cur).as_deref(), Some("VERSION=2"));
        assert_eq!(
            inspect("container", &cur)["Config"]["Labels"]["ctrlplane.io/release"],
            "r2"
        );
        assert_eq!(env_of(&format!("{cur}.prev")).as_deref(), Some("VERSION=1"));
    }
    let s = running_ready(&agent, id).await;
    assert_eq!(s.metadata["release"], "r2");
    // Unknown services are NOT_FOUND; an earlier release needs Rollback.
    let mut unknown = deploy.clone();
    unknown.services[0].name = "nope".into();
    assert!(matches!(
        agent.deploy(unknown).await,
        Err(ProviderError::NotFound(_))
    ));

    let rb = agent
        .rollback(pb::RollbackRequest {
            instance_id: id.into(),
            release_id: String::new(),
        })
        .await
        .unwrap();
    assert_eq!(rb.release_id, "initial");
    // Naming the release again (a retry) changes nothing more; a release
    // that is not kept is refused.
    let again = agent
        .rollback(pb::RollbackRequest {
            instance_id: id.into(),
            release_id: "initial".into(),
        })
        .await
        .unwrap();
    assert_eq!(again.release_id, "initial");
    let err = agent
        .rollback(pb::RollbackRequest {
            instance_id: id.into(),
            release_id: "r0".into(),
        })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not kept"), "{err}");
    for r in 0..2 {
        assert_eq!(
            env_of(&format!("{scope}.{id}.main.{r}")).as_deref(),
            Some("VERSION=1")
        );
    }
    // Release ids are not reused for other content: the current one…
    let mut again = deploy;
    again.release_id = "initial".into();
    again.services[0].env = HashMap::from([("VERSION".into(), "3".into())]);
    let err = agent.deploy(again.clone()).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::FailedPrecondition(_)),
        "{err:?}"
    );
    // …nor the previous one (that is Rollback's job).
    again.release_id = "r2".into();
    let err = agent.deploy(again).await.unwrap_err();
    assert!(err.to_string().contains("Rollback"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_agent_finds_the_workloads_from_the_engine_alone() {
    let (dir, scope, _sweeper) = setup();
    let first = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_restart";
    let before = provision_sleeper(&first, id).await;
    drop(first);
    // Another agent of the same scope, with a fresh state dir.
    let other_dir = tempfile::tempdir().unwrap();
    let second = DockerAgent::new(docker_config(other_dir.path(), &scope));
    second.start().await;
    let listed = second.list_managed(100, "").await.unwrap();
    assert_eq!(listed.workloads.len(), 1);
    let w = &listed.workloads[0];
    assert_eq!(w.instance_id, id);
    assert_eq!(w.tenant_id, "tenant-1");
    assert_eq!(w.labels.get("team").map(String::as_str), Some("platform"));
    let after = running_ready(&second, id).await;
    assert_eq!(
        after.started_at, before.started_at,
        "the workload was restarted"
    );
    // Another scope sees none of it.
    let stranger = DockerAgent::new(docker_config(other_dir.path(), &format!("{scope}-x")));
    assert!(
        stranger
            .list_managed(100, "")
            .await
            .unwrap()
            .workloads
            .is_empty()
    );
    assert!(matches!(
        stranger.status(id).await,
        Err(ProviderError::NotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_engine_is_unhealthy_and_unavailable_not_a_panic() {
    ctrlplane_runtime::telemetry::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let agent = DockerAgent::new(DockerConfig::new(
        "unix:///nonexistent/docker.sock",
        dir.path(),
    ));
    agent.start().await;
    let h = agent.check_health().await.unwrap();
    assert!(!h.healthy);
    assert!(
        h.message
            .contains("no Docker engine at unix:///nonexistent/docker.sock"),
        "{h:?}"
    );
    let err = agent.status("wl_x").await.unwrap_err();
    assert!(matches!(err, ProviderError::Unavailable(_)), "{err:?}");
    // The real engine, for contrast.
    let ok = DockerAgent::new(DockerConfig::new(DOCKER_HOST, dir.path()));
    assert!(ok.check_health().await.unwrap().healthy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_changes_limits_replica_by_replica_and_counts() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_scale";
    let mut main = svc("main", pb::ServiceRole::Main, &["sleep"]);
    main.resources = Some(pb::ResourceSpec {
        memory_mb: 32,
        ..Default::default()
    });
    agent
        .provision(request(id, pb::WorkloadKind::Deployment, vec![main]))
        .await
        .unwrap();
    running_ready(&agent, id).await;
    let s = agent
        .scale(pb::ScaleRequest {
            instance_id: id.into(),
            service_name: String::new(),
            resources: Some(pb::ResourceSpec {
                memory_mb: 48,
                replicas: 2,
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(s.services["main"].replicas, 2, "{s:?}");
    for r in 0..2 {
        let c = inspect("container", &format!("{scope}.{id}.main.{r}"));
        assert_eq!(c["HostConfig"]["Memory"], 48 * 1024 * 1024, "replica {r}");
    }
    // The replaced replica 0 is kept as its previous generation.
    let prev = inspect("container", &format!("{scope}.{id}.main.0.prev"));
    assert_eq!(prev["HostConfig"]["Memory"], 32 * 1024 * 1024);
    running_ready(&agent, id).await;
    // Init services cannot be scaled; unknown services are NOT_FOUND.
    let err = agent
        .scale(pb::ScaleRequest {
            instance_id: id.into(),
            service_name: "nope".into(),
            resources: Some(pb::ResourceSpec {
                replicas: 3,
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::NotFound(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_cut_short_by_a_crash_is_repaired_at_start() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_repair";
    provision_sleeper(&agent, id).await;
    drop(agent);
    // What a crash between "rename to .prev" and "create the new one"
    // leaves: only the stopped previous generation.
    let name = format!("{scope}.{id}.main.0");
    for args in [
        vec!["stop", "-t", "1", name.as_str()],
        vec!["rename", name.as_str(), &format!("{name}.prev")],
    ] {
        let out = std::process::Command::new("docker")
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    agent.start().await;
    let s = running_ready(&agent, id).await;
    assert_eq!(s.services["main"].replicas, 1, "{s:?}");
    assert_eq!(inspect("container", &name)["State"]["Running"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_the_engine_refuses_is_failed_with_its_reason() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    // Two replicas on one fixed host port: the second cannot start.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut main = svc("main", pb::ServiceRole::Main, &["serve"]);
    main.ports = vec![pb::PortSpec {
        container: 8080,
        host: i32::from(port),
        ..Default::default()
    }];
    main.resources = Some(pb::ResourceSpec {
        replicas: 2,
        ..Default::default()
    });
    agent
        .provision(request("wl_port", pb::WorkloadKind::Deployment, vec![main]))
        .await
        .unwrap();
    let s = agent.status("wl_port").await.unwrap();
    assert_eq!(s.state, pb::InstanceState::Failed as i32, "{s:?}");
    assert!(s.message.starts_with("start failed:"), "{s:?}");
    assert!(s.message.contains(&port.to_string()), "{s:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deploy_retried_after_a_partial_rollout_finishes_it() {
    let (dir, scope, _sweeper) = setup();
    let agent = DockerAgent::new(docker_config(dir.path(), &scope));
    let id = "wl_retry";
    let mut main = svc("main", pb::ServiceRole::Main, &["sleep"]);
    main.resources = Some(pb::ResourceSpec {
        replicas: 2,
        ..Default::default()
    });
    agent
        .provision(request(id, pb::WorkloadKind::Deployment, vec![main]))
        .await
        .unwrap();
    running_ready(&agent, id).await;
    let deploy = pb::DeployRequest {
        instance_id: id.into(),
        release_id: "r2".into(),
        services: vec![pb::DeployService {
            name: "main".into(),
            env: HashMap::from([("VERSION".into(), "2".into())]),
            ..Default::default()
        }],
        strategy: 0,
    };
    agent.deploy(deploy.clone()).await.unwrap();
    // Undo replica 1 by hand, as if the rollout had stopped after replica 0.
    let r1 = format!("{scope}.{id}.main.1");
    for args in [
        vec!["rm", "-f", r1.as_str()],
        vec!["rename", &format!("{r1}.prev"), r1.as_str()],
        vec!["start", r1.as_str()],
    ] {
        let out = std::process::Command::new("docker")
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(
        inspect("container", &r1)["Config"]["Labels"]["ctrlplane.io/release"],
        "initial"
    );
    // The same Deploy again finishes the rollout.
    agent.deploy(deploy).await.unwrap();
    for r in 0..2 {
        assert_eq!(
            inspect("container", &format!("{scope}.{id}.main.{r}"))["Config"]["Labels"]["ctrlplane.io/release"],
            "r2",
            "replica {r}"
        );
    }
    running_ready(&agent, id).await;
}
