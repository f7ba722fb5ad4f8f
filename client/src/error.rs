//! The client's one error type: local failures (never sent) told apart from the
//! server's answers, which are kept whole.

use spool_proto::v1;
use tonic::Status;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint cannot be dialled as given (a malformed URL, or TLS settings for
    /// an `http://` address).
    #[error("invalid endpoint: {0}")]
    InvalidEndpoint(String),
    /// No connection could be made; `reason` is the innermost cause.
    #[error("cannot reach the Spool server at {server}: {reason}")]
    Unreachable {
        /// The endpoint as given.
        server: String,
        /// Why, as the transport said it.
        reason: String,
    },
    /// The token cannot be sent as a header value.
    #[error("the token is not a valid header value")]
    InvalidToken,
    /// The call failed below gRPC: what answers at the address does not speak gRPC
    /// (another service's port), or the connection broke mid-call.
    #[error(
        "{server} does not speak gRPC, or dropped the connection ({reason}): is it a Spool server's port?"
    )]
    NotGrpc {
        /// The endpoint as given.
        server: String,
        /// What the transport said.
        reason: String,
    },
    /// The server answered with an error status.
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    /// A typed input could not be encoded (nothing was sent).
    #[error("the input of {activity} cannot be encoded: {reason}")]
    Encode {
        /// The activity type.
        activity: &'static str,
        /// serde's message.
        reason: String,
    },
    /// A typed output is not the type the activity declares.
    #[error("the output of {activity} is not a valid {expected}: {reason}")]
    Decode {
        /// The activity type.
        activity: &'static str,
        /// The output type declared.
        expected: &'static str,
        /// Why it does not decode.
        reason: String,
    },
    /// The activity finished without completing: FAILED (its last error says why)
    /// or CANCELLED.
    #[error("{} ended {}: {}", display_key(.activity.key.as_ref()), status_name(.activity.status), last_error(.activity))]
    NotCompleted {
        /// The activity as it ended.
        activity: Box<v1::Activity>,
    },
}

fn display_key(key: Option<&v1::ActivityKey>) -> String {
    let key = key.cloned().unwrap_or_default();
    format!("{}/{}/{}", key.namespace, key.workflow_id, key.activity_id)
}

fn status_name(status: i32) -> &'static str {
    v1::ActivityStatus::try_from(status)
        .map(|s| s.as_str_name().trim_start_matches("ACTIVITY_STATUS_"))
        .unwrap_or("UNKNOWN")
}

fn last_error(activity: &v1::Activity) -> String {
    activity.last_error.as_ref().map_or_else(
        || "no error recorded".to_owned(),
        |e| format!("{}: {}", e.r#type, e.message),
    )
}

impl Error {
    /// A failed call's status, told apart: a status the transport made up (it
    /// carries the transport's error as its source; one a server sent never does)
    /// is [`Error::NotGrpc`].
    pub(crate) fn from_call(server: &str, status: Status) -> Self {
        let local = matches!(
            status.code(),
            tonic::Code::Unknown | tonic::Code::Internal | tonic::Code::Cancelled
        ) && std::error::Error::source(&status).is_some();
        if local {
            Error::NotGrpc {
                server: server.to_owned(),
                reason: status.message().to_owned(),
            }
        } else {
            Error::Status(status)
        }
    }
}
