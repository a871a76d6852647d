//! The fast agent: a [`Provider`] that provisions instantly in memory.
//!
//! It keeps every instance in a map keyed by instance id, answers every
//! call at once and never fails, so what the benchmark measures is the
//! control plane itself (datacenter → scheduler → bootstrap → agent → rows
//! and events), not a backend. It keeps the provider contract: provision is
//! idempotent by instance id, deprovision of an unknown instance succeeds,
//! and `list_managed` pages through what it holds.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctrlplane_agent::{Capability, Provider, ProviderError};
use ctrlplane_proto::provider::v1 as pb;

/// One instance held by the agent.
#[derive(Debug, Clone)]
struct Instance {
    labels: std::collections::HashMap<String, String>,
    created_at: ctrlplane_proto::pbjson_types::Timestamp,
}

/// The in-memory agent. Cheap to clone (shared state).
#[derive(Clone, Default)]
pub struct FastAgent {
    instances: Arc<Mutex<BTreeMap<String, Instance>>>,
    provisions: Arc<AtomicU64>,
}

impl FastAgent {
    /// Instances currently held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// `Provision` calls received.
    pub fn provisions(&self) -> u64 {
        self.provisions.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instance>> {
        self.instances.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn running(&self, id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        if !self.lock().contains_key(id) {
            return Err(ProviderError::no_instance(id));
        }
        Ok(pb::InstanceStatus {
            instance_id: id.to_string(),
            state: pb::InstanceState::Running as i32,
            ready: true,
            ..Default::default()
        })
    }
}

fn now() -> ctrlplane_proto::pbjson_types::Timestamp {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    ctrlplane_proto::pbjson_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[tonic::async_trait]
impl Provider for FastAgent {
    fn info(&self) -> pb::GetInfoResponse {
        pb::GetInfoResponse {
            provider_name: "bench".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        vec![Capability::Provision]
    }

    async fn provision(
        &self,
        req: pb::ProvisionRequest,
    ) -> Result<pb::ProvisionResponse, ProviderError> {
        self.provisions.fetch_add(1, Ordering::Relaxed);
        self.lock()
            .entry(req.instance_id.clone())
            .or_insert_with(|| Instance {
                labels: req.labels.clone(),
                created_at: now(),
            });
        Ok(pb::ProvisionResponse {
            provider_ref: format!("bench/{}", req.instance_id),
            service_refs: req
                .services
                .iter()
                .map(|s| {
                    (
                        s.name.clone(),
                        format!("bench/{}/{}", req.instance_id, s.name),
                    )
                })
                .collect(),
            endpoints: Vec::new(),
            metadata: Default::default(),
        })
    }

    async fn deprovision(
        &self,
        instance_id: &str,
    ) -> Result<pb::DeprovisionResponse, ProviderError> {
        let existed = self.lock().remove(instance_id).is_some();
        Ok(pb::DeprovisionResponse { existed })
    }

    async fn start(&self, instance_id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        self.running(instance_id)
    }

    async fn stop(
        &self,
        instance_id: &str,
        _grace: Duration,
    ) -> Result<pb::InstanceStatus, ProviderError> {
        self.running(instance_id)
    }

    async fn restart(
        &self,
        instance_id: &str,
        _service: Option<&str>,
    ) -> Result<pb::InstanceStatus, ProviderError> {
        self.running(instance_id)
    }

    async fn status(&self, instance_id: &str) -> Result<pb::InstanceStatus, ProviderError> {
        self.running(instance_id)
    }

    async fn resources(&self, instance_id: &str) -> Result<pb::ResourceUsage, ProviderError> {
        self.running(instance_id)?;
        Ok(pb::ResourceUsage::default())
    }

    async fn check_health(&self) -> Result<pb::CheckHealthResponse, ProviderError> {
        Ok(pb::CheckHealthResponse {
            healthy: true,
            message: String::new(),
            instances: i32::try_from(self.len()).unwrap_or(i32::MAX),
        })
    }

    async fn list_managed(
        &self,
        page_size: u32,
        page_token: &str,
    ) -> Result<pb::ListManagedResponse, ProviderError> {
        let size = usize::try_from(page_size.clamp(1, 1000)).unwrap_or(1000);
        let map = self.lock();
        let mut page: Vec<pb::ManagedWorkload> = map
            .range::<str, _>((
                std::ops::Bound::Excluded(page_token),
                std::ops::Bound::Unbounded,
            ))
            .take(size + 1)
            .map(|(id, inst)| pb::ManagedWorkload {
                instance_id: id.clone(),
                labels: inst.labels.clone(),
                created_at: Some(inst.created_at),
                tenant_id: String::new(),
            })
            .collect();
        let next_page_token = if page.len() > size {
            page.truncate(size);
            page.last()
                .map(|w| w.instance_id.clone())
                .unwrap_or_default()
        } else {
            String::new()
        };
        Ok(pb::ListManagedResponse {
            workloads: page,
            next_page_token,
        })
    }
}
