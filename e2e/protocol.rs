//! The worker stream, spoken by hand where the SDK would never misbehave.

use std::{sync::Arc, time::Duration};

use spool_proto::v1::{self, ActivityStatus, ErrorKind, server_message, worker_message};
use spool_worker::Payload;

use crate::harness::*;

#[tokio::test]
async fn a_stale_attempt_result_is_refused() {
    let server = TestServer::start().await;
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;
    assert!(!raw.welcome.worker_id.is_empty());
    assert_eq!(raw.welcome.protocol_version, 1);
    let mut client = server.client().await;
    submit(&mut client, request("t", "wf", "a")).await;
    let task = raw.task().await;
    assert_eq!(task.attempt, 1);
    assert_eq!(task.activity_type, "t");

    raw.complete(&task, 7).await;
    let ack = raw.ack().await;
    assert_eq!(
        (ack.attempt, ack.accepted),
        (7, false),
        "a result for an attempt never given"
    );
    assert_eq!(
        status(&get(&mut client, key("wf", "a")).await),
        ActivityStatus::Running
    );

    raw.complete(&task, 1).await;
    let ack = raw.ack().await;
    assert_eq!((ack.attempt, ack.accepted), (1, true));
    raw.complete(&task, 1).await;
    assert!(
        !raw.ack().await.accepted,
        "the same result twice is refused the second time"
    );
    let done = get(&mut client, key("wf", "a")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
}

#[tokio::test]
async fn flow_control_never_exceeds_max_concurrency() {
    let server = TestServer::start().await;
    let mut raw = RawWorker::connect(&server, &["t"], 2).await;
    let mut client = server.client().await;
    for i in 0..5 {
        submit(&mut client, request("t", "wf", &format!("a{i}"))).await;
    }
    let first = raw.task().await;
    let second = raw.task().await;
    raw.quiet_for(Duration::from_millis(200)).await;
    raw.complete(&first, first.attempt).await;
    // The freed slot's next task may share the completion's commit, so it can
    // arrive before the ack.
    let (mut acks, mut tasks) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        match raw.next().await {
            server_message::Message::Ack(a) => acks.push(a),
            server_message::Message::Task(t) => tasks.push(t),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(acks.len() == 1 && acks[0].accepted, "{acks:?}");
    let third = tasks.pop().expect("one new task for the one freed slot");
    raw.quiet_for(Duration::from_millis(100)).await;
    for t in [&second, &third] {
        raw.complete(t, t.attempt).await;
    }

    // And through the SDK, with real concurrency: never more than 3 at once.
    let gauge = Arc::new(Gauge::default());
    let counted = gauge.clone();
    let _worker = server.worker(move |w| {
        w.max_concurrency(3).activity("busy", move |_, _| {
            let counted = counted.clone();
            async move {
                counted
                    .counted(tokio::time::sleep(Duration::from_millis(20)))
                    .await;
                Ok(Payload::default())
            }
        })
    });
    let batch = v1::SubmitBatchRequest {
        activities: (0..30)
            .map(|i| request("busy", "wf", &format!("b{i}")))
            .collect(),
    };
    client.submit_batch(batch).await.unwrap();
    for i in 0..30 {
        wait(&mut client, key("wf", &format!("b{i}"))).await;
    }
    assert_eq!(gauge.most(), 3);
}

#[tokio::test]
async fn cancel_a_scheduled_activity() {
    let (server, mut client) = TestServer::serving().await;
    submit(&mut client, request("t", "wf", "c")).await;
    let cancelled = cancel(&mut client, key("wf", "c"), "not needed")
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status(&cancelled), ActivityStatus::Cancelled);
    assert_eq!(cancelled.last_error.unwrap().message, "not needed");
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;
    raw.quiet_for(Duration::from_millis(200)).await;
    let err = cancel(&mut client, key("wf", "c"), "").await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let err = cancel(&mut client, key("wf", "nope"), "")
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn cancel_a_running_activity_tells_the_worker_and_refuses_its_result() {
    let server = TestServer::start().await;
    let mut raw = RawWorker::connect(&server, &["t", "u"], 1).await;
    let mut client = server.client().await;
    submit(&mut client, request("t", "wf", "r")).await;
    let task = raw.task().await;
    let waiter = {
        let mut client = client.clone();
        tokio::spawn(async move { wait(&mut client, key("wf", "r")).await })
    };
    cancel(&mut client, key("wf", "r"), "stop").await.unwrap();
    match raw.next().await {
        server_message::Message::Cancel(c) => {
            assert_eq!(
                (c.activity_id.as_str(), c.attempt, c.reason.as_str()),
                ("r", 1, "stop")
            );
        }
        other => panic!("expected CancelActivity, got {other:?}"),
    }
    let waited = waiter.await.unwrap();
    assert_eq!(status(&waited), ActivityStatus::Cancelled);
    // The slot stays taken until the worker answers.
    submit(&mut client, request("u", "wf", "next")).await;
    raw.quiet_for(Duration::from_millis(200)).await;
    raw.complete(&task, 1).await;
    let (ack, next) = raw.ack_and_task().await;
    assert!(!ack.accepted, "a result after cancel is not accepted");
    assert_eq!(next.activity_id, "next");
    assert_eq!(
        status(&get(&mut client, key("wf", "r")).await),
        ActivityStatus::Cancelled
    );
}

/// The cancel reaches the handler: with one slot, the next activity can start
/// only once the cancelled handler saw `ctx.cancelled()` fire and returned.
#[tokio::test]
async fn the_sdk_stops_a_cancelled_handler() {
    let server = TestServer::start().await;
    let (started, mut starts) = tokio::sync::mpsc::unbounded_channel();
    let (stopped, mut stops) = tokio::sync::mpsc::unbounded_channel();
    let _worker = server.worker(move |w| {
        w.max_concurrency(1).activity("long", move |ctx, _| {
            let (started, stopped) = (started.clone(), stopped.clone());
            async move {
                let id = ctx.info().activity_id.clone();
                let _ = started.send(id.clone());
                ctx.cancelled().await;
                let _ = stopped.send(id);
                Err(spool_worker::ActivityError::retryable(
                    "Cancelled",
                    "stopped as asked",
                ))
            }
        })
    });
    let mut client = server.client().await;
    submit(&mut client, request("long", "wf", "l")).await;
    assert_eq!(starts.recv().await.as_deref(), Some("l"));
    submit(&mut client, request("long", "wf", "m")).await;
    cancel(&mut client, key("wf", "l"), "").await.unwrap();
    let stopped = tokio::time::timeout(WAIT, stops.recv()).await.unwrap();
    assert_eq!(
        stopped.as_deref(),
        Some("l"),
        "the cancel fired in the handler"
    );
    // Only then does the one slot take the next activity.
    let next = tokio::time::timeout(WAIT, starts.recv()).await.unwrap();
    assert_eq!(next.as_deref(), Some("m"));
}

#[tokio::test]
async fn a_lost_worker_s_attempts_go_to_another_worker() {
    let server = TestServer::start().await;
    let raw = RawWorker::connect(&server, &["t"], 1).await;
    let mut client = server.client().await;
    submit(&mut client, request("t", "wf", "l")).await;
    let mut raw = raw;
    let task = raw.task().await;
    assert_eq!(task.attempt, 1);
    drop(raw);
    let mut other = RawWorker::connect(&server, &["t"], 1).await;
    let again = other.task().await;
    assert_eq!((again.activity_id.as_str(), again.attempt), ("l", 2));
    let row = get(&mut client, key("wf", "l")).await;
    assert_eq!(row.last_error.unwrap().kind, ErrorKind::WorkerLost as i32);
}

#[tokio::test]
async fn the_handshake_checks_hello() {
    let server = TestServer::start().await;
    let not_hello = worker_message::Message::Heartbeat(v1::Heartbeat::default());
    let err = RawWorker::open(&server, not_hello).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    let no_types = worker_message::Message::Hello(hello(&[], 1));
    let err = RawWorker::open(&server, no_types).await.err().unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("activity_types"),
        "{}",
        err.message()
    );

    let mut future = hello(&["t"], 1);
    future.protocol_version = 99;
    let err = RawWorker::open(&server, worker_message::Message::Hello(future))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("[1]"), "{}", err.message());

    let mut bad_ns = hello(&["t"], 1);
    bad_ns.namespace = "no spaces".into();
    let err = RawWorker::open(&server, worker_message::Message::Hello(bad_ns))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);

    // Zero concurrency means one; zero version means 1.
    let mut lax = hello(&["t"], 0);
    lax.protocol_version = 0;
    let _lax = RawWorker::open(&server, worker_message::Message::Hello(lax))
        .await
        .unwrap();
    let workers = server.workers().await.unwrap();
    assert_eq!(workers.len(), 1);
    assert_eq!(workers[0].max_concurrency, 1);
    assert_eq!(workers[0].activity_types, vec!["t".to_string()]);
}

