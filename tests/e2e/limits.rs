//! What one caller may take: sessions per token, unauthenticated streams, a unary
//! call's running time.

use std::{sync::Arc, time::Duration};

use spool_proto::v1;
use spool_server::store::Store;
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::{faults::Faulty, harness::*};

#[tokio::test]
async fn sessions_per_token_are_capped_and_freed_on_close() {
    // The cap is each node's.
    let server = TestServer::one_node_with(|c| c.limits.max_sessions_per_token = 2).await;
    let first = RawWorker::connect(&server, &["t"], 1).await;
    let _second = RawWorker::connect(&server, &["t"], 1).await;
    let err = RawWorker::open(
        &server,
        v1::worker_message::Message::Hello(hello(&["t"], 1)),
    )
    .await
    .err()
    .expect("a third session is refused");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(
        err.message().contains("--max-sessions-per-token"),
        "{}",
        err.message()
    );
    drop(first);
    eventually("a place to free up", || async {
        RawWorker::open(
            &server,
            v1::worker_message::Message::Hello(hello(&["t"], 1)),
        )
        .await
        .ok()
    })
    .await;
}

#[tokio::test]
async fn unauthenticated_watch_streams_are_bounded_but_checks_are_not() {
    // The bound is each node's.
    let server = TestServer::one_node_with(|c| c.limits.max_open_streams_unauthenticated = 2).await;
    let mut health = HealthClient::new(server.channel().await);
    let mut watches = Vec::new();
    for _ in 0..2 {
        let mut stream = health
            .watch(HealthCheckRequest::default())
            .await
            .expect("a watch within the bound")
            .into_inner();
        stream.message().await.expect("first status");
        watches.push(stream);
    }
    let refused = match health.watch(HealthCheckRequest::default()).await {
        Err(status) => status,
        Ok(response) => response
            .into_inner()
            .message()
            .await
            .expect_err("a third watch is refused"),
    };
    assert_eq!(refused.code(), Code::ResourceExhausted);
    // A probe's Check is never refused for want of a Watch slot.
    health
        .check(HealthCheckRequest::default())
        .await
        .expect("Check still answers");
    drop(watches);
    eventually("a watch slot to free up", || {
        let mut health = health.clone();
        async move {
            let mut stream = health
                .watch(HealthCheckRequest::default())
                .await
                .ok()?
                .into_inner();
            stream.message().await.ok().flatten()
        }
    })
    .await;
}

/// A unary call that cannot finish (the store hangs) is answered at
/// `--request-timeout`, with DEADLINE_EXCEEDED and what to do.
#[tokio::test]
async fn a_unary_call_is_cut_at_the_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::sqlite(&format!("sqlite://{}", dir.path().join("f.db").display())).await;
    let store: Arc<dyn Store> = faulty.clone();
    let server = TestServer::start_with_store(
        move |_| Box::pin(async move { store }),
        |c| c.limits.request_timeout = Duration::from_millis(300),
    )
    .await;
    let mut client = server.client().await;
    let mut admin = server.admin().await;
    faulty.stall(true);
    let cut = |err: Status, started: std::time::Instant| {
        assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
        assert!(
            err.message().contains("--request-timeout"),
            "{}",
            err.message()
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    };
    let started = std::time::Instant::now();
    let err = client
        .submit(request("t", "wf", "a"))
        .await
        .expect_err("the store hangs");
    cut(err, started);
    // An operator's call too.
    let started = std::time::Instant::now();
    let set = admin.set_rate_limit(v1::SetRateLimitRequest {
        rate_limit: Some(v1::RateLimit {
            namespace: "default".into(),
            activity_type: "t".into(),
            limit: 10,
            period: Some(prost_types_duration(Duration::from_secs(1))),
            ..Default::default()
        }),
    });
    let err = tokio::time::timeout(Duration::from_secs(5), set)
        .await
        .expect("answered, not left hanging")
        .expect_err("the store hangs");
    cut(err, started);
    faulty.stall(false);
    // The submit may still land; retrying with the same key is safe.
    let retried = client.submit(request("t", "wf", "a")).await.unwrap();
    assert_eq!(
        retried
            .into_inner()
            .activity
            .unwrap()
            .key
            .unwrap()
            .activity_id,
        "a"
    );
}

/// A SubmitBatch just under the message limit: its answer, the stored activities
/// with what the server set on each (namespace, times, status), is larger than
/// the request, and still comes back. Refused after the commit, it would tell
/// the caller that activities it stored were not.
#[tokio::test]
async fn a_batch_just_under_the_message_limit_is_answered() {
    use prost::Message;
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let limit = spool_server::Config::new("sqlite://unused").max_message_bytes();
    let row = |i: usize, input: usize| v1::SubmitRequest {
        input: Some(v1::Payload {
            content_type: "application/octet-stream".into(),
            data: vec![b'x'; input],
        }),
        ..request("t", "wf", &format!("a{i}"))
    };
    let rows = 10_000;
    let one = row(0, 0).encoded_len() + 8;
    let input = (limit - 64 * 1024) / rows - one;
    let batch = v1::SubmitBatchRequest {
        activities: (0..rows).map(|i| row(i, input)).collect(),
    };
    assert!(
        batch.encoded_len() < limit,
        "{} >= {limit}",
        batch.encoded_len()
    );
    let answer = client
        .submit_batch(batch)
        .await
        .expect("answered")
        .into_inner();
    assert_eq!(answer.results.len(), rows);
    assert!(
        answer.encoded_len() > limit,
        "the answer ({} bytes) is larger than the limit",
        answer.encoded_len()
    );
}
