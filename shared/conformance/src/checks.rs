//! The conformance checks, one `pub async fn` per property of the
//! protocol (numbered as in the contract). Each takes a fresh agent
//! ([`Harness`]), provisions its own instances (ids `bws_conf_<check>`),
//! asserts real outcomes — processes answering on their endpoints, lines in
//! their logs, exit codes — and cleans up through [`run_check`].

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use ctrlplane_agent::Capability;
use ctrlplane_proto::provider::v1 as pb;
use ctrlplane_proto::provider::v1::ServiceRole;
use ctrlplane_proto::provider::v1::provider_service_client::ProviderServiceClient;
use ctrlplane_runtime::auth::{Authenticator, Claims, ROLE_SERVICE};
use ctrlplane_runtime::client::{BearerInterceptor, authed_channel, channel};
use futures::StreamExt;
use tonic::Code;

use crate::Harness;
use crate::kit::*;

/// `serve` main with its HTTP port declared.
fn serve_main(kit: &Kit, args: &[&str]) -> pb::ServiceSpec {
    let mut all = vec!["serve"];
    all.extend_from_slice(args);
    let mut s = kit.testapp.service("main", ServiceRole::Main, &all);
    s.ports = vec![port(HTTP_PORT)];
    s
}

fn port(container: i32) -> pb::PortSpec {
    pb::PortSpec {
        container,
        host: 0,
        protocol: pb::PortProtocol::Tcp as i32,
        name: String::new(),
    }
}

/// An HTTP health check on the declared port, probing every second.
fn http_check() -> pb::HealthCheckSpec {
    pb::HealthCheckSpec {
        path: "/healthz".to_string(),
        port: HTTP_PORT,
        interval: Some(pb_duration(Duration::from_secs(1))),
        timeout: Some(pb_duration(Duration::from_secs(1))),
        retries: 3,
        r#type: pb::HealthCheckType::Http as i32,
        command: Vec::new(),
    }
}

fn state(s: &pb::InstanceStatus) -> pb::InstanceState {
    pb::InstanceState::try_from(s.state).unwrap_or(pb::InstanceState::Unspecified)
}

fn service<'a>(s: &'a pb::InstanceStatus, name: &str) -> &'a pb::ServiceStatus {
    s.services.get(name).unwrap_or_else(|| {
        panic!(
            "status has no service {name:?} (services: {:?}): {}",
            s.services.keys().collect::<Vec<_>>(),
            brief(s)
        )
    })
}

fn http_endpoint(s: &pb::InstanceStatus, replica: i32) -> (String, u16) {
    let (host, port) = endpoint(s, "main", HTTP_PORT, replica).unwrap_or_else(|| {
        panic!(
            "no endpoint for main replica {replica} port {HTTP_PORT}: {}",
            brief(s)
        )
    });
    assert_ne!(port, 0, "endpoint with host port 0: {}", brief(s));
    (host, port)
}

