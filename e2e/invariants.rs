//! The rules a user relies on, each in a test that fails when the rule breaks: the
//! attempt budget only counts what the rules count, results are fenced to the
//! worker and attempt they were sent to, limits hold for every payload, and
//! protocol misuse is answered, not trusted.

use std::time::Duration;

use spool_proto::v1::{self, ActivityStatus, ErrorKind, worker_message};
use tonic::Code;

use crate::harness::*;

fn result(
    task: &v1::ActivityTask,
    outcome: v1::activity_result::Outcome,
) -> worker_message::Message {
    worker_message::Message::Result(v1::ActivityResult {
        workflow_id: task.workflow_id.clone(),
        activity_id: task.activity_id.clone(),
        attempt: task.attempt,
        outcome: Some(outcome),
    })
}

fn retryable_now(message: &str) -> v1::activity_result::Outcome {
    v1::activity_result::Outcome::Error(v1::ActivityError {
        kind: ErrorKind::Retryable as i32,
        r#type: "Flaky".into(),
        message: message.into(),
        details: None,
        next_retry_delay: Some(prost_types_duration(Duration::ZERO)),
    })
}

fn snooze_now() -> v1::activity_result::Outcome {
    v1::activity_result::Outcome::Snooze(prost_types_duration(Duration::ZERO))
}

fn with_budget(activity_id: &str, max_attempts: u32) -> v1::SubmitRequest {
    let mut req = request("t", "wf", activity_id);
    req.retry_policy = Some(v1::RetryPolicy {
        max_attempts,
        ..Default::default()
    });
    req
}

