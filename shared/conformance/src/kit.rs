//! The helpers every check is written with: a [`Kit`] (client, request
//! builders, the instances to clean up), polling with a deadline
//! ([`eventually`]), log collection, and plain-TCP probes of endpoints.
//!
//! Invariants:
//! - nothing here sleeps for a fixed time to make an assertion true: every
//!   wait polls the real state every [`POLL`] until [`WAIT`] has passed and
//!   then fails with the last thing it saw;
//! - every instance a check provisions through the kit is deprovisioned when
//!   the check ends, passed or failed ([`run_check`]), so a failing check
//!   never leaves processes behind on the test machine.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ctrlplane_agent::Capability;
use ctrlplane_agent::client::{ProviderClient, provider_client};
use ctrlplane_proto::pbjson_types::{Duration as PbDuration, Timestamp};
use ctrlplane_proto::provider::v1 as pb;
use std::panic::AssertUnwindSafe;

use futures::{FutureExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::{Harness, TestApp};

/// How long a wait for a state polls before failing. Generous, so that a
/// loaded two-core machine stays deterministic.
pub const WAIT: Duration = Duration::from_secs(30);
/// Time between two polls.
pub const POLL: Duration = Duration::from_millis(150);
/// Longest a whole check may run.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(240);
/// Longest a non-follow `StreamLogs` may take to end.
pub const LOGS_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest one unary call may take (Stop and Restart may wait for a
/// grace period).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Tenant id every conformance workload is provisioned for.
pub const TENANT: &str = "tenant-conformance";
/// Container port every `serve` workload declares for its HTTP server.
pub const HTTP_PORT: i32 = 8080;

/// Everything a check needs, shared between the check and its clean-up.
pub struct Kit {
    /// A client minting `system:service` tokens.
    pub client: ProviderClient,
    /// The agent's endpoint.
    pub endpoint: String,
    /// The secret the agent verifies tokens with.
    pub auth: Arc<ctrlplane_runtime::auth::Authenticator>,
    /// How services run the test app.
    pub testapp: TestApp,
    provisioned: Mutex<Vec<String>>,
}

impl Kit {
    /// A kit for the agent of `h`.
    ///
    /// # Panics
    /// An endpoint that is not a valid URI.
    pub fn new(h: &Harness) -> Kit {
        let client = provider_client(&h.endpoint, h.auth.clone(), "conformance")
            .unwrap_or_else(|e| panic!("bad agent endpoint {:?}: {e}", h.endpoint));
        Kit {
            client,
            endpoint: h.endpoint.clone(),
            auth: h.auth.clone(),
            testapp: h.testapp.clone(),
            provisioned: Mutex::new(Vec::new()),
        }
    }

    /// A fresh client (clients need `&mut` per call).
    pub fn c(&self) -> ProviderClient {
        self.client.clone()
    }

    /// A Provision request for `id` (tenant [`TENANT`], kind deployment,
    /// labels `suite=conformance`, name derived from the id).
    pub fn request(&self, id: &str, services: Vec<pb::ServiceSpec>) -> pb::ProvisionRequest {
        pb::ProvisionRequest {
            instance_id: id.to_string(),
            tenant_id: TENANT.to_string(),
            name: id.replace('_', "-"),
            kind: pb::WorkloadKind::Deployment as i32,
            services,
            labels: HashMap::from([("suite".to_string(), "conformance".to_string())]),
        }
    }

    /// Provisions, remembering the id for clean-up.
    ///
    /// # Errors
    /// The agent's status.
    pub async fn try_provision(
        &self,
        req: pb::ProvisionRequest,
    ) -> Result<pb::ProvisionResponse, Status> {
        self.remember(&req.instance_id);
        call(self.c().provision(req)).await
    }

    /// Provisions and expects success.
    ///
    /// # Panics
    /// When the agent refuses.
    pub async fn provision(&self, req: pb::ProvisionRequest) -> pb::ProvisionResponse {
        let id = req.instance_id.clone();
        self.try_provision(req)
            .await
            .unwrap_or_else(|s| panic!("Provision({id}) failed: {}", show(&s)))
    }

    /// Marks an instance for clean-up.
    pub fn remember(&self, id: &str) {
        let mut ids = self.provisioned.lock().unwrap_or_else(|p| p.into_inner());
        if !ids.iter().any(|i| i == id) {
            ids.push(id.to_string());
        }
    }

    /// Deprovisions every instance provisioned through the kit; errors are
    /// ignored (the check's own outcome is what counts).
    pub async fn cleanup(&self) {
        let ids = std::mem::take(&mut *self.provisioned.lock().unwrap_or_else(|p| p.into_inner()));
        for id in ids {
            let _ = tokio::time::timeout(
                CALL_TIMEOUT,
                self.c()
                    .deprovision(pb::DeprovisionRequest { instance_id: id }),
            )
            .await;
        }
    }

    /// GetStatus.
    ///
    /// # Errors
    /// The agent's status.
    pub async fn status(&self, id: &str) -> Result<pb::InstanceStatus, Status> {
        let r = call(self.c().get_status(pb::GetStatusRequest {
            instance_id: id.to_string(),
        }))
        .await?;
        r.status
            .ok_or_else(|| Status::internal("GetStatus answered without a status"))
    }

    /// Polls GetStatus until `pred` holds; fails after [`WAIT`] with the last
    /// status seen.
    pub async fn wait_status(
        &self,
        id: &str,
        what: &str,
        pred: impl Fn(&pb::InstanceStatus) -> bool,
    ) -> pb::InstanceStatus {
        eventually(&format!("{id}: {what}"), async || {
            match self.status(id).await {
                Ok(s) if pred(&s) => Ok(s),
                Ok(s) => Err(brief(&s)),
                Err(e) => Err(format!("GetStatus: {}", show(&e))),
            }
        })
        .await
    }

    /// Waits for state RUNNING and ready.
    pub async fn wait_running_ready(&self, id: &str) -> pb::InstanceStatus {
        self.wait_status(id, "state RUNNING and ready", |s| {
            s.state == pb::InstanceState::Running as i32 && s.ready
        })
        .await
    }

    /// Waits for state RUNNING (ready or not).
    pub async fn wait_running(&self, id: &str) -> pb::InstanceStatus {
        self.wait_status(id, "state RUNNING", |s| {
            s.state == pb::InstanceState::Running as i32
        })
        .await
    }

    /// The advertised capabilities.
    ///
    /// # Panics
    /// When GetCapabilities fails.
    pub async fn capabilities(&self) -> Vec<String> {
        call(self.c().get_capabilities(pb::GetCapabilitiesRequest {}))
            .await
            .unwrap_or_else(|s| panic!("GetCapabilities failed: {}", show(&s)))
            .capabilities
    }

    /// Whether `cap` is advertised.
    pub async fn has(&self, cap: Capability) -> bool {
        self.capabilities()
            .await
            .iter()
            .any(|c| c.as_str() == cap.as_str())
    }

    /// Collects a non-follow `StreamLogs` to its end.
    ///
    /// # Errors
    /// The agent's status, at the call or in the stream.
    ///
    /// # Panics
    /// When the stream does not end within [`LOGS_TIMEOUT`].
    pub async fn logs(
        &self,
        req: pb::StreamLogsRequest,
    ) -> Result<Vec<pb::StreamLogsResponse>, Status> {
        assert!(!req.follow, "Kit::logs reads non-follow streams only");
        let what = format!("{req:?}");
        let read = async {
            let mut stream = self.c().stream_logs(req).await?.into_inner();
            let mut lines = Vec::new();
            while let Some(item) = stream.next().await {
                lines.push(item?);
            }
            Ok(lines)
        };
        tokio::time::timeout(LOGS_TIMEOUT, read)
            .await
            .unwrap_or_else(|_| {
                panic!("a non-follow StreamLogs did not end within {LOGS_TIMEOUT:?}: {what}")
            })
    }

    /// All log lines of one service (empty = all services) so far.
    ///
    /// # Panics
    /// When StreamLogs fails.
    pub async fn service_logs(&self, id: &str, service: &str) -> Vec<pb::StreamLogsResponse> {
        self.logs(logs_request(id, service))
            .await
            .unwrap_or_else(|s| panic!("StreamLogs({id}, {service:?}) failed: {}", show(&s)))
    }

    /// Polls the logs of one service until `pred` holds on them.
    pub async fn wait_logs(
        &self,
        id: &str,
        service: &str,
        what: &str,
        pred: impl Fn(&[pb::StreamLogsResponse]) -> bool,
    ) -> Vec<pb::StreamLogsResponse> {
        eventually(
            &format!("{id}: logs of {service:?}: {what}"),
            async || match self.logs(logs_request(id, service)).await {
                Ok(lines) if pred(&lines) => Ok(lines),
                Ok(lines) => Err(format!(
                    "{} lines, the last ones: {:?}",
                    lines.len(),
                    lines
                        .iter()
                        .rev()
                        .take(8)
                        .rev()
                        .map(describe_line)
                        .collect::<Vec<_>>()
                )),
                Err(e) => Err(format!("StreamLogs: {}", show(&e))),
            },
        )
        .await
    }

    /// Every managed workload, paging with `page_size`.
    ///
    /// # Panics
    /// When ListManaged fails or pages for ever.
    pub async fn list_managed(&self, page_size: i32) -> Vec<pb::ManagedWorkload> {
        let mut all = Vec::new();
        let mut token = String::new();
        for _ in 0..1000 {
            let r = call(self.c().list_managed(pb::ListManagedRequest {
                page_size,
                page_token: token.clone(),
            }))
            .await
            .unwrap_or_else(|s| panic!("ListManaged failed: {}", show(&s)));
            if page_size > 0 {
                assert!(
                    r.workloads.len() <= page_size as usize,
                    "ListManaged(page_size {page_size}) returned {} workloads",
                    r.workloads.len()
                );
            }
            all.extend(r.workloads);
            if r.next_page_token.is_empty() {
                return all;
            }
            token = r.next_page_token;
        }
        panic!("ListManaged never returned an empty next_page_token");
    }
}

/// Runs one check body with a kit for `h`, under [`CHECK_TIMEOUT`];
/// afterwards, whatever happened (a panic is caught first), every instance
/// the kit provisioned is deprovisioned and the agent is stopped (by
/// dropping `h`); then the body's panic, if any, is re-raised.
pub async fn run_check<F, Fut>(h: Harness, name: &str, body: F)
where
    F: FnOnce(Arc<Kit>) -> Fut,
    Fut: Future<Output = ()>,
{
    let kit = Arc::new(Kit::new(&h));
    let outcome = tokio::time::timeout(
        CHECK_TIMEOUT,
        AssertUnwindSafe(body(kit.clone())).catch_unwind(),
    )
    .await;
    kit.cleanup().await;
    drop(kit);
    drop(h);
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => panic!("{name}: the check did not finish within {CHECK_TIMEOUT:?}"),
    }
}

/// Polls `f` every [`POLL`] until it returns `Ok`, for at most [`WAIT`].
///
/// # Panics
/// On timeout, with `what` and the last `Err` that `f` returned.
pub async fn eventually<T>(what: &str, mut f: impl AsyncFnMut() -> Result<T, String>) -> T {
    // tokio's clock, so the helper can be tested under paused time.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if tokio::time::Instant::now() >= deadline => {
                panic!("timed out after {WAIT:?} waiting for {what}; last observed: {last}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Runs a unary call under [`CALL_TIMEOUT`], unwrapping the response.
///
/// # Errors
/// The call's status, or `DEADLINE_EXCEEDED` on timeout.
pub async fn call<T>(
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer within {CALL_TIMEOUT:?} (client-side timeout)"
        ))),
    }
}

