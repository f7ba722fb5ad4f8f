//! The admin service: connected workers, the limits and weights set on every
//! node, and a node's drain. Each call is sent once.

use std::time::Duration;

use spool_proto::{duration, v1};

use super::Client;
use crate::Error;

impl Client {
    /// The workers connected now (all namespaces when `namespace` is empty).
    pub async fn workers(
        &self,
        namespace: impl Into<String>,
    ) -> Result<Vec<v1::WorkerInfo>, Error> {
        Ok(self.list_workers(namespace).await?.workers)
    }

    /// The workers connected now, and whether the node is draining.
    pub async fn list_workers(
        &self,
        namespace: impl Into<String>,
    ) -> Result<v1::ListWorkersResponse, Error> {
        let request = v1::ListWorkersRequest {
            namespace: namespace.into(),
        };
        self.once(self.admin().list_workers(self.request(request)))
            .await
    }

    /// Sets the rate limit of a namespace's activity type, on every node: at most
    /// `limit.limit` rows each `limit.period`, `limit.burst` at once (0: the
    /// limit). Answers the limit as stored, with what is available of it now.
    pub async fn set_rate_limit(&self, limit: v1::RateLimit) -> Result<v1::RateLimit, Error> {
        let request = v1::SetRateLimitRequest {
            rate_limit: Some(limit),
        };
        self.once(self.admin().set_rate_limit(self.request(request)))
            .await?
            .rate_limit
            .ok_or_else(|| self.failed(tonic::Status::internal("no rate limit in the answer")))
    }

    /// The rate limits of `namespace` (every namespace when empty), with what is
    /// available of each now.
    pub async fn list_rate_limits(
        &self,
        namespace: impl Into<String>,
    ) -> Result<Vec<v1::RateLimit>, Error> {
        let request = v1::ListRateLimitsRequest {
            namespace: namespace.into(),
        };
        Ok(self
            .once(self.admin().list_rate_limits(self.request(request)))
            .await?
            .rate_limits)
    }

    /// Removes a type's rate limit; false when it had none.
    pub async fn delete_rate_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
    ) -> Result<bool, Error> {
        self.delete_key_rate_limit(namespace, activity_type, String::new())
            .await
    }

    /// Removes the rate limit of one concurrency key of a type; false when it
    /// had none.
    pub async fn delete_key_rate_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<bool, Error> {
        let request = v1::DeleteRateLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: key.into(),
        };
        Ok(self
            .once(self.admin().delete_rate_limit(self.request(request)))
            .await?
            .deleted)
    }

    /// Sets the concurrency limit of a namespace's activity type, on every node:
    /// at most `limit.max_running` activities sharing a concurrency key run at
    /// once. Answers the limit as stored, with its keys' use now.
    pub async fn set_concurrency_limit(
        &self,
        limit: v1::ConcurrencyLimit,
    ) -> Result<v1::ConcurrencyLimit, Error> {
        let request = v1::SetConcurrencyLimitRequest {
            concurrency_limit: Some(limit),
        };
        self.once(self.admin().set_concurrency_limit(self.request(request)))
            .await?
            .concurrency_limit
            .ok_or_else(|| self.failed(tonic::Status::internal("no limit in the answer")))
    }

    /// The concurrency limits of `namespace` (every namespace when empty), with
    /// their keys' use now.
    pub async fn list_concurrency_limits(
        &self,
        namespace: impl Into<String>,
    ) -> Result<Vec<v1::ConcurrencyLimit>, Error> {
        let request = v1::ListConcurrencyLimitsRequest {
            namespace: namespace.into(),
        };
        Ok(self
            .once(self.admin().list_concurrency_limits(self.request(request)))
            .await?
            .concurrency_limits)
    }

    /// Removes a type's concurrency limit; false when it had none.
    pub async fn delete_concurrency_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
    ) -> Result<bool, Error> {
        self.delete_concurrency_key_limit(namespace, activity_type, String::new())
            .await
    }

    /// Removes what was set for one concurrency key of a type (its own limit and
    /// weight); false when nothing was.
    pub async fn delete_concurrency_key_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<bool, Error> {
        let request = v1::DeleteConcurrencyLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: key.into(),
        };
        Ok(self
            .once(self.admin().delete_concurrency_limit(self.request(request)))
            .await?
            .deleted)
    }

    /// Sets the weight of one fairness key of a namespace's activity type, on
    /// every node: activities of the key submitted from now on are placed with
    /// `weight.weight`, whatever fairness weight they are submitted with. Answers
    /// the weight as stored.
    pub async fn set_fairness_weight(
        &self,
        weight: v1::FairnessWeight,
    ) -> Result<v1::FairnessWeight, Error> {
        let request = v1::SetFairnessWeightRequest {
            fairness_weight: Some(weight),
        };
        self.once(self.admin().set_fairness_weight(self.request(request)))
            .await?
            .fairness_weight
            .ok_or_else(|| self.failed(tonic::Status::internal("no weight in the answer")))
    }

    /// The fairness weights set in `namespace` (every namespace when empty).
    pub async fn list_fairness_weights(
        &self,
        namespace: impl Into<String>,
    ) -> Result<Vec<v1::FairnessWeight>, Error> {
        let request = v1::ListFairnessWeightsRequest {
            namespace: namespace.into(),
        };
        Ok(self
            .once(self.admin().list_fairness_weights(self.request(request)))
            .await?
            .fairness_weights)
    }

    /// Removes the weight set for one fairness key of a type, so that its
    /// activities are placed by their own weights again; false when none was set.
    pub async fn delete_fairness_weight(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
        key: impl Into<String>,
    ) -> Result<bool, Error> {
        let request = v1::DeleteFairnessWeightRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            fairness_key: key.into(),
        };
        Ok(self
            .once(self.admin().delete_fairness_weight(self.request(request)))
            .await?
            .deleted)
    }

    /// Ends a drain: the node takes workers and dispatches again.
    pub async fn resume(&self) -> Result<v1::ResumeResponse, Error> {
        self.once(self.admin().resume(self.request(v1::ResumeRequest {})))
            .await
    }

    /// Drains the server: it stops dispatching and lets running activities finish,
    /// up to `timeout` (the server's own drain timeout if `None`).
    pub async fn drain(&self, timeout: Option<Duration>) -> Result<v1::DrainResponse, Error> {
        let request = v1::DrainRequest {
            timeout: timeout.map(duration::to_proto),
        };
        self.once(self.admin().drain(self.request(request))).await
    }
}
