//! `WorkerService.Session`: one bidirectional stream per worker process.
//!
//! The handshake ([`handshake`]) reads the `Hello` and registers the worker; then a
//! session task reads the worker's messages until its stream ends, while the
//! registry and the committer write to the worker's outbound channel.
//!
//! Invariants:
//! - the first message is `Hello`, anything else ends the stream with
//!   `INVALID_ARGUMENT`; `Welcome` is the first message the worker receives;
//! - every `ActivityResult` gets exactly one `ResultAck`, sent after the outcome is
//!   committed (accepted) or refused (not accepted); a result the worker sends
//!   again after a resume, for an attempt that ended while it was away, or whose
//!   ending the store refused, is answered accepted, without a write, when the
//!   store shows that the attempt ended with it (its first ack was lost with the
//!   old stream, or another node wrote it);
//! - reading never waits on the committer: results go, in order, to a forwarder
//!   that commits them and acks each after its commit, so keep-alives are read
//!   whatever the results' backpressure, and a stall of the server is never taken
//!   for the worker's silence (where the reader must wait, silence is not counted);
//! - at most [`ACK_WINDOW`] acks are queued per session: the forwarder waits until
//!   acks leave for the wire (backpressure on a worker that does not read);
//! - when the stream ends, every attempt the worker still held fails as
//!   `WORKER_LOST`; when the server shuts down, they are released instead.

use std::{pin::Pin, sync::Arc, time::Duration};

use spool_proto::{
    duration,
    time::{UnixMillis, now_millis},
    v1::{
        self, ErrorKind, ServerMessage, WorkerMessage, activity_result, worker_message,
        worker_service_server::WorkerService,
    },
};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{Request, Response, Status, Streaming};

use super::{
    Error,
    auth::{Principal, Role, authorize_principal},
    validate,
};
use crate::dispatch::{CommitError, Core};
use crate::{
    dispatch::outbound::{Ack, Ending, Outgoing, Task, ToWorker},
    dispatch::registry::{
        ACK_WINDOW, Answer, AttemptKey, Registration, ResumeRefused, Resumption, Ticket,
    },
    lifecycle,
    store::Attempt,
    store::{ActivityError, HeartbeatDetails, Op, Outcome, SessionTicket, TakeSession, Transition},
};

mod results;
mod wire;

use results::*;
use wire::Greeting;

/// How long a new stream may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How many times in all a result is committed while the store's failure is not
/// one that may pass (see `store::Class`).
const RESULT_TRIES_UNLESS_TRANSIENT: u32 = 3;

/// How long a new or resumed session's stream may wait for its ticket to be
/// stored (several nodes only), well within the silence that evicts a worker.
const TICKET_SAVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The pauses between tries of a write or read the store failed (a result's
/// commit, a resent task's read): from the first, doubling up to the last.
const RESULT_RETRY_FIRST: Duration = Duration::from_millis(100);
const RESULT_RETRY_MAX: Duration = Duration::from_secs(2);

pub struct WorkerApi {
    core: Arc<Core>,
    /// Open sessions per token, for `--max-sessions-per-token`.
    open: Arc<OpenSessions>,
    /// Every session task is spawned here, so shutdown can wait for their clean-up.
    tracker: TaskTracker,
    /// Cancelled when the server shuts down: sessions release their attempts and end.
    shutdown: CancellationToken,
}

impl WorkerApi {
    pub fn new(core: Arc<Core>, tracker: TaskTracker, shutdown: CancellationToken) -> Self {
        let limit = core.config.limits.max_sessions_per_token;
        Self {
            core,
            open: Arc::new(OpenSessions {
                limit,
                counts: std::sync::Mutex::new(std::collections::HashMap::new()),
            }),
            tracker,
            shutdown,
        }
    }
}

/// How many sessions each token holds open.
struct OpenSessions {
    limit: usize,
    counts: std::sync::Mutex<std::collections::HashMap<Arc<str>, usize>>,
}

impl OpenSessions {
    /// A place for one more session of `caller`, held until the session ends.
    fn open(self: &Arc<Self>, caller: &Arc<str>) -> Result<SessionPlace, Error> {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(caller.clone()).or_default();
        if *count >= self.limit {
            return Err(Error::Exhausted(format!(
                "this token already holds {} worker sessions (--max-sessions-per-token); close some, or use another token",
                self.limit
            )));
        }
        *count += 1;
        Ok(SessionPlace {
            open: self.clone(),
            caller: caller.clone(),
        })
    }
}

/// One session's place under `--max-sessions-per-token`; freed when dropped.
struct SessionPlace {
    open: Arc<OpenSessions>,
    caller: Arc<str>,
}

impl Drop for SessionPlace {
    fn drop(&mut self) {
        let mut counts = self.open.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(&self.caller);
            }
        }
    }
}

