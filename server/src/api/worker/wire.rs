//! A session's messages on the wire, both ways: the one place what a worker sends
//! is checked and decoded ([`decode`]: contents held to the limits, texts
//! sanitised), and the one place what it is told ([`ToWorker`]) becomes a
//! `ServerMessage` ([`encode`]; the welcome's settings come from the session's
//! set-up, [`Greeting`]).

use std::{
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use spool_proto::{
    duration, time,
    v1::{
        self, ErrorKind, ServerMessage, WorkerMessage, activity_result, server_message::Message,
        worker_message,
    },
};
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tonic::Status;

use super::{Error, validate};
use crate::{
    dispatch::{
        outbound::{Ack, Cancel, CancelKind, Ending, Outgoing, ToWorker},
        session::{Beat, FromWorker, Report, Reported},
    },
    store::ActivityError,
};

/// What a worker sent, checked; `None` for a message kind this server does not
/// know (a newer worker's), which is skipped.
pub(super) fn decode(
    message: WorkerMessage,
    max_payload: usize,
    worker_id: &str,
) -> Option<FromWorker> {
    Some(match message.message? {
        worker_message::Message::Result(result) => FromWorker::Result(report(result, max_payload)),
        worker_message::Message::Results(batch) => FromWorker::Results(
            batch
                .results
                .into_iter()
                .map(|result| report(result, max_payload))
                .collect(),
        ),
        worker_message::Message::Heartbeat(beat) => {
            FromWorker::Heartbeat(heartbeat(beat, max_payload, worker_id))
        }
        worker_message::Message::Goodbye(_) => FromWorker::Goodbye,
        worker_message::Message::Hello(_) => FromWorker::Hello,
    })
}

fn report(result: v1::ActivityResult, max_payload: usize) -> Report {
    Report {
        workflow_id: result.workflow_id,
        activity_id: result.activity_id,
        attempt: result.attempt,
        outcome: reported(result.outcome, max_payload),
    }
}

fn heartbeat(beat: v1::Heartbeat, max_payload: usize, worker_id: &str) -> Beat {
    if beat.workflow_id.is_empty() && beat.activity_id.is_empty() {
        return Beat::KeepAlive;
    }
    // Without details the heartbeat says "alive"; the details reported last
    // stay as they are.
    let details = beat.details.and_then(|mut d| {
        if validate::check_size("heartbeat.details", &d, max_payload).is_err() {
            tracing::warn!(%worker_id, activity_id = %beat.activity_id, "heartbeat details over the payload limit dropped");
            return None;
        }
        validate::worker_content_type(&mut d);
        Some(d)
    });
    Beat::Progress {
        workflow_id: beat.workflow_id,
        activity_id: beat.activity_id,
        attempt: beat.attempt,
        details,
    }
}

/// What a result asks for, after checking what it carries.
fn reported(outcome: Option<activity_result::Outcome>, max_payload: usize) -> Reported {
    match outcome {
        Some(activity_result::Outcome::Output(mut output)) => {
            match validate::check_size("output", &output, max_payload) {
                Ok(()) => {
                    validate::worker_content_type(&mut output);
                    Reported::Output(output)
                }
                // Retrying would most likely produce the same output again.
                Err(e) => Reported::Fail(crate::store::server_error(
                    ErrorKind::Terminal,
                    "PayloadTooLarge",
                    e.to_string(),
                )),
            }
        }
        Some(activity_result::Outcome::Error(error)) => {
            Reported::Error(worker_error(error, max_payload))
        }
        Some(activity_result::Outcome::Snooze(snooze)) => Reported::Snooze {
            delay_ms: validate::millis(validate::worker_delay(Some(&snooze))),
        },
        None => Reported::Error(crate::store::server_error(
            ErrorKind::Retryable,
            "InvalidResult",
            "the worker's result carried no output, error or snooze".to_owned(),
        )),
    }
}

/// A worker's error as it will be stored: workers may only send RETRYABLE or
/// TERMINAL (anything else counts as RETRYABLE); its texts are sanitised (see
/// `validate`), oversized details are dropped with a note, and `next_retry_delay`
/// is bounded like any delay.
fn worker_error(mut error: ActivityError, max_payload: usize) -> ActivityError {
    let kind = ErrorKind::try_from(error.kind).unwrap_or(ErrorKind::Retryable);
    if kind != ErrorKind::Terminal {
        error.kind = ErrorKind::Retryable as i32;
    }
    error.r#type =
        validate::worker_text(std::mem::take(&mut error.r#type), validate::MAX_NAME_BYTES);
    error.message = validate::worker_text(
        std::mem::take(&mut error.message),
        validate::MAX_MESSAGE_BYTES,
    );
    if let Some(details) = &mut error.details {
        if validate::check_size("error.details", details, max_payload).is_err() {
            error
                .message
                .push_str(" [error details dropped: over the payload limit]");
            error.details = None;
        } else {
            validate::worker_content_type(details);
        }
    }
    // An invalid delay is ignored (the policy's backoff applies); a long one is cut.
    error.next_retry_delay = error
        .next_retry_delay
        .as_ref()
        .and_then(|d| duration::from_proto(Some(d)).ok().flatten())
        .map(|d| duration::to_proto(d.min(validate::MAX_DURATION)));
    error
}

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
    /// The worker's Hello asked for batches.
    pub batches: bool,
}

/// The most tasks or acks one message carries.
const BATCH_MAX: usize = 256;

/// The payload bytes past which a batch of tasks takes no more: far below any
/// message limit, and enough that a batch's share of a frame's cost is small.
const BATCH_BYTES: usize = 1024 * 1024;

/// A session's outbound stream: each message encoded as it leaves the channel.
/// For a worker that takes batches, the tasks (or acks) ready together leave as
/// one message: nothing waits for a batch to fill, and the order is kept.
pub(super) struct Frames {
    rx: mpsc::Receiver<Outgoing>,
    greeting: Greeting,
    /// A message taken from the channel that ended a batch: it goes next.
    next: Option<Outgoing>,
}

impl Frames {
    pub(super) fn new(rx: mpsc::Receiver<Outgoing>, greeting: Greeting) -> Self {
        Self {
            rx,
            greeting,
            next: None,
        }
    }

    /// `first` and the messages of its kind ready behind it, as one message.
    fn batch(&mut self, first: Outgoing) -> Result<ServerMessage, Status> {
        let message = match first.message {
            ToWorker::Task(task) => {
                let mut bytes = task.payload_bytes();
                let first = crate::wire::task(task.row, task.deadline);
                let mut tasks = self.gather(first, |message| match message {
                    ToWorker::Task(task) if bytes + task.payload_bytes() <= BATCH_BYTES => {
                        bytes += task.payload_bytes();
                        Ok(crate::wire::task(task.row, task.deadline))
                    }
                    other => Err(other),
                });
                match tasks.len() {
                    1 => Message::Task(tasks.remove(0)),
                    _ => Message::Tasks(v1::TaskBatch { tasks }),
                }
            }
            ToWorker::Ack(first) => {
                let mut acks = self.gather(ack(first), |message| match message {
                    ToWorker::Ack(next) => Ok(ack(next)),
                    other => Err(other),
                });
                match acks.len() {
                    1 => Message::Ack(acks.remove(0)),
                    _ => Message::Acks(v1::AckBatch { acks }),
                }
            }
            other => return encode(other, &self.greeting),
        };
        Ok(ServerMessage {
            message: Some(message),
        })
    }

    /// `first`, then what `take` makes of the messages waiting behind it, at
    /// most [`BATCH_MAX`] in all; the first it refuses goes next, on its own.
    /// The permit of each message taken returns as it leaves the channel, as a
    /// lone message's does.
    fn gather<T>(
        &mut self,
        first: T,
        mut take: impl FnMut(ToWorker) -> Result<T, ToWorker>,
    ) -> Vec<T> {
        let mut items = vec![first];
        while items.len() < BATCH_MAX {
            let Ok(Outgoing { message, _permit }) = self.rx.try_recv() else {
                break;
            };
            match take(message) {
                Ok(item) => items.push(item),
                Err(message) => {
                    self.next = Some(Outgoing { message, _permit });
                    break;
                }
            }
        }
        items
    }
}

impl Stream for Frames {
    type Item = Result<ServerMessage, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let out = match self.next.take() {
            Some(out) => out,
            None => match self.rx.poll_recv(cx) {
                Poll::Ready(Some(out)) => out,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            },
        };
        let message = if self.greeting.batches {
            self.batch(out)
        } else {
            encode(out.message, &self.greeting)
        };
        Poll::Ready(Some(message))
    }
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
            batches: true,
        }),
        ToWorker::Task(task) => Message::Task(crate::wire::task(task.row, task.deadline)),
        ToWorker::Cancel(cancel) => Message::Cancel(self::cancel(cancel)),
        ToWorker::Ack(ack) => Message::Ack(self::ack(ack)),
        ToWorker::Drain { deadline } => Message::Drain(v1::Drain {
            deadline: deadline.map(time::to_proto),
        }),
        ToWorker::End(Ending::Protocol(why)) => {
            return Err(Error::InvalidArgument(why.to_owned()).into());
        }
        ToWorker::End(Ending::Lost(why)) => {
            return Err(Error::Unavailable(format!("worker lost: {why}")).into());
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
