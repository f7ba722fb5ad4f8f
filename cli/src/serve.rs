//! `spool serve`: its flags, the server's `Config` they make, and running the
//! server until a signal drains it.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context;
use spool_server::Config;

use crate::{args::duration, logging::init_logging};

#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "SPOOL_LISTEN", default_value = "127.0.0.1:7070")]
    listen: SocketAddr,
    /// Database URL: sqlite://PATH (one file, created if missing) or
    /// postgres://USER:PASSWORD@HOST/DB (several nodes may share it).
    #[arg(long, env = "SPOOL_DATABASE_URL", default_value = "sqlite://spool.db")]
    database: String,
    /// How long in-flight activities may finish when draining.
    #[arg(long, env = "SPOOL_DRAIN_TIMEOUT", default_value = "30s", value_parser = duration)]
    drain_timeout: Duration,
    /// How long a running activity's lease lasts without renewal.
    #[arg(long, env = "SPOOL_LEASE_TIMEOUT", default_value = "30s", value_parser = duration)]
    lease_timeout: Duration,
    /// How often workers must send a keep-alive.
    #[arg(long, env = "SPOOL_HEARTBEAT_INTERVAL", default_value = "5s", value_parser = duration)]
    heartbeat_interval: Duration,
    /// A bearer token every client and worker must present.
    #[arg(long, env = "SPOOL_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// A JSON file of tokens with roles and namespaces (see README).
    #[arg(long, env = "SPOOL_TOKENS_FILE")]
    tokens_file: Option<std::path::PathBuf>,
    /// The largest payload accepted, in bytes.
    #[arg(long, env = "SPOOL_MAX_PAYLOAD_BYTES", default_value_t = 4 * 1024 * 1024)]
    max_payload_bytes: usize,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, env = "SPOOL_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// The most (namespace, activity type) pairs labelled in metrics; later ones
    /// are counted as `_other`.
    #[arg(long, env = "SPOOL_METRICS_MAX_TYPES", default_value_t = spool_server::metrics::DEFAULT_MAX_TYPES)]
    metrics_max_types: usize,
    /// Serve the web dashboard at http://ADDR/ (off unless set). It takes the same
    /// tokens as the API.
    #[arg(long, env = "SPOOL_UI_LISTEN")]
    ui_listen: Option<SocketAddr>,
    /// The dashboard shows everything and changes nothing, whatever the token.
    #[arg(long, env = "SPOOL_UI_READ_ONLY")]
    ui_read_only: bool,
    /// This server's name in attempt histories and worker lists (default: the
    /// host name and the port; nodes sharing a database need different names).
    #[arg(long, env = "SPOOL_NODE_NAME")]
    node_name: Option<String>,
    /// How long a worker whose connection dropped may reconnect and resume its
    /// session, keeping its running attempts (default: 5s, or half the lease if
    /// shorter; 0s: attempts are lost at once, as WORKER_LOST).
    #[arg(long, env = "SPOOL_RESUME_GRACE", value_parser = duration)]
    resume_grace: Option<Duration>,
    /// How much waiting outweighs one level of priority: with 10s, a row waits
    /// at most 10s per level of difference before rows of higher priority due
    /// after it stop overtaking it (0s: strict priority, highest first). Stored
    /// in the database, for every node sharing it; without the flag a node keeps
    /// what is stored (strict, on a new database).
    #[arg(long, env = "SPOOL_PRIORITY_AGING", value_parser = duration)]
    priority_aging: Option<Duration>,
    /// How long finished activities are kept.
    #[arg(long, env = "SPOOL_RETENTION", default_value = "7d", value_parser = duration)]
    retention: Duration,
    /// Log format: text or json (level from RUST_LOG, default info).
    #[arg(long, env = "SPOOL_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,
    /// TLS certificate chain (PEM); with --tls-key, the server speaks TLS only.
    #[arg(long, env = "SPOOL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) for --tls-cert.
    #[arg(long, env = "SPOOL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// CA (PEM) whose certificates clients must present (mutual TLS).
    #[arg(long, env = "SPOOL_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitArgs,
    /// Export the server's spans over OTLP/gRPC to this collector (for example
    /// http://127.0.0.1:4317); logs still go to stderr.
    #[cfg(feature = "otel")]
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
}