type SessionStream = Pin<Box<dyn Stream<Item = Result<ServerMessage, Status>> + Send>>;

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    type SessionStream = SessionStream;

    async fn session(
        &self,
        request: Request<Streaming<WorkerMessage>>,
    ) -> Result<Response<SessionStream>, Status> {
        if self.shutdown.is_cancelled() {
            return Err(draining().into());
        }
        let principal = request.extensions().get::<Principal>().cloned();
        let place = match &principal {
            Some(p) => self.open.open(p.caller())?,
            None => {
                return Err(
                    Error::Unauthenticated("no credentials were checked for this call").into(),
                );
            }
        };
        let mut inbound = request.into_inner();
        let mut hello = handshake(&mut inbound).await?;
        let resume = (!hello.resume_worker_id.is_empty()).then(|| {
            (
                std::mem::take(&mut hello.resume_worker_id),
                std::mem::take(&mut hello.resume_token),
            )
        });
        let held = validate::held(std::mem::take(&mut hello.held))?;
        let registration = validate::hello(hello, self.core.config.limits.max_worker_concurrency)?;
        authorize_principal(principal.as_ref(), Role::Worker, &registration.namespace)?;
        let setup = Setup::new(&self.core, principal.as_ref(), registration, held);
        // A draining node takes no new session, but resumes one it holds: its
        // worker, back from a blip, delivers what the drain is waiting for rather
        // than having it released to run again.
        let mut refused = None;
        if let Some((old_id, old_secret)) = resume {
            match self.resume(&setup, &old_id, old_secret).await {
                Ok(resumed) => {
                    crate::metrics::session_resumed(resumed.reattached, resumed.resend.len());
                    tracing::info!(
                        worker_id = %old_id,
                        reattached = resumed.reattached,
                        resent = resumed.resend.len(),
                        cancelled = resumed.cancels.len(),
                        "worker resumed its session"
                    );
                    let row = setup.shared.then(|| setup.ticket_row(&self.core, &old_id));
                    // The session runs, and owns the registration's clean-up, before
                    // the ticket's save awaits: a connection reset meanwhile drops
                    // this call, and must not leave the worker registered for ever.
                    let response = self.start_session(
                        old_id.into(),
                        setup.registration.namespace.clone(),
                        (resumed, setup.greeting(true, "")),
                        place,
                        inbound,
                    );
                    if let Some(row) = row {
                        self.save_ticket(row).await;
                    }
                    return Ok(response);
                }
                Err(why) => {
                    crate::metrics::resume_refused(why.reason());
                    tracing::warn!(worker_id = %old_id, reason = why.reason(), "resume refused: {}; a new session starts", why.explain());
                    refused = Some(why);
                }
            }
        }
        if self.core.registry.is_draining() {
            return Err(draining().into());
        }
        let refused = refused.map_or("", |r| r.explain());
        let namespace = setup.registration.namespace.clone();
        let (worker_id, tx, rx, evict) = self
            .core
            .registry
            .register(setup.registration.clone(), now_millis());
        tracing::info!(%worker_id, "worker connected");
        let row = setup
            .shared
            .then(|| setup.ticket_row(&self.core, &worker_id));
        // As above: the session owns the registration before anything awaits.
        let response = self.serve_stream(
            worker_id,
            namespace,
            (tx, rx, setup.greeting(false, refused)),
            evict,
            place,
            inbound,
        );
        if let Some(row) = row {
            self.save_ticket(row).await;
        }
        Ok(response)
    }
}

/// What a session's set-up settled from its Hello and the server's config: the
/// registration (with its ticket), what the worker says it holds, and what its
/// Welcome and its stored ticket say.
struct Setup {
    registration: Registration,
    held: std::collections::HashSet<AttemptKey>,
    secret: String,
    grace: Duration,
    heartbeat_interval: Duration,
    max_payload_bytes: usize,
    /// Other nodes share the store and the session has a ticket: it is saved
    /// where they can check it.
    shared: bool,
    caller: String,
    fingerprint: String,
}

