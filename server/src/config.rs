//! The server's settings, resolved from flags and the environment by the binary
//! and passed whole to [`crate::server::run`]. Defaults match the README.
//!
//! [`Config::check`] refuses settings the server cannot run with (a zero heartbeat
//! interval, a lease that could lapse between renewals, a token too short to be a
//! secret), naming the flag, so a bad deploy fails at start and not later.

use std::{path::PathBuf, time::Duration};

use crate::limits;

/// Server-wide retry defaults, used where a submit leaves a field zero or unset.
#[derive(Debug, Clone)]
pub struct RetryDefaults {
    pub max_attempts: u32,
    pub initial_interval: Duration,
    pub backoff_coefficient: f64,
    pub max_interval: Duration,
}

impl Default for RetryDefaults {
    fn default() -> Self {
        Self {
            max_attempts: 10,
            initial_interval: Duration::from_secs(1),
            backoff_coefficient: 2.0,
            max_interval: Duration::from_secs(300),
        }
    }
}

/// TLS for the gRPC listener: PEM files, read at start.
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// With a CA, clients must present a certificate it signed (mTLS).
    pub client_ca: Option<PathBuf>,
}

/// What one client may take of the server; each is a flag (docs/SECURITY.md).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Open TCP connections; the next is accepted only when one closes.
    pub max_connections: usize,
    /// Open TCP connections from one IP address; more are closed at once.
    pub max_connections_per_peer: usize,
    /// How long a connection may stay open without an authenticated request
    /// (health checks do not count); then it is closed.
    pub first_request_timeout: Duration,
    /// HTTP/2 streams per connection, advertised in SETTINGS.
    pub max_concurrent_streams: u32,
    /// Streams a client may open and reset before the server accepts them, before
    /// the connection gets GOAWAY (HTTP/2 rapid reset).
    pub max_pending_accept_reset_streams: usize,
    /// Streams the server may reset for protocol errors on one connection before
    /// it sends GOAWAY.
    pub max_local_error_reset_streams: usize,
    /// The largest header list (metadata) a request may carry, in bytes.
    pub max_header_list_bytes: u32,
    /// Worker sessions open at once per token (per caller, without tokens).
    pub max_sessions_per_token: usize,
    /// The most slots one worker session is granted.
    pub max_worker_concurrency: u32,
    /// Unauthenticated streams (health `Watch`, reflection) open at once.
    pub max_open_streams_unauthenticated: usize,
    /// The longest a unary call but `Wait` and `Drain` may take.
    pub request_timeout: Duration,
    /// The longest one `Wait` parks; then it answers with the current state.
    pub max_wait: Duration,
    /// `Wait` calls parked at once per token (per caller, without tokens).
    pub max_waits_per_token: usize,
    /// `Wait` calls parked at once on this node.
    pub max_waits: usize,
    /// HTTP/2 PING interval; a peer that does not answer within
    /// `keepalive_timeout` is disconnected.
    pub keepalive_interval: Duration,
    pub keepalive_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            max_connections_per_peer: 1024,
            first_request_timeout: Duration::from_secs(30),
            max_concurrent_streams: 1024,
            max_pending_accept_reset_streams: 20,
            max_local_error_reset_streams: 1024,
            max_header_list_bytes: 16 * 1024,
            max_sessions_per_token: 4096,
            max_worker_concurrency: limits::DEFAULT_WORKER_CONCURRENCY,
            max_open_streams_unauthenticated: 64,
            request_timeout: Duration::from_secs(60),
            max_wait: Duration::from_secs(3600),
            max_waits_per_token: 10_000,
            max_waits: 100_000,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    /// `sqlite://PATH` (created if missing) or `postgres://…`.
    pub database: String,
    /// How long in-flight attempts may finish during a drain.
    pub drain_timeout: Duration,
    /// How long a RUNNING row's lease lasts without renewal.
    pub lease_timeout: Duration,
    /// How often workers must send a keep-alive; silent for 3 intervals is lost.
    pub heartbeat_interval: Duration,
    /// A single bearer token every client and worker must present; `None`: no auth.
    pub auth_token: Option<String>,
    /// Per-token roles and namespaces (see `api::auth`).
    pub tokens_file: Option<PathBuf>,
    /// The largest payload (input, output, details) accepted.
    pub max_payload_bytes: usize,
    /// How long finished rows are kept.
    pub retention: Duration,
    pub retry_defaults: RetryDefaults,
    /// `None`: plaintext.
    pub tls: Option<Tls>,
    pub limits: Limits,
    /// This server's name in attempt histories and worker lists (`--node-name`);
    /// `None`: the host name and the port it listens on. Nodes sharing a database
    /// must have different names: a node only ends (as lost) the attempts of its
    /// own sessions.
    pub node_name: Option<String>,
    /// The web dashboard's address (`--ui-listen`); `None`: no dashboard.
    pub ui_listen: Option<std::net::SocketAddr>,
    /// The dashboard changes nothing, whatever the token (`--ui-read-only`).
    pub ui_read_only: bool,
    /// How long a worker whose stream dropped may resume its session, keeping its
    /// attempts (`--resume-grace`); zero: never, its attempts are lost at once.
    /// `None`: [`DEFAULT_RESUME_GRACE`], or half the lease if that is shorter.
    pub resume_grace: Option<Duration>,
    /// How much waiting outweighs one level of priority (`--priority-aging`), so a
    /// low priority is never starved; zero: strict priority. Stored in the
    /// database for every node: a node started with it sets it; `None` keeps
    /// what is stored (strict, on a new database).
    pub priority_aging: Option<Duration>,
}