/// When `cap` is not advertised, asserts that `rpc` answers
/// UNIMPLEMENTED and returns false (the check ends there).
async fn needs<T: std::fmt::Debug>(
    kit: &Kit,
    cap: Capability,
    rpc: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> bool {
    if kit.has(cap).await {
        return true;
    }
    expect_code(
        &format!(
            "RPC gated by the unadvertised capability {:?}",
            cap.as_str()
        ),
        rpc.await,
        Code::Unimplemented,
    );
    false
}

fn unknown_logs(id: &str) -> pb::StreamLogsRequest {
    logs_request(id, "")
}

fn ok<T>(r: Result<T, tonic::Status>) -> Result<(), tonic::Status> {
    r.map(|_| ())
}

async fn stream_logs_once(
    kit: &Kit,
    req: pb::StreamLogsRequest,
) -> Result<Vec<pb::StreamLogsResponse>, tonic::Status> {
    kit.logs(req).await
}

// 1 ---------------------------------------------------------------------------

/// Provision is idempotent by instance id: provisioning the same request
/// again returns the same provider ref, service refs and endpoints, starts
/// nothing new (the running instance is not restarted) and ListManaged
/// shows the instance once.
pub async fn provision_is_idempotent(h: Harness) {
    run_check(h, "provision_is_idempotent", async |kit| {
        let id = "bws_conf_idempotent";
        let req = kit.request(id, vec![serve_main(&kit, &[])]);
        let r1 = kit.provision(req.clone()).await;
        let r2 = kit.provision(req.clone()).await;
        assert!(!r1.provider_ref.is_empty(), "empty provider_ref: {r1:?}");
        assert_eq!(
            r1.provider_ref, r2.provider_ref,
            "a second Provision changed provider_ref"
        );
        assert!(
            r1.service_refs.contains_key("main"),
            "service_refs has no entry for main: {:?}",
            r1.service_refs
        );
        assert_eq!(
            r1.service_refs, r2.service_refs,
            "a second Provision changed service_refs"
        );
        let eps = |r: &pb::ProvisionResponse| {
            r.endpoints
                .iter()
                .map(|e| (e.service_name.clone(), e.container_port, e.replica, e.port))
                .collect::<BTreeSet<_>>()
        };
        assert_eq!(eps(&r1), eps(&r2), "a second Provision changed endpoints");

        let s1 = kit.wait_running(id).await;
        let (host, p) = http_endpoint(&s1, 0);
        wait_http_ok(&host, p).await;
        let r3 = kit.provision(req).await;
        assert_eq!(r3.provider_ref, r1.provider_ref);
        assert_eq!(r3.service_refs, r1.service_refs);
        let s2 = kit.wait_running(id).await;
        assert_eq!(
            nanos(s2.started_at.as_ref()),
            nanos(s1.started_at.as_ref()),
            "Provision of a running instance restarted it: before {} / after {}",
            brief(&s1),
            brief(&s2)
        );
        assert_eq!(
            s2.restarts, s1.restarts,
            "Provision of a running instance restarted it"
        );
        assert_eq!(
            service(&s2, "main").replicas,
            1,
            "one instance, one replica: {}",
            brief(&s2)
        );
        assert_eq!(
            s2.endpoints
                .iter()
                .filter(|e| e.service_name == "main")
                .count(),
            1,
            "one replica, one endpoint: {}",
            brief(&s2)
        );
        let (h2, p2) = http_endpoint(&s2, 0);
        assert_eq!((h2.as_str(), p2), (host.as_str(), p), "the endpoint moved");

        let managed = kit.list_managed(0).await;
        let ids: Vec<_> = managed.iter().map(|w| w.instance_id.as_str()).collect();
        assert_eq!(ids, vec![id], "ListManaged after two Provisions");
    })
    .await;
}

// 2 ---------------------------------------------------------------------------

/// Deprovision is convergent: the first call reports `existed`, a second
/// one and one for an id never provisioned succeed with `existed = false`;
/// afterwards GetStatus is NOT_FOUND, ListManaged does not list the
/// instance, and its processes are gone (nothing answers on its endpoint).
pub async fn deprovision_is_convergent(h: Harness) {
    run_check(h, "deprovision_is_convergent", async |kit| {
        let id = "bws_conf_deprovision";
        kit.provision(kit.request(id, vec![serve_main(&kit, &[])]))
            .await;
        let s = kit.wait_running(id).await;
        let (host, p) = http_endpoint(&s, 0);
        wait_http_ok(&host, p).await;

        let dep = async |id: &str| {
            call(kit.c().deprovision(pb::DeprovisionRequest {
                instance_id: id.to_string(),
            }))
            .await
            .unwrap_or_else(|e| panic!("Deprovision({id}) failed: {}", show(&e)))
        };
        assert!(dep(id).await.existed, "first Deprovision: existed=false");
        assert!(!dep(id).await.existed, "second Deprovision: existed=true");
        assert!(
            !dep("bws_conf_never_provisioned").await.existed,
            "Deprovision of an unknown id: existed=true"
        );

        expect_code(
            "GetStatus after Deprovision",
            kit.status(id).await,
            Code::NotFound,
        );
        let managed = kit.list_managed(0).await;
        assert!(
            managed.iter().all(|w| w.instance_id != id),
            "ListManaged still lists {id} after Deprovision: {managed:?}"
        );
        wait_port_closed(&host, p).await;
    })
    .await;
}

// 3 ---------------------------------------------------------------------------

/// Status reaches RUNNING and ready for a `serve` main with an HTTP health
/// check, with an endpoint for its declared port that really answers.
pub async fn status_reaches_running_ready(h: Harness) {
    run_check(h, "status_reaches_running_ready", async |kit| {
        let id = "bws_conf_ready";
        let mut main = serve_main(&kit, &[]);
        main.health_check = Some(http_check());
        let r = kit.provision(kit.request(id, vec![main])).await;
        let s = kit.wait_running_ready(id).await;
        let m = service(&s, "main");
        assert_eq!(
            m.state,
            pb::InstanceState::Running as i32,
            "main: {}",
            brief(&s)
        );
        assert!(m.ready, "instance ready but main not: {}", brief(&s));
        assert_eq!(s.instance_id, id, "status names another instance");
        assert!(s.started_at.is_some(), "no started_at: {}", brief(&s));
        let (host, p) = http_endpoint(&s, 0);
        http_get(&host, p, "/healthz")
            .await
            .unwrap_or_else(|e| panic!("ready, but the endpoint does not answer: {e}"));
        if let Some(e) = r
            .endpoints
            .iter()
            .find(|e| e.service_name == "main" && e.container_port == HTTP_PORT)
        {
            assert_eq!(
                e.port,
                i32::from(p),
                "Provision and GetStatus report different ports"
            );
        }
    })
    .await;
}

// 4 ---------------------------------------------------------------------------

/// Inits run to completion in `depends_on` order before main and sidecars
/// start, and the sidecar starts after main, which it depends on (seen in
/// the log timestamps); inits report exit code 0; a failing init makes the
/// workload FAILED with a message naming it, and main never starts.
pub async fn init_services_run_first_in_order(h: Harness) {
    run_check(h, "init_services_run_first_in_order", async |kit| {
        let t = &kit.testapp;
        let id = "bws_conf_init_order";
        let init_a = t.service(
            "init-a",
            ServiceRole::Init,
            &["exit", "0", "--after", "150", "--message", "init-a"],
        );
        let mut init_b = t.service(
            "init-b",
            ServiceRole::Init,
            &["exit", "0", "--after", "150", "--message", "init-b"],
        );
        init_b.depends_on = vec!["init-a".into()];
        let mut sidecar = t.service(
            "sidecar",
            ServiceRole::Sidecar,
            &["serve", "--port", "9090"],
        );
        sidecar.ports = vec![port(9090)];
        sidecar.depends_on = vec!["main".into()];
        // Sidecar and init-b first: spec order must not be start order.
        kit.provision(kit.request(id, vec![sidecar, init_b, serve_main(&kit, &[]), init_a]))
            .await;
        let s = kit
            .wait_status(id, "RUNNING with inits done (exit 0)", |s| {
                state(s) == pb::InstanceState::Running
                    && ["init-a", "init-b"].iter().all(|n| {
                        s.services.get(*n).is_some_and(|v| {
                            v.exit_code == 0
                                && v.state != pb::InstanceState::Running as i32
                                && v.state != pb::InstanceState::Starting as i32
                                && v.state != pb::InstanceState::Failed as i32
                        })
                    })
            })
            .await;
        for n in ["main", "sidecar"] {
            assert_eq!(
                service(&s, n).state,
                pb::InstanceState::Running as i32,
                "{n}: {}",
                brief(&s)
            );
        }

        if needs(
            &kit,
            Capability::Logs,
            stream_logs_once(&kit, unknown_logs(id)),
        )
        .await
        {
            let lines = kit
                .wait_logs(id, "", "init lines and ticks of main and sidecar", |ls| {
                    ["main", "sidecar"]
                        .iter()
                        .all(|n| ls.iter().any(|l| l.service_name == *n && tick(l).is_some()))
                        && ["init-a", "init-b"]
                            .iter()
                            .all(|n| ls.iter().any(|l| l.service_name == *n && text(l) == *n))
                })
                .await;
            let first = |svc: &str, pred: &dyn Fn(&pb::StreamLogsResponse) -> bool| {
                lines
                    .iter()
                    .filter(|l| l.service_name == svc && pred(l))
                    .map(|l| nanos(l.timestamp.as_ref()))
                    .min()
                    .unwrap_or_else(|| panic!("no matching line of {svc}"))
            };
            let a = first("init-a", &|l| text(l) == "init-a");
            let b = first("init-b", &|l| text(l) == "init-b");
            let m = first("main", &|l| tick(l).is_some());
            let sc = first("sidecar", &|l| tick(l).is_some());
            let all: Vec<_> = lines.iter().map(describe_line).collect();
            assert!(a < b, "init-b ran before init-a finished: {all:#?}");
            assert!(b < m, "main started before init-b finished: {all:#?}");
            assert!(b < sc, "sidecar started before init-b finished: {all:#?}");
            assert!(
                m < sc,
                "the sidecar started before main, which it depends on: {all:#?}"
            );
        }

        // A failing init.
        let id = "bws_conf_init_fail";
        let bad = t.service(
            "init-a",
            ServiceRole::Init,
            &["exit", "3", "--message", "init-a-fails"],
        );
        kit.provision(kit.request(id, vec![bad, serve_main(&kit, &[])]))
            .await;
        let s = kit
            .wait_status(id, "state FAILED", |s| {
                state(s) == pb::InstanceState::Failed
            })
            .await;
        assert!(
            s.message.contains("init-a"),
            "the FAILED message does not name the init: {}",
            brief(&s)
        );
        assert_eq!(
            service(&s, "init-a").exit_code,
            3,
            "init-a's exit code: {}",
            brief(&s)
        );
        // It stays failed and main never starts (observed for a second).
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let s = kit
                .status(id)
                .await
                .unwrap_or_else(|e| panic!("GetStatus: {}", show(&e)));
            assert_eq!(
                state(&s),
                pb::InstanceState::Failed,
                "left FAILED: {}",
                brief(&s)
            );
            if let Some(m) = s.services.get("main") {
                assert!(
                    m.state != pb::InstanceState::Running as i32 && !m.ready,
                    "main runs after a failed init: {}",
                    brief(&s)
                );
            }
            tokio::time::sleep(POLL).await;
        }
        if kit.has(Capability::Logs).await {
            let main_lines = kit.service_logs(id, "main").await;
            assert!(
                main_lines.is_empty(),
                "main logged after a failed init: {:?}",
                main_lines.iter().map(describe_line).collect::<Vec<_>>()
            );
            let init_lines = kit.service_logs(id, "init-a").await;
            assert!(
                init_lines.iter().any(|l| text(l) == "init-a-fails"),
                "the failed init's output is not in the logs: {:?}",
                init_lines.iter().map(describe_line).collect::<Vec<_>>()
            );
        }
    })
    .await;
}

