//! The connection a service uses to submit activities to Spool, wait for their
//! outcomes, and manage them: one gRPC channel to a server, the bearer token on
//! every call, answers as the `spool.v1` messages.
//!
//! ```no_run
//! use spool_client::{Client, v1};
//!
//! # async fn example() -> Result<(), spool_client::Error> {
//! let client = Client::builder("http://127.0.0.1:7070").connect().await?;
//! let submitted = client
//!     .submit(v1::SubmitRequest {
//!         activity_type: "greet".into(),
//!         ..Default::default()
//!     })
//!     .await?;
//! let key = submitted.activity.and_then(|a| a.key).unwrap_or_default();
//! let done = client.wait(key, None).await?;
//! println!("{:?}", done.status());
//! # Ok(())
//! # }
//! ```
//!
//! Invariants: the client adds nothing to a request but the token; every error is
//! either local (a bad endpoint or token, never sent) or the server's status, kept
//! whole so callers can branch on its code.

#![deny(missing_docs)]

mod error;
mod retry;
mod typed;

use std::time::Duration;

pub use error::Error;
pub use retry::Retry;
pub use spool_proto::{activity::Activity, endpoint::ClientTls, v1};
use spool_proto::{
    duration,
    v1::{
        activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
    },
};
use tonic::{
    Request, Status,
    metadata::{Ascii, MetadataValue},
    transport::Channel,
};
pub use typed::{Handle, Submit, TRACEPARENT, new_traceparent};

/// Settings for a connection; [`Builder::connect`] makes it.
#[derive(Debug, Clone)]
pub struct Builder {
    server: String,
    token: Option<String>,
    tls: ClientTls,
    retry: Retry,
    timeout: Option<Duration>,
    connect_timeout: Duration,
}

impl Builder {
    /// How UNAVAILABLE is retried (default: [`Retry::default`]).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// The longest one call may take (sent to the server as its deadline), but a
    /// `wait`, which has its own. Default: none (the server's `--request-timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The longest `connect` (and a reconnect) may take (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The bearer token, for a server started with tokens.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// TLS settings for an `https://` server (a private CA, a client identity).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Connects now; fails if the server cannot be reached.
    pub async fn connect(self) -> Result<Client, Error> {
        let token = match &self.token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| Error::InvalidToken)?,
            ),
            None => None,
        };
        let endpoint = spool_proto::endpoint::endpoint(&self.server, &self.tls)
            .map_err(|e| Error::InvalidEndpoint(e.to_string()))?
            .connect_timeout(self.connect_timeout);
        let channel = endpoint.connect().await.map_err(|e| {
            let mut reason = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                reason = s.to_string();
                source = s.source();
            }
            Error::Unreachable {
                server: self.server.clone(),
                reason,
            }
        })?;
        Ok(Client {
            channel,
            token,
            server: self.server,
            retry: self.retry,
            timeout: self.timeout,
        })
    }
}

/// A connection to one Spool server. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    channel: Channel,
    token: Option<MetadataValue<Ascii>>,
    /// The endpoint as given, for errors.
    server: String,
    retry: Retry,
    timeout: Option<Duration>,
}

