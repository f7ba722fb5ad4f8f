//! Sessions that survive a network blip: a worker whose connection drops resumes
//! its session within the grace and keeps its attempts (no WORKER_LOST, no second
//! run); past the grace they are lost as before. Through a TCP proxy in the test
//! that cuts, refuses or black-holes the worker's connection mid-attempt.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use spool_proto::v1::{self, server_message, worker_message};
use spool_testkit::{faults::Faulty, proxy};
use spool_worker::{Connection, ResultAck, Worker};

use crate::harness::*;

/// A server with a resume grace, and a proxy in front of it (one node: the proxy
/// is the network the test cuts).
async fn behind_proxy(grace: Duration, heartbeat: Duration) -> (TestServer, proxy::Proxy) {
    let server = TestServer::one_node_with(|c| {
        c.resume_grace = Some(grace);
        c.heartbeat_interval = heartbeat;
    })
    .await;
    let addr = server
        .endpoint
        .trim_start_matches("http://")
        .parse()
        .expect("a socket address");
    let proxy = proxy::Proxy::start(vec![addr]).await.expect("proxy");
    (server, proxy)
}

/// A slow activity started on a worker connected through the proxy of
/// [`behind_proxy`]'s server.
struct SlowRun {
    server: TestServer,
    proxy: proxy::Proxy,
    seen: Seen,
    connection: tokio::sync::watch::Receiver<Connection>,
    client: Calls,
    /// Held for the run: dropping it stops the worker.
    _worker: RunningWorker,
}

/// Starts `slow(id, ms)` on a slow worker, in a first session, behind a proxy.
async fn slow_run(grace: Duration, heartbeat: Duration, id: &str, ms: u64) -> SlowRun {
    let (server, proxy) = behind_proxy(grace, heartbeat).await;
    let seen = Seen::default();
    let (_worker, mut connection) = slow_worker(&proxy, &seen);
    assert!(!connected(&mut connection).await, "a first session");
    let mut client = server.client().await;
    submit(&mut client, slow(id, ms)).await;
    seen.first_run().await;
    SlowRun {
        server,
        proxy,
        seen,
        connection,
        client,
        _worker,
    }
}

/// How often each attempt's handler ran, and the acks the worker saw.
#[derive(Clone, Default)]
struct Seen {
    runs: Arc<Mutex<Vec<(String, u32)>>>,
    acks: Arc<Mutex<Vec<ResultAck>>>,
}

impl Seen {
    /// Waits for the first run to start.
    async fn first_run(&self) {
        eventually("the attempt to start", || async {
            (!self.runs().is_empty()).then_some(())
        })
        .await;
    }

    fn runs(&self) -> Vec<(String, u32)> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn accepted(&self, id: &str, attempt: u32) -> usize {
        self.acks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|a| a.activity_id == id && a.attempt == attempt && a.accepted)
            .count()
    }

    fn refused(&self, id: &str, attempt: u32) -> bool {
        self.acks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|a| a.activity_id == id && a.attempt == attempt && !a.accepted)
    }
}

/// A worker through `proxy` whose `slow` handler sleeps the input's `ms`, deaf
/// to cancellation (work that cannot stop), recording each run.
fn slow_worker(
    proxy: &proxy::Proxy,
    seen: &Seen,
) -> (RunningWorker, tokio::sync::watch::Receiver<Connection>) {
    // Fast pings: a stall is noticed within half a second.
    slow_worker_pinging(
        proxy,
        seen,
        Duration::from_millis(200),
        Duration::from_millis(300),
    )
}

/// [`slow_worker`] with its own ping interval and timeout.
fn slow_worker_pinging(
    proxy: &proxy::Proxy,
    seen: &Seen,
    interval: Duration,
    timeout: Duration,
) -> (RunningWorker, tokio::sync::watch::Receiver<Connection>) {
    slow_worker_with(proxy, seen, interval, timeout, |w| w)
}

/// [`slow_worker_pinging`], the worker further set up by `configure`.
fn slow_worker_with(
    proxy: &proxy::Proxy,
    seen: &Seen,
    interval: Duration,
    timeout: Duration,
    configure: impl FnOnce(Worker) -> Worker,
) -> (RunningWorker, tokio::sync::watch::Receiver<Connection>) {
    let runs = seen.runs.clone();
    let acks = seen.acks.clone();
    let worker = Worker::new(format!("http://{}", proxy.addr))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .keep_alive(interval, timeout);
    let worker = configure(worker)
        .on_ack(move |ack| {
            acks.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ack.clone())
        })
        .activity("slow", move |ctx, input| {
            let runs = runs.clone();
            async move {
                let info = ctx.info().clone();
                runs.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((info.activity_id.clone(), info.attempt));
                let ms: serde_json::Value = serde_json::from_slice(&input.data).unwrap_or_default();
                tokio::time::sleep(Duration::from_millis(ms["ms"].as_u64().unwrap_or(0))).await;
                spool_worker::json(&serde_json::json!({ "attempt": info.attempt }))
            }
        });
    let connection = worker.connection();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone()));
    (RunningWorker { stop, _task: task }, connection)
}

