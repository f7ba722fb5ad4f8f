//! One connection's life: `Hello`, `Welcome`, then tasks in and results out until
//! the stream ends; and what outlives it ([`Carry`]), so a dropped stream costs
//! nothing: the next `Hello` resumes the session with its ticket, handlers keep
//! running through the reconnect, and every result the server did not acknowledge
//! is sent again (results are fenced by attempt, so a second copy is refused, never
//! recorded twice).
//!
//! The loop owns the only sender of the outbound stream; handlers report through
//! channels the loop drains, so closing the stream is dropping that one sender.

mod attempt;

use std::{collections::HashMap, sync::Arc, time::Duration};

use spool_proto::{
    attempt::{AttemptKey, Ids},
    duration,
    v1::{
        self, ServerMessage, WorkerMessage, activity_result, server_message, worker_message,
        worker_service_client::WorkerServiceClient,
    },
};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Status,
    metadata::MetadataValue,
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};

use crate::{CancelReason, Error, Worker, context::Cancel, telemetry::TypeMetrics};

use attempt::{Attempt, OfType, too_large};

/// `after` from now; a duration too long for the clock is a year.
fn later(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after)
        .unwrap_or_else(|| now + Duration::from_secs(365 * 86_400))
}

pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A session ended without an error (whether it was welcomed is in
/// [`Carry::take_welcomed`]).
pub(crate) struct Ended;

/// What outlives one stream of a worker: its running handlers, results not yet
/// acknowledged, and the ticket that resumes its session.
pub(crate) struct Carry {
    /// Attempts running now, with the cancellation their handler watches.
    running: foldhash::HashMap<AttemptKey, Arc<Cancel>>,
    /// Parent of every handler's token: cancelled when the worker is done for.
    cancel: CancellationToken,
    /// Handlers' outcomes (one per task, so at most `max_concurrency` queued).
    results: (
        mpsc::Sender<v1::ActivityResult>,
        mpsc::Receiver<v1::ActivityResult>,
    ),
    /// Handlers' heartbeats; full means the newest ones are dropped.
    heartbeats: (mpsc::Sender<v1::Heartbeat>, mpsc::Receiver<v1::Heartbeat>),
    /// Results sent and not yet acknowledged: sent again after a resume.
    unacked: foldhash::HashMap<AttemptKey, v1::ActivityResult>,
    /// The session to resume, and its ticket (`Welcome.worker_id`, `resume_token`).
    resume: Option<(String, String)>,
    /// A server welcomed a stream since the caller last asked: the reconnect
    /// backoff starts over, however that stream ended.
    welcomed: bool,
    /// Once the worker is shutting down: when running handlers are told to stop.
    /// One deadline across streams, so a cut while stopping does not restart it.
    stop_by: Option<tokio::time::Instant>,
}

impl Carry {
    pub(crate) fn new(worker: &Worker) -> Self {
        let capacity = 2 * worker.max_concurrency as usize + 64;
        Self {
            running: Default::default(),
            // Not a child of `shutdown`: a worker shutting down lets running handlers
            // finish (up to its shutdown timeout) before it tells them to stop.
            cancel: CancellationToken::new(),
            results: mpsc::channel(capacity),
            heartbeats: mpsc::channel(256),
            unacked: Default::default(),
            resume: None,
            welcomed: false,
            stop_by: None,
        }
    }

    /// The worker is shutting down: the deadline for what still runs, set once.
    pub(crate) fn stop_by(&mut self, timeout: Duration) -> tokio::time::Instant {
        *self.stop_by.get_or_insert_with(|| later(timeout))
    }

    /// The shutdown deadline, once the worker is shutting down.
    pub(crate) fn stopping_by(&self) -> Option<tokio::time::Instant> {
        self.stop_by
    }

    /// Shutting down with a stream lost, whether a new stream should still be
    /// tried: a session to resume holds attempts running or results unacknowledged
    /// (given up, they would run again elsewhere, counted), and the shutdown
    /// timeout has not passed.
    pub(crate) fn finishing(&self) -> bool {
        self.resume.is_some()
            && !(self.running.is_empty() && self.unacked.is_empty())
            && self
                .stop_by
                .is_some_and(|t| tokio::time::Instant::now() < t)
    }

    /// Whether a stream was welcomed since the last call.
    pub(crate) fn take_welcomed(&mut self) -> bool {
        std::mem::take(&mut self.welcomed)
    }

    /// The attempts this worker still has, for a resuming `Hello`.
    fn held(&self) -> Vec<v1::AttemptRef> {
        self.running
            .keys()
            .chain(self.unacked.keys())
            .map(|key| v1::AttemptRef {
                workflow_id: key.workflow_id.clone(),
                activity_id: key.activity_id.clone(),
                attempt: key.attempt,
            })
            .collect()
    }

    /// The server started a new session instead of resuming ours: what ran under
    /// the old one is no longer this worker's. Handlers are told to stop; their
    /// results, if they still come, are refused.
    fn forget(&mut self, why: &str) {
        for cancel in self.running.values() {
            cancel.cancel(CancelReason::EndedElsewhere(format!(
                "the server did not resume this worker's session: {why}"
            )));
        }
        self.unacked.clear();
    }

    /// The session `welcome` started or resumed is the one a next stream resumes.
    fn adopt(&mut self, welcome: &v1::Welcome) {
        if welcome.resumed {
            tracing::info!(worker_id = %welcome.worker_id, running = self.running.len(), unacknowledged = self.unacked.len(), "reconnected: session resumed");
        } else {
            // With or without a session to resume (a server without a resume grace
            // gives none), a new one means the old one's attempts are not this
            // worker's any more: the server ended them when the stream dropped.
            if !(self.running.is_empty() && self.unacked.is_empty()) {
                let why = if welcome.resume_refused.is_empty() {
                    "the server cannot resume sessions"
                } else {
                    welcome.resume_refused.as_str()
                };
                tracing::warn!(worker_id = %welcome.worker_id, running = self.running.len(), "connected with a new session ({why}): the attempts of the old one are lost to this worker");
                self.forget(why);
            }
            tracing::info!(worker_id = %welcome.worker_id, "connected");
        }
        self.resume = (!welcome.resume_token.is_empty())
            .then(|| (welcome.worker_id.clone(), welcome.resume_token.clone()));
        self.welcomed = true;
    }

    /// Every handler is told to stop: the worker stops for good.
    pub(crate) fn stop(&self) {
        self.cancel.cancel();
    }
}

pub(crate) async fn run(
    worker: &Worker,
    carry: &mut Carry,
    shutdown: &CancellationToken,
) -> Result<Ended, Error> {
    let Some(channel) = dial(worker, carry, shutdown).await? else {
        return Ok(Ended);
    };
    let mut client = service(worker, channel)?;
    let capacity = 2 * worker.max_concurrency as usize + 64;
    let (out_tx, out_rx) = mpsc::channel::<WorkerMessage>(capacity + carry.unacked.len());
    out_tx
        .send(WorkerMessage {
            message: Some(worker_message::Message::Hello(hello(worker, carry))),
        })
        .await
        .map_err(|_| Error::Protocol("outbound stream closed before Hello".to_owned()))?;
    let mut inbound = client
        .session(ReceiverStream::new(out_rx))
        .await
        .map_err(Error::Rejected)?
        .into_inner();
    let welcome = welcome(&mut inbound).await?;
    carry.adopt(&welcome);
    worker.set_connection(crate::Connection::Connected {
        worker_id: welcome.worker_id.clone(),
        resumed: welcome.resumed,
    });

    let mut session = Loop::new(worker, out_tx, carry);
    session.max_payload = usize::try_from(welcome.max_payload_bytes).unwrap_or(usize::MAX);
    session.batches = worker.batches && welcome.batches;
    if welcome.resumed {
        session.send_unacked().await;
    }
    session
        .serve(&mut inbound, heartbeat_interval(&welcome), shutdown)
        .await
}

/// A channel to the server; `None` when the worker stopped first.
async fn dial(
    worker: &Worker,
    carry: &Carry,
    shutdown: &CancellationToken,
) -> Result<Option<Channel>, Error> {
    // A black-holed connection is noticed by its pings going unanswered, well
    // before the server counts this worker silent (three heartbeat intervals).
    let endpoint = spool_proto::endpoint::endpoint(&worker.endpoint, &worker.tls)
        .map_err(|e| Error::InvalidEndpoint(e.to_string()))?
        .http2_keep_alive_interval(worker.keep_alive.0)
        .keep_alive_timeout(worker.keep_alive.1)
        .keep_alive_while_idle(true);
    // Shutting down, a connection is still made to finish what runs, until the
    // shutdown timeout (`Carry::finishing`).
    let stopped = async {
        if carry.finishing() {
            sleep_until(carry.stop_by).await;
        } else {
            shutdown.cancelled().await;
        }
    };
    tokio::select! {
        c = endpoint.connect() => Ok(Some(c?)),
        () = stopped => Ok(None),
    }
}

/// The worker service over `channel`, the worker's token on every call.
fn service(
    worker: &Worker,
    channel: Channel,
) -> Result<WorkerServiceClient<InterceptedService<Channel, impl Interceptor>>, Error> {
    let token: Option<MetadataValue<_>> =
        match &worker.token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| {
                Error::Protocol("the token is not a valid header value".to_owned())
            })?),
            None => None,
        };
    let client = WorkerServiceClient::with_interceptor(channel, move |mut request: Request<()>| {
        if let Some(token) = &token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok::<_, Status>(request)
    });
    Ok(client
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX))
}

