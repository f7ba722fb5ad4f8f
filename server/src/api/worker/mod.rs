//! `WorkerService.Session`: one bidirectional stream per worker process.
//!
//! The handshake ([`handshake`]) reads the `Hello`, registers the worker (or
//! resumes its session) and saves its resume ticket; then
//! `dispatch::session::Session` reads what the worker sends, decoded by `wire`,
//! while the registry and the committer write to the worker's outbound channel,
//! encoded by `wire` as it leaves.
//!
//! Invariants:
//! - the first message is `Hello`, anything else ends the stream with
//!   `INVALID_ARGUMENT`; `Welcome` is the first message the worker receives;
//! - the session runs, and owns its registration's clean-up, before anything of
//!   its set-up awaits (a connection reset then leaves nothing registered);
//! - what a worker sends is held to the limits before dispatch sees it.

use std::{pin::Pin, sync::Arc, time::Duration};

use spool_proto::{
    duration,
    time::now_millis,
    v1::{
        self, ServerMessage, WorkerMessage, worker_message, worker_service_server::WorkerService,
    },
};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{Request, Response, Status, Streaming};

use super::{
    Error,
    auth::{Principal, Role, authorize_principal},
    validate,
};
use crate::{
    dispatch::{
        Core,
        outbound::{Outgoing, ToWorker},
        registry::{AttemptKey, Registration, ResumeRefused, Resumption, Ticket},
        session::{self, Inbound, Session},
    },
    store::{SessionTicket, TakeSession},
};

mod wire;

use wire::Greeting;

/// How long a new stream may take to send its `Hello`.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a new or resumed session's stream may wait for its ticket to be
/// stored (several nodes only), well within the silence that evicts a worker.
const TICKET_SAVE_TIMEOUT: Duration = Duration::from_secs(3);

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
        let batches = hello.batches;
        let registration = validate::hello(hello, self.core.config.limits.max_worker_concurrency)?;
        authorize_principal(principal.as_ref(), Role::Worker, &registration.namespace)?;
        let setup = Setup::new(&self.core, principal.as_ref(), registration, held, batches);
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
    /// The worker takes several tasks or acks in one message.
    batches: bool,
}

impl Setup {
    fn new(
        core: &Core,
        principal: Option<&Principal>,
        mut registration: Registration,
        held: std::collections::HashSet<AttemptKey>,
        batches: bool,
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
            batches,
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
            batches: self.batches,
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
                    session::resend_task(&core, &tx, &worker_id, &attempt).await;
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
        let session = Session::new(self.core.clone(), worker_id.clone(), namespace, tx, evict);
        let max_payload = self.core.config.max_payload_bytes;
        let inbound: Inbound = Box::pin(inbound.filter_map(move |message| match message {
            Ok(message) => wire::decode(message, max_payload, &worker_id).map(Ok),
            Err(status) => Some(Err(status.message().to_owned())),
        }));
        let shutdown = self.shutdown.clone();
        self.tracker.spawn(async move {
            // The place under `--max-sessions-per-token` is held while the session runs.
            let _place = place;
            session.run(inbound, shutdown).await
        });
        // Dropping each `Outgoing` as it is sent returns its ack permit.
        Response::new(Box::pin(wire::Frames::new(rx, greeting)))
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

fn draining() -> Error {
    Error::Unavailable("the server is draining for a restart: reconnect with backoff".to_owned())
}

#[cfg(test)]
mod tests;
