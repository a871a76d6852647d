//! The agent registry on SQLite and Postgres: join tokens (expired, reused,
//! wrong-provider, forged), races for a single-use token, lost-answer
//! retries, heartbeats, revocation, and resolution to healthy agents only.

mod common;

use std::time::Duration;

use common::{Backend, SECRET, admin, env, system_service, tenant};
use ctrlplane_datacenter::Error;
use ctrlplane_datacenter::agents::model::Health;
use ctrlplane_datacenter::agents::service::{AgentRegistry, JoinInput};
use ctrlplane_datacenter::model::{DatacenterPatch, NewDatacenter};
use ctrlplane_runtime::auth::{Authenticator, Caller, ROLE_AGENT};

fn input(token: &str, provider: &str, key: &str) -> JoinInput {
    JoinInput {
        token: token.to_string(),
        provider_name: provider.to_string(),
        endpoint: "http://127.0.0.1:7401".to_string(),
        version: "1.0".to_string(),
        capabilities: vec!["provision".into(), "logs".into()],
        idempotency_key: key.to_string(),
        ..Default::default()
    }
}

fn agent_caller(credential: &str) -> Caller {
    Caller {
        claims: Authenticator::new(SECRET).verify(credential).unwrap(),
    }
}

async fn token(r: &AgentRegistry, provider: &str, uses: i32) -> String {
    r.create_join_token(&admin(), provider, None, uses)
        .await
        .unwrap()
        .1
}

