//! Input rules, one function per kind of field, so every RPC refuses bad input the
//! same way and before anything is written. Messages name the field and the rule.
//!
//! Every limit on what a caller may send is in [`crate::limits`] (the few a
//! flag may change say so, and take their value from `Config`). Two rules govern
//! strings that get stored, the same for every store:
//! - a client's string (a name, an id, a type, a content type, a cancel reason) with
//!   NUL or another control character is refused with INVALID_ARGUMENT (free text,
//!   the cancel reason, may hold tab, line feed and carriage return);
//! - a worker's text (an error's type and message, a content type it reports) is
//!   *sanitised*, never refused, so the outcome it carries is not lost: control
//!   characters become U+FFFD and the text is cut to its limit.
//!
//! Durations are bounded too ([`crate::limits::MAX_DURATION`]), so every time the server
//! computes from them (due times, expiries, backoff) stays far inside `i64`
//! milliseconds; those computations saturate anyway, in Rust, and are bound to
//! statements as integers.

use std::time::Duration;

use spool_proto::{
    DEFAULT_NAMESPACE, PROTOCOL_VERSIONS,
    duration::{self, InvalidDuration},
    time::UnixMillis,
    v1,
};

use super::Error;
use crate::{
    config::{Config, RetryDefaults},
    dispatch::registry::Registration,
    store::{
        Fairness, Key, NewActivity, Op, Payload, RetrySpec, Timeouts, concurrency,
        fairness::FairnessWeight,
        rate::{self, RateLimit},
    },
};

pub use crate::limits::*;

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
    short(field, value)
}