/// The `Hello` that opens a stream: what this worker runs, and the session it
/// resumes with what it still holds of it.
fn hello(worker: &Worker, carry: &Carry) -> v1::Hello {
    let mut activity_types: Vec<String> = worker.handlers.keys().cloned().collect();
    activity_types.sort();
    let (resume_worker_id, resume_token) = carry.resume.clone().unwrap_or_default();
    v1::Hello {
        namespace: worker.namespace.clone(),
        identity: worker.identity.clone(),
        activity_types,
        max_concurrency: worker.max_concurrency,
        protocol_version: 1,
        resume_worker_id,
        resume_token,
        held: carry.held(),
        batches: worker.batches,
    }
}

/// The server's first message, which must be its `Welcome`.
async fn welcome(inbound: &mut tonic::Streaming<ServerMessage>) -> Result<v1::Welcome, Error> {
    match inbound.message().await {
        Ok(Some(ServerMessage {
            message: Some(server_message::Message::Welcome(w)),
        })) => Ok(w),
        Ok(Some(_)) => Err(Error::Protocol(
            "the server did not start with Welcome".to_owned(),
        )),
        Ok(None) => Err(Error::Protocol(
            "the server closed the stream before Welcome".to_owned(),
        )),
        Err(status) => Err(Error::Rejected(status)),
    }
}

