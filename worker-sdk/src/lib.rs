//! The Spool worker SDK: register handlers for activity types, connect, and the
//! server pushes tasks over one bidirectional stream; each handler's outcome goes
//! back on the same stream.
//!
//! ```no_run
//! use spool_worker::{Activity, ActivityError, Worker};
//!
//! /// The contract, shared with the services that submit it.
//! struct Greet;
//! impl Activity for Greet {
//!     const NAME: &'static str = "greet";
//!     type Input = String;
//!     type Output = String;
//! }
//!
//! # async fn example() -> Result<(), spool_worker::Error> {
//! Worker::new("http://127.0.0.1:7070")
//!     .max_concurrency(8)
//!     .register::<Greet, _, _>(|_ctx, name| async move {
//!         Ok::<_, ActivityError>(format!("hello {name}"))
//!     })
//!     .run_until_signal()
//!     .await
//! # }
//! ```
//!
//! Invariants the SDK keeps:
//! - every task received gets exactly one result, even if its handler panics;
//! - results are sent on the session that received the task (the server fences
//!   results to the attempt and the session that ran it);
//! - on shutdown it takes no new work (a task that still arrives is handed back as
//!   a short snooze, which does not count as an attempt), lets running handlers
//!   finish up to the shutdown timeout, then stops sending and reads until the
//!   server closes, so no ack still in flight is lost.

#![deny(missing_docs)]

mod context;
mod error;
mod session;
mod telemetry;
pub mod testing;

use std::{collections::HashMap, future::Future, pin::Pin, sync::Arc, time::Duration};

pub use context::{ActivityContext, ActivityInfo, CancelReason};
pub use error::{ActivityError, Error};
/// OpenTelemetry (the `otel` feature): [`otel::install`] exports this process's
/// spans over OTLP; each attempt's span joins its activity's trace.
#[cfg(feature = "otel")]
pub use spool_proto::otel;
pub use spool_proto::{activity::Activity, activity_type, endpoint::ClientTls, v1::Payload};
use tokio_util::sync::CancellationToken;

/// What a handler returns.
pub type HandlerResult = Result<Payload, ActivityError>;

type BoxFuture = Pin<Box<dyn Future<Output = HandlerResult> + Send>>;
type Handler = Arc<dyn Fn(ActivityContext, Payload) -> BoxFuture + Send + Sync>;
type AckObserver = Arc<dyn Fn(&ResultAck) + Send + Sync>;

/// The server's answer to one result: whether it was recorded as this attempt's
/// outcome. A refused result (`accepted: false`) was for an attempt that had
/// already ended (cancelled, timed out, or taken over after this worker was
/// thought lost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultAck {
    /// The activity's workflow id.
    pub workflow_id: String,
    /// The activity's id within its workflow.
    pub activity_id: String,
    /// The attempt the result was for.
    pub attempt: u32,
    /// Recorded as the attempt's outcome (false: refused, the attempt had ended).
    pub accepted: bool,
}

/// A worker process's connection to Spool, and the handlers it runs.
#[derive(Clone)]
pub struct Worker {
    endpoint: String,
    namespace: String,
    identity: String,
    max_concurrency: u32,
    token: Option<String>,
    tls: ClientTls,
    handlers: HashMap<String, Handler>,
    reconnect_min: Duration,
    reconnect_max: Duration,
    shutdown_timeout: Duration,
    on_ack: Option<AckObserver>,
    /// Types whose handlers may run only so many at once, within `max_concurrency`.
    type_limits: HashMap<String, Arc<tokio::sync::Semaphore>>,
    /// HTTP/2 ping interval and timeout: how fast a dead connection is noticed.
    keep_alive: (Duration, Duration),
    /// Whether the worker is connected now, for [`Worker::connection`].
    connection: Arc<tokio::sync::watch::Sender<Connection>>,
    /// Asks the server for several tasks and acks in one message, and sends
    /// several results in one where the server takes them.
    batches: bool,
}

/// Where a worker's connection stands, as [`Worker::connection`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Not connected yet, or reconnecting after the stream dropped (running
    /// handlers go on; their results wait for the next stream).
    Connecting,
    /// Serving.
    Connected {
        /// The server's id for this worker's session.
        worker_id: String,
        /// This stream resumed the one before it: its attempts were kept.
        resumed: bool,
    },
    /// `run` returned.
    Stopped,
}

