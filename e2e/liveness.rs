//! Heartbeats, timeouts, silent workers and the admin drain, in process.

use std::{sync::Arc, time::Duration};

use spool_proto::v1::{self, ActivityStatus, ErrorKind, server_message, worker_message};
use spool_worker::{ActivityError, Payload};
use tokio::sync::Notify;

use crate::harness::*;

fn ms(n: u64) -> Option<prost_types::Duration> {
    Some(prost_types_duration(Duration::from_millis(n)))
}

/// Drains `server`, giving what runs `timeout_ms` to finish.
async fn drain(server: &TestServer, timeout_ms: u64) -> v1::DrainResponse {
    let request = v1::DrainRequest {
        timeout: ms(timeout_ms),
    };
    server
        .admin()
        .await
        .drain(request)
        .await
        .unwrap()
        .into_inner()
}

fn last_error(activity: &v1::Activity) -> (ErrorKind, String) {
    let e = activity.last_error.clone().expect("a last error");
    (ErrorKind::try_from(e.kind).expect("known kind"), e.r#type)
}

#[tokio::test]
async fn heartbeat_timeout_ends_the_attempt_and_retries_it() {
    let server = TestServer::start().await;
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;
    let mut client = server.client().await;
    // Beats come every 50 ms; the timeout is ten times that, so a loaded machine
    // does not time out a live attempt.
    submit_beating(&mut client, "t", "hb", 500, 3).await;
    let first = raw.task().await;
    assert_eq!(first.heartbeat_timeout, ms(500));
    // Silence: the server ends attempt 1 and tells the worker.
    match raw.next().await {
        server_message::Message::Cancel(c) => {
            assert_eq!(c.attempt, 1);
            assert!(c.reason.contains("heartbeat"), "{}", c.reason);
        }
        other => panic!("expected CancelActivity, got {other:?}"),
    }
    let row = row_when(
        &client,
        key("wf", "hb"),
        "the timeout to be recorded",
        |row| row.last_error.is_some(),
    )
    .await;
    assert_eq!(
        last_error(&row),
        (ErrorKind::Timeout, "HeartbeatTimeout".into())
    );
    // The slot is still taken: attempt 2 waits for the worker to answer attempt 1.
    raw.quiet_for(Duration::from_millis(150)).await;
    raw.complete(&first, 1).await;
    let mut got_ack = false;
    let mut second = None;
    while !(got_ack && second.is_some()) {
        match raw.next().await {
            server_message::Message::Ack(a) => {
                assert!(!a.accepted, "a result for a timed-out attempt is refused");
                got_ack = true;
            }
            server_message::Message::Task(t) => second = Some(t),
            other => panic!("unexpected {other:?}"),
        }
    }
    let second = second.unwrap();
    assert_eq!(second.attempt, 2);
    // Heartbeats keep attempt 2 alive past the timeout, and their details are readable.
    let beats = {
        let tx = raw.tx.clone();
        tokio::spawn(async move {
            for i in 0.. {
                let beat = v1::Heartbeat {
                    workflow_id: "wf".into(),
                    activity_id: "hb".into(),
                    attempt: 2,
                    details: Some(json(serde_json::json!({"progress": i}))),
                };
                let message = v1::WorkerMessage {
                    message: Some(worker_message::Message::Heartbeat(beat)),
                };
                if tx.send(message).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let started = tokio::time::Instant::now();
    let row = row_when(
        &client,
        key("wf", "hb"),
        "heartbeat details to be stored",
        |row| row.heartbeat_details.is_some(),
    )
    .await;
    let progress: serde_json::Value =
        serde_json::from_slice(&row.heartbeat_details.unwrap().data).unwrap();
    assert!(progress["progress"].is_u64(), "{progress}");
    // Four times the 500 ms timeout, with the sweep judging it every second, attempt
    // 2 still runs.
    tokio::time::sleep(Duration::from_millis(2_000).saturating_sub(started.elapsed())).await;
    let row = get(&mut client, key("wf", "hb")).await;
    assert_eq!(outcome(&row), (ActivityStatus::Running, 2));
    beats.abort();
    raw.complete(&second, 2).await;
    assert!(raw.ack().await.accepted);
}

#[tokio::test]
async fn start_to_close_fails_each_attempt_as_timeout() {
    let server = TestServer::start().await;
    let cancelled = Arc::new(Notify::new());
    let c = cancelled.clone();
    let _worker = server.worker(move |w| {
        w.activity("stuck", move |ctx, _| {
            let c = c.clone();
            async move {
                ctx.cancelled().await;
                c.notify_one();
                Err(ActivityError::retryable("Stopped", "told to stop"))
            }
        })
    });
    let mut client = server.client().await;
    let mut req = request("stuck", "wf", "s2c");
    req.start_to_close_timeout = ms(150);
    req.retry_policy = fast_retries(2);
    submit(&mut client, req).await;
    let done = wait(&mut client, key("wf", "s2c")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Failed, 2));
    assert_eq!(
        last_error(&done),
        (ErrorKind::Timeout, "StartToCloseTimeout".into())
    );
    // The SDK handler was told to stop.
    tokio::time::timeout(WAIT, cancelled.notified())
        .await
        .unwrap();
}

#[tokio::test]
async fn schedule_to_close_fails_waiting_and_running_activities_for_good() {
    let (server, mut client) = TestServer::serving().await;
    let mut waiting = request("unserved", "wf", "waiting");
    waiting.schedule_to_close_timeout = ms(200);
    submit(&mut client, waiting).await;
    let done = wait(&mut client, key("wf", "waiting")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Failed, 0));
    assert_eq!(
        last_error(&done),
        (ErrorKind::Timeout, "ScheduleToCloseTimeout".into())
    );

    let _worker = server.worker(|w| {
        w.activity("slow", |ctx, _| async move {
            ctx.cancelled().await;
            Ok(Payload::default())
        })
    });
    let mut running = request("slow", "wf", "running");
    running.schedule_to_close_timeout = ms(300);
    running.retry_policy = fast_retries(10);
    submit(&mut client, running).await;
    let done = wait(&mut client, key("wf", "running")).await;
    assert_eq!(status(&done), ActivityStatus::Failed);
    assert_eq!(done.attempt, 1, "schedule-to-close is not retried");
    assert_eq!(
        last_error(&done),
        (ErrorKind::Timeout, "ScheduleToCloseTimeout".into())
    );
}

#[tokio::test]
async fn a_silent_worker_is_lost_and_its_attempt_goes_elsewhere() {
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(100)).await;
    // Stored first, so the silent worker's first claim takes it: its 300 ms run
    // from its Welcome.
    let mut client = server.client().await;
    submit(&mut client, request("t", "wf", "s")).await;
    // The raw worker sends no keep-alives at all.
    let mut silent = RawWorker::connect(&server, &["t"], 1).await;
    assert_eq!(silent.welcome.heartbeat_interval, ms(100));
    assert_eq!(silent.task().await.attempt, 1);
    let started = tokio::time::Instant::now();
    let _healthy = server.completing("t");
    let done = wait(&mut client, key("wf", "s")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Completed, 2));
    assert_eq!(last_error(&done).0, ErrorKind::WorkerLost);
    // Evicted after 3 silent intervals (300 ms), far sooner than any lease (30 s):
    // the bound leaves room for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "lost after {:?}",
        started.elapsed()
    );
    // Its stream ends with UNAVAILABLE.
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match silent.rx.message().await {
                Ok(Some(_)) => continue,
                other => return other,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(end.unwrap_err().code(), tonic::Code::Unavailable);
}

#[tokio::test]
async fn admin_drain_lets_running_work_finish_and_refuses_new_sessions() {
    // A drain is the node's own: the one node asked, and its sessions.
    let server = TestServer::one_node().await;
    let mut idle = RawWorker::connect(&server, &["idle"], 1).await;
    let _worker = server.worker(|w| {
        w.max_concurrency(4).activity("short", |_, _| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(Payload::default())
        })
    });
    server.await_workers(1).await;
    let mut client = server.client().await;
    for i in 0..3 {
        submit(&mut client, request("short", "wf", &format!("d{i}"))).await;
    }
    stats_until(&client, WAIT, "3 running", |s| s.running == 3).await;
    let report = drain(&server, 5_000).await;
    assert_eq!((report.completed, report.released), (3, 0));
    for i in 0..3 {
        let row = get(&mut client, key("wf", &format!("d{i}"))).await;
        assert_eq!(outcome(&row), (ActivityStatus::Completed, 1));
    }
    // Still up: submits are stored but not dispatched (the raw worker, connected
    // before the drain and ignoring it, is sent nothing); new workers are turned away.
    submit(&mut client, request("idle", "wf", "after")).await;
    let err = RawWorker::open(
        &server,
        worker_message::Message::Hello(hello(&["short"], 1)),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let mut drained = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_millis(300), idle.rx.message()).await {
            Ok(Ok(Some(v1::ServerMessage { message: Some(m) }))) => drained.push(m),
            Ok(other) => panic!("the idle worker's stream: {other:?}"),
            Err(_) => break,
        }
    }
    assert!(
        drained
            .iter()
            .all(|m| matches!(m, server_message::Message::Drain(_))),
        "only Drain reaches a worker after the drain: {drained:?}"
    );
    let after = get(&mut client, key("wf", "after")).await;
    assert_eq!(outcome(&after), (ActivityStatus::Scheduled, 0));
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let check = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        check.status,
        tonic_health::pb::health_check_response::ServingStatus::NotServing as i32
    );
}

