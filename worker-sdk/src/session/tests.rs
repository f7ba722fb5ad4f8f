//! Tests of `session`.

use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU32, Ordering},
};

use super::*;
use crate::Payload;

/// The loop over channels: what the server sends, and what the worker sends.
struct Harness {
    to_worker: mpsc::Sender<Result<ServerMessage, Status>>,
    from_worker: mpsc::Receiver<WorkerMessage>,
}

impl Harness {
    async fn send(&self, message: server_message::Message) {
        self.to_worker
            .send(Ok(ServerMessage {
                message: Some(message),
            }))
            .await
            .unwrap_or_else(|_| panic!("the loop stopped reading"));
    }

    /// The next message the worker sends that is not a keep-alive; `None` once
    /// it closed its side.
    async fn next(&mut self) -> Option<worker_message::Message> {
        loop {
            let m = tokio::time::timeout(Duration::from_secs(10), self.from_worker.recv())
                .await
                .unwrap_or_else(|_| panic!("nothing from the worker in time"))?;
            match m.message {
                Some(worker_message::Message::Heartbeat(h)) if h.activity_id.is_empty() => {}
                other => return other,
            }
        }
    }
}

fn task(id: &str, attempt: u32) -> server_message::Message {
    server_message::Message::Task(v1::ActivityTask {
        workflow_id: "wf".into(),
        activity_id: id.into(),
        activity_type: "t".into(),
        attempt,
        ..Default::default()
    })
}

/// Runs `body` against a loop serving `worker` until the shutdown token given to
/// `body` is cancelled and the loop ends.
async fn with_loop<F, Fut>(worker: Worker, body: F) -> Result<Ended, Error>
where
    F: FnOnce(Harness, CancellationToken) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (to_worker, inbound) = mpsc::channel(64);
    let (out, from_worker) = mpsc::channel(64);
    let shutdown = CancellationToken::new();
    let mut carry = Carry::new(&worker);
    let mut session = Loop::new(&worker, out, &mut carry);
    let mut inbound = ReceiverStream::new(inbound);
    let serve = session.serve(&mut inbound, Duration::from_secs(1), &shutdown);
    let harness = Harness {
        to_worker,
        from_worker,
    };
    let (ended, ()) = tokio::join!(serve, body(harness, shutdown.clone()));
    ended
}

/// Shutting down: Goodbye first; a task that still arrives is handed back (a
/// short snooze), not run and not dropped; the send side closes only after the
/// server's Drain.
#[tokio::test]
async fn shutdown_says_goodbye_hands_back_late_tasks_and_closes_after_drain() {
    let ran = Arc::new(AtomicU32::new(0));
    let counted = ran.clone();
    let worker = Worker::new("http://unused").activity("t", move |_, _| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(Payload::default())
        }
    });
    let ended = with_loop(worker, |mut h, shutdown| async move {
        shutdown.cancel();
        assert!(matches!(
            h.next().await,
            Some(worker_message::Message::Goodbye(_))
        ));
        h.send(task("late", 1)).await;
        match h.next().await {
            Some(worker_message::Message::Result(r)) => {
                assert_eq!((r.activity_id.as_str(), r.attempt), ("late", 1));
                assert!(
                    matches!(r.outcome, Some(activity_result::Outcome::Snooze(_))),
                    "handed back: {r:?}"
                );
            }
            other => panic!("expected the hand-back, got {other:?}"),
        }
        h.send(server_message::Message::Drain(v1::Drain { deadline: None }))
            .await;
        assert!(h.next().await.is_none(), "the send side closes after Drain");
        drop(h.to_worker);
    })
    .await;
    assert!(ended.is_ok());
    assert_eq!(ran.load(Ordering::SeqCst), 0, "nothing ran while stopping");
}

