//! `AdminService`: the operator's view of this node.

use std::sync::Arc;

use spool_proto::v1::{self, admin_service_server::AdminService};
use tonic::{Request, Response, Status};

use super::{
    auth::{Role, authorize, authorize_everywhere},
    validate,
};
use crate::dispatch::Core;
use crate::drain::Drainer;

pub struct AdminApi {
    core: Arc<Core>,
    drainer: Arc<Drainer>,
}

impl AdminApi {
    pub fn new(core: Arc<Core>, drainer: Arc<Drainer>) -> Self {
        Self { core, drainer }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn drain(
        &self,
        request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        authorize_everywhere(&request, Role::Admin)?;
        let timeout = validate::duration("timeout", request.get_ref().timeout.as_ref())?
            .filter(|d| !d.is_zero())
            .unwrap_or(self.core.config.drain_timeout);
        let report = self.drainer.drain(timeout).await;
        Ok(Response::new(v1::DrainResponse {
            completed: report.completed,
            released: report.released,
        }))
    }

    async fn list_workers(
        &self,
        request: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        let namespace = &request.get_ref().namespace;
        // A read: any role that may read activities may see who runs them.
        let namespace = if namespace.is_empty() {
            authorize_everywhere(&request, Role::Viewer)?;
            None
        } else {
            let namespace = validate::namespace(namespace)?;
            authorize(&request, Role::Viewer, &namespace)?;
            Some(namespace)
        };
        Ok(Response::new(v1::ListWorkersResponse {
            workers: self.core.registry.workers(namespace.as_deref()),
            draining: self.core.registry.is_draining(),
        }))
    }

    async fn resume(
        &self,
        request: Request<v1::ResumeRequest>,
    ) -> Result<Response<v1::ResumeResponse>, Status> {
        authorize_everywhere(&request, Role::Admin)?;
        let was_draining = self
            .drainer
            .resume()
            .await
            .map_err(|e| Status::from(super::Error::from(e)))?;
        Ok(Response::new(v1::ResumeResponse { was_draining }))
    }
}