/// Stops its worker when dropped.
struct RunningWorker {
    stop: tokio_util::sync::CancellationToken,
    _task: tokio::task::JoinHandle<Result<(), spool_worker::Error>>,
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn slow(activity_id: &str, ms: u64) -> v1::SubmitRequest {
    v1::SubmitRequest {
        input: Some(json(serde_json::json!({ "ms": ms }))),
        retry_policy: fast_retries(5),
        ..request("slow", "wf", activity_id)
    }
}

/// Waits for the worker to lose its connection, then for the next one: whether it
/// resumed the session.
async fn reconnected(connection: &mut tokio::sync::watch::Receiver<Connection>) -> bool {
    tokio::time::timeout(
        WAIT,
        connection.wait_for(|c| matches!(c, Connection::Connecting)),
    )
    .await
    .expect("the drop noticed in time")
    .expect("the worker runs");
    connected(connection).await
}

/// Waits for the worker to stop, within its shutdown timeout.
async fn stopped(connection: &mut tokio::sync::watch::Receiver<Connection>) {
    tokio::time::timeout(
        Duration::from_secs(10),
        connection.wait_for(|c| matches!(c, Connection::Stopped)),
    )
    .await
    .expect("the worker stops within its shutdown timeout")
    .expect("the worker's state");
}

async fn connected(connection: &mut tokio::sync::watch::Receiver<Connection>) -> bool {
    let state = tokio::time::timeout(
        WAIT,
        connection.wait_for(|c| matches!(c, Connection::Connected { .. })),
    )
    .await
    .expect("connected in time")
    .expect("the worker runs")
    .clone();
    matches!(state, Connection::Connected { resumed: true, .. })
}

/// A 5 s activity whose connection is cut at 1 s, and refused for 1 s more:
/// the worker resumes its session, and attempt 1 completes, run and recorded once.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_within_the_grace_costs_nothing() {
    let mut run = slow_run(Duration::from_secs(5), Duration::from_secs(1), "a", 5_000).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    run.proxy.cut_off();
    tokio::time::sleep(Duration::from_secs(1)).await;
    run.proxy.up();
    assert!(
        connected(&mut run.connection).await,
        "the session was resumed"
    );
    let done = wait(&mut run.client, key("wf", "a")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
    assert_eq!(run.seen.runs(), [("a".to_owned(), 1)], "run once");
    eventually("the result's ack", || async {
        (run.seen.accepted("a", 1) == 1).then_some(())
    })
    .await;
    let history = get_with_history(&mut run.client, key("wf", "a"))
        .await
        .history;
    assert_eq!(history.len(), 1, "one attempt: {history:?}");
}

/// The handler finishes while the worker is cut off: its result waits in the
/// worker and is recorded after the resume, exactly once.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_produced_while_disconnected_is_recorded_once() {
    let mut run = slow_run(Duration::from_secs(5), Duration::from_secs(1), "b", 800).await;
    run.proxy.cut_off();
    // The handler ends 800 ms in, while no connection can be made.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let meanwhile = get(&mut run.client, key("wf", "b")).await;
    assert_eq!(
        status(&meanwhile),
        v1::ActivityStatus::Running,
        "waiting for the worker"
    );
    run.proxy.up();
    let done = wait(&mut run.client, key("wf", "b")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
    eventually("the result's ack", || async {
        (run.seen.accepted("b", 1) == 1).then_some(())
    })
    .await;
    assert_eq!(run.seen.runs(), [("b".to_owned(), 1)]);
}

/// A server that resumes no session (a grace of 0 gives the worker no token):
/// after a cut, the worker's new session tells the old one's handlers to stop,
/// since the server ended their attempts when the stream dropped, and keeps none
/// of the old results to send again.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_grace_a_new_session_stops_the_handlers_of_the_old_one() {
    let (server, proxy) = behind_proxy(Duration::ZERO, Duration::from_secs(1)).await;
    let started = Arc::new(AtomicU32::new(0));
    let stopped = Arc::new(Mutex::new(None));
    let (s, st) = (started.clone(), stopped.clone());
    let worker = Worker::new(format!("http://{}", proxy.addr))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .keep_alive(Duration::from_millis(200), Duration::from_millis(300))
        .activity("patient", move |ctx, _| {
            let (s, st) = (s.clone(), st.clone());
            async move {
                s.fetch_add(1, Ordering::SeqCst);
                tokio::select! {
                    () = ctx.cancelled() => {
                        *st.lock().unwrap_or_else(|e| e.into_inner()) = ctx.cancel_reason();
                    }
                    () = tokio::time::sleep(Duration::from_secs(30)) => {}
                }
                spool_worker::json(&serde_json::json!({}))
            }
        });
    let mut connection = worker.connection();
    let stop = tokio_util::sync::CancellationToken::new();
    let _worker = RunningWorker {
        stop: stop.clone(),
        _task: tokio::spawn(worker.run(stop)),
    };
    assert!(!connected(&mut connection).await, "a first session");
    let mut client = server.client().await;
    submit_with_retries(&mut client, "patient", "p", 1).await;
    eventually("the attempt to start", || async {
        (started.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    proxy.cut();
    assert!(!reconnected(&mut connection).await, "a new session");
    eventually("the old handler to be told to stop", || async {
        stopped
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(|reason| {
                assert!(
                    matches!(reason, spool_worker::CancelReason::EndedElsewhere(_)),
                    "{reason:?}"
                )
            })
    })
    .await;
}

/// The worker is told to shut down while its connection is cut, an attempt
/// still running: it does not give the session up, but reconnects within its
/// shutdown timeout, resumes, and reports the attempt, recorded once, before it
/// stops.
#[tokio::test(flavor = "multi_thread")]
async fn a_shutdown_while_cut_off_still_reports_what_runs() {
    let (server, proxy) = behind_proxy(Duration::from_secs(5), Duration::from_secs(1)).await;
    let seen = Seen::default();
    // The cut resets the connection, so it needs no ping to be noticed; slow
    // pings keep a loaded machine from taking the resumed stream for a stalled one.
    let (worker, mut connection) = slow_worker_with(
        &proxy,
        &seen,
        Duration::from_secs(2),
        Duration::from_secs(3),
        |w| w.shutdown_timeout(Duration::from_secs(5)),
    );
    connected(&mut connection).await;
    let mut client = server.client().await;
    submit(&mut client, slow("s", 1_500)).await;
    seen.first_run().await;
    proxy.cut_off();
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.stop.cancel();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.up();
    let done = wait(&mut client, key("wf", "s")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
    assert_eq!(seen.runs(), [("s".to_owned(), 1)], "run once");
    stopped(&mut connection).await;
}

/// A worker that said Goodbye and lost its stream resumes its session to report
/// the attempt it ran: the attempt completes, counted once, instead of failing
/// as lost; the resumed session stays leaving and is handed no new task.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_that_said_goodbye_resumes_to_report_and_takes_no_new_task() {
    // One node: the session must be this node's to resume it leaving.
    let server = TestServer::one_node_with(|c| c.resume_grace = Some(Duration::from_secs(5))).await;
    let mut client = server.client().await;
    let (mut first, (worker_id, token), task) = holding_one(&server, &mut client, "g").await;
    first
        .send(worker_message::Message::Goodbye(v1::Goodbye {}))
        .await;
    assert!(
        matches!(first.next().await, server_message::Message::Drain(_)),
        "Goodbye is answered with Drain"
    );
    drop(first);
    let mut resumed = RawWorker::open(&server, resume_hello(&worker_id, &token, &[("g", 1)]))
        .await
        .expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    submit(&mut client, request("raw", "wf", "other")).await;
    resumed.quiet_for(Duration::from_millis(500)).await;
    resumed.complete(&task, 1).await;
    let ack = resumed.ack().await;
    assert!(ack.accepted, "{ack:?}");
    let done = get(&mut client, key("wf", "g")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
}

/// The SDK's side: a worker shutting down whose connection is cut after its
/// Goodbye keeps its handler running (it honours cancellation), resumes, and
/// reports; the attempt completes once.
#[tokio::test(flavor = "multi_thread")]
async fn a_cut_after_goodbye_neither_cancels_the_handler_nor_loses_the_attempt() {
    let (server, proxy) = behind_proxy(Duration::from_secs(5), Duration::from_secs(1)).await;
    let runs = Count::default();
    let counted = runs.clone();
    let worker = Worker::new(format!("http://{}", proxy.addr))
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
        .keep_alive(Duration::from_secs(2), Duration::from_secs(3))
        .shutdown_timeout(Duration::from_secs(5))
        .activity("slow", move |ctx, _| {
            counted.bump();
            async move {
                tokio::select! {
                    () = ctx.cancelled() => Err(spool_worker::ActivityError::terminal("cancelled", "stopped early")),
                    () = tokio::time::sleep(Duration::from_millis(1_500)) => spool_worker::json(&"done"),
                }
            }
        });
    let mut connection = worker.connection();
    let stop = tokio_util::sync::CancellationToken::new();
    let _task = tokio::spawn(worker.run(stop.clone()));
    connected(&mut connection).await;
    let mut client = server.client().await;
    submit(
        &mut client,
        v1::SubmitRequest {
            retry_policy: fast_retries(1),
            ..slow("g", 1_500)
        },
    )
    .await;
    eventually("the attempt to start", || async {
        (runs.get() == 1).then_some(())
    })
    .await;
    stop.cancel();
    // Goodbye and its Drain cross before the cut.
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.cut_off();
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.up();
    let done = wait(&mut client, key("wf", "g")).await;
    assert_eq!(
        (status(&done), done.attempt, done.last_error),
        (v1::ActivityStatus::Completed, 1, None)
    );
    assert_eq!(runs.get(), 1, "run once");
    stopped(&mut connection).await;
}

/// A cut longer than the grace: attempt 1 is lost, attempt 2 runs on another
/// worker, and attempt 1's late result is refused.
#[tokio::test(flavor = "multi_thread")]
async fn past_the_grace_the_attempt_runs_elsewhere_and_the_late_result_is_refused() {
    let mut run = slow_run(
        Duration::from_millis(500),
        Duration::from_secs(1),
        "c",
        2_500,
    )
    .await;
    let direct = Count::default();
    let counted = direct.clone();
    let _other = run.server.worker(move |w| {
        w.activity("slow", move |ctx, _| {
            counted.bump();
            async move { spool_worker::json(&serde_json::json!({ "attempt": ctx.info().attempt })) }
        })
    });
    run.proxy.cut_off();
    let done = wait(&mut run.client, key("wf", "c")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 2));
    assert_eq!(
        done.last_error.map(|e| e.kind),
        Some(v1::ErrorKind::WorkerLost as i32)
    );
    assert_eq!(direct.get(), 1);
    run.proxy.up();
    // The first worker reconnects with a new session; its attempt 1 finishes and
    // its result is refused.
    eventually("attempt 1's late result to be refused", || async {
        run.seen.refused("c", 1).then_some(())
    })
    .await;
    let still = get(&mut run.client, key("wf", "c")).await;
    assert_eq!(outcome(&still), (v1::ActivityStatus::Completed, 2));
    assert_eq!(run.seen.accepted("c", 1), 0);
}

/// A black-holed connection (bytes held, nothing closed): the worker's pings go
/// unanswered, it reconnects and resumes before the server would count it silent,
/// and attempt 1 completes once.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_connection_is_detected_and_resumed() {
    // Silent for three heartbeat intervals (6 s) would be lost; the worker sees
    // the stall within half a second.
    let mut run = slow_run(Duration::from_secs(5), Duration::from_secs(2), "d", 2_000).await;
    run.proxy.stall();
    assert!(
        reconnected(&mut run.connection).await,
        "resumed over a new connection"
    );
    let done = wait(&mut run.client, key("wf", "d")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
    assert_eq!(run.seen.runs(), [("d".to_owned(), 1)]);
    run.proxy.cut();
}

/// A raw worker of two slots for "raw" holding the one attempt `id` may have
/// (workflow "wf"): the worker, its session (id and resume token), and the task.
async fn holding_one(
    server: &TestServer,
    client: &mut Calls,
    id: &str,
) -> (RawWorker, (String, String), v1::ActivityTask) {
    let mut worker = RawWorker::connect(server, &["raw"], 2).await;
    let session = session_of(&worker);
    submit_with_retries(client, "raw", id, 1).await;
    let task = worker.task().await;
    (worker, session, task)
}

/// A raw worker of two slots for "raw" holding the tasks of `a` and `b`
/// (workflow "wf"): the worker, its session (id and resume token), and the two
/// tasks in that order.
async fn holding_two(
    server: &TestServer,
    client: &mut Calls,
    a: &str,
    b: &str,
) -> (
    RawWorker,
    (String, String),
    (v1::ActivityTask, v1::ActivityTask),
) {
    let mut worker = RawWorker::connect(server, &["raw"], 2).await;
    let session = session_of(&worker);
    submit(client, request("raw", "wf", a)).await;
    submit(client, request("raw", "wf", b)).await;
    let (one, two) = (worker.task().await, worker.task().await);
    let tasks = if one.activity_id == a {
        (one, two)
    } else {
        (two, one)
    };
    (worker, session, tasks)
}

/// The worker id and resume token a session was welcomed with.
fn session_of(worker: &RawWorker) -> (String, String) {
    (
        worker.welcome.worker_id.clone(),
        worker.welcome.resume_token.clone(),
    )
}

fn resume_hello(worker_id: &str, token: &str, held: &[(&str, u32)]) -> worker_message::Message {
    worker_message::Message::Hello(v1::Hello {
        resume_worker_id: worker_id.to_owned(),
        resume_token: token.to_owned(),
        held: held
            .iter()
            .map(|(id, attempt)| v1::AttemptRef {
                workflow_id: "wf".into(),
                activity_id: (*id).into(),
                attempt: *attempt,
            })
            .collect(),
        ..hello(&["raw"], 2)
    })
}

/// A forged token, and a token used once already, are refused: the worker gets a
/// new session, and the session they named keeps its attempt.
#[tokio::test(flavor = "multi_thread")]
async fn forged_and_replayed_resume_tokens_are_refused_and_change_nothing() {
    // One node: each refusal must come from the node holding the session.
    let server = TestServer::one_node_with(|c| c.resume_grace = Some(Duration::from_secs(5))).await;
    let mut client = server.client().await;
    let mut first = RawWorker::connect(&server, &["raw"], 2).await;
    let (worker_id, token) = session_of(&first);
    assert_eq!(token.len(), 64, "256 bits, hex");
    submit(&mut client, request("raw", "wf", "r")).await;
    let task = first.task().await;

    let forged = RawWorker::open(
        &server,
        resume_hello(&worker_id, &"0".repeat(64), &[("r", 1)]),
    )
    .await
    .expect("a session");
    assert!(!forged.welcome.resumed);
    assert_ne!(forged.welcome.worker_id, worker_id, "a new session");
    assert!(
        forged.welcome.resume_refused.contains("token"),
        "{:?}",
        forged.welcome
    );
    drop(forged);

    // The real session still holds its attempt: it completes through it.
    first.complete(&task, 1).await;
    assert!(first.ack().await.accepted);

    // Its stream drops; it resumes once with its token...
    submit(&mut client, request("raw", "wf", "s")).await;
    let task = first.task().await;
    drop(first);
    let mut resumed = RawWorker::open(&server, resume_hello(&worker_id, &token, &[("s", 1)]))
        .await
        .expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    assert_eq!(resumed.welcome.worker_id, worker_id);
    assert_ne!(resumed.welcome.resume_token, token, "a new token each time");
    // ... and that token, replayed, is refused while the resumed stream goes on.
    let replay = RawWorker::open(&server, resume_hello(&worker_id, &token, &[("s", 1)]))
        .await
        .expect("a session");
    assert!(!replay.welcome.resumed);
    drop(replay);
    resumed.complete(&task, 1).await;
    assert!(
        resumed.ack().await.accepted,
        "the resumed stream's result counts"
    );
    let done = wait(&mut client, key("wf", "s")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
}

/// A task dispatched while the worker's stream was down is sent again on the
/// resumed stream; an attempt the worker still has that the server ended is
/// cancelled again.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_resends_missing_tasks_and_repeats_cancels() {
    let server = TestServer::start_with(|c| c.resume_grace = Some(Duration::from_secs(5))).await;
    let mut client = server.client().await;
    let (first, (worker_id, token), (cancelled, lost)) =
        holding_two(&server, &mut client, "kept", "unseen").await;
    drop(first);
    cancel(&mut client, key("wf", &cancelled.activity_id), "not needed")
        .await
        .expect("cancel");
    // The worker says it has the cancelled attempt, not the other one.
    let mut resumed = RawWorker::open(
        &server,
        resume_hello(&worker_id, &token, &[(&cancelled.activity_id, 1)]),
    )
    .await
    .expect("a session");
    assert!(resumed.welcome.resumed);
    let (resent, cancel) = resumed.task_and_cancel().await;
    assert_eq!(
        (resent.activity_id, resent.attempt),
        (lost.activity_id.clone(), 1)
    );
    assert_eq!(cancel.activity_id, cancelled.activity_id.clone());
    resumed.complete(&lost, 1).await;
    assert!(resumed.ack().await.accepted);
}

/// A result recorded just before the stream dropped, its ack lost with the
/// stream: sent again on the resumed stream, it is acknowledged as accepted, and
/// nothing is written twice. A result of an attempt the server ended meanwhile (a
/// cancel) is still refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_whose_ack_was_lost_is_accepted_when_sent_again_after_a_resume() {
    let server = TestServer::start_with(|c| c.resume_grace = Some(Duration::from_secs(5))).await;
    let mut client = server.client().await;
    let (first, (worker_id, token), (done, stopped)) =
        holding_two(&server, &mut client, "done", "stopped").await;
    first.complete(&done, 1).await;
    let recorded = wait(&mut client, key("wf", "done")).await;
    assert_eq!(status(&recorded), v1::ActivityStatus::Completed);
    // The stream drops before the worker reads the ack.
    drop(first);
    cancel(&mut client, key("wf", "stopped"), "not needed")
        .await
        .expect("cancel");
    let mut resumed = RawWorker::open(
        &server,
        resume_hello(&worker_id, &token, &[("done", 1), ("stopped", 1)]),
    )
    .await
    .expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    let mut cancelled = Vec::new();
    while cancelled.len() < 2 {
        match resumed.next().await {
            server_message::Message::Cancel(c) => cancelled.push(c.activity_id),
            other => panic!("expected two cancels, got {other:?}"),
        }
    }
    cancelled.sort();
    assert_eq!(cancelled, ["done", "stopped"]);
    resumed.complete(&done, 1).await;
    let ack = resumed.ack().await;
    assert_eq!(
        (ack.activity_id.as_str(), ack.accepted),
        ("done", true),
        "{ack:?}"
    );
    resumed.complete(&stopped, 1).await;
    let ack = resumed.ack().await;
    assert_eq!(
        (ack.activity_id.as_str(), ack.accepted),
        ("stopped", false),
        "{ack:?}"
    );
    let again = get_with_history(&mut client, key("wf", "done")).await;
    assert_eq!(
        (status(&again), again.attempt, again.finished_at),
        (v1::ActivityStatus::Completed, 1, recorded.finished_at),
        "written once"
    );
    assert_eq!(again.history.len(), 1, "{:?}", again.history);
    assert_eq!(
        status(&get(&mut client, key("wf", "stopped")).await),
        v1::ActivityStatus::Cancelled
    );
}

/// A result whose first write failed, and is being tried again, when the worker
/// (its stream dropped) sends it again: the ack waits for that write, and says
/// accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_result_sent_again_while_its_first_write_is_retried_is_accepted_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = resuming_on(&faulty).await;
    let mut client = server.client().await;
    // The session holds an attempt still running, so it can be resumed.
    let (first, (worker_id, token), (task, _)) =
        holding_two(&server, &mut client, "retried", "running").await;
    // Every write of an ending fails until the test says otherwise.
    faulty.failed_endings.store(usize::MAX, Ordering::SeqCst);
    first.complete(&task, 1).await;
    eventually("the result's first write to fail", || async {
        (faulty.failed_endings.load(Ordering::SeqCst) < usize::MAX).then_some(())
    })
    .await;
    drop(first);
    let mut resumed = RawWorker::open(
        &server,
        resume_hello(&worker_id, &token, &[("retried", 1), ("running", 1)]),
    )
    .await
    .expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    let cancel = resumed.next().await;
    assert!(
        matches!(&cancel, server_message::Message::Cancel(c) if c.activity_id == "retried"),
        "the attempt is no longer the session's: {cancel:?}"
    );
    resumed.complete(&task, 1).await;
    resumed.quiet_for(Duration::from_millis(500)).await;
    faulty.failed_endings.store(0, Ordering::SeqCst);
    let ack = resumed.ack().await;
    assert_eq!(
        (ack.activity_id.as_str(), ack.accepted),
        ("retried", true),
        "{ack:?}"
    );
    let done = get(&mut client, key("wf", "retried")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
}

/// A session whose call is dropped (the connection reset) while its ticket is
/// being saved leaves no registration behind: none holding the slot, none whose
/// leases are renewed with nothing running.
#[tokio::test(flavor = "multi_thread")]
async fn a_session_dropped_while_its_ticket_is_saved_leaves_nothing_registered() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    faulty.shared.store(true, Ordering::SeqCst);
    let server = resuming_on(&faulty).await;
    faulty.hold_tickets(true);
    dropped_while_saving_its_ticket(
        &server,
        &faulty,
        worker_message::Message::Hello(hello(&["raw"], 2)),
    )
    .await;
    eventually("the registration to be removed", || async {
        server.workers().await.ok()?.is_empty().then_some(())
    })
    .await;
}

/// The same on a resume: the session's attempt is lost once after the grace, as
/// for any dropped stream, rather than left RUNNING with its lease renewed.
#[tokio::test(flavor = "multi_thread")]
async fn a_resume_dropped_while_its_ticket_is_saved_loses_its_attempt_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    faulty.shared.store(true, Ordering::SeqCst);
    let server = TestServer::on_store(faulty.clone(), |c| {
        c.resume_grace = Some(Duration::from_secs(1))
    })
    .await;
    let mut client = server.client().await;
    let (first, (worker_id, token), _) = holding_one(&server, &mut client, "r").await;
    faulty.hold_tickets(true);
    drop(first);
    dropped_while_saving_its_ticket(
        &server,
        &faulty,
        resume_hello(&worker_id, &token, &[("r", 1)]),
    )
    .await;
    let ended = wait(&mut client, key("wf", "r")).await;
    assert_eq!(
        outcome(&ended),
        (v1::ActivityStatus::Failed, 1),
        "{ended:?}"
    );
    assert_eq!(
        ended.last_error.map(|e| e.kind),
        Some(v1::ErrorKind::WorkerLost as i32)
    );
    eventually("the registration to be removed", || async {
        server.workers().await.ok()?.is_empty().then_some(())
    })
    .await;
}

