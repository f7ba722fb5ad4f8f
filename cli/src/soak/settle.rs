//! After the faults: waiting until nothing is scheduled or running, what is
//! still held or counted then, and every row read back for the checker.

use std::{collections::HashMap, time::Duration};

use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use tonic::transport::Channel;

use super::{Error, NAMESPACE, check, setup, worker};

/// Waits until nothing in the namespace is scheduled or running.
pub(super) async fn settle(mut client: ActivityServiceClient<Channel>, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while tokio::time::Instant::now() < deadline {
        if let Ok(stats) = client
            .stats(v1::StatsRequest {
                namespace: NAMESPACE.to_owned(),
            })
            .await
        {
            let s = stats.into_inner();
            if s.scheduled == 0 && s.running == 0 {
                return true;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Worker sessions that still count attempts in flight once nothing is RUNNING
/// (given a few seconds for acks on their way), on any node.
pub(super) async fn held_slots(channels: &[Channel]) -> Vec<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut held = Vec::new();
        for (i, channel) in channels.iter().enumerate() {
            let mut admin = AdminServiceClient::new(channel.clone());
            match admin
                .list_workers(v1::ListWorkersRequest {
                    namespace: NAMESPACE.to_owned(),
                })
                .await
            {
                Ok(answer) => held.extend(
                    answer
                        .into_inner()
                        .workers
                        .into_iter()
                        .filter(|w| w.in_flight > 0)
                        .map(|w| format!("node{i}/{}: {}", w.identity, w.in_flight)),
                ),
                Err(s) => held.push(format!("node{i}: cannot list workers: {}", s.message())),
            }
        }
        if held.is_empty() || tokio::time::Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the load's concurrency limit still counts once every activity has
/// finished: nothing, unless a fault left a key's counts behind its rows.
pub(super) async fn keys_left(channels: &[Channel]) -> Vec<String> {
    let mut admin = AdminServiceClient::new(channels[0].clone());
    let listed = admin
        .list_concurrency_limits(v1::ListConcurrencyLimitsRequest {
            namespace: NAMESPACE.to_owned(),
        })
        .await;
    match listed {
        Ok(answer) => answer
            .into_inner()
            .concurrency_limits
            .into_iter()
            .filter(|l| l.concurrency_key.is_empty() && (l.keys > 0 || l.running > 0 || l.held > 0))
            .map(|l| format!("{} keys, {} running, {} held", l.keys, l.running, l.held))
            .collect(),
        Err(s) => vec![format!("cannot list concurrency limits: {}", s.message())],
    }
}

/// Every row of the namespace, by activity id.
pub(super) async fn read_rows(
    mut client: ActivityServiceClient<Channel>,
) -> Result<HashMap<String, check::Row>, Error> {
    let mut rows = HashMap::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(v1::ListRequest {
                namespace: NAMESPACE.to_owned(),
                page_size: 1_000,
                page_token: token,
                ..Default::default()
            })
            .await
            .map_err(|s| setup(format!("cannot list the activities: {}", s.message())))?
            .into_inner();
        for a in page.activities {
            let Some(key) = &a.key else { continue };
            let output = a
                .output
                .as_ref()
                .and_then(|p| serde_json::from_slice::<worker::Output>(&p.data).ok())
                .map(|o| (o.by, o.attempt));
            rows.insert(
                key.activity_id.clone(),
                check::Row {
                    status: v1::ActivityStatus::try_from(a.status)
                        .unwrap_or(v1::ActivityStatus::Unspecified),
                    attempt: a.attempt,
                    output,
                    error_kind: a
                        .last_error
                        .as_ref()
                        .and_then(|e| v1::ErrorKind::try_from(e.kind).ok()),
                    started_at: a.started_at.as_ref().map(spool_proto::time::from_proto),
                    finished_at: a.finished_at.as_ref().map(spool_proto::time::from_proto),
                },
            );
        }
        if page.next_page_token.is_empty() {
            return Ok(rows);
        }
        token = page.next_page_token;
    }
}
