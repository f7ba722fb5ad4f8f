//! Calls to a running server that tests make again and again: every page of a
//! List (or its pages), the default namespace's Stats, Stats polled until they
//! show what a test waits for, and the admin listings of every namespace.

// A test helper: what it cannot do fails the test.
#![allow(clippy::expect_used)]

use std::time::Duration;

use spool_proto::v1::{
    self, activity_service_client::ActivityServiceClient, admin_service_client::AdminServiceClient,
};
use tonic::{Status, transport::Channel};

/// Every activity in the default namespace, over all pages.
pub async fn list_all(client: &mut ActivityServiceClient<Channel>) -> Vec<v1::Activity> {
    list_pages(client, 1000)
        .await
        .into_iter()
        .flat_map(|page| page.activities)
        .collect()
}

/// Every page of the default namespace's List, asking for `page_size` a page.
pub async fn list_pages(
    client: &mut ActivityServiceClient<Channel>,
    page_size: u32,
) -> Vec<v1::ListResponse> {
    let mut pages = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list(v1::ListRequest {
                page_size,
                page_token: token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        token = page.next_page_token.clone();
        pages.push(page);
        if token.is_empty() {
            return pages;
        }
    }
}

/// The default namespace's Stats now.
pub async fn stats(client: &mut ActivityServiceClient<Channel>) -> v1::StatsResponse {
    client
        .stats(v1::StatsRequest::default())
        .await
        .expect("stats")
        .into_inner()
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

/// The workers connected to the node behind `admin`, of every namespace.
pub async fn workers(
    admin: &mut AdminServiceClient<Channel>,
) -> Result<Vec<v1::WorkerInfo>, Status> {
    Ok(admin
        .list_workers(v1::ListWorkersRequest::default())
        .await?
        .into_inner()
        .workers)
}
