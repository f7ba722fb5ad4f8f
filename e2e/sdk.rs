//! The worker SDK against the real server: typed activities, errors from `?` and
//! panics, the context (cancel reasons, the previous attempt's heartbeat details,
//! the attempt budget).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use spool_proto::v1::{self, ActivityStatus};
use spool_worker::{Activity, ActivityError, CancelReason};

use crate::harness::*;

spool_worker::activity_type!(
    /// The contract both sides of the typed tests share.
    Add = "add", Operands => i64
);

#[derive(serde::Serialize, serde::Deserialize)]
struct Operands {
    a: i64,
    b: i64,
}

fn typed_request(workflow_id: &str, activity_id: &str, input: v1::Payload) -> v1::SubmitRequest {
    v1::SubmitRequest {
        input: Some(input),
        retry_policy: fast_retries(3),
        ..request(Add::NAME, workflow_id, activity_id)
    }
}

/// A worker that adds, typed.
fn adding(server: &TestServer) -> WorkerGuard {
    server.worker(|w| {
        w.register::<Add, _, _>(
            |_ctx, Operands { a, b }| async move { Ok::<_, ActivityError>(a + b) },
        )
    })
}

/// A typed handler gets its input decoded and its output encoded; input that is
/// not the type fails the activity for good, naming the type and serde's message.
#[tokio::test]
async fn a_typed_activity_round_trips_and_bad_input_is_terminal() {
    let server = TestServer::start().await;
    let _worker = adding(&server);
    let mut client = server.client().await;
    let input = spool_proto::activity::encode(&Operands { a: 2, b: 40 }).expect("encode");
    submit(&mut client, typed_request("wf", "sum", input)).await;
    let done = wait(&mut client, key("wf", "sum")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    let output: i64 =
        spool_proto::activity::decode(&done.output.unwrap_or_default()).expect("an i64");
    assert_eq!(output, 42);

    submit(
        &mut client,
        typed_request("wf", "bad", json(serde_json::json!({"a": "two"}))),
    )
    .await;
    let failed = wait(&mut client, key("wf", "bad")).await;
    assert_eq!(outcome(&failed), (ActivityStatus::Failed, 1));
    let error = failed.last_error.unwrap_or_default();
    assert_eq!(error.r#type, "BadInput");
    assert!(
        error.message.contains("Operands") && error.message.contains("invalid type"),
        "{}",
        error.message
    );
}

/// `?` on an ordinary error is a retryable failure named after its type, and a
/// panicking handler is a retry too, while the worker stays up and runs the next
/// attempt.
#[tokio::test]
async fn errors_from_question_mark_and_panics_are_retried_by_a_worker_that_lives_on() {
    let server = TestServer::start().await;
    let runs = Count::default();
    let seen = runs.clone();
    let _worker = server.worker(move |w| {
        w.activity("flaky", move |ctx, _| {
            seen.bump();
            async move {
                match ctx.info().attempt {
                    1 => {
                        let n: u32 = "not a number".parse()?;
                        Ok(spool_worker::json(&n)?)
                    }
                    2 => panic!("the handler blew up"),
                    _ => spool_worker::json("third time lucky"),
                }
            }
        })
    });
    let mut client = server.client().await;
    let done = run_to_the_end(&mut client, "flaky", "f", 3).await;
    assert_eq!(outcome(&done), (ActivityStatus::Completed, 3), "{done:?}");
    assert_eq!(runs.get(), 3, "one worker ran all three");
    // The second attempt's error is the last one stored before the success.
    let error = done.last_error.unwrap_or_default();
    assert_eq!(error.r#type, "Panic", "{error:?}");
}

/// A client's cancel reaches the handler promptly (pushed, not found by a
/// sweep), with its reason; a timeout says it is one.
#[tokio::test]
async fn a_cancel_reaches_the_handler_promptly_with_its_reason() {
    // A short interval, for a prompt sweep of the timeout below; not so short that
    // a loaded machine's late keep-alive costs the worker its session.
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(250)).await;
    /// Per cancelled attempt: its activity id, the reason, how long it had run.
    type Seen = Vec<(String, CancelReason, Duration)>;
    let reasons: Arc<Mutex<Seen>> = Arc::default();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::channel::<String>(4);
    let seen = reasons.clone();
    let _worker = server.worker(move |w| {
        w.activity("long", move |ctx, _| {
            let seen = seen.clone();
            let started = started_tx.clone();
            async move {
                let _ = started.send(ctx.info().activity_id.clone()).await;
                let waiting = Instant::now();
                ctx.cancelled().await;
                let reason = ctx.cancel_reason().expect("a reason once cancelled");
                seen.lock().expect("lock").push((
                    ctx.info().activity_id.clone(),
                    reason,
                    waiting.elapsed(),
                ));
                Err(ActivityError::retryable("Stopped", "asked to"))
            }
        })
    });
    let mut client = server.client().await;
    submit(&mut client, request("long", "wf", "c")).await;
    assert_eq!(started_rx.recv().await.as_deref(), Some("c"));
    let cancelled_at = Instant::now();
    cancel(&mut client, key("wf", "c"), "not needed any more")
        .await
        .expect("cancel");
    let (id, reason, _) = eventually("the handler to see the cancel", || {
        let reasons = reasons.clone();
        async move { reasons.lock().expect("lock").first().cloned() }
    })
    .await;
    let within = cancelled_at.elapsed();
    assert_eq!(id, "c");
    assert_eq!(
        reason,
        CancelReason::Requested("not needed any more".into())
    );
    // A cancel is pushed to the worker's session (across nodes, as a notification
    // to its node first); nothing else would ever tell the handler, so the bound
    // only needs to tell "pushed" from "never", and is generous for a machine
    // shared with every other test (typically it takes a few milliseconds; the
    // benchmarks, not this test, watch the latency).
    let prompt = if nodes_wanted() > 1 { 3_000 } else { 1_000 };
    assert!(within < Duration::from_millis(prompt), "took {within:?}");

    let mut timed = request("long", "wf", "t");
    timed.start_to_close_timeout = Some(prost_types_duration(Duration::from_millis(300)));
    timed.retry_policy = fast_retries(1);
    submit(&mut client, timed).await;
    let (_, reason, _) = eventually("the timeout to reach the handler", || {
        let reasons = reasons.clone();
        async move {
            reasons
                .lock()
                .expect("lock")
                .iter()
                .find(|r| r.0 == "t")
                .cloned()
        }
    })
    .await;
    assert!(
        matches!(&reason, CancelReason::TimedOut(why) if why.contains("start_to_close")),
        "{reason:?}"
    );
}

/// What an attempt last reported with a heartbeat reaches the next attempt, with
/// the attempt budget, so long work resumes where it stopped.
#[tokio::test]
async fn the_previous_attempts_heartbeat_details_reach_the_next_attempt() {
    // Not a tighter interval: a worker silent for three of them is lost, and a
    // loaded machine (three nodes on two cores) pauses that long.
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(250)).await;
    /// Per attempt: its number, where it resumed from, whether it was the last.
    type Seen = Vec<(u32, Option<u32>, bool)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let log = seen.clone();
    let _worker = server.worker(move |w| {
        w.activity("resumable", move |ctx, _| {
            let log = log.clone();
            async move {
                let resumed_from: Option<u32> = ctx.last_heartbeat().expect("a u32");
                log.lock().expect("lock").push((
                    ctx.info().attempt,
                    resumed_from,
                    ctx.info().is_last_attempt(),
                ));
                if ctx.info().attempt == 1 {
                    ctx.heartbeat_with(&7u32).expect("encode");
                    // The beat goes out before the result; the details are stored
                    // with the result, whether or not a sweep came first.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    return Err(ActivityError::retryable("Interrupted", "try again"));
                }
                spool_worker::json(&resumed_from)
            }
        })
    });
    let mut client = server.client().await;
    let done = run_to_the_end(&mut client, "resumable", "r", 2).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(
        seen.lock().expect("lock").clone(),
        vec![(1, None, false), (2, Some(7), true)]
    );
}

/// The typed client: `execute` submits and returns the typed output; a failure is
/// `NotCompleted` with the activity as it ended; a handle cancels and re-drives.
#[tokio::test]
async fn a_typed_client_executes_waits_and_manages() {
    let server = TestServer::start().await;
    let _worker = server.worker(|w| {
        w.register::<Add, _, _>(|_ctx, Operands { a, b }| async move {
            if a < 0 {
                return Err(ActivityError::terminal("Negative", "no negatives"));
            }
            Ok(a + b)
        })
    });
    let client = spool_client::Client::builder(server.endpoint.clone())
        .connect()
        .await
        .expect("connect");
    let sum = client
        .activity::<Add>(&Operands { a: 1, b: 2 })
        .expect("encode")
        .workflow_id("typed")
        .activity_id("one")
        .max_attempts(2)
        .execute()
        .await
        .expect("completed");
    assert_eq!(sum, 3);
    let failed = client
        .activity::<Add>(&Operands { a: -1, b: 2 })
        .expect("encode")
        .execute()
        .await;
    match failed {
        Err(spool_client::Error::NotCompleted { activity }) => {
            assert_eq!(activity.status(), ActivityStatus::Failed);
            assert_eq!(activity.last_error.unwrap_or_default().r#type, "Negative");
        }
        other => panic!("expected NotCompleted, got {other:?}"),
    }
    // Nobody serves the delayed one yet: cancel it through its handle, re-drive it.
    let handle = client
        .activity::<Add>(&Operands { a: 5, b: 5 })
        .expect("encode")
        .delay(Duration::from_secs(3600))
        .send()
        .await
        .expect("submitted");
    assert!(handle.created());
    let cancelled = handle.cancel("changed my mind").await.expect("cancel");
    assert_eq!(cancelled.status(), ActivityStatus::Cancelled);
    let retried = handle.retry().await.expect("retry");
    assert_eq!(retried.status(), ActivityStatus::Scheduled);
    assert_eq!(handle.wait().await.expect("completed"), 10);
}

/// The server says what it is and accepts; a worker never sends a payload over
/// the limit it was told (the attempt fails with a clear error, the session lives
/// on and runs the next task).
#[tokio::test]
async fn limits_are_told_and_an_oversized_output_fails_only_its_attempt() {
    let server = TestServer::start_with(|c| c.max_payload_bytes = 64 * 1024).await;
    let client = spool_client::Client::builder(server.endpoint.clone())
        .connect()
        .await
        .expect("connect");
    let info = client.server_info().await.expect("server info");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.protocol_versions, vec![1]);
    assert_eq!(info.max_payload_bytes, 64 * 1024);
    assert!(info.max_batch_size > 0 && info.max_worker_concurrency > 0);

    let _worker = server.worker(|w| {
        w.activity("big", |ctx, _| async move {
            // Over the limit, and well over the transport's message limit.
            let size = if ctx.info().activity_id == "huge" {
                20 << 20
            } else {
                10
            };
            ctx.heartbeat(Some(v1::Payload {
                content_type: String::new(),
                data: vec![b'h'; size],
            }));
            Ok(v1::Payload {
                content_type: String::new(),
                data: vec![b'x'; size],
            })
        })
    });
    let mut raw = server.client().await;
    submit_with_retries(&mut raw, "big", "huge", 3).await;
    let failed = wait(&mut raw, key("wf", "huge")).await;
    assert_eq!(outcome(&failed), (ActivityStatus::Failed, 1));
    let error = failed.last_error.unwrap_or_default();
    assert_eq!(error.r#type, "PayloadTooLarge");
    assert!(error.message.contains("was not sent"), "{}", error.message);
    submit(&mut raw, request("big", "wf", "small")).await;
    let done = wait(&mut raw, key("wf", "small")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(
        server.workers().await.expect("workers").len(),
        1,
        "the same session ran both"
    );
}

/// A type's own concurrency limit holds within the worker's: of four `slow` ones
/// a worker of four slots takes at once, never two run at the same time.
#[tokio::test]
async fn a_type_concurrency_limit_holds() {
    let server = TestServer::start().await;
    let gauge = Arc::new(Gauge::default());
    let counted = gauge.clone();
    let _worker = server.worker(move |w| {
        w.max_concurrency(4)
            .type_concurrency("slow", 1)
            .activity("slow", move |_, _| {
                let counted = counted.clone();
                async move {
                    counted
                        .counted(tokio::time::sleep(Duration::from_millis(100)))
                        .await;
                    Ok(v1::Payload::default())
                }
            })
    });
    let mut client = server.client().await;
    for i in 0..4 {
        submit(&mut client, request("slow", "wf", &format!("s{i}"))).await;
    }
    for i in 0..4 {
        let done = wait(&mut client, key("wf", &format!("s{i}"))).await;
        assert_eq!(status(&done), ActivityStatus::Completed);
    }
    assert_eq!(gauge.most(), 1, "never two at once");
}

/// The client retries UNAVAILABLE (a node restarting) for the calls that may be
/// sent again, and gives up at once when told to try only once.
#[tokio::test]
async fn the_client_retries_a_restarting_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    let database = format!("sqlite://{}", dir.path().join("spool.db").display());
    let serve = move |listener: tokio::net::TcpListener| {
        let mut config = spool_server::Config::new(database.clone());
        config.drain_timeout = Duration::from_millis(100);
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(spool_server::run(
            config,
            listener,
            stop.clone().cancelled_owned(),
        ));
        (stop, task)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, task) = serve(listener);
    let connect = |retry: spool_client::Retry| {
        spool_client::Client::builder(address.to_string())
            .retry(retry)
            .connect()
    };
    let patient = connect(spool_client::Retry {
        attempts: 50,
        initial_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
    })
    .await
    .expect("connect");
    let hasty = connect(spool_client::Retry {
        attempts: 1,
        ..Default::default()
    })
    .await
    .expect("connect");
    let submitted = patient.submit(request("t", "", "")).await.expect("submit");
    let key = submitted.activity.and_then(|a| a.key).expect("key");
    assert!(!key.workflow_id.is_empty() && !key.activity_id.is_empty());

    stop.cancel();
    let _ = task.await;
    match hasty.get(key.clone()).await {
        Err(spool_client::Error::Status(s)) => assert_eq!(s.code(), tonic::Code::Unavailable),
        other => panic!("expected UNAVAILABLE, got {other:?}"),
    }
    let restart = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .expect("rebind");
        serve(listener)
    });
    let got = patient.get(key).await.expect("answered after the restart");
    assert_eq!(got.status(), ActivityStatus::Scheduled);
    let (stop, _task) = restart.await.expect("restart");
    stop.cancel();
}