/// How long a dropped session waits for its worker by default.
pub const DEFAULT_RESUME_GRACE: Duration = Duration::from_secs(5);

/// The host's name, the default `--node-name`.
pub fn host_name() -> String {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "spool".to_owned())
}

/// A setting the server cannot run with; names the flag.
#[derive(Debug, thiserror::Error)]
#[error("{flag}: {reason}")]
pub struct ConfigError {
    pub flag: &'static str,
    pub reason: String,
}

/// The shortest bearer token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

impl Config {
    pub fn new(database: impl Into<String>) -> Self {
        Self {
            database: database.into(),
            drain_timeout: Duration::from_secs(30),
            lease_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            auth_token: None,
            tokens_file: None,
            max_payload_bytes: 4 * 1024 * 1024,
            retention: Duration::from_secs(7 * 86_400),
            retry_defaults: RetryDefaults::default(),
            tls: None,
            limits: Limits::default(),
            node_name: None,
            ui_listen: None,
            ui_read_only: false,
            resume_grace: None,
            priority_aging: None,
        }
    }

    /// The transport's own limit on one message, both ways: above any single
    /// payload we would accept, so an oversized payload gets our clear
    /// `RESOURCE_EXHAUSTED`, not the codec's; and room for the largest answer, an
    /// activity carrying an input, an output and two sets of details at the limit.
    pub fn max_message_bytes(&self) -> usize {
        self.max_payload_bytes
            .saturating_mul(4)
            .saturating_add(1024 * 1024)
            .max(16 * 1024 * 1024)
    }