// 5 ---------------------------------------------------------------------------

/// Env, command, args and config files are applied: the `env` main prints
/// the spec's variables, the `args` sidecar prints its arguments verbatim
/// (spaces and dashes intact), and the config file is readable from the
/// service's working directory with the exact content.
pub async fn env_command_args_and_config_files_are_applied(h: Harness) {
    run_check(
        h,
        "env_command_args_and_config_files_are_applied",
        async |kit| {
            let t = &kit.testapp;
            let id = "bws_conf_env_args";
            let content = "greeting: hello\nlist:\n  - a\n  - \"b c\"\n";
            let mut main = t.service("main", ServiceRole::Main, &["env"]);
            main.env = HashMap::from([
                ("CONF_GREETING".into(), "hello conformance".into()),
                ("CONF_EMPTY".into(), String::new()),
            ]);
            main.config_files = vec![pb::ConfigFile {
                name: "app".into(),
                path: "conf/app.yaml".into(),
                format: "yaml".into(),
                content: content.into(),
            }];
            let mut sidecar = t.service(
                "printer",
                ServiceRole::Sidecar,
                &["args", "one", "two words", "--three"],
            );
            sidecar.depends_on = vec!["main".into()];
            kit.provision(kit.request(id, vec![main, sidecar])).await;
            kit.wait_running(id).await;

            if needs(
                &kit,
                Capability::Logs,
                stream_logs_once(&kit, unknown_logs(id)),
            )
            .await
            {
                let lines = kit
                    .wait_logs(id, "main", "the env output", |ls| {
                        ls.iter().any(|l| text(l).starts_with("CONF_GREETING="))
                    })
                    .await;
                let env: Vec<&str> = lines.iter().filter(|l| is_stdout(l)).map(text).collect();
                assert!(
                    env.contains(&"CONF_GREETING=hello conformance"),
                    "env output: {env:?}"
                );
                assert!(env.contains(&"CONF_EMPTY="), "env output: {env:?}");
                let lines = kit
                    .wait_logs(id, "printer", "three argument lines", |ls| ls.len() >= 3)
                    .await;
                let args: Vec<&str> = lines.iter().map(text).collect();
                assert_eq!(args, vec!["one", "two words", "--three"], "args output");
            }

            let cat = pb::ExecRequest {
                instance_id: id.into(),
                service_name: "main".into(),
                command: vec![t.program.clone(), "cat".into(), "conf/app.yaml".into()],
                ..Default::default()
            };
            if needs(&kit, Capability::Exec, call(kit.c().exec(cat.clone()))).await {
                let r = call(kit.c().exec(cat))
                    .await
                    .unwrap_or_else(|e| panic!("Exec cat: {}", show(&e)));
                assert_eq!(
                    r.exit_code,
                    0,
                    "cat conf/app.yaml failed: {}",
                    String::from_utf8_lossy(&r.stderr)
                );
                assert_eq!(
                    String::from_utf8_lossy(&r.stdout),
                    content,
                    "config file content"
                );
            }
        },
    )
    .await;
}

// 6 ---------------------------------------------------------------------------