impl Setup {
    fn new(
        core: &Core,
        principal: Option<&Principal>,
        mut registration: Registration,
        held: std::collections::HashSet<AttemptKey>,
    ) -> Self {
        let grace = core.config.resume_grace();
        let ticket = match principal {
            Some(p) if !grace.is_zero() => Some(Ticket::new(p.caller().clone())),
            _ => None,
        };
        let secret = ticket
            .as_ref()
            .map(|t| t.secret.clone())
            .unwrap_or_default();
        registration.ticket = ticket;
        let fingerprint = format!(
            "{}|{}|{}",
            registration.namespace,
            registration.activity_types.join(","),
            registration.max_concurrency
        );
        Self {
            shared: !core.store.single_node() && !secret.is_empty(),
            caller: principal
                .map(|p| p.caller().to_string())
                .unwrap_or_default(),
            registration,
            held,
            secret,
            grace,
            heartbeat_interval: core.config.heartbeat_interval,
            max_payload_bytes: core.config.max_payload_bytes,
            fingerprint,
        }
    }

    /// What the session's `Welcome` says; `refused` explains a resume refused.
    fn greeting(&self, resumed: bool, refused: &'static str) -> Greeting {
        Greeting {
            heartbeat_interval: self.heartbeat_interval,
            max_concurrency: self.registration.max_concurrency,
            max_payload_bytes: self.max_payload_bytes,
            resume_token: self.secret.clone(),
            resume_grace: self.grace,
            resumed,
            resume_refused: refused,
        }
    }

    fn ticket_row(&self, core: &Core, worker_id: &str) -> SessionTicket {
        SessionTicket {
            worker_id: worker_id.to_owned(),
            secret: self.secret.clone(),
            caller: self.caller.clone(),
            registration: self.fingerprint.clone(),
            at: core.store.now(),
        }
    }
}

impl WorkerApi {
    /// The session `old_id` resumed on this stream: held here, or, with other
    /// nodes, taken over from the node that held it (the database decides).
    async fn resume(
        &self,
        setup: &Setup,
        old_id: &str,
        old_secret: String,
    ) -> Result<Resumption, ResumeRefused> {
        let local = self.core.registry.resume_session(
            old_id,
            &old_secret,
            &setup.registration,
            &setup.held,
        );
        match local {
            Ok(resumed) => Ok(resumed),
            // Not held here, or held with an older ticket (the session moved to
            // another node and back): with other nodes, the database decides.
            Err(why @ (ResumeRefused::Unknown | ResumeRefused::Ticket))
                if setup.shared
                    && !self.core.registry.is_draining()
                    && (why == ResumeRefused::Ticket || !self.core.registry.knows(old_id)) =>
            {
                let take = TakeSession {
                    ticket: setup.ticket_row(&self.core, old_id),
                    old_secret,
                    node: self.core.registry.node().to_string(),
                };
                match self.core.store.take_session(&take).await {
                    Ok(Some(rows)) => {
                        tracing::info!(worker_id = %old_id, attempts = rows.len(), "taking over a session from another node");
                        Ok(self.core.registry.adopt(
                            old_id,
                            setup.registration.clone(),
                            rows,
                            &setup.held,
                            self.core.store.now(),
                        ))
                    }
                    Ok(None) => Err(why),
                    Err(e) => {
                        tracing::warn!(worker_id = %old_id, error = %e, "cannot read the session to resume");
                        Err(ResumeRefused::Unknown)
                    }
                }
            }
            Err(why) => Err(why),
        }
    }