/// Opens a session with `first`, and drops the call once the server is saving
/// its ticket (held by the test), before any Welcome.
async fn dropped_while_saving_its_ticket(
    server: &TestServer,
    faulty: &Faulty,
    first: worker_message::Message,
) {
    let saving = faulty.tickets_saving.load(Ordering::SeqCst);
    let opening = RawWorker::open(server, first);
    tokio::pin!(opening);
    tokio::select! {
        opened = &mut opening => panic!("welcomed while its ticket is held: {:?}", opened.map(|w| w.welcome)),
        () = eventually("the ticket's save to begin", || async {
            (faulty.tickets_saving.load(Ordering::SeqCst) > saving).then_some(())
        }) => {}
    }
}

/// One node on a store with faults the test switches on, that resumes sessions.
async fn resuming_on(faulty: &Arc<Faulty>) -> TestServer {
    TestServer::on_store(faulty.clone(), |c| {
        c.resume_grace = Some(Duration::from_secs(5))
    })
    .await
}

/// A worker of one slot whose stream drops as a task arrives: it resumes without
/// it, and the server must send it again.
async fn resume_lacking_a_task(
    server: &TestServer,
    client: &mut v1::activity_service_client::ActivityServiceClient<tonic::transport::Channel>,
) -> RawWorker {
    let mut first = RawWorker::connect(server, &["raw"], 1).await;
    let (worker_id, token) = session_of(&first);
    submit(client, request("raw", "wf", "lacked")).await;
    // It came; the worker resumes saying it never did (lost on the way).
    first.task().await;
    drop(first);
    let hello = worker_message::Message::Hello(v1::Hello {
        resume_worker_id: worker_id.clone(),
        resume_token: token,
        ..hello(&["raw"], 1)
    });
    let resumed = RawWorker::open(server, hello).await.expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    resumed
}

