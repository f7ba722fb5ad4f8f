//! The lifecycle docs/PROTOCOL.md describes, driven through the public API and the SDK.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use spool_proto::v1::{self, ActivityStatus, ErrorKind};
use spool_worker::{ActivityError, Payload};

use crate::harness::*;

/// Counts calls per activity id and remembers attempts seen.
#[derive(Default, Clone)]
struct Calls(Arc<Mutex<Vec<(String, u32)>>>);

impl Calls {
    fn record(&self, ctx: &spool_worker::ActivityContext) -> u32 {
        let info = ctx.info();
        self.0
            .lock()
            .unwrap()
            .push((info.activity_id.clone(), info.attempt));
        info.attempt
    }

    fn attempts(&self, id: &str) -> Vec<u32> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(a, _)| a == id)
            .map(|(_, n)| *n)
            .collect()
    }
}

#[tokio::test]
async fn submit_then_wait_round_trip() {
    let server = TestServer::start().await;
    let _worker = server.worker(|w| {
        w.activity("greet", |_ctx, input: Payload| async move {
            let v: serde_json::Value = serde_json::from_slice(&input.data).unwrap();
            spool_worker::json(
                &serde_json::json!({"greeting": format!("hello {}", v["id"].as_str().unwrap())}),
            )
        })
    });
    let mut client = server.client().await;
    let submitted = submit(&mut client, request("greet", "wf-1", "world")).await;
    assert!(submitted.created);
    let activity = submitted.activity.unwrap();
    assert_eq!(activity.key.as_ref().unwrap().namespace, "default");
    let done = wait(&mut client, key("wf-1", "world")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(done.attempt, 1);
    let output: serde_json::Value = serde_json::from_slice(&done.output.unwrap().data).unwrap();
    assert_eq!(output["greeting"], "hello world");
    assert!(done.started_at.is_some() && done.finished_at.is_some());
    assert!(!done.worker_id.is_empty());
}

#[tokio::test]
async fn empty_ids_are_generated() {
    let (_server, mut client) = TestServer::serving().await;
    let a = submit(&mut client, request("t", "", ""))
        .await
        .activity
        .unwrap();
    let b = submit(&mut client, request("t", "", ""))
        .await
        .activity
        .unwrap();
    let (ka, kb) = (a.key.unwrap(), b.key.unwrap());
    assert_eq!(ka.workflow_id.len(), 36, "a UUID: {}", ka.workflow_id);
    assert_ne!(ka.activity_id, kb.activity_id);
}

#[tokio::test]
async fn idempotent_submit_is_delivered_once() {
    let server = TestServer::start().await;
    let calls = Calls::default();
    let mut client = server.client().await;
    let first = submit(&mut client, request("once", "wf", "a")).await;
    let second = submit(&mut client, request("once", "wf", "a")).await;
    assert!(first.created);
    assert!(!second.created);
    let c = calls.clone();
    let _worker = server.worker(move |w| {
        w.max_concurrency(1).activity("once", move |ctx, _| {
            let c = c.clone();
            async move {
                c.record(&ctx);
                Ok(Payload::default())
            }
        })
    });
    wait(&mut client, key("wf", "a")).await;
    let third = submit(&mut client, request("once", "wf", "a")).await;
    assert!(!third.created);
    assert_eq!(
        status(third.activity.as_ref().unwrap()),
        ActivityStatus::Completed
    );
    // A marker submitted after: the single slot serves in order, so once it has
    // run, a wrongly re-dispatched copy would have run too.
    submit(&mut client, request("once", "wf", "marker")).await;
    wait(&mut client, key("wf", "marker")).await;
    assert_eq!(calls.attempts("a"), vec![1]);
}

#[tokio::test]
async fn same_key_with_another_type_is_already_exists() {
    let (_server, mut client) = TestServer::serving().await;
    submit(&mut client, request("one", "wf", "a")).await;
    let err = client.submit(request("two", "wf", "a")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::AlreadyExists);
    assert!(err.message().contains("\"one\""), "{}", err.message());
    assert_eq!(get(&mut client, key("wf", "a")).await.activity_type, "one");
}

#[tokio::test]
async fn two_retryable_failures_then_success_on_attempt_three() {
    let server = TestServer::start().await;
    let calls = Calls::default();
    let c = calls.clone();
    let _worker = server.worker(move |w| {
        w.activity("flaky", move |ctx, _| {
            let c = c.clone();
            async move {
                match c.record(&ctx) {
                    n if n < 3 => Err(ActivityError::retryable("Flaky", format!("failure {n}"))),
                    _ => spool_worker::json("ok"),
                }
            }
        })
    });
    let mut client = server.client().await;
    let done = run_to_the_end(&mut client, "flaky", "f", 5).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(done.attempt, 3);
    assert_eq!(calls.attempts("f"), vec![1, 2, 3]);
    let last = done.last_error.expect("the last failure is kept");
    assert_eq!(last.message, "failure 2");
}

#[tokio::test]
async fn dead_letter_at_max_attempts_with_last_error() {
    let server = TestServer::start().await;
    let _worker = server.worker(|w| {
        w.activity("doomed", |ctx, _| async move {
            Err(ActivityError::retryable(
                "Broken",
                format!("attempt {} broke", ctx.info().attempt),
            ))
        })
    });
    let mut client = server.client().await;
    let done = run_to_the_end(&mut client, "doomed", "d", 3).await;
    assert_eq!(status(&done), ActivityStatus::Failed);
    assert_eq!(done.attempt, 3);
    assert_eq!(done.max_attempts, 3);
    let error = done.last_error.unwrap();
    assert_eq!(error.kind, ErrorKind::Retryable as i32);
    assert_eq!(error.r#type, "Broken");
    assert_eq!(error.message, "attempt 3 broke");
    let stats = stats(&mut client).await;
    assert_eq!(stats.failed, 1);
}

#[tokio::test]
async fn non_retryable_type_and_terminal_error_fail_at_once() {
    let server = TestServer::start().await;
    let _worker = server.worker(|w| {
        w.activity("strict", |ctx, _| async move {
            if ctx.info().activity_id == "typed" {
                Err(ActivityError::retryable("InvalidCard", "card declined"))
            } else {
                Err(ActivityError::terminal("Nope", "will never work"))
            }
        })
    });
    let mut client = server.client().await;
    let mut typed = request("strict", "wf", "typed");
    typed.retry_policy = Some(v1::RetryPolicy {
        max_attempts: 5,
        non_retryable_error_types: vec!["InvalidCard".into()],
        ..fast_retries(5).unwrap()
    });
    submit(&mut client, typed).await;
    submit_with_retries(&mut client, "strict", "terminal", 5).await;
    for id in ["typed", "terminal"] {
        let done = wait(&mut client, key("wf", id)).await;
        assert_eq!(status(&done), ActivityStatus::Failed, "{id}");
        assert_eq!(done.attempt, 1, "{id} must not be retried");
    }
    let terminal = get(&mut client, key("wf", "terminal")).await;
    assert_eq!(
        terminal.last_error.unwrap().kind,
        ErrorKind::Terminal as i32
    );
}

#[tokio::test]
async fn a_delay_is_respected() {
    let server = TestServer::start().await;
    let _worker = server.completing("later");
    server.await_workers(1).await;
    let mut client = server.client().await;
    let mut req = request("later", "wf", "d");
    req.delay = Some(prost_types_duration(Duration::from_millis(400)));
    // The delay counts from the server's receipt of the submit, not from its
    // commit (`created_at`), which a busy node may make later: judge it from just
    // before the call, by this machine's clock (the nodes keep the database's,
    // which is the same clock here, to a few milliseconds).
    let sent = spool_proto::time::now_millis();
    submit(&mut client, req).await;
    let done = wait(&mut client, key("wf", "d")).await;
    let started_at = spool_proto::time::from_proto(&done.started_at.unwrap());
    assert!(
        started_at - sent >= 400 - 10,
        "started {} ms after the submit was sent",
        started_at - sent
    );
}

#[tokio::test]
async fn without_a_worker_for_its_type_an_activity_waits_with_attempt_zero() {
    let server = TestServer::start().await;
    let _other = server.completing("other");
    server.await_workers(1).await;
    let mut client = server.client().await;
    submit(&mut client, request("unserved", "wf", "u")).await;
    let waited = wait_within(&mut client, key("wf", "u"), Duration::from_millis(300)).await;
    assert_eq!(status(&waited), ActivityStatus::Scheduled);
    assert_eq!(waited.attempt, 0);
    // A worker for the type arrives: it runs, as attempt 1.
    let _late = server.completing("unserved");
    let done = wait(&mut client, key("wf", "u")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Completed, 1));
}

#[tokio::test]
async fn snooze_runs_again_without_spending_attempts() {
    let server = TestServer::start().await;
    let snoozes = Count::default();
    let _worker = server.worker(move |w| {
        w.activity("patient", move |_, _| {
            let snooze = snoozes.bump() < 2;
            async move {
                if snooze {
                    Err(ActivityError::snooze(Duration::from_millis(20)))
                } else {
                    Ok(Payload::default())
                }
            }
        })
    });
    let mut client = server.client().await;
    let done = run_to_the_end(&mut client, "patient", "p", 1).await;
    assert_eq!(
        status(&done),
        ActivityStatus::Completed,
        "two snoozes must not exhaust max_attempts=1"
    );
    assert_eq!(done.attempt, 3);
}

#[tokio::test]
async fn retry_re_drives_a_dead_letter_with_a_fresh_budget() {
    let server = TestServer::start().await;
    let healthy = Arc::new(AtomicU32::new(0));
    let h = healthy.clone();
    let _worker = server.worker(move |w| {
        w.activity("fixable", move |_, _| {
            let h = h.clone();
            async move {
                if h.load(Ordering::SeqCst) == 0 {
                    Err(ActivityError::retryable("Down", "dependency down"))
                } else {
                    spool_worker::json("fixed")
                }
            }
        })
    });
    let mut client = server.client().await;
    let dead = run_to_the_end(&mut client, "fixable", "r", 2).await;
    assert_eq!(outcome(&dead), (ActivityStatus::Failed, 2));

    let err = redrive(&mut client, key("wf", "missing"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);

    healthy.store(1, Ordering::SeqCst);
    let redriven = redrive(&mut client, key("wf", "r"))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        status(&redriven),
        ActivityStatus::Scheduled | ActivityStatus::Running | ActivityStatus::Completed
    ));
    let done = wait(&mut client, key("wf", "r")).await;
    assert_eq!(outcome(&done), (ActivityStatus::Completed, 3));
    let err = redrive(&mut client, key("wf", "r")).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
}

