//! Hostile and broken clients: absurd durations, answers that would explode,
//! control characters, greedy workers. None may stop the server, poison stored
//! data or take more than its share.

use std::time::Duration;

use prost::Message;
use spool_proto::v1::{
    self, ActivityStatus, activity_service_client::ActivityServiceClient, worker_message,
};
use tonic::Code;

use crate::harness::*;

fn seconds(seconds: i64) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos: 0 })
}

/// Every duration field of a submit refuses what would overflow a time.
#[tokio::test]
async fn absurd_durations_are_refused_and_nothing_is_stored() {
    let (_server, mut client) = TestServer::serving().await;
    type Set = fn(&mut v1::SubmitRequest, Option<prost_types::Duration>);
    let fields: [(&str, Set); 6] = [
        ("schedule_to_close_timeout", |r, d| {
            r.schedule_to_close_timeout = d
        }),
        ("start_to_close_timeout", |r, d| {
            r.start_to_close_timeout = d
        }),
        ("heartbeat_timeout", |r, d| r.heartbeat_timeout = d),
        ("delay", |r, d| r.delay = d),
        ("retry_policy.initial_interval", |r, d| {
            r.retry_policy = Some(v1::RetryPolicy {
                initial_interval: d,
                ..Default::default()
            })
        }),
        ("retry_policy.max_interval", |r, d| {
            r.retry_policy = Some(v1::RetryPolicy {
                max_interval: d,
                ..Default::default()
            })
        }),
    ];
    for (field, set) in fields {
        for bad in [seconds(1_000_000_000_000), seconds(i64::MAX), seconds(-1)] {
            let mut req = request("t", "wf", field);
            set(&mut req, bad);
            let err = client.submit(req).await.expect_err(field);
            assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
            assert!(err.message().contains(field), "{field}: {}", err.message());
        }
    }
    let mut nan = request("t", "wf", "nan");
    nan.retry_policy = Some(v1::RetryPolicy {
        backoff_coefficient: f64::NAN,
        ..Default::default()
    });
    let err = client.submit(nan).await.expect_err("NaN");
    assert_eq!(err.code(), Code::InvalidArgument);
    let stats = stats(&mut client).await;
    assert_eq!(stats.scheduled, 0, "nothing was stored");
    // Ten years is the limit, and it is accepted; the activity reads back.
    let mut ten_years = request("t", "wf", "ten-years");
    ten_years.schedule_to_close_timeout = seconds(10 * 365 * 86_400);
    submit(&mut client, ten_years).await;
    assert_eq!(list_all(&mut client).await.len(), 1);
}

/// A batch naming one large stored activity many times: a small request must not
/// get a huge answer.
#[tokio::test]
async fn a_batch_of_existing_keys_gets_a_small_answer() {
    let (_server, mut client) = TestServer::serving().await;
    let mut big = request("t", "wf", "big");
    big.input = Some(v1::Payload {
        content_type: String::new(),
        data: vec![b'x'; 2 * 1024 * 1024],
    });
    submit(&mut client, big).await;
    let mut again = request("t", "wf", "big");
    again.input = None;
    let batch = v1::SubmitBatchRequest {
        activities: vec![again; 400],
    };
    let wire = batch.encoded_len();
    let answer = client.submit_batch(batch).await.unwrap().into_inner();
    assert_eq!(answer.results.len(), 400);
    assert!(answer.results.iter().all(|r| !r.created));
    assert!(
        answer.encoded_len() < 40 * wire,
        "{} bytes answered a request of {wire}",
        answer.encoded_len()
    );
    let first = answer.results[0].activity.as_ref().unwrap();
    assert_eq!(first.key.as_ref().unwrap().activity_id, "big");
    assert_eq!(first.status, ActivityStatus::Scheduled as i32);
    assert!(first.input.is_none());
}

