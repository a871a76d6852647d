//! The agent side of joining (ctrlplane_agent::join) against the real
//! registry over gRPC: first join writes the identity, the identity is a
//! one-way lock, refusals are final and immediate, an unreachable control
//! plane is retried until it appears, a lost answer is recovered with the
//! persisted key, heartbeats renew the lease and a revoked agent is told so.

mod common;

use std::time::Duration;

use common::server::{RawAuth, Server, channel, start, start_at, token};
use ctrlplane_agent::join::{
    HeartbeatError, JOIN_KEY_FILE, JoinError, JoinOptions, ensure_identity, heartbeat_loop,
    load_identity,
};
use ctrlplane_proto::agent::v1::{
    self as pb, agent_registry_service_client::AgentRegistryServiceClient,
};
use ctrlplane_runtime::auth::ROLE_ADMIN;
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

type Admin = AgentRegistryServiceClient<InterceptedService<Channel, RawAuth>>;

fn admin(s: &Server) -> Admin {
    AgentRegistryServiceClient::with_interceptor(
        channel(s),
        RawAuth(Some(format!(
            "Bearer {}",
            token("admin", "", &[ROLE_ADMIN])
        ))),
    )
}

async fn mint(s: &Server, provider: &str, uses: i32) -> String {
    admin(s)
        .create_join_token(pb::CreateJoinTokenRequest {
            provider_name: provider.into(),
            ttl: None,
            max_uses: uses,
        })
        .await
        .unwrap()
        .into_inner()
        .token
}

fn options(s: &Server, dir: &std::path::Path, token: Option<String>) -> JoinOptions {
    let mut o = JoinOptions::new(
        format!("http://{}", s.addr),
        dir,
        "nomad",
        "http://127.0.0.1:7404",
    );
    o.join_token = token;
    o.initial_backoff = Duration::from_millis(20);
    o.max_backoff = Duration::from_millis(200);
    o.capabilities = vec!["provision".into()];
    o
}

