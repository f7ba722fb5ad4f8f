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
        Fairness, Key, NewActivity, Op, Payload, RetrySpec, SettingChange, Timeouts, concurrency,
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

/// A list of at most `max` names (`hint` follows the limit in the refusal),
/// each a valid name.
fn names(field: &str, list: &[String], max: usize, hint: &str) -> Result<(), Error> {
    if list.len() > max {
        return Err(invalid(format!(
            "{field} has {} entries; the limit is {max}{hint}",
            list.len()
        )));
    }
    for (i, t) in list.iter().enumerate() {
        name(&format!("{field}[{i}]"), t)?;
    }
    Ok(())
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
        Op::Setting(SettingChange::KeyLimit {
            namespace: namespace.clone(),
            activity_type: limit.activity_type.clone(),
            weight: in_weight_range("concurrency_limit.weight", limit.weight, true)?,
            key: limit.concurrency_key,
            max_running: (limit.max_running > 0).then_some(limit.max_running),
        })
    } else {
        if limit.weight != 0 {
            return Err(invalid(
                "concurrency_limit.weight is one key's: give its concurrency_key".to_owned(),
            ));
        }
        Op::Setting(SettingChange::ConcurrencyLimit {
            namespace: namespace.clone(),
            activity_type: limit.activity_type.clone(),
            max_running: limit.max_running,
            strategy,
        })
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

pub use spool_proto::time::millis;

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
    names(
        "retry_policy.non_retryable_error_types",
        &policy.non_retryable_error_types,
        MAX_NON_RETRYABLE_TYPES,
        "",
    )?;
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
    names(
        "hello.activity_types",
        &hello.activity_types,
        MAX_HELLO_TYPES,
        ": split the types over several workers",
    )?;
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
        .map(|a| {
            crate::dispatch::registry::AttemptKey::new(a.workflow_id, a.activity_id, a.attempt)
        })
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
mod tests;