/// The heartbeat interval the server asks for (5 s when it names none).
fn heartbeat_interval(welcome: &v1::Welcome) -> Duration {
    duration::from_proto(welcome.heartbeat_interval.as_ref())
        .ok()
        .flatten()
        .filter(|d| !d.is_zero())
        .unwrap_or(Duration::from_secs(5))
}

struct Loop<'a> {
    worker: &'a Worker,
    /// The only sender of the outbound stream; `None` once we stopped sending.
    out: Option<mpsc::Sender<WorkerMessage>>,
    /// What outlives this stream.
    carry: &'a mut Carry,
    /// Taking no new work (shutdown, or the server's drain).
    stopping: bool,
    /// The server said no task is on its way any more (Drain), or did not answer
    /// our Goodbye in time.
    drained: bool,
    /// This worker is shutting down (not a server's drain): at the end, whatever
    /// still runs is told to stop.
    shutting_down: bool,
    /// The largest payload the server takes (0: it did not say); a larger one would
    /// end the session, so it is never sent.
    max_payload: usize,
    /// The server takes several results in one message.
    batches: bool,
    /// What each activity type's attempts share, by type.
    types: foldhash::HashMap<String, Arc<OfType>>,
}

/// The most results one message carries, and the encoded bytes past which it
/// takes no more: far below the server's message limit (16 MiB at the least).
const BATCH_MAX: usize = 256;
const BATCH_BYTES: usize = 1024 * 1024;

