//! Input rules, one function per kind of field, so every RPC refuses bad input the
//! same way and before anything is written. Messages name the field and the rule.

use std::time::Duration;

use spool_proto::{DEFAULT_NAMESPACE, PROTOCOL_VERSIONS, duration, time::UnixMillis, v1};

use super::Error;
use crate::{
    config::{Config, RetryDefaults},
    dispatch::registry::Registration,
    store::{Key, NewActivity, Payload, RetrySpec, Timeouts},
};

/// Longest name or id, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
pub const MAX_NAMESPACE_BYTES: usize = 64;
pub const MAX_ATTEMPTS: u32 = 10_000;
/// The most activities one `SubmitBatch` may carry.
pub const MAX_BATCH: usize = 10_000;
/// The largest `List` page; larger requests get this many.
pub const MAX_PAGE: u32 = 1_000;
pub const DEFAULT_PAGE: u32 = 100;
/// Longest cancel reason or error message kept, in bytes; longer ones are cut.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// `[A-Za-z0-9._-]{1,64}`; empty means the default namespace.
pub fn namespace(value: &str) -> Result<String, Error> {
    if value.is_empty() {
        return Ok(DEFAULT_NAMESPACE.to_owned());
    }
    let ok = value.len() <= MAX_NAMESPACE_BYTES
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(value.to_owned())
    } else {
        Err(invalid(format!(
            "namespace {value:?} is invalid: use 1 to 64 of A-Z a-z 0-9 . _ -"
        )))
    }
}

