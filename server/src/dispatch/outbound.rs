//! What the server tells one worker, as dispatch decides it. A session's outbound
//! channel carries these in order; the api layer alone turns them into wire
//! messages (`api::worker::wire`), so dispatch never builds a protobuf message.
//!
//! Invariant: an ack carries a permit of its session's ack window, released when
//! the message leaves the channel for the wire (see `registry::ACK_WINDOW`).

use std::sync::Arc;

use spool_proto::time::UnixMillis;
use tokio::sync::OwnedSemaphorePermit;

use crate::store::{ActivityRow, Attempt};

/// One message to a worker, and the ack-window permit it holds, if any.
pub struct Outgoing {
    pub message: ToWorker,
    /// Held, never read: dropped as the message leaves the channel.
    pub _permit: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    pub fn new(message: ToWorker) -> Self {
        Self {
            message,
            _permit: None,
        }
    }
}

/// What a worker is told.
#[derive(Debug)]
pub enum ToWorker {
    /// First on every stream: the session the worker now has, by id.
    Welcome { worker_id: Arc<str> },
    /// An attempt the worker now runs.
    Task(Box<Task>),
    /// The server ended an attempt the worker runs.
    Cancel(Cancel),
    /// The server committed (or refused) one of the worker's results.
    Ack(Ack),
    /// No task follows; what still runs should finish by `deadline`.
    Drain { deadline: Option<UnixMillis> },
    /// The stream ends, and why.
    End(Ending),
}

/// The row of an attempt sent to its worker, as the claim read it.
#[derive(Debug)]
pub struct Task {
    pub row: ActivityRow,
    /// When the attempt's start-to-close or schedule-to-close timeout ends it.
    pub deadline: Option<UnixMillis>,
}

impl Task {
    pub fn new(row: ActivityRow, attempt: &Attempt) -> Self {
        Self {
            deadline: attempt.deadline(),
            row,
        }
    }

    /// The payload bytes it carries (input and heartbeat details): what it holds
    /// in memory while it waits to be sent.
    pub fn payload_bytes(&self) -> usize {
        self.row.input.data.len()
            + self
                .row
                .heartbeat_details
                .as_ref()
                .map_or(0, |d| d.data.len())
    }
}

/// Why the server stopped an attempt, for the worker's code to branch on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelKind {
    Requested,
    TimedOut,
    Drain,
    EndedElsewhere,
}

impl CancelKind {
    /// Its name on the wire, which the logs use too.
    pub fn as_str(self) -> &'static str {
        match self {
            CancelKind::Requested => "CANCEL_KIND_REQUESTED",
            CancelKind::TimedOut => "CANCEL_KIND_TIMED_OUT",
            CancelKind::Drain => "CANCEL_KIND_DRAIN",
            CancelKind::EndedElsewhere => "CANCEL_KIND_ENDED_ELSEWHERE",
        }
    }
}

/// An attempt the worker should stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cancel {
    pub workflow_id: String,
    pub activity_id: String,
    pub attempt: u32,
    /// For a person.
    pub reason: String,
    pub kind: CancelKind,
}

/// The answer to one result: `accepted` when its outcome was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    pub workflow_id: String,
    pub activity_id: String,
    pub attempt: u32,
    pub accepted: bool,
}

/// Why the server ends a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The worker broke the protocol (the status is `INVALID_ARGUMENT`).
    Protocol(&'static str),
    /// The worker was taken for lost (the status is `UNAVAILABLE`: it reconnects).
    Lost(String),
}