/// A status as `CODE: message [field: description, …]`.
pub fn show(s: &Status) -> String {
    let fields = violation_fields(s);
    if fields.is_empty() {
        format!("{:?}: {}", s.code(), s.message())
    } else {
        format!("{:?}: {} {fields:?}", s.code(), s.message())
    }
}

/// The fields named by a status' `BadRequest` detail.
pub fn violation_fields(s: &Status) -> Vec<String> {
    s.get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

/// Asserts that `r` failed with `code`.
///
/// # Panics
/// With `what`, the expected code and what happened instead.
pub fn expect_code<T: std::fmt::Debug>(what: &str, r: Result<T, Status>, code: Code) -> Status {
    match r {
        Ok(v) => panic!("{what}: expected {code:?}, got success: {v:?}"),
        Err(s) => {
            assert_eq!(
                s.code(),
                code,
                "{what}: expected {code:?}, got {}",
                show(&s)
            );
            s
        }
    }
}

/// Asserts that `r` failed with INVALID_ARGUMENT naming every one of
/// `fields` in its `BadRequest` detail.
pub fn expect_invalid<T: std::fmt::Debug>(what: &str, r: Result<T, Status>, fields: &[&str]) {
    let s = expect_code(what, r, Code::InvalidArgument);
    let named = violation_fields(&s);
    for f in fields {
        assert!(
            named.iter().any(|n| n == f),
            "{what}: INVALID_ARGUMENT does not name field {f:?}; it names {named:?} ({})",
            s.message()
        );
    }
}

/// A non-follow, whole-history logs request.
pub fn logs_request(id: &str, service: &str) -> pb::StreamLogsRequest {
    pb::StreamLogsRequest {
        instance_id: id.to_string(),
        service_name: service.to_string(),
        ..Default::default()
    }
}

/// A log line's text without a trailing newline.
pub fn text(l: &pb::StreamLogsResponse) -> &str {
    l.line.trim_end_matches(['\n', '\r'])
}

/// Whether a line came from stdout.
pub fn is_stdout(l: &pb::StreamLogsResponse) -> bool {
    l.stream == pb::LogStream::Stdout as i32
}

/// Whether a line came from stderr.
pub fn is_stderr(l: &pb::StreamLogsResponse) -> bool {
    l.stream == pb::LogStream::Stderr as i32
}

/// The `n` of a `tick <n>` line.
pub fn tick(l: &pb::StreamLogsResponse) -> Option<u64> {
    text(l).strip_prefix("tick ")?.parse().ok()
}

/// The `n` of a `warn <n>` line.
pub fn warn(l: &pb::StreamLogsResponse) -> Option<u64> {
    text(l).strip_prefix("warn ")?.parse().ok()
}

/// A line as `service/replica stream @ts: text`, for failure messages.
pub fn describe_line(l: &pb::StreamLogsResponse) -> String {
    let stream = match pb::LogStream::try_from(l.stream) {
        Ok(pb::LogStream::Stdout) => "stdout",
        Ok(pb::LogStream::Stderr) => "stderr",
        _ => "?",
    };
    format!(
        "{}/{} {stream} @{}: {}",
        l.service_name,
        l.replica,
        nanos(l.timestamp.as_ref()),
        text(l)
    )
}

/// A timestamp as nanoseconds since the epoch (unset = `i128::MIN`).
pub fn nanos(t: Option<&Timestamp>) -> i128 {
    t.map_or(i128::MIN, |t| {
        i128::from(t.seconds) * 1_000_000_000 + i128::from(t.nanos)
    })
}

/// Nanoseconds since the epoch as a timestamp.
pub fn timestamp(nanos: i128) -> Timestamp {
    Timestamp {
        seconds: nanos.div_euclid(1_000_000_000) as i64,
        nanos: nanos.rem_euclid(1_000_000_000) as i32,
    }
}

/// The current time as nanoseconds since the epoch.
pub fn now_nanos() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// A protobuf duration.
pub fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A short description of a status for failure messages.
pub fn brief(s: &pb::InstanceStatus) -> String {
    let state = |v: i32| {
        pb::InstanceState::try_from(v)
            .map(|x| {
                x.as_str_name()
                    .trim_start_matches("INSTANCE_STATE_")
                    .to_string()
            })
            .unwrap_or_else(|_| v.to_string())
    };
    let mut services: Vec<_> = s
        .services
        .iter()
        .map(|(n, v)| {
            format!(
                "{n}: {} ready={} replicas={}/{} restarts={} exit={} msg={:?}",
                state(v.state),
                v.ready,
                v.ready_replicas,
                v.replicas,
                v.restarts,
                v.exit_code,
                v.message
            )
        })
        .collect();
    services.sort();
    format!(
        "state={} ready={} restarts={} started_at={} msg={:?} endpoints={:?} services=[{}]",
        state(s.state),
        s.ready,
        s.restarts,
        nanos(s.started_at.as_ref()),
        s.message,
        s.endpoints
            .iter()
            .map(|e| format!(
                "{}#{}:{}->{}:{}",
                e.service_name, e.replica, e.container_port, e.host, e.port
            ))
            .collect::<Vec<_>>(),
        services.join("; ")
    )
}

/// The endpoint of `service`'s replica `replica` for container port
/// `port`, as a host and port to connect to (an unspecified host means
/// this machine).
pub fn endpoint(
    s: &pb::InstanceStatus,
    service: &str,
    port: i32,
    replica: i32,
) -> Option<(String, u16)> {
    s.endpoints
        .iter()
        .find(|e| e.service_name == service && e.container_port == port && e.replica == replica)
        .map(|e| (connect_host(&e.host), e.port as u16))
}

fn connect_host(host: &str) -> String {
    match host {
        "" | "0.0.0.0" | "::" | "[::]" => "127.0.0.1".to_string(),
        h => h.to_string(),
    }
}

/// One plain HTTP/1.1 GET; `Ok` with the response when it is a 200.
///
/// # Errors
/// A description of what went wrong.
pub async fn http_get(host: &str, port: u16, path: &str) -> Result<String, String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("connect {host}:{port}: {e}"))?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(String::from_utf8_lossy(&resp).into_owned())
    };
    let resp = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| format!("GET {host}:{port}{path}: no answer within 5s"))??;
    if resp.starts_with("HTTP/1.1 200") || resp.starts_with("HTTP/1.0 200") {
        Ok(resp)
    } else {
        Err(format!("GET {host}:{port}{path}: not a 200: {resp:?}"))
    }
}

