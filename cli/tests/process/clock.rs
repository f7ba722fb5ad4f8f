//! A step of the wall clock under a running server (libfaketime moves the
//! server's wall clock, not its monotonic one): liveness runs on the monotonic
//! clock, so no healthy worker is evicted, and due rows are judged on the wall
//! clock within a second, so none stalls.

use std::time::Duration;

use spool_proto::v1::{self, ActivityStatus};

use crate::support::*;

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

async fn worker_ids(url: &str) -> Vec<String> {
    admin_of(url)
        .await
        .list_workers(v1::ListWorkersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .workers
        .into_iter()
        .map(|w| w.worker_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(spool_test_faketime),
    ignore = "needs libfaketime: apt-get install faketime"
)]
async fn a_wall_clock_step_neither_evicts_workers_nor_stalls_due_rows() {
    let env = Env::new();
    let clock = env.file("clock", b"+0");
    let clock = clock.to_string_lossy();
    let envs = faked(&clock);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = env.server_with(&env.database(), &["--heartbeat-interval", "500ms"], &envs);
    let mut client = server.client().await;
    let worker = env.worker(1);
    server.await_workers(&mut client, 1).await;
    let before = worker_ids(&env.url()).await;
    // Due in half an hour of the server's wall time.
    submit(
        &mut client,
        sleep_request("later", 10, Some(Duration::from_secs(1800))),
    )
    .await;
    // The wall clock jumps an hour ahead.
    std::fs::write(&*clock, "+3600").unwrap();
    let done = eventually_for(
        Duration::from_secs(10),
        "the row the step made due to run",
        || {
            let mut client = client.clone();
            async move {
                let row = get(&mut client, "later").await;
                (status(&row) == ActivityStatus::Completed).then_some(row)
            }
        },
    )
    .await;
    assert_eq!(done.attempt, 1);
    // Three heartbeat intervals and more pass: the worker stays, the same one.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        worker_ids(&env.url()).await,
        before,
        "the worker was evicted"
    );
    assert_eq!(worker.log().starts(), 1);
    // And back an hour, past where it started: still nobody evicted.
    std::fs::write(&*clock, "-3600").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(worker_ids(&env.url()).await, before);
}

/// The variables that run `spool serve` under libfaketime, reading its offset
/// from `clock`. Tests that use it are ignored where libfaketime is missing
/// (`spool_test_faketime`); where they run, a missing library fails them.
fn faked(clock: &str) -> [(&'static str, String); 4] {
    assert!(
        std::path::Path::new(FAKETIME).exists(),
        "{FAKETIME} is missing: apt-get install faketime"
    );
    [
        ("LD_PRELOAD", FAKETIME.to_owned()),
        ("FAKETIME_TIMESTAMP_FILE", clock.to_owned()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// Two nodes on one PostgreSQL, b's wall clock `offset` from a's (and the
/// database's).
async fn skewed_pair(database: &str, offset: &str) -> (Env, Env, ServerProcess, ServerProcess) {
    let (node_a, node_b) = (Env::new(), Env::new());
    let clock = node_b.file("clock", offset.as_bytes());
    let envs = faked(&clock.to_string_lossy());
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["--lease-timeout", "4s", "--heartbeat-interval", "500ms"];
    let a = node_a.server_on(database, &args);
    let b = node_b.server_with(database, &args, &envs);
    (node_a, node_b, a, b)
}

/// Leases are judged by the database's clock: a node whose own clock runs an
/// hour ahead does not take a live attempt from another node.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(all(spool_test_postgres, spool_test_faketime)),
    ignore = "needs PostgreSQL (installed, or SPOOL_TEST_POSTGRES_URL) and libfaketime"
)]
async fn a_node_whose_clock_runs_ahead_never_reclaims_a_live_attempt() {
    let database = postgres_schema().await;
    let (node_a, _node_b, a, b) = skewed_pair(&database, "+3600").await;
    let mut client_a = a.client().await;
    b.client().await;
    let worker = node_a.worker(1);
    a.await_workers(&mut client_a, 1).await;
    // Three leases long: b's sweep looks at it many times.
    submit(&mut client_a, sleep_request("live", 12_000, None)).await;
    let done = eventually_for(Duration::from_secs(40), "it to finish", || {
        let mut client = client_a.clone();
        async move {
            let row = get(&mut client, "live").await;
            (status(&row) == ActivityStatus::Completed).then_some(row)
        }
    })
    .await;
    assert_eq!(done.attempt, 1, "reclaimed by the skewed node: {done:?}");
    assert_eq!(worker.log().starts(), 1);
}

/// Due times are judged by the database's clock: a node whose clock runs an hour
/// behind still dispatches a row another node submitted, at once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(all(spool_test_postgres, spool_test_faketime)),
    ignore = "needs PostgreSQL (installed, or SPOOL_TEST_POSTGRES_URL) and libfaketime"
)]
async fn a_node_whose_clock_runs_behind_does_not_hold_due_rows_back() {
    let database = postgres_schema().await;
    let (_node_a, node_b, a, b) = skewed_pair(&database, "-3600").await;
    let mut client_a = a.client().await;
    let mut client_b = b.client().await;
    let _worker = node_b.worker(1);
    b.await_workers(&mut client_b, 1).await;
    submit(&mut client_a, sleep_request("due", 10, None)).await;
    let done = eventually_for(Duration::from_secs(10), "b to run it", || {
        let mut client = client_a.clone();
        async move {
            let row = get(&mut client, "due").await;
            (status(&row) == ActivityStatus::Completed).then_some(row)
        }
    })
    .await;
    assert_eq!(done.attempt, 1);
}
