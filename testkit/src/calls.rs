//! Calls to a running server that tests make again and again: every page of a
//! List, and Stats polled until they show what a test waits for.

// A test helper: what it cannot do fails the test.
#![allow(clippy::expect_used)]

use std::time::Duration;

use spool_proto::v1::{self, activity_service_client::ActivityServiceClient};
use tonic::transport::Channel;

/// Every activity in the default namespace, over all pages.
pub async fn list_all(client: &mut ActivityServiceClient<Channel>) -> Vec<v1::Activity> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(v1::ListRequest {
                page_size: 1000,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        all.extend(page.activities);
        if page.next_page_token.is_empty() {
            return all;
        }
        token = page.next_page_token;
    }
}

/// Polls the default namespace's Stats through `client` until `done` accepts
/// them, failing the test after `within`; returns the Stats that did.
pub async fn stats_until(
    client: &ActivityServiceClient<Channel>,
    within: Duration,
    what: &str,
    done: impl Fn(&v1::StatsResponse) -> bool,
) -> v1::StatsResponse {
    let done = &done;
    crate::fixtures::eventually_for(within, what, || {
        let mut client = client.clone();
        async move {
            let stats = client
                .stats(v1::StatsRequest::default())
                .await
                .ok()?
                .into_inner();
            done(&stats).then_some(stats)
        }
    })
    .await
}
