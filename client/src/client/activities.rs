//! The activity service, untyped: submits, reads, waits, cancels and retries,
//! and listing page by page, to a limit, or as a stream.

use std::time::Duration;

use spool_proto::{duration, v1};

use super::Client;
use crate::Error;

impl Client {
    /// Submits one activity; `created` is false when its key already existed with
    /// the same type (the stored activity is returned).
    pub async fn submit(
        &self,
        mut request: v1::SubmitRequest,
    ) -> Result<v1::SubmitResponse, Error> {
        fill_ids(&mut request.workflow_id, &mut request.activity_id);
        self.retried(&request, |mut s, r| async move { s.submit(r).await })
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
        self.retried(&request, |mut s, r| async move { s.submit_batch(r).await })
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
        self.retried(&request, |mut s, r| async move { s.get(r).await })
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
        self.once(self.activities().cancel(self.request(request)))
            .await
    }

    /// Runs a FAILED or CANCELLED activity again, with a fresh attempt budget.
    pub async fn retry(&self, key: v1::ActivityKey) -> Result<v1::Activity, Error> {
        let request = v1::RetryRequest { key: Some(key) };
        self.once(self.activities().retry(self.request(request)))
            .await
    }

    /// One page of activities; pass its `next_page_token` for the next.
    pub async fn list(&self, request: v1::ListRequest) -> Result<v1::ListResponse, Error> {
        self.retried(&request, |mut s, r| async move { s.list(r).await })
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
        self.retried(&request, |mut s, r| async move { s.stats(r).await })
            .await
    }

    /// What the server is (version, protocol versions) and what it accepts (payload
    /// size, batch size, worker concurrency, heartbeat interval, longest wait).
    pub async fn server_info(&self) -> Result<v1::ServerInfo, Error> {
        self.retried(&v1::GetServerInfoRequest {}, |mut s, r| async move {
            s.get_server_info(r).await
        })
        .await
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
