//! The connection a service uses to submit activities to Spool, wait for their
//! outcomes, and manage them: one gRPC channel to a server, the bearer token on
//! every call, answers as the `spool.v1` messages.
//!
//! ```no_run
//! use spool_client::{Client, v1};
//!
//! # async fn example() -> Result<(), spool_client::Error> {
//! let client = Client::builder("http://127.0.0.1:7070").connect().await?;
//! let submitted = client
//!     .submit(v1::SubmitRequest {
//!         activity_type: "greet".into(),
//!         ..Default::default()
//!     })
//!     .await?;
//! let key = submitted.activity.and_then(|a| a.key).unwrap_or_default();
//! let done = client.wait(key, None).await?;
//! println!("{:?}", done.status());
//! # Ok(())
//! # }
//! ```
//!
//! Invariants: the client adds nothing to a request but the token; every error is
//! either local (a bad endpoint or token, never sent) or the server's status, kept
//! whole so callers can branch on its code.

#![deny(missing_docs)]

mod client;
mod error;
mod retry;
mod typed;

pub use client::{Builder, Client};
pub use error::Error;
pub use retry::Retry;
pub use spool_proto::{activity::Activity, activity_type, endpoint::ClientTls, v1};
pub use typed::{Handle, Submit, TRACEPARENT, new_traceparent};

#[cfg(test)]
mod tests;