/// While stopping, a task that still arrives is handed back after this delay, as a
/// snooze (not counted as an attempt): long enough not to bounce straight back to
/// this worker, short enough not to hold the activity up.
const HAND_BACK: Duration = Duration::from_millis(200);

/// How long to wait for the server's answer to Goodbye (its Drain) before closing
/// the send side anyway.
const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// After the shutdown timeout cancels handlers, how long their results may take.
const AFTER_CANCEL: Duration = Duration::from_secs(2);

impl<'a> Loop<'a> {
    fn new(worker: &'a Worker, out: mpsc::Sender<WorkerMessage>, carry: &'a mut Carry) -> Self {
        Self {
            worker,
            out: Some(out),
            carry,
            stopping: false,
            drained: false,
            shutting_down: false,
            max_payload: 0,
            batches: false,
            types: Default::default(),
        }
    }

    /// The session after `Welcome`, over any stream of server messages (tonic's in
    /// production, a channel in tests).
    async fn serve<S>(
        &mut self,
        inbound: &mut S,
        interval: Duration,
        shutdown: &CancellationToken,
    ) -> Result<Ended, Error>
    where
        S: Stream<Item = Result<ServerMessage, Status>> + Unpin,
    {
        // Keep-alives at twice the rate asked for, so one late tick is not fatal
        // (and never a zero period, which would panic).
        let mut keepalive = tokio::time::interval((interval / 2).max(Duration::from_millis(1)));
        keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Shutdown or a server's drain: take no new work, let what runs finish and
        // report, then close. On shutdown, handlers still running at the shutdown
        // timeout are cancelled, and given a moment to report.
        let mut give_up: Option<tokio::time::Instant> = None;
        let mut cancelled_handlers = false;
        // After our Goodbye: until the server's Drain says no task is on its way,
        // the send side stays open to hand back whatever still arrives. A server
        // that does not answer (an older one) is waited for this long.
        let mut goodbye_wait: Option<tokio::time::Instant> = None;
        let ended = loop {
            if self.stopping && self.carry.running.is_empty() && self.drained && self.out.is_some()
            {
                // Everything answered: stop sending, then read until the server
                // closes so acks still in flight are not lost.
                self.out = None;
            }
            tokio::select! {
                message = inbound.next() => match message.transpose() {
                    Ok(Some(ServerMessage { message: Some(server_message::Message::Drain(drain)) })) => {
                        if drain.deadline.is_some() {
                            tracing::info!(running = self.carry.running.len(), deadline = ?drain.deadline, "server draining: finishing running activities, then reconnecting");
                        }
                        self.stopping = true;
                        self.drained = true;
                    }
                    Ok(Some(ServerMessage { message: Some(m) })) => self.on_message(m),
                    Ok(Some(ServerMessage { message: None })) => {}
                    Ok(None) => break Ok(Ended),
                    Err(status) => break Err(Error::Rejected(status)),
                },
                Some(result) = self.carry.results.1.recv() => self.report(result).await,
                Some(heartbeat) = self.carry.heartbeats.1.recv() => {
                    // Coalesce: of the heartbeats queued now, only each attempt's
                    // latest is sent.
                    let mut latest: HashMap<AttemptKey, v1::Heartbeat> = HashMap::new();
                    let mut next = Some(heartbeat);
                    while let Some(beat) = next {
                        latest.insert(AttemptKey::new(&beat.workflow_id, &beat.activity_id, beat.attempt), beat);
                        next = self.carry.heartbeats.1.try_recv().ok();
                    }
                    for mut beat in latest.into_values() {
                        if let Some(d) = &beat.details && too_large(d.data.len(), self.max_payload) {
                            tracing::warn!(activity_id = %beat.activity_id, bytes = d.data.len(), limit = self.max_payload, "heartbeat details over the server's limit: sent without them");
                            beat.details = None;
                        }
                        self.send(worker_message::Message::Heartbeat(beat)).await;
                    }
                }
                _ = keepalive.tick() => {
                    self.send(worker_message::Message::Heartbeat(v1::Heartbeat::default())).await;
                }
                _ = shutdown.cancelled(), if give_up.is_none() => {
                    tracing::info!(running = self.carry.running.len(), "shutting down: finishing running activities");
                    self.stopping = true;
                    self.shutting_down = true;
                    give_up = Some(self.carry.stop_by(self.worker.shutdown_timeout));
                    if !self.drained {
                        self.send(worker_message::Message::Goodbye(v1::Goodbye {})).await;
                        goodbye_wait = Some(later(GOODBYE_WAIT));
                    }
                }
                _ = sleep_until(goodbye_wait), if goodbye_wait.is_some() && !self.drained => {
                    tracing::debug!("no answer to Goodbye in time; taking it as given");
                    self.drained = true;
                }
                _ = sleep_until(give_up), if give_up.is_some() => {
                    if cancelled_handlers {
                        tracing::warn!(running = self.carry.running.len(), "handlers did not stop; their attempts will be retried elsewhere");
                        break Ok(Ended);
                    }
                    tracing::warn!(running = self.carry.running.len(), "shutdown timeout: cancelling running activities");
                    self.carry.cancel.cancel();
                    cancelled_handlers = true;
                    give_up = Some(later(AFTER_CANCEL));
                }
            }
        };
        // A worker stopping for good tells what still runs to stop; a dropped stream
        // leaves handlers running for the next one to resume, while shutting down
        // too, until the shutdown's deadline.
        if self.shutting_down && !self.carry.finishing() {
            self.carry.cancel.cancel();
        }
        ended
    }

