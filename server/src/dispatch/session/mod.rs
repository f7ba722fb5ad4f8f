//! One worker's session once its stream is open: the reader of what the worker
//! sends ([`FromWorker`], decoded by the api layer), its results on their way to
//! the store (`results`), and what happens to its attempts when the stream ends.
//!
//! Invariants:
//! - every result gets exactly one ack, sent after its outcome is committed
//!   (accepted) or refused (not accepted); a result the worker sends again after a
//!   resume, for an attempt that ended while it was away, or whose ending the store
//!   refused, is answered accepted, without a write, when the store shows that the
//!   attempt ended with it (its first ack was lost with the old stream, or another
//!   node wrote it);
//! - reading never waits on the committer: results go, in order, to a forwarder
//!   that commits them and acks each after its commit, so keep-alives are read
//!   whatever the results' backpressure, and a stall of the server is never taken
//!   for the worker's silence (where the reader must wait, silence is not counted);
//! - at most [`ACK_WINDOW`] acks are queued per session: the forwarder waits until
//!   acks leave for the wire (backpressure on a worker that does not read);
//! - when the stream ends, every attempt the worker still held fails as
//!   `WORKER_LOST`, unless the worker may resume (it is detached for the grace);
//!   when the server shuts down, they are released instead.

use std::{pin::Pin, sync::Arc, time::Duration};

use spool_proto::{duration, time::UnixMillis};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

use super::{
    CommitError, Core,
    outbound::{Ack, Ending, Outgoing, ToWorker},
    registry::{ACK_WINDOW, Answer},
};
use crate::{
    lifecycle,
    store::{ActivityError, Attempt, HeartbeatDetails, Op, Outcome, Payload, Transition},
};

mod results;

pub use results::resend_task;
use results::*;

/// What a worker sends, checked and decoded by the api layer.
#[derive(Debug)]
pub enum FromWorker {
    /// The outcome of an attempt the worker ran.
    Result(Report),
    /// Several, in the order the worker sent them.
    Results(Vec<Report>),
    /// Progress of an attempt, or (without one) that the worker is alive.
    Heartbeat(Beat),
    /// The worker takes no more tasks; it finishes what it runs and reports.
    Goodbye,
    /// A second `Hello`: the worker broke the protocol.
    Hello,
}

/// One attempt's outcome, as the worker reported it.
#[derive(Debug)]
pub struct Report {
    pub workflow_id: String,
    pub activity_id: String,
    pub attempt: u32,
    pub outcome: Reported,
}

/// What a result asks for, its contents already checked against the limits.
#[derive(Debug)]
pub enum Reported {
    Output(Payload),
    /// The worker's error: the retry policy decides what follows.
    Error(ActivityError),
    /// The attempt fails for good, whatever the policy (an output over the
    /// payload limit would most likely come back as large).
    Fail(ActivityError),
    /// Run the attempt again after the delay, uncounted.
    Snooze {
        delay_ms: i64,
    },
}

/// A heartbeat.
#[derive(Debug)]
pub enum Beat {
    /// The worker is alive.
    KeepAlive,
    /// An attempt is alive; `details` (when some) are its latest progress.
    Progress {
        workflow_id: String,
        activity_id: String,
        attempt: u32,
        details: Option<Payload>,
    },
}

/// What a session reads: decoded messages, then the end of the stream (`None`)
/// or why it broke.
pub type Inbound = Pin<Box<dyn Stream<Item = Result<FromWorker, String>> + Send>>;

/// How a session ended, which decides the fate of the attempts it held.
pub(crate) enum End {
    /// The stream ended or broke: the worker may resume the session within the
    /// grace; if it does not, its attempts are lost.
    Dropped(String),
    /// The worker was evicted as silent, or broke the protocol: its attempts are
    /// lost now.
    Lost(String),
    /// A resumed stream took the session over: nothing of it is this stream's.
    Superseded,
    /// The server is shutting down: its attempts go back to SCHEDULED, uncounted.
    Shutdown,
}

pub struct Session {
    core: Arc<Core>,
    worker_id: Arc<str>,
    /// The namespace the worker registered in (resolved: never empty).
    namespace: Arc<str>,
    /// The worker's outbound channel (the registry holds another sender).
    tx: mpsc::Sender<Outgoing>,
    /// Results in flight; see the module invariants.
    window: Arc<Semaphore>,
    /// Cancelled by the liveness sweep when the worker has been silent too long.
    evict: CancellationToken,
}