/// A graceful restart (the drain releases what runs; the kill -9 process test
/// covers start-up reclaim).
#[tokio::test]
async fn a_restart_keeps_every_activity_and_releases_running_ones() {
    // One node: a node stopping beside others hands its sessions over to resume
    // elsewhere instead of releasing their attempts (the resume tests).
    let server = TestServer::one_node().await;
    let mut client = server.client().await;
    let mut raw = RawWorker::connect(&server, &["slow"], 1).await;
    submit(&mut client, request("slow", "wf", "running")).await;
    let mut delayed = request("slow", "wf", "delayed");
    delayed.delay = Some(prost_types_duration(Duration::from_millis(300)));
    submit(&mut client, delayed).await;
    let task = raw.task().await;
    assert_eq!(task.activity_id, "running");
    // The raw worker stays connected: the shutdown, not the worker, ends its attempt.
    let server = server.restart().await;
    drop(raw);
    let mut client = server.client().await;
    let _worker = server.completing("slow");
    for id in ["running", "delayed"] {
        let done = wait(&mut client, key("wf", id)).await;
        assert_eq!(status(&done), ActivityStatus::Completed, "{id}");
    }
    let released = get(&mut client, key("wf", "running")).await;
    assert_eq!(released.attempt, 2);
    assert!(
        released.last_error.is_none(),
        "a shutdown release is not a failure: {:?}",
        released.last_error
    );
}