    /// Keeps a session's ticket where the other nodes can check it. Without it the
    /// session can still be resumed here, only not elsewhere. The session already
    /// runs (its Welcome waits in its channel until this call answers), so a call
    /// dropped meanwhile leaves nothing registered that no one removes, and a
    /// database slow to take the ticket does not hold the stream back.
    async fn save_ticket(&self, ticket: SessionTicket) {
        let saved = tokio::time::timeout(TICKET_SAVE_TIMEOUT, self.core.store.save_ticket(&ticket));
        let why = match saved.await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!(
                "not stored within {}",
                duration::format(TICKET_SAVE_TIMEOUT)
            ),
        };
        tracing::warn!(worker_id = %ticket.worker_id, error = %why, "cannot store the session's resume ticket: it can be resumed on this node only");
    }

    /// Runs a resumed session on its new stream: first the tasks the worker never
    /// got (read again from the store) and the cancels it must hear again.
    fn start_session(
        &self,
        worker_id: Arc<str>,
        namespace: Arc<str>,
        (resumed, greeting): (Resumption, Greeting),
        place: SessionPlace,
        inbound: Streaming<WorkerMessage>,
    ) -> Response<SessionStream> {
        let Resumption {
            tx,
            rx,
            evict,
            resend,
            cancels,
            ..
        } = resumed;
        for cancel in cancels {
            let _ = tx.try_send(Outgoing::new(ToWorker::Cancel(cancel)));
        }
        if !resend.is_empty() {
            let (core, tx, worker_id) = (self.core.clone(), tx.clone(), worker_id.clone());
            self.tracker.spawn(async move {
                for attempt in resend {
                    resend_task(&core, &tx, &worker_id, &attempt).await;
                }
            });
        }
        self.serve_stream(
            worker_id,
            namespace,
            (tx, rx, greeting),
            evict,
            place,
            inbound,
        )
    }

    /// Starts the session task reading `inbound`, and answers with the stream of
    /// what the worker is sent.
    fn serve_stream(
        &self,
        worker_id: Arc<str>,
        namespace: Arc<str>,
        (tx, rx, greeting): (mpsc::Sender<Outgoing>, mpsc::Receiver<Outgoing>, Greeting),
        evict: CancellationToken,
        place: SessionPlace,
        inbound: Streaming<WorkerMessage>,
    ) -> Response<SessionStream> {
        let session = Session {
            core: self.core.clone(),
            worker_id,
            namespace,
            tx,
            window: Arc::new(Semaphore::new(ACK_WINDOW)),
            evict,
            _place: place,
        };
        self.tracker
            .spawn(session.run(inbound, self.shutdown.clone()));
        // Dropping each `Outgoing` as it is sent returns its ack permit.
        let outbound = ReceiverStream::new(rx).map(move |out| wire::encode(out.message, &greeting));
        Response::new(Box::pin(outbound))
    }
}

/// Reads the first message, which must be a `Hello`.
pub async fn handshake<S>(inbound: &mut S) -> Result<v1::Hello, Error>
where
    S: Stream<Item = Result<WorkerMessage, Status>> + Unpin,
{
    // A stream that breaks or stalls before its Hello says nothing about the
    // worker's configuration: UNAVAILABLE, which a worker retries. Only a first
    // message that is not a Hello is the worker's mistake.
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next())
        .await
        .map_err(|_| {
            Error::Unavailable(format!(
                "no Hello within {}s of opening the stream; reconnect",
                HELLO_TIMEOUT.as_secs()
            ))
        })?;
    match first {
        Some(Ok(WorkerMessage {
            message: Some(worker_message::Message::Hello(hello)),
        })) => Ok(hello),
        Some(Ok(_)) => Err(Error::InvalidArgument(
            "the first message of a Session must be a Hello".to_owned(),
        )),
        Some(Err(status))
            if matches!(
                status.code(),
                tonic::Code::OutOfRange | tonic::Code::ResourceExhausted
            ) =>
        {
            Err(Error::Exhausted(format!(
                "the Hello is larger than this server accepts: {}",
                status.message()
            )))
        }
        Some(Err(status)) => Err(Error::Unavailable(format!(
            "the stream failed before Hello: {}; reconnect",
            status.message()
        ))),
        None => Err(Error::Unavailable(
            "the stream ended before Hello; reconnect".to_owned(),
        )),
    }
}

