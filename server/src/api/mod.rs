//! The gRPC surface: thin tonic services that validate, authorize and call the core.
//!
//! Every failure a caller can see is an [`Error`] variant, mapped to a
//! `tonic::Status` in exactly one place (`From<Error> for Status`), with a message a
//! person can act on.

pub mod activity;
pub mod admin;
pub mod auth;
pub mod validate;
pub mod worker;

use std::sync::Arc;

use tonic::Status;

use crate::{
    dispatch::CommitError,
    store::{self, ActivityStatus, Key},
};

/// An outcome the store contract rules out; reported, never panicked on.
fn unexpected(what: &str) -> Error {
    Error::Store(Arc::new(crate::store::Error::Corrupt(format!(
        "unexpected store answer: {what}"
    ))))
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; the message names the field and the rule.
    #[error("{0}")]
    InvalidArgument(String),
    /// A payload is over `--max-payload-bytes`; send less, or raise the limit.
    #[error(
        "{field} is {size} bytes, over the server's limit of {limit} bytes (--max-payload-bytes)"
    )]
    PayloadTooLarge {
        field: String,
        size: usize,
        limit: usize,
    },
    #[error("activity {} not found", display_key(.0))]
    NotFound(Key),
    /// The key exists with another activity type.
    #[error(
        "activity {} already exists with type {existing:?}, not {requested:?}: use another activity_id",
        display_key(key)
    )]
    AlreadyExists {
        key: Key,
        existing: String,
        requested: String,
    },
    /// The activity is not in a state that allows the operation.
    #[error("activity {} is {}: {action}", display_key(key), status_name(*status))]
    WrongStatus {
        key: Key,
        status: ActivityStatus,
        action: &'static str,
    },
    /// The worker speaks a protocol version this server does not.
    #[error("protocol version {requested} is not supported; this server speaks {supported:?}")]
    UnsupportedProtocol {
        requested: u32,
        supported: &'static [u32],
    },
    /// Not taking this now (shutting down, draining); retry against a live node.
    #[error("{0}")]
    Unavailable(String),
    /// The server did not finish the call within `--request-timeout`. A write may
    /// still land: retry it (submits are idempotent by key).
    #[error(
        "the server did not finish this call within {} (--request-timeout); it may be overloaded: retry (a submit may still be stored: retry with the same key)",
        spool_proto::duration::format(*.0)
    )]
    Deadline(std::time::Duration),
    /// Over a per-caller limit (sessions per token); the message names the flag.
    #[error("{0}")]
    Exhausted(String),
    #[error("{0}")]
    Unauthenticated(&'static str),
    /// The token is valid but does not cover this role or namespace.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// The store failed; nothing was written.
    #[error("storage failure: {0}")]
    Store(Arc<store::Error>),
    /// A drain cannot be ended: the node is shutting down.
    #[error("{0}")]
    ShuttingDown(#[from] crate::drain::ShuttingDown),
}

impl From<Error> for Status {
    fn from(e: Error) -> Self {
        let message = e.to_string();
        match e {
            Error::InvalidArgument(_) => Status::invalid_argument(message),
            Error::PayloadTooLarge { .. } => Status::resource_exhausted(message),
            Error::NotFound(_) => Status::not_found(message),
            Error::AlreadyExists { .. } => Status::already_exists(message),
            Error::WrongStatus { .. } => Status::failed_precondition(message),
            Error::UnsupportedProtocol { .. } => Status::failed_precondition(message),
            Error::Unavailable(_) => Status::unavailable(message),
            Error::Deadline(_) => Status::deadline_exceeded(message),
            Error::Exhausted(_) => Status::resource_exhausted(message),
            Error::Unauthenticated(_) => Status::unauthenticated(message),
            Error::PermissionDenied(_) => Status::permission_denied(message),
            Error::ShuttingDown(_) => Status::failed_precondition(message),
            // Only what may pass is UNAVAILABLE, which clients retry; a failure
            // that would repeat must not be retried for ever.
            Error::Store(inner) => match inner.class() {
                store::Class::Transient => Status::unavailable(message),
                store::Class::InvalidInput => Status::invalid_argument(message),
                store::Class::Conflict => Status::failed_precondition(message),
                store::Class::Internal => Status::internal(message),
            },
        }
    }
}

impl From<CommitError> for Error {
    fn from(e: CommitError) -> Self {
        match e {
            CommitError::Closed => Error::Unavailable("the server is shutting down".to_owned()),
            CommitError::Store { why, .. } => Error::Store(why),
        }
    }
}

impl From<store::Error> for Error {
    fn from(e: store::Error) -> Self {
        Error::Store(Arc::new(e))
    }
}

/// Runs a unary call's work within `limit` (`--request-timeout`), so a stalled
/// store or committer never holds a caller, and its resources, for ever.
pub async fn within<T, E: From<Error>>(
    limit: std::time::Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, E> {
    match tokio::time::timeout(limit, work).await {
        Ok(result) => result,
        Err(_) => Err(Error::Deadline(limit).into()),
    }
}

fn display_key(key: &Key) -> String {
    format!("{}/{}/{}", key.namespace, key.workflow_id, key.activity_id)
}

pub fn status_name(status: ActivityStatus) -> &'static str {
    match status {
        ActivityStatus::Unspecified => "UNSPECIFIED",
        ActivityStatus::Scheduled => "SCHEDULED",
        ActivityStatus::Running => "RUNNING",
        ActivityStatus::Completed => "COMPLETED",
        ActivityStatus::Failed => "FAILED",
        ActivityStatus::Cancelled => "CANCELLED",
    }
}
