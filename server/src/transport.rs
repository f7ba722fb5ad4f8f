//! The network edge: what any peer can cost the server before a token is even
//! checked. Owns the connection cap, the HTTP/2 limits every connection gets, TLS,
//! and the bound on long-lived unauthenticated streams.
//!
//! Invariants:
//! - at most `--max-connections` connections are open: the next one is accepted only
//!   once another closes (a permit is taken *before* `accept`, so a flood waits in
//!   the kernel's backlog, not in our memory); a connection that has not sent the
//!   start of a handshake ([`HANDSHAKE_BYTES`]) within [`HANDSHAKE_TIMEOUT`] is
//!   closed, and one that has made no authenticated request within
//!   `--first-request-timeout` too (health checks do not count), so sockets that
//!   only answer pings cannot hold the cap;
//! - at most `--max-connections-per-peer` connections come from one IP address:
//!   more are closed as they are accepted, so one peer cannot take every place;
//! - every connection advertises `SETTINGS_MAX_CONCURRENT_STREAMS`, bounds streams
//!   reset before they are accepted and streams the server resets for errors (both
//!   end in GOAWAY: HTTP/2 rapid reset), bounds header lists, and answers no
//!   keep-alive PING within `--keepalive-timeout` with a close;
//! - health `Watch` and reflection streams, open to anyone, hold a permit each for
//!   their whole life; past `--max-unauthenticated-streams` a new one is refused
//!   with RESOURCE_EXHAUSTED.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::IpAddr,
    path::Path,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tokio_stream::Stream;
use tokio_util::sync::PollSemaphore;
use tonic::{
    Status,
    body::Body,
    codegen::{BoxFuture, Service, http},
    server::NamedService,
    transport::{
        Certificate, Identity, ServerTlsConfig,
        server::{Connected, TcpIncoming},
    },
};

use crate::config::{Limits, Tls};

/// How long a new connection may take to send its first [`HANDSHAKE_BYTES`].
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/2 connection preface is 24 bytes; a TLS ClientHello is longer.
pub const HANDSHAKE_BYTES: usize = 24;

/// TLS settings that cannot be used; the server does not start.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {path}: {reason}")]
pub struct TlsError {
    flag: &'static str,
    path: String,
    reason: String,
}

/// Reads the PEM files `tls` names, failing with the flag and file at fault.
pub fn tls_config(tls: &Tls) -> Result<ServerTlsConfig, TlsError> {
    let read = |flag: &'static str, path: &Path| {
        let fail = |reason: String| TlsError {
            flag,
            path: path.display().to_string(),
            reason,
        };
        let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
            return Err(fail("is not a PEM file".to_owned()));
        }
        Ok(pem)
    };
    let cert = read("--tls-cert", &tls.cert)?;
    let key = read("--tls-key", &tls.key)?;
    // The handshake guard lets a connection go once its first bytes came, which
    // with TLS is only the start of a ClientHello: the whole TLS handshake is
    // bounded by the same timeout, or a stalled one would hold its place for good.
    let mut config = ServerTlsConfig::new()
        .identity(Identity::from_pem(cert, key))
        .timeout(HANDSHAKE_TIMEOUT);
    if let Some(ca) = &tls.client_ca {
        config = config.client_ca_root(Certificate::from_pem(read("--tls-client-ca", ca)?));
    }
    Ok(config)
}

/// The HTTP/2 limits of every connection.
pub fn builder(limits: &Limits) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(limits.max_pending_accept_reset_streams))
        // tonic's default (None) would switch off hyper's own cap: RUSTSEC-2024-0003.
        .http2_max_local_error_reset_streams(Some(limits.max_local_error_reset_streams))
        .http2_max_header_list_size(limits.max_header_list_bytes)
        .http2_keepalive_interval(Some(limits.keepalive_interval))
        .http2_keepalive_timeout(Some(limits.keepalive_timeout))
        .accept_http1(false)
}

/// Accepted connections, at most `--max-connections` open at once and
/// `--max-connections-per-peer` from one address.
pub struct Incoming {
    inner: TcpIncoming,
    permits: PollSemaphore,
    /// A permit taken for the next connection, before accepting it.
    next: Option<OwnedSemaphorePermit>,
    /// Whether the cap was hit and not yet logged (once per stretch at the cap).
    full_logged: bool,
    /// Open connections by peer address; each connection's [`PeerSlot`] gives
    /// its count back when it closes.
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max_per_peer: usize,
    /// When a peer over its cap was last logged (once per 10 s at most).
    peer_logged: Option<tokio::time::Instant>,
    first_request_timeout: Duration,
}