/// How a session ended, which decides the fate of the attempts it held.
enum End {
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

struct Session {
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
    /// This session's place under `--max-sessions-per-token`.
    _place: SessionPlace,
}

impl Session {
    /// Reads the worker's messages until its stream ends. Reading never waits on
    /// the committer: results go to a forwarder task that commits them in order, so
    /// keep-alives are read while results queue behind a slow commit, and a stall of
    /// the server is never taken for silence of the worker.
    async fn run(self, mut inbound: Streaming<WorkerMessage>, shutdown: CancellationToken) {
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
        let end = loop {
            let message = tokio::select! {
                m = inbound.message() => m,
                _ = shutdown.cancelled() => break End::Shutdown,
                _ = self.evict.cancelled() => break self.evicted(),
            };
            match message {
                Ok(Some(WorkerMessage { message: Some(m) })) => {
                    let item = match m {
                        worker_message::Message::Result(result) => self.on_result(result),
                        worker_message::Message::Goodbye(_) => {
                            // No more claims for it; the forwarder answers with Drain
                            // once none planned before can still arrive.
                            self.core.registry.leave(&self.worker_id);
                            Forward::Goodbye
                        }
                        worker_message::Message::Heartbeat(beat) => {
                            self.on_heartbeat(beat);
                            continue;
                        }
                        worker_message::Message::Hello(_) => {
                            let _ =
                                self.tx
                                    .try_send(Outgoing::new(ToWorker::End(Ending::Protocol(
                                        "Hello may only be the first message of a Session",
                                    ))));
                            break End::Lost("protocol error: second Hello".to_owned());
                        }
                    };
                    if let Err(mpsc::error::TrySendError::Full(item)) = forward.try_send(item) {
                        // Only a worker answering attempts it does not hold, faster
                        // than it reads the refusals, gets here: wait for room, and do
                        // not count the wait as the worker's silence.
                        let _paused = self.core.registry.pause_silence(&self.worker_id);
                        tokio::select! {
                            _ = forward.send(item) => {}
                            _ = shutdown.cancelled() => break End::Shutdown,
                            _ = self.evict.cancelled() => break self.evicted(),
                        }
                    }
                }
                // A message kind this server does not know (a newer worker): skip it.
                Ok(Some(WorkerMessage { message: None })) => {}
                Ok(None) => break End::Dropped("the worker closed its stream".to_owned()),
                Err(status) => {
                    break End::Dropped(format!("the stream broke: {}", status.message()));
                }
            }
        };
        // Results already read are still committed; their acks go out only if the
        // window has room (the worker may be gone).
        drop(forward);
        over.cancel();
        self.finish(end).await;
        let _ = forwarder.await;
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

    fn on_heartbeat(&self, beat: v1::Heartbeat) {
        let now = tokio::time::Instant::now();
        if beat.workflow_id.is_empty() && beat.activity_id.is_empty() {
            self.core.registry.touch(&self.worker_id, now);
            return;
        }
        // Without details the heartbeat says "alive"; the details reported last
        // stay as they are.
        let details = beat.details.and_then(|mut d| {
            if validate::check_size("heartbeat.details", &d, self.core.config.max_payload_bytes)
                .is_err()
            {
                tracing::warn!(worker_id = %self.worker_id, activity_id = %beat.activity_id, "heartbeat details over the payload limit dropped");
                return None;
            }
            validate::worker_content_type(&mut d);
            Some(d)
        });
        self.core.registry.heartbeat(
            &self.worker_id,
            &beat.workflow_id,
            &beat.activity_id,
            beat.attempt,
            details,
            now,
        );
    }

    /// Takes the attempt a result answers (freeing its slot at once, so the next
    /// claim can share the result's commit) and decides what to write.
    fn on_result(&self, result: v1::ActivityResult) -> Forward {
        self.core
            .registry
            .touch(&self.worker_id, tokio::time::Instant::now());
        let ack = Ack {
            workflow_id: result.workflow_id.clone(),
            activity_id: result.activity_id.clone(),
            attempt: result.attempt,
            accepted: false,
        };
        let (attempt, details) = match self.core.registry.answer(
            &self.worker_id,
            &result.workflow_id,
            &result.activity_id,
            result.attempt,
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
        let transition = decide(
            &attempt,
            result.outcome,
            self.core.config.max_payload_bytes,
            self.core.store.now(),
        );
        let mut ops = Vec::with_capacity(2);
        if let Some(details) = details {
            // The last progress reported survives the attempt's end.
            ops.push(Op::RecordHeartbeats(vec![HeartbeatDetails {
                id: attempt.id,
                attempt: attempt.attempt,
                details: Some(details),
            }]));
        }
        ops.push(Op::Finish {
            attempt,
            transition,
            lease_expired_by: None,
        });
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
                Op::Finish {
                    attempt,
                    transition,
                    lease_expired_by: None,
                }
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

fn draining() -> Error {
    Error::Unavailable("the server is draining for a restart: reconnect with backoff".to_owned())
}

#[cfg(test)]
mod tests;