impl Worker {
    /// A worker for the server at `endpoint` (`http://host:port`, `host:port`, or
    /// `https://host:port` for TLS with the system's roots), in the default
    /// namespace, running up to 10 activities at once.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            namespace: String::new(),
            identity: default_identity(),
            max_concurrency: 10,
            token: None,
            tls: ClientTls::default(),
            handlers: HashMap::new(),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            shutdown_timeout: Duration::from_secs(30),
            on_ack: None,
            type_limits: HashMap::new(),
            keep_alive: (Duration::from_secs(5), Duration::from_secs(5)),
            batches: true,
            connection: Arc::new(tokio::sync::watch::Sender::new(Connection::Connecting)),
        }
    }

    /// How often the connection is pinged, and how long an unanswered ping may
    /// take before the connection counts as dead and the worker reconnects
    /// (default 5 s and 5 s): keep their sum under three of the server's heartbeat
    /// intervals, so a black-holed connection is noticed and the session resumed
    /// before the server gives the worker up as silent.
    pub fn keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = (interval, timeout);
        self
    }

    /// Watches the connection: connecting, connected (and whether the session was
    /// resumed), stopped. Take it before `run`.
    pub fn connection(&self) -> tokio::sync::watch::Receiver<Connection> {
        self.connection.subscribe()
    }

    pub(crate) fn set_connection(&self, state: Connection) {
        self.connection.send_replace(state);
    }

    /// The namespace whose activities this worker runs (default: the default one).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// A name for this worker in `spool workers` (default: host and process id).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = identity.into();
        self
    }

    /// How many activities run at once; the server never sends more.
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = n.max(1);
        self
    }

    /// At most `n` handlers of `activity_type` run at once (a rate-limited API, a
    /// heavy job), within [`Worker::max_concurrency`]: a task beyond it waits in
    /// this worker for a running one of its type to finish, holding its slot.
    pub fn type_concurrency(mut self, activity_type: impl Into<String>, n: u32) -> Self {
        let permits = usize::try_from(n.max(1)).unwrap_or(usize::MAX);
        self.type_limits.insert(
            activity_type.into(),
            Arc::new(tokio::sync::Semaphore::new(permits)),
        );
        self
    }

    /// The bearer token, when the server requires one.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// A CA certificate (PEM) to trust besides the system's roots, for a server
    /// with a certificate from a private CA (`https://` only).
    pub fn ca_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca_pem = Some(pem.into());
        self
    }

    /// A certificate chain and key (PEM) to present to a server that requires
    /// mutual TLS (`https://` only).
    pub fn client_identity(
        mut self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.identity_pem = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// All TLS settings at once.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = tls;
        self
    }

    /// Bounds of the reconnect backoff (default 100 ms to 5 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// How long running activities may take to finish once `run`'s shutdown token
    /// is cancelled (default 30 s); then they are cancelled.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Whether tasks, results and acks ready together travel in one message
    /// (on by default; a server before batches is spoken to one at a time
    /// anyway). Off, the worker speaks as workers before batches did.
    pub fn batches(mut self, on: bool) -> Self {
        self.batches = on;
        self
    }

    /// Calls `observer` with the server's answer to every result this worker sends,
    /// on the session's task (so it must not block). For audit logs and tests: a
    /// handler's outcome counts only once the server accepted it.
    pub fn on_ack(mut self, observer: impl Fn(&ResultAck) + Send + Sync + 'static) -> Self {
        self.on_ack = Some(Arc::new(observer));
        self
    }

    /// Runs `handler` for every task of the typed activity `A`: its input decoded
    /// from JSON, its output encoded to JSON. Input that does not decode fails the
    /// activity for good (`BadInput`, naming the type and serde's message); an output
    /// that cannot be encoded fails it too (`BadOutput`), never an empty result.
    pub fn register<A, F, Fut>(self, handler: F) -> Self
    where
        A: Activity,
        F: Fn(ActivityContext, A::Input) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<A::Output, ActivityError>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        self.activity(A::NAME, move |ctx, input: Payload| {
            let handler = handler.clone();
            async move {
                let input: A::Input = spool_proto::activity::decode(&input).map_err(|e| {
                    ActivityError::terminal(
                        "BadInput",
                        format!(
                            "the input of {} is not a valid {}: {e}",
                            A::NAME,
                            std::any::type_name::<A::Input>()
                        ),
                    )
                })?;
                let output = handler(ctx, input).await?;
                spool_proto::activity::encode(&output).map_err(|e| {
                    ActivityError::terminal(
                        "BadOutput",
                        format!("the output of {} cannot be encoded: {e}", A::NAME),
                    )
                })
            }
        })
    }

    /// Runs `handler` for every task of `activity_type`, with the raw payloads (any
    /// content type); [`Worker::register`] is the typed form.
    pub fn activity<F, Fut>(mut self, activity_type: impl Into<String>, handler: F) -> Self
    where
        F: Fn(ActivityContext, Payload) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |ctx, input| Box::pin(handler(ctx, input)));
        self.handlers.insert(activity_type.into(), handler);
        self
    }

    /// Connects and runs tasks until `shutdown` is cancelled, reconnecting with
    /// backoff whenever the stream ends. Returns an error only for what retrying
    /// cannot fix: no handlers, or the server refusing the `Hello` (bad namespace,
    /// unsupported protocol, wrong token).
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        if self.handlers.is_empty() {
            return Err(Error::NoHandlers);
        }
        let mut delay = self.reconnect_min;
        // Survives each stream: a reconnect resumes the session, handlers running on.
        let mut carry = session::Carry::new(&self);
        let mut tries: u32 = 0;
        // Until shutdown; then on while a stream lost while stopping may still be
        // resumed to finish what runs (`Carry::finishing`).
        while !shutdown.is_cancelled() || carry.finishing() {
            let ended = session::run(&self, &mut carry, &shutdown).await;
            self.set_connection(Connection::Connecting);
            // A stream that was welcomed worked: however it ended (a cut breaks it
            // with an error), the next try comes soon, within the server's grace.
            if carry.take_welcomed() {
                delay = self.reconnect_min;
                tries = 0;
            }
            match ended {
                Ok(session::Ended) => {
                    if !shutdown.is_cancelled() {
                        tracing::info!("session ended; reconnecting");
                    }
                }
                Err(e) if e.is_permanent() => {
                    tracing::error!(error = %e, "the server refused this worker; stopping: reconnecting cannot help until its configuration (namespace, token, activity types, protocol) changes");
                    carry.stop();
                    self.set_connection(Connection::Stopped);
                    return Err(e);
                }
                Err(e) => {
                    tries += 1;
                    tracing::warn!(error = %e, try_number = tries, "session failed; reconnecting in {delay:?}");
                }
            }
            if !shutdown.is_cancelled() {
                telemetry::reconnected();
            }
            let stopping = shutdown.is_cancelled();
            if stopping {
                // However the shutdown was seen (in the session, or while
                // connecting), its deadline starts once.
                carry.stop_by(self.shutdown_timeout);
                if !carry.finishing() {
                    break;
                }
            }
            let jittered = jittered(delay, rand::random());
            let stop_by = carry.stopping_by();
            tokio::select! {
                _ = tokio::time::sleep(jittered) => {}
                // Shutdown while waiting: a session worth resuming is tried at once.
                _ = shutdown.cancelled(), if !stopping => {
                    carry.stop_by(self.shutdown_timeout);
                    if !carry.finishing() {
                        break;
                    }
                }
                _ = session::sleep_until(stop_by), if stopping => break,
            }
            delay = doubled(delay, self.reconnect_max);
        }
        carry.stop();
        self.set_connection(Connection::Stopped);
        tracing::info!("stopped");
        Ok(())
    }

    /// [`Worker::run`] until the process gets SIGTERM or SIGINT (Ctrl-C): then it
    /// takes no new work, lets running activities finish and report (up to the
    /// shutdown timeout), and returns. What a deploy needs: the attempts it ran are
    /// completed, not lost.
    pub async fn run_until_signal(self) -> Result<(), Error> {
        let shutdown = CancellationToken::new();
        let on_signal = shutdown.clone();
        let signals = tokio::spawn(async move {
            signal().await;
            tracing::info!("signal received: finishing running activities, then stopping");
            on_signal.cancel();
        });
        let result = self.run(shutdown).await;
        signals.abort();
        result
    }
}