/// A client on gRPC's default 4 MiB receive limit can list large activities.
#[tokio::test]
async fn list_pages_fit_a_default_client() {
    let server = TestServer::start().await;
    // tonic's default decoding limit is 4 MiB, like grpcio, grpc-go and grpc-java.
    let mut client = ActivityServiceClient::new(server.channel().await);
    for i in 0..12 {
        let mut big = request("t", "wf", &format!("a{i:02}"));
        big.input = Some(v1::Payload {
            content_type: String::new(),
            data: vec![b'x'; 1024 * 1024],
        });
        client.submit(big).await.unwrap();
    }
    // Each page fits 4 MiB, or the List itself would have failed.
    let pages = list_pages(&mut client, 100).await;
    for page in &pages {
        assert!(page.encoded_len() < 4 * 1024 * 1024);
    }
    let seen: usize = pages.iter().map(|page| page.activities.len()).sum();
    assert_eq!(seen, 12);
    assert!(pages.len() >= 4, "{} pages", pages.len());
}

#[tokio::test]
async fn control_characters_from_clients_are_refused() {
    let (_server, mut client) = TestServer::serving().await;
    submit(&mut client, request("t", "wf", "a")).await;
    invalid(
        cancel(&mut client, key("wf", "a"), "stop\0now").await,
        "reason",
    );
    invalid(
        cancel(&mut client, key("wf", "a"), "x".repeat(33 * 1024)).await,
        "reason",
    );
    let mut bad_type = request("t", "wf", "b");
    bad_type.input = Some(v1::Payload {
        content_type: "text/\0plain".into(),
        data: Vec::new(),
    });
    let err = client.submit(bad_type).await.expect_err("NUL content type");
    assert_eq!(err.code(), Code::InvalidArgument);
    // A line break in a reason is text, not an attack.
    let cancelled = cancel(&mut client, key("wf", "a"), "first line\nsecond line")
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        cancelled.last_error.map(|e| e.message).as_deref(),
        Some("first line\nsecond line")
    );
}

/// A greedy worker is granted the server's cap, and is never sent more.
#[tokio::test]
async fn a_worker_asking_for_every_slot_gets_the_cap() {
    let server = TestServer::start_with(|c| c.limits.max_worker_concurrency = 8).await;
    let mut client = server.client().await;
    let batch = v1::SubmitBatchRequest {
        activities: (0..50)
            .map(|i| request("t", "wf", &format!("a{i}")))
            .collect(),
    };
    client.submit_batch(batch).await.unwrap();
    let mut worker = RawWorker::connect(&server, &["t"], u32::MAX).await;
    assert_eq!(worker.welcome.max_concurrency, 8);
    for _ in 0..8 {
        worker.task().await;
    }
    worker.quiet_for(Duration::from_millis(300)).await;
    let too_many: Vec<String> = (0..1_001).map(|i| format!("t{i}")).collect();
    let types: Vec<&str> = too_many.iter().map(String::as_str).collect();
    let err = RawWorker::open(&server, worker_message::Message::Hello(hello(&types, 1)))
        .await
        .err()
        .expect("too many types");
    assert_eq!(err.code(), Code::InvalidArgument);
}

/// A worker's text is sanitised, never refused: its outcome is kept.
async fn worker_text_is_sanitised(server: &TestServer) {
    let mut client = server.client().await;
    submit_with_retries(&mut client, "t", "nul", 1).await;
    let mut worker = RawWorker::connect(server, &["t"], 1).await;
    let task = worker.task().await;
    worker
        .send(worker_message::Message::Result(v1::ActivityResult {
            workflow_id: task.workflow_id.clone(),
            activity_id: task.activity_id.clone(),
            attempt: task.attempt,
            outcome: Some(v1::activity_result::Outcome::Error(v1::ActivityError {
                kind: v1::ErrorKind::Retryable as i32,
                r#type: "Bad\0Type".into(),
                message: "nul \0 here\nand a line".into(),
                details: Some(v1::Payload {
                    content_type: "text/\0x".into(),
                    data: b"d".to_vec(),
                }),
                next_retry_delay: seconds(i64::MAX),
            })),
        }))
        .await;
    assert!(worker.ack().await.accepted);
    let failed = wait(&mut client, key("wf", "nul")).await;
    let error = dead_letter_error(&failed);
    assert_eq!(error.r#type, "Bad\u{fffd}Type");
    assert_eq!(error.message, "nul \u{fffd} here\nand a line");
    assert_eq!(error.details.unwrap().content_type, "text/\u{fffd}x");
    // Dispatch goes on.
    submit(&mut client, request("t", "wf", "after")).await;
    let task = worker.task().await;
    worker.complete(&task, task.attempt).await;
    assert!(worker.ack().await.accepted);
}

#[tokio::test]
async fn worker_text_is_sanitised_on_sqlite() {
    let server = TestServer::one_node().await;
    worker_text_is_sanitised(&server).await;
}

#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn worker_text_is_sanitised_on_postgres() {
    let server = TestServer::start_on_database(&postgres_schema().await).await;
    worker_text_is_sanitised(&server).await;
}

