//! The contract one activity type makes between the service that submits it and the
//! worker that runs it: its name and the types of its input and output, shared by
//! both sides as one Rust type, so a mismatch is a compile error rather than a
//! payload that does not parse at run time.
//!
//! ```
//! use spool_proto::activity::Activity;
//!
//! #[derive(serde::Serialize, serde::Deserialize)]
//! pub struct Greeting { pub name: String }
//!
//! pub struct Greet;
//! impl Activity for Greet {
//!     const NAME: &'static str = "greet";
//!     type Input = Greeting;
//!     type Output = String;
//! }
//! ```
//!
//! [`activity_type!`](crate::activity_type) writes the same in one line:
//!
//! ```
//! # #[derive(serde::Serialize, serde::Deserialize)]
//! # pub struct Greeting { pub name: String }
//! spool_proto::activity_type!(pub Greet = "greet", Greeting => String);
//! ```
//!
//! Inputs and outputs travel as JSON (`application/json`).

use serde::{Serialize, de::DeserializeOwned};

use crate::v1::Payload;

/// One activity type: what a worker registers and a service submits.
pub trait Activity: Send + Sync + 'static {
    /// The activity type's name on the wire (`SubmitRequest.activity_type`).
    const NAME: &'static str;
    /// What the submitter passes and the handler receives.
    type Input: Serialize + DeserializeOwned + Send + 'static;
    /// What the handler returns and the submitter gets back.
    type Output: Serialize + DeserializeOwned + Send + 'static;
}

/// Declares an activity type: a unit struct and its [`Activity`] impl.
/// `activity_type!(pub Greet = "greet", Greeting => String)` is `pub struct Greet;`
/// with `NAME` `"greet"`, `Input` `Greeting` and `Output` `String`; doc comments
/// and attributes before the name go on the struct.
#[macro_export]
macro_rules! activity_type {
    ($(#[$meta:meta])* $vis:vis $name:ident = $wire:literal, $input:ty => $output:ty $(;)?) => {
        $(#[$meta])*
        $vis struct $name;

        impl $crate::activity::Activity for $name {
            const NAME: &'static str = $wire;
            type Input = $input;
            type Output = $output;
        }
    };
}

/// The content type of typed payloads.
pub const JSON: &str = "application/json";

/// `value` as a JSON payload.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Payload, serde_json::Error> {
    Ok(Payload {
        content_type: JSON.to_owned(),
        data: serde_json::to_vec(value)?,
    })
}

/// A JSON payload (or one without a content type) as a `T`.
pub fn decode<T: DeserializeOwned>(payload: &Payload) -> Result<T, DecodeError> {
    if !payload.content_type.is_empty() && payload.content_type != JSON {
        return Err(DecodeError::ContentType(payload.content_type.clone()));
    }
    serde_json::from_slice(&payload.data).map_err(DecodeError::Json)
}

/// Why a payload is not the `T` it should be.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// The payload is not JSON.
    #[error("the payload's content type is {0:?}, not {JSON}")]
    ContentType(String),
    /// The JSON does not fit the type.
    #[error("{0}")]
    Json(serde_json::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_other_content_types_are_refused() {
        let payload = encode(&vec![1, 2]).unwrap_or_default();
        assert_eq!(payload.content_type, JSON);
        assert_eq!(decode::<Vec<u8>>(&payload).ok(), Some(vec![1, 2]));
        let bare = Payload {
            content_type: String::new(),
            data: b"7".to_vec(),
        };
        assert_eq!(decode::<u8>(&bare).ok(), Some(7));
        let text = Payload {
            content_type: "text/plain".into(),
            data: b"7".to_vec(),
        };
        assert!(matches!(
            decode::<u8>(&text),
            Err(DecodeError::ContentType(_))
        ));
        assert!(matches!(decode::<u8>(&payload), Err(DecodeError::Json(_))));
    }
}