/// The read of a task to send again fails: it is read again, and the task sent,
/// rather than its slot held and its lease renewed with nothing running.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_to_send_again_is_read_again_when_the_read_fails() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = resuming_on(&faulty).await;
    let mut client = server.client().await;
    faulty.failed_gets.store(2, Ordering::SeqCst);
    let mut resumed = resume_lacking_a_task(&server, &mut client).await;
    let task = tokio::time::timeout(Duration::from_secs(10), resumed.task())
        .await
        .expect("the task, sent again once a read succeeds");
    assert_eq!((task.activity_id.as_str(), task.attempt), ("lacked", 1));
    resumed.complete(&task, 1).await;
    assert!(resumed.ack().await.accepted);
}

/// The task to send again ended before it was read (cancelled): the worker never
/// had it, so it will not answer the cancel; its slot is freed for the next task.
#[tokio::test(flavor = "multi_thread")]
async fn a_task_to_send_again_that_ended_meanwhile_frees_its_slot() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = resuming_on(&faulty).await;
    let mut client = server.client().await;
    faulty.hold_gets(true);
    let mut resumed = resume_lacking_a_task(&server, &mut client).await;
    cancel(&mut client, key("wf", "lacked"), "not needed")
        .await
        .expect("cancel");
    faulty.hold_gets(false);
    submit(&mut client, request("raw", "wf", "next")).await;
    let task = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match resumed.next().await {
                server_message::Message::Task(task) => return task,
                // The cancel of the attempt it never had; nothing to answer.
                server_message::Message::Cancel(_) => {}
                other => panic!("expected a task, got {other:?}"),
            }
        }
    })
    .await
    .expect("the slot of the ended task, freed for the next");
    assert_eq!((task.activity_id.as_str(), task.attempt), ("next", 1));
}