/// A worker that sends its keep-alives but asks for a snooze of ten thousand
/// years gets the longest delay there is, not an overflow.
#[tokio::test]
async fn an_absurd_snooze_is_cut_to_the_limit() {
    let server = TestServer::start().await;
    let (mut client, mut worker, task) = server.running_one(request("t", "wf", "snooze")).await;
    worker
        .send(worker_message::Message::Result(v1::ActivityResult {
            workflow_id: task.workflow_id.clone(),
            activity_id: task.activity_id.clone(),
            attempt: task.attempt,
            outcome: Some(v1::activity_result::Outcome::Snooze(
                prost_types::Duration {
                    seconds: i64::MAX,
                    nanos: 999_999_999,
                },
            )),
        }))
        .await;
    assert!(worker.ack().await.accepted);
    let row = get(&mut client, key("wf", "snooze")).await;
    assert_eq!(status(&row), ActivityStatus::Scheduled);
    let next = row.next_at.unwrap().seconds;
    let now = spool_proto::time::now_millis() / 1000;
    let ten_years = 10 * 365 * 86_400;
    assert!(
        (next - now - ten_years).abs() < 60,
        "next_at {next} is ten years away"
    );
    assert_eq!(list_all(&mut client).await.len(), 1);
}

/// Large payloads and a slow worker: rows claimed ahead wait in the server, and
/// tasks of 4 MiB queue behind the worker's HTTP/2 window, yet the session keeps
/// reading its heartbeats: no attempt times out, none is lost or run twice.
#[tokio::test(flavor = "multi_thread")]
async fn large_tasks_for_a_slow_worker_neither_time_out_nor_run_twice() {
    use std::sync::{Arc, Mutex};
    let server = TestServer::one_node().await;
    let mut client = server.client().await;
    let runs: Arc<Mutex<Vec<(String, u32)>>> = Arc::default();
    let seen = runs.clone();
    let _worker = server.worker(move |w| {
        w.max_concurrency(2).activity("big", move |ctx, input| {
            let seen = seen.clone();
            async move {
                let info = ctx.info().clone();
                seen.lock()
                    .unwrap()
                    .push((info.activity_id.clone(), info.attempt));
                for _ in 0..4 {
                    ctx.heartbeat(None);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                spool_worker::json(&input.data.len())
            }
        })
    });
    let n = 24;
    for i in 0..n {
        submit(
            &mut client,
            v1::SubmitRequest {
                input: Some(v1::Payload {
                    content_type: "application/octet-stream".into(),
                    data: vec![b'x'; 4 * 1024 * 1024],
                }),
                heartbeat_timeout: Some(prost_types_duration(Duration::from_secs(1))),
                retry_policy: fast_retries(1),
                ..request("big", "wf", &format!("b{i}"))
            },
        )
        .await;
    }
    // Generous: 96 MiB of tasks through one debug-built worker on a busy machine.
    for i in 0..n {
        let done = wait_within(
            &mut client,
            key("wf", &format!("b{i}")),
            Duration::from_secs(120),
        )
        .await;
        // Rows claimed ahead beyond what a worker may hold go back uncounted
        // and run as a later attempt: one counted attempt each.
        assert_eq!(
            (status(&done), done.counted_attempts),
            (v1::ActivityStatus::Completed, 1),
            "b{i}: {:?}",
            done.last_error
        );
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), n, "each ran once: {runs:?}");
}
