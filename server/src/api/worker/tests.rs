//! Tests of `worker`.

use super::*;

/// A stream that breaks or ends before its Hello is UNAVAILABLE (a worker
/// retries it); one whose first message is too large is RESOURCE_EXHAUSTED;
/// only a first message that is not a Hello is INVALID_ARGUMENT.
#[tokio::test]
async fn a_stream_broken_before_its_hello_is_unavailable() {
    let code = |first: Vec<Result<WorkerMessage, Status>>| async move {
        let mut inbound = tokio_stream::iter(first);
        match handshake(&mut inbound).await {
            Ok(_) => panic!("no Hello, yet a handshake"),
            Err(e) => Status::from(e).code(),
        }
    };
    assert_eq!(
        code(vec![Err(Status::unknown("h2 protocol error"))]).await,
        tonic::Code::Unavailable
    );
    assert_eq!(code(Vec::new()).await, tonic::Code::Unavailable);
    assert_eq!(
        code(vec![Err(Status::out_of_range(
            "Error, decoded message length too large"
        ))])
        .await,
        tonic::Code::ResourceExhausted
    );
    let goodbye = WorkerMessage {
        message: Some(worker_message::Message::Goodbye(v1::Goodbye {})),
    };
    assert_eq!(code(vec![Ok(goodbye)]).await, tonic::Code::InvalidArgument);
}

/// What a worker sends is held to the limits before dispatch sees it: an output
/// over the payload limit fails the attempt for good, a result with no outcome is
/// a retryable error, a heartbeat's oversized details are dropped, error kinds a
/// worker may not send count as retryable, and a message kind this server does
/// not know is skipped.
#[test]
fn what_a_worker_sends_is_checked_before_dispatch_sees_it() {
    use crate::dispatch::session::{Beat, FromWorker, Reported};
    let payload = |n: usize| v1::Payload {
        data: vec![b'x'; n],
        ..Default::default()
    };
    let result = |outcome| WorkerMessage {
        message: Some(worker_message::Message::Result(v1::ActivityResult {
            workflow_id: "wf".into(),
            activity_id: "a".into(),
            attempt: 1,
            outcome,
        })),
    };
    let decoded = |message| wire::decode(message, 16, "w");
    let reported = |message| match decoded(message) {
        Some(FromWorker::Result(report)) => report.outcome,
        other => panic!("not a result: {other:?}"),
    };
    use v1::activity_result::Outcome;
    assert!(matches!(
        reported(result(Some(Outcome::Output(payload(16))))),
        Reported::Output(p) if p.data.len() == 16
    ));
    match reported(result(Some(Outcome::Output(payload(17))))) {
        Reported::Fail(e) => {
            assert_eq!(e.r#type, "PayloadTooLarge");
            assert_eq!(e.kind, v1::ErrorKind::Terminal as i32);
        }
        other => panic!("an oversized output taken as {other:?}"),
    }
    match reported(result(None)) {
        Reported::Error(e) => {
            assert_eq!(e.r#type, "InvalidResult");
            assert_eq!(e.kind, v1::ErrorKind::Retryable as i32);
        }
        other => panic!("an empty result taken as {other:?}"),
    }
    let error = v1::ActivityError {
        kind: v1::ErrorKind::Unspecified as i32,
        r#type: "Boom".into(),
        details: Some(payload(17)),
        ..Default::default()
    };
    match reported(result(Some(Outcome::Error(error)))) {
        Reported::Error(e) => {
            assert_eq!(e.kind, v1::ErrorKind::Retryable as i32);
            assert!(e.details.is_none(), "oversized details kept");
        }
        other => panic!("a worker's error taken as {other:?}"),
    }
    let beat = |details| WorkerMessage {
        message: Some(worker_message::Message::Heartbeat(v1::Heartbeat {
            workflow_id: "wf".into(),
            activity_id: "a".into(),
            attempt: 1,
            details,
        })),
    };
    assert!(matches!(
        decoded(beat(Some(payload(17)))),
        Some(FromWorker::Heartbeat(Beat::Progress { details: None, .. }))
    ));
    assert!(matches!(
        decoded(WorkerMessage {
            message: Some(worker_message::Message::Heartbeat(v1::Heartbeat::default())),
        }),
        Some(FromWorker::Heartbeat(Beat::KeepAlive))
    ));
    assert!(decoded(WorkerMessage { message: None }).is_none());
}