/// Stop / Start / Restart: Stop ends every process (a sidecar ignoring
/// SIGTERM is killed after the grace period) and reports STOPPED, not
/// ready; Start brings it back RUNNING and ready; Restart restarts it
/// (`started_at` advances or the restart count grows).
pub async fn stop_start_restart(h: Harness) {
    run_check(h, "stop_start_restart", async |kit| {
        let id = "bws_conf_stop_start";
        let mut main = serve_main(&kit, &[]);
        main.health_check = Some(http_check());
        let mut stubborn = kit.testapp.service(
            "stubborn",
            ServiceRole::Sidecar,
            &["sleep", "--ignore-term"],
        );
        stubborn.depends_on = vec!["main".into()];
        kit.provision(kit.request(id, vec![main, stubborn])).await;
        let s = kit.wait_running_ready(id).await;
        let (host, p) = http_endpoint(&s, 0);
        wait_http_ok(&host, p).await;

        let grace = Duration::from_secs(1);
        let t0 = Instant::now();
        call(kit.c().stop(pb::StopRequest {
            instance_id: id.into(),
            grace_period: Some(pb_duration(grace)),
        }))
        .await
        .unwrap_or_else(|e| panic!("Stop: {}", show(&e)));
        let s = kit
            .wait_status(id, "STOPPED, not ready", |s| {
                state(s) == pb::InstanceState::Stopped && !s.ready
            })
            .await;
        assert!(
            t0.elapsed() < grace + Duration::from_secs(15),
            "Stop took {:?} with a {grace:?} grace period",
            t0.elapsed()
        );
        for n in ["main", "stubborn"] {
            let v = service(&s, n);
            assert_eq!(
                v.state,
                pb::InstanceState::Stopped as i32,
                "{n} after Stop: {}",
                brief(&s)
            );
            assert!(!v.ready, "{n} ready after Stop: {}", brief(&s));
        }
        wait_port_closed(&host, p).await;

        call(kit.c().start(pb::StartRequest {
            instance_id: id.into(),
        }))
        .await
        .unwrap_or_else(|e| panic!("Start: {}", show(&e)));
        let s1 = kit.wait_running_ready(id).await;
        let (host, p) = http_endpoint(&s1, 0);
        wait_http_ok(&host, p).await;

        call(kit.c().restart(pb::RestartRequest {
            instance_id: id.into(),
            service_name: String::new(),
        }))
        .await
        .unwrap_or_else(|e| panic!("Restart: {}", show(&e)));
        let before = nanos(s1.started_at.as_ref());
        let s2 = kit
            .wait_status(id, "restarted, RUNNING and ready", |s| {
                (nanos(s.started_at.as_ref()) > before || s.restarts > s1.restarts)
                    && state(s) == pb::InstanceState::Running
                    && s.ready
            })
            .await;
        let (host, p) = http_endpoint(&s2, 0);
        wait_http_ok(&host, p).await;
    })
    .await;
}

// 7 ---------------------------------------------------------------------------

/// Deploy changes what runs: a Deploy with new env restarts main with it
/// (its `env` output shows `VERSION=2`); the same Deploy again is a
/// successful no-op (nothing restarts).
pub async fn deploy_changes_what_runs(h: Harness) {
    run_check(h, "deploy_changes_what_runs", async |kit| {
        let id = "bws_conf_deploy";
        let deploy = pb::DeployRequest {
            instance_id: id.into(),
            release_id: "r2".into(),
            services: vec![pb::DeployService {
                name: "main".into(),
                image: kit.testapp.image.clone(),
                env: HashMap::from([("VERSION".into(), "2".into())]),
                ..Default::default()
            }],
            strategy: pb::DeployStrategy::Unspecified as i32,
        };
        if !needs(
            &kit,
            Capability::Deploy,
            call(kit.c().deploy(deploy.clone())),
        )
        .await
        {
            return;
        }
        let mut main = kit.testapp.service("main", ServiceRole::Main, &["env"]);
        main.env = HashMap::from([("VERSION".into(), "1".into())]);
        kit.provision(kit.request(id, vec![main])).await;
        kit.wait_running(id).await;
        let has_logs = kit.has(Capability::Logs).await;
        let count = |ls: &[pb::StreamLogsResponse], line: &str| {
            ls.iter().filter(|l| text(l) == line).count()
        };
        if has_logs {
            kit.wait_logs(id, "main", "VERSION=1", |ls| count(ls, "VERSION=1") == 1)
                .await;
        }

        let r = call(kit.c().deploy(deploy.clone()))
            .await
            .unwrap_or_else(|e| panic!("Deploy r2: {}", show(&e)));
        assert_eq!(r.release_id, "r2", "DeployResponse.release_id");
        if has_logs {
            kit.wait_logs(id, "main", "VERSION=2 from the new process", |ls| {
                count(ls, "VERSION=2") == 1
            })
            .await;
        } else {
            expect_code(
                "StreamLogs without the logs capability",
                stream_logs_once(&kit, unknown_logs(id)).await,
                Code::Unimplemented,
            );
        }
        // Taken once the new process runs, so a rollout still under way
        // cannot be mistaken for a restart by the repeated Deploy.
        let s1 = kit.wait_running(id).await;

        // The same Deploy again: success, nothing restarts.
        let r = call(kit.c().deploy(deploy))
            .await
            .unwrap_or_else(|e| panic!("repeated Deploy r2: {}", show(&e)));
        assert_eq!(r.release_id, "r2");
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            tokio::time::sleep(POLL).await;
        }
        let s2 = kit.wait_running(id).await;
        assert_eq!(
            s2.restarts, s1.restarts,
            "the repeated Deploy restarted something"
        );
        if has_logs {
            let lines = kit.service_logs(id, "main").await;
            assert_eq!(
                count(&lines, "VERSION=2"),
                1,
                "the repeated Deploy started main again: {:?}",
                lines.iter().map(describe_line).collect::<Vec<_>>()
            );
            assert_eq!(count(&lines, "VERSION=1"), 1);
        }
    })
    .await;
}

// 8 ---------------------------------------------------------------------------

