//! Every bound on input, in one place: what the validator enforces, what the
//! config checks flags against, and what the committer cuts worker text to.
//! docs/SECURITY.md lists them with their flags.

use std::time::Duration;

/// Longest name or id (a namespace aside), activity type, identity, content
/// type or error type, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
pub const MAX_NAMESPACE_BYTES: usize = 64;
/// Longest cancel reason a client may send, in bytes; a worker's error message
/// is cut to this length.
pub const MAX_MESSAGE_BYTES: usize = 32 * 1024;
pub const MAX_ATTEMPTS: u32 = 10_000;
/// The largest `retry_policy.backoff_coefficient`.
pub const MAX_BACKOFF_COEFFICIENT: f64 = 100.0;
/// The most entries in `retry_policy.non_retryable_error_types`.
pub const MAX_NON_RETRYABLE_TYPES: usize = 100;
/// The longest duration accepted anywhere (a delay, a timeout, a retry
/// interval, a drain's timeout): ten years. A worker's snooze or
/// `next_retry_delay` beyond it is cut to it.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 86_400);
/// The most activities one `SubmitBatch` may carry.
pub const MAX_BATCH: usize = 10_000;
/// The largest `List` page; larger requests get this many.
pub const MAX_PAGE: u32 = 1_000;
pub const DEFAULT_PAGE: u32 = 100;
/// The most encoded bytes of activities in one `List` page, so that every page
/// fits a client on gRPC's default 4 MiB receive limit; a single row larger than
/// that comes alone.
pub const MAX_PAGE_BYTES: usize = 3 * 1024 * 1024;
/// The most activity types one worker may register in its `Hello`.
pub const MAX_HELLO_TYPES: usize = 1_000;
/// The ceiling of a worker's `max_concurrency`. `--max-worker-concurrency`
/// (default [`DEFAULT_WORKER_CONCURRENCY`]) may set it lower; a worker asking for
/// more is granted the cap, and `Welcome.max_concurrency` tells it so.
pub const MAX_WORKER_CONCURRENCY: u32 = 10_000;
pub const DEFAULT_WORKER_CONCURRENCY: u32 = 1_000;

/// The most headers one activity may carry.
pub const MAX_HEADERS: usize = 64;
/// The longest header key, in bytes (lowercase ASCII letters, digits, `-_.`).
pub const MAX_HEADER_KEY_BYTES: usize = 128;
/// The most bytes of all of an activity's header keys and values together.
pub const MAX_HEADERS_BYTES: usize = 16 * 1024;

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn truncate(mut s: String, max: usize) -> String {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
    s
}