/// A non-empty name or id of at most 255 bytes without control characters.
pub fn name(field: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(invalid(format!("{field} is required")));
    }
    if value.len() > MAX_NAME_BYTES {
        return Err(invalid(format!(
            "{field} is {} bytes; the limit is {MAX_NAME_BYTES}",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid(format!(
            "{field} {value:?} contains a control character"
        )));
    }
    Ok(())
}

/// Like [`name`], but empty means "generate one" (a UUIDv7).
pub fn id_or_new(field: &str, value: &str) -> Result<String, Error> {
    if value.is_empty() {
        return Ok(uuid::Uuid::now_v7().to_string());
    }
    name(field, value)?;
    Ok(value.to_owned())
}

/// The key of an existing activity: both ids required.
pub fn key(key: Option<&v1::ActivityKey>) -> Result<Key, Error> {
    let key = key.ok_or_else(|| invalid("key is required".to_owned()))?;
    name("key.workflow_id", &key.workflow_id)?;
    name("key.activity_id", &key.activity_id)?;
    Ok(Key {
        namespace: namespace(&key.namespace)?,
        workflow_id: key.workflow_id.clone(),
        activity_id: key.activity_id.clone(),
    })
}

/// A payload within the size limit; unset is an empty JSON-typed payload.
pub fn payload(field: &str, value: Option<Payload>, limit: usize) -> Result<Payload, Error> {
    let value = value.unwrap_or_default();
    check_payload(field, &value, limit)?;
    Ok(value)
}

pub fn check_payload(field: &str, value: &Payload, limit: usize) -> Result<(), Error> {
    if value.data.len() > limit {
        return Err(Error::PayloadTooLarge {
            field: field.to_owned(),
            size: value.data.len(),
            limit,
        });
    }
    if value.content_type.len() > MAX_NAME_BYTES || value.content_type.chars().any(char::is_control)
    {
        return Err(invalid(format!(
            "{field}.content_type must be at most {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    Ok(())
}

/// A non-negative duration; unset stays unset.
pub fn duration(
    field: &str,
    value: Option<&prost_types::Duration>,
) -> Result<Option<Duration>, Error> {
    duration::from_proto(value).map_err(|_| invalid(format!("{field} must not be negative")))
}

/// A duration in milliseconds where zero or unset means "none".
fn optional_ms(field: &str, value: Option<&prost_types::Duration>) -> Result<Option<i64>, Error> {
    Ok(duration(field, value)?.filter(|d| !d.is_zero()).map(millis))
}

pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub fn retry_policy(
    policy: Option<&v1::RetryPolicy>,
    defaults: &RetryDefaults,
) -> Result<RetrySpec, Error> {
    let policy = policy.cloned().unwrap_or_default();
    if policy.max_attempts > MAX_ATTEMPTS {
        return Err(invalid(format!(
            "retry_policy.max_attempts is {}; the limit is {MAX_ATTEMPTS}",
            policy.max_attempts
        )));
    }
    let coefficient = policy.backoff_coefficient;
    if coefficient != 0.0 && !(coefficient.is_finite() && coefficient >= 1.0) {
        return Err(invalid(format!(
            "retry_policy.backoff_coefficient is {coefficient}; it must be at least 1 (or 0 for the default)"
        )));
    }
    let initial = duration(
        "retry_policy.initial_interval",
        policy.initial_interval.as_ref(),
    )?
    .filter(|d| !d.is_zero())
    .unwrap_or(defaults.initial_interval);
    let max = duration("retry_policy.max_interval", policy.max_interval.as_ref())?
        .filter(|d| !d.is_zero());
    if let Some(max) = max
        && max < initial
    {
        return Err(invalid(format!(
            "retry_policy.max_interval ({}) is shorter than initial_interval ({})",
            duration::format(max),
            duration::format(initial)
        )));
    }
    for (i, t) in policy.non_retryable_error_types.iter().enumerate() {
        name(&format!("retry_policy.non_retryable_error_types[{i}]"), t)?;
    }
    Ok(RetrySpec {
        max_attempts: if policy.max_attempts == 0 {
            defaults.max_attempts
        } else {
            policy.max_attempts
        },
        initial_interval_ms: millis(initial),
        backoff_coefficient: if coefficient == 0.0 {
            defaults.backoff_coefficient
        } else {
            coefficient
        },
        max_interval_ms: millis(max.unwrap_or(defaults.max_interval.max(initial))),
        non_retryable: policy.non_retryable_error_types,
    })
}

pub fn submit(
    request: v1::SubmitRequest,
    config: &Config,
    now: UnixMillis,
) -> Result<NewActivity, Error> {
    let namespace = namespace(&request.namespace)?;
    name("activity_type", &request.activity_type)?;
    let workflow_id = id_or_new("workflow_id", &request.workflow_id)?;
    let activity_id = id_or_new("activity_id", &request.activity_id)?;
    let input = payload("input", request.input, config.max_payload_bytes)?;
    let delay = duration("delay", request.delay.as_ref())?.unwrap_or_default();
    let retry = retry_policy(request.retry_policy.as_ref(), &config.retry_defaults)?;
    let timeouts = Timeouts {
        heartbeat_ms: optional_ms("heartbeat_timeout", request.heartbeat_timeout.as_ref())?,
        start_to_close_ms: optional_ms(
            "start_to_close_timeout",
            request.start_to_close_timeout.as_ref(),
        )?,
        schedule_to_close_ms: optional_ms(
            "schedule_to_close_timeout",
            request.schedule_to_close_timeout.as_ref(),
        )?,
    };
    Ok(NewActivity {
        key: Key {
            namespace,
            workflow_id,
            activity_id,
        },
        activity_type: request.activity_type,
        input,
        next_at: now.saturating_add(millis(delay)),
        retry,
        timeouts,
        priority: request.priority,
    })
}

pub fn hello(hello: v1::Hello) -> Result<Registration, Error> {
    let version = if hello.protocol_version == 0 {
        1
    } else {
        hello.protocol_version
    };
    if !PROTOCOL_VERSIONS.contains(&version) {
        return Err(Error::UnsupportedProtocol {
            requested: version,
            supported: PROTOCOL_VERSIONS,
        });
    }
    let namespace = namespace(&hello.namespace)?;
    if hello.activity_types.is_empty() {
        return Err(invalid(
            "hello.activity_types is empty: a worker must register at least one activity type"
                .to_owned(),
        ));
    }
    for (i, t) in hello.activity_types.iter().enumerate() {
        name(&format!("hello.activity_types[{i}]"), t)?;
    }
    if hello.identity.len() > MAX_NAME_BYTES || hello.identity.chars().any(char::is_control) {
        return Err(invalid(format!(
            "hello.identity must be at most {MAX_NAME_BYTES} bytes without control characters"
        )));
    }
    let mut types: Vec<std::sync::Arc<str>> = hello
        .activity_types
        .iter()
        .map(|t| t.as_str().into())
        .collect();
    types.sort();
    types.dedup();
    Ok(Registration {
        namespace: namespace.into(),
        identity: hello.identity,
        activity_types: types,
        max_concurrency: hello.max_concurrency.max(1),
    })
}

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespaces() {
        assert_eq!(namespace("").ok().as_deref(), Some("default"));
        assert!(namespace("prod-eu.1_a").is_ok());
        assert!(namespace("has space").is_err());
        assert!(namespace(&"a".repeat(65)).is_err());
        assert!(namespace("ünï").is_err());
    }

    #[test]
    fn names() {
        assert!(name("f", "ok").is_ok());
        assert!(name("f", "").is_err());
        assert!(name("f", &"x".repeat(256)).is_err());
        assert!(name("f", &"x".repeat(255)).is_ok());
        assert!(name("f", "tab\there").is_err());
    }

    #[test]
    fn retry_policy_defaults_and_bounds() {
        let d = RetryDefaults::default();
        let spec = retry_policy(None, &d).map_err(|e| e.to_string());
        assert_eq!(spec.as_ref().map(|s| s.max_attempts), Ok(10));
        let too_many = v1::RetryPolicy {
            max_attempts: 10_001,
            ..Default::default()
        };
        assert!(retry_policy(Some(&too_many), &d).is_err());
        let bad_coefficient = v1::RetryPolicy {
            backoff_coefficient: 0.5,
            ..Default::default()
        };
        assert!(retry_policy(Some(&bad_coefficient), &d).is_err());
        let negative = v1::RetryPolicy {
            initial_interval: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert!(retry_policy(Some(&negative), &d).is_err());
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".to_owned(), 2), "h");
        assert_eq!(truncate("abc".to_owned(), 5), "abc");
    }
}
