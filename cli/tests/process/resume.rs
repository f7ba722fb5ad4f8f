//! A worker's session outlives the node it was on: with `kill -9` of that node, the
//! worker reconnects (through a balancer, here a TCP proxy) to another node sharing
//! the PostgreSQL database, resumes its session there, and the attempt it was
//! running completes as attempt 1: not lost, not run twice, without waiting for the
//! dead node's lease.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use spool_proto::v1::{self, ActivityStatus};
use spool_testkit::proxy;
use spool_worker::{Connection, Worker};

use crate::support::*;

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_worker_moves_to_another_node_when_its_node_is_killed() {
    // A lease far longer than the test: only the resume can save the attempt fast.
    let args = ["--lease-timeout", "60s", "--resume-grace", "10s"];
    let (_node_a, _node_b, mut a, b) = two_nodes(&args).await;
    let mut client_b = b.client().await;
    let mut client_a = a.client().await;
    let addr = |url: &str| {
        url.trim_start_matches("http://")
            .parse()
            .expect("a socket address")
    };
    let proxy = proxy::Proxy::start(vec![addr(&a.url), addr(&b.url)])
        .await
        .expect("proxy");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let seen = runs.clone();
    let worker = Worker::new(format!("http://{}", proxy.addr))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        // A killed node's connection breaks at once; slow pings keep a loaded
        // machine from moving the worker before the kill.
        .keep_alive(Duration::from_secs(2), Duration::from_secs(3))
        .activity("slow", move |ctx, _| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(ctx.info().attempt);
                tokio::time::sleep(Duration::from_secs(3)).await;
                spool_worker::json(&serde_json::json!({ "attempt": ctx.info().attempt }))
            }
        });
    let mut connection = worker.connection();
    let stop = tokio_util::sync::CancellationToken::new();
    let _running = tokio::spawn(worker.run(stop.clone()));
    let _stop = stop.drop_guard();
    connection
        .wait_for(|c| matches!(c, Connection::Connected { .. }))
        .await
        .expect("connected");
    // The proxy sends the first connection to a.
    a.await_workers(&mut client_a, 1).await;
    submit(
        &mut client_b,
        v1::SubmitRequest {
            activity_type: "slow".into(),
            workflow_id: "p".into(),
            activity_id: "moved".into(),
            ..Default::default()
        },
    )
    .await;
    eventually("the attempt to start on a's session", || async {
        (!runs.lock().unwrap_or_else(|e| e.into_inner()).is_empty()).then_some(())
    })
    .await;
    a.kill_9();
    eventually("the worker to resume on b", || {
        let connection = connection.clone();
        async move {
            match &*connection.borrow() {
                Connection::Connected { resumed: true, .. } => Some(()),
                _ => None,
            }
        }
    })
    .await;
    let done = wait(&mut client_b, "moved").await;
    assert_eq!(
        (status(&done), done.attempt),
        (ActivityStatus::Completed, 1),
        "{done:?}"
    );
    assert!(done.last_error.is_none(), "never lost: {done:?}");
    assert_eq!(
        *runs.lock().unwrap_or_else(|e| e.into_inner()),
        [1],
        "run once"
    );
}
