//! The smaller holes: a worker leaving cleanly, a stalled server, bare heartbeats,
//! absurd SDK durations.

use std::time::{Duration, Instant};

use spool_proto::v1::{self, ActivityStatus, server_message, worker_message};
use spool_testkit::faults::Faulty;

use crate::harness::*;

/// Goodbye: the server plans nothing more for the worker and says so with Drain;
/// nothing is sent after it.
#[tokio::test]
async fn goodbye_is_answered_with_drain_and_nothing_follows_it() {
    let (server, mut client) = TestServer::serving().await;
    let mut worker = RawWorker::connect(&server, &["t"], 5).await;
    submit(&mut client, request("t", "wf", "before")).await;
    let task = worker.task().await;
    worker
        .send(worker_message::Message::Goodbye(v1::Goodbye {}))
        .await;
    loop {
        match worker.next().await {
            server_message::Message::Drain(drain) => {
                assert!(drain.deadline.is_none());
                break;
            }
            server_message::Message::Task(t) => panic!("a task after Goodbye: {t:?}"),
            _ => {}
        }
    }
    for i in 0..5 {
        submit(&mut client, request("t", "wf", &format!("after{i}"))).await;
    }
    worker.quiet_for(Duration::from_millis(300)).await;
    // What it held it may still finish.
    worker.complete(&task, task.attempt).await;
    assert!(worker.ack().await.accepted);
}

