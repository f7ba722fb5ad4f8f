//! A step of the wall clock under a running server (libfaketime moves the
//! server's wall clock, not its monotonic one): liveness runs on the monotonic
//! clock, so no healthy worker is evicted, and the store's clock is anchored
//! (SQLite: the wall clock at open, read forward by the monotonic clock;
//! PostgreSQL: the database's), so a step neither delays nor expires work.

use std::time::Duration;

use spool_proto::v1::{self, ActivityStatus};

use crate::support::*;

const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

async fn worker_ids(url: &str) -> Vec<String> {
    workers(&mut admin_of(url).await)
        .await
        .unwrap()
        .into_iter()
        .map(|w| w.worker_id)
        .collect()
}

/// A server on SQLite under libfaketime, with a worker, and the file that moves
/// its wall clock.
async fn faked_server(env: &Env) -> (ServerProcess, String) {
    let clock = env.file("clock", b"+0").to_string_lossy().into_owned();
    let server = faked_server_on(env, &clock);
    (server, clock)
}

fn faked_server_on(env: &Env, clock: &str) -> ServerProcess {
    let envs = faked(clock);
    let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.server_with(&env.database(), &["--heartbeat-interval", "500ms"], &envs)
}

/// A step of an hour ahead, then back: no healthy worker is evicted (liveness is
/// on the monotonic clock), and due times do not move with the wall clock: a row
/// delayed half an hour still waits, one due now runs at once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_faketime), ignore = "needs faketime: docs/TESTING.md")]
async fn a_wall_clock_step_neither_evicts_workers_nor_moves_due_times() {
    let env = Env::new();
    let (server, clock) = faked_server(&env).await;
    let mut client = server.client().await;
    let worker = env.worker(1);
    server.await_workers(&mut client, 1).await;
    let before = worker_ids(&env.url()).await;
    submit(
        &mut client,
        sleep_request("later", 10, Some(Duration::from_secs(1800))),
    )
    .await;
    // The wall clock jumps an hour ahead.
    std::fs::write(&clock, "+3600").unwrap();
    submit(&mut client, sleep_request("now", 10, None)).await;
    let done = completed_within(&client, "now", Duration::from_secs(10)).await;
    assert_eq!(done.attempt, 1);
    // Three heartbeat intervals and more pass: the worker stays, the same one,
    // and the delayed row is not made due by the step.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        worker_ids(&env.url()).await,
        before,
        "the worker was evicted"
    );
    assert_eq!(worker.log().starts(), 1);
    assert_eq!(
        status(&get(&mut client, "later").await),
        ActivityStatus::Scheduled
    );
    // And back an hour, past where it started: still nobody evicted.
    std::fs::write(&clock, "-3600").unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(worker_ids(&env.url()).await, before);
}

/// A step of a minute back does not hold back a row that was due a second later,
/// nor a rate-limited row waiting for the bucket's next token.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_faketime), ignore = "needs faketime: docs/TESTING.md")]
async fn a_backward_step_holds_back_neither_delayed_nor_rate_limited_rows() {
    let env = Env::new();
    let (server, clock) = faked_server(&env).await;
    let mut client = server.client().await;
    server
        .set_rate_limit("sleep", 1, Duration::from_secs(3))
        .await;
    let _worker = env.worker(2);
    server.await_workers(&mut client, 1).await;
    submit(&mut client, sleep_request("first", 10, None)).await;
    completed_within(&client, "first", Duration::from_secs(10)).await;
    submit(&mut client, sleep_request("limited", 10, None)).await;
    submit(
        &mut client,
        sleep_request("delayed", 10, Some(Duration::from_secs(1))),
    )
    .await;
    std::fs::write(&clock, "-60").unwrap();
    // Two more tokens come within 6 s; the step would add a minute to each.
    completed_within(&client, "limited", Duration::from_secs(15)).await;
    completed_within(&client, "delayed", Duration::from_secs(15)).await;
}

/// A step of two hours ahead does not fail a waiting row whose
/// schedule-to-close timeout is an hour: it runs once a worker comes.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_faketime), ignore = "needs faketime: docs/TESTING.md")]
async fn a_forward_step_expires_no_waiting_row() {
    let env = Env::new();
    let (server, clock) = faked_server(&env).await;
    let mut client = server.client().await;
    submit(
        &mut client,
        v1::SubmitRequest {
            schedule_to_close_timeout: Some(spool_proto::duration::to_proto(Duration::from_secs(
                3600,
            ))),
            ..sleep_request("patient", 10, None)
        },
    )
    .await;
    std::fs::write(&clock, "+7200").unwrap();
    // Several sweeps (every heartbeat interval) pass.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let row = get(&mut client, "patient").await;
    assert_eq!(status(&row), ActivityStatus::Scheduled, "{row:?}");
    let _worker = env.worker(1);
    let done = completed_within(&client, "patient", Duration::from_secs(10)).await;
    assert_eq!(done.attempt, 1);
}

/// The clock stepped back ten minutes while the server was down: times go on
/// from the newest one stored, so a row due five seconds after the stop does not
/// wait out the step.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_faketime), ignore = "needs faketime: docs/TESTING.md")]
async fn a_restart_after_a_backward_step_does_not_delay_due_rows() {
    let env = Env::new();
    let (mut server, clock) = faked_server(&env).await;
    let mut client = server.client().await;
    submit(
        &mut client,
        sleep_request("soon", 10, Some(Duration::from_secs(5))),
    )
    .await;
    server.signal("TERM");
    assert_eq!(server.wait_exit(Duration::from_secs(10)).await, Some(0));
    std::fs::write(&clock, "-600").unwrap();
    let server = faked_server_on(&env, &clock);
    let client = server.client().await;
    let _worker = env.worker(1);
    completed_within(&client, "soon", Duration::from_secs(20)).await;
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
    ignore = "needs PostgreSQL and libfaketime (docs/TESTING.md)"
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
    let done = completed_within(&client_a, "live", Duration::from_secs(40)).await;
    assert_eq!(done.attempt, 1, "reclaimed by the skewed node: {done:?}");
    assert_eq!(worker.log().starts(), 1);
}

/// Due times are judged by the database's clock: a node whose clock runs an hour
/// behind still dispatches a row another node submitted, at once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(
    not(all(spool_test_postgres, spool_test_faketime)),
    ignore = "needs PostgreSQL and libfaketime (docs/TESTING.md)"
)]
async fn a_node_whose_clock_runs_behind_does_not_hold_due_rows_back() {
    let database = postgres_schema().await;
    let (_node_a, node_b, a, b) = skewed_pair(&database, "-3600").await;
    let mut client_a = a.client().await;
    let mut client_b = b.client().await;
    let _worker = node_b.worker(1);
    b.await_workers(&mut client_b, 1).await;
    submit(&mut client_a, sleep_request("due", 10, None)).await;
    let done = completed_within(&client_a, "due", Duration::from_secs(10)).await;
    assert_eq!(done.attempt, 1);
}
