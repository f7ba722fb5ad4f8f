//! Rate limits as the stores keep them: a token bucket per (namespace, activity
//! type), or per concurrency key of a type, held in one number, the time it is
//! next full (`tat_ns`, as in GCRA). Every claim of a limited type (or key) reads
//! and moves it in the claim's own transaction, so the rows taken over any window
//! never exceed the burst plus one per interval, however many nodes claim. Times are nanoseconds of the store's
//! clock (`Store::now` × 1e6); the limits on a limit keep every sum inside `i64`.

use std::time::Duration;

use spool_proto::time::UnixMillis;

/// The most rows a period may allow, and the largest burst.
pub const MAX_PER_PERIOD: u32 = 1_000_000;
/// The longest period: with the largest burst, `burst × interval` stays in `i64`.
pub const MAX_PERIOD: Duration = Duration::from_secs(3600);

/// A limit as set: at most `per_period` rows each `period`, `burst` at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub namespace: String,
    pub activity_type: String,
    /// Set for one concurrency key's limit, beside the type's.
    pub key: Option<String>,
    pub per_period: u32,
    pub period: Duration,
    pub burst: u32,
}

impl RateLimit {
    /// The period as stored: whole milliseconds, at most [`MAX_PERIOD`].
    pub fn period_ms(&self) -> i64 {
        spool_proto::time::millis(self.period.min(MAX_PERIOD))
    }

    /// How long one row's token takes to come back.
    pub fn interval_ns(&self) -> i64 {
        (nanos(self.period_ms()) / i64::from(self.per_period.max(1))).max(1)
    }
}

/// A limit and what is left of it now.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitUse {
    pub limit: RateLimit,
    /// Rows a claim could take now.
    pub available: u32,
}

/// The stored state of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub interval_ns: i64,
    pub burst: i64,
    pub tat_ns: i64,
}

pub fn nanos(millis: UnixMillis) -> i64 {
    millis.saturating_mul(1_000_000)
}

impl Bucket {
    /// Rows a claim at `now_ns` may take: from none up to the burst.
    pub fn available(&self, now_ns: i64) -> i64 {
        let base = self.tat_ns.max(now_ns);
        ((now_ns + self.burst * self.interval_ns - base) / self.interval_ns).clamp(0, self.burst)
    }

    /// The bucket after a claim at `now_ns` took `taken` rows.
    pub fn take(self, now_ns: i64, taken: i64) -> Self {
        Self {
            tat_ns: self.tat_ns.max(now_ns) + taken * self.interval_ns,
            ..self
        }
    }

    /// When a claim may take a row again, if not at `now_ns`: the first
    /// millisecond by which one token is back.
    pub fn refills_at(&self, now_ns: i64) -> Option<UnixMillis> {
        refill_millis(self.tat_ns - (self.burst - 1) * self.interval_ns, now_ns)
    }
}

/// A bucket's refill time `at_ns`, when it is after `now_ns`, as the millisecond
/// by which the token is surely back (rounded up).
pub fn refill_millis(at_ns: i64, now_ns: i64) -> Option<UnixMillis> {
    (at_ns > now_ns).then(|| at_ns / 1_000_000 + i64::from(at_ns % 1_000_000 > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_period: u32, period: Duration, burst: u32) -> Bucket {
        let limit = RateLimit {
            namespace: "n".into(),
            activity_type: "t".into(),
            key: None,
            per_period,
            period,
            burst,
        };
        Bucket {
            interval_ns: limit.interval_ns(),
            burst: i64::from(burst),
            tat_ns: 0,
        }
    }

    #[test]
    fn a_full_bucket_gives_its_burst_then_one_row_per_interval() {
        // 50 a second (one per 20 ms), 5 at once.
        let t0 = nanos(1_000_000);
        let bucket = limit(50, Duration::from_secs(1), 5);
        assert_eq!(bucket.available(t0), 5);
        let bucket = bucket.take(t0, 5);
        assert_eq!(bucket.available(t0), 0);
        assert_eq!(bucket.refills_at(t0), Some(1_000_020));
        assert_eq!(bucket.available(nanos(1_000_019)), 0);
        assert_eq!(bucket.available(nanos(1_000_020)), 1);
        // At the very instant the token is back there is nothing to wait for.
        assert_eq!(bucket.refills_at(nanos(1_000_020)), None);
        // A token back part-way through a millisecond is waited for to its end.
        assert_eq!(
            refill_millis(1_000_020_500_000, 1_000_019_000_000),
            Some(1_000_021)
        );
        assert_eq!(bucket.available(nanos(1_000_059)), 2);
        // Idle for long, it holds no more than the burst.
        assert_eq!(bucket.available(nanos(2_000_000)), 5);
        assert_eq!(bucket.refills_at(nanos(2_000_000)), None);
    }

    #[test]
    fn over_a_window_no_more_than_the_burst_plus_the_rate() {
        // Claims of up to 7 rows every 3 ms for 10 s, at 100 a second, burst 10.
        let mut bucket = limit(100, Duration::from_secs(1), 10);
        let mut taken = 0;
        for step in 0..3_334 {
            let now = nanos(1_000_000 + step * 3);
            let take = bucket.available(now).min(7);
            bucket = bucket.take(now, take);
            taken += take;
        }
        assert!((1_000..=1_010).contains(&taken), "{taken}");
    }

    #[test]
    fn fractional_intervals_keep_the_rate() {
        // 3 a second (333.33 ms each), claimed whenever the bucket says it gives a
        // row again, as the dispatch timer does: over an hour, 10,800 rows and the
        // burst. A burst of one would lose the rounding up to whole milliseconds.
        let mut bucket = limit(3, Duration::from_secs(1), 2);
        assert_eq!(bucket.interval_ns, 333_333_333);
        let (mut now, mut taken) = (0, 0);
        while now < 3_600_000 {
            let take = bucket.available(nanos(now));
            bucket = bucket.take(nanos(now), take);
            taken += take;
            now = bucket.refills_at(nanos(now)).unwrap_or(now + 1);
        }
        assert!((10_800..=10_802).contains(&taken), "{taken}");
    }
}