/// An SDK worker shut down while tasks keep coming never drops one: everything it
/// was sent is run or handed back, so no attempt is lost. A worker that stays
/// runs the rest; then every one of the 300 completed on its first counted
/// attempt (a lost attempt counts, a hand-back does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_shutdown_under_load_loses_no_attempt() {
    const N: usize = 300;
    let (server, client) = TestServer::serving().await;
    let worker = server.worker(|w| {
        w.max_concurrency(4)
            .activity("t", |_, _| async { spool_worker::json(&"ok") })
    });
    server.await_workers(1).await;
    let submitter = {
        let mut client = client.clone();
        tokio::spawn(async move {
            for i in 0..N {
                submit(&mut client, request("t", "wf", &format!("a{i}"))).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    worker.shutdown().await.expect("clean shutdown");
    submitter.await.unwrap();
    let _stayer = server.worker(|w| w.activity("t", |_, _| async { spool_worker::json(&"ok") }));
    let all = eventually("every activity to complete", || {
        let mut client = client.clone();
        async move {
            let all = list_all(&mut client).await;
            all.iter()
                .all(|a| status(a) == ActivityStatus::Completed)
                .then_some(all)
        }
    })
    .await;
    assert_eq!(all.len(), N, "every submitted activity is listed");
    let spent: Vec<_> = all
        .iter()
        .filter(|a| a.counted_attempts != 1)
        .map(|a| (a.key.clone(), a.counted_attempts, a.last_error.clone()))
        .collect();
    assert!(
        spent.is_empty(),
        "attempts were lost in a clean shutdown: {spent:?}"
    );
}

/// A committer stalled for many heartbeat intervals: the worker keeps sending
/// keep-alives and results; it is not evicted, and no attempt is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_server_does_not_evict_healthy_workers() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = TestServer::on_store(faulty.clone(), |c| {
        c.heartbeat_interval = Duration::from_millis(100)
    })
    .await;
    let mut client = server.client().await;
    const N: usize = 300;
    client
        .submit_batch(v1::SubmitBatchRequest {
            activities: (0..N)
                .map(|i| request("t", "wf", &format!("a{i}")))
                .collect(),
        })
        .await
        .unwrap();
    let mut worker = RawWorker::connect(&server, &["t"], N as u32).await;
    let mut tasks = Vec::new();
    while tasks.len() < N {
        tasks.push(worker.task().await);
    }
    let mut admin = server.admin().await;
    faulty.stall(true);
    // Results pile up behind the stall, more than the ack window; keep-alives go
    // on all the while.
    for task in &tasks {
        worker.complete(task, task.attempt).await;
    }
    let stalled_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < stalled_until {
        worker
            .send(worker_message::Message::Heartbeat(v1::Heartbeat::default()))
            .await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Keep-alives were read all along, results queued behind the stall or not.
    let workers = workers(&mut admin).await.unwrap();
    let seen = workers[0]
        .last_seen_at
        .as_ref()
        .map(spool_proto::time::from_proto);
    let silent_for = spool_proto::time::now_millis() - seen.unwrap_or(0);
    // Unread keep-alives would leave it silent for the whole 3 s stall; read,
    // for 30 ms at a time. The bound is generous for a loaded machine.
    assert!(
        silent_for < 1_000,
        "the worker looked silent for {silent_for} ms"
    );
    faulty.stall(false);
    let mut accepted = 0;
    while accepted < N {
        match worker.next().await {
            server_message::Message::Ack(ack) => {
                assert!(ack.accepted, "{ack:?}");
                accepted += 1;
            }
            server_message::Message::Cancel(c) => panic!("the worker was cut off: {c:?}"),
            _ => {}
        }
        worker
            .send(worker_message::Message::Heartbeat(v1::Heartbeat::default()))
            .await;
    }
    let stats = stats(&mut client).await;
    assert_eq!(stats.completed, N as u64);
    assert_eq!(stats.connected_workers, 1, "the worker was never evicted");
}

/// The store fails a result's commit (and the committer's retry of it alone): the
/// result is committed again once the store is back, and acknowledged as
/// accepted. Refusing it would tell the worker its attempt had ended elsewhere;
/// the outcome would be lost and the row reclaimed as a lost worker's.
#[tokio::test]
async fn a_result_the_store_failed_is_written_once_the_store_is_back() {
    // The batch with the ending fails, then the ending written alone fails too.
    a_result_whose_commit_fails_twice_is_accepted(|faulty| &faulty.failed_endings).await;
}

/// A result's commit is written but reported failed (its reply lost with the
/// connection), and so is the committer's retry of it alone: the session's own
/// retry then finds the row already ended, by this very result. The worker hears
/// it was accepted, as it would had the first reply come back.
#[tokio::test]
async fn a_result_written_but_reported_failed_is_acknowledged_as_accepted() {
    a_result_whose_commit_fails_twice_is_accepted(|faulty| &faulty.lost_replies).await;
}

/// One result whose commit fails twice as `fault` says, on a store of its own:
/// the worker's ack says accepted, and the activity is completed, once.
async fn a_result_whose_commit_fails_twice_is_accepted(
    fault: impl Fn(&Faulty) -> &std::sync::atomic::AtomicUsize,
) {
    use std::sync::atomic::Ordering::SeqCst;
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = TestServer::on_store(faulty.clone(), |_| {}).await;
    let (mut client, mut worker, task) = server.running_one(request("t", "wf", "a")).await;
    fault(&faulty).store(2, SeqCst);
    worker.complete(&task, task.attempt).await;
    let ack = tokio::time::timeout(Duration::from_secs(10), worker.ack())
        .await
        .expect("no ack within 10 s");
    assert_eq!(fault(&faulty).load(SeqCst), 0, "both commits failed");
    assert!(ack.accepted, "the result was said refused: {ack:?}");
    let activity = get(&mut client, key("wf", "a")).await;
    assert_eq!(status(&activity), ActivityStatus::Completed, "{activity:?}");
    assert_eq!(activity.attempt, 1, "{activity:?}");
}

/// A heartbeat without details says "alive": the progress reported before stays.
#[tokio::test]
async fn a_bare_heartbeat_keeps_the_stored_details() {
    // Heartbeats are written every quarter interval. The raw worker says nothing
    // while the test waits for the write, so the interval leaves it three seconds
    // of silence (three intervals) before it would be evicted, even on a loaded
    // machine with several nodes.
    let server =
        TestServer::start_with(|c| c.heartbeat_interval = Duration::from_millis(1_000)).await;
    let (mut client, mut worker, task) = server.running_one(request("t", "wf", "a")).await;
    let beat = |details: Option<v1::Payload>| {
        worker_message::Message::Heartbeat(v1::Heartbeat {
            workflow_id: task.workflow_id.clone(),
            activity_id: task.activity_id.clone(),
            attempt: task.attempt,
            details,
        })
    };
    worker
        .send(beat(Some(json(serde_json::json!({"done": 50})))))
        .await;
    row_when(&client, key("wf", "a"), "the details to be stored", |row| {
        row.heartbeat_details
            .as_ref()
            .is_some_and(|d| !d.data.is_empty())
    })
    .await;
    worker.send(beat(None)).await;
    // The result carries whatever details were reported since the last flush: a
    // bare heartbeat must not have put "none" there.
    worker.complete(&task, task.attempt).await;
    assert!(worker.ack().await.accepted);
    let row = get(&mut client, key("wf", "a")).await;
    assert_eq!(status(&row), ActivityStatus::Completed);
    assert_eq!(
        row.heartbeat_details.map(|d| d.data),
        Some(br#"{"done":50}"#.to_vec())
    );
}

/// Durations past what a clock holds do not panic the SDK.
#[tokio::test]
async fn the_sdk_survives_absurd_durations() {
    let (server, mut client) = TestServer::serving().await;
    let worker = server.worker(|w| {
        w.shutdown_timeout(Duration::MAX)
            .reconnect_backoff(Duration::MAX, Duration::MAX)
            .activity("t", |_, _| async { spool_worker::json(&"ok") })
    });
    submit(&mut client, request("t", "wf", "a")).await;
    let done = wait(&mut client, key("wf", "a")).await;
    assert_eq!(status(&done), ActivityStatus::Completed);
    tokio::time::timeout(WAIT, worker.shutdown())
        .await
        .expect("shuts down")
        .expect("without error");
}