async fn join_tokens_are_checked(b: Backend) {
    let Some(e) = env(b).await else { return };
    let r = &e.registry;

    // Only admins mint; bad input names every field.
    let err = r
        .create_join_token(&tenant("t"), "nomad", None, 1)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let err = r
        .create_join_token(&admin(), "Bad Name", Some(Duration::ZERO), -1)
        .await
        .unwrap_err();
    match err {
        Error::InvalidArgument(v) => {
            let f: Vec<_> = v.iter().map(|x| x.field.as_str()).collect();
            assert_eq!(f, ["provider_name", "ttl", "max_uses"]);
        }
        other => panic!("{other:?}"),
    }

    // A good join: the credential is a system:agent token bound to the id.
    let tok = token(r, "nomad", 1).await;
    let joined = r.join(input(&tok, "nomad", "k1")).await.unwrap();
    let claims = Authenticator::new(SECRET)
        .verify(&joined.credential)
        .unwrap();
    assert_eq!(claims.roles, [ROLE_AGENT]);
    assert_eq!(claims.agent_id.as_deref(), Some(joined.agent.id.as_str()));
    assert_eq!(joined.agent.capabilities, ["provision", "logs"]);

    // Reused: a second agent (another key) finds no use left.
    let err = r.join(input(&tok, "nomad", "k2")).await.unwrap_err();
    assert!(
        matches!(err, Error::PermissionDenied(ref m) if m.contains("no uses left")),
        "{err:?}"
    );
    // Lost answer: the same key gets the same identity, even now.
    let again = r.join(input(&tok, "nomad", "k1")).await.unwrap();
    assert_eq!(again.agent.id, joined.agent.id);

    // Wrong provider.
    let tok2 = token(r, "nomad", 1).await;
    let err = r.join(input(&tok2, "docker", "k3")).await.unwrap_err();
    assert!(
        matches!(err, Error::PermissionDenied(ref m) if m.contains("\"nomad\"")),
        "{err:?}"
    );

    // Forged: right id, wrong secret; unknown id; garbage.
    let (id, _) = tok2.split_once('.').unwrap();
    for forged in [
        format!("{id}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        "jtk_01h455vb4pex5vsknk084sn02q.secret".to_string(),
        "garbage".to_string(),
    ] {
        let err = r.join(input(&forged, "nomad", "k4")).await.unwrap_err();
        assert!(
            matches!(err, Error::Unauthenticated(ref m) if m == "invalid join token"),
            "{err:?}"
        );
    }

    // Expired.
    let tok3 = r
        .create_join_token(&admin(), "nomad", Some(Duration::from_secs(60)), 5)
        .await
        .unwrap()
        .1;
    e.clock.advance(Duration::from_secs(61));
    let err = r.join(input(&tok3, "nomad", "k5")).await.unwrap_err();
    assert!(
        matches!(err, Error::Unauthenticated(ref m) if m.contains("expired")),
        "{err:?}"
    );

    // Bad join input names every field.
    let err = r
        .join(JoinInput {
            token: String::new(),
            provider_name: "NOPE".into(),
            endpoint: "localhost".into(),
            capabilities: vec!["Bad Cap".into()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    match err {
        Error::InvalidArgument(v) => {
            let f: Vec<_> = v.iter().map(|x| x.field.as_str()).collect();
            assert_eq!(f, ["token", "provider_name", "endpoint", "capabilities[0]"]);
        }
        other => panic!("{other:?}"),
    }
}

async fn racing_for_a_single_use_token(b: Backend) {
    let Some(e) = env(b).await else { return };
    let tok = token(&e.registry, "nomad", 1).await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let r = e.registry.clone();
        let tok = tok.clone();
        tasks.push(tokio::spawn(async move {
            r.join(input(&tok, "nomad", &format!("racer-{i}"))).await
        }));
    }
    let mut winners = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => winners += 1,
            Err(Error::PermissionDenied(m)) => assert!(m.contains("no uses left"), "{m}"),
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(winners, 1);
    let (agents, _) = e.registry.list(&admin(), "nomad", 100, "").await.unwrap();
    assert_eq!(agents.len(), 1);

    // Concurrent retries of one join (same key) register one agent, also
    // when the token has a single use (the retries that lose the race for
    // it find the winner's identity).
    for uses in [1, 3] {
        let provider = format!("same-key-{uses}");
        let tok = token(&e.registry, &provider, uses).await;
        let mut tasks = Vec::new();
        for _ in 0..6 {
            let (r, tok, provider) = (e.registry.clone(), tok.clone(), provider.clone());
            tasks.push(tokio::spawn(async move {
                r.join(input(&tok, &provider, "same-key")).await
            }));
        }
        let mut ids = std::collections::HashSet::new();
        for t in tasks {
            ids.insert(t.await.unwrap().unwrap().agent.id);
        }
        assert_eq!(ids.len(), 1, "max_uses {uses}: {ids:?}");
    }
    let tok = token(&e.registry, "nomad", 3).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let r = e.registry.clone();
        let tok = tok.clone();
        tasks.push(tokio::spawn(async move {
            r.join(input(&tok, "nomad", "same-key"))
                .await
                .unwrap()
                .agent
                .id
        }));
    }
    let mut ids = std::collections::HashSet::new();
    for t in tasks {
        ids.insert(t.await.unwrap());
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let (agents, _) = e.registry.list(&admin(), "nomad", 100, "").await.unwrap();
    assert_eq!(agents.len(), 2);
}

async fn heartbeats_revocation_and_resolution(b: Backend) {
    let Some(e) = env(b).await else { return };
    let r = &e.registry;
    let a1 = r
        .join(input(&token(r, "nomad", 1).await, "nomad", "a1"))
        .await
        .unwrap();
    e.clock.advance(Duration::from_secs(1));
    let a2 = r
        .join(input(&token(r, "nomad", 1).await, "nomad", "a2"))
        .await
        .unwrap();
    let c1 = agent_caller(&a1.credential);
    let c2 = agent_caller(&a2.credential);

    // The most recent heartbeat wins.
    assert_eq!(r.resolve("nomad").await.unwrap().id, a2.agent.id);
    e.clock.advance(Duration::from_secs(1));
    let (hb, fresh) = r
        .heartbeat(&c1, &a1.agent.id, "http://127.0.0.1:7999", &[])
        .await
        .unwrap();
    assert!(fresh.is_none(), "credential is young");
    assert_eq!(hb.endpoint, "http://127.0.0.1:7999");
    let resolved = r.resolve("nomad").await.unwrap();
    assert_eq!(
        (resolved.id.as_str(), resolved.endpoint.as_str()),
        (a1.agent.id.as_str(), "http://127.0.0.1:7999")
    );

    // An agent can only heartbeat for itself; admins are not agents.
    let err = r.heartbeat(&c2, &a1.agent.id, "", &[]).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let err = r
        .heartbeat(&admin(), &a1.agent.id, "", &[])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");

    // Past its lease an agent is unhealthy and skipped.
    e.clock.advance(r.config().lease_ttl);
    r.heartbeat(&c2, &a2.agent.id, "", &[]).await.unwrap();
    assert_eq!(r.resolve("nomad").await.unwrap().id, a2.agent.id);
    let a1_now = r.get(&admin(), &a1.agent.id).await.unwrap();
    assert_eq!(a1_now.health(r.now()), Health::Unhealthy);

    // Revoked: its credential stops working at once and it is never resolved.
    r.revoke(&admin(), &a2.agent.id).await.unwrap();
    let err = r.heartbeat(&c2, &a2.agent.id, "", &[]).await.unwrap_err();
    assert!(
        matches!(err, Error::Unauthenticated(ref m) if m.contains("revoked")),
        "{err:?}"
    );
    let err = r.resolve("nomad").await.unwrap_err();
    match err {
        Error::Unavailable(m) => assert!(
            m.contains("no healthy agent") && m.contains("lease expired"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    // A retried join of a revoked agent is refused.
    let err = r.revoke(&tenant("t"), &a1.agent.id).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    assert!(
        matches!(r.resolve("kubernetes").await, Err(Error::Unavailable(ref m)) if m.contains("no agent has joined"))
    );

    // A credential near its expiry is refreshed by a heartbeat.
    e.clock
        .advance(r.config().credential_ttl - Duration::from_secs(3600));
    let mut old = c1.clone();
    old.claims.exp = (r.now().timestamp() + 3600) as u64;
    let (_, fresh) = r.heartbeat(&old, &a1.agent.id, "", &[]).await.unwrap();
    assert!(fresh.is_some());
}

async fn health_probe_failures_make_agents_unhealthy(b: Backend) {
    let Some(e) = env(b).await else { return };
    // The agents joined by `env` point at a closed port: probes fail.
    let err = e.registry.check_agents(&tenant("t")).await.unwrap_err();
    assert!(matches!(err, Error::PermissionDenied(_)), "{err:?}");
    let probed = e.registry.check_agents(&system_service()).await.unwrap();
    assert_eq!(probed.len(), 2);
    for a in &probed {
        assert_eq!(a.probe_ok, Some(false), "{a:?}");
        assert!(!a.last_error.is_empty());
        assert!(a.last_checked_at.is_some());
        assert_eq!(a.health(e.registry.now()), Health::Unhealthy);
    }
    let err = e.registry.resolve("process").await.unwrap_err();
    assert!(
        matches!(err, Error::Unavailable(ref m) if m.contains("last health probe failed")),
        "{err:?}"
    );
}

async fn datacenters_need_a_registered_provider(b: Backend) {
    let Some(e) = env(b).await else { return };
    let err = e
        .svc
        .create(
            &admin(),
            NewDatacenter {
                name: "k8s".into(),
                provider_name: "kubernetes".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::FailedPrecondition(ref m) if m.contains("\"kubernetes\"")),
        "{err:?}"
    );
    let dc = e
        .svc
        .create(
            &admin(),
            NewDatacenter {
                name: "p".into(),
                provider_name: "process".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let err = e
        .svc
        .update(
            &admin(),
            &dc.id,
            DatacenterPatch {
                provider_name: Some("kubernetes".into()),
                ..Default::default()
            },
            Default::default(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
    // ResolveProvider answers with the agent; its probe state counts.
    let (_, agent) = e.svc.resolve_provider(&admin(), &dc.id).await.unwrap();
    assert_eq!(agent.endpoint, "http://127.0.0.1:9");
}

on_both_backends!(
    join_tokens_are_checked,
    racing_for_a_single_use_token,
    heartbeats_revocation_and_resolution,
    health_probe_failures_make_agents_unhealthy,
    datacenters_need_a_registered_provider,
);