    /// How often the liveness sweep runs: a quarter of the heartbeat interval,
    /// from 20 ms to 1 s.
    pub fn sweep_tick(&self) -> Duration {
        (self.heartbeat_interval / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
    }

    /// How long a dropped session may be resumed: below the lease, so a session
    /// resumed on another node finds its rows' leases still held.
    pub fn resume_grace(&self) -> Duration {
        self.resume_grace
            .unwrap_or_else(|| DEFAULT_RESUME_GRACE.min(self.lease_timeout / 2))
    }

    /// Refuses settings the server cannot run with.
    pub fn check(&self) -> Result<(), ConfigError> {
        self.check_durations()?;
        self.check_values()?;
        self.check_counts()
    }

    /// Every duration above zero and within the limit; those that bound each
    /// other in order.
    fn check_durations(&self) -> Result<(), ConfigError> {
        let fail = |flag: &'static str, reason: String| Err(ConfigError { flag, reason });
        let positive = [
            ("--heartbeat-interval", self.heartbeat_interval),
            ("--lease-timeout", self.lease_timeout),
            ("--retention", self.retention),
            ("--request-timeout", self.limits.request_timeout),
            ("--max-wait", self.limits.max_wait),
            ("--first-request-timeout", self.limits.first_request_timeout),
            ("--keepalive-interval", self.limits.keepalive_interval),
            ("--keepalive-timeout", self.limits.keepalive_timeout),
        ];
        for (flag, value) in positive {
            if value.is_zero() {
                return fail(flag, "must be more than zero".to_owned());
            }
            if value > limits::MAX_DURATION {
                return fail(
                    flag,
                    format!(
                        "{} is longer than the limit of {}",
                        spool_proto::duration::format(value),
                        spool_proto::duration::format(limits::MAX_DURATION)
                    ),
                );
            }
        }
        if self.heartbeat_interval < Duration::from_millis(10) {
            return fail(
                "--heartbeat-interval",
                "must be at least 10ms: workers could not keep up".to_owned(),
            );
        }
        if self.drain_timeout > limits::MAX_DURATION {
            return fail(
                "--drain-timeout",
                format!(
                    "is longer than the limit of {}",
                    spool_proto::duration::format(limits::MAX_DURATION)
                ),
            );
        }
        // Leases are renewed on the liveness sweep's ticks: one shorter than two
        // ticks could lapse between renewals, and another node would reclaim a
        // live attempt.
        if self.lease_timeout < self.sweep_tick().saturating_mul(2) {
            return fail(
                "--lease-timeout",
                format!(
                    "({}) must be at least twice the liveness sweep's tick ({}, a quarter of --heartbeat-interval, at most 1s)",
                    spool_proto::duration::format(self.lease_timeout),
                    spool_proto::duration::format(self.sweep_tick())
                ),
            );
        }
        if self.resume_grace() >= self.lease_timeout {
            return fail(
                "--resume-grace",
                format!(
                    "({}) must be shorter than --lease-timeout ({}): a session is resumed while its attempts' leases hold",
                    spool_proto::duration::format(self.resume_grace()),
                    spool_proto::duration::format(self.lease_timeout)
                ),
            );
        }
        Ok(())
    }

    /// The priority aging, the token and the payload limit.
    fn check_values(&self) -> Result<(), ConfigError> {
        let fail = |flag: &'static str, reason: String| Err(ConfigError { flag, reason });
        if let Some(aging) = self.priority_aging
            && !aging.is_zero()
            && (aging < Duration::from_millis(1) || aging > crate::store::MAX_PRIORITY_AGING)
        {
            return fail(
                "--priority-aging",
                format!(
                    "({}) must be from 1ms to {} (0s: strict priority)",
                    spool_proto::duration::format(aging),
                    spool_proto::duration::format(crate::store::MAX_PRIORITY_AGING)
                ),
            );
        }
        if let Some(token) = &self.auth_token
            && token.len() < MIN_TOKEN_LEN
        {
            return fail(
                "--auth-token",
                format!("must be at least {MIN_TOKEN_LEN} characters"),
            );
        }
        if self.max_payload_bytes == 0 || self.max_payload_bytes > 64 * 1024 * 1024 {
            return fail(
                "--max-payload-bytes",
                "must be from 1 to 67108864 (64 MiB)".to_owned(),
            );
        }
        Ok(())
    }

    /// Every count at least one, and those with a ceiling or a floor within it.
    fn check_counts(&self) -> Result<(), ConfigError> {
        let fail = |flag: &'static str, reason: String| Err(ConfigError { flag, reason });
        let counts = [
            ("--max-connections", self.limits.max_connections),
            (
                "--max-connections-per-peer",
                self.limits.max_connections_per_peer,
            ),
            ("--max-waits-per-token", self.limits.max_waits_per_token),
            ("--max-waits", self.limits.max_waits),
            (
                "--max-concurrent-streams",
                self.limits.max_concurrent_streams as usize,
            ),
            (
                "--max-sessions-per-token",
                self.limits.max_sessions_per_token,
            ),
            (
                "--max-worker-concurrency",
                self.limits.max_worker_concurrency as usize,
            ),
            (
                "--max-header-list-bytes",
                self.limits.max_header_list_bytes as usize,
            ),
            (
                "--max-unauthenticated-streams",
                self.limits.max_open_streams_unauthenticated,
            ),
        ];
        for (flag, value) in counts {
            if value == 0 {
                return fail(flag, "must be at least 1".to_owned());
            }
        }
        if self.limits.max_worker_concurrency > limits::MAX_WORKER_CONCURRENCY {
            return fail(
                "--max-worker-concurrency",
                format!("the ceiling is {}", limits::MAX_WORKER_CONCURRENCY),
            );
        }
        if self.limits.max_header_list_bytes < 1024 {
            return fail(
                "--max-header-list-bytes",
                "must be at least 1024: gRPC's own headers need room".to_owned(),
            );
        }
        Ok(())
    }
}

/// The database as a log line should name it: a SQLite file by its absolute path
/// (a relative one depends on where the server was started), any other URL with
/// its password replaced by `***`.
pub fn shown_database(url: &str) -> String {
    if let Some(path) = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
    {
        let path = path.split('?').next().unwrap_or(path);
        if let Ok(absolute) = std::path::absolute(path) {
            return format!("sqlite://{}", absolute.display());
        }
    }
    redact_url(url)
}

/// A database URL safe to log: any password replaced by `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    // The password may hold '/', '?' or '@' (percent-encoding is not always
    // used): everything up to the last '@' is user information.
    let (mut redacted, tail) = match rest.rsplit_once('@') {
        Some((userinfo, after)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let shown = if user.len() < userinfo.len() {
                format!("{scheme}://{user}:***@")
            } else {
                format!("{scheme}://{user}@")
            };
            (shown, after)
        }
        None => (format!("{scheme}://"), rest),
    };
    // `?password=…` is a libpq spelling too.
    let mut query_parts = Vec::new();
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    redacted.push_str(path);
    for part in query.split('&').filter(|p| !p.is_empty()) {
        match part.split_once('=') {
            Some((k, _)) if k.eq_ignore_ascii_case("password") => {
                query_parts.push(format!("{k}=***"))
            }
            _ => query_parts.push(part.to_owned()),
        }
    }
    if !query_parts.is_empty() {
        redacted.push('?');
        redacted.push_str(&query_parts.join("&"));
    }
    redacted
}

#[cfg(test)]
mod tests;
