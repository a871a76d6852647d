//! `SchedulerService`: list, inspect and run workers (system:admin).

use std::time::Duration;

use chrono::{DateTime, Utc};
use ctrlplane_core::{Violations, id};
use ctrlplane_proto::pbjson_types;
use ctrlplane_proto::scheduler::v1::{
    self as pb, scheduler_service_server::SchedulerService as Rpc,
};
use ctrlplane_runtime::auth::{Caller, caller};
use tonic::{Request, Response, Status};

use crate::leader::Election;
use crate::worker::{Info, RunError, RunScope, Workers};

/// The gRPC face of the workers.
#[derive(Clone)]
pub struct SchedulerGrpc {
    workers: Workers,
    election: Election,
}

impl SchedulerGrpc {
    /// Wraps the workers.
    pub fn new(workers: Workers, election: Election) -> Self {
        SchedulerGrpc { workers, election }
    }
}

fn ts(t: DateTime<Utc>) -> pbjson_types::Timestamp {
    pbjson_types::Timestamp {
        seconds: t.timestamp(),
        nanos: t.timestamp_subsec_nanos() as i32,
    }
}

fn duration(d: Duration) -> pbjson_types::Duration {
    pbjson_types::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

fn info_to_proto(i: &Info) -> pb::WorkerInfo {
    pb::WorkerInfo {
        name: i.name.clone(),
        interval: Some(duration(i.interval)),
        running: i.running,
        last_run_time: i.last_run_time.map(ts),
        last_error: i.last_error.clone(),
        run_count: i.run_count,
        last_duration: Some(duration(i.last_duration)),
        next_run_time: i.next_run_time.map(ts),
        error_count: i.error_count,
    }
}

fn admin(c: &Caller) -> Result<(), Status> {
    if c.is_admin() {
        Ok(())
    } else {
        Err(Status::permission_denied(
            "the scheduler API needs a system:admin token",
        ))
    }
}

fn not_found(name: &str) -> Status {
    Status::not_found(format!("worker {name:?} not found"))
}

#[tonic::async_trait]
impl Rpc for SchedulerGrpc {
    async fn list_workers(
        &self,
        req: Request<pb::ListWorkersRequest>,
    ) -> Result<Response<pb::ListWorkersResponse>, Status> {
        admin(&caller(&req)?)?;
        let leader_id = self.election.holder().await.unwrap_or_default();
        Ok(Response::new(pb::ListWorkersResponse {
            workers: self.workers.list().iter().map(info_to_proto).collect(),
            leader: self.workers.is_leader(),
            leader_id,
        }))
    }

    async fn get_worker(
        &self,
        req: Request<pb::GetWorkerRequest>,
    ) -> Result<Response<pb::GetWorkerResponse>, Status> {
        admin(&caller(&req)?)?;
        let name = &req.get_ref().name;
        let info = self.workers.get(name).ok_or_else(|| not_found(name))?;
        Ok(Response::new(pb::GetWorkerResponse {
            worker: Some(info_to_proto(&info)),
        }))
    }

    async fn run_worker(
        &self,
        req: Request<pb::RunWorkerRequest>,
    ) -> Result<Response<pb::RunWorkerResponse>, Status> {
        admin(&caller(&req)?)?;
        let r = req.get_ref();
        let mut v = Violations::new();
        if r.name.is_empty() {
            v.add("name", "is required");
        }
        if !r.datacenter_id.is_empty() {
            id::check_id(&mut v, "datacenter_id", id::DATACENTER, &r.datacenter_id);
        }
        v.into_result().map_err(|v| v.to_status())?;
        let scope = RunScope {
            datacenter_id: Some(r.datacenter_id.clone()).filter(|d| !d.is_empty()),
        };
        match self.workers.run_now(&r.name, scope).await {
            Ok(info) => Ok(Response::new(pb::RunWorkerResponse {
                worker: Some(info_to_proto(&info)),
            })),
            Err(RunError::NotFound(n)) => Err(not_found(&n)),
            Err(e @ RunError::NotLeader) => Err(Status::failed_precondition(e.to_string())),
        }
    }
}
