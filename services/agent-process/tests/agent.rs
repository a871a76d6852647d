//! The process agent's own behaviour beyond the conformance kit: agent
//! restarts (re-adoption, no duplicates, processes that died meanwhile),
//! crash restarts with backoff, SIGKILL after the stop grace, volumes,
//! per-replica volumes of stateful sets, Deprovision cleaning up, ports in
//! env and endpoints, and backend-specific validation.
//!
//! Every test runs real processes (the workspace's `ctrlplane-testapp`),
//! waits by polling with deadlines, and leaves nothing behind: agents are
//! halted on drop and a [`common::Sweeper`] kills whatever is left under the
//! test's state directory.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use common::{Sweeper, TestAgent, agent_config, processes_of, testapp, wait_until};
use ctrlplane_agent_process::supervisor::Backoff;
use ctrlplane_conformance::kit::{self, Kit, call, nanos, text};
use ctrlplane_proto::provider::v1 as pb;
use tonic::Code;

const WAIT: Duration = Duration::from_secs(30);

fn serve(name: &str, role: pb::ServiceRole) -> pb::ServiceSpec {
    let mut s = testapp().service(name, role, &["serve", "--port", "8080"]);
    s.ports = vec![pb::PortSpec {
        container: 8080,
        ..Default::default()
    }];
    s.health_check = Some(pb::HealthCheckSpec {
        path: "/healthz".to_string(),
        port: 8080,
        r#type: pb::HealthCheckType::Http as i32,
        ..Default::default()
    });
    s
}

fn replicas(mut s: pb::ServiceSpec, n: i32) -> pb::ServiceSpec {
    s.resources = Some(pb::ResourceSpec {
        replicas: n,
        ..Default::default()
    });
    s
}

fn service_status<'a>(s: &'a pb::InstanceStatus, name: &str) -> &'a pb::ServiceStatus {
    s.services
        .get(name)
        .unwrap_or_else(|| panic!("no service {name} in {}", kit::brief(s)))
}

fn pids(found: &[common::Found], service: &str) -> BTreeSet<i32> {
    found
        .iter()
        .filter(|p| p.service == service)
        .map(|p| p.pid)
        .collect()
}