/// Waits until `host:port` answers HTTP 200.
pub async fn wait_http_ok(host: &str, port: u16) {
    eventually(&format!("HTTP 200 from {host}:{port}"), async || {
        http_get(host, port, "/").await.map(|_| ())
    })
    .await;
}

/// Waits until nothing listens on `host:port` any more.
pub async fn wait_port_closed(host: &str, port: u16) {
    eventually(
        &format!("nothing listening on {host}:{port}"),
        async || match tokio::time::timeout(
            Duration::from_secs(2),
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
        {
            Ok(Ok(_)) => Err("a connection was accepted".to_string()),
            Ok(Err(_)) => Ok(()),
            Err(_) => Err("connect timed out (still routed?)".to_string()),
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_nanos() {
        for n in [0i128, 1, 999_999_999, 1_700_000_000_123_456_789, -1] {
            assert_eq!(nanos(Some(&timestamp(n))), n);
        }
        assert_eq!(nanos(None), i128::MIN);
        let t = timestamp(-1);
        assert_eq!((t.seconds, t.nanos), (-1, 999_999_999));
    }

    #[test]
    fn endpoints_are_found_by_service_port_and_replica() {
        let ep = |service: &str, replica, host: &str, port| pb::Endpoint {
            service_name: service.into(),
            container_port: HTTP_PORT,
            replica,
            host: host.into(),
            port,
            ..Default::default()
        };
        let s = pb::InstanceStatus {
            endpoints: vec![
                ep("main", 0, "0.0.0.0", 4000),
                ep("main", 1, "10.0.0.2", 4001),
                ep("side", 0, "", 4002),
            ],
            ..Default::default()
        };
        assert_eq!(
            endpoint(&s, "main", HTTP_PORT, 0),
            Some(("127.0.0.1".into(), 4000))
        );
        assert_eq!(
            endpoint(&s, "main", HTTP_PORT, 1),
            Some(("10.0.0.2".into(), 4001))
        );
        assert_eq!(
            endpoint(&s, "side", HTTP_PORT, 0),
            Some(("127.0.0.1".into(), 4002))
        );
        assert_eq!(endpoint(&s, "main", 9090, 0), None);
        assert_eq!(endpoint(&s, "main", HTTP_PORT, 2), None);
    }

    #[test]
    fn log_lines_are_parsed() {
        let l = |line: &str, stream: pb::LogStream| pb::StreamLogsResponse {
            line: line.into(),
            stream: stream as i32,
            service_name: "main".into(),
            ..Default::default()
        };
        assert_eq!(tick(&l("tick 12\n", pb::LogStream::Stdout)), Some(12));
        assert_eq!(tick(&l("tock 12", pb::LogStream::Stdout)), None);
        assert_eq!(warn(&l("warn 5", pb::LogStream::Stderr)), Some(5));
        assert!(is_stdout(&l("x", pb::LogStream::Stdout)));
        assert!(is_stderr(&l("x", pb::LogStream::Stderr)));
        assert!(describe_line(&l("warn 5", pb::LogStream::Stderr)).contains("main/0 stderr"));
    }

    #[test]
    fn invalid_argument_fields_are_read_from_the_details() {
        let mut v = ctrlplane_core::Violations::new();
        v.add("instance_id", "is required");
        v.add("services[0].ports[0].container", "must be 1-65535, got 0");
        let status = v.to_status();
        assert_eq!(
            violation_fields(&status),
            vec!["instance_id", "services[0].ports[0].container"]
        );
        expect_invalid::<()>("x", Err(status.clone()), &["instance_id"]);
        let r = std::panic::catch_unwind(AssertUnwindSafe(|| {
            expect_invalid::<()>("x", Err(status.clone()), &["name"]);
        }));
        assert!(r.is_err(), "a missing field must fail the assertion");
        let r = std::panic::catch_unwind(|| expect_code("x", Ok(()), Code::NotFound));
        assert!(r.is_err(), "success must fail expect_code");
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_returns_the_first_ok_and_fails_with_the_last_error() {
        let mut n = 0;
        let v = eventually("three tries", async || {
            n += 1;
            if n < 3 {
                Err(format!("try {n}"))
            } else {
                Ok(n)
            }
        })
        .await;
        assert_eq!(v, 3);

        let r = tokio::spawn(async {
            eventually::<()>("never", async || Err("still no".to_string())).await;
        })
        .await;
        let panic = r.expect_err("must time out").into_panic();
        let msg = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("never") && msg.contains("still no"), "{msg}");
    }
}