/// The server stops a lacked attempt (its start-to-close timeout) while the task
/// is being read again, before the stop is written: the row still reads RUNNING,
/// but the task is not sent after its cancel, where it would run unasked, and its
/// slot is freed.
#[tokio::test(flavor = "multi_thread")]
async fn a_lacked_task_the_server_stopped_meanwhile_is_not_sent_after_its_cancel() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Faulty::in_dir(dir.path()).await;
    let server = TestServer::on_store(faulty.clone(), |c| {
        c.resume_grace = Some(Duration::from_secs(5));
        c.heartbeat_interval = Duration::from_millis(250);
    })
    .await;
    let mut client = server.client().await;
    let mut first = RawWorker::connect(&server, &["raw"], 1).await;
    let (worker_id, token) = session_of(&first);
    let mut short = request("raw", "wf", "lacked");
    short.start_to_close_timeout = Some(prost_types_duration(Duration::from_millis(300)));
    submit(&mut client, short).await;
    first.task().await;
    faulty.hold_gets(true);
    drop(first);
    let hello = worker_message::Message::Hello(v1::Hello {
        resume_worker_id: worker_id,
        resume_token: token,
        ..hello(&["raw"], 1)
    });
    let mut resumed = RawWorker::open(&server, hello).await.expect("a session");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    // The timeout's ending cannot be written; the sweep stops the attempt.
    faulty.hold_endings(true);
    let cancel = tokio::time::timeout(Duration::from_secs(5), resumed.next())
        .await
        .expect("the timeout's cancel");
    assert!(
        matches!(&cancel, server_message::Message::Cancel(c) if c.activity_id == "lacked"),
        "{cancel:?}"
    );
    faulty.hold_gets(false);
    resumed.keep_alive().await;
    let after = tokio::time::timeout(Duration::from_millis(500), resumed.next()).await;
    assert!(after.is_err(), "sent after its cancel: {after:?}");
    faulty.hold_endings(false);
    resumed.keep_alive().await;
    // Nor does it keep the slot: the worker never had it, so never answers it.
    submit(&mut client, request("raw", "wf", "next")).await;
    let next = tokio::time::timeout(Duration::from_secs(5), resumed.next())
        .await
        .expect("a task for the freed slot");
    assert!(matches!(next, server_message::Message::Task(_)), "{next:?}");
}