/// Scale changes the replica count: 1 → 3 gives three ready replicas, each
/// answering on its own endpoint; 3 → 1 removes two (their ports close).
pub async fn scale_changes_replica_count(h: Harness) {
    run_check(h, "scale_changes_replica_count", async |kit| {
        let id = "bws_conf_scale";
        let scale = |replicas| pb::ScaleRequest {
            instance_id: id.into(),
            service_name: "main".into(),
            resources: Some(pb::ResourceSpec {
                replicas,
                ..Default::default()
            }),
        };
        if !needs(&kit, Capability::Scale, call(kit.c().scale(scale(3)))).await {
            return;
        }
        kit.provision(kit.request(id, vec![serve_main(&kit, &[])]))
            .await;
        let s = kit.wait_running_ready(id).await;
        assert_eq!(service(&s, "main").replicas, 1, "{}", brief(&s));

        call(kit.c().scale(scale(3)))
            .await
            .unwrap_or_else(|e| panic!("Scale to 3: {}", show(&e)));
        let s = kit
            .wait_status(id, "main at 3 ready replicas", |s| {
                s.services
                    .get("main")
                    .is_some_and(|m| m.replicas == 3 && m.ready_replicas == 3)
                    && state(s) == pb::InstanceState::Running
            })
            .await;
        let mut ports = BTreeSet::new();
        let mut eps = Vec::new();
        for r in 0..3 {
            let (host, p) = eventually(&format!("an endpoint for replica {r}"), async || {
                let s = kit.status(id).await.map_err(|e| show(&e))?;
                endpoint(&s, "main", HTTP_PORT, r).ok_or_else(|| brief(&s))
            })
            .await;
            wait_http_ok(&host, p).await;
            ports.insert(p);
            eps.push((host, p));
        }
        assert_eq!(ports.len(), 3, "replicas share ports: {}", brief(&s));

        call(kit.c().scale(scale(1)))
            .await
            .unwrap_or_else(|e| panic!("Scale to 1: {}", show(&e)));
        let s = kit
            .wait_status(id, "main back at 1 ready replica", |s| {
                s.services
                    .get("main")
                    .is_some_and(|m| m.replicas == 1 && m.ready_replicas == 1)
                    && s.endpoints
                        .iter()
                        .filter(|e| e.service_name == "main")
                        .count()
                        == 1
            })
            .await;
        let (host, p) = http_endpoint(&s, 0);
        wait_http_ok(&host, p).await;
        for (host, p) in eps.iter().filter(|(_, q)| *q != p) {
            wait_port_closed(host, *p).await;
        }
    })
    .await;
}

// 9 ---------------------------------------------------------------------------

/// StreamLogs: `tail: 3` returns exactly the last three lines of each
/// stream; `since` drops earlier lines and keeps later ones; `follow`
/// keeps delivering new lines, in order, without gaps.
pub async fn stream_logs_tail_since_follow(h: Harness) {
    run_check(h, "stream_logs_tail_since_follow", async |kit| {
        let id = "bws_conf_logs";
        if !needs(
            &kit,
            Capability::Logs,
            stream_logs_once(&kit, unknown_logs(id)),
        )
        .await
        {
            return;
        }
        kit.provision(kit.request(id, vec![serve_main(&kit, &["--log-every", "100"])]))
            .await;
        kit.wait_running(id).await;
        let a = kit
            .wait_logs(id, "main", "16 ticks and 3 warnings", |ls| {
                ls.iter().filter(|l| tick(l).is_some()).count() >= 16
                    && ls.iter().filter(|l| warn(l).is_some()).count() >= 3
            })
            .await;
        for l in &a {
            assert_eq!(l.service_name, "main", "{}", describe_line(l));
            assert_eq!(l.replica, 0, "{}", describe_line(l));
            if tick(l).is_some() {
                assert!(is_stdout(l), "a tick not on stdout: {}", describe_line(l));
            }
            if warn(l).is_some() {
                assert!(
                    is_stderr(l),
                    "a warning not on stderr: {}",
                    describe_line(l)
                );
            }
        }
        let last_tick_a = a.iter().filter_map(tick).max().unwrap_or(0);
        let last_warn_a = a.iter().filter_map(warn).max().unwrap_or(0);

        // tail
        let mut req = logs_request(id, "main");
        req.tail = 3;
        let t = kit
            .logs(req)
            .await
            .unwrap_or_else(|e| panic!("StreamLogs tail 3: {}", show(&e)));
        let shown: Vec<_> = t.iter().map(describe_line).collect();
        let ticks: Vec<u64> = t.iter().filter(|l| is_stdout(l)).filter_map(tick).collect();
        let warns: Vec<u64> = t.iter().filter(|l| is_stderr(l)).filter_map(warn).collect();
        assert_eq!(t.len(), 6, "tail 3 of two streams: {shown:#?}");
        assert_eq!(ticks.len(), 3, "tail 3 stdout lines: {shown:#?}");
        assert_eq!(warns.len(), 3, "tail 3 stderr lines: {shown:#?}");
        assert!(
            ticks.windows(2).all(|w| w[1] == w[0] + 1) && ticks[2] >= last_tick_a,
            "tail 3 is not the last three ticks (last seen before: {last_tick_a}): {shown:#?}"
        );
        assert!(
            warns.windows(2).all(|w| w[1] == w[0] + 5) && warns[2] >= last_warn_a,
            "tail 3 is not the last three warnings (last seen before: {last_warn_a}): {shown:#?}"
        );

        // since: the midpoint between two ticks keeps the later one only.
        let b = kit.service_logs(id, "main").await;
        let b_ticks: Vec<&pb::StreamLogsResponse> =
            b.iter().filter(|l| tick(l).is_some()).collect();
        assert!(b_ticks.len() >= 16);
        let (prev, at) = (b_ticks[7], b_ticks[8]);
        let (tp, ta) = (nanos(prev.timestamp.as_ref()), nanos(at.timestamp.as_ref()));
        assert!(
            tp < ta,
            "two ticks 100 ms apart have timestamps out of order: {} / {}",
            describe_line(prev),
            describe_line(at)
        );
        let since = tp + (ta - tp) / 2;
        let mut req = logs_request(id, "main");
        req.since = Some(timestamp(since));
        let s = kit
            .logs(req)
            .await
            .unwrap_or_else(|e| panic!("StreamLogs since: {}", show(&e)));
        let shown: Vec<_> = s.iter().map(describe_line).collect();
        assert!(
            s.iter().all(|l| nanos(l.timestamp.as_ref()) >= since),
            "since {since}: earlier lines returned: {shown:#?}"
        );
        let first = s.iter().filter_map(tick).min();
        assert_eq!(
            first,
            tick(at),
            "since between ticks {:?} and {:?}: {shown:#?}",
            tick(prev),
            tick(at)
        );

        // follow: three new ticks in order, then the stream is dropped.
        let last_b = b.iter().filter_map(tick).max().unwrap_or(0);
        let mut req = logs_request(id, "main");
        req.follow = true;
        req.tail = 1;
        let mut stream = call(kit.c().stream_logs(req))
            .await
            .unwrap_or_else(|e| panic!("StreamLogs follow: {}", show(&e)));
        let mut new = Vec::new();
        let read = async {
            while new.len() < 3 {
                match stream.next().await {
                    Some(Ok(l)) => {
                        if let Some(n) = tick(&l).filter(|n| *n > last_b) {
                            new.push(n);
                        }
                    }
                    Some(Err(e)) => panic!("follow stream failed: {}", show(&e)),
                    None => panic!("follow stream ended after {new:?}"),
                }
            }
        };
        tokio::time::timeout(WAIT, read)
            .await
            .unwrap_or_else(|_| panic!("follow delivered only {new:?} new ticks within {WAIT:?}"));
        assert!(
            new.windows(2).all(|w| w[1] == w[0] + 1),
            "follow lost or reordered lines: {new:?}"
        );
        drop(stream);
    })
    .await;
}

