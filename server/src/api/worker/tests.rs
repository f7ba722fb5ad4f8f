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