/// With `max_attempts = 2`: a snooze and a drain's release are not counted, so one
/// retryable failure after them still leaves an attempt, and it completes. Were
/// either counted, the failure would be the last and the activity FAILED.
#[tokio::test]
async fn uncounted_steps_leave_the_budget_whole() {
    // One node: a node stopping beside others hands its sessions over to resume
    // elsewhere instead of releasing their attempts (the resume tests).
    let server = TestServer::one_node().await;
    let (client, mut worker, first) = server.running_one(with_budget("a", 2)).await;
    worker.send(result(&first, snooze_now())).await;
    let (ack, second) = worker.ack_and_task().await;
    assert!(ack.accepted);
    assert_eq!(second.attempt, 2);
    // A deploy: the drain releases the running attempt.
    drop(client);
    let server = server.restart().await;
    drop(worker);
    let mut client = server.client().await;
    let mut worker = RawWorker::connect(&server, &["t"], 1).await;
    let third = worker.task().await;
    assert_eq!(third.attempt, 3);
    worker.send(result(&third, retryable_now("once"))).await;
    let (ack, fourth) = worker.ack_and_task().await;
    assert!(ack.accepted);
    assert_eq!(
        fourth.attempt, 4,
        "one counted failure of two: another attempt"
    );
    worker.complete(&fourth, fourth.attempt).await;
    assert!(worker.ack().await.accepted);
    let done = wait(&mut client, key("wf", "a")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(done.attempt, 4);
}

/// A re-drive gives a fresh budget: after three counted failures (FAILED), two
/// more failures still leave a third attempt, which completes.
#[tokio::test]
async fn a_re_drive_restores_the_whole_budget() {
    let server = TestServer::start().await;
    let (mut client, mut worker, mut task) = server.running_one(with_budget("a", 3)).await;
    for attempt in 1..=3 {
        assert_eq!(task.attempt, attempt);
        worker.send(result(&task, retryable_now("down"))).await;
        if attempt < 3 {
            let (ack, next) = worker.ack_and_task().await;
            assert!(ack.accepted);
            task = next;
        } else {
            assert!(worker.ack().await.accepted);
        }
    }
    let dead = wait(&mut client, key("wf", "a")).await;
    assert_eq!(
        status(&dead),
        ActivityStatus::Failed,
        "the budget was spent"
    );
    redrive(&mut client, key("wf", "a")).await.unwrap();
    let mut task = worker.task().await;
    for attempt in 4..=5 {
        assert_eq!(task.attempt, attempt);
        worker
            .send(result(&task, retryable_now("still down")))
            .await;
        let (ack, next) = worker.ack_and_task().await;
        assert!(ack.accepted);
        task = next;
    }
    let last = task;
    assert_eq!(last.attempt, 6, "a fresh budget of three");
    worker.complete(&last, last.attempt).await;
    assert!(worker.ack().await.accepted);
    let done = wait(&mut client, key("wf", "a")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
}

/// A result counts only from the worker the attempt was sent to: another worker
/// naming the same ids and attempt is refused, and the row stays RUNNING.
#[tokio::test]
async fn another_workers_result_for_the_same_attempt_is_refused() {
    let server = TestServer::start().await;
    let (mut client, mut holder, task) = server.running_one(request("t", "wf", "a")).await;
    let mut other = RawWorker::connect(&server, &["t"], 1).await;
    other.complete(&task, task.attempt).await;
    assert!(!other.ack().await.accepted, "not its attempt");
    let row = get(&mut client, key("wf", "a")).await;
    assert_eq!(status(&row), ActivityStatus::Running);
    assert_eq!(row.attempt, task.attempt);
    holder.complete(&task, task.attempt).await;
    assert!(holder.ack().await.accepted);
}

/// With a small `--max-payload-bytes`, every payload is held to it: a submit's input
/// is refused with the exact message; an output over it fails the activity; heartbeat
/// details over it are dropped; error details over it are dropped with a note.
#[tokio::test]
async fn every_payload_is_held_to_the_limit() {
    let server = TestServer::start_with(|c| c.max_payload_bytes = 64).await;
    let mut client = server.client().await;
    let big = || v1::Payload {
        content_type: "application/octet-stream".into(),
        data: vec![1u8; 65],
    };
    let fits = || v1::Payload {
        content_type: "application/octet-stream".into(),
        data: vec![1u8; 64],
    };
    let mut req = request("t", "wf", "big-input");
    req.input = Some(big());
    let err = client.submit(req).await.expect_err("65 bytes over 64");
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(
        err.message(),
        "input is 65 bytes, over the server's limit of 64 bytes (--max-payload-bytes)"
    );
    let mut req = request("t", "wf", "at-limit");
    req.input = Some(fits());
    submit(&mut client, req).await;

    let mut worker = RawWorker::connect(&server, &["t"], 1).await;
    // Output over the limit: the activity fails, terminally, saying why.
    let task = worker.task().await;
    worker
        .send(result(&task, v1::activity_result::Outcome::Output(big())))
        .await;
    assert!(worker.ack().await.accepted);
    let failed = get(&mut client, key("wf", "at-limit")).await;
    let error = dead_letter_error(&failed);
    assert_eq!(error.r#type, "PayloadTooLarge");
    assert_eq!(
        error.message,
        "output is 65 bytes, over the server's limit of 64 bytes (--max-payload-bytes)"
    );

    // Heartbeat details over the limit are dropped; what fits is kept.
    submit(&mut client, request("t", "wf", "beats")).await;
    let task = worker.task().await;
    let beat = |details| {
        worker_message::Message::Heartbeat(v1::Heartbeat {
            workflow_id: task.workflow_id.clone(),
            activity_id: task.activity_id.clone(),
            attempt: task.attempt,
            details: Some(details),
        })
    };
    worker.send(beat(fits())).await;
    worker.send(beat(big())).await;
    // Error details over the limit are dropped, and the message says so.
    worker
        .send(result(
            &task,
            v1::activity_result::Outcome::Error(v1::ActivityError {
                kind: ErrorKind::Terminal as i32,
                r#type: "Broke".into(),
                message: "it broke".into(),
                details: Some(big()),
                next_retry_delay: None,
            }),
        ))
        .await;
    assert!(worker.ack().await.accepted);
    let row = get(&mut client, key("wf", "beats")).await;
    assert_eq!(
        row.heartbeat_details.map(|d| d.data.len()),
        Some(64),
        "the details that fit were kept, the oversized ones dropped"
    );
    let error = row.last_error.unwrap();
    assert!(error.details.is_none());
    assert_eq!(
        error.message,
        "it broke [error details dropped: over the payload limit]"
    );
}

/// Workers may only send RETRYABLE or TERMINAL: a worker claiming WORKER_LOST or
/// TIMEOUT itself is recorded as RETRYABLE; a result without an outcome is a
/// retryable `InvalidResult`.
#[tokio::test]
async fn a_worker_cannot_claim_server_error_kinds_or_send_no_outcome() {
    let (server, mut client) = TestServer::serving().await;
    for id in ["lost", "timeout", "empty"] {
        let mut req = request("t", "wf", id);
        req.retry_policy = Some(v1::RetryPolicy {
            max_attempts: 5,
            initial_interval: Some(prost_types_duration(Duration::from_secs(3600))),
            ..Default::default()
        });
        submit(&mut client, req).await;
    }
    let mut worker = RawWorker::connect(&server, &["t"], 3).await;
    let mut tasks = Vec::new();
    while tasks.len() < 3 {
        tasks.push(worker.task().await);
    }
    for task in tasks {
        let claimed = |kind: ErrorKind| {
            v1::activity_result::Outcome::Error(v1::ActivityError {
                kind: kind as i32,
                r#type: "Claimed".into(),
                message: "a worker's claim".into(),
                details: None,
                next_retry_delay: None,
            })
        };
        let message = match task.activity_id.as_str() {
            "lost" => result(&task, claimed(ErrorKind::WorkerLost)),
            "timeout" => result(&task, claimed(ErrorKind::Timeout)),
            _ => worker_message::Message::Result(v1::ActivityResult {
                workflow_id: task.workflow_id.clone(),
                activity_id: task.activity_id.clone(),
                attempt: task.attempt,
                outcome: None,
            }),
        };
        worker.send(message).await;
        assert!(worker.ack().await.accepted);
    }
    for id in ["lost", "timeout", "empty"] {
        let row = get(&mut client, key("wf", id)).await;
        assert_eq!(status(&row), ActivityStatus::Scheduled, "{id} is retried");
        let error = row.last_error.unwrap();
        assert_eq!(error.kind, ErrorKind::Retryable as i32, "{id}");
        if id == "empty" {
            assert_eq!(error.r#type, "InvalidResult");
        }
    }
}

/// A second `Hello` in a session ends it with INVALID_ARGUMENT, and what the
/// worker held is lost (and runs again), not trusted.
#[tokio::test]
async fn a_second_hello_ends_the_session() {
    let server = TestServer::start().await;
    let (mut client, mut worker, task) = server.running_one(request("t", "wf", "a")).await;
    worker
        .send(worker_message::Message::Hello(hello(&["t"], 1)))
        .await;
    let ended = loop {
        match tokio::time::timeout(WAIT, worker.rx.message()).await {
            Ok(Err(status)) => break status,
            Ok(Ok(Some(_))) => continue,
            other => panic!("expected the stream to end with an error, got {other:?}"),
        }
    };
    assert_eq!(ended.code(), Code::InvalidArgument);
    let mut other = RawWorker::connect(&server, &["t"], 1).await;
    let again = other.task().await;
    assert_eq!(
        (again.activity_id.as_str(), again.attempt),
        ("a", task.attempt + 1)
    );
    let row = get(&mut client, key("wf", "a")).await;
    assert_eq!(
        row.last_error.map(|e| e.kind),
        Some(ErrorKind::WorkerLost as i32)
    );
}
