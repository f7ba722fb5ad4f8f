//! The server's settings, resolved from flags and the environment by the binary
//! and passed whole to [`crate::server::run`]. Defaults match DESIGN.md.

use std::time::Duration;

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

#[derive(Debug, Clone)]
pub struct Config {
    /// `sqlite://PATH` (created if missing).
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
    pub tokens_file: Option<std::path::PathBuf>,
    /// The largest payload (input, output, details) accepted.
    pub max_payload_bytes: usize,
    /// How long finished rows are kept.
    pub retention: Duration,
    pub retry_defaults: RetryDefaults,
}

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
        }
    }

    /// The transport's own decode limit: above any single payload we would accept,
    /// so an oversized payload gets our clear `RESOURCE_EXHAUSTED`, not the codec's.
    pub fn max_message_bytes(&self) -> usize {
        self.max_payload_bytes
            .saturating_mul(4)
            .saturating_add(1024 * 1024)
            .max(16 * 1024 * 1024)
    }
}
