"""AgentRegistryService through the generated Python client: join tokens
(admin only, single use even under a race, forged ones refused), JoinAgent
without a bearer token and idempotent by its key, and datacenters that need
a registered agent for their provider."""

from __future__ import annotations

import threading
import uuid

import grpc
import jwt
import pytest
from google.protobuf import field_mask_pb2

from ctrlplane.agent.v1 import agent_pb2 as apb
from ctrlplane.datacenter.v1 import datacenter_pb2 as pb
from helpers import Code, expect_code, field_violations

H = apb.AgentHealth


def fresh_provider(prefix: str) -> str:
    """A provider name (DNS label) no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def admin_md(server):
    return [("authorization", f"Bearer {server.admin_token()}")]


def agents_of(server, provider: str) -> list[apb.Agent]:
    resp = server.registry().ListAgents(
        apb.ListAgentsRequest(provider_name=provider, page_size=1000), metadata=admin_md(server), timeout=30
    )
    return list(resp.agents)


def race(n: int, fn):
    """Runs fn(i) on n threads released together; returns each outcome (a
    result or the grpc.RpcError), in thread order."""
    barrier = threading.Barrier(n)
    out: list = [None] * n

    def run(i):
        barrier.wait(timeout=30)
        try:
            out[i] = fn(i)
        except grpc.RpcError as err:
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a JoinAgent call hung"
    return out


def test_fixture_agents_are_registered(server):
    from conftest import AGENT_ENDPOINT, AGENT_PROVIDERS

    for provider in AGENT_PROVIDERS:
        agents = agents_of(server, provider)
        assert agents, f"no {provider} agent registered by the fixture"
        assert all(a.provider_name == provider and a.endpoint == AGENT_ENDPOINT for a in agents)


def test_join_without_bearer_token_returns_identity_and_credential(server):
    provider = fresh_provider("join")
    token = server.join_token(provider)
    assert token.startswith("jtk_") and "." in token
    joined = server.join_agent(provider, token=token, endpoint="http://10.0.0.5:7401")
    assert joined.agent_id.startswith("agt_") and len(joined.agent_id) == 4 + 26
    assert joined.heartbeat_interval.seconds > 0
    # The credential is a bearer token bound to the agent.
    claims = jwt.decode(joined.credential, server.secret, algorithms=["HS256"])
    assert claims["sub"] == joined.agent_id
    assert claims.get("agent_id") == joined.agent_id
    assert claims["roles"] == ["system:agent"]

    [agent] = agents_of(server, provider)
    assert agent.id == joined.agent_id
    assert agent.endpoint == "http://10.0.0.5:7401" and agent.version == "pytest"
    assert list(agent.capabilities) == ["provision"]
    assert agent.health == H.AGENT_HEALTH_HEALTHY

    # It heartbeats with that credential.
    hb = server.registry().Heartbeat(
        apb.HeartbeatRequest(agent_id=joined.agent_id),
        metadata=[("authorization", f"Bearer {joined.credential}")],
        timeout=30,
    )
    assert hb.lease_expire_time.seconds > 0


def test_single_use_token_race_admits_exactly_one(server):
    """Two agents join with one single-use token at the same moment, each
    with its own idempotency key: exactly one gets in."""
    provider = fresh_provider("race")
    rounds = 5
    for _ in range(rounds):
        token = server.join_token(provider, max_uses=1)
        outcomes = race(2, lambda i: server.join_agent(provider, token=token, idempotency_key=f"racer-{i}-{uuid.uuid4().hex}"))
        won = [o for o in outcomes if isinstance(o, apb.JoinAgentResponse)]
        lost = [o for o in outcomes if isinstance(o, grpc.RpcError)]
        assert len(won) == 1, f"expected exactly one join to succeed, got {outcomes!r}"
        assert len(lost) == 1
        assert lost[0].code() == Code.PERMISSION_DENIED, f"{lost[0].code().name}: {lost[0].details()}"
        assert "no uses left" in lost[0].details()
    assert len(agents_of(server, provider)) == rounds


def test_retry_with_the_same_key_returns_the_same_agent(server):
    provider = fresh_provider("retry")
    token = server.join_token(provider, max_uses=1)
    first = server.join_agent(provider, token=token, idempotency_key="agent-key-1")
    again = server.join_agent(provider, token=token, idempotency_key="agent-key-1")
    assert again.agent_id == first.agent_id
    assert again.credential, "a retry gets a credential too"
    # The retry did not use the token again, and it is used up now.
    err = expect_code(
        Code.PERMISSION_DENIED, server.join_agent, provider, token=token, idempotency_key="agent-key-2"
    )
    assert "no uses left" in err.details()
    assert [a.id for a in agents_of(server, provider)] == [first.agent_id]


def test_concurrent_retries_with_the_same_key_get_one_agent(server):
    """A join whose answer was lost is retried while the first attempt is
    still in flight: both get the same identity, one agent is registered."""
    provider = fresh_provider("dupe")
    token = server.join_token(provider, max_uses=1)
    outcomes = race(2, lambda i: server.join_agent(provider, token=token, idempotency_key="same-key"))
    errors = [o for o in outcomes if isinstance(o, grpc.RpcError)]
    assert not errors, [f"{e.code().name}: {e.details()}" for e in errors]
    assert outcomes[0].agent_id == outcomes[1].agent_id
    assert len(agents_of(server, provider)) == 1


def test_join_token_is_for_admins_only(server):
    registry = server.registry()
    req = apb.CreateJoinTokenRequest(provider_name="process")
    tenant_md = [("authorization", f"Bearer {server.token(subject='t', tenant='acme')}")]
    expect_code(Code.PERMISSION_DENIED, registry.CreateJoinToken, req, metadata=tenant_md, timeout=30)
    service_md = [("authorization", f"Bearer {server.token(subject='svc', roles=['system:service'])}")]
    expect_code(Code.PERMISSION_DENIED, registry.CreateJoinToken, req, metadata=service_md, timeout=30)
    expect_code(Code.UNAUTHENTICATED, registry.CreateJoinToken, req, timeout=30)
    expect_code(Code.PERMISSION_DENIED, registry.ListAgents, apb.ListAgentsRequest(), metadata=tenant_md, timeout=30)


def test_forged_and_mismatched_join_tokens(server):
    provider = fresh_provider("forged")
    token = server.join_token(provider)
    token_id = token.split(".", 1)[0]
    for bad in [f"{token_id}.not-the-secret", "no-dot-at-all", server.admin_token()]:
        err = expect_code(Code.UNAUTHENTICATED, server.join_agent, provider, token=bad)
        assert "join token" in err.details(), err.details()
    # A token admits only agents of its provider.
    err = expect_code(Code.PERMISSION_DENIED, server.join_agent, "process", token=token)
    assert provider in err.details()
    # Bad fields are INVALID_ARGUMENT with a field violation each.
    err = expect_code(Code.INVALID_ARGUMENT, server.join_agent, "Not A Label", token=token, endpoint="10.0.0.5")
    fields = field_violations(err)
    assert "provider_name" in fields and "endpoint" in fields, fields
    # None of that used the token.
    assert server.join_agent(provider, token=token).agent_id.startswith("agt_")


def test_datacenter_needs_a_registered_provider(server, tenant):
    provider = fresh_provider("unreg")
    err = expect_code(Code.FAILED_PRECONDITION, tenant.create, "Nowhere 1", provider=provider)
    assert f'no agent has registered for provider "{provider}"' in err.details(), err.details()
    assert tenant.ListDatacenters(pb.ListDatacentersRequest(provider_name=provider)).total_size == 0

    # Moving an existing datacenter onto it fails the same way.
    dc = tenant.create("Somewhere 1", provider="process")
    err = expect_code(
        Code.FAILED_PRECONDITION,
        tenant.UpdateDatacenter,
        pb.UpdateDatacenterRequest(
            datacenter=pb.Datacenter(id=dc.id, provider_name=provider),
            update_mask=field_mask_pb2.FieldMask(paths=["provider_name"]),
        ),
    )
    assert provider in err.details()
    assert tenant.GetDatacenter(pb.GetDatacenterRequest(id=dc.id)).datacenter.provider_name == "process"

    # Once an agent joined, it works; the datacenter resolves to that agent.
    joined = server.join_agent(provider, endpoint="http://10.0.0.7:7401")
    created = tenant.create("Nowhere 1", provider=provider)
    assert created.provider_name == provider
    resolved = tenant.ResolveProvider(pb.ResolveProviderRequest(datacenter_id=created.id))
    assert (resolved.provider_name, resolved.agent_id, resolved.agent_endpoint) == (
        provider,
        joined.agent_id,
        "http://10.0.0.7:7401",
    )

    # Revoked, the agent no longer counts.
    revoked = server.registry().RevokeAgent(
        apb.RevokeAgentRequest(id=joined.agent_id), metadata=admin_md(server), timeout=30
    ).agent
    assert revoked.health == H.AGENT_HEALTH_REVOKED
    err = expect_code(Code.FAILED_PRECONDITION, tenant.create, "Nowhere 2", provider=provider)
    assert provider in err.details()
    expect_code(Code.UNAVAILABLE, tenant.ResolveProvider, pb.ResolveProviderRequest(datacenter_id=created.id))