impl Incoming {
    pub fn new(listener: TcpListener, limits: &Limits) -> Self {
        // Without TCP_NODELAY, Nagle's algorithm and delayed ACKs hold small
        // messages (a task, an ack) back by tens of milliseconds.
        let inner = TcpIncoming::from(listener)
            .with_nodelay(Some(true))
            .with_keepalive(Some(Duration::from_secs(30)));
        Self {
            inner,
            permits: PollSemaphore::new(Arc::new(Semaphore::new(limits.max_connections))),
            next: None,
            full_logged: false,
            peers: Arc::default(),
            max_per_peer: limits.max_connections_per_peer,
            peer_logged: None,
            first_request_timeout: limits.first_request_timeout,
        }
    }

    /// A place for one more connection from `ip`, unless it holds its cap.
    fn admit(&mut self, ip: IpAddr) -> Option<PeerSlot> {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let open = peers.entry(ip).or_insert(0);
        if *open >= self.max_per_peer {
            return None;
        }
        *open += 1;
        Some(PeerSlot {
            peers: self.peers.clone(),
            ip,
        })
    }
}

/// One connection's place in its peer's count.
struct PeerSlot {
    peers: Arc<Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(open) = peers.get_mut(&self.ip) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

/// What a request knows of its connection (in its extensions): the flag the
/// auth interceptor sets once a request authenticated.
#[derive(Debug, Clone)]
pub struct Peer {
    authenticated: Arc<AtomicBool>,
}

impl Peer {
    /// The connection made an authenticated request: it may stay open.
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Release);
    }
}

impl Stream for Incoming {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.next.is_none() {
            if this.permits.available_permits() == 0 && !this.full_logged {
                this.full_logged = true;
                crate::metrics::connections_refused("max_connections");
                tracing::warn!("--max-connections reached: new connections wait until one closes");
            }
            match this.permits.poll_acquire(cx) {
                Poll::Ready(Some(permit)) => {
                    this.next = Some(permit);
                    this.full_logged = false;
                }
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
        loop {
            let stream = match Pin::new(&mut this.inner).poll_next(cx) {
                Poll::Ready(Some(Ok(stream))) => stream,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            };
            let ip = match stream.peer_addr() {
                Ok(addr) => addr.ip().to_canonical(),
                Err(_) => continue,
            };
            let Some(peer_slot) = this.admit(ip) else {
                // Closed at once; the permit waits for the next connection.
                crate::metrics::connections_refused("max_connections_per_peer");
                let now = tokio::time::Instant::now();
                if this
                    .peer_logged
                    .is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(10))
                {
                    this.peer_logged = Some(now);
                    tracing::warn!(%ip, "--max-connections-per-peer reached: its new connections are closed");
                }
                continue;
            };
            crate::metrics::connection_opened();
            return Poll::Ready(Some(Ok(Connection {
                stream,
                _permit: this.next.take(),
                _peer_slot: peer_slot,
                handshake: Some((Box::pin(tokio::time::sleep(HANDSHAKE_TIMEOUT)), 0)),
                authenticated: Arc::default(),
                first_request: Some(Box::pin(tokio::time::sleep(this.first_request_timeout))),
            })));
        }
    }
}

/// One accepted connection; closing it frees its place under the caps.
pub struct Connection {
    stream: TcpStream,
    _permit: Option<OwnedSemaphorePermit>,
    _peer_slot: PeerSlot,
    /// Until the handshake has begun: its deadline and the bytes read so far.
    handshake: Option<(Pin<Box<tokio::time::Sleep>>, usize)>,
    /// Set by the auth interceptor (through [`Peer`]) on the first
    /// authenticated request.
    authenticated: Arc<AtomicBool>,
    /// Until then: the deadline for it.
    first_request: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        crate::metrics::connection_closed();
    }
}

impl Connected for Connection {
    type ConnectInfo = Peer;