/// Headers travel from the submit to every attempt and back in `Get`; the typed
/// client starts a W3C trace when the caller gives none, and keeps one it is given;
/// a malformed header is refused at the edge.
#[tokio::test]
async fn headers_and_traceparent_reach_the_handler() {
    let server = TestServer::start().await;
    /// Per attempt: its tenant header, its traceparent, and the trace id in it.
    type Seen = Vec<(String, Option<String>, Option<String>)>;
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let log = seen.clone();
    let _worker = server.worker(move |w| {
        w.register::<Add, _, _>(move |ctx, Operands { a, b }| {
            let log = log.clone();
            async move {
                let info = ctx.info();
                log.lock().expect("lock").push((
                    info.headers.get("tenant").cloned().unwrap_or_default(),
                    info.traceparent().map(str::to_owned),
                    info.trace_id().map(str::to_owned),
                ));
                Ok::<_, ActivityError>(a + b)
            }
        })
    });
    let client = spool_client::Client::builder(server.endpoint.clone())
        .connect()
        .await
        .expect("connect");
    let given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let handle = client
        .activity::<Add>(&Operands { a: 1, b: 1 })
        .expect("encode")
        .header("tenant", "acme")
        .traceparent(given)
        .send()
        .await
        .expect("submit");
    assert_eq!(handle.wait().await.expect("done"), 2);
    let stored = handle.get().await.expect("get");
    assert_eq!(
        stored.headers.get("tenant").map(String::as_str),
        Some("acme")
    );
    client
        .activity::<Add>(&Operands { a: 2, b: 2 })
        .expect("encode")
        .execute()
        .await
        .expect("done");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(
        seen[0],
        (
            "acme".to_owned(),
            Some(given.to_owned()),
            Some("0af7651916cd43dd8448eb211c80319c".to_owned())
        )
    );
    let (_, started, trace_id) = &seen[1];
    assert!(
        started
            .as_deref()
            .is_some_and(|t| t.starts_with("00-") && t.len() == 55),
        "a new trace: {started:?}"
    );
    assert!(trace_id.is_some());

    let refused = client
        .activity::<Add>(&Operands { a: 0, b: 0 })
        .expect("encode")
        .header("Bad Key", "x")
        .send()
        .await;
    match refused {
        Err(spool_client::Error::Status(s)) => {
            assert_eq!(s.code(), tonic::Code::InvalidArgument);
            assert!(s.message().contains("header key"), "{}", s.message());
        }
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
}

/// A typed batch is one commit with a handle per input; the list stream pages
/// through everything, newest first when asked.
#[tokio::test]
async fn a_typed_batch_and_the_list_stream() {
    use tokio_stream::StreamExt;
    let server = TestServer::start().await;
    let _worker = adding(&server);
    let client = spool_client::Client::builder(server.endpoint.clone())
        .connect()
        .await
        .expect("connect");
    let inputs: Vec<Operands> = (0..25).map(|i| Operands { a: i, b: i }).collect();
    let handles = client.submit_all::<Add>(&inputs).await.expect("batch");
    assert_eq!(handles.len(), 25);
    for (i, handle) in handles.iter().enumerate() {
        assert!(handle.created());
        assert_eq!(handle.wait().await.expect("done"), 2 * i as i64);
    }
    let listed: Vec<v1::Activity> = client
        .list_stream(v1::ListRequest {
            page_size: 7,
            newest_first: true,
            ..Default::default()
        })
        .collect::<Result<_, _>>()
        .await
        .expect("listed");
    assert_eq!(listed.len(), 25, "four pages of seven, the last short");
    let last = handles.last().map(|h| h.key().clone());
    assert_eq!(listed[0].key, last, "newest first");
}
