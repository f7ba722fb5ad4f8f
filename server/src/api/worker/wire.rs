//! What a worker is told, put on the wire: the one place a session's outbound
//! messages ([`ToWorker`]) become `ServerMessage`s. The welcome's settings come
//! from the session's set-up ([`Greeting`]), the rest from the message itself.

use std::time::Duration;

use spool_proto::{
    duration, time,
    v1::{self, ServerMessage, server_message::Message},
};
use tonic::Status;

use crate::dispatch::outbound::{Ack, Cancel, CancelKind, Ending, ToWorker};

/// What a session's `Welcome` says besides the worker's id.
pub(super) struct Greeting {
    pub heartbeat_interval: Duration,
    pub max_concurrency: u32,
    pub max_payload_bytes: usize,
    /// Empty: the session cannot be resumed.
    pub resume_token: String,
    pub resume_grace: Duration,
    pub resumed: bool,
    /// Why the resume the worker asked for was refused (empty if none was).
    pub resume_refused: &'static str,
}

/// One message for the wire; an ending becomes the stream's error status.
pub(super) fn encode(message: ToWorker, greeting: &Greeting) -> Result<ServerMessage, Status> {
    let message = match message {
        ToWorker::Welcome { worker_id } => Message::Welcome(v1::Welcome {
            worker_id: worker_id.to_string(),
            heartbeat_interval: Some(duration::to_proto(greeting.heartbeat_interval)),
            protocol_version: 1,
            max_concurrency: greeting.max_concurrency,
            max_payload_bytes: greeting.max_payload_bytes as u64,
            resume_token: greeting.resume_token.clone(),
            resume_grace: (!greeting.resume_token.is_empty())
                .then(|| duration::to_proto(greeting.resume_grace)),
            resumed: greeting.resumed,
            resume_refused: greeting.resume_refused.to_owned(),
        }),
        ToWorker::Task(task) => Message::Task(crate::wire::task(task.row, task.deadline)),
        ToWorker::Cancel(cancel) => Message::Cancel(self::cancel(cancel)),
        ToWorker::Ack(ack) => Message::Ack(self::ack(ack)),
        ToWorker::Drain { deadline } => Message::Drain(v1::Drain {
            deadline: deadline.map(time::to_proto),
        }),
        ToWorker::End(Ending::Protocol(why)) => return Err(Status::invalid_argument(why)),
        ToWorker::End(Ending::Lost(why)) => {
            return Err(Status::unavailable(format!("worker lost: {why}")));
        }
    };
    Ok(ServerMessage {
        message: Some(message),
    })
}

fn cancel(c: Cancel) -> v1::CancelActivity {
    v1::CancelActivity {
        workflow_id: c.workflow_id,
        activity_id: c.activity_id,
        attempt: c.attempt,
        reason: c.reason,
        kind: match c.kind {
            CancelKind::Requested => v1::CancelKind::Requested,
            CancelKind::TimedOut => v1::CancelKind::TimedOut,
            CancelKind::Drain => v1::CancelKind::Drain,
            CancelKind::EndedElsewhere => v1::CancelKind::EndedElsewhere,
        } as i32,
    }
}

fn ack(a: Ack) -> v1::ResultAck {
    v1::ResultAck {
        workflow_id: a.workflow_id,
        activity_id: a.activity_id,
        attempt: a.attempt,
        accepted: a.accepted,
    }
}