    /// Sends a finished attempt's result, with those finished beside it when the
    /// server takes batches.
    async fn report(&mut self, first: v1::ActivityResult) {
        let first = self.finished(first);
        if !self.batches {
            return self.send(worker_message::Message::Result(first)).await;
        }
        let mut bytes = prost::Message::encoded_len(&first);
        let mut results = vec![first];
        while results.len() < BATCH_MAX && bytes < BATCH_BYTES {
            let Ok(next) = self.carry.results.1.try_recv() else {
                break;
            };
            bytes += prost::Message::encoded_len(&next);
            results.push(self.finished(next));
        }
        let message = if results.len() == 1 {
            worker_message::Message::Result(results.remove(0))
        } else {
            worker_message::Message::Results(v1::ResultBatch { results })
        };
        self.send(message).await;
    }

    /// An attempt's result leaves it running; it is kept until acknowledged, to be
    /// sent again after a resume.
    fn finished(&mut self, result: v1::ActivityResult) -> v1::ActivityResult {
        let ids = Ids::new(&result.workflow_id, &result.activity_id, result.attempt);
        let key = match self.carry.running.remove_entry(ids.key()) {
            Some((key, _)) => key,
            None => AttemptKey::new(&result.workflow_id, &result.activity_id, result.attempt),
        };
        self.carry.unacked.insert(key, result.clone());
        result
    }

