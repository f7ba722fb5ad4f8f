//! Several servers sharing one PostgreSQL database: a node dispatches only to its
//! own workers, and nodes tell each other about committed changes.

use std::time::{Duration, Instant};

use spool_proto::v1::{self, ActivityStatus, server_message};

use crate::harness::*;

#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn nodes_sharing_a_database_hand_work_to_each_other() {
    let (a, b) = TestServer::two_on_postgres().await;
    let _worker_on_b =
        b.worker(|w| w.activity("t", |_, _| async { spool_worker::json(&"ran on b") }));
    b.await_workers(1).await;
    let mut client_a = a.client().await;

    // Submitted on A, run by B's worker; A's Wait hears of the outcome.
    let started = Instant::now();
    submit(&mut client_a, request("t", "wf", "x")).await;
    let done = wait(&mut client_a, key("wf", "x")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(done.output.unwrap().data, br#""ran on b""#);
    assert!(
        started.elapsed() < Duration::from_millis(1_500),
        "woken by the other node's notification, not by a re-read: {:?}",
        started.elapsed()
    );

    // A delayed submit on A comes due on B.
    let mut later = request("t", "wf", "later");
    later.delay = Some(prost_types_duration(Duration::from_millis(300)));
    submit(&mut client_a, later).await;
    let done = wait(&mut client_a, key("wf", "later")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);

    // A cancel on A reaches the worker on B running the attempt.
    let mut raw_on_b = RawWorker::connect(&b, &["held"], 1).await;
    submit(&mut client_a, request("held", "wf", "c")).await;
    let task = raw_on_b.task().await;
    cancel(&mut client_a, key("wf", "c"), "from node a")
        .await
        .unwrap();
    match raw_on_b.next().await {
        server_message::Message::Cancel(c) => {
            assert_eq!(
                (c.activity_id.as_str(), c.attempt, c.reason.as_str()),
                ("c", task.attempt, "from node a")
            );
        }
        other => panic!("expected CancelActivity, got {other:?}"),
    }
}

#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn delayed_activities_submitted_together_each_come_due_on_the_other_node() {
    let (a, b) = TestServer::two_on_postgres().await;
    let _worker_on_b = b.worker(|w| w.activity("t", |_, _| async { Ok(Default::default()) }));
    b.await_workers(1).await;
    let mut client_a = a.client().await;
    let delayed = |id: &str, ms: u64| {
        let mut r = request("t", "wf", id);
        r.delay = Some(prost_types_duration(Duration::from_millis(ms)));
        r
    };
    // One commit on A carries both: B must learn of each due time, not only the first.
    client_a
        .submit_batch(v1::SubmitBatchRequest {
            activities: vec![delayed("soon", 200), delayed("later", 900)],
        })
        .await
        .unwrap();
    let started = Instant::now();
    for id in ["soon", "later"] {
        let done = wait(&mut client_a, key("wf", id)).await;
        assert_eq!(status(&done), ActivityStatus::Completed, "{id}");
    }
    assert!(
        started.elapsed() < Duration::from_millis(2_500),
        "each due time reached B, not just the earliest: {:?}",
        started.elapsed()
    );
}

/// Renewal keeps a live attempt: with a 4 s lease and another node sweeping for
/// expired leases, a 12 s activity runs once, as attempt 1.
#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_live_attempt_outlasts_its_lease_while_another_node_sweeps() {
    let database = postgres_schema().await;
    let short_lease = |c: &mut spool_server::Config| {
        c.lease_timeout = Duration::from_secs(4);
        c.heartbeat_interval = Duration::from_millis(500);
    };
    let a = TestServer::start_on_database_with(&database, short_lease).await;
    let _b = TestServer::start_on_database_with(&database, short_lease).await;
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counted = runs.clone();
    let _worker = a.worker(move |w| {
        w.activity("long", move |ctx, _| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(12)).await;
                spool_worker::json(&ctx.info().attempt)
            }
        })
    });
    a.await_workers(1).await;
    let mut client = a.client().await;
    submit(&mut client, request("long", "wf", "long")).await;
    let done = wait_within(&mut client, key("wf", "long"), Duration::from_secs(30)).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    assert_eq!(done.attempt, 1, "the renewed lease was never reclaimed");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}
