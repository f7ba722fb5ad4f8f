//! Instants on the wire and in storage. Storage keeps Unix milliseconds (an `i64`,
//! the same column type in every dialect); the wire uses `google.protobuf.Timestamp`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub type UnixMillis = i64;

/// The wall clock, in Unix milliseconds.
pub fn now_millis() -> UnixMillis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// A duration in whole milliseconds, saturating at `i64::MAX`.
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Unix milliseconds as a protobuf timestamp.
pub fn to_proto(ms: UnixMillis) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // In 0..1e9 by construction.
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A protobuf timestamp as Unix milliseconds (sub-millisecond precision is dropped).
pub fn from_proto(ts: &prost_types::Timestamp) -> UnixMillis {
    ts.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(ts.nanos) / 1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_including_before_the_epoch() {
        for ms in [0, 1, 999, 1_700_000_000_123, -1, -1001] {
            assert_eq!(from_proto(&to_proto(ms)), ms);
        }
    }
}