    fn connect_info(&self) -> Self::ConnectInfo {
        Peer {
            authenticated: self.authenticated.clone(),
        }
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        // Polled on every read, so the deadline wakes the connection by itself,
        // and a peer that keeps the socket busy cannot put it off.
        if let Some(deadline) = &mut this.first_request {
            if this.authenticated.load(Ordering::Acquire) {
                this.first_request = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                crate::metrics::connections_refused("first_request_timeout");
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no authenticated request within --first-request-timeout",
                )));
            }
        }
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Some((deadline, seen)) = &mut this.handshake {
            *seen += buf.filled().len() - before;
            if *seen >= HANDSHAKE_BYTES {
                this.handshake = None;
            } else if read.is_pending() && deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no handshake within the handshake timeout",
                )));
            }
        }
        read
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// A service behind the edge's own answers:
/// - a message over the size limit is answered with RESOURCE_EXHAUSTED, saying
///   which limit, rather than tonic's OUT_OF_RANGE: a client retrying on
///   RESOURCE_EXHAUSTED with a smaller message, or reporting it, meets the same
///   code as for every other limit;
/// - with a bound, each call holds a permit of a shared semaphore until its
///   response body ends: a bound on concurrent streams of services that need no
///   token (health `Watch`, reflection).
#[derive(Clone)]
pub struct Guarded<S> {
    inner: S,
    /// `None`: the service's streams are not bounded.
    bound: Option<Bound>,
}

/// A bound on a service's open streams.
#[derive(Clone)]
struct Bound {
    permits: Arc<Semaphore>,
    /// The one method bounded (`None`: all of them); others pass freely, so a
    /// liveness probe's unary `Check` is never refused for want of a `Watch` slot.
    method: Option<&'static str>,
}

impl<S> Guarded<S> {
    /// Guards the size of `inner`'s messages, its streams unbounded.
    pub fn new(inner: S) -> Self {
        Self { inner, bound: None }
    }

    /// Bounds every call of `inner` too.
    pub fn bounded(inner: S, permits: Arc<Semaphore>) -> Self {
        let bound = Bound {
            permits,
            method: None,
        };
        Self {
            inner,
            bound: Some(bound),
        }
    }

    /// Bounds the calls of `inner`'s `method` only.
    pub fn bounded_method(inner: S, method: &'static str, permits: Arc<Semaphore>) -> Self {
        let bound = Bound {
            permits,
            method: Some(method),
        };
        Self {
            inner,
            bound: Some(bound),
        }
    }

    /// A permit for `request`, `Ok(None)` where it needs none; `Err` where the
    /// bound is reached.
    fn permit<B>(
        &self,
        request: &http::Request<B>,
    ) -> Result<Option<OwnedSemaphorePermit>, Status> {
        let Some(Bound { permits, method }) = &self.bound else {
            return Ok(None);
        };
        let bounded = method.is_none_or(|m| {
            request
                .uri()
                .path()
                .rsplit_once('/')
                .is_some_and(|(_, name)| name == m)
        });
        if !bounded {
            return Ok(None);
        }
        match permits.clone().try_acquire_owned() {
            Ok(permit) => Ok(Some(permit)),
            Err(_) => {
                crate::metrics::connections_refused("max_unauthenticated_streams");
                Err(Status::resource_exhausted(
                    "too many health or reflection streams are open (--max-unauthenticated-streams); retry later",
                ))
            }
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Guarded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let permit = match self.permit(&request) {
            Ok(permit) => permit,
            Err(status) => return Box::pin(async move { Ok(status.into_http()) }),
        };
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            // A unary call's request is decoded before its handler runs; its
            // refusal is a trailers-only answer, its status in the headers.
            let status = Status::from_header_map(response.headers());
            if let Some(status) = status.filter(|s| {
                s.code() == tonic::Code::OutOfRange
                    && s.message().contains("message length too large")
            }) {
                return Ok(Status::resource_exhausted(format!(
                    "the message is larger than this server accepts (4 × --max-payload-bytes + 1 MiB): {}",
                    status.message()
                ))
                .into_http());
            }
            Ok(match permit {
                Some(permit) => response.map(|body| {
                    Body::new(Permitted {
                        body,
                        _permit: permit,
                    })
                }),
                None => response,
            })
        })
    }
}

/// A response body that holds a permit until it ends (or is dropped).
struct Permitted {
    body: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Permitted {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