/// A worker's stream drops while the node drains: it resumes there (a new
/// session would be refused), and the attempt the drain waits for completes,
/// neither released nor run again.
#[tokio::test(flavor = "multi_thread")]
async fn a_worker_resumes_on_a_draining_node_and_its_attempt_completes() {
    let server = TestServer::one_node_with(|c| c.resume_grace = Some(Duration::from_secs(5))).await;
    let mut client = server.client().await;
    let mut first = RawWorker::connect(&server, &["raw"], 2).await;
    let (worker_id, token) = session_of(&first);
    submit(&mut client, request("raw", "wf", "r")).await;
    let task = first.task().await;
    let mut admin = server.admin().await;
    let drain = tokio::spawn(async move {
        admin
            .drain(v1::DrainRequest {
                timeout: Some(prost_types_duration(Duration::from_secs(20))),
            })
            .await
    });
    let told = first.next().await;
    assert!(
        matches!(told, server_message::Message::Drain(_)),
        "expected Drain, got {told:?}"
    );
    drop(first);
    let refused = RawWorker::open(&server, worker_message::Message::Hello(hello(&["raw"], 2)))
        .await
        .err()
        .map(|status| status.code());
    assert_eq!(refused, Some(tonic::Code::Unavailable), "no new session");
    let mut resumed = RawWorker::open(&server, resume_hello(&worker_id, &token, &[("r", 1)]))
        .await
        .expect("the session, resumed while draining");
    assert!(resumed.welcome.resumed, "{:?}", resumed.welcome);
    resumed.complete(&task, 1).await;
    loop {
        match resumed.next().await {
            server_message::Message::Ack(ack) => {
                assert!(ack.accepted, "{ack:?}");
                break;
            }
            server_message::Message::Drain(_) => {}
            other => panic!("expected an ack, got {other:?}"),
        }
    }
    let report = drain
        .await
        .expect("the drain's task")
        .expect("the drain")
        .into_inner();
    assert_eq!((report.completed, report.released), (1, 0));
    let done = get(&mut client, key("wf", "r")).await;
    assert_eq!(outcome(&done), (v1::ActivityStatus::Completed, 1));
}

/// [`two_nodes`] and a slow worker through the proxy, connected to one of them
/// (`holder`).
struct Held {
    holder: TestServer,
    other: TestServer,
    /// The other node's place in the proxy's backends.
    other_index: usize,
    proxy: proxy::Proxy,
    seen: Seen,
    connection: tokio::sync::watch::Receiver<Connection>,
    _worker: RunningWorker,
}

async fn held_by_one_of_two(grace: Duration, drain: Duration) -> Held {
    let (a, b, proxy) = two_nodes(grace, drain).await;
    let seen = Seen::default();
    // Slow pings: on a loaded machine a fast one may miss and move the worker early.
    let (_worker, mut connection) = slow_worker_pinging(
        &proxy,
        &seen,
        Duration::from_secs(2),
        Duration::from_secs(3),
    );
    connected(&mut connection).await;
    let (holder, other, other_index) = if on_first(&a, &b).await {
        (a, b, 1)
    } else {
        (b, a, 0)
    };
    Held {
        holder,
        other,
        other_index,
        proxy,
        seen,
        connection,
        _worker,
    }
}

