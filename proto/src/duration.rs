//! Human durations (`500ms`, `30s`, `5m`, `2h`, `7d`, and sums such as `1h30m`) as
//! used by every flag and environment variable, and the conversions between
//! `std::time::Duration` and `google.protobuf.Duration`.

use std::time::Duration;

/// A duration string that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a number with a unit such as 500ms, 30s, 5m, 2h or 7d"
)]
pub struct ParseDurationError {
    input: String,
}

/// Parses `500ms`, `30s`, `5m`, `2h`, `7d` or a sum of them (`1h30m`). A bare `0` is
/// zero; any other number needs a unit, so `30` is never silently seconds or millis.
pub fn parse(input: &str) -> Result<Duration, ParseDurationError> {
    let err = || ParseDurationError {
        input: input.to_owned(),
    };
    let s = input.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
        if digits == 0 {
            return Err(err());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| err())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(err()),
        };
        rest = &rest[unit_len..];
        let ms = value.checked_mul(unit_ms).ok_or_else(err)?;
        total = total
            .checked_add(Duration::from_millis(ms))
            .ok_or_else(err)?;
    }
    Ok(total)
}

/// Formats a duration the way [`parse`] reads it, in the largest units that are exact.
pub fn format(d: Duration) -> String {
    let mut ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut out = String::new();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    out
}

/// A protobuf duration that `std::time::Duration` cannot hold, or that protobuf
/// itself calls invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum InvalidDuration {
    #[error("must not be negative")]
    Negative,
    /// `nanos` outside `0..1_000_000_000` (protobuf's own rule for a positive duration).
    #[error("has nanos outside 0..1000000000")]
    Nanos,
}

/// Converts a protobuf duration; `None` stays `None`; a negative one, or one whose
/// `nanos` protobuf calls invalid, is an error.
pub fn from_proto(d: Option<&prost_types::Duration>) -> Result<Option<Duration>, InvalidDuration> {
    let Some(d) = d else { return Ok(None) };
    if d.seconds < 0 || d.nanos < 0 {
        return Err(InvalidDuration::Negative);
    }
    let nanos = u32::try_from(d.nanos).map_err(|_| InvalidDuration::Negative)?;
    if nanos >= 1_000_000_000 {
        return Err(InvalidDuration::Nanos);
    }
    let secs = u64::try_from(d.seconds).map_err(|_| InvalidDuration::Negative)?;
    Ok(Some(Duration::new(secs, nanos)))
}

/// Converts to a protobuf duration, saturating at `i64::MAX` seconds.
pub fn to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        // Always below 1e9, so it fits an i32.
        nanos: d.subsec_nanos() as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        for bad in [
            "",
            "30",
            "s",
            "-5s",
            "5x",
            "1.5s",
            "5 s",
            "99999999999999999999d",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn format_round_trips() {
        for s in ["30s", "5m", "2h", "7d", "1h30m", "1s500ms"] {
            let d = parse(s).map_err(|e| e.to_string());
            assert_eq!(d.clone().map(format), Ok(s.to_owned()));
        }
    }

    #[test]
    fn negative_proto_durations_are_refused() {
        let neg = prost_types::Duration {
            seconds: -1,
            nanos: 0,
        };
        assert_eq!(from_proto(Some(&neg)), Err(InvalidDuration::Negative));
        let bad_nanos = prost_types::Duration {
            seconds: 1,
            nanos: 1_000_000_000,
        };
        assert_eq!(from_proto(Some(&bad_nanos)), Err(InvalidDuration::Nanos));
        let pos = prost_types::Duration {
            seconds: 2,
            nanos: 5,
        };
        assert_eq!(from_proto(Some(&pos)), Ok(Some(Duration::new(2, 5))));
        assert_eq!(from_proto(None), Ok(None));
    }
}