impl Client {
    /// Settings for a connection to `server` (`host:port`, `http://host:port`, or
    /// `https://host:port` for TLS with the system's roots).
    pub fn builder(server: impl Into<String>) -> Builder {
        Builder {
            server: server.into(),
            token: None,
            tls: ClientTls::default(),
            retry: Retry::default(),
            timeout: None,
            connect_timeout: Duration::from_secs(10),
        }
    }

    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = self.untimed(message);
        if let Some(timeout) = self.timeout {
            request.set_timeout(timeout);
        }
        request
    }

    /// A request without the call timeout (a `wait` has its own).
    fn untimed<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// Runs `call` (one gRPC call, made afresh each try), retrying UNAVAILABLE as
    /// [`Retry`] says; for calls that may safely be sent again.
    async fn retrying<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.retry.run(call).await.map_err(|s| self.failed(s))
    }

    /// A failed call as an [`Error`].
    fn failed(&self, status: Status) -> Error {
        Error::from_call(&self.server, status)
    }

    fn activities(&self) -> ActivityServiceClient<Channel> {
        // Answers are bounded by the server; an activity may carry payloads up to
        // its limit.
        ActivityServiceClient::new(self.channel.clone()).max_decoding_message_size(usize::MAX)
    }

    fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone())
    }

    /// Submits one activity; `created` is false when its key already existed with
    /// the same type (the stored activity is returned).
    pub async fn submit(
        &self,
        mut request: v1::SubmitRequest,
    ) -> Result<v1::SubmitResponse, Error> {
        fill_ids(&mut request.workflow_id, &mut request.activity_id);
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(request.clone());
            async move { service.submit(request).await }
        })
        .await
    }

    /// Submits activities all or nothing, in one commit.
    pub async fn submit_batch(
        &self,
        mut request: v1::SubmitBatchRequest,
    ) -> Result<v1::SubmitBatchResponse, Error> {
        for activity in &mut request.activities {
            fill_ids(&mut activity.workflow_id, &mut activity.activity_id);
        }
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(request.clone());
            async move { service.submit_batch(request).await }
        })
        .await
    }

    /// The activity now.
    pub async fn get(&self, key: v1::ActivityKey) -> Result<v1::Activity, Error> {
        self.get_activity(key, false).await
    }

    /// The activity with its attempt history (`Activity.history`, oldest first):
    /// who ran each attempt, where, when, and how it ended.
    pub async fn get_with_history(&self, key: v1::ActivityKey) -> Result<v1::Activity, Error> {
        self.get_activity(key, true).await
    }

    async fn get_activity(
        &self,
        key: v1::ActivityKey,
        include_history: bool,
    ) -> Result<v1::Activity, Error> {
        let request = v1::GetRequest {
            key: Some(key),
            include_history,
        };
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(request.clone());
            async move { service.get(request).await }
        })
        .await
    }

    /// Waits until the activity is finished, or `timeout` passes (then answers its
    /// state so far). Without a timeout it waits until the end, asking again each
    /// time the server answers at its own longest wait.
    pub async fn wait(
        &self,
        key: v1::ActivityKey,
        timeout: Option<Duration>,
    ) -> Result<v1::Activity, Error> {
        loop {
            let request = v1::WaitRequest {
                key: Some(key.clone()),
                timeout: timeout.map(duration::to_proto),
            };
            let activity = self
                .retrying(|| {
                    let mut service = self.activities();
                    let request = self.untimed(request.clone());
                    async move { service.wait(request).await }
                })
                .await?;
            if timeout.is_some() || activity.status >= v1::ActivityStatus::Completed as i32 {
                return Ok(activity);
            }
        }
    }

    /// Cancels a scheduled or running activity.
    pub async fn cancel(
        &self,
        key: v1::ActivityKey,
        reason: impl Into<String>,
    ) -> Result<v1::Activity, Error> {
        let request = v1::CancelRequest {
            key: Some(key),
            reason: reason.into(),
        };
        Ok(self
            .activities()
            .cancel(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner())
    }

    /// Runs a FAILED or CANCELLED activity again, with a fresh attempt budget.
    pub async fn retry(&self, key: v1::ActivityKey) -> Result<v1::Activity, Error> {
        let request = v1::RetryRequest { key: Some(key) };
        Ok(self
            .activities()
            .retry(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner())
    }

    /// One page of activities; pass its `next_page_token` for the next.
    pub async fn list(&self, request: v1::ListRequest) -> Result<v1::ListResponse, Error> {
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(request.clone());
            async move { service.list(request).await }
        })
        .await
    }

    /// Up to `limit` activities matching `request`, following page tokens.
    pub async fn list_up_to(
        &self,
        request: v1::ListRequest,
        limit: usize,
    ) -> Result<Vec<v1::Activity>, Error> {
        Ok(self.list_page_up_to(request, limit).await?.0)
    }

    /// Up to `limit` activities matching `request`, following page tokens, and the
    /// token that continues after the last one returned (empty when no more match).
    pub async fn list_page_up_to(
        &self,
        mut request: v1::ListRequest,
        limit: usize,
    ) -> Result<(Vec<v1::Activity>, String), Error> {
        let mut activities = Vec::new();
        loop {
            let wanted = limit.saturating_sub(activities.len());
            if wanted == 0 {
                return Ok((activities, request.page_token));
            }
            request.page_size = u32::try_from(wanted.min(1000)).unwrap_or(1000);
            let page = self.list(request.clone()).await?;
            // A page holds at most `page_size`, so never more than `wanted`.
            activities.extend(page.activities);
            request.page_token = page.next_page_token;
            if request.page_token.is_empty() {
                return Ok((activities, String::new()));
            }
        }
    }

    /// Every activity matching `request`, page after page as the stream is read
    /// (one page ahead at most): the whole list without holding it in memory. An
    /// error ends the stream after it is yielded.
    pub fn list_stream(
        &self,
        mut request: v1::ListRequest,
    ) -> impl tokio_stream::Stream<Item = Result<v1::Activity, Error>> + Send + 'static {
        let client = self.clone();
        let page = usize::try_from(request.page_size.max(1)).unwrap_or(100);
        let (tx, rx) = tokio::sync::mpsc::channel(page);
        tokio::spawn(async move {
            loop {
                match client.list(request.clone()).await {
                    Ok(response) => {
                        for activity in response.activities {
                            if tx.send(Ok(activity)).await.is_err() {
                                return; // the reader dropped the stream
                            }
                        }
                        if response.next_page_token.is_empty() {
                            return;
                        }
                        request.page_token = response.next_page_token;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    /// Activities by status in a namespace, and the workers connected to it.
    pub async fn stats(&self, namespace: impl Into<String>) -> Result<v1::StatsResponse, Error> {
        let request = v1::StatsRequest {
            namespace: namespace.into(),
        };
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(request.clone());
            async move { service.stats(request).await }
        })
        .await
    }

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
        Ok(self
            .admin()
            .list_workers(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner())
    }

    /// Sets the rate limit of a namespace's activity type, on every node: at most
    /// `limit.limit` rows each `limit.period`, `limit.burst` at once (0: the
    /// limit). Answers the limit as stored, with what is available of it now.
    pub async fn set_rate_limit(&self, limit: v1::RateLimit) -> Result<v1::RateLimit, Error> {
        let request = v1::SetRateLimitRequest {
            rate_limit: Some(limit),
        };
        self.admin()
            .set_rate_limit(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
            .admin()
            .list_rate_limits(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
            .rate_limits)
    }

    /// Removes a type's rate limit; false when it had none.
    pub async fn delete_rate_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
    ) -> Result<bool, Error> {
        self.delete_rate(v1::DeleteRateLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: String::new(),
        })
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
        self.delete_rate(v1::DeleteRateLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: key.into(),
        })
        .await
    }

    async fn delete_rate(&self, request: v1::DeleteRateLimitRequest) -> Result<bool, Error> {
        Ok(self
            .admin()
            .delete_rate_limit(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
        self.admin()
            .set_concurrency_limit(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
            .admin()
            .list_concurrency_limits(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
            .concurrency_limits)
    }

    /// Removes a type's concurrency limit; false when it had none.
    pub async fn delete_concurrency_limit(
        &self,
        namespace: impl Into<String>,
        activity_type: impl Into<String>,
    ) -> Result<bool, Error> {
        self.delete_concurrency(v1::DeleteConcurrencyLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: String::new(),
        })
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
        self.delete_concurrency(v1::DeleteConcurrencyLimitRequest {
            namespace: namespace.into(),
            activity_type: activity_type.into(),
            concurrency_key: key.into(),
        })
        .await
    }

    async fn delete_concurrency(
        &self,
        request: v1::DeleteConcurrencyLimitRequest,
    ) -> Result<bool, Error> {
        Ok(self
            .admin()
            .delete_concurrency_limit(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
        self.admin()
            .set_fairness_weight(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
            .admin()
            .list_fairness_weights(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
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
            .admin()
            .delete_fairness_weight(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner()
            .deleted)
    }

    /// What the server is (version, protocol versions) and what it accepts (payload
    /// size, batch size, worker concurrency, heartbeat interval, longest wait).
    pub async fn server_info(&self) -> Result<v1::ServerInfo, Error> {
        self.retrying(|| {
            let mut service = self.activities();
            let request = self.request(v1::GetServerInfoRequest {});
            async move { service.get_server_info(request).await }
        })
        .await
    }

    /// Ends a drain: the node takes workers and dispatches again.
    pub async fn resume(&self) -> Result<v1::ResumeResponse, Error> {
        Ok(self
            .admin()
            .resume(self.request(v1::ResumeRequest {}))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner())
    }

    /// Drains the server: it stops dispatching and lets running activities finish,
    /// up to `timeout` (the server's own drain timeout if `None`).
    pub async fn drain(&self, timeout: Option<Duration>) -> Result<v1::DrainResponse, Error> {
        let request = v1::DrainRequest {
            timeout: timeout.map(duration::to_proto),
        };
        Ok(self
            .admin()
            .drain(self.request(request))
            .await
            .map_err(|s| self.failed(s))?
            .into_inner())
    }
}

/// Fills empty ids with new UUIDv7s, as the server would, so that sending the
/// request again names the same key.
fn fill_ids(workflow_id: &mut String, activity_id: &mut String) {
    for id in [workflow_id, activity_id] {
        if id.is_empty() {
            *id = uuid::Uuid::now_v7().to_string();
        }
    }
}

#[cfg(test)]
mod tests;
