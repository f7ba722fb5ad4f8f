//! The client half of the `spool` binary: one method per subcommand, each one call of
//! `spool-client` that prints a human table (default) or JSON (`--json`) to
//! stdout. Errors go to stderr with a message naming what to do, and a non-zero exit.
//!
//! Here is what every family of commands shares (exit codes, errors, the
//! connection); each family's methods are in a module of their own.

mod activities;
mod admin;
mod limits;
mod parse;
mod print;

use spool_client::Client;
use spool_proto::v1;
use tonic::{Code, Status};

pub(crate) use limits::{LimitKind, Setting};
pub(crate) use parse::{input, parse_key, parse_status};
use print::{activity_json, activity_text, print_json};

/// The exit codes of the client subcommands (README, "Exit codes").
pub mod exit {
    /// Done; a waited-for activity COMPLETED.
    pub const OK: i32 = 0;
    /// The server refused or failed the call (permission, conflict, internal).
    pub const ERROR: i32 = 1;
    /// The command line or an input is wrong (also what the server calls an invalid
    /// argument).
    pub const USAGE: i32 = 2;
    /// The waited-for activity finished FAILED or CANCELLED.
    pub const NOT_COMPLETED: i32 = 3;
    /// `--timeout` passed before the waited-for activity finished.
    pub const TIMEOUT: i32 = 4;
    /// No such activity.
    pub const NOT_FOUND: i32 = 5;
    /// No Spool server answers at the address.
    pub const UNREACHABLE: i32 = 6;
}

/// Where and how to reach the server.
#[derive(Debug, Clone)]
pub struct Target {
    pub server: String,
    pub token: Option<String>,
    pub json: bool,
    /// TLS settings for an `https://` server.
    pub tls: spool_proto::endpoint::ClientTls,
}

/// What went wrong, said for a person.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "cannot reach the Spool server at {server}: {reason} (is `spool serve` running? set --server or SPOOL_SERVER)"
    )]
    Unreachable { server: String, reason: String },
    #[error("{server} broke off the call ({reason}): {}", not_grpc_hint(.server))]
    NotGrpc { server: String, reason: String },
    #[error("{}", describe(.0))]
    Server(Status),
    #[error("{0}")]
    Usage(String),
}

/// Why a server may break off a call below gRPC, for the address given.
fn not_grpc_hint(server: &str) -> &'static str {
    if server.starts_with("https://") {
        "it refused this client's TLS (does it require --client-cert and --client-key?), \
         or it does not speak gRPC (is it a Spool server's address?)"
    } else {
        "it does not speak gRPC: is it a Spool server's address? (`spool serve` listens on \
         127.0.0.1:7070 unless --listen says otherwise; a TLS server needs https://)"
    }
}

impl Error {
    /// The exit code this error ends the command with.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Unreachable { .. } | Error::NotGrpc { .. } => exit::UNREACHABLE,
            Error::Usage(_) => exit::USAGE,
            Error::Server(status) => match status.code() {
                Code::NotFound => exit::NOT_FOUND,
                Code::InvalidArgument => exit::USAGE,
                _ => exit::ERROR,
            },
        }
    }
}

fn describe(status: &Status) -> String {
    let hint = match status.code() {
        Code::Unauthenticated => " (pass --token or set SPOOL_TOKEN)",
        Code::Unavailable => " (the server is unreachable or shutting down)",
        _ => "",
    };
    format!("{:?}: {}{hint}", status.code(), status.message())
}

impl From<spool_client::Error> for Error {
    fn from(e: spool_client::Error) -> Self {
        match e {
            spool_client::Error::Status(status) => Error::Server(status),
            spool_client::Error::Unreachable { server, reason } => {
                Error::Unreachable { server, reason }
            }
            spool_client::Error::InvalidEndpoint(why) => Error::Usage(format!("--server: {why}")),
            spool_client::Error::InvalidToken => {
                Error::Usage("the token is not a valid header value".to_owned())
            }
            spool_client::Error::NotGrpc { server, reason } => Error::NotGrpc { server, reason },
            // The typed calls' errors; the CLI makes none of those calls.
            e @ (spool_client::Error::Encode { .. }
            | spool_client::Error::Decode { .. }
            | spool_client::Error::NotCompleted { .. }) => Error::Usage(e.to_string()),
        }
    }
}

/// The client subcommands: each one call of [`spool_client::Client`], printed.
pub struct Commands {
    client: Client,
    json: bool,
}

impl Commands {
    pub async fn connect(target: Target) -> Result<Self, Error> {
        let mut builder = Client::builder(target.server).tls(target.tls);
        if let Some(token) = target.token {
            builder = builder.token(token);
        }
        Ok(Self {
            client: builder.connect().await?,
            json: target.json,
        })
    }

    fn print_activity(&self, activity: &v1::Activity) {
        if self.json {
            print_json(&activity_json(activity));
        } else {
            print!("{}", activity_text(activity));
        }
    }
}

/// What `bulk` does to each activity.
#[derive(Clone)]
pub enum Bulk {
    Retry,
    Cancel { reason: String },
}