#[tokio::test]
async fn higher_priority_first_then_oldest_first() {
    let (server, mut client) = TestServer::serving().await;
    for (id, priority) in [("low-1", 0), ("low-2", 0), ("high", 5), ("low-3", 0)] {
        let mut req = request("t", "wf", id);
        req.priority = priority;
        submit(&mut client, req).await;
        // Age is each submitting node's reading of the database's clock; nodes
        // agree on it within a few milliseconds (more on a loaded machine), so
        // submits on different nodes are ordered only when further apart: a
        // quarter second is generous.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;
    // One slot: each task comes only after the previous one is answered (its ack
    // and the next task may arrive in either order).
    let mut order = Vec::new();
    while order.len() < 4 {
        match raw.next().await {
            server_message::Message::Task(task) => {
                order.push(task.activity_id.clone());
                raw.complete(&task, task.attempt).await;
            }
            server_message::Message::Ack(ack) => assert!(ack.accepted),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(order, ["high", "low-1", "low-2", "low-3"]);
}

/// With aging, a stream of higher-priority rows the worker cannot keep up with
/// overtakes a low one only while they came due less than (difference × aging)
/// after it; with strict priority the low one would wait for the stream to end.
#[tokio::test]
async fn an_aged_low_priority_runs_under_a_stream_of_higher_ones() {
    const AGING: Duration = Duration::from_millis(20);
    const LEVELS: i32 = 10;
    // The bound (10 × 20 ms), and room for the low row's commit to be seen by a
    // claim that began after it was stamped.
    let bound = AGING * LEVELS as u32;
    let slack = Duration::from_millis(50);
    let server = TestServer::start_with(|c| c.priority_aging = Some(AGING)).await;
    let client = server.client().await;
    // The worker first: on a loaded machine its connection can take seconds, and
    // a stream started before it would pile up a backlog of that size.
    let mut raw = RawWorker::connect(&server, &["t"], 1).await;

    // About 200 rows a second, against a worker that takes 10 ms over each.
    let stream = tokio::spawn({
        let client = client.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(5));
            for n in 0.. {
                tick.tick().await;
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut req = request("t", "wf", &format!("h{n}"));
                    req.priority = LEVELS;
                    submit(&mut client, req).await;
                });
            }
        }
    });
    let mut order = Vec::new();
    let run_one = |order: &mut Vec<String>, message| match message {
        server_message::Message::Task(task) => {
            order.push(task.activity_id.clone());
            Some(task)
        }
        server_message::Message::Ack(ack) => {
            assert!(ack.accepted);
            None
        }
        other => panic!("unexpected {other:?}"),
    };
    // A backlog builds up first.
    let start = tokio::time::Instant::now();
    while start.elapsed() < Duration::from_millis(300) {
        if let Some(task) = run_one(&mut order, raw.next().await) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            raw.complete(&task, task.attempt).await;
        }
    }
    submit(&mut client.clone(), request("t", "wf", "low")).await;
    let low_submitted = tokio::time::Instant::now();
    while !order.iter().any(|id| id == "low") {
        assert!(
            low_submitted.elapsed() < Duration::from_secs(10),
            "the low row waited 10 s behind {} higher ones",
            order.len()
        );
        if let Some(task) = run_one(&mut order, raw.next().await) {
            tokio::time::sleep(Duration::from_millis(10)).await;
            raw.complete(&task, task.attempt).await;
        }
    }
    stream.abort();

    let mut client = client.clone();
    let due = |activity: &v1::Activity| {
        let at = activity.next_at.expect("next_at");
        Duration::new(at.seconds as u64, at.nanos as u32)
    };
    let low = due(&get(&mut client, key("wf", "low")).await);
    let mut overtook = 0;
    for id in &order[..order.len() - 1] {
        let high = due(&get(&mut client, key("wf", id)).await);
        assert!(
            high < low + bound + slack,
            "{id} came due {:?} after the low row and still ran before it",
            high - low
        );
        overtook += u32::from(high > low);
    }
    assert!(
        overtook > 0,
        "rows of higher priority due just after it overtake it: none did"
    );
}

