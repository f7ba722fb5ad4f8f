//! What one caller may take: sessions per token, unauthenticated streams, a unary
//! call's running time.

use std::time::Duration;

use spool_proto::v1;
use spool_testkit::faults::Faulty;
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::harness::*;

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
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = TestServer::on_store(faulty.clone(), |c| {
        c.limits.request_timeout = Duration::from_millis(300)
    })
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
    let (_server, mut client) = TestServer::serving().await;
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

/// Parked `Wait` calls are capped per token and on the node: past either cap a
/// Wait that would park is refused with RESOURCE_EXHAUSTED naming the flag, a
/// Wait on a finished activity is still answered, and a place freed (a caller
/// gone) is taken again.
#[tokio::test]
async fn parked_waits_are_capped_per_token_and_in_total() {
    const A: &str = "client-a-0123456789abcdef";
    const B: &str = "client-b-0123456789abcdef";
    let tokens = tokens_file(serde_json::json!([
        {"token": A, "role": "client"},
        {"token": B, "role": "client"},
    ]));
    // The caps are each node's.
    let server = TestServer::one_node_with(|c| {
        c.tokens_file = Some(tokens.path.clone());
        c.limits.max_waits_per_token = 2;
        c.limits.max_waits = 3;
    })
    .await;
    let client = server.client().await;
    let wait_for = |token: &'static str, id: &'static str, timeout: Duration| {
        let mut client = client.clone();
        let request = with_token(
            v1::WaitRequest {
                key: Some(key("wf", id)),
                timeout: Some(prost_types_duration(timeout)),
            },
            token,
        );
        async move { client.wait(request).await }
    };
    let mut submitter = client.clone();
    submitter
        .submit(with_token(request("t", "wf", "waiting"), A))
        .await
        .expect("submit");
    submitter
        .submit(with_token(request("t", "wf", "done"), A))
        .await
        .expect("submit");
    submitter
        .cancel(with_token(
            v1::CancelRequest {
                key: Some(key("wf", "done")),
                reason: String::new(),
            },
            A,
        ))
        .await
        .expect("cancel");
    let long = Duration::from_secs(60);
    // Long Waits held parked: one refused because a probe held a place at the
    // time ends at once, and is started again, until a probe is refused.
    let hold_until_refused = |token: &'static str, n: usize, flag: &'static str| async move {
        let mut held: Vec<tokio::task::JoinHandle<_>> = Vec::new();
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            held.retain(|h| !h.is_finished());
            while held.len() < n {
                held.push(tokio::spawn(wait_for(token, "waiting", long)));
            }
            match wait_for(token, "waiting", Duration::from_millis(200)).await {
                Err(e) if e.code() == Code::ResourceExhausted => {
                    assert!(e.message().contains(flag), "{}", e.message());
                    return held;
                }
                other => assert!(
                    std::time::Instant::now() < deadline,
                    "never refused: {other:?}"
                ),
            }
        }
    };
    let mut held_a = hold_until_refused(A, 2, "--max-waits-per-token").await;
    let _held_b = hold_until_refused(B, 1, "--max-waits").await;
    let finished = wait_for(B, "done", long)
        .await
        .expect("a finished activity is answered at the cap")
        .into_inner();
    assert_eq!(status(&finished), v1::ActivityStatus::Cancelled);
    held_a.pop().expect("a held Wait").abort();
    eventually("the place a caller left to be taken again", || {
        let wait = wait_for(A, "waiting", Duration::from_millis(200));
        async move { wait.await.ok() }
    })
    .await;
}
