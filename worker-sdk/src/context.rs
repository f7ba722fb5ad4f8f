//! What a handler knows about the attempt it runs, and how it talks back while
//! running (cancellation, heartbeats).

use std::{
    sync::{Arc, OnceLock},
    time::{Duration, SystemTime},
};

use serde::{Serialize, de::DeserializeOwned};
use spool_proto::{
    activity::DecodeError,
    v1::{self, Payload},
};
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

/// The attempt being run.
#[derive(Debug, Clone)]
pub struct ActivityInfo {
    /// The worker's namespace.
    pub namespace: String,
    /// The activity's workflow id.
    pub workflow_id: String,
    /// The activity's id within its workflow.
    pub activity_id: String,
    /// The type the handler was registered for.
    pub activity_type: String,
    /// 1 for the first attempt. Snoozes and hand-backs by the server take an
    /// attempt number too, without counting against `max_attempts`.
    pub attempt: u32,
    /// The attempt budget (0 from a server that does not say).
    pub max_attempts: u32,
    /// How many attempts before this one counted against `max_attempts`.
    pub counted_attempts: u32,
    /// When this attempt became due (submit time plus delay, or a retry's backoff).
    pub scheduled_at: Option<SystemTime>,
    /// When the server handed this attempt to the worker.
    pub started_at: Option<SystemTime>,
    /// When the server ends this attempt (start-to-close or schedule-to-close).
    pub deadline: Option<SystemTime>,
    /// How long the server waits for a heartbeat before it fails this attempt, if
    /// the submitter set one.
    pub heartbeat_timeout: Option<Duration>,
    /// The headers the activity was submitted with (a `traceparent`, a tenant).
    pub headers: std::collections::BTreeMap<String, String>,
}

impl ActivityInfo {
    /// True when this attempt is the last the budget allows: if it fails
    /// (retryably or not), the activity is FAILED for good.
    pub fn is_last_attempt(&self) -> bool {
        self.max_attempts > 0 && self.counted_attempts.saturating_add(1) >= self.max_attempts
    }

    /// The W3C trace context the activity was submitted in (its `traceparent`
    /// header), to continue the trace in what this attempt calls or submits.
    pub fn traceparent(&self) -> Option<&str> {
        self.headers.get("traceparent").map(String::as_str)
    }

    /// The trace id of [`ActivityInfo::traceparent`], when it is a valid one.
    pub fn trace_id(&self) -> Option<&str> {
        let traceparent = self.traceparent()?;
        let mut parts = traceparent.split('-');
        let (_version, trace_id) = (parts.next()?, parts.next()?);
        (trace_id.len() == 32 && trace_id.bytes().all(|b| b.is_ascii_hexdigit()))
            .then_some(trace_id)
    }
}

/// Why an attempt was asked to stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelReason {
    /// A client cancelled the activity; its reason.
    Requested(String),
    /// The attempt passed a timeout; which one.
    TimedOut(String),
    /// The server is draining: the activity runs again later, not counted.
    ServerDrain(String),
    /// Another server node ended the attempt (a cancel there, or a reclaim).
    EndedElsewhere(String),
    /// This worker is shutting down and its shutdown timeout passed.
    WorkerShutdown,
    /// A server that does not say which, and its message.
    Other(String),
}

impl CancelReason {
    /// The server's `CancelActivity` as a reason.
    pub(crate) fn from_wire(cancel: &v1::CancelActivity) -> Self {
        let message = cancel.reason.clone();
        match v1::CancelKind::try_from(cancel.kind) {
            Ok(v1::CancelKind::Requested) => Self::Requested(message),
            Ok(v1::CancelKind::TimedOut) => Self::TimedOut(message),
            Ok(v1::CancelKind::Drain) => Self::ServerDrain(message),
            Ok(v1::CancelKind::EndedElsewhere) => Self::EndedElsewhere(message),
            _ => Self::Other(message),
        }
    }
}

/// One attempt's cancellation: the token its handler watches, and why.
#[derive(Debug, Default)]
pub(crate) struct Cancel {
    pub token: CancellationToken,
    reason: OnceLock<CancelReason>,
}