/// What one client may take of the server (see docs/SECURITY.md).
#[derive(clap::Args)]
struct LimitArgs {
    /// Open connections; more wait until one closes.
    #[arg(long, env = "SPOOL_MAX_CONNECTIONS", default_value_t = 4096)]
    max_connections: usize,
    /// Open connections from one IP address; more are closed at once (raise it
    /// behind a proxy, whose connections all come from its address).
    #[arg(long, env = "SPOOL_MAX_CONNECTIONS_PER_PEER", default_value_t = 1024)]
    max_connections_per_peer: usize,
    /// How long a connection may stay open before its first authenticated
    /// request (health checks do not count).
    #[arg(long, env = "SPOOL_FIRST_REQUEST_TIMEOUT", default_value = "30s", value_parser = duration)]
    first_request_timeout: Duration,
    /// HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, env = "SPOOL_MAX_CONCURRENT_STREAMS", default_value_t = 1024)]
    max_concurrent_streams: u32,
    /// Streams a client may reset before the server accepts them, before GOAWAY.
    #[arg(long, env = "SPOOL_MAX_PENDING_RESET_STREAMS", default_value_t = 20)]
    max_pending_reset_streams: usize,
    /// Streams the server may reset for protocol errors on a connection, before GOAWAY.
    #[arg(long, env = "SPOOL_MAX_LOCAL_RESET_STREAMS", default_value_t = 1024)]
    max_local_reset_streams: usize,
    /// The largest request header list (metadata), in bytes.
    #[arg(long, env = "SPOOL_MAX_HEADER_LIST_BYTES", default_value_t = 16 * 1024)]
    max_header_list_bytes: u32,
    /// Worker sessions one token may hold open (one caller, without tokens).
    #[arg(long, env = "SPOOL_MAX_SESSIONS_PER_TOKEN", default_value_t = 4096)]
    max_sessions_per_token: usize,
    /// The most slots a worker session is granted (its Hello may ask for fewer).
    #[arg(long, env = "SPOOL_MAX_WORKER_CONCURRENCY", default_value_t = spool_server::limits::DEFAULT_WORKER_CONCURRENCY)]
    max_worker_concurrency: u32,
    /// Open health Watch and reflection streams, which need no token.
    #[arg(long, env = "SPOOL_MAX_UNAUTHENTICATED_STREAMS", default_value_t = 64)]
    max_unauthenticated_streams: usize,
    /// The longest a unary call (but Wait and Drain) may take.
    #[arg(long, env = "SPOOL_REQUEST_TIMEOUT", default_value = "60s", value_parser = duration)]
    request_timeout: Duration,
    /// The longest one Wait parks before answering with the current state.
    #[arg(long, env = "SPOOL_MAX_WAIT", default_value = "1h", value_parser = duration)]
    max_wait: Duration,
    /// Wait calls one token may have parked at once (one caller, without tokens).
    #[arg(long, env = "SPOOL_MAX_WAITS_PER_TOKEN", default_value_t = 10_000)]
    max_waits_per_token: usize,
    /// Wait calls parked at once on this node.
    #[arg(long, env = "SPOOL_MAX_WAITS", default_value_t = 100_000)]
    max_waits: usize,
    /// HTTP/2 keep-alive PING interval.
    #[arg(long, env = "SPOOL_KEEPALIVE_INTERVAL", default_value = "10s", value_parser = duration)]
    keepalive_interval: Duration,
    /// A peer that does not answer a PING this long is disconnected.
    #[arg(long, env = "SPOOL_KEEPALIVE_TIMEOUT", default_value = "10s", value_parser = duration)]
    keepalive_timeout: Duration,
}

impl LimitArgs {
    fn into_limits(self) -> spool_server::config::Limits {
        spool_server::config::Limits {
            max_connections: self.max_connections,
            max_connections_per_peer: self.max_connections_per_peer,
            first_request_timeout: self.first_request_timeout,
            max_concurrent_streams: self.max_concurrent_streams,
            max_pending_accept_reset_streams: self.max_pending_reset_streams,
            max_local_error_reset_streams: self.max_local_reset_streams,
            max_header_list_bytes: self.max_header_list_bytes,
            max_sessions_per_token: self.max_sessions_per_token,
            max_worker_concurrency: self.max_worker_concurrency,
            max_open_streams_unauthenticated: self.max_unauthenticated_streams,
            request_timeout: self.request_timeout,
            max_wait: self.max_wait,
            max_waits_per_token: self.max_waits_per_token,
            max_waits: self.max_waits,
            keepalive_interval: self.keepalive_interval,
            keepalive_timeout: self.keepalive_timeout,
        }
    }
}

pub(crate) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Kept for the life of the server: dropping it flushes the last spans.
    #[cfg(feature = "otel")]
    let _otel = match &args.otlp_endpoint {
        Some(endpoint) => Some(spool_proto::otel::install("spool-server", endpoint)?),
        None => {
            init_logging(&args.log_format, "info");
            None
        }
    };
    #[cfg(not(feature = "otel"))]
    init_logging(&args.log_format, "info");
    let mut config = Config::new(args.database);
    config.drain_timeout = args.drain_timeout;
    config.lease_timeout = args.lease_timeout;
    config.heartbeat_interval = args.heartbeat_interval;
    config.auth_token = args.auth_token.filter(|t| !t.is_empty());
    config.tokens_file = args.tokens_file;
    config.max_payload_bytes = args.max_payload_bytes;
    config.retention = args.retention;
    config.limits = args.limits.into_limits();
    config.ui_listen = args.ui_listen;
    config.ui_read_only = args.ui_read_only;
    config.resume_grace = args.resume_grace;
    config.priority_aging = args.priority_aging;
    config.node_name = args.node_name.filter(|n| !n.is_empty());
    config.tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some(spool_server::config::Tls {
            cert,
            key,
            client_ca: args.tls_client_ca,
        }),
        _ => None,
    };
    // Refuse what cannot work before binding anything, naming the flag.
    config.check()?;
    if config.auth_token.is_none()
        && config.tokens_file.is_none()
        && !args.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %args.listen, "no --auth-token set and the address is not loopback: anyone who can reach it can submit and run activities");
    }
    if config.tls.is_none()
        && (config.auth_token.is_some() || config.tokens_file.is_some())
        && !args.listen.ip().is_loopback()
    {
        tracing::warn!(listen = %args.listen, "tokens and payloads cross the network in clear text: set --tls-cert and --tls-key");
    }
    if let Some(addr) = args.metrics_listen {
        spool_server::metrics::serve(addr, args.metrics_max_types)
            .with_context(|| format!("cannot serve metrics on {addr}"))?;
        tracing::info!(%addr, "metrics at http://{addr}/metrics");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let shutdown = async {
        shutdown_signal().await;
        tracing::info!("signal received: draining; a second signal exits at once");
        tokio::spawn(async {
            shutdown_signal().await;
            eprintln!("second signal: exiting now");
            std::process::exit(130);
        });
    };
    spool_server::run(config, listener, shutdown).await?;
    Ok(())
}

/// Completes at the first SIGTERM or SIGINT.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