    /// Gives a task back unrun while stopping (see [`HAND_BACK`]).
    fn hand_back(&mut self, task: v1::ActivityTask) {
        let result = v1::ActivityResult {
            workflow_id: task.workflow_id,
            activity_id: task.activity_id,
            attempt: task.attempt,
            outcome: Some(activity_result::Outcome::Snooze(duration::to_proto(
                HAND_BACK,
            ))),
        };
        if let Some(out) = &self.out
            && out
                .try_send(WorkerMessage {
                    message: Some(worker_message::Message::Result(result)),
                })
                .is_err()
        {
            tracing::warn!(
                "could not hand a task back while stopping; it will be retried elsewhere"
            );
        }
    }

    async fn send(&mut self, message: worker_message::Message) {
        if let Some(out) = &self.out {
            // Closed means the server ended the stream; the read side will see it.
            let _ = out
                .send(WorkerMessage {
                    message: Some(message),
                })
                .await;
        }
    }

    /// Sends again the results the server may not have: no ack was seen for them.
    async fn send_unacked(&mut self) {
        let unacked: Vec<v1::ActivityResult> = self.carry.unacked.values().cloned().collect();
        for result in unacked {
            self.send(worker_message::Message::Result(result)).await;
        }
    }

    fn on_message(&mut self, message: server_message::Message) {
        match message {
            server_message::Message::Task(task) => self.start(task),
            server_message::Message::Cancel(cancel) => {
                let reason = CancelReason::from_wire(&cancel);
                let ids = Ids::new(&cancel.workflow_id, &cancel.activity_id, cancel.attempt);
                if let Some(running) = self.carry.running.get(ids.key()) {
                    running.cancel(reason);
                }
            }
            server_message::Message::Tasks(batch) => {
                for task in batch.tasks {
                    self.start(task);
                }
            }
            server_message::Message::Ack(ack) => self.on_ack(ack),
            server_message::Message::Acks(batch) => {
                for ack in batch.acks {
                    self.on_ack(ack);
                }
            }
            // Drain is handled by the loop; a second Welcome means nothing.
            server_message::Message::Drain(_) | server_message::Message::Welcome(_) => {}
        }
    }

    fn on_ack(&mut self, ack: v1::ResultAck) {
        let ids = Ids::new(&ack.workflow_id, &ack.activity_id, ack.attempt);
        self.carry.unacked.remove(ids.key());
        if !ack.accepted {
            tracing::debug!(workflow_id = %ack.workflow_id, activity_id = %ack.activity_id, attempt = ack.attempt, "result not accepted");
        }
        if let Some(observe) = &self.worker.on_ack {
            observe(&crate::ResultAck {
                workflow_id: ack.workflow_id,
                activity_id: ack.activity_id,
                attempt: ack.attempt,
                accepted: ack.accepted,
            });
        }
    }

    /// Runs `task` on a task of its own, watched as running until its result
    /// comes; while stopping, hands it back instead.
    fn start(&mut self, task: v1::ActivityTask) {
        if self.stopping {
            self.hand_back(task);
            return;
        }
        let key = AttemptKey::new(&task.workflow_id, &task.activity_id, task.attempt);
        let cancel = Arc::new(Cancel::child_of(&self.carry.cancel));
        self.carry.running.insert(key, cancel.clone());
        let of = self.of_type(&task.activity_type);
        of.metrics.task_received();
        let attempt = Attempt::new(task, cancel, self.carry.heartbeats.0.clone());
        tokio::spawn(attempt.run(of, self.carry.results.0.clone(), self.max_payload));
    }

    fn of_type(&mut self, activity_type: &str) -> Arc<OfType> {
        if let Some(of) = self.types.get(activity_type) {
            return of.clone();
        }
        let of = Arc::new(OfType {
            handler: self.worker.handlers.get(activity_type).cloned(),
            limit: self.worker.type_limits.get(activity_type).cloned(),
            metrics: TypeMetrics::new(activity_type),
        });
        self.types.insert(activity_type.to_owned(), of.clone());
        of
    }
}

#[cfg(test)]
mod tests;