/// A handler that panics, whether when called or when its future is polled,
/// still answers: its attempt ends with a retryable "Panic" error that says
/// what the panic said.
#[tokio::test]
async fn a_panicking_handler_still_answers() {
    let worker = Worker::new("http://unused").activity("t", |ctx, _| {
        assert_ne!(ctx.info().activity_id, "called", "the handler's call");
        async {
            if true {
                panic!("the handler's future");
            }
            Ok(Payload::default())
        }
    });
    let ended = with_loop(worker, |mut h, shutdown| async move {
        for (id, said) in [
            ("called", "the handler's call"),
            ("polled", "the handler's future"),
        ] {
            h.send(task(id, 1)).await;
            // `next` skips keep-alives, which come every second: a result that
            // never comes must fail the test, not hang it.
            let next = tokio::time::timeout(Duration::from_secs(10), h.next()).await;
            match next.unwrap_or_else(|_| panic!("no result for {id}")) {
                Some(worker_message::Message::Result(r)) => {
                    assert_eq!(r.activity_id, id);
                    match r.outcome {
                        Some(activity_result::Outcome::Error(e)) => {
                            assert_eq!(e.r#type, "Panic");
                            assert_eq!(e.kind(), v1::ErrorKind::Retryable, "{e:?}");
                            assert!(e.message.contains(said), "{e:?}");
                        }
                        other => panic!("expected a Panic error, got {other:?}"),
                    }
                }
                other => panic!("expected {id}'s result, got {other:?}"),
            }
        }
        drop(h.to_worker);
        shutdown.cancel();
    })
    .await;
    assert!(ended.is_ok());
}

/// A task waiting for its type's limit (`type_concurrency`) that is cancelled
/// ends at once, without running: the server holds its slot until it is
/// answered, and the running handler of its type may take long.
#[tokio::test]
async fn a_task_cancelled_while_waiting_for_its_types_limit_is_answered_at_once() {
    let ran = Arc::new(Mutex::new(Vec::new()));
    let seen = ran.clone();
    let worker = Worker::new("http://unused")
        .max_concurrency(2)
        .shutdown_timeout(Duration::from_millis(100))
        .type_concurrency("t", 1)
        .activity("t", move |ctx, _| {
            let seen = seen.clone();
            async move {
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(ctx.info().activity_id.clone());
                // Long, but it stops when the worker does.
                ctx.cancelled().await;
                Ok(Payload::default())
            }
        });
    let ended = with_loop(worker, |mut h, shutdown| async move {
        h.send(task("a", 1)).await;
        h.send(task("b", 1)).await;
        // a runs; b waits for a's permit.
        tokio::time::sleep(Duration::from_millis(10)).await;
        h.send(server_message::Message::Cancel(v1::CancelActivity {
            workflow_id: "wf".into(),
            activity_id: "b".into(),
            attempt: 1,
            reason: "enough".into(),
            kind: v1::CancelKind::Requested as i32,
        }))
        .await;
        let answered = tokio::time::timeout(Duration::from_secs(1), h.next()).await;
        match answered {
            Ok(Some(worker_message::Message::Result(r))) => {
                assert_eq!(r.activity_id, "b");
                match r.outcome {
                    Some(activity_result::Outcome::Error(e)) => {
                        assert_eq!(e.r#type, "Cancelled")
                    }
                    other => panic!("expected b's cancellation, got {other:?}"),
                }
            }
            other => panic!("b was not answered while a ran: {other:?}"),
        }
        shutdown.cancel();
    })
    .await;
    assert!(ended.is_ok());
    assert_eq!(
        *ran.lock().unwrap_or_else(|e| e.into_inner()),
        ["a"],
        "b never ran"
    );
}

/// A server's cancel reaches the handler of exactly that attempt.
#[tokio::test]
async fn a_cancel_reaches_the_handler_of_its_attempt() {
    // A handler ends with an error when cancelled, with its output after 300 ms
    // otherwise.
    let worker = Worker::new("http://unused").activity("t", |ctx, _| async move {
        tokio::select! {
            _ = ctx.cancelled() => Err(crate::ActivityError::retryable(
                "Cancelled",
                ctx.info().activity_id.clone(),
            )),
            _ = tokio::time::sleep(Duration::from_millis(300)) => Ok(Payload::default()),
        }
    });
    let ended = with_loop(worker, |mut h, shutdown| async move {
        h.send(task("a", 1)).await;
        h.send(task("b", 1)).await;
        h.send(server_message::Message::Cancel(v1::CancelActivity {
            workflow_id: "wf".into(),
            activity_id: "b".into(),
            attempt: 1,
            reason: String::new(),
            kind: v1::CancelKind::Requested as i32,
        }))
        .await;
        match h.next().await {
            Some(worker_message::Message::Result(r)) => {
                assert_eq!(r.activity_id, "b", "only b was cancelled");
                assert!(matches!(
                    r.outcome,
                    Some(activity_result::Outcome::Error(_))
                ));
            }
            other => panic!("expected b's result, got {other:?}"),
        }
        // A cancel for another attempt number touches nothing.
        h.send(server_message::Message::Cancel(v1::CancelActivity {
            workflow_id: "wf".into(),
            activity_id: "a".into(),
            attempt: 2,
            reason: String::new(),
            kind: v1::CancelKind::Requested as i32,
        }))
        .await;
        match h.next().await {
            Some(worker_message::Message::Result(r)) => {
                assert_eq!(r.activity_id, "a");
                assert!(
                    matches!(r.outcome, Some(activity_result::Outcome::Output(_))),
                    "a ran to its end, uncancelled: {r:?}"
                );
            }
            other => panic!("expected a's result, got {other:?}"),
        }
        drop(h.to_worker);
        shutdown.cancel();
    })
    .await;
    assert!(ended.is_ok());
}

/// Every ack the server sends reaches the `on_ack` observer, accepted or not.
#[tokio::test]
async fn acks_reach_the_observer() {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    let worker = Worker::new("http://unused")
        .activity("t", |_, _| async { Ok(Payload::default()) })
        .on_ack(move |ack| {
            log.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ack.clone())
        });
    let ended = with_loop(worker, |h, shutdown| async move {
        for (id, accepted) in [("a", true), ("b", false)] {
            h.send(server_message::Message::Ack(v1::ResultAck {
                workflow_id: "wf".into(),
                activity_id: id.into(),
                attempt: 2,
                accepted,
            }))
            .await;
        }
        drop(h.to_worker);
        shutdown.cancel();
    })
    .await;
    assert!(ended.is_ok());
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let expected: Vec<crate::ResultAck> = [("a", true), ("b", false)]
        .into_iter()
        .map(|(id, accepted)| crate::ResultAck {
            workflow_id: "wf".into(),
            activity_id: id.into(),
            attempt: 2,
            accepted,
        })
        .collect();
    assert_eq!(seen, expected);
}

/// Of the heartbeats a handler reports in a burst, each attempt's latest goes
/// out, not every one.
#[tokio::test]
async fn heartbeats_are_coalesced_to_the_latest() {
    let worker = Worker::new("http://unused").activity("t", |ctx, _| async move {
        for i in 0..100u32 {
            ctx.heartbeat(crate::json(&i).ok());
        }
        ctx.cancelled().await;
        Ok(Payload::default())
    });
    let ended = with_loop(worker, |mut h, shutdown| async move {
        h.send(task("a", 1)).await;
        let mut seen = Vec::new();
        loop {
            match h.next().await {
                Some(worker_message::Message::Heartbeat(beat)) => {
                    let n: u32 = beat
                        .details
                        .map(|d| serde_json::from_slice(&d.data).unwrap_or_default())
                        .unwrap_or_default();
                    seen.push(n);
                    if n == 99 {
                        break;
                    }
                }
                other => panic!("expected heartbeats, got {other:?}"),
            }
        }
        assert!(seen.len() < 100, "coalesced: {} sent", seen.len());
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "in order: {seen:?}");
        drop(h.to_worker);
        shutdown.cancel();
    })
    .await;
    assert!(ended.is_ok());
}