/// Nodes `node-a` and `node-b` on one fresh PostgreSQL schema, and a proxy that
/// sends the first connection to A, the next to B.
async fn two_nodes(grace: Duration, drain: Duration) -> (TestServer, TestServer, proxy::Proxy) {
    let database = postgres_schema().await;
    let node = |name: &'static str| {
        move |c: &mut spool_server::Config| {
            c.resume_grace = Some(grace);
            c.drain_timeout = drain;
            c.node_name = Some(name.to_owned());
        }
    };
    let a = TestServer::start_on_database_with(&database, node("node-a")).await;
    let b = TestServer::start_on_database_with(&database, node("node-b")).await;
    let addr = |s: &TestServer| {
        s.endpoint
            .trim_start_matches("http://")
            .parse()
            .expect("a socket address")
    };
    let proxy = proxy::Proxy::start(vec![addr(&a), addr(&b)])
        .await
        .expect("proxy");
    (a, b, proxy)
}

/// On PostgreSQL, a worker whose connection a balancer moves from node A to node B
/// mid-attempt resumes its session on B, which takes the attempt over through the
/// database; A, alive, lets it go when its grace runs out (its ending is fenced to
/// rows still its own): attempt 1 completes, run once, never lost.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_session_moves_to_another_node_with_its_attempt() {
    let Held {
        holder: from,
        other: to,
        other_index: to_index,
        proxy,
        seen,
        mut connection,
        _worker,
    } = held_by_one_of_two(Duration::from_secs(1), Duration::from_secs(1)).await;
    let to_name = ["node-a", "node-b"][to_index];
    let mut client = from.client().await;
    submit(&mut client, slow("moved", 3_000)).await;
    seen.first_run().await;
    proxy.send_next_to(to_index);
    proxy.cut();
    assert!(
        reconnected(&mut connection).await,
        "resumed on the other node"
    );
    to.await_workers(1).await;
    let done = wait(&mut client, key("wf", "moved")).await;
    assert_eq!(
        outcome(&done),
        (v1::ActivityStatus::Completed, 1),
        "{done:?}"
    );
    assert!(done.last_error.is_none(), "never lost: {done:?}");
    assert_eq!(seen.runs(), [("moved".to_owned(), 1)]);
    let history = get_with_history(&mut client, key("wf", "moved"))
        .await
        .history;
    assert_eq!(
        history
            .iter()
            .map(|h| (h.attempt, h.outcome.as_str(), h.node.as_str()))
            .collect::<Vec<_>>(),
        [(1, "completed", to_name)]
    );
}

/// After a worker's session moves from node A to node B, A's copy of the attempt
/// hears no more heartbeats: its heartbeat timeout passes there while the worker
/// heartbeats to B. A's ending is fenced to rows still its own, so the attempt
/// the worker runs on B is not ended as timed out, and completes.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn the_node_a_session_left_does_not_time_out_the_attempt_it_moved_with() {
    let (a, b, _proxy) = two_nodes(Duration::from_secs(5), Duration::from_secs(1)).await;
    let mut client = a.client().await;
    let mut first = RawWorker::connect(&a, &["raw"], 2).await;
    let (worker_id, token) = session_of(&first);
    submit(
        &mut client,
        v1::SubmitRequest {
            heartbeat_timeout: Some(prost_types_duration(Duration::from_secs(1))),
            retry_policy: fast_retries(1),
            ..request("raw", "wf", "hb")
        },
    )
    .await;
    let task = first.task().await;
    drop(first);
    let mut moved = RawWorker::open(&b, resume_hello(&worker_id, &token, &[("hb", 1)]))
        .await
        .expect("a session");
    assert!(moved.welcome.resumed, "{:?}", moved.welcome);
    // Three heartbeat timeouts, heartbeating to B all along.
    let beats = std::time::Instant::now();
    while beats.elapsed() < Duration::from_secs(3) {
        moved
            .send(worker_message::Message::Heartbeat(v1::Heartbeat {
                workflow_id: "wf".into(),
                activity_id: "hb".into(),
                attempt: 1,
                ..Default::default()
            }))
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    moved.complete(&task, 1).await;
    let ack = loop {
        match moved.next().await {
            server_message::Message::Ack(ack) => break ack,
            server_message::Message::Cancel(c) => panic!("the moved attempt was stopped: {c:?}"),
            _ => {}
        }
    };
    assert!(ack.accepted, "{ack:?}");
    let done = get(&mut client, key("wf", "hb")).await;
    assert_eq!(
        (status(&done), done.attempt, done.last_error),
        (v1::ActivityStatus::Completed, 1, None)
    );
}

/// Whether the one worker is connected to `a` (else to `b`), once it is on one.
async fn on_first(a: &TestServer, b: &TestServer) -> bool {
    let (admin_a, admin_b) = (a.admin().await, b.admin().await);
    eventually("the worker to be on a node", || {
        let (mut admin_a, mut admin_b) = (admin_a.clone(), admin_b.clone());
        async move {
            let on_a = workers(&mut admin_a).await.map_or(0, |w| w.len());
            let on_b = workers(&mut admin_b).await.map_or(0, |w| w.len());
            match (on_a, on_b) {
                (1, 0) => Some(true),
                (0, 1) => Some(false),
                _ => None,
            }
        }
    })
    .await
}

/// On PostgreSQL, a node that stops (a deploy) with a longer attempt still running
/// hands the session over instead of releasing the attempt: the worker, told to
/// drain, keeps running it, resumes on the other node when its stream ends, and
/// attempt 1 completes there, run once.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_stopping_node_hands_its_sessions_over() {
    let Held {
        mut holder,
        other,
        other_index,
        proxy,
        seen,
        mut connection,
        _worker,
    } = held_by_one_of_two(Duration::from_secs(2), Duration::from_millis(300)).await;
    let mut client = other.client().await;
    submit(&mut client, slow("deploy", 2_500)).await;
    seen.first_run().await;
    proxy.send_next_to(other_index);
    holder.shutdown().await;
    assert!(
        reconnected(&mut connection).await,
        "resumed on the other node"
    );
    let done = wait(&mut client, key("wf", "deploy")).await;
    assert_eq!(
        (status(&done), done.attempt, done.counted_attempts),
        (v1::ActivityStatus::Completed, 1, 1),
        "not released, not retried: {done:?}"
    );
    assert_eq!(seen.runs(), [("deploy".to_owned(), 1)]);
}