#[tokio::test]
async fn delayed_rows_from_before_a_restart_each_come_due() {
    let (server, mut client) = TestServer::serving().await;
    for (id, ms) in [("soon", 1_500), ("later", 2_500), ("latest", 3_500)] {
        let mut req = request("delayed", "wf", id);
        req.delay = Some(prost_types_duration(Duration::from_millis(ms)));
        submit(&mut client, req).await;
    }
    // After the restart, only the store knows these rows; the worker is idle when
    // each comes due, so nothing but the timer can dispatch them.
    let server = server.restart().await;
    let _worker = server.completing("delayed");
    server.await_workers(1).await;
    let ready = spool_proto::time::now_millis();
    let mut client = server.client().await;
    let mut started = Vec::new();
    for id in ["soon", "later", "latest"] {
        let done = wait(&mut client, key("wf", id)).await;
        assert_eq!(status(&done), ActivityStatus::Completed, "{id}");
        started.push(spool_proto::time::from_proto(&done.started_at.unwrap()));
    }
    // The last came due after the worker was waiting: the timer dispatched it.
    assert!(
        started[2] > ready,
        "latest started at {} before the worker was ready at {ready}",
        started[2]
    );
    assert!(started.windows(2).all(|w| w[0] <= w[1]), "{started:?}");
}