async fn agents(s: &Server, provider: &str) -> Vec<pb::Agent> {
    admin(s)
        .list_agents(pb::ListAgentsRequest {
            provider_name: provider.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .agents
}

#[tokio::test]
async fn join_once_then_the_identity_is_the_lock() {
    let s = start().await;
    let dir = tempfile::tempdir().unwrap();
    let first = ensure_identity(&options(&s, dir.path(), Some(mint(&s, "nomad", 1).await)))
        .await
        .unwrap();
    assert!(first.agent_id.starts_with("agt_"));
    assert_eq!(load_identity(dir.path()).unwrap().as_ref(), Some(&first));
    assert!(!dir.path().join(JOIN_KEY_FILE).exists());

    // Restarting with a new token keeps the identity and uses no token.
    let unused = mint(&s, "nomad", 1).await;
    let again = ensure_identity(&options(&s, dir.path(), Some(unused.clone())))
        .await
        .unwrap();
    assert_eq!(again, first);
    assert_eq!(agents(&s, "nomad").await.len(), 1);
    // The unused token still admits another agent.
    let other = tempfile::tempdir().unwrap();
    let second = ensure_identity(&options(&s, other.path(), Some(unused)))
        .await
        .unwrap();
    assert_ne!(second.agent_id, first.agent_id);
}

#[tokio::test]
async fn refusals_are_final_and_immediate() {
    let s = start().await;
    let used = mint(&s, "nomad", 1).await;
    ensure_identity(&options(
        &s,
        tempfile::tempdir().unwrap().path(),
        Some(used.clone()),
    ))
    .await
    .unwrap();
    let expired_or_forged = format!("{}.forged", used.split_once('.').unwrap().0);
    let wrong_provider = mint(&s, "docker", 1).await;
    for (tok, code) in [
        (used, Code::PermissionDenied),
        (expired_or_forged, Code::Unauthenticated),
        (wrong_provider, Code::PermissionDenied),
    ] {
        let dir = tempfile::tempdir().unwrap();
        // No max_attempts: a retry loop would hang here; a refusal returns.
        let res = tokio::time::timeout(
            Duration::from_secs(20),
            ensure_identity(&options(&s, dir.path(), Some(tok))),
        )
        .await
        .expect("a refusal is not retried");
        match res {
            Err(JoinError::Rejected { code: c, .. }) => assert_eq!(c, code),
            other => panic!("{other:?}"),
        }
        assert!(load_identity(dir.path()).unwrap().is_none());
    }
}

#[tokio::test]
async fn unreachable_control_plane_is_retried_until_it_appears() {
    // Reserve a port, release it, start joining, then start the server there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut opts = JoinOptions::new(
        format!("http://127.0.0.1:{port}"),
        dir.path(),
        "process",
        "http://127.0.0.1:7401",
    );
    opts.initial_backoff = Duration::from_millis(20);
    opts.max_backoff = Duration::from_millis(200);
    // The token can only be minted once the server is up: the joining task
    // receives it over a channel and then joins.
    let (tx, rx) = tokio::sync::oneshot::channel::<String>();
    let join = tokio::spawn(async move {
        let token = rx.await.unwrap();
        opts.join_token = Some(token);
        ensure_identity(&opts).await
    });
    // While nothing listens, joins are retried (and give up only when told).
    let probe_dir = tempfile::tempdir().unwrap();
    let mut probe = JoinOptions::new(
        format!("http://127.0.0.1:{port}"),
        probe_dir.path(),
        "process",
        "http://127.0.0.1:7401",
    );
    probe.join_token = Some("jtk_01h455vb4pex5vsknk084sn02q.x".into());
    probe.initial_backoff = Duration::from_millis(5);
    probe.max_backoff = Duration::from_millis(20);
    probe.max_attempts = Some(3);
    assert!(matches!(
        ensure_identity(&probe).await,
        Err(JoinError::GaveUp { attempts: 3, .. })
    ));

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let s = start_at(listener).await;
    tx.send(mint(&s, "process", 1).await).unwrap();
    let id = tokio::time::timeout(Duration::from_secs(30), join)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(id.agent_id.starts_with("agt_"));
}

#[tokio::test]
async fn lost_answer_is_recovered_with_the_persisted_key() {
    let s = start().await;
    let tok = mint(&s, "nomad", 1).await;
    let dir = tempfile::tempdir().unwrap();
    // The agent persisted its key and sent the join, then crashed before
    // the answer arrived: the server registered it and used the token.
    std::fs::write(dir.path().join(JOIN_KEY_FILE), "crash-key").unwrap();
    let mut anon = AgentRegistryServiceClient::new(channel(&s));
    let lost = anon
        .join_agent(pb::JoinAgentRequest {
            token: tok.clone(),
            provider_name: "nomad".into(),
            endpoint: "http://127.0.0.1:7404".into(),
            idempotency_key: "crash-key".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    // On restart, the same token and key bring back the same identity.
    let id = ensure_identity(&options(&s, dir.path(), Some(tok)))
        .await
        .unwrap();
    assert_eq!(id.agent_id, lost.agent_id);
    assert_eq!(agents(&s, "nomad").await.len(), 1);
}

#[tokio::test]
async fn heartbeats_renew_the_lease_and_revocation_stops_them() {
    let s = start().await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&s, dir.path(), Some(mint(&s, "nomad", 1).await));
    let mut id = ensure_identity(&opts).await.unwrap();
    id.heartbeat_interval_ms = 50;
    let before = admin(&s)
        .get_agent(pb::GetAgentRequest {
            id: id.agent_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap()
        .lease_expire_time
        .unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let beat = tokio::spawn(heartbeat_loop(id.clone(), opts.clone(), async {
        let _ = stop_rx.await;
    }));
    // Wait until the lease moved forward.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let now = admin(&s)
            .get_agent(pb::GetAgentRequest {
                id: id.agent_id.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .agent
            .unwrap();
        let lease = now.lease_expire_time.unwrap();
        if (lease.seconds, lease.nanos) > (before.seconds, before.nanos) {
            assert_eq!(now.health, pb::AgentHealth::Healthy as i32);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "lease never renewed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop_tx.send(()).unwrap();
    beat.await.unwrap().unwrap();

    // Revoked: the next heartbeat is refused and the loop ends saying so.
    admin(&s)
        .revoke_agent(pb::RevokeAgentRequest {
            id: id.agent_id.clone(),
        })
        .await
        .unwrap();
    let res = tokio::time::timeout(
        Duration::from_secs(20),
        heartbeat_loop(id, opts, std::future::pending()),
    )
    .await
    .unwrap();
    match res {
        Err(HeartbeatError::Refused { code, message, .. }) => {
            assert_eq!(code, Code::Unauthenticated);
            assert!(message.contains("revoked"), "{message}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn auto_join_mints_its_own_single_use_token_with_the_secret() {
    let s = start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut o = options(&s, dir.path(), None);
    o.auto_join = Some(std::sync::Arc::new(
        ctrlplane_runtime::auth::Authenticator::new(common::server::SECRET),
    ));
    let id = ensure_identity(&o).await.unwrap();
    assert_eq!(agents(&s, "nomad").await.len(), 1);
    assert_eq!(load_identity(dir.path()).unwrap(), Some(id.clone()));
    // The minted token was used up and is forgotten with the key.
    assert!(
        !dir.path()
            .join(ctrlplane_agent::join::AUTO_TOKEN_FILE)
            .exists()
    );
    assert!(!dir.path().join(JOIN_KEY_FILE).exists());
    // Joined once: a restart keeps the identity, registers nobody new.
    assert_eq!(ensure_identity(&o).await.unwrap(), id);
    assert_eq!(agents(&s, "nomad").await.len(), 1);

    // A minted token the registry refuses (here: one that does not exist)
    // is dropped, so the next start mints a fresh one and joins.
    let stale = tempfile::tempdir().unwrap();
    std::fs::write(
        stale.path().join(ctrlplane_agent::join::AUTO_TOKEN_FILE),
        "jtk_00000000000000000000000000.nope",
    )
    .unwrap();
    let mut o = options(&s, stale.path(), None);
    o.auto_join = Some(std::sync::Arc::new(
        ctrlplane_runtime::auth::Authenticator::new(common::server::SECRET),
    ));
    assert!(matches!(
        ensure_identity(&o).await,
        Err(JoinError::Rejected { .. })
    ));
    assert!(
        !stale
            .path()
            .join(ctrlplane_agent::join::AUTO_TOKEN_FILE)
            .exists()
    );
    ensure_identity(&o).await.unwrap();
    assert_eq!(agents(&s, "nomad").await.len(), 2);

    // A secret the control plane does not share is a final refusal.
    let other = tempfile::tempdir().unwrap();
    let mut o = options(&s, other.path(), None);
    o.auto_join = Some(std::sync::Arc::new(
        ctrlplane_runtime::auth::Authenticator::new(b"another-secret-another-secret-another"),
    ));
    match ensure_identity(&o).await.unwrap_err() {
        JoinError::Rejected { code, message } => {
            assert_eq!(code, Code::Unauthenticated, "{message}");
            assert!(message.contains("CP_AUTH_SECRET"), "{message}");
        }
        e => panic!("{e:?}"),
    }
}
