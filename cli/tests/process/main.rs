//! Real processes where the point is a real kill or signal: the `spool` binary as
//! the server, and this test binary re-run as a worker process (see
//! [`worker_process_entry`]).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod ahead;
mod child;
mod cli;
mod clock;
mod dashboard;
mod durability;
mod hostile;
mod metrics;
mod observe;
mod resume;
mod support;

use std::time::{Duration, Instant};

use spool_proto::v1::{self, ActivityStatus, ErrorKind};
use support::*;

/// The entry point of worker child processes: `WorkerProcess::start` re-runs this
/// test binary with only this (ignored) test selected and its configuration in the
/// environment.
#[test]
#[ignore = "the worker child processes' entry point, not a test"]
fn worker_process_entry() {
    if let Ok(config) = std::env::var(child::CONFIG_ENV) {
        child::run(&config);
    }
}

/// kill -9 of the server with 30 attempts running and 30 rows delayed: at the
/// restart the running ones come back at once as attempt 2, WORKER_LOST (start-up
/// reclaim: the lease is two minutes, far longer than the test), and every activity
/// completes once, with its final attempt's result.
#[tokio::test]
async fn kill_9_of_the_server_loses_nothing_and_completes_each_activity_once() {
    let env = Env::new();
    let args = ["--heartbeat-interval", "1s", "--lease-timeout", "120s"];
    let (mut server, mut client, worker) = env.served(&args, 30).await;
    // One batch: all thirty start together, long enough to be running at the kill.
    client
        .submit_batch(v1::SubmitBatchRequest {
            activities: (0..30)
                .map(|i| sleep_request(&format!("run{i}"), 5_000, None))
                .collect(),
        })
        .await
        .expect("submit");
    for i in 0..30 {
        submit(
            &mut client,
            sleep_request(&format!("later{i}"), 100, Some(Duration::from_millis(800))),
        )
        .await;
    }
    eventually("30 activities to start", || async {
        (worker.log().starts() >= 30).then_some(())
    })
    .await;
    server.kill_9();
    let restarted = Instant::now();
    let (_server, mut client) = env.serving(&args).await;
    await_completed(&client, 60, Duration::from_secs(30)).await;
    assert!(
        restarted.elapsed() < Duration::from_secs(60),
        "done long before the 120 s lease could have expired"
    );
    let all = list_all(&mut client).await;
    assert_eq!(all.len(), 60);
    for activity in &all {
        let output: serde_json::Value =
            serde_json::from_slice(&activity.output.as_ref().unwrap().data).unwrap();
        assert_eq!(
            output["attempt"], activity.attempt,
            "the accepted result is the final attempt's: {activity:?}"
        );
        let id = &activity.key.as_ref().unwrap().activity_id;
        if id.starts_with("run") {
            assert_eq!(activity.attempt, 2, "{id} was reclaimed at start-up");
            assert_eq!(
                activity.last_error.as_ref().map(|e| e.kind),
                Some(ErrorKind::WorkerLost as i32),
                "{id}"
            );
        } else {
            assert_eq!(activity.attempt, 1, "{id} had not started");
        }
    }
    // Each attempt ran exactly once: 30 interrupted, 30 re-run, 30 delayed.
    assert_eq!(worker.log().starts(), 90);
}

/// kill -9 with rows of concurrency keys waiting behind their keys' limit. SQLite's
/// writer keeps the index of those rows in memory and fills it from the file when
/// it opens: after the restart every one of them runs, once (the two running at
/// the kill again, as attempt 2).
#[tokio::test]
async fn kill_9_with_keyed_rows_waiting_runs_each_once_after_the_restart() {
    let env = Env::new();
    let args = ["--heartbeat-interval", "1s", "--lease-timeout", "120s"];
    let (mut server, mut client) = env.serving(&args).await;
    server.set_concurrency_limit("sleep", 1).await;
    let worker = env.worker(10);
    server.await_workers(&mut client, 1).await;
    client
        .submit_batch(v1::SubmitBatchRequest {
            activities: (0..20)
                .map(|i| v1::SubmitRequest {
                    concurrency_key: format!("k{}", i % 2),
                    ..sleep_request(&format!("keyed{i}"), 600, None)
                })
                .collect(),
        })
        .await
        .expect("submit");
    // Killed well before the first two end (600 ms), so exactly those two run.
    eventually("one row of each key to start", || async {
        (worker.log().starts() >= 2).then_some(())
    })
    .await;
    server.kill_9();
    assert_eq!(worker.log().dones(), 0, "killed too late to tell");
    let (_server, client) = env.serving(&args).await;
    await_completed(&client, 20, Duration::from_secs(30)).await;
    let all = list_all(&mut client.clone()).await;
    assert_eq!(all.len(), 20);
    let again = all.iter().filter(|a| a.attempt == 2).count();
    assert_eq!(again, 2, "the two running at the kill ran again");
    assert!(all.iter().all(|a| a.attempt <= 2), "{all:?}");
    assert_eq!(worker.log().starts(), 22, "every other row ran once");
}