impl Cancel {
    /// A cancellation that also fires when `parent` does (the worker shutting down).
    pub fn child_of(parent: &CancellationToken) -> Self {
        Self {
            token: parent.child_token(),
            reason: OnceLock::new(),
        }
    }

    /// Asks the handler to stop, for `reason` (the first reason given stays).
    pub fn cancel(&self, reason: CancelReason) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }

    fn reason(&self) -> Option<CancelReason> {
        if !self.token.is_cancelled() {
            return None;
        }
        Some(
            self.reason
                .get()
                .cloned()
                .unwrap_or(CancelReason::WorkerShutdown),
        )
    }
}

/// Handed to each handler invocation.
#[derive(Clone)]
pub struct ActivityContext {
    info: Arc<ActivityInfo>,
    /// Fires when the server sends `CancelActivity` for this attempt, or the worker
    /// shuts down.
    cancel: Arc<Cancel>,
    /// What an earlier attempt last reported (see [`Self::last_heartbeat_details`]).
    last_heartbeat: Option<Payload>,
    /// To the session, which sends heartbeats on the stream; sends that would block
    /// are dropped (a heartbeat is superseded by the next one anyway).
    heartbeats: mpsc::Sender<v1::Heartbeat>,
}

impl ActivityContext {
    pub(crate) fn new(
        info: Arc<ActivityInfo>,
        cancel: Arc<Cancel>,
        last_heartbeat: Option<Payload>,
        heartbeats: mpsc::Sender<v1::Heartbeat>,
    ) -> Self {
        Self {
            info,
            cancel,
            last_heartbeat,
            heartbeats,
        }
    }

    /// Which attempt of which activity this is.
    pub fn info(&self) -> &ActivityInfo {
        &self.info
    }

    /// True once this attempt was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.token.is_cancelled()
    }

    /// Completes when this attempt is asked to stop; its result will not be
    /// accepted after that, so return promptly.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.token.cancelled()
    }

    /// Why this attempt was asked to stop; `None` while it was not.
    pub fn cancel_reason(&self) -> Option<CancelReason> {
        self.cancel.reason()
    }

    /// The details an earlier attempt last reported with a heartbeat (and the
    /// server stored) before it ended: where to resume long work. `None` on a first
    /// attempt, or when no earlier attempt reported any.
    pub fn last_heartbeat_details(&self) -> Option<&Payload> {
        self.last_heartbeat.as_ref()
    }

    /// [`Self::last_heartbeat_details`] as a `T` (JSON).
    pub fn last_heartbeat<T: DeserializeOwned>(&self) -> Result<Option<T>, DecodeError> {
        self.last_heartbeat
            .as_ref()
            .map(spool_proto::activity::decode)
            .transpose()
    }

    /// Reports progress as JSON; see [`Self::heartbeat`]. A value that cannot be
    /// serialized is reported as a heartbeat without details, and the error returned.
    pub fn heartbeat_with<T: Serialize + ?Sized>(
        &self,
        details: &T,
    ) -> Result<(), serde_json::Error> {
        match spool_proto::activity::encode(details) {
            Ok(payload) => {
                self.heartbeat(Some(payload));
                Ok(())
            }
            Err(e) => {
                self.heartbeat(None);
                Err(e)
            }
        }
    }

    /// Reports progress and keeps the attempt alive; `details` are readable through
    /// `Get` while it runs, and reach the next attempt if this one ends unfinished.
    /// Cheap to call often: the latest details of each attempt are sent, coalesced.
    pub fn heartbeat(&self, details: Option<Payload>) {
        let _ = self.heartbeats.try_send(v1::Heartbeat {
            workflow_id: self.info.workflow_id.clone(),
            activity_id: self.info.activity_id.clone(),
            attempt: self.info.attempt,
            details,
        });
    }
}

pub(crate) fn system_time(ts: &prost_types::Timestamp) -> Option<SystemTime> {
    let ms = spool_proto::time::from_proto(ts);
    u64::try_from(ms)
        .ok()
        .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms))
}
