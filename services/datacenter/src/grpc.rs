//! Thin gRPC adapter: decode the request, call the service, encode the
//! answer. No business rules here.

use std::pin::Pin;

use ctrlplane_core::Violations;
use ctrlplane_proto::datacenter::v1::{
    self as pb, datacenter_service_server::DatacenterService as Rpc,
};
use ctrlplane_runtime::auth::caller;
use futures::Stream;
use tonic::{Request, Response, Status};

use crate::convert::status_from_proto;
use crate::model::{DatacenterPatch, NewDatacenter};
use crate::service::{DatacenterService, ListFilterInput};

/// Paths `UpdateDatacenter` accepts in its mask.
pub const UPDATABLE_PATHS: &[&str] = &[
    "name",
    "provider_name",
    "region",
    "zone",
    "location",
    "capacity",
    "labels",
    "metadata",
    "bootstrap_services",
];

/// The gRPC face of [`DatacenterService`].
#[derive(Clone, Debug)]
pub struct DatacenterGrpc {
    service: DatacenterService,
}

impl DatacenterGrpc {
    /// Wraps the service.
    pub fn new(service: DatacenterService) -> Self {
        DatacenterGrpc { service }
    }
}

fn new_datacenter(d: pb::Datacenter) -> NewDatacenter {
    NewDatacenter {
        tenant_id: Some(d.tenant_id).filter(|t| !t.is_empty()),
        name: d.name,
        provider_name: d.provider_name,
        region: d.region,
        zone: d.zone,
        location: d.location,
        capacity: d.capacity,
        labels: d.labels.into_iter().collect(),
        metadata: d.metadata.into_iter().collect(),
        bootstrap_services: d.bootstrap_services,
    }
}

/// Builds a patch from the mask; unknown or immutable paths are violations
/// on `update_mask.paths[i]`.
fn patch_from_mask(d: pb::Datacenter, paths: &[String], v: &mut Violations) -> DatacenterPatch {
    let mut patch = DatacenterPatch::default();
    if paths.is_empty() {
        v.add(
            "update_mask",
            format!(
                "must name at least one field to change; updatable: {}",
                UPDATABLE_PATHS.join(", ")
            ),
        );
    }
    for (i, path) in paths.iter().enumerate() {
        match path.as_str() {
            "name" => patch.name = Some(d.name.clone()),
            "provider_name" => patch.provider_name = Some(d.provider_name.clone()),
            "region" => patch.region = Some(d.region.clone()),
            "zone" => patch.zone = Some(d.zone.clone()),
            "location" => patch.location = Some(d.location.clone()),
            "capacity" => patch.capacity = Some(d.capacity),
            "labels" => patch.labels = Some(d.labels.clone().into_iter().collect()),
            "metadata" => patch.metadata = Some(d.metadata.clone().into_iter().collect()),
            "bootstrap_services" => patch.bootstrap_services = Some(d.bootstrap_services.clone()),
            other => v.add(
                format!("update_mask.paths[{i}]"),
                format!(
                    "{other:?} is not an updatable field (updatable: {})",
                    UPDATABLE_PATHS.join(", ")
                ),
            ),
        }
    }
    patch
}