// 10 --------------------------------------------------------------------------

/// Exec returns the real exit code and output, runs in the service's
/// environment, and reports stderr separately.
pub async fn exec_returns_exit_code_and_output(h: Harness) {
    run_check(h, "exec_returns_exit_code_and_output", async |kit| {
        let id = "bws_conf_exec";
        let program = kit.testapp.program.clone();
        let exec = |command: Vec<&str>| pb::ExecRequest {
            instance_id: id.into(),
            service_name: "main".into(),
            command: command.into_iter().map(String::from).collect(),
            timeout: Some(pb_duration(Duration::from_secs(30))),
            ..Default::default()
        };
        let exit7 = exec(vec![&program, "exit", "7", "--message", "hello"]);
        if !needs(&kit, Capability::Exec, call(kit.c().exec(exit7.clone()))).await {
            return;
        }
        let mut main = kit.testapp.service("main", ServiceRole::Main, &["sleep"]);
        main.env = HashMap::from([("EXEC_MARKER".into(), "from-the-spec".into())]);
        kit.provision(kit.request(id, vec![main])).await;
        kit.wait_running(id).await;

        let r = call(kit.c().exec(exit7))
            .await
            .unwrap_or_else(|e| panic!("Exec exit 7: {}", show(&e)));
        assert_eq!(r.exit_code, 7, "exit code: {r:?}");
        assert_eq!(
            String::from_utf8_lossy(&r.stdout),
            "hello\n",
            "stdout: {r:?}"
        );

        let r = call(kit.c().exec(exec(vec![&program, "cat", "no/such/file"])))
            .await
            .unwrap_or_else(|e| panic!("Exec cat: {}", show(&e)));
        assert_eq!(r.exit_code, 1, "exit code of a failing cat: {r:?}");
        assert!(r.stdout.is_empty(), "stdout of a failing cat: {r:?}");
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(
            err.contains("no/such/file"),
            "stderr of a failing cat: {err:?}"
        );

        let r = call(kit.c().exec(exec(vec![&program, "env", "--once"])))
            .await
            .unwrap_or_else(|e| panic!("Exec env: {}", show(&e)));
        assert_eq!(r.exit_code, 0, "{r:?}");
        let out = String::from_utf8_lossy(&r.stdout);
        assert!(
            out.lines().any(|l| l == "EXEC_MARKER=from-the-spec"),
            "Exec does not run in the service's env: {out}"
        );
    })
    .await;
}

// 11 --------------------------------------------------------------------------

