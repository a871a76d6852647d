//! Thin gRPC adapter of the agent registry.

use std::time::Duration;

use ctrlplane_proto::agent::v1::{
    self as pb, agent_registry_service_server::AgentRegistryService as Rpc,
};
use ctrlplane_proto::pbjson_types;
use ctrlplane_runtime::auth::{Caller, caller};
use tonic::{Request, Response, Status};

use super::model::{Agent, Health, JoinToken};
use super::service::{AgentRegistry, JoinInput};
use crate::convert::timestamp;

/// Full path of `JoinAgent`, which authenticates with its join token
/// instead of a bearer token.
pub const JOIN_AGENT_PATH: &str = "/ctrlplane.agent.v1.AgentRegistryService/JoinAgent";

/// The gRPC face of [`AgentRegistry`].
#[derive(Clone, Debug)]
pub struct AgentRegistryGrpc {
    registry: AgentRegistry,
}

impl AgentRegistryGrpc {
    /// Wraps the registry.
    pub fn new(registry: AgentRegistry) -> Self {
        AgentRegistryGrpc { registry }
    }
}

fn duration(d: Duration) -> pbjson_types::Duration {
    pbjson_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn from_duration(d: &pbjson_types::Duration) -> Result<Duration, Status> {
    if d.seconds < 0 || d.nanos < 0 {
        let mut v = ctrlplane_core::Violations::new();
        v.add("ttl", "must not be negative");
        return Err(v.to_status());
    }
    Ok(Duration::new(d.seconds as u64, d.nanos as u32))
}

fn agent_to_proto(a: &Agent, now: chrono::DateTime<chrono::Utc>) -> pb::Agent {
    pb::Agent {
        id: a.id.clone(),
        provider_name: a.provider_name.clone(),
        endpoint: a.endpoint.clone(),
        version: a.version.clone(),
        capabilities: a.capabilities.clone(),
        info: a.info.clone().into_iter().collect(),
        health: match a.health(now) {
            Health::Healthy => pb::AgentHealth::Healthy,
            Health::Unhealthy => pb::AgentHealth::Unhealthy,
            Health::Revoked => pb::AgentHealth::Revoked,
        } as i32,
        last_heartbeat_time: Some(timestamp(a.last_heartbeat_time)),
        lease_expire_time: Some(timestamp(a.lease_expire_time)),
        last_checked_at: a.last_checked_at.map(timestamp),
        last_latency: a.last_latency.map(duration),
        last_error: a.last_error.clone(),
        create_time: Some(timestamp(a.create_time)),
        update_time: Some(timestamp(a.update_time)),
    }
}

fn token_to_proto(t: &JoinToken) -> pb::JoinToken {
    pb::JoinToken {
        id: t.id.clone(),
        provider_name: t.provider_name.clone(),
        expire_time: Some(timestamp(t.expire_time)),
        max_uses: t.max_uses,
        uses: t.uses,
        create_time: Some(timestamp(t.create_time)),
    }
}

fn req_caller<T>(req: &Request<T>) -> Result<Caller, Status> {
    caller(req)
}

#[tonic::async_trait]
impl Rpc for AgentRegistryGrpc {
    async fn create_join_token(
        &self,
        req: Request<pb::CreateJoinTokenRequest>,
    ) -> Result<Response<pb::CreateJoinTokenResponse>, Status> {
        let caller = req_caller(&req)?;
        let r = req.into_inner();
        let ttl = r.ttl.as_ref().map(from_duration).transpose()?;
        let (token, plain) = self
            .registry
            .create_join_token(&caller, &r.provider_name, ttl, r.max_uses)
            .await?;
        Ok(Response::new(pb::CreateJoinTokenResponse {
            join_token: Some(token_to_proto(&token)),
            token: plain,
        }))
    }

    async fn join_agent(
        &self,
        req: Request<pb::JoinAgentRequest>,
    ) -> Result<Response<pb::JoinAgentResponse>, Status> {
        let r = req.into_inner();
        let joined = self
            .registry
            .join(JoinInput {
                token: r.token,
                provider_name: r.provider_name,
                endpoint: r.endpoint,
                version: r.version,
                info: r.info.into_iter().collect(),
                capabilities: r.capabilities,
                idempotency_key: r.idempotency_key,
            })
            .await?;
        Ok(Response::new(pb::JoinAgentResponse {
            agent_id: joined.agent.id,
            credential: joined.credential,
            heartbeat_interval: Some(duration(joined.heartbeat_interval)),
        }))
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        let caller = req_caller(&req)?;
        let r = req.get_ref();
        let (agent, fresh) = self
            .registry
            .heartbeat(&caller, &r.agent_id, &r.endpoint, &r.capabilities)
            .await?;
        Ok(Response::new(pb::HeartbeatResponse {
            lease_expire_time: Some(timestamp(agent.lease_expire_time)),
            heartbeat_interval: Some(duration(self.registry.config().heartbeat_interval)),
            credential: fresh.unwrap_or_default(),
        }))
    }

    async fn list_agents(
        &self,
        req: Request<pb::ListAgentsRequest>,
    ) -> Result<Response<pb::ListAgentsResponse>, Status> {
        let caller = req_caller(&req)?;
        let r = req.get_ref();
        let (agents, next) = self
            .registry
            .list(&caller, &r.provider_name, r.page_size, &r.page_token)
            .await?;
        let now = self.registry.now();
        Ok(Response::new(pb::ListAgentsResponse {
            agents: agents.iter().map(|a| agent_to_proto(a, now)).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn get_agent(
        &self,
        req: Request<pb::GetAgentRequest>,
    ) -> Result<Response<pb::GetAgentResponse>, Status> {
        let caller = req_caller(&req)?;
        let agent = self.registry.get(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::GetAgentResponse {
            agent: Some(agent_to_proto(&agent, self.registry.now())),
        }))
    }

    async fn revoke_agent(
        &self,
        req: Request<pb::RevokeAgentRequest>,
    ) -> Result<Response<pb::RevokeAgentResponse>, Status> {
        let caller = req_caller(&req)?;
        let agent = self.registry.revoke(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::RevokeAgentResponse {
            agent: Some(agent_to_proto(&agent, self.registry.now())),
        }))
    }

    async fn check_agents(
        &self,
        req: Request<pb::CheckAgentsRequest>,
    ) -> Result<Response<pb::CheckAgentsResponse>, Status> {
        let caller = req_caller(&req)?;
        let agents = self.registry.check_agents(&caller).await?;
        let now = self.registry.now();
        Ok(Response::new(pb::CheckAgentsResponse {
            agents: agents.iter().map(|a| agent_to_proto(a, now)).collect(),
        }))
    }
}
