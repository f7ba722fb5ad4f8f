//! What a handler can fail with, and what can stop a worker.

use std::time::Duration;

use spool_proto::v1::{self, ErrorKind, Payload};

/// How an activity attempt did not succeed.
#[derive(Debug, Clone)]
pub enum ActivityError {
    /// Try again (after the retry policy's backoff, or `next_retry_delay`), unless
    /// the policy says otherwise.
    Retryable {
        /// A short name for the kind of failure; retry policies list types that
        /// must not be retried.
        error_type: String,
        /// What happened, for a person.
        message: String,
        /// Anything else worth keeping with the error.
        details: Option<Payload>,
        /// Overrides the policy's backoff for the next attempt.
        next_retry_delay: Option<Duration>,
    },
    /// Fail the activity now; no more attempts.
    Terminal {
        /// A short name for the kind of failure.
        error_type: String,
        /// What happened, for a person.
        message: String,
        /// Anything else worth keeping with the error.
        details: Option<Payload>,
    },
    /// Not a failure: run this activity again after the delay, without using up an
    /// attempt (waiting on something outside, rate limits).
    Snooze(Duration),
}

impl ActivityError {
    /// A failure to retry under the activity's retry policy.
    pub fn retryable(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Retryable {
            error_type: error_type.into(),
            message: message.into(),
            details: None,
            next_retry_delay: None,
        }
    }

    /// A failure that ends the activity (FAILED, no more attempts).
    pub fn terminal(error_type: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Terminal {
            error_type: error_type.into(),
            message: message.into(),
            details: None,
        }
    }

    /// Run again after `delay`, without using an attempt.
    pub fn snooze(delay: Duration) -> Self {
        Self::Snooze(delay)
    }

    /// Overrides the retry policy's backoff for this failure (retryable only).
    pub fn with_next_retry_delay(mut self, delay: Duration) -> Self {
        if let Self::Retryable {
            next_retry_delay, ..
        } = &mut self
        {
            *next_retry_delay = Some(delay);
        }
        self
    }

    /// Attaches `payload` to a retryable or terminal error (a snooze has none).
    pub fn with_details(mut self, payload: Payload) -> Self {
        match &mut self {
            Self::Retryable { details, .. } | Self::Terminal { details, .. } => {
                *details = Some(payload)
            }
            Self::Snooze(_) => {}
        }
        self
    }

    pub(crate) fn into_outcome(self) -> v1::activity_result::Outcome {
        use v1::activity_result::Outcome;
        let error = |kind: ErrorKind, r#type, message, details, next_retry_delay: Option<_>| {
            Outcome::Error(v1::ActivityError {
                kind: kind as i32,
                r#type,
                message,
                details,
                next_retry_delay: next_retry_delay.map(spool_proto::duration::to_proto),
            })
        };
        match self {
            Self::Retryable {
                error_type,
                message,
                details,
                next_retry_delay,
            } => error(
                ErrorKind::Retryable,
                error_type,
                message,
                details,
                next_retry_delay,
            ),
            Self::Terminal {
                error_type,
                message,
                details,
            } => error(ErrorKind::Terminal, error_type, message, details, None),
            Self::Snooze(delay) => Outcome::Snooze(spool_proto::duration::to_proto(delay)),
        }
    }
}

impl std::fmt::Display for ActivityError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Retryable {
                error_type,
                message,
                ..
            } => write!(f, "{error_type}: {message} (retryable)"),
            Self::Terminal {
                error_type,
                message,
                ..
            } => write!(f, "{error_type}: {message} (terminal)"),
            Self::Snooze(d) => write!(f, "snoozed for {d:?}"),
        }
    }
}

/// `?` on any error (`std::error::Error`, or `anyhow::Error`) in a handler: a
/// retryable failure named after the error's type, with its message and causes.
/// (This is why `ActivityError` itself is not a `std::error::Error`.) Use
/// [`ActivityError::terminal`] for a failure that retrying cannot fix.
impl<E> From<E> for ActivityError
where
    E: Into<anyhow::Error>,
{
    fn from(e: E) -> Self {
        let name = std::any::type_name::<E>();
        // The type's own name, without its path or generic arguments.
        let short = name
            .split('<')
            .next()
            .and_then(|path| path.rsplit("::").next())
            .unwrap_or(name);
        let e: anyhow::Error = e.into();
        Self::retryable(short, format!("{e:#}"))
    }
}

/// Why a worker stopped, or a session failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `run` was called without any handler registered.
    #[error("no activity handlers are registered")]
    NoHandlers,
    /// The endpoint is not a server address, or its TLS settings cannot be used.
    #[error("{0}")]
    InvalidEndpoint(String),
    /// The server could not be reached; the worker retries.
    #[error("cannot connect: {0}")]
    Connect(#[from] tonic::transport::Error),
    /// The server refused or ended the session.
    #[error("the server refused the session: {} ({:?})", .0.message(), .0.code())]
    Rejected(tonic::Status),
    /// The server broke the protocol (for instance, no `Welcome` first).
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl Error {
    /// True when reconnecting cannot help: the configuration must change.
    pub fn is_permanent(&self) -> bool {
        match self {
            Error::NoHandlers | Error::InvalidEndpoint(_) => true,
            Error::Rejected(status) => {
                matches!(
                    status.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::FailedPrecondition
                        | tonic::Code::Unauthenticated
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unimplemented
                ) && !broke_before_hello(status)
            }
            Error::Connect(_) | Error::Protocol(_) => false,
        }
    }
}

/// Servers before this version answered a stream that broke or stalled before
/// its Hello with INVALID_ARGUMENT: a fault of the connection, not of the
/// worker's configuration, and worth another try.
fn broke_before_hello(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::InvalidArgument
        && [
            "no Hello within",
            "the stream failed before Hello",
            "the stream ended before Hello",
        ]
        .iter()
        .any(|p| status.message().starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_broken_before_its_hello_is_retried_and_a_bad_hello_is_not() {
        let rejected = |message: &str| Error::Rejected(tonic::Status::invalid_argument(message));
        assert!(!rejected("no Hello within 10s of opening the stream").is_permanent());
        assert!(!rejected("the stream failed before Hello: h2 reset").is_permanent());
        assert!(rejected("namespace \"bad ns\" is not valid").is_permanent());
        assert!(!Error::Rejected(tonic::Status::unavailable("reconnect")).is_permanent());
    }
}