/// A worker shutting down finishes what it runs; a task that reaches it after
/// its Goodbye left (the server sent it before that landed) is handed back
/// unrun, and does not spend the activity's only attempt. The worker reaches the
/// server through a proxy holding what it sends, so the task crosses the
/// Goodbye every time: the path is forced, not raced.
#[tokio::test]
async fn a_worker_shutting_down_finishes_what_it_runs_and_hands_back_new_work() {
    let server = TestServer::one_node_with(|_| {}).await;
    let addr = server
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("a socket address");
    let proxy = spool_testkit::proxy::Proxy::start(vec![addr])
        .await
        .expect("proxy");
    let (started_tx, mut started) = tokio::sync::mpsc::channel(4);
    let stop = tokio_util::sync::CancellationToken::new();
    let leaving = spool_worker::Worker::new(format!("http://{}", proxy.addr))
        .identity("leaving")
        .max_concurrency(2)
        .activity("job", move |ctx, _| {
            let started_tx = started_tx.clone();
            async move {
                let _ = started_tx.send(ctx.info().activity_id.clone()).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
                spool_worker::json(&"finished by the leaving worker")
            }
        });
    let leaving = tokio::spawn(leaving.run(stop.clone()));
    let mut client = server.client().await;
    submit_with_retries(&mut client, "job", "x", 1).await;
    assert_eq!(started.recv().await.as_deref(), Some("x"));

    // The Goodbye is held on its way; y goes to the leaving worker's free slot.
    proxy.hold_upstream();
    stop.cancel();
    submit_with_retries(&mut client, "job", "y", 1).await;
    row_when(
        &client,
        key("wf", "y"),
        "y to be sent to the leaving worker",
        |y| status(y) == ActivityStatus::Running,
    )
    .await;
    proxy.release_upstream();
    let _stayer = server.worker(|w| {
        w.identity("stayer").activity("job", |_, _| async {
            spool_worker::json(&"finished by the stayer")
        })
    });

    let x = wait(&mut client, key("wf", "x")).await;
    assert_eq!(
        outcome(&x),
        (ActivityStatus::Completed, 1),
        "x ran to the end on the leaving worker"
    );
    wait(&mut client, key("wf", "y")).await;
    let y = get_with_history(&mut client, key("wf", "y")).await;
    let history: Vec<(u32, &str, &str)> = y
        .history
        .iter()
        .map(|a| (a.attempt, a.identity.as_str(), a.outcome.as_str()))
        .collect();
    assert_eq!(
        history,
        [(1, "leaving", "snoozed"), (2, "stayer", "completed")],
        "y was handed back unrun, then run by the stayer"
    );
    assert_eq!(
        (status(&y), y.counted_attempts),
        (ActivityStatus::Completed, 1),
        "handing back does not spend y's only attempt"
    );
    assert_eq!(
        y.output.expect("y's output").data,
        br#""finished by the stayer""#
    );
    tokio::time::timeout(WAIT, leaving)
        .await
        .expect("the leaving worker stops")
        .expect("its task")
        .expect("it stops cleanly");
}

/// A finished activity is deleted once the retention has passed since it
/// finished, and not before; one still waiting stays, however old. With a short
/// retention the pruner looks again within a tenth of it (a second at least), so
/// the deletion comes within seconds.
#[tokio::test]
async fn finished_activities_are_pruned_after_the_retention_and_waiting_ones_stay() {
    let retention = Duration::from_secs(1);
    let server = TestServer::start_with(|c| c.retention = retention).await;
    let _worker = server.worker(|w| {
        w.activity("quick", |_ctx, _input: Payload| async move {
            Ok(Payload::default())
        })
    });
    let mut client = server.client().await;
    submit(&mut client, request("quick", "wf", "done")).await;
    submit(&mut client, request("unserved", "wf", "waiting")).await;
    let done = wait(&mut client, key("wf", "done")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    let finished_at = spool_proto::time::from_proto(&done.finished_at.expect("finished_at"));
    eventually("the finished activity to be pruned", || {
        let mut client = client.clone();
        async move {
            let found = client
                .get(v1::GetRequest {
                    key: Some(key("wf", "done")),
                    ..Default::default()
                })
                .await;
            (found.err()?.code() == tonic::Code::NotFound).then_some(())
        }
    })
    .await;
    let gone_after = Duration::from_millis(
        u64::try_from(spool_proto::time::now_millis() - finished_at).unwrap_or(0),
    );
    // `finished_at` is the store's clock (on PostgreSQL each node's reading of the
    // database's), this is the test's: a little slack for the two to differ.
    assert!(
        gone_after >= retention.saturating_sub(Duration::from_millis(250)),
        "pruned {gone_after:?} after it finished, within the retention"
    );
    let waiting = get(&mut client, key("wf", "waiting")).await;
    assert_eq!(status(&waiting), ActivityStatus::Scheduled);
}