async fn exec(k: &Kit, id: &str, service: &str, replica: i32, argv: &[&str]) -> pb::ExecResponse {
    call(k.c().exec(pb::ExecRequest {
        instance_id: id.to_string(),
        service_name: service.to_string(),
        command: argv.iter().map(|a| a.to_string()).collect(),
        replica,
        ..Default::default()
    }))
    .await
    .unwrap_or_else(|e| panic!("Exec {argv:?}: {}", kit::show(&e)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_restart_readopts_workloads_and_reports_the_dead() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let id = "bws_readopt";

    // First agent: two serving replicas and a sidecar.
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    k.provision(k.request(
        id,
        vec![
            replicas(serve("main", pb::ServiceRole::Main), 2),
            testapp().service("side", pb::ServiceRole::Sidecar, &["sleep"]),
        ],
    ))
    .await;
    let before = k.wait_running_ready(id).await;
    let procs = processes_of(dir.path(), id);
    assert_eq!(procs.len(), 3, "{procs:?}");
    let mains = pids(&procs, "main");
    let sides = pids(&procs, "side");
    assert!(
        procs.iter().all(|p| p.pgrp == p.pid),
        "each replica leads its own group: {procs:?}"
    );

    // The agent goes away; its workloads stay.
    a.shutdown().await;
    assert_eq!(
        processes_of(dir.path(), id),
        procs,
        "workloads survive the agent"
    );

    // The sidecar dies while no agent watches.
    let side = *sides.iter().next().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(side),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_until("the sidecar to die", WAIT, || {
        pids(&processes_of(dir.path(), id), "side").is_empty()
    })
    .await;

    // Second agent with a long backoff: the death is reported, nothing is
    // restarted yet, and the mains are adopted, not duplicated.
    let mut slow = agent_config(dir.path());
    slow.backoff = Backoff {
        initial: Duration::from_secs(600),
        ..slow.backoff
    };
    let b = TestAgent::start(slow).await;
    let kb = Kit::new(&b.harness(Box::new(())));
    let s = kb
        .wait_status(
            id,
            "the sidecar reported as ended while the agent was down",
            |s| {
                s.services
                    .get("side")
                    .is_some_and(|x| x.message.contains("ended while the agent was down"))
            },
        )
        .await;
    assert_eq!(
        s.state,
        pb::InstanceState::Starting as i32,
        "{}",
        kit::brief(&s)
    );
    assert!(!s.ready, "{}", kit::brief(&s));
    assert_eq!(
        service_status(&s, "side").state,
        pb::InstanceState::Starting as i32
    );
    assert_eq!(
        nanos(s.started_at.as_ref()),
        nanos(before.started_at.as_ref())
    );
    let main = kb
        .wait_status(id, "adopted mains ready", |s| {
            service_status(s, "main").ready_replicas == 2
        })
        .await;
    assert_eq!(service_status(&main, "main").restarts, 0);
    let now = processes_of(dir.path(), id);
    assert_eq!(
        pids(&now, "main"),
        mains,
        "mains were adopted, not restarted"
    );
    assert!(
        pids(&now, "side").is_empty(),
        "nothing restarted during the backoff"
    );
    b.shutdown().await;

    // Third agent with the usual backoff: the sidecar comes back, counted
    // as a restart; still exactly one process per replica.
    let c = TestAgent::start(agent_config(dir.path())).await;
    let kc = Kit::new(&c.harness(Box::new(())));
    let s = kc
        .wait_status(id, "running and ready again", |s| {
            s.state == pb::InstanceState::Running as i32 && s.ready
        })
        .await;
    assert_eq!(service_status(&s, "side").restarts, 1, "{}", kit::brief(&s));
    assert_eq!(service_status(&s, "main").restarts, 0, "{}", kit::brief(&s));
    let now = processes_of(dir.path(), id);
    assert_eq!(now.len(), 3, "no duplicates: {now:?}");
    assert_eq!(pids(&now, "main"), mains);
    assert_ne!(pids(&now, "side"), sides);

    // The adopted processes are still supervised: killing one restarts it.
    let victim = *mains.iter().next().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let s = kc
        .wait_status(id, "the killed main replica restarted", |s| {
            service_status(s, "main").restarts == 1 && s.ready
        })
        .await;
    assert_eq!(s.state, pb::InstanceState::Running as i32);
    let now = processes_of(dir.path(), id);
    assert_eq!(now.len(), 3, "{now:?}");
    assert!(!pids(&now, "main").contains(&victim));

    kc.cleanup().await;
    call(kc.c().deprovision(pb::DeprovisionRequest {
        instance_id: id.to_string(),
    }))
    .await
    .unwrap();
    assert!(processes_of(dir.path(), id).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_instance_stays_stopped_across_an_agent_restart() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let id = "bws_stopped";
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    k.provision(k.request(id, vec![serve("main", pb::ServiceRole::Main)]))
        .await;
    k.wait_running_ready(id).await;
    call(k.c().stop(pb::StopRequest {
        instance_id: id.to_string(),
        grace_period: None,
    }))
    .await
    .unwrap();
    a.shutdown().await;
    let b = TestAgent::start(agent_config(dir.path())).await;
    let kb = Kit::new(&b.harness(Box::new(())));
    let s = kb.status(id).await.unwrap();
    assert_eq!(
        s.state,
        pb::InstanceState::Stopped as i32,
        "{}",
        kit::brief(&s)
    );
    assert!(processes_of(dir.path(), id).is_empty());
    let s = call(kb.c().start(pb::StartRequest {
        instance_id: id.to_string(),
    }))
    .await
    .unwrap();
    assert!(s.status.is_some());
    kb.wait_running_ready(id).await;
    assert_eq!(processes_of(dir.path(), id).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashes_restart_with_growing_backoff_and_a_restart_count() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let mut cfg = agent_config(dir.path());
    cfg.backoff = Backoff {
        initial: Duration::from_millis(200),
        max: Duration::from_millis(800),
        reset_after: Duration::from_secs(30),
    };
    let a = TestAgent::start(cfg).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_crash";
    k.provision(k.request(
        id,
        vec![testapp().service(
            "main",
            pb::ServiceRole::Main,
            &["exit", "1", "--message", "boom"],
        )],
    ))
    .await;
    let s = k
        .wait_status(id, "four restarts", |s| s.restarts >= 4)
        .await;
    assert_ne!(
        s.state,
        pb::InstanceState::Running as i32,
        "{}",
        kit::brief(&s)
    );
    let lines = k
        .wait_logs(id, "main", "five crashes logged", |ls| {
            ls.iter().filter(|l| text(l) == "boom").count() >= 5
        })
        .await;
    let at: Vec<i128> = lines
        .iter()
        .filter(|l| text(l) == "boom")
        .map(|l| nanos(l.timestamp.as_ref()))
        .collect();
    // Delays 200, 400, 800, 800 ms; the lines are stamped when read, so
    // allow for half of each delay being eaten by scheduling jitter.
    for (i, want_ms) in [200i128, 400, 800, 800].into_iter().enumerate() {
        let gap_ms = (at[i + 1] - at[i]) / 1_000_000;
        assert!(
            gap_ms >= want_ms / 2,
            "gap {i} was {gap_ms} ms, expected about {want_ms} ms: {at:?}"
        );
    }
    let s = k
        .wait_status(id, "a message about the restart", |s| {
            service_status(s, "main")
                .message
                .contains("exited with code 1")
        })
        .await;
    assert!(service_status(&s, "main").restarts >= 4);
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_escalates_to_sigkill_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_stubborn";
    k.provision(k.request(
        id,
        vec![testapp().service("main", pb::ServiceRole::Main, &["sleep", "--ignore-term"])],
    ))
    .await;
    k.wait_running_ready(id).await;
    wait_until("the process to run", WAIT, || {
        processes_of(dir.path(), id).len() == 1
    })
    .await;
    let t0 = std::time::Instant::now();
    let r = call(k.c().stop(pb::StopRequest {
        instance_id: id.to_string(),
        grace_period: Some(kit::pb_duration(Duration::from_millis(1500))),
    }))
    .await
    .unwrap();
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "SIGTERM was ignored, so Stop waits the grace: {took:?}"
    );
    let s = r.status.unwrap();
    assert_eq!(
        s.state,
        pb::InstanceState::Stopped as i32,
        "{}",
        kit::brief(&s)
    );
    assert!(processes_of(dir.path(), id).is_empty(), "SIGKILL ended it");

    // A process that honours SIGTERM stops well within a long grace.
    let id2 = "bws_polite";
    k.provision(k.request(id2, vec![serve("main", pb::ServiceRole::Main)]))
        .await;
    k.wait_running_ready(id2).await;
    let t0 = std::time::Instant::now();
    call(k.c().stop(pb::StopRequest {
        instance_id: id2.to_string(),
        grace_period: Some(kit::pb_duration(Duration::from_secs(60))),
    }))
    .await
    .unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert!(processes_of(dir.path(), id2).is_empty());
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volumes_persist_across_stop_and_start() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_volume";
    let mut main = testapp().service("main", pb::ServiceRole::Main, &["sleep"]);
    main.volumes = vec![pb::VolumeSpec {
        name: "data".to_string(),
        mount_path: "/var/lib/data".to_string(),
        ..Default::default()
    }];
    k.provision(k.request(id, vec![main])).await;
    k.wait_running_ready(id).await;
    let r = exec(
        &k,
        id,
        "main",
        0,
        &[
            "sh",
            "-c",
            "echo kept > \"$CP_VOLUME_DATA/file\" && echo $CP_VOLUME_DATA",
        ],
    )
    .await;
    assert_eq!(r.exit_code, 0, "{r:?}");
    let path = String::from_utf8(r.stdout).unwrap().trim().to_string();
    assert!(
        path.ends_with("instances/bws_volume/volumes/data"),
        "{path}"
    );

    call(k.c().stop(pb::StopRequest {
        instance_id: id.to_string(),
        grace_period: None,
    }))
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("{path}/file")).unwrap(),
        "kept\n"
    );
    call(k.c().start(pb::StartRequest {
        instance_id: id.to_string(),
    }))
    .await
    .unwrap();
    k.wait_running_ready(id).await;
    let r = exec(
        &k,
        id,
        "main",
        0,
        &["sh", "-c", "cat \"$CP_VOLUME_DATA/file\""],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "kept\n");
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stateful_sets_get_a_volume_per_replica_kept_when_scaled_down() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_stateful";
    let mut main = replicas(
        testapp().service("main", pb::ServiceRole::Main, &["sleep"]),
        2,
    );
    main.volumes = vec![pb::VolumeSpec {
        name: "data".to_string(),
        mount_path: "/data".to_string(),
        ..Default::default()
    }];
    let mut req = k.request(id, vec![main]);
    req.kind = pb::WorkloadKind::StatefulSet as i32;
    k.provision(req).await;
    k.wait_running_ready(id).await;
    let mut dirs = Vec::new();
    for r in 0..2 {
        let out = exec(
            &k,
            id,
            "main",
            r,
            &[
                "sh",
                "-c",
                "echo replica-$CP_REPLICA > \"$CP_VOLUME_DATA/who\"; echo $CP_VOLUME_DATA",
            ],
        )
        .await;
        let d = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert!(d.ends_with(&format!("volumes/data-{r}")), "{d}");
        dirs.push(d);
    }
    assert_eq!(
        std::fs::read_to_string(format!("{}/who", dirs[1])).unwrap(),
        "replica-1\n"
    );
    let s = call(k.c().scale(pb::ScaleRequest {
        instance_id: id.to_string(),
        service_name: "main".to_string(),
        resources: Some(pb::ResourceSpec {
            replicas: 1,
            ..Default::default()
        }),
    }))
    .await
    .unwrap()
    .status
    .unwrap();
    assert_eq!(service_status(&s, "main").replicas, 1);
    wait_until("one replica left", WAIT, || {
        processes_of(dir.path(), id).len() == 1
    })
    .await;
    assert_eq!(
        std::fs::read_to_string(format!("{}/who", dirs[1])).unwrap(),
        "replica-1\n",
        "a removed replica's volume stays for when it comes back"
    );
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_removes_processes_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_gone";
    let mut main = replicas(serve("main", pb::ServiceRole::Main), 2);
    main.config_files = vec![pb::ConfigFile {
        name: "conf".to_string(),
        path: "conf/app.yaml".to_string(),
        content: "a: 1\n".to_string(),
        ..Default::default()
    }];
    main.volumes = vec![pb::VolumeSpec {
        name: "data".to_string(),
        mount_path: "/data".to_string(),
        ..Default::default()
    }];
    let side = testapp().service(
        "side",
        pb::ServiceRole::Sidecar,
        &["sleep", "--ignore-term"],
    );
    k.provision(k.request(id, vec![main, side])).await;
    k.wait_running_ready(id).await;
    let root = dir.path().join("instances").join(id);
    assert!(root.join("conf/app.yaml").is_file());
    assert!(root.join("volumes/data").is_dir());
    assert_eq!(processes_of(dir.path(), id).len(), 3);

    let r = call(k.c().deprovision(pb::DeprovisionRequest {
        instance_id: id.to_string(),
    }))
    .await
    .unwrap();
    assert!(r.existed);
    assert!(
        processes_of(dir.path(), id).is_empty(),
        "every process group was killed"
    );
    assert!(!root.exists(), "the instance root was removed");
    assert!(
        !dir.path()
            .join("records")
            .join(format!("{id}.json"))
            .exists()
    );
    assert_eq!(a.agent.process_groups(), 0);
    let err = k.status(id).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let again = call(k.c().deprovision(pb::DeprovisionRequest {
        instance_id: id.to_string(),
    }))
    .await
    .unwrap();
    assert!(!again.existed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_are_handed_in_env_and_reported_as_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_ports";
    let mut main = replicas(
        testapp().service("main", pb::ServiceRole::Main, &["env"]),
        2,
    );
    main.ports = vec![
        pb::PortSpec {
            container: 8080,
            ..Default::default()
        },
        pb::PortSpec {
            container: 9000,
            name: "admin".to_string(),
            ..Default::default()
        },
    ];
    let resp = k.provision(k.request(id, vec![main])).await;
    assert_eq!(resp.endpoints.len(), 4, "{:?}", resp.endpoints);
    let hosts: BTreeSet<i32> = resp.endpoints.iter().map(|e| e.port).collect();
    assert_eq!(hosts.len(), 4, "distinct host ports: {:?}", resp.endpoints);
    assert!(
        resp.endpoints
            .iter()
            .all(|e| e.host == "127.0.0.1" && e.port > 0)
    );
    let admin = resp
        .endpoints
        .iter()
        .find(|e| e.port_name == "admin" && e.replica == 1)
        .expect("named port endpoint");
    assert_eq!(admin.container_port, 9000);

    let lines = k
        .wait_logs(id, "main", "both replicas' environment", |ls| {
            ls.iter()
                .filter(|l| text(l).starts_with("CP_PORT_8080="))
                .count()
                >= 2
        })
        .await;
    for replica in 0..2 {
        let env: HashMap<&str, &str> = lines
            .iter()
            .filter(|l| l.replica == replica)
            .filter_map(|l| text(l).split_once('='))
            .collect();
        let port_of = |container: i32| {
            resp.endpoints
                .iter()
                .find(|e| e.replica == replica && e.container_port == container)
                .unwrap()
                .port
                .to_string()
        };
        assert_eq!(
            env.get("CP_PORT_8080").copied(),
            Some(port_of(8080).as_str())
        );
        assert_eq!(
            env.get("CP_PORT_9000").copied(),
            Some(port_of(9000).as_str())
        );
        assert_eq!(env.get("PORT").copied(), Some(port_of(8080).as_str()));
        assert_eq!(
            env.get("CP_REPLICA").copied(),
            Some(replica.to_string().as_str())
        );
        assert!(
            !env.contains_key("CP_AUTH_SECRET"),
            "the agent's secrets do not leak"
        );
    }
    let s = k.status(id).await.unwrap();
    assert_eq!(s.endpoints.len(), 4);
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_specific_requests_are_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let mut no_command = testapp().service("main", pb::ServiceRole::Main, &["serve"]);
    no_command.command.clear();
    let mut absolute = testapp().service("side", pb::ServiceRole::Sidecar, &["sleep"]);
    absolute.config_files = vec![pb::ConfigFile {
        name: "c".to_string(),
        path: "/etc/app.yaml".to_string(),
        ..Default::default()
    }];
    let r = call(
        k.c()
            .provision(k.request("bws_bad", vec![no_command, absolute])),
    )
    .await;
    kit::expect_invalid(
        "no command and an absolute config path",
        r,
        &["services[0].command", "services[1].config_files[0].path"],
    );
    let listed = k.list_managed(100).await;
    assert!(listed.is_empty(), "nothing was created: {listed:?}");
    assert!(!dir.path().join("instances/bws_bad").exists());

    // A secret that does not exist is the operator's to provide.
    let mut secretive = testapp().service("main", pb::ServiceRole::Main, &["sleep"]);
    secretive.secrets = vec![pb::SecretRef {
        key: "DB_PASSWORD".to_string(),
        ..Default::default()
    }];
    let err = call(
        k.c()
            .provision(k.request("bws_secret", vec![secretive.clone()])),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", kit::show(&err));
    assert!(err.message().contains("DB_PASSWORD"), "{}", err.message());
    std::fs::write(a.agent.state_dir().join("secrets/DB_PASSWORD"), "hunter2\n").unwrap();
    k.provision(k.request("bws_secret", vec![secretive])).await;
    k.wait_running_ready("bws_secret").await;
    let r = exec(&k, "bws_secret", "main", 0, &["printenv", "DB_PASSWORD"]).await;
    assert!(
        String::from_utf8_lossy(&r.stdout).contains("hunter2"),
        "{r:?}"
    );
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_rollback_restart_one_service_and_exec_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_releases";
    let mut main = testapp().service("main", pb::ServiceRole::Main, &["env"]);
    main.env = HashMap::from([("VERSION".to_string(), "1".to_string())]);
    k.provision(k.request(id, vec![main])).await;
    let first = k.wait_running_ready(id).await;
    assert_eq!(
        first.metadata.get("release").map(String::as_str),
        Some("initial")
    );
    let count =
        |ls: &[pb::StreamLogsResponse], line: &str| ls.iter().filter(|l| text(l) == line).count();

    let deploy = |release: &str, version: &str| pb::DeployRequest {
        instance_id: id.to_string(),
        release_id: release.to_string(),
        services: vec![pb::DeployService {
            name: "main".to_string(),
            env: HashMap::from([("VERSION".to_string(), version.to_string())]),
            ..Default::default()
        }],
        strategy: pb::DeployStrategy::Rolling as i32,
    };
    let r = call(k.c().deploy(deploy("r2", "2"))).await.unwrap();
    assert_eq!(r.release_id, "r2");
    k.wait_logs(id, "main", "the new release's env", |ls| {
        count(ls, "VERSION=2") == 1
    })
    .await;
    let pid_r2 = processes_of(dir.path(), id);
    assert_eq!(pid_r2.len(), 1);

    let r = call(k.c().rollback(pb::RollbackRequest {
        instance_id: id.to_string(),
        release_id: String::new(),
    }))
    .await
    .unwrap();
    assert_eq!(r.release_id, "initial");
    k.wait_logs(id, "main", "the old env again", |ls| {
        count(ls, "VERSION=1") == 2
    })
    .await;
    let err = call(k.c().deploy(deploy("r2", "2"))).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{}", kit::show(&err));

    // Restarting one service replaces its process; the run goes on.
    let before = k.wait_running_ready(id).await;
    let old = processes_of(dir.path(), id);
    call(k.c().restart(pb::RestartRequest {
        instance_id: id.to_string(),
        service_name: "main".to_string(),
    }))
    .await
    .unwrap();
    let after = k.wait_running_ready(id).await;
    let new = processes_of(dir.path(), id);
    assert_eq!(new.len(), 1);
    assert_ne!(new, old);
    assert_eq!(
        nanos(after.started_at.as_ref()),
        nanos(before.started_at.as_ref())
    );

    // Exec is bounded by its timeout and leaves nothing behind.
    let err = call(k.c().exec(pb::ExecRequest {
        instance_id: id.to_string(),
        service_name: "main".to_string(),
        command: vec![testapp().program, "sleep".to_string()],
        timeout: Some(kit::pb_duration(Duration::from_millis(300))),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{}", kit::show(&err));
    wait_until("the exec'd process to be gone", WAIT, || {
        processes_of(dir.path(), id).len() == 1
    })
    .await;
    k.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_health_checks_drive_ready() {
    let dir = tempfile::tempdir().unwrap();
    let _sweep = Sweeper(dir.path().to_path_buf());
    let a = TestAgent::start(agent_config(dir.path())).await;
    let k = Kit::new(&a.harness(Box::new(())));
    let id = "bws_cmdcheck";
    let mut main = testapp().service("main", pb::ServiceRole::Main, &["sleep"]);
    main.health_check = Some(pb::HealthCheckSpec {
        r#type: pb::HealthCheckType::Command as i32,
        command: vec!["test".to_string(), "-f".to_string(), "ready".to_string()],
        interval: Some(kit::pb_duration(Duration::from_millis(200))),
        retries: 1,
        ..Default::default()
    });
    k.provision(k.request(id, vec![main])).await;
    let s = k.wait_running(id).await;
    assert!(!s.ready, "no ready file yet: {}", kit::brief(&s));
    exec(&k, id, "main", 0, &["touch", "ready"]).await;
    k.wait_running_ready(id).await;
    exec(&k, id, "main", 0, &["rm", "ready"]).await;
    k.wait_status(id, "unready once the check fails", |s| !s.ready)
        .await;
    k.cleanup().await;
}