impl Session {
    pub fn new(
        core: Arc<Core>,
        worker_id: Arc<str>,
        namespace: Arc<str>,
        tx: mpsc::Sender<Outgoing>,
        evict: CancellationToken,
    ) -> Self {
        Self {
            core,
            worker_id,
            namespace,
            tx,
            window: Arc::new(Semaphore::new(ACK_WINDOW)),
            evict,
        }
    }

    /// Reads the worker's messages until its stream ends. Reading never waits on
    /// the committer: results go to a forwarder task that commits them in order, so
    /// keep-alives are read while results queue behind a slow commit, and a stall of
    /// the server is never taken for silence of the worker.
    pub async fn run(self, mut inbound: Inbound, shutdown: CancellationToken) {
        // Results of attempts the worker holds are at most its max_concurrency while
        // nothing new is dispatched (no commit, no claim); refusals take the window.
        let capacity = self.core.registry.capacity(&self.worker_id) + ACK_WINDOW;
        let (forward, queue) = mpsc::channel(capacity);
        let over = CancellationToken::new();
        let forwarder = tokio::spawn(forward_results(
            self.core.clone(),
            (self.worker_id.clone(), self.namespace.clone()),
            self.tx.clone(),
            self.window.clone(),
            queue,
            over.clone(),
        ));
        let end = 'read: loop {
            let message = tokio::select! {
                m = inbound.next() => m,
                _ = shutdown.cancelled() => break End::Shutdown,
                _ = self.evict.cancelled() => break self.evicted(),
            };
            let item = match message {
                Some(Ok(FromWorker::Result(report))) => self.on_result(report),
                Some(Ok(FromWorker::Results(reports))) => {
                    for report in reports {
                        let item = self.on_result(report);
                        if let Err(end) = self.forward(&forward, item, &shutdown).await {
                            break 'read end;
                        }
                    }
                    continue;
                }
                Some(Ok(FromWorker::Goodbye)) => {
                    // No more claims for it; the forwarder answers with Drain
                    // once none planned before can still arrive.
                    self.core.registry.leave(&self.worker_id);
                    Forward::Goodbye
                }
                Some(Ok(FromWorker::Heartbeat(beat))) => {
                    self.on_heartbeat(beat);
                    continue;
                }
                Some(Ok(FromWorker::Hello)) => {
                    let _ = self
                        .tx
                        .try_send(Outgoing::new(ToWorker::End(Ending::Protocol(
                            "Hello may only be the first message of a Session",
                        ))));
                    break End::Lost("protocol error: second Hello".to_owned());
                }
                None => break End::Dropped("the worker closed its stream".to_owned()),
                Some(Err(why)) => break End::Dropped(format!("the stream broke: {why}")),
            };
            if let Err(end) = self.forward(&forward, item, &shutdown).await {
                break end;
            }
        };
        // Results already read are still committed; their acks go out only if the
        // window has room (the worker may be gone).
        drop(forward);
        over.cancel();
        self.finish(end).await;
        let _ = forwarder.await;
    }

    /// Hands a result (or Goodbye) to the forwarder. Only a worker answering
    /// attempts it does not hold, faster than it reads the refusals, finds the
    /// queue full: then this waits for room, and the wait is not counted as the
    /// worker's silence.
    async fn forward(
        &self,
        forward: &mpsc::Sender<Forward>,
        item: Forward,
        shutdown: &CancellationToken,
    ) -> Result<(), End> {
        if let Err(mpsc::error::TrySendError::Full(item)) = forward.try_send(item) {
            let _paused = self.core.registry.pause_silence(&self.worker_id);
            tokio::select! {
                _ = forward.send(item) => {}
                _ = shutdown.cancelled() => return Err(End::Shutdown),
                _ = self.evict.cancelled() => return Err(self.evicted()),
            }
        }
        Ok(())
    }

    /// Tells a worker the sweep found silent why its stream ends (unless a resumed
    /// stream took the session over: then this one just ends).
    fn evicted(&self) -> End {
        if !self.core.registry.owns(&self.worker_id, &self.tx) {
            return End::Superseded;
        }
        let why = format!(
            "no message for 3 heartbeat intervals ({} each)",
            duration::format(self.core.config.heartbeat_interval)
        );
        let _ = self
            .tx
            .try_send(Outgoing::new(ToWorker::End(Ending::Lost(why.clone()))));
        End::Lost(why)
    }

    fn on_heartbeat(&self, beat: Beat) {
        let now = tokio::time::Instant::now();
        match beat {
            Beat::KeepAlive => self.core.registry.touch(&self.worker_id, now),
            Beat::Progress {
                workflow_id,
                activity_id,
                attempt,
                details,
            } => {
                self.core.registry.heartbeat(
                    &self.worker_id,
                    &workflow_id,
                    &activity_id,
                    attempt,
                    details,
                    now,
                );
            }
        }
    }

    /// Takes the attempt a result answers (freeing its slot at once, so the next
    /// claim can share the result's commit) and decides what to write.
    fn on_result(&self, result: Report) -> Forward {
        self.core
            .registry
            .touch(&self.worker_id, tokio::time::Instant::now());
        let ack = Ack {
            workflow_id: result.workflow_id,
            activity_id: result.activity_id,
            attempt: result.attempt,
            accepted: false,
        };
        let (attempt, details) = match self.core.registry.answer(
            &self.worker_id,
            &ack.workflow_id,
            &ack.activity_id,
            ack.attempt,
        ) {
            Answer::Held(attempt, details) => (attempt, details),
            Answer::Ended | Answer::Unknown => {
                crate::metrics::result_refused();
                return Forward::Refuse(ack);
            }
            Answer::EndedAway => return Forward::Recheck(ack),
        };
        // Unsettled until its commit returns: a drain waits for it.
        let committing = self.core.registry.commit_begins();
        let transition = decide(&attempt, result.outcome, self.core.store.now());
        let mut ops = Vec::with_capacity(2);
        if let Some(details) = details {
            // The last progress reported survives the attempt's end.
            ops.push(Op::RecordHeartbeats(vec![HeartbeatDetails {
                id: attempt.id,
                attempt: attempt.attempt,
                details: Some(details),
            }]));
        }
        ops.push(Op::finish(attempt, transition));
        Forward::Commit {
            ops,
            ack,
            committing,
        }
    }

    async fn finish(self, end: End) {
        let grace = self.core.config.resume_grace();
        if let End::Dropped(why) = &end
            && self.core.registry.detach(&self.worker_id, &self.tx, grace)
        {
            crate::metrics::session_detached();
            tracing::info!(worker_id = %self.worker_id, grace = %duration::format(grace), "worker stream dropped ({why}): its attempts wait for it to resume");
            return;
        }
        if matches!(end, End::Superseded) || !self.core.registry.owns(&self.worker_id, &self.tx) {
            tracing::debug!(worker_id = %self.worker_id, "stream ended; a resumed stream holds the session");
            return;
        }
        // A node stopping with others that stay on its database leaves a
        // resumable session's attempts running: the worker resumes on another
        // node, which takes them over; if it never does, their leases lapse and
        // they are reclaimed. The drain decided whether to (`end_all`).
        if matches!(end, End::Shutdown)
            && self.core.registry.hands_over()
            && self.core.registry.resumable(&self.worker_id)
        {
            if let Some(left) = self
                .core
                .registry
                .unregister_owned(&self.worker_id, &self.tx)
            {
                tracing::info!(worker_id = %self.worker_id, left = left.len(), "session handed over: its attempts wait for the worker to resume on another node");
            }
            return;
        }
        // Unless a resume took the worker since the check above: its attempts are
        // the resumed stream's now.
        let Some(attempts) = self
            .core
            .registry
            .unregister_lost_owned(&self.worker_id, &self.tx)
        else {
            tracing::debug!(worker_id = %self.worker_id, "stream ended; a resumed stream holds the session");
            return;
        };
        let now = self.core.store.now();
        let ops: Vec<Op> = attempts
            .into_iter()
            .map(|attempt| {
                let transition = match &end {
                    End::Shutdown | End::Superseded => lifecycle::release(&attempt, now),
                    End::Lost(why) | End::Dropped(why) => lifecycle::lost(
                        &attempt,
                        format!("worker {} was lost: {why}", self.worker_id),
                        now,
                    ),
                };
                Op::finish(attempt, transition)
            })
            .collect();
        match &end {
            End::Lost(why) | End::Dropped(why) => {
                crate::metrics::worker_lost();
                tracing::info!(worker_id = %self.worker_id, lost = ops.len(), "worker disconnected: {why}")
            }
            End::Shutdown | End::Superseded => {
                tracing::info!(worker_id = %self.worker_id, released = ops.len(), "session closed by shutdown")
            }
        }
        if !ops.is_empty() && self.core.committer.send(ops).await.is_err() {
            tracing::warn!(worker_id = %self.worker_id, "attempts not ended: shutting down; reclaimed at the next start");
        }
    }
}