/// Completes at the first SIGTERM or SIGINT.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `delay` spread to between half and all of it (`r` in `[0, 1)`), so workers that
/// lost a server together do not reconnect together. Never panics: a delay too long
/// for floating point stays as it is.
fn jittered(delay: Duration, r: f64) -> Duration {
    Duration::try_from_secs_f64(delay.as_secs_f64() * (0.5 + r.clamp(0.0, 1.0) / 2.0))
        .unwrap_or(delay)
}

/// The next reconnect delay: twice `delay`, at most `max`, saturating.
fn doubled(delay: Duration, max: Duration) -> Duration {
    delay.saturating_mul(2).min(max)
}

/// A JSON payload of `value`, for handlers of raw payloads: `Ok(json(&out)?)`. A
/// value that cannot be encoded is an error (terminal: encoding it again fails the
/// same way), never an empty payload.
pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Result<Payload, ActivityError> {
    spool_proto::activity::encode(value).map_err(|e| {
        ActivityError::terminal("BadOutput", format!("the output cannot be encoded: {e}"))
    })
}

fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "worker".to_owned());
    format!("{host}:{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnect_delays_never_overflow() {
        assert_eq!(doubled(Duration::MAX, Duration::MAX), Duration::MAX);
        assert_eq!(
            doubled(Duration::from_secs(3), Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            doubled(Duration::from_millis(100), Duration::MAX),
            Duration::from_millis(200)
        );
        assert!(jittered(Duration::MAX, 0.999) <= Duration::MAX);
        assert_eq!(
            jittered(Duration::from_secs(2), 0.0),
            Duration::from_secs(1)
        );
        assert_eq!(
            jittered(Duration::from_secs(2), 1.0),
            Duration::from_secs(2)
        );
        assert_eq!(jittered(Duration::ZERO, 0.5), Duration::ZERO);
    }
}
