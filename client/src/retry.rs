//! Retries of UNAVAILABLE: the policy a caller sets, and the one loop every
//! call that may safely be sent again goes through.

use std::time::Duration;

use tonic::{Response, Status};

/// How calls that may safely be sent again are retried when the server (or the
/// way to it) is UNAVAILABLE: a node draining or restarting, a store failure that
/// may pass, a connection lost. Only reads and submits are retried; a submit is
/// idempotent by key, and the client fills in empty ids before the first try so a
/// retry names the same key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Tries in all, the first included (1: never retry).
    pub attempts: u32,
    /// The wait before the first retry; each next one doubles, up to `max_delay`,
    /// each spread to between half and all of it.
    pub initial_delay: Duration,
    /// The longest wait between tries.
    pub max_delay: Duration,
}

impl Default for Retry {
    /// 5 tries, from 100 ms up to 2 s apart.
    fn default() -> Self {
        Self {
            attempts: 5,
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl Retry {
    /// Runs `call` (one gRPC call, made afresh each try) until it answers, fails
    /// with anything but UNAVAILABLE, or the tries are spent.
    pub(crate) async fn run<T, F, Fut>(&self, mut call: F) -> Result<T, Status>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut delay = self.initial_delay;
        let mut tried = 1;
        loop {
            match call().await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status)
                    if status.code() == tonic::Code::Unavailable && tried < self.attempts =>
                {
                    let spread = delay.mul_f64(0.5 + rand_half());
                    tokio::time::sleep(spread).await;
                    delay = delay.saturating_mul(2).min(self.max_delay);
                    tried += 1;
                }
                Err(status) => return Err(status),
            }
        }
    }
}

/// A number in `[0, 0.5)` that differs between calls and processes: the spread of
/// a retry's delay, so clients that failed together do not retry together.
fn rand_half() -> f64 {
    use std::hash::{BuildHasher, RandomState};
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    (bits % 1_000) as f64 / 2_000.0
}
