//! What a handler knows about the attempt it runs, and how it talks back while
//! running (cancellation, heartbeats).

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use spool_proto::v1::{self, Payload};
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
    /// 1 for the first attempt.
    pub attempt: u32,
    /// When the activity was submitted.
    pub scheduled_at: Option<SystemTime>,
    /// When the server ends this attempt (start-to-close or schedule-to-close).
    pub deadline: Option<SystemTime>,
    /// How long the server waits for a heartbeat before it fails this attempt, if
    /// the submitter set one.
    pub heartbeat_timeout: Option<Duration>,
}

/// Handed to each handler invocation.
#[derive(Clone)]
pub struct ActivityContext {
    info: Arc<ActivityInfo>,
    /// Cancelled when the server sends `CancelActivity` for this attempt, or the
    /// worker shuts down.
    cancel: CancellationToken,
    /// To the session, which sends heartbeats on the stream; sends that would block
    /// are dropped (a heartbeat is superseded by the next one anyway).
    heartbeats: mpsc::Sender<v1::Heartbeat>,
}

impl ActivityContext {
    pub(crate) fn new(
        info: Arc<ActivityInfo>,
        cancel: CancellationToken,
        heartbeats: mpsc::Sender<v1::Heartbeat>,
    ) -> Self {
        Self {
            info,
            cancel,
            heartbeats,
        }
    }

    /// Which attempt of which activity this is.
    pub fn info(&self) -> &ActivityInfo {
        &self.info
    }

    /// True once the server asked this attempt to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when the server asks this attempt to stop; its result will not be
    /// accepted after that, so return promptly.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Reports progress; `details` are readable through `Get` while it runs.
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