/// A possibly empty string of at most 255 bytes without control characters.
fn short(field: &str, value: &str) -> Result<(), Error> {
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

/// Free text from a client (a cancel reason): at most `max` bytes, no NUL or other
/// control character but tab, line feed and carriage return.
pub fn text(field: &str, value: &str, max: usize) -> Result<(), Error> {
    if value.len() > max {
        return Err(invalid(format!(
            "{field} is {} bytes; the limit is {max}",
            value.len()
        )));
    }
    if value.chars().any(|c| c.is_control() && !is_text_space(c)) {
        return Err(invalid(format!(
            "{field} contains a control character other than tab or a line break"
        )));
    }
    Ok(())
}

fn is_text_space(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r')
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

/// A client's payload within the size limit; unset is an empty JSON-typed payload.
pub fn payload(field: &str, value: Option<Payload>, limit: usize) -> Result<Payload, Error> {
    let value = value.unwrap_or_default();
    check_size(field, &value, limit)?;
    short(&format!("{field}.content_type"), &value.content_type)?;
    Ok(value)
}

/// The size rule alone, for payloads from clients and workers alike.
pub fn check_size(field: &str, value: &Payload, limit: usize) -> Result<(), Error> {
    if value.data.len() > limit {
        return Err(Error::PayloadTooLarge {
            field: field.to_owned(),
            size: value.data.len(),
            limit,
        });
    }
    Ok(())
}

/// A rate limit to set: a named type, a limit and burst from 1 to
/// [`rate::MAX_PER_PERIOD`] (a burst of 0 is the limit), a period of whole
/// milliseconds from 1 ms to [`rate::MAX_PERIOD`].
pub fn rate_limit(limit: Option<v1::RateLimit>) -> Result<RateLimit, Error> {
    let Some(limit) = limit else {
        return Err(invalid("rate_limit is required".to_owned()));
    };
    let namespace = namespace(&limit.namespace)?;
    name("rate_limit.activity_type", &limit.activity_type)?;
    let in_range = |field: &str, value: u32| {
        if (1..=rate::MAX_PER_PERIOD).contains(&value) {
            Ok(value)
        } else {
            Err(invalid(format!(
                "{field} is {value}; it must be from 1 to {}",
                rate::MAX_PER_PERIOD
            )))
        }
    };
    let per_period = in_range("rate_limit.limit", limit.limit)?;
    let burst = match limit.burst {
        0 => per_period,
        burst => in_range("rate_limit.burst", burst)?,
    };
    let period = duration("rate_limit.period", limit.period.as_ref())?.unwrap_or_default();
    if period < Duration::from_millis(1)
        || period > rate::MAX_PERIOD
        || period.subsec_nanos() % 1_000_000 != 0
    {
        return Err(invalid(format!(
            "rate_limit.period is {}; it must be whole milliseconds from 1ms to {}",
            duration::format(period),
            duration::format(rate::MAX_PERIOD)
        )));
    }
    Ok(RateLimit {
        namespace,
        activity_type: limit.activity_type,
        key: concurrency_key("rate_limit.concurrency_key", limit.concurrency_key)?,
        per_period,
        period,
        burst,
    })
}

/// A concurrency key named in `field`, if any: empty is none.
pub fn concurrency_key(field: &str, key: String) -> Result<Option<String>, Error> {
    if key.is_empty() {
        return Ok(None);
    }
    name(field, &key)?;
    Ok(Some(key))
}

/// A fairness key's weight to set: a named type and key, and a weight from 1 to
/// [`concurrency::MAX_WEIGHT`] (0 is refused: it would read as "no weight").
pub fn fairness_weight(weight: Option<v1::FairnessWeight>) -> Result<FairnessWeight, Error> {
    let Some(weight) = weight else {
        return Err(invalid("fairness_weight is required".to_owned()));
    };
    let namespace = namespace(&weight.namespace)?;
    name("fairness_weight.activity_type", &weight.activity_type)?;
    name("fairness_weight.fairness_key", &weight.fairness_key)?;
    Ok(FairnessWeight {
        namespace,
        weight: in_weight_range("fairness_weight.weight", weight.weight, false)?,
        activity_type: weight.activity_type,
        key: weight.fairness_key,
    })
}

/// A concurrency limit to set, as the op that sets it: for a named type, from 1 to
/// [`concurrency::MAX_RUNNING`] running per key and a known strategy; for one
/// key of it, 0 (the type's) to that limit, and a weight from 1 (also for 0) to
/// [`concurrency::MAX_WEIGHT`]. Answers (namespace, type, op).
pub fn concurrency_limit(
    limit: Option<v1::ConcurrencyLimit>,
) -> Result<(String, String, Op), Error> {
    let Some(limit) = limit else {
        return Err(invalid("concurrency_limit is required".to_owned()));
    };
    let namespace = namespace(&limit.namespace)?;
    name("concurrency_limit.activity_type", &limit.activity_type)?;
    let keyed = !limit.concurrency_key.is_empty();
    let least = if keyed { 0 } else { 1 };
    if !(least..=concurrency::MAX_RUNNING).contains(&limit.max_running) {
        return Err(invalid(format!(
            "concurrency_limit.max_running is {}; it must be from {least} to {}{}",
            limit.max_running,
            concurrency::MAX_RUNNING,
            if keyed { " (0: the type's)" } else { "" }
        )));
    }
    let strategy = match v1::ConcurrencyStrategy::try_from(limit.strategy) {
        Ok(v1::ConcurrencyStrategy::Unspecified | v1::ConcurrencyStrategy::Queue) => {
            concurrency::Strategy::Queue
        }
        Ok(v1::ConcurrencyStrategy::CancelNewest) => concurrency::Strategy::CancelNewest,
        Ok(v1::ConcurrencyStrategy::CancelInProgress) => concurrency::Strategy::CancelInProgress,
        Err(_) => {
            return Err(invalid(format!(
                "concurrency_limit.strategy {} is not a ConcurrencyStrategy",
                limit.strategy
            )));
        }
    };
    let op = if keyed {
        name("concurrency_limit.concurrency_key", &limit.concurrency_key)?;
        if strategy != concurrency::Strategy::Queue {
            return Err(invalid(
                "concurrency_limit.strategy is the type's: set it without concurrency_key"
                    .to_owned(),
            ));
        }
        Op::SetKeyLimit {
            namespace: namespace.clone(),
            activity_type: limit.activity_type.clone(),
            weight: in_weight_range("concurrency_limit.weight", limit.weight, true)?,
            key: limit.concurrency_key,
            max_running: (limit.max_running > 0).then_some(limit.max_running),
        }
    } else {
        if limit.weight != 0 {
            return Err(invalid(
                "concurrency_limit.weight is one key's: give its concurrency_key".to_owned(),
            ));
        }
        Op::SetConcurrencyLimit {
            namespace: namespace.clone(),
            activity_type: limit.activity_type.clone(),
            max_running: limit.max_running,
            strategy,
        }
    };
    Ok((namespace, limit.activity_type, op))
}

/// A client's duration: not negative, valid as protobuf, at most
/// [`MAX_DURATION`]; unset stays unset.
pub fn duration(
    field: &str,
    value: Option<&prost_types::Duration>,
) -> Result<Option<Duration>, Error> {
    let d = duration::from_proto(value).map_err(|e| match e {
        InvalidDuration::Negative => invalid(format!("{field} must not be negative")),
        InvalidDuration::Nanos => invalid(format!(
            "{field} has nanos outside 0..1000000000, which protobuf does not allow"
        )),
    })?;
    if let Some(d) = d
        && d > MAX_DURATION
    {
        return Err(invalid(format!(
            "{field} is {}s; the limit is {} ({}s)",
            d.as_secs(),
            duration::format(MAX_DURATION),
            MAX_DURATION.as_secs()
        )));
    }
    Ok(d)
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
    if coefficient != 0.0
        && !(coefficient.is_finite() && (1.0..=MAX_BACKOFF_COEFFICIENT).contains(&coefficient))
    {
        return Err(invalid(format!(
            "retry_policy.backoff_coefficient is {coefficient}; it must be from 1 to {MAX_BACKOFF_COEFFICIENT} (or 0 for the default)"
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
    if policy.non_retryable_error_types.len() > MAX_NON_RETRYABLE_TYPES {
        return Err(invalid(format!(
            "retry_policy.non_retryable_error_types has {} entries; the limit is {MAX_NON_RETRYABLE_TYPES}",
            policy.non_retryable_error_types.len()
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
        headers: headers(request.headers)?,
        concurrency_key: concurrency_key("concurrency_key", request.concurrency_key)?,
        fairness: fairness(request.fairness_key, request.fairness_weight)?,
    })
}

/// A `SubmitBatch` with each key once: `activities` what the store is given,
/// `answers` the answer of each request entry, in request order.
#[derive(Debug)]
pub struct DistinctBatch {
    pub activities: Vec<NewActivity>,
    pub answers: Vec<Answer>,
}

/// Which stored answer a request entry gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The first entry naming `activities[n]`.
    First(usize),
    /// A later entry naming the same key: answered as the first, without its
    /// payloads or headers, and never as created.
    Repeat(usize),
}

/// Keeps the first entry of each key, so a batch that repeats a key within
/// itself builds and stores one row, however many times it names it. A repeat
/// naming another type is refused, as a stored key of another type is.
pub fn distinct(batch: Vec<NewActivity>) -> Result<DistinctBatch, Error> {
    let mut first: std::collections::HashMap<Key, usize> =
        std::collections::HashMap::with_capacity(batch.len());
    let mut activities: Vec<NewActivity> = Vec::with_capacity(batch.len());
    let mut answers = Vec::with_capacity(batch.len());
    for new in batch {
        if let Some(&n) = first.get(&new.key) {
            if activities[n].activity_type != new.activity_type {
                return Err(Error::AlreadyExists {
                    key: new.key,
                    existing: activities[n].activity_type.clone(),
                    requested: new.activity_type,
                });
            }
            answers.push(Answer::Repeat(n));
            continue;
        }
        first.insert(new.key.clone(), activities.len());
        answers.push(Answer::First(activities.len()));
        activities.push(new);
    }
    Ok(DistinctBatch {
        activities,
        answers,
    })
}

/// A submit's fairness key and its weight: none when the key is empty (and then
/// no weight either); a weight of 0 is 1, and at most
/// [`concurrency::MAX_WEIGHT`].
fn fairness(key: String, weight: u32) -> Result<Option<Fairness>, Error> {
    if key.is_empty() {
        if weight != 0 {
            return Err(invalid(
                "fairness_weight is a fairness key's: give the fairness_key".to_owned(),
            ));
        }
        return Ok(None);
    }
    name("fairness_key", &key)?;
    Ok(Some(Fairness {
        weight: in_weight_range("fairness_weight", weight, true)?,
        key,
    }))
}

/// A weight in the claims' shares, from 1 to [`concurrency::MAX_WEIGHT`]; 0 reads
/// as 1 where `zero_is_one` (a field left unset), and is refused elsewhere (a
/// weight an operator sets must be said).
fn in_weight_range(field: &str, weight: u32, zero_is_one: bool) -> Result<u32, Error> {
    match weight {
        0 if zero_is_one => Ok(1),
        1..=concurrency::MAX_WEIGHT => Ok(weight),
        _ => Err(invalid(format!(
            "{field} is {weight}; it must be from 1 to {}{}",
            concurrency::MAX_WEIGHT,
            if zero_is_one { " (0: 1)" } else { "" }
        ))),
    }
}

/// A submit's headers: at most [`crate::limits::MAX_HEADERS`], keys of lowercase ASCII
/// letters, digits, `-`, `_` and `.` (as HTTP and W3C trace context spell them),
/// values of text without control characters, all together within
/// [`crate::limits::MAX_HEADERS_BYTES`].
pub fn headers(
    headers: std::collections::HashMap<String, String>,
) -> Result<crate::store::Headers, Error> {
    if headers.len() > crate::limits::MAX_HEADERS {
        return Err(invalid(format!(
            "headers has {} entries; the limit is {}",
            headers.len(),
            crate::limits::MAX_HEADERS
        )));
    }
    let total: usize = headers.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > crate::limits::MAX_HEADERS_BYTES {
        return Err(invalid(format!(
            "headers are {total} bytes together; the limit is {}",
            crate::limits::MAX_HEADERS_BYTES
        )));
    }
    for (key, value) in &headers {
        let valid_key = !key.is_empty()
            && key.len() <= crate::limits::MAX_HEADER_KEY_BYTES
            && key.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.')
            });
        if !valid_key {
            return Err(invalid(format!(
                "header key {key:?} must be 1 to {} lowercase ASCII letters, digits, '-', '_' or '.'",
                crate::limits::MAX_HEADER_KEY_BYTES
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(format!(
                "header {key:?} has a control character in its value"
            )));
        }
    }
    Ok(headers.into_iter().collect())
}

/// A worker's `Hello`; its `max_concurrency` is granted up to `max_concurrency`.
pub fn hello(hello: v1::Hello, max_concurrency: u32) -> Result<Registration, Error> {
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
    if hello.activity_types.len() > MAX_HELLO_TYPES {
        return Err(invalid(format!(
            "hello.activity_types has {} entries; the limit is {MAX_HELLO_TYPES}: split the types over several workers",
            hello.activity_types.len()
        )));
    }
    for (i, t) in hello.activity_types.iter().enumerate() {
        name(&format!("hello.activity_types[{i}]"), t)?;
    }
    short("hello.identity", &hello.identity)?;
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
        max_concurrency: hello.max_concurrency.clamp(1, max_concurrency.max(1)),
        ticket: None,
    })
}

/// The most attempts a resuming `Hello` may say it holds.
pub const MAX_HELD: usize = 100_000;

/// The attempts a resuming worker says it holds, as the registry keys them.
pub fn held(
    held: Vec<v1::AttemptRef>,
) -> Result<std::collections::HashSet<crate::dispatch::registry::AttemptKey>, Error> {
    if held.len() > MAX_HELD {
        return Err(invalid(format!(
            "Hello.held lists {} attempts; at most {MAX_HELD}",
            held.len()
        )));
    }
    Ok(held
        .into_iter()
        .map(|a| (a.workflow_id, a.activity_id, a.attempt))
        .collect())
}

/// A worker's text as it will be stored: control characters (tab and line breaks
/// aside) become U+FFFD, and it is cut to `max` bytes.
pub fn worker_text(value: String, max: usize) -> String {
    let unwanted = |c: char| c.is_control() && !is_text_space(c);
    // Most texts are clean: only those that are not are copied.
    let value = if value.contains(unwanted) {
        value.replace(unwanted, "\u{FFFD}")
    } else {
        value
    };
    truncate(value, max)
}

/// A content type a worker reports, as it will be stored: one line, cut to size.
pub fn worker_content_type(payload: &mut Payload) {
    let value = std::mem::take(&mut payload.content_type);
    payload.content_type = worker_text(value, MAX_NAME_BYTES).replace(is_text_space, " ");
}

/// A delay a worker asks for (a snooze, `next_retry_delay`): an invalid one is no
/// delay, a longer one than [`MAX_DURATION`] is cut to it.
pub fn worker_delay(value: Option<&prost_types::Duration>) -> Duration {
    duration::from_proto(value)
        .ok()
        .flatten()
        .unwrap_or_default()
        .min(MAX_DURATION)
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
        assert!(name("f", "nul\0here").is_err());
    }

    #[test]
    fn free_text_allows_line_breaks_but_not_nul() {
        assert!(text("reason", "two\nlines\twith tab\r\n", 100).is_ok());
        assert!(text("reason", "nul\0", 100).is_err());
        assert!(text("reason", "bell\u{7}", 100).is_err());
        assert!(text("reason", "escape\u{1b}[0m", 100).is_err());
        assert!(text("reason", &"x".repeat(101), 100).is_err());
    }

    #[test]
    fn a_set_fairness_weight_names_its_key_and_stays_in_range() {
        let asked = |key: &str, weight: u32| {
            fairness_weight(Some(v1::FairnessWeight {
                namespace: String::new(),
                activity_type: "t".into(),
                fairness_key: key.into(),
                weight,
                ..Default::default()
            }))
        };
        assert_eq!(
            asked("tenant", 3).ok(),
            Some(FairnessWeight {
                namespace: "default".into(),
                activity_type: "t".into(),
                key: "tenant".into(),
                weight: 3,
            })
        );
        assert!(asked("tenant", 1_000).is_ok());
        assert!(asked("tenant", 0).is_err());
        assert!(asked("tenant", 1_001).is_err());
        assert!(asked("", 3).is_err());
        assert!(asked("nul\0", 3).is_err());
        assert!(fairness_weight(None).is_err());
    }

    #[test]
    fn a_fairness_weight_needs_its_key_and_stays_in_range() {
        let config = Config::new("sqlite://x.db");
        let asked = |key: &str, weight: u32| {
            submit(
                v1::SubmitRequest {
                    activity_type: "email.send".into(),
                    fairness_key: key.into(),
                    fairness_weight: weight,
                    ..Default::default()
                },
                &config,
                0,
            )
            .map(|n| n.fairness)
        };
        let fair = |weight| {
            Some(Fairness {
                key: "t".into(),
                weight,
            })
        };
        assert_eq!(asked("", 0).ok(), Some(None));
        assert_eq!(asked("t", 0).ok(), Some(fair(1)), "0 is weight 1");
        assert_eq!(asked("t", 1_000).ok(), Some(fair(1_000)));
        for (key, weight, says) in [
            ("", 2, "give the fairness_key"),
            ("t", 1_001, "from 1 to 1000"),
            ("a\u{7}b", 1, "fairness_key"),
        ] {
            match asked(key, weight) {
                Err(Error::InvalidArgument(message)) => {
                    assert!(message.contains(says), "{key:?} {weight}: {message}")
                }
                other => panic!("{key:?} {weight}: {other:?}"),
            }
        }
    }

    #[test]
    fn worker_text_is_sanitised_not_refused() {
        assert_eq!(worker_text("a\0b\nc".to_owned(), 100), "a\u{fffd}b\nc");
        assert_eq!(worker_text("nul\0only".to_owned(), 100), "nul\u{fffd}only");
        assert_eq!(worker_text("plain".to_owned(), 100), "plain");
        assert_eq!(worker_text("héllo".to_owned(), 2), "h");
        let mut p = Payload {
            content_type: "text/\0plain\n".to_owned(),
            data: Vec::new(),
        };
        worker_content_type(&mut p);
        assert_eq!(p.content_type, "text/\u{fffd}plain ");
    }

    #[test]
    fn durations_are_bounded() {
        let d = |seconds, nanos| prost_types::Duration { seconds, nanos };
        assert!(duration("f", Some(&d(-1, 0))).is_err());
        assert!(duration("f", Some(&d(0, -1))).is_err());
        assert!(duration("f", Some(&d(1, 1_000_000_000))).is_err());
        assert!(duration("f", Some(&d(i64::MAX, 0))).is_err());
        assert!(duration("f", Some(&d(1_000_000_000_000, 0))).is_err());
        let max = i64::try_from(MAX_DURATION.as_secs()).unwrap_or(i64::MAX);
        assert_eq!(
            duration("f", Some(&d(max, 0))).ok().flatten(),
            Some(MAX_DURATION)
        );
        assert!(duration("f", Some(&d(max, 1))).is_err());
        assert_eq!(worker_delay(Some(&d(i64::MAX, 0))), MAX_DURATION);
        assert_eq!(worker_delay(Some(&d(-5, 0))), Duration::ZERO);
    }

    #[test]
    fn hello_caps_concurrency_and_types() {
        let hello_with = |types: usize, max_concurrency: u32| v1::Hello {
            activity_types: (0..types).map(|i| format!("t{i}")).collect(),
            max_concurrency,
            ..Default::default()
        };
        let granted = hello(hello_with(1, u32::MAX), 64).map(|r| r.max_concurrency);
        assert_eq!(granted.ok(), Some(64));
        let granted = hello(hello_with(1, 0), 64).map(|r| r.max_concurrency);
        assert_eq!(granted.ok(), Some(1));
        assert!(hello(hello_with(MAX_HELLO_TYPES, 1), 64).is_ok());
        assert!(hello(hello_with(MAX_HELLO_TYPES + 1, 1), 64).is_err());
        let bad_identity = v1::Hello {
            identity: "host\0".to_owned(),
            ..hello_with(1, 1)
        };
        assert!(hello(bad_identity, 64).is_err());
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
        for coefficient in [0.5, f64::NAN, f64::INFINITY, 100.5, -1.0] {
            let bad_coefficient = v1::RetryPolicy {
                backoff_coefficient: coefficient,
                ..Default::default()
            };
            assert!(
                retry_policy(Some(&bad_coefficient), &d).is_err(),
                "{coefficient}"
            );
        }
        let negative = v1::RetryPolicy {
            initial_interval: Some(prost_types::Duration {
                seconds: -1,
                nanos: 0,
            }),
            ..Default::default()
        };
        assert!(retry_policy(Some(&negative), &d).is_err());
        let many_types = v1::RetryPolicy {
            non_retryable_error_types: vec!["X".to_owned(); MAX_NON_RETRYABLE_TYPES + 1],
            ..Default::default()
        };
        assert!(retry_policy(Some(&many_types), &d).is_err());
    }

    /// The limits are part of the documented contract (docs/SECURITY.md).
    #[test]
    fn the_documented_limits() {
        assert_eq!(MAX_NAME_BYTES, 255);
        assert_eq!(MAX_NAMESPACE_BYTES, 64);
        assert_eq!(MAX_MESSAGE_BYTES, 32_768);
        assert_eq!(MAX_ATTEMPTS, 10_000);
        assert_eq!(MAX_NON_RETRYABLE_TYPES, 100);
        assert_eq!(MAX_DURATION, Duration::from_secs(315_360_000));
        assert_eq!(MAX_BATCH, 10_000);
        assert_eq!(MAX_PAGE, 1_000);
        assert_eq!(MAX_PAGE_BYTES, 3_145_728);
        assert_eq!(MAX_HELLO_TYPES, 1_000);
        assert_eq!(MAX_WORKER_CONCURRENCY, 10_000);
        assert_eq!(DEFAULT_WORKER_CONCURRENCY, 1_000);
    }

    fn d(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    /// Header keys are lowercase tokens, values text without control characters,
    /// and their number and size are bounded.
    #[test]
    fn headers_are_bounded_and_well_formed() {
        let one = |k: &str, v: &str| headers([(k.to_owned(), v.to_owned())].into());
        assert!(
            one(
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            )
            .is_ok()
        );
        assert!(one("x-tenant.id_2", "acme corp").is_ok());
        for bad_key in ["", "Tenant", "a b", "ü", &"k".repeat(129)] {
            assert!(one(bad_key, "v").is_err(), "{bad_key:?}");
        }
        assert!(one("k", "line\nbreak").is_err());
        let many: std::collections::HashMap<String, String> =
            (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(headers(many).is_err(), "more than 64");
        let big = [("k".to_owned(), "v".repeat(16 * 1024))].into();
        assert!(headers(big).is_err(), "over 16 KiB together");
    }

    /// A submit resolves to exactly what it asked for, defaults filled in.
    #[test]
    fn a_submit_resolves_to_what_it_asked_for() {
        let config = Config::new("sqlite://x.db");
        let request = v1::SubmitRequest {
            headers: [("tenant".to_owned(), "acme".to_owned())].into(),
            concurrency_key: "customer-7".into(),
            fairness_key: "tenant-1".into(),
            fairness_weight: 3,
            namespace: "orders".into(),
            workflow_id: "wf-1".into(),
            activity_id: "act-1".into(),
            activity_type: "email.send".into(),
            input: Some(Payload {
                content_type: "text/plain".into(),
                data: b"hi".to_vec(),
            }),
            delay: d(2, 500_000_000),
            retry_policy: Some(v1::RetryPolicy {
                max_attempts: 4,
                initial_interval: d(3, 0),
                backoff_coefficient: 1.5,
                max_interval: d(60, 0),
                non_retryable_error_types: vec!["Fatal".into()],
            }),
            heartbeat_timeout: d(10, 0),
            start_to_close_timeout: d(0, 1_000_000),
            schedule_to_close_timeout: d(0, 0),
            priority: -7,
        };
        let new = submit(request, &config, 1_000).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            new.key,
            Key {
                namespace: "orders".into(),
                workflow_id: "wf-1".into(),
                activity_id: "act-1".into(),
            }
        );
        assert_eq!(new.activity_type, "email.send");
        assert_eq!(new.input.data, b"hi");
        assert_eq!(new.input.content_type, "text/plain");
        assert_eq!(new.next_at, 3_500, "now plus the delay, in milliseconds");
        assert_eq!(
            new.timeouts,
            Timeouts {
                heartbeat_ms: Some(10_000),
                start_to_close_ms: Some(1),
                schedule_to_close_ms: None,
            },
            "a zero timeout is no timeout"
        );
        assert_eq!(new.priority, -7);
        assert_eq!(new.concurrency_key.as_deref(), Some("customer-7"));
        assert_eq!(
            new.fairness,
            Some(Fairness {
                key: "tenant-1".into(),
                weight: 3
            })
        );
        assert_eq!(
            new.retry,
            RetrySpec {
                max_attempts: 4,
                initial_interval_ms: 3_000,
                backoff_coefficient: 1.5,
                max_interval_ms: 60_000,
                non_retryable: vec!["Fatal".into()],
            }
        );
        // Empty ids are generated, as UUIDv7s; empty namespace is the default.
        let bare = submit(
            v1::SubmitRequest {
                activity_type: "t".into(),
                ..Default::default()
            },
            &config,
            0,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bare.key.namespace, "default");
        for id in [&bare.key.workflow_id, &bare.key.activity_id] {
            let uuid = uuid::Uuid::parse_str(id).unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(uuid.get_version_num(), 7);
        }
        assert_ne!(bare.key.workflow_id, bare.key.activity_id);
        assert_eq!(bare.input, Payload::default());
        assert_eq!(bare.next_at, 0);
    }

    #[test]
    fn retry_policy_defaults_fill_zeroes_and_bounds_are_inclusive() {
        let defaults = RetryDefaults::default();
        let resolve = |p: v1::RetryPolicy| retry_policy(Some(&p), &defaults);
        let zero = resolve(v1::RetryPolicy::default()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            zero,
            RetrySpec {
                max_attempts: 10,
                initial_interval_ms: 1_000,
                backoff_coefficient: 2.0,
                max_interval_ms: 300_000,
                non_retryable: Vec::new(),
            }
        );
        // An initial interval above the default maximum lifts the maximum with it.
        let long = resolve(v1::RetryPolicy {
            initial_interval: d(600, 0),
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (long.initial_interval_ms, long.max_interval_ms),
            (600_000, 600_000)
        );
        // Equal initial and maximum is allowed; a maximum below the initial is not.
        assert!(
            resolve(v1::RetryPolicy {
                initial_interval: d(5, 0),
                max_interval: d(5, 0),
                ..Default::default()
            })
            .is_ok()
        );
        assert!(
            resolve(v1::RetryPolicy {
                initial_interval: d(5, 0),
                max_interval: d(4, 0),
                ..Default::default()
            })
            .is_err()
        );
        assert!(
            resolve(v1::RetryPolicy {
                max_attempts: MAX_ATTEMPTS,
                ..Default::default()
            })
            .is_ok()
        );
        assert!(
            resolve(v1::RetryPolicy {
                non_retryable_error_types: vec!["X".into(); MAX_NON_RETRYABLE_TYPES],
                ..Default::default()
            })
            .is_ok()
        );
        assert_eq!(
            resolve(v1::RetryPolicy {
                backoff_coefficient: 1.0,
                ..Default::default()
            })
            .map(|r| r.backoff_coefficient)
            .ok(),
            Some(1.0)
        );
    }

    #[test]
    fn sizes_and_lengths_are_inclusive_limits() {
        let payload = |n: usize| Payload {
            content_type: String::new(),
            data: vec![0; n],
        };
        assert!(check_size("f", &payload(10), 10).is_ok());
        assert!(matches!(
            check_size("f", &payload(11), 10),
            Err(Error::PayloadTooLarge {
                size: 11,
                limit: 10,
                ..
            })
        ));
        assert!(check_size("f", &payload(0), 10).is_ok());
        assert!(text("reason", &"x".repeat(100), 100).is_ok());
        let kept = self::payload("input", Some(payload(3)), 10).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kept.data.len(), 3);
        assert!(self::payload("input", Some(payload(11)), 10).is_err());
        assert_eq!(millis(Duration::from_millis(1_234)), 1_234);
        assert_eq!(millis(Duration::MAX), i64::MAX);
        assert_eq!(optional_ms("t", d(0, 0).as_ref()).ok(), Some(None));
        assert_eq!(
            optional_ms("t", d(1, 500_000_000).as_ref()).ok(),
            Some(Some(1_500))
        );
        assert_eq!(optional_ms("t", None).ok(), Some(None));
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo".to_owned(), 2), "h");
        assert_eq!(truncate("abc".to_owned(), 5), "abc");
    }
}
