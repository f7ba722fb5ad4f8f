//! `AdminService`: the operator's view of this node.

use std::sync::Arc;

use spool_proto::v1::{self, admin_service_server::AdminService};
use tonic::{Request, Response, Status};

use super::{Core, validate};

pub struct AdminApi {
    core: Arc<Core>,
}

impl AdminApi {
    pub fn new(core: Arc<Core>) -> Self {
        Self { core }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn drain(
        &self,
        _request: Request<v1::DrainRequest>,
    ) -> Result<Response<v1::DrainResponse>, Status> {
        Err(Status::unimplemented(
            "AdminService.Drain is not available in this version; stop the server with SIGTERM",
        ))
    }

    async fn list_workers(
        &self,
        request: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        let namespace = &request.get_ref().namespace;
        let namespace = if namespace.is_empty() {
            None
        } else {
            Some(validate::namespace(namespace)?)
        };
        Ok(Response::new(v1::ListWorkersResponse {
            workers: self.core.registry.workers(namespace.as_deref()),
        }))
    }
}