#[tokio::test]
async fn namespaces_do_not_mix() {
    // `connected_workers` is the node's own.
    let server = TestServer::one_node().await;
    let mut client = server.client().await;
    let mut in_orders = request("t", "wf", "a");
    in_orders.namespace = "orders".into();
    submit(&mut client, in_orders).await;
    // A worker of the default namespace never sees it.
    let mut default_worker = RawWorker::connect(&server, &["t"], 1).await;
    default_worker.quiet_for(Duration::from_millis(200)).await;
    let err = get_refused(&mut client, key("wf", "a")).await;
    assert_eq!(
        err.code(),
        tonic::Code::NotFound,
        "the same ids in another namespace are another activity"
    );
    let mut orders_hello = hello(&["t"], 1);
    orders_hello.namespace = "orders".into();
    let mut orders_worker = RawWorker::open(&server, worker_message::Message::Hello(orders_hello))
        .await
        .unwrap();
    let task = orders_worker.task().await;
    assert_eq!(
        (task.namespace.as_str(), task.activity_id.as_str()),
        ("orders", "a")
    );
    let stats = |namespace: &str| {
        let mut client = client.clone();
        let namespace = namespace.to_owned();
        async move {
            client
                .stats(v1::StatsRequest { namespace })
                .await
                .unwrap()
                .into_inner()
        }
    };
    let (orders, default) = (stats("orders").await, stats("").await);
    assert_eq!((orders.running, orders.connected_workers), (1, 1));
    assert_eq!(
        (
            default.running,
            default.scheduled,
            default.connected_workers
        ),
        (0, 0, 1)
    );
}