#[tokio::test]
async fn a_drain_releases_what_outlives_it_without_failing_it() {
    // A drain is the node's own: the one node asked, and its sessions.
    let server = TestServer::one_node().await;
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;
    let mut client = server.client().await;
    submit_with_retries(&mut client, "t", "forever", 1).await;
    raw.task().await;
    let report = drain(&server, 200).await;
    assert_eq!((report.completed, report.released), (0, 1));
    let mut saw_drain = false;
    let mut saw_cancel = false;
    while !(saw_drain && saw_cancel) {
        match raw.next().await {
            server_message::Message::Drain(d) => {
                assert!(d.deadline.is_some());
                saw_drain = true;
            }
            server_message::Message::Cancel(c) => {
                assert_eq!(c.attempt, 1);
                saw_cancel = true;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let row = get(&mut client, key("wf", "forever")).await;
    assert_eq!(status(&row), ActivityStatus::Scheduled);
    assert!(row.last_error.is_none(), "a release is not a failure");
    // Released attempts are not counted: with max_attempts = 1 it may still run.
    let server = server.restart().await;
    let _worker = server.completing("t");
    let mut client = server.client().await;
    let done = wait(&mut client, key("wf", "forever")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Completed, 2));
}

#[tokio::test]
async fn sdk_heartbeats_are_stored_and_keep_an_attempt_alive() {
    // Keep-alives every 250 ms: on three nodes and two loaded cores, a worker was
    // found silent for the 300 ms that three 100 ms intervals allow.
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(250)).await;
    // 1.5 s of work against a 600 ms heartbeat timeout: only the beats, every
    // 50 ms, keep the attempt alive (with room for a loaded machine's pauses).
    let _worker = server.worker(|w| {
        w.activity("progress", |ctx, _| async move {
            for i in 0..30 {
                ctx.heartbeat(spool_worker::json(&(i % 10)).ok());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(Payload::default())
        })
    });
    let mut client = server.client().await;
    submit_beating(&mut client, "progress", "p", 600, 1).await;
    let done = wait(&mut client, key("wf", "p")).await;
    assert_eq!(
        outcome(&done),
        (ActivityStatus::Completed, 1),
        "{:?}",
        done.last_error
    );
    let details = done
        .heartbeat_details
        .expect("details kept after completion");
    assert!(
        details.data.len() == 1 && details.data[0].is_ascii_digit(),
        "{details:?}"
    );
}

#[tokio::test]
async fn an_ended_attempt_and_its_retry_on_one_worker_take_two_slots() {
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(200)).await;
    let mut raw = RawWorker::connect(&server, &["t"], 2).await;
    // Heartbeats for attempt 2 only (they also keep the worker alive): attempt 1
    // must time out, attempt 2 must not.
    let keepalive = {
        let tx = raw.tx.clone();
        tokio::spawn(async move {
            loop {
                let beat = v1::WorkerMessage {
                    message: Some(worker_message::Message::Heartbeat(v1::Heartbeat {
                        workflow_id: "wf".into(),
                        activity_id: "a".into(),
                        attempt: 2,
                        details: None,
                    })),
                };
                if tx.send(beat).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut client = server.client().await;
    submit_beating(&mut client, "t", "a", 600, 5).await;
    let first = raw.task().await;
    // Attempt 1 times out; this worker keeps running it (it never answers), and its
    // retry, attempt 2, comes back to the same worker's second slot.
    let mut cancelled = false;
    let mut second = None;
    while !(cancelled && second.is_some()) {
        match raw.next().await {
            server_message::Message::Cancel(c) => {
                assert_eq!(c.attempt, 1);
                cancelled = true;
            }
            server_message::Message::Task(t) => second = Some(t),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(second.as_ref().map(|t| t.attempt), Some(2));
    // Both slots are taken: another activity must wait.
    submit(&mut client, request("t", "wf", "b")).await;
    let workers = server.workers().await.unwrap();
    assert_eq!(workers[0].in_flight, 2);
    raw.quiet_for(Duration::from_millis(300)).await;
    // Answering attempt 1 (refused) frees its slot, and only then does b arrive.
    raw.complete(&first, 1).await;
    let mut got_b = false;
    let mut refused = false;
    while !(got_b && refused) {
        match raw.next().await {
            server_message::Message::Ack(a) => {
                assert_eq!((a.attempt, a.accepted), (1, false));
                refused = true;
            }
            server_message::Message::Task(t) => {
                assert_eq!(t.activity_id, "b");
                got_b = true;
            }
            server_message::Message::Cancel(c) => panic!("unexpected cancel {c:?}"),
            other => panic!("unexpected {other:?}"),
        }
    }
    keepalive.abort();
}

/// Submits an activity (workflow "wf") that must heartbeat every
/// `heartbeat_timeout_ms`, with `max_attempts` fast retries.
async fn submit_beating(
    client: &mut Calls,
    activity_type: &str,
    activity_id: &str,
    heartbeat_timeout_ms: u64,
    max_attempts: u32,
) {
    let mut req = request(activity_type, "wf", activity_id);
    req.heartbeat_timeout = ms(heartbeat_timeout_ms);
    req.retry_policy = fast_retries(max_attempts);
    submit(client, req).await;
}