/// GetResources reports non-zero CPU and memory for a busy workload.
pub async fn resources_report_usage(h: Harness) {
    run_check(h, "resources_report_usage", async |kit| {
        let id = "bws_conf_resources";
        kit.provision(kit.request(id, vec![serve_main(&kit, &["--busy"])]))
            .await;
        kit.wait_running(id).await;
        let usage = eventually("non-zero CPU and memory", async || {
            let r = call(kit.c().get_resources(pb::GetResourcesRequest {
                instance_id: id.into(),
            }))
            .await
            .map_err(|e| format!("GetResources: {}", show(&e)))?;
            match r.usage {
                Some(u) if u.cpu_percent > 0.0 && u.memory_bytes > 0 => Ok(u),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
        assert!(
            usage.cpu_percent.is_finite(),
            "cpu_percent is not a number: {usage:?}"
        );
    })
    .await;
}

// 12 --------------------------------------------------------------------------

/// ListManaged lists exactly the managed instances (paging one at a time),
/// with the request's labels, the tenant and a creation time.
pub async fn list_managed_lists_exactly_the_managed_instances(h: Harness) {
    run_check(
        h,
        "list_managed_lists_exactly_the_managed_instances",
        async |kit| {
            let t0 = now_nanos() - 60_000_000_000;
            let (a, b) = ("bws_conf_managed_a", "bws_conf_managed_b");
            for (id, tenant) in [(a, "tenant-a"), (b, "tenant-b")] {
                let mut req = kit.request(
                    id,
                    vec![kit.testapp.service("main", ServiceRole::Main, &["sleep"])],
                );
                req.tenant_id = tenant.into();
                req.labels.insert("which".into(), id.into());
                kit.provision(req).await;
            }
            let both = kit.list_managed(1).await;
            let ids: BTreeSet<_> = both.iter().map(|w| w.instance_id.as_str()).collect();
            assert_eq!(
                ids,
                BTreeSet::from([a, b]),
                "ListManaged (page size 1) with two instances: {both:?}"
            );
            assert_eq!(both.len(), 2, "an instance listed twice: {both:?}");

            let gone = call(kit.c().deprovision(pb::DeprovisionRequest {
                instance_id: b.into(),
            }))
            .await
            .unwrap_or_else(|e| panic!("Deprovision: {}", show(&e)));
            assert!(gone.existed);
            let left = kit.list_managed(0).await;
            assert_eq!(
                left.iter()
                    .map(|w| w.instance_id.as_str())
                    .collect::<Vec<_>>(),
                vec![a],
                "ListManaged after deprovisioning {b}: {left:?}"
            );
            let w = &left[0];
            for (k, v) in [("suite", "conformance"), ("which", a)] {
                assert_eq!(
                    w.labels.get(k).map(String::as_str),
                    Some(v),
                    "label {k} of {a}: {:?}",
                    w.labels
                );
            }
            assert!(
                w.tenant_id == "tenant-a"
                    || w.labels.get("ctrlplane.io/tenant").map(String::as_str) == Some("tenant-a"),
                "the tenant is neither in tenant_id nor in the labels: {w:?}"
            );
            let created = nanos(w.created_at.as_ref());
            assert!(
                created >= t0 && created <= now_nanos() + 60_000_000_000,
                "created_at is not around now: {w:?}"
            );
        },
    )
    .await;
}

// 13 --------------------------------------------------------------------------

/// Bad requests are INVALID_ARGUMENT naming every bad field, and create
/// nothing.
pub async fn bad_requests_are_invalid_argument(h: Harness) {
    run_check(h, "bad_requests_are_invalid_argument", async |kit| {
        let t = &kit.testapp;
        let main = || t.service("main", ServiceRole::Main, &["sleep"]);

        let req = kit.request("", vec![main()]);
        expect_invalid(
            "Provision without instance_id",
            kit.try_provision(req).await,
            &["instance_id"],
        );

        let req = kit.request(
            "bws_conf_two_mains",
            vec![main(), {
                let mut m = main();
                m.name = "main2".into();
                m
            }],
        );
        expect_invalid(
            "Provision with two mains",
            kit.try_provision(req).await,
            &["services"],
        );

        let mut bad_port = main();
        bad_port.ports = vec![port(70000)];
        let req = kit.request("bws_conf_bad_port", vec![bad_port]);
        expect_invalid(
            "Provision with port 70000",
            kit.try_provision(req).await,
            &["services[0].ports[0].container"],
        );

        // All at once: every field is named in one answer.
        let mut bad_port = main();
        bad_port.ports = vec![port(0)];
        let mut second = main();
        second.name = "main2".into();
        let req = kit.request("", vec![bad_port, second]);
        expect_invalid(
            "Provision with three mistakes",
            kit.try_provision(req).await,
            &["instance_id", "services", "services[0].ports[0].container"],
        );

        expect_invalid(
            "Stop with a negative grace period",
            call(kit.c().stop(pb::StopRequest {
                instance_id: "bws_conf_bad_stop".into(),
                grace_period: Some(ctrlplane_proto::pbjson_types::Duration {
                    seconds: -1,
                    nanos: 0,
                }),
            }))
            .await,
            &["grace_period"],
        );
        expect_invalid(
            "GetStatus with an instance id of bad characters",
            kit.status("BAD ID!").await,
            &["instance_id"],
        );

        let managed = kit.list_managed(0).await;
        assert!(
            managed.is_empty(),
            "bad requests created instances: {managed:?}"
        );
        for id in ["bws_conf_two_mains", "bws_conf_bad_port"] {
            expect_code(
                "GetStatus of a rejected instance",
                kit.status(id).await,
                Code::NotFound,
            );
        }
    })
    .await;
}

// 14 --------------------------------------------------------------------------

/// Capabilities are honest: every advertised name is a known capability;
/// every RPC gated by an advertised capability does not answer
/// UNIMPLEMENTED (an advertised `volumes` really provisions a volume),
/// and every RPC gated by an unadvertised one does.
pub async fn capabilities_are_honest(h: Harness) {
    run_check(h, "capabilities_are_honest", async |kit| {
        let caps = kit.capabilities().await;
        let mut seen = BTreeSet::new();
        for c in &caps {
            assert!(
                Capability::parse(c).is_some(),
                "unknown capability {c:?} advertised: {caps:?}"
            );
            assert!(seen.insert(c.as_str()), "{c:?} advertised twice: {caps:?}");
        }
        assert!(
            seen.contains("provision"),
            "an agent must advertise provision: {caps:?}"
        );
        let info = call(kit.c().get_info(pb::GetInfoRequest {}))
            .await
            .unwrap_or_else(|e| panic!("GetInfo: {}", show(&e)));
        assert!(!info.provider_name.is_empty(), "GetInfo: {info:?}");
        let health = call(kit.c().check_health(pb::CheckHealthRequest {}))
            .await
            .unwrap_or_else(|e| panic!("CheckHealth: {}", show(&e)));
        assert!(health.healthy, "CheckHealth: {health:?}");

        let has = |c: Capability| seen.contains(c.as_str());
        let judge = |what: &str, cap: Capability, r: Result<(), tonic::Status>| {
            let unimplemented = matches!(&r, Err(s) if s.code() == Code::Unimplemented);
            if has(cap) {
                assert!(
                    !unimplemented,
                    "{what}: {:?} is advertised but the RPC answers {}",
                    cap.as_str(),
                    show(r.as_ref().unwrap_err())
                );
            } else {
                assert!(
                    unimplemented,
                    "{what}: {:?} is not advertised but the RPC answers {}",
                    cap.as_str(),
                    r.as_ref().map_or_else(show, |_| "OK".to_string())
                );
            }
        };
        let unknown = "bws_conf_caps_unknown";

        judge(
            "GetStatus",
            Capability::Provision,
            ok(kit.status(unknown).await),
        );
        judge(
            "Start",
            Capability::Provision,
            ok(call(kit.c().start(pb::StartRequest {
                instance_id: unknown.into(),
            }))
            .await),
        );
        judge(
            "GetResources",
            Capability::Provision,
            ok(call(kit.c().get_resources(pb::GetResourcesRequest {
                instance_id: unknown.into(),
            }))
            .await),
        );
        let deploy = |strategy: pb::DeployStrategy| pb::DeployRequest {
            instance_id: unknown.into(),
            release_id: "r1".into(),
            services: vec![pb::DeployService {
                name: "main".into(),
                image: kit.testapp.image.clone(),
                ..Default::default()
            }],
            strategy: strategy as i32,
        };
        judge(
            "Deploy",
            Capability::Deploy,
            ok(call(kit.c().deploy(deploy(pb::DeployStrategy::Unspecified))).await),
        );
        judge(
            "Rollback",
            Capability::Deploy,
            ok(call(kit.c().rollback(pb::RollbackRequest {
                instance_id: unknown.into(),
                release_id: String::new(),
            }))
            .await),
        );
        if has(Capability::Deploy) {
            for (strategy, cap) in [
                (pb::DeployStrategy::BlueGreen, Capability::StrategyBlueGreen),
                (pb::DeployStrategy::Canary, Capability::StrategyCanary),
            ] {
                judge(
                    &format!("Deploy {strategy:?}"),
                    cap,
                    ok(call(kit.c().deploy(deploy(strategy))).await),
                );
            }
            if has(Capability::StrategyRolling) {
                judge(
                    "Deploy Rolling",
                    Capability::StrategyRolling,
                    ok(call(kit.c().deploy(deploy(pb::DeployStrategy::Rolling))).await),
                );
            }
        }
        judge(
            "Scale",
            Capability::Scale,
            ok(call(kit.c().scale(pb::ScaleRequest {
                instance_id: unknown.into(),
                service_name: String::new(),
                resources: Some(pb::ResourceSpec {
                    replicas: 2,
                    ..Default::default()
                }),
            }))
            .await),
        );
        judge(
            "StreamLogs",
            Capability::Logs,
            ok(stream_logs_once(&kit, unknown_logs(unknown)).await),
        );
        judge(
            "Exec",
            Capability::Exec,
            ok(call(kit.c().exec(pb::ExecRequest {
                instance_id: unknown.into(),
                service_name: "main".into(),
                command: vec![kit.testapp.program.clone(), "exit".into(), "0".into()],
                ..Default::default()
            }))
            .await),
        );

        let mut with_volume = kit.testapp.service("main", ServiceRole::Main, &["sleep"]);
        with_volume.volumes = vec![pb::VolumeSpec {
            name: "data".into(),
            mount_path: "/data".into(),
            size_mb: 0,
            r#type: pb::VolumeType::Persistent as i32,
        }];
        let r = kit
            .try_provision(kit.request("bws_conf_caps_volume", vec![with_volume]))
            .await;
        if has(Capability::Volumes) {
            r.unwrap_or_else(|e| {
                panic!(
                    "volumes is advertised but Provision with a volume failed: {}",
                    show(&e)
                )
            });
            kit.wait_running("bws_conf_caps_volume").await;
        } else {
            judge("Provision with a volume", Capability::Volumes, ok(r));
        }
        let mut with_gpu = kit.testapp.service("main", ServiceRole::Main, &["sleep"]);
        with_gpu.resources = Some(pb::ResourceSpec {
            gpu: 1,
            ..Default::default()
        });
        judge(
            "Provision with a GPU",
            Capability::Gpu,
            ok(kit
                .try_provision(kit.request("bws_conf_caps_gpu", vec![with_gpu]))
                .await),
        );
    })
    .await;
}

// 15 --------------------------------------------------------------------------

/// Auth: without a token, with a forged or an expired one → UNAUTHENTICATED;
/// a tenant token (no system role) → PERMISSION_DENIED and nothing happens;
/// `system:admin` and `system:service` tokens are accepted.
pub async fn auth_requires_a_system_token(h: Harness) {
    run_check(h, "auth_requires_a_system_token", async |kit| {
        let fixed = |token: &str| {
            let interceptor = BearerInterceptor::fixed(token).expect("a JWT is valid metadata");
            ProviderServiceClient::new(
                authed_channel(&kit.endpoint, interceptor).expect("a valid endpoint"),
            )
        };
        let id = "bws_conf_auth";
        let req = || {
            kit.request(
                id,
                vec![kit.testapp.service("main", ServiceRole::Main, &["sleep"])],
            )
        };

        let mut anon =
            ProviderServiceClient::new(channel(&kit.endpoint).expect("a valid endpoint"));
        expect_code(
            "GetCapabilities without a token",
            call(anon.get_capabilities(pb::GetCapabilitiesRequest {})).await,
            Code::Unauthenticated,
        );
        expect_code(
            "Provision without a token",
            call(anon.provision(req())).await,
            Code::Unauthenticated,
        );

        let forger = Authenticator::new(b"not-the-agent-secret-not-the-agent-secret");
        let forged = forger.service_token("conformance", Duration::from_secs(300));
        expect_code(
            "GetStatus with a token signed by another secret",
            call(fixed(&forged).get_status(pb::GetStatusRequest {
                instance_id: id.into(),
            }))
            .await,
            Code::Unauthenticated,
        );

        let mut old = Claims::new(
            "conformance",
            "",
            vec![ROLE_SERVICE.to_string()],
            Duration::from_secs(60),
        );
        old.exp = old.exp.saturating_sub(3600);
        old.iat = old.iat.saturating_sub(3600);
        expect_code(
            "GetStatus with an expired service token",
            call(
                fixed(&kit.auth.mint(&old)).get_status(pb::GetStatusRequest {
                    instance_id: id.into(),
                }),
            )
            .await,
            Code::Unauthenticated,
        );

        let tenant = kit.auth.mint(&Claims::new(
            "alice",
            "tenant-a",
            vec!["tenant:admin".to_string()],
            Duration::from_secs(300),
        ));
        let mut as_tenant = fixed(&tenant);
        expect_code(
            "GetCapabilities with a tenant token",
            call(as_tenant.get_capabilities(pb::GetCapabilitiesRequest {})).await,
            Code::PermissionDenied,
        );
        expect_code(
            "Provision with a tenant token",
            call(as_tenant.provision(req())).await,
            Code::PermissionDenied,
        );
        expect_code(
            "ListManaged with a tenant token",
            call(as_tenant.list_managed(pb::ListManagedRequest::default())).await,
            Code::PermissionDenied,
        );

        let admin = kit.auth.mint(&Claims::new(
            "operator",
            "",
            vec![ctrlplane_runtime::auth::ROLE_ADMIN.to_string()],
            Duration::from_secs(300),
        ));
        call(fixed(&admin).get_capabilities(pb::GetCapabilitiesRequest {}))
            .await
            .unwrap_or_else(|e| panic!("GetCapabilities as system:admin: {}", show(&e)));
        let managed = kit.list_managed(0).await;
        assert!(
            managed.is_empty(),
            "a refused Provision created something: {managed:?}"
        );
        expect_code(
            "GetStatus of the refused instance",
            kit.status(id).await,
            Code::NotFound,
        );
    })
    .await;
}