fn required(v: Option<pb::Datacenter>) -> Result<pb::Datacenter, Status> {
    v.ok_or_else(|| {
        let mut v = Violations::new();
        v.add("datacenter", "is required");
        v.to_status()
    })
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchDatacentersResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Rpc for DatacenterGrpc {
    async fn create_datacenter(
        &self,
        req: Request<pb::CreateDatacenterRequest>,
    ) -> Result<Response<pb::CreateDatacenterResponse>, Status> {
        let caller = caller(&req)?;
        let d = required(req.into_inner().datacenter)?;
        let dc = self.service.create(&caller, new_datacenter(d)).await?;
        Ok(Response::new(pb::CreateDatacenterResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn get_datacenter(
        &self,
        req: Request<pb::GetDatacenterRequest>,
    ) -> Result<Response<pb::GetDatacenterResponse>, Status> {
        let caller = caller(&req)?;
        let dc = self.service.get(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::GetDatacenterResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn get_datacenter_by_slug(
        &self,
        req: Request<pb::GetDatacenterBySlugRequest>,
    ) -> Result<Response<pb::GetDatacenterBySlugResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let dc = self
            .service
            .get_by_slug(&caller, &r.slug, &r.tenant_id)
            .await?;
        Ok(Response::new(pb::GetDatacenterBySlugResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn list_datacenters(
        &self,
        req: Request<pb::ListDatacentersRequest>,
    ) -> Result<Response<pb::ListDatacentersResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let filter = ListFilterInput {
            status: status_from_proto(r.status),
            status_invalid: r.status != 0 && status_from_proto(r.status).is_none(),
            provider_name: r.provider_name,
            region: r.region,
            label_selector: r.label_selector,
        };
        let page = self
            .service
            .list(&caller, &r.tenant_id, filter, r.page_size, &r.page_token)
            .await?;
        Ok(Response::new(pb::ListDatacentersResponse {
            datacenters: page.items.iter().map(Into::into).collect(),
            next_page_token: page.next_page_token.unwrap_or_default(),
            total_size: i32::try_from(page.total_size).unwrap_or(i32::MAX),
        }))
    }

    async fn update_datacenter(
        &self,
        req: Request<pb::UpdateDatacenterRequest>,
    ) -> Result<Response<pb::UpdateDatacenterResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let d = required(r.datacenter)?;
        let id = d.id.clone();
        let mut v = Violations::new();
        let paths = r.update_mask.map(|m| m.paths).unwrap_or_default();
        let patch = patch_from_mask(d, &paths, &mut v);
        let dc = self.service.update(&caller, &id, patch, v).await?;
        Ok(Response::new(pb::UpdateDatacenterResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn delete_datacenter(
        &self,
        req: Request<pb::DeleteDatacenterRequest>,
    ) -> Result<Response<pb::DeleteDatacenterResponse>, Status> {
        let caller = caller(&req)?;
        let dc = self.service.delete(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::DeleteDatacenterResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn set_datacenter_status(
        &self,
        req: Request<pb::SetDatacenterStatusRequest>,
    ) -> Result<Response<pb::SetDatacenterStatusResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let dc = self
            .service
            .set_status(&caller, &r.id, status_from_proto(r.status), &r.reason)
            .await?;
        Ok(Response::new(pb::SetDatacenterStatusResponse {
            datacenter: Some((&dc).into()),
        }))
    }

    async fn resolve_provider(
        &self,
        req: Request<pb::ResolveProviderRequest>,
    ) -> Result<Response<pb::ResolveProviderResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let (provider_name, agent) = if r.datacenter_id.is_empty() && !r.provider_name.is_empty() {
            let agent = self
                .service
                .resolve_provider_name(&caller, &r.provider_name)
                .await?;
            (r.provider_name.clone(), agent)
        } else {
            let (dc, agent) = self
                .service
                .resolve_provider(&caller, &r.datacenter_id)
                .await?;
            (dc.provider_name, agent)
        };
        Ok(Response::new(pb::ResolveProviderResponse {
            provider_name,
            agent_id: agent.agent_id,
            agent_endpoint: agent.endpoint,
        }))
    }

    type WatchDatacentersStream = WatchStream;

    async fn watch_datacenters(
        &self,
        req: Request<pb::WatchDatacentersRequest>,
    ) -> Result<Response<Self::WatchDatacentersStream>, Status> {
        let caller = caller(&req)?;
        let rx = self
            .service
            .watch(&caller, req.get_ref().since_revision)
            .await?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let stream = futures::StreamExt::map(stream, |item| {
            item.map(|e| pb::WatchDatacentersResponse {
                event: Some((&e).into()),
            })
            .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn list_datacenter_events(
        &self,
        req: Request<pb::ListDatacenterEventsRequest>,
    ) -> Result<Response<pb::ListDatacenterEventsResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.get_ref();
        let (events, next) = self
            .service
            .list_events(
                &caller,
                &r.datacenter_id,
                r.since_revision,
                r.page_size,
                &r.page_token,
            )
            .await?;
        Ok(Response::new(pb::ListDatacenterEventsResponse {
            events: events.iter().map(Into::into).collect(),
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn purge_datacenter(
        &self,
        req: Request<pb::PurgeDatacenterRequest>,
    ) -> Result<Response<pb::PurgeDatacenterResponse>, Status> {
        let caller = caller(&req)?;
        self.service.purge(&caller, &req.get_ref().id).await?;
        Ok(Response::new(pb::PurgeDatacenterResponse {}))
    }
}
