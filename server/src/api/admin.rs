//! `AdminService`: the operator's view of this node, and the settings that hold
//! for every node (rate and concurrency limits, fairness weights), stored in the
//! database.

use std::sync::Arc;

use spool_proto::v1::{self, admin_service_server::AdminService};
use tonic::{Request, Response, Status};

use super::{Error, unexpected, within};
use super::{
    auth::{Role, authorize, authorize_everywhere},
    validate,
};
use crate::dispatch::Core;
use crate::drain::Drainer;
use crate::store::{Op, Outcome, Setting, SettingChange};

pub struct AdminApi {
    core: Arc<Core>,
    drainer: Arc<Drainer>,
}

impl AdminApi {
    /// Deletes a setting of a namespace's type (a limit, of the type or of one
    /// key, or a fairness key's weight); true when there was one. Rows a limit
    /// held back may go at once.
    async fn delete_setting<T>(
        &self,
        request: &Request<T>,
        namespace: &str,
        activity_type: &str,
        setting: Setting,
    ) -> Result<bool, Error> {
        let namespace = validate::namespace(namespace)?;
        validate::name("activity_type", activity_type)?;
        authorize(request, Role::Admin, &namespace)?;
        let op = Op::Setting(SettingChange::Remove {
            namespace: namespace.clone(),
            activity_type: activity_type.to_owned(),
            setting,
        });
        let deleted = match self.commit(op).await? {
            Outcome::Removed(deleted) => deleted,
            other => return Err(unexpected(&format!("delete answered {other:?}"))),
        };
        self.core.registry.mark_due(&namespace, activity_type);
        Ok(deleted)
    }

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
            handed_over: report.handed_over,
            ended_otherwise: report.ended_otherwise,
        }))
    }

    async fn list_workers(
        &self,
        request: Request<v1::ListWorkersRequest>,
    ) -> Result<Response<v1::ListWorkersResponse>, Status> {
        // A read: any role that may read activities may see who runs them.
        let namespace = Self::readable(&request, &request.get_ref().namespace)?;
        Ok(Response::new(v1::ListWorkersResponse {
            workers: self
                .core
                .registry
                .workers(namespace.as_deref())
                .into_iter()
                .map(|w| crate::wire::worker(w, self.core.registry.node()))
                .collect(),
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

    async fn set_rate_limit(
        &self,
        request: Request<v1::SetRateLimitRequest>,
    ) -> Result<Response<v1::SetRateLimitResponse>, Status> {
        let limit = validate::rate_limit(request.get_ref().rate_limit.clone())?;
        authorize(&request, Role::Admin, &limit.namespace)?;
        let (namespace, activity_type, key) = (
            limit.namespace.clone(),
            limit.activity_type.clone(),
            limit.key.clone(),
        );
        match self
            .commit(Op::Setting(SettingChange::RateLimit(limit)))
            .await?
        {
            Outcome::RateLimitSet => {}
            other => return Err(unexpected(&format!("set answered {other:?}")).into()),
        }
        let now = self.core.store.now();
        let set = self
            .bounded(self.core.store.rate_limits(Some(&namespace), now))
            .await?
            .into_iter()
            .find(|u| u.limit.activity_type == activity_type && u.limit.key == key)
            .map(crate::wire::rate_limit);
        // A raised limit may let waiting rows go now.
        self.core.registry.mark_due(&namespace, &activity_type);
        Ok(Response::new(v1::SetRateLimitResponse { rate_limit: set }))
    }

    async fn list_rate_limits(
        &self,
        request: Request<v1::ListRateLimitsRequest>,
    ) -> Result<Response<v1::ListRateLimitsResponse>, Status> {
        let namespace = Self::readable(&request, &request.get_ref().namespace)?;
        let now = self.core.store.now();
        let limits = self
            .bounded(self.core.store.rate_limits(namespace.as_deref(), now))
            .await?;
        Ok(Response::new(v1::ListRateLimitsResponse {
            rate_limits: limits.into_iter().map(crate::wire::rate_limit).collect(),
        }))
    }

    async fn delete_rate_limit(
        &self,
        request: Request<v1::DeleteRateLimitRequest>,
    ) -> Result<Response<v1::DeleteRateLimitResponse>, Status> {
        let r = request.get_ref();
        let key = validate::concurrency_key("concurrency_key", r.concurrency_key.clone())?;
        let deleted = self
            .delete_setting(
                &request,
                &r.namespace,
                &r.activity_type,
                Setting::RateLimit(key),
            )
            .await?;
        Ok(Response::new(v1::DeleteRateLimitResponse { deleted }))
    }

    async fn set_concurrency_limit(
        &self,
        request: Request<v1::SetConcurrencyLimitRequest>,
    ) -> Result<Response<v1::SetConcurrencyLimitResponse>, Status> {
        let (namespace, activity_type, op) =
            validate::concurrency_limit(request.get_ref().concurrency_limit.clone())?;
        authorize(&request, Role::Admin, &namespace)?;
        let key = match &op {
            Op::Setting(SettingChange::KeyLimit { key, .. }) => Some(key.clone()),
            _ => None,
        };
        match self.commit(op).await? {
            Outcome::ConcurrencyLimitSet => {}
            other => return Err(unexpected(&format!("set answered {other:?}")).into()),
        }
        let set = self
            .bounded(self.core.store.concurrency_limits(Some(&namespace)))
            .await?
            .into_iter()
            .find(|l| l.activity_type == activity_type && l.key == key)
            .map(crate::wire::concurrency_limit);
        // A raised limit may let waiting rows go now.
        self.core.registry.mark_due(&namespace, &activity_type);
        Ok(Response::new(v1::SetConcurrencyLimitResponse {
            concurrency_limit: set,
        }))
    }

    async fn list_concurrency_limits(
        &self,
        request: Request<v1::ListConcurrencyLimitsRequest>,
    ) -> Result<Response<v1::ListConcurrencyLimitsResponse>, Status> {
        let namespace = Self::readable(&request, &request.get_ref().namespace)?;
        let limits = self
            .bounded(self.core.store.concurrency_limits(namespace.as_deref()))
            .await?;
        Ok(Response::new(v1::ListConcurrencyLimitsResponse {
            concurrency_limits: limits
                .into_iter()
                .map(crate::wire::concurrency_limit)
                .collect(),
        }))
    }

    async fn delete_concurrency_limit(
        &self,
        request: Request<v1::DeleteConcurrencyLimitRequest>,
    ) -> Result<Response<v1::DeleteConcurrencyLimitResponse>, Status> {
        let r = request.get_ref();
        let key = validate::concurrency_key("concurrency_key", r.concurrency_key.clone())?;
        let deleted = self
            .delete_setting(
                &request,
                &r.namespace,
                &r.activity_type,
                Setting::ConcurrencyLimit(key),
            )
            .await?;
        Ok(Response::new(v1::DeleteConcurrencyLimitResponse {
            deleted,
        }))
    }

    async fn set_fairness_weight(
        &self,
        request: Request<v1::SetFairnessWeightRequest>,
    ) -> Result<Response<v1::SetFairnessWeightResponse>, Status> {
        let weight = validate::fairness_weight(request.get_ref().fairness_weight.clone())?;
        authorize(&request, Role::Admin, &weight.namespace)?;
        match self
            .commit(Op::Setting(SettingChange::FairnessWeight(weight.clone())))
            .await?
        {
            Outcome::FairnessWeightSet => {}
            other => return Err(unexpected(&format!("set answered {other:?}")).into()),
        }
        // What was committed is what was asked: a weight has no read-only part.
        Ok(Response::new(v1::SetFairnessWeightResponse {
            fairness_weight: Some(crate::wire::fairness_weight(weight)),
        }))
    }

    async fn list_fairness_weights(
        &self,
        request: Request<v1::ListFairnessWeightsRequest>,
    ) -> Result<Response<v1::ListFairnessWeightsResponse>, Status> {
        let namespace = Self::readable(&request, &request.get_ref().namespace)?;
        let weights = self
            .bounded(self.core.store.fairness_weights(namespace.as_deref()))
            .await?;
        Ok(Response::new(v1::ListFairnessWeightsResponse {
            fairness_weights: weights
                .into_iter()
                .map(crate::wire::fairness_weight_use)
                .collect(),
        }))
    }

    async fn delete_fairness_weight(
        &self,
        request: Request<v1::DeleteFairnessWeightRequest>,
    ) -> Result<Response<v1::DeleteFairnessWeightResponse>, Status> {
        let r = request.get_ref();
        validate::name("fairness_key", &r.fairness_key)?;
        let key = r.fairness_key.clone();
        let deleted = self
            .delete_setting(
                &request,
                &r.namespace,
                &r.activity_type,
                Setting::FairnessWeight(key),
            )
            .await?;
        Ok(Response::new(v1::DeleteFairnessWeightResponse { deleted }))
    }
}

impl AdminApi {
    /// The namespace a list call names (`None`: every one), once the caller may
    /// read it.
    fn readable<T>(request: &Request<T>, namespace: &str) -> Result<Option<String>, Error> {
        if namespace.is_empty() {
            authorize_everywhere(request, Role::Viewer)?;
            Ok(None)
        } else {
            let namespace = validate::namespace(namespace)?;
            authorize(request, Role::Viewer, &namespace)?;
            Ok(Some(namespace))
        }
    }

    /// `work` (a commit or a read of the store) cut at `--request-timeout`, as
    /// every call's but `Drain`'s (which has a timeout of its own), like the
    /// activity service's: a store that hangs answers DEADLINE_EXCEEDED, not never.
    async fn bounded<T, E: Into<Error>>(
        &self,
        work: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, Error> {
        within(self.core.config.limits.request_timeout, async {
            work.await.map_err(Into::into)
        })
        .await
    }

    /// Commits one op and returns its outcome.
    async fn commit(&self, op: Op) -> Result<Outcome, Error> {
        let mut outcomes = self.bounded(self.core.committer.commit(vec![op])).await?;
        outcomes
            .pop()
            .ok_or_else(|| unexpected("a commit without an outcome"))
    }
}
