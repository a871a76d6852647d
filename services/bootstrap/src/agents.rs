//! Reaching a datacenter's agent: resolve it through the datacenter
//! service (`ResolveProvider`), keep one client per endpoint, and cache the
//! agent's capabilities for a short while.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctrlplane_agent::client::{ProviderClient, provider_client};
use ctrlplane_proto::datacenter::v1::{
    self as dcpb, datacenter_service_client::DatacenterServiceClient,
};
use ctrlplane_proto::provider::v1 as pb;
use ctrlplane_runtime::auth::Authenticator;
use ctrlplane_runtime::client::AuthedChannel;

use crate::error::{Error, Result};

/// How long fetched capabilities are trusted.
const CAPABILITIES_TTL: Duration = Duration::from_secs(30);

/// Capabilities per agent id, with the time they were fetched.
type CapabilityCache = Arc<Mutex<HashMap<String, (Vec<String>, Instant)>>>;

/// A resolved agent with a ready client.
#[derive(Clone)]
pub struct AgentHandle {
    /// Agent id.
    pub agent_id: String,
    /// Its endpoint.
    pub endpoint: String,
    /// A client for it.
    pub client: ProviderClient,
}

/// Resolves agents and hands out clients.
#[derive(Clone)]
pub struct AgentDirectory {
    datacenters: DatacenterServiceClient<AuthedChannel>,
    registry: AuthedChannel,
    auth: Arc<Authenticator>,
    clients: Arc<Mutex<HashMap<String, ProviderClient>>>,
    capabilities: CapabilityCache,
    call_timeout: Duration,
}

fn unavailable(what: &str, s: &tonic::Status) -> Error {
    Error::Unavailable(format!("{what}: {:?}: {}", s.code(), s.message()))
}

impl AgentDirectory {
    /// A directory asking the datacenter service over `channel`.
    pub fn new(channel: AuthedChannel, auth: Arc<Authenticator>, call_timeout: Duration) -> Self {
        AgentDirectory {
            datacenters: DatacenterServiceClient::new(channel.clone()),
            registry: channel,
            auth,
            clients: Default::default(),
            capabilities: Default::default(),
            call_timeout,
        }
    }

    /// The datacenter service client (also used to purge).
    pub fn datacenters(&self) -> DatacenterServiceClient<AuthedChannel> {
        self.datacenters.clone()
    }

    /// A channel to the agent registry (served by the datacenter process).
    pub fn registry_channel(&self) -> AuthedChannel {
        self.registry.clone()
    }

    /// Timeout for one agent call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout
    }

    /// A handle (with a cached client) for a known agent.
    ///
    /// # Errors
    /// `Unavailable` for an invalid endpoint.
    pub fn handle_for(&self, agent_id: &str, endpoint: &str) -> Result<AgentHandle> {
        self.handle(agent_id.to_string(), endpoint.to_string())
    }

    fn handle(&self, agent_id: String, endpoint: String) -> Result<AgentHandle> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let client = match clients.get(&endpoint) {
            Some(c) => c.clone(),
            None => {
                let c = provider_client(&endpoint, self.auth.clone(), "bootstrap")
                    .map_err(|e| Error::Unavailable(format!("agent {agent_id}: {e}")))?;
                clients.insert(endpoint.clone(), c.clone());
                c
            }
        };
        Ok(AgentHandle {
            agent_id,
            endpoint,
            client,
        })
    }

    async fn resolve_request(
        &self,
        req: dcpb::ResolveProviderRequest,
        what: &str,
    ) -> Result<AgentHandle> {
        let mut client = self.datacenters.clone();
        let mut req = tonic::Request::new(req);
        req.set_timeout(self.call_timeout);
        let r = client
            .resolve_provider(req)
            .await
            .map_err(|s| unavailable(&format!("no agent for {what}"), &s))?
            .into_inner();
        self.handle(r.agent_id, r.agent_endpoint)
    }

    /// The healthy agent serving a datacenter.
    ///
    /// # Errors
    /// `Unavailable` with the registry's reason.
    pub async fn for_datacenter(&self, datacenter_id: &str) -> Result<AgentHandle> {
        self.resolve_request(
            dcpb::ResolveProviderRequest {
                datacenter_id: datacenter_id.to_string(),
                provider_name: String::new(),
            },
            &format!("datacenter {datacenter_id}"),
        )
        .await
    }

    /// A healthy agent of a provider (for rows whose datacenter is gone).
    ///
    /// # Errors
    /// `Unavailable` with the registry's reason.
    pub async fn for_provider(&self, provider_name: &str) -> Result<AgentHandle> {
        self.resolve_request(
            dcpb::ResolveProviderRequest {
                datacenter_id: String::new(),
                provider_name: provider_name.to_string(),
            },
            &format!("provider {provider_name:?}"),
        )
        .await
    }

    /// The agent's capabilities (cached for a short while).
    ///
    /// # Errors
    /// `Unavailable` when the agent does not answer.
    pub async fn capabilities(&self, agent: &AgentHandle) -> Result<Vec<String>> {
        if let Some((caps, at)) = self
            .capabilities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&agent.agent_id)
            && at.elapsed() < CAPABILITIES_TTL
        {
            return Ok(caps.clone());
        }
        let mut client = agent.client.clone();
        let mut req = tonic::Request::new(pb::GetCapabilitiesRequest {});
        req.set_timeout(self.call_timeout);
        let caps = client
            .get_capabilities(req)
            .await
            .map_err(|s| unavailable(&format!("agent {}", agent.agent_id), &s))?
            .into_inner()
            .capabilities;
        self.capabilities
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.agent_id.clone(), (caps.clone(), Instant::now()));
        Ok(caps)
    }
}