/// kill -9 while submits are in flight: every submit the server acknowledged is
/// there after the restart (a submit is answered only after its durable commit).
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_submits_keeps_every_acknowledged_one() {
    let env = Env::new();
    let (mut server, client) = env.serving(&[]).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut loops = Vec::new();
    for n in 0..8 {
        let mut client = client.clone();
        let acked = acked.clone();
        loops.push(tokio::spawn(async move {
            let mut refused = 0;
            for i in 0.. {
                let id = format!("s{n}-{i}");
                match client.submit(sleep_request(&id, 1, None)).await {
                    Ok(_) => acked.lock().unwrap().push(id),
                    Err(_) => {
                        refused += 1;
                        if refused > 3 {
                            return;
                        }
                    }
                }
            }
        }));
    }
    eventually("submits to be flowing", || async {
        (acked.lock().unwrap().len() >= 200).then_some(())
    })
    .await;
    server.kill_9();
    for l in loops {
        let _ = l.await;
    }
    let acknowledged = acked.lock().unwrap().clone();
    let (_server, mut client) = env.serving(&[]).await;
    for id in &acknowledged {
        client
            .get(v1::GetRequest {
                key: Some(key(id)),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("acknowledged {id} is gone: {e}"));
    }
    let stats = stats(&mut client).await;
    assert!(
        stats.scheduled as usize >= acknowledged.len(),
        "{} stored, {} acknowledged",
        stats.scheduled,
        acknowledged.len()
    );
}

/// A worker killed mid-attempt cannot be told from one whose connection dropped:
/// its session waits the resume grace (1 s here) for it, then its attempt runs
/// again on another worker, as WORKER_LOST.
#[tokio::test]
async fn kill_9_of_a_worker_redelivers_to_another_after_the_resume_grace() {
    let env = Env::new();
    let (server, mut client, mut doomed) = env.served(&["--resume-grace", "1s"], 1).await;
    submit(&mut client, sleep_request("w", 30_000, None)).await;
    eventually("the first attempt to start", || async {
        (doomed.log().starts() == 1).then_some(())
    })
    .await;
    let _other = in_process_worker(&server, "sleep");
    server.await_workers(&mut client, 2).await;
    let killed_at = now_ms();
    doomed.kill_9();
    let row = eventually("attempt 2 to start", || {
        let mut client = client.clone();
        async move {
            let row = get(&mut client, "w").await;
            (row.attempt == 2).then_some(row)
        }
    })
    .await;
    let started = spool_proto::time::from_proto(&row.started_at.unwrap());
    // The broken stream is seen at once and the grace is 1 s; an eviction for
    // silence would take 15 s and a lease 30 s, so 4 s leaves a loaded machine room
    // and still tells them apart.
    assert!(
        (900..4_000).contains(&(started - killed_at)),
        "redelivered {} ms after the kill",
        started - killed_at
    );
    let done = wait(&mut client, "w").await;
    assert_eq!(
        (status(&done), done.attempt),
        (ActivityStatus::Completed, 2)
    );
    assert_eq!(done.last_error.unwrap().kind, ErrorKind::WorkerLost as i32);
}

/// A worker on `run_until_signal` that gets SIGTERM mid-activity finishes it,
/// reports it and exits 0: the attempt completes, nothing is counted lost.
#[tokio::test]
async fn sigterm_to_a_worker_finishes_its_work_and_loses_no_attempt() {
    let env = Env::new();
    let (_server, mut client, mut worker) = env.served(&[], 1).await;
    submit(&mut client, sleep_request("w", 1_000, None)).await;
    eventually("the attempt to start", || async {
        (worker.log().starts() == 1).then_some(())
    })
    .await;
    worker.signal("TERM");
    let code = worker.wait_exit(Duration::from_secs(10)).await;
    assert_eq!(code, Some(0), "{}", worker.stderr());
    assert_eq!(worker.log().dones(), 1, "the work finished");
    let done = wait(&mut client, "w").await;
    assert_eq!(
        (status(&done), done.attempt, done.last_error),
        (ActivityStatus::Completed, 1, None),
        "completed by the stopping worker, no attempt lost"
    );
}

#[tokio::test]
async fn a_frozen_worker_loses_its_attempt_and_its_late_result_changes_nothing() {
    let env = Env::new();
    let (server, mut client, frozen) = env.served(&["--heartbeat-interval", "500ms"], 1).await;
    submit(&mut client, sleep_request("f", 2_000, None)).await;
    eventually("the first attempt to start", || async {
        (frozen.log().starts() == 1).then_some(())
    })
    .await;
    let _other = in_process_worker(&server, "sleep");
    server.await_workers(&mut client, 2).await;
    frozen.signal("STOP");
    let stopped = Instant::now();
    let done = wait(&mut client, "f").await;
    let took = stopped.elapsed();
    assert_eq!(
        (status(&done), done.attempt),
        (ActivityStatus::Completed, 2)
    );
    // 3 silent intervals are 1.5 s; the lease (30 s) would be the alternative.
    assert!(
        took < Duration::from_millis(5_000),
        "redelivered after {took:?} (3 intervals = 1.5 s)"
    );
    assert_eq!(
        done.last_error.as_ref().unwrap().kind,
        ErrorKind::WorkerLost as i32
    );
    frozen.signal("CONT");
    // The frozen worker wakes and finishes attempt 1 (its session is gone, so the
    // SDK cannot deliver that result), then connects again; nothing changes.
    eventually("the frozen worker to finish attempt 1", || async {
        (frozen.log().dones() == 1).then_some(())
    })
    .await;
    server.await_workers(&mut client, 2).await;
    let after = get(&mut client, "f").await;
    assert_eq!(
        (status(&after), after.attempt),
        (ActivityStatus::Completed, 2)
    );
    assert_eq!(
        after.output, done.output,
        "the late result of attempt 1 was not accepted"
    );
}

#[tokio::test]
async fn an_activity_longer_than_its_lease_runs_exactly_once() {
    let env = Env::new();
    let (_server, mut client, worker) = env.served(&["--lease-timeout", "10s"], 1).await;
    submit(&mut client, sleep_request("long", 65_000, None)).await;
    let done = completed_within(&client, "long", Duration::from_secs(90)).await;
    assert_eq!(done.attempt, 1);
    assert_eq!(worker.log().starts(), 1, "delivered exactly once");
}

#[tokio::test]
async fn sigterm_drains_in_flight_work_and_exits_zero() {
    let env = Env::new();
    let (mut server, mut client, worker) = env.served(&["--drain-timeout", "5s"], 10).await;
    for i in 0..10 {
        submit(&mut client, sleep_request(&format!("d{i}"), 1_000, None)).await;
    }
    eventually("10 activities to start", || async {
        (worker.log().starts() == 10).then_some(())
    })
    .await;
    server.signal("TERM");
    let code = server.wait_exit(Duration::from_secs(5 + 2)).await;
    assert_eq!(code, Some(0));
    assert!(
        worker.stderr().contains("server draining"),
        "the worker was sent Drain"
    );
    assert_eq!(worker.log().dones(), 10);
    let (_server, mut client) = env.serving(&[]).await;
    for activity in list_all(&mut client).await {
        assert_eq!(
            (status(&activity), activity.attempt),
            (ActivityStatus::Completed, 1)
        );
    }
}

#[tokio::test]
async fn sigterm_releases_what_outlives_the_drain_and_it_runs_after_restart() {
    let env = Env::new();
    let (mut server, mut client, mut worker) = env.served(&["--drain-timeout", "1s"], 1).await;
    let mut forever = sleep_request("forever", 0, None);
    forever.activity_type = "forever".into();
    submit(&mut client, forever).await;
    eventually("it to start", || async {
        (worker.log().starts() == 1).then_some(())
    })
    .await;
    let signalled = Instant::now();
    server.signal("TERM");
    let code = server.wait_exit(Duration::from_secs(1 + 2)).await;
    assert_eq!(code, Some(0));
    assert!(
        signalled.elapsed() >= Duration::from_secs(1),
        "it waited for the drain timeout"
    );
    worker.kill_9();

    let (server, mut client) = env.serving(&[]).await;
    let row = get(&mut client, "forever").await;
    assert_eq!(
        status(&row),
        ActivityStatus::Scheduled,
        "released, not failed"
    );
    assert!(row.last_error.is_none());
    let again = env.worker(1);
    server.await_workers(&mut client, 1).await;
    eventually("it to run again", || async {
        again.log().started(2).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_second_signal_exits_at_once() {
    let env = Env::new();
    let (mut server, mut client, worker) = env.served(&["--drain-timeout", "30s"], 1).await;
    let mut forever = sleep_request("forever", 0, None);
    forever.activity_type = "forever".into();
    submit(&mut client, forever).await;
    eventually("it to start", || async {
        (worker.log().starts() == 1).then_some(())
    })
    .await;
    server.signal("TERM");
    // The first signal was taken (the drain made the node NOT_SERVING): the
    // handler of the second is armed.
    server.await_not_serving().await;
    let again = Instant::now();
    server.signal("INT");
    let code = server.wait_exit(Duration::from_secs(3)).await;
    assert_eq!(code, Some(130));
    assert!(again.elapsed() < Duration::from_secs(2));
}

#[tokio::test]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn when_a_node_dies_another_takes_over_its_attempts_after_their_lease() {
    let args = ["--lease-timeout", "2s", "--heartbeat-interval", "500ms"];
    let (node_a, _node_b, mut a, b) = two_nodes(&args).await;
    let mut client_a = a.client().await;
    let mut client_b = b.client().await;
    let worker_on_a = node_a.worker(1);
    a.await_workers(&mut client_a, 1).await;
    submit(&mut client_a, sleep_request("orphan", 60_000, None)).await;
    eventually("it to start on a's worker", || async {
        (worker_on_a.log().starts() == 1).then_some(())
    })
    .await;
    let _worker_on_b = in_process_worker(&b, "sleep");
    b.await_workers(&mut client_b, 1).await;
    let killed = std::time::Instant::now();
    a.kill_9();
    let done = completed_within(&client_b, "orphan", WAIT).await;
    assert_eq!(done.attempt, 2);
    assert_eq!(
        done.last_error.as_ref().map(|e| e.kind),
        Some(ErrorKind::WorkerLost as i32)
    );
    let took = killed.elapsed();
    assert!(
        took >= Duration::from_millis(1_000),
        "not before the lease could expire: {took:?}"
    );
    assert!(
        took < Duration::from_secs(6),
        "within the lease plus a sweep: {took:?}"
    );
}

/// The priority aging is stored for every node: a node started with the flag
/// sets it, one started without keeps what is stored, and `--priority-aging 0s`
/// sets strict priority again.
#[tokio::test]
async fn a_node_started_without_priority_aging_keeps_the_stored_setting() {
    let env = Env::new();
    let run = |args: &'static [&'static str]| {
        let env = &env;
        async move {
            let mut server = env.server(args);
            server.client().await;
            server.signal("TERM");
            assert_eq!(server.wait_exit(Duration::from_secs(10)).await, Some(0));
        }
    };
    let stored = || async {
        let pool = sqlx::SqlitePool::connect(&env.database()).await.unwrap();
        let ms: i64 = sqlx::query_scalar("SELECT priority_aging_ms FROM dispatch_settings")
            .fetch_one(&pool)
            .await
            .unwrap();
        pool.close().await;
        ms
    };
    run(&["--priority-aging", "1s"]).await;
    assert_eq!(stored().await, 1_000);
    run(&[]).await;
    assert_eq!(stored().await, 1_000, "a node without the flag changed it");
    run(&["--priority-aging", "0s"]).await;
    assert_eq!(stored().await, 0);
}