/// A worker whose Hello asks for batches gets the tasks ready together in one
/// message, may answer with several results in one, and gets each result acked
/// once; a worker that does not ask (any worker before batches) is sent one task
/// and one ack per message, as before.
#[tokio::test]
async fn batches_carry_what_is_ready_together_and_only_to_a_worker_that_asks() {
    let (server, mut client) = TestServer::serving().await;
    let submit_all = |activity_type: &str, n: usize| v1::SubmitBatchRequest {
        activities: (0..n)
            .map(|i| request(activity_type, "wf", &format!("{activity_type}{i}")))
            .collect(),
    };
    client.submit_batch(submit_all("b", 40)).await.unwrap();
    let mut batched = RawWorker::open(
        &server,
        worker_message::Message::Hello(v1::Hello {
            batches: true,
            ..hello(&["b"], 40)
        }),
    )
    .await
    .expect("session");
    assert!(batched.welcome.batches, "the server takes batches");
    let (mut tasks, mut messages) = (Vec::new(), 0);
    while tasks.len() < 40 {
        messages += 1;
        match batched.next().await {
            server_message::Message::Task(t) => tasks.push(t),
            server_message::Message::Tasks(batch) => tasks.extend(batch.tasks),
            other => panic!("expected tasks, got {other:?}"),
        }
    }
    assert!(
        messages < 40,
        "40 tasks claimed together came in {messages} messages"
    );
    let mut ids: Vec<&str> = tasks.iter().map(|t| t.activity_id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 40, "each task once");
    let results = tasks
        .iter()
        .map(|t| v1::ActivityResult {
            workflow_id: t.workflow_id.clone(),
            activity_id: t.activity_id.clone(),
            attempt: t.attempt,
            outcome: Some(v1::activity_result::Outcome::Output(json(
                serde_json::json!("batched"),
            ))),
        })
        .collect();
    batched
        .send(worker_message::Message::Results(v1::ResultBatch {
            results,
        }))
        .await;
    let mut acked = Vec::new();
    while acked.len() < 40 {
        match batched.next().await {
            server_message::Message::Ack(a) => acked.push(a),
            server_message::Message::Acks(batch) => acked.extend(batch.acks),
            other => panic!("expected acks, got {other:?}"),
        }
    }
    assert!(acked.iter().all(|a| a.accepted), "{acked:?}");
    batched.quiet_for(Duration::from_millis(200)).await;
    for i in 0..40 {
        let done = get(&mut client, key("wf", &format!("b{i}"))).await;
        assert_eq!(status(&done), ActivityStatus::Completed, "b{i}");
        assert_eq!(done.counted_attempts, 1, "b{i}");
    }

    // A worker that does not ask: one task, one ack a message.
    client.submit_batch(submit_all("s", 20)).await.unwrap();
    let mut single = RawWorker::connect(&server, &["s"], 20).await;
    let mut tasks = Vec::new();
    for _ in 0..20 {
        tasks.push(single.task().await);
    }
    for task in &tasks {
        single.complete(task, task.attempt).await;
    }
    for _ in 0..20 {
        assert!(single.ack().await.accepted);
    }
    single.quiet_for(Duration::from_millis(200)).await;
}