/// On PostgreSQL, a node that stops alone on its database (no other node heard
/// from) releases a running attempt, uncounted, as a single node does. Left
/// running for a hand-over no node could take, the attempt would be reclaimed as
/// lost, counted, by the node started again before its worker was back.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_node_stopping_alone_releases_instead_of_handing_over() {
    let database = postgres_schema().await;
    let configure = |c: &mut spool_server::Config| {
        c.resume_grace = Some(Duration::from_secs(2));
        c.drain_timeout = Duration::from_millis(300);
    };
    let mut node = TestServer::start_on_database_with(&database, configure).await;
    let mut client = node.client().await;
    submit(&mut client, request("t", "wf", "alone")).await;
    let mut worker = RawWorker::connect(&node, &["t"], 1).await;
    let task = worker.task().await;
    assert_eq!(task.attempt, 1);
    node.shutdown().await;
    let again = TestServer::start_on_database_with(&database, configure).await;
    let mut client = again.client().await;
    let row = get(&mut client, key("wf", "alone")).await;
    assert_eq!(
        (status(&row), row.attempt, row.counted_attempts),
        (v1::ActivityStatus::Scheduled, 1, 0),
        "released, uncounted: {row:?}"
    );
}

/// On PostgreSQL, every node stopping at once: each hears the others say they
/// are draining, so none hands its sessions to a node that is leaving too. The
/// running attempt is released, uncounted, and runs again after the restart
/// rather than failing as lost.
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn nodes_stopping_together_release_instead_of_handing_over_to_each_other() {
    let (mut a, mut b, _proxy) =
        two_nodes(Duration::from_secs(2), Duration::from_millis(500)).await;
    let mut client = a.client().await;
    submit_with_retries(&mut client, "raw", "together", 1).await;
    let mut worker = RawWorker::connect(&a, &["raw"], 1).await;
    assert_eq!(worker.task().await.attempt, 1);
    // Both have heard each other before they stop.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    tokio::join!(a.shutdown(), b.shutdown());
    drop(worker);
    let again = TestServer::start_on_database_with(&a.database, |c| {
        c.resume_grace = Some(Duration::from_secs(2))
    })
    .await;
    let mut client = again.client().await;
    let row = get(&mut client, key("wf", "together")).await;
    assert_eq!(
        (status(&row), row.attempt, row.counted_attempts),
        (v1::ActivityStatus::Scheduled, 1, 0),
        "released, uncounted: {row:?}"
    );
}

/// Each run's activity id, attempt and input.
type RunsWithInput = Arc<Mutex<Vec<(String, u32, Vec<u8>)>>>;

/// On PostgreSQL, a session that moves to another node while its first node holds
/// rows claimed ahead for it (claimed and counted, not yet sent): the new node
/// takes over the attempts the worker holds and gives the rest back, and every
/// activity runs with its own input, once per attempt, and completes with it.
/// (The rows a takeover reads carry no payloads; one kept ahead from them was once
/// sent with an empty input.)
#[tokio::test(flavor = "multi_thread")]
#[cfg_attr(not(spool_test_postgres), ignore = "needs PostgreSQL: docs/TESTING.md")]
async fn a_session_moved_with_rows_claimed_ahead_runs_each_with_its_input() {
    const N: usize = 2_000;
    let (a, b, proxy) = two_nodes(Duration::from_secs(1), Duration::from_secs(1)).await;
    let runs: RunsWithInput = Arc::default();
    let worker = {
        let runs = runs.clone();
        Worker::new(format!("http://{}", proxy.addr))
            .max_concurrency(8)
            .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(100))
            .keep_alive(Duration::from_secs(2), Duration::from_secs(3))
            .activity("echo", move |ctx, input| {
                let runs = runs.clone();
                async move {
                    let info = ctx.info().clone();
                    runs.lock().unwrap_or_else(|e| e.into_inner()).push((
                        info.activity_id,
                        info.attempt,
                        input.data.clone(),
                    ));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok(input)
                }
            })
    };
    let mut connection = worker.connection();
    let stop = tokio_util::sync::CancellationToken::new();
    let _worker = RunningWorker {
        stop: stop.clone(),
        _task: tokio::spawn(worker.run(stop)),
    };
    connected(&mut connection).await;
    let (from, to, to_index) = if on_first(&a, &b).await {
        (a, b, 1)
    } else {
        (b, a, 0)
    };
    let mut client = from.client().await;
    for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
        client
            .submit_batch(v1::SubmitBatchRequest {
                activities: chunk
                    .iter()
                    .map(|i| request("echo", "wf", &format!("e{i}")))
                    .collect(),
            })
            .await
            .expect("submit a batch");
    }
    stats_until(
        &client,
        WAIT,
        "rows claimed ahead on the worker's node",
        |s| s.claimed_ahead > 0,
    )
    .await;
    proxy.send_next_to(to_index);
    proxy.cut();
    assert!(
        reconnected(&mut connection).await,
        "resumed on the other node"
    );
    let mut other = to.client().await;
    let stats = stats_until(
        &other,
        Duration::from_secs(60),
        "every activity to end",
        |s| s.completed + s.failed + s.cancelled == N as u64,
    )
    .await;
    assert_eq!((stats.completed, stats.failed), (N as u64, 0), "{stats:?}");

    let runs = runs.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut attempts = std::collections::HashSet::new();
    for (id, attempt, input) in &runs {
        let want = json(serde_json::json!({ "id": id })).data;
        assert_eq!(
            input, &want,
            "{id} attempt {attempt} ran with its own input"
        );
        assert!(
            attempts.insert((id.clone(), *attempt)),
            "{id} attempt {attempt} ran twice"
        );
    }
    let mut page_token = String::new();
    let mut completed = 0;
    loop {
        let page = other
            .list(v1::ListRequest {
                status: v1::ActivityStatus::Completed as i32,
                page_size: 500,
                page_token,
                ..Default::default()
            })
            .await
            .expect("list")
            .into_inner();
        for activity in &page.activities {
            let id = activity
                .key
                .as_ref()
                .map(|k| k.activity_id.as_str())
                .unwrap_or("");
            assert_eq!(
                activity.output.as_ref().map(|o| o.data.clone()),
                Some(json(serde_json::json!({ "id": id })).data),
                "{id} completed with its own input"
            );
            completed += 1;
        }
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(completed, N);
}
