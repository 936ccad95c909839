//! Retry delays as client-go's work-queue rate limiters give them: per key, exponential from a base to a
//! cap, reset on success; optionally also no faster than a shared token bucket (`DefaultControllerRateLimiter`:
//! 5 ms doubling to 1000 s, and 10 retries a second with a burst of 100). Beyond upstream, each delay gets up
//! to 10% of random jitter, so keys that failed together do not retry together.

use parking_lot::Mutex;
use std::collections::HashMap;

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket that hands out reservations: the wait until the token is there.
#[derive(Debug)]
struct Bucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn reserve(&mut self) -> Duration {
        let now = Instant::now();
        self.tokens =
            (self.tokens + now.duration_since(self.last).as_secs_f64() * self.per_second).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.per_second)
        }
    }
}

/// Retry delays per key.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: Mutex<HashMap<String, u32>>,
    bucket: Option<Mutex<Bucket>>,
}

impl Backoff {
    /// Per key only: `base · 2^(failures−1)`, at most `cap`.
    pub fn per_key(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            failures: Mutex::default(),
            bucket: None,
        }
    }

    /// client-go's default controller rate limiter (the cloud-node controller's).
    pub fn controller_default() -> Backoff {
        Backoff {
            bucket: Some(Mutex::new(Bucket {
                per_second: 10.0,
                burst: 100.0,
                tokens: 100.0,
                last: Instant::now(),
            })),
            ..Backoff::per_key(Duration::from_millis(5), Duration::from_secs(1000))
        }
    }

    /// `key` failed (again): how long until it is tried again.
    pub fn failed(&self, key: &str) -> Duration {
        let failures = {
            let mut table = self.failures.lock();
            let count = table.entry(key.to_owned()).or_insert(0);
            *count = count.saturating_add(1);
            *count
        };
        let exponential = self
            .base
            .checked_mul(2_u32.saturating_pow(failures.saturating_sub(1).min(31)))
            .unwrap_or(self.cap)
            .min(self.cap);
        let bucket = self
            .bucket
            .as_ref()
            .map_or(Duration::ZERO, |b| b.lock().reserve());
        exponential.max(bucket).mul_f64(1.0 + rand::random::<f64>() * 0.1)
    }

    /// `key` succeeded, or is gone: its next failure starts from the base again.
    pub fn forget(&self, key: &str) {
        self.failures.lock().remove(key);
    }

    /// How many keys have failures on record (for tests of the table's bounds).
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.failures.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: Duration, expected: Duration) -> bool {
        actual >= expected && actual <= expected.mul_f64(1.1)
    }

    #[tokio::test(start_paused = true)]
    async fn exponential_per_key_capped_and_forgotten() {
        let backoff = Backoff::per_key(Duration::from_secs(5), Duration::from_secs(300));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.failed("a")).collect();
        for (delay, seconds) in delays.iter().zip([5, 10, 20, 40, 80, 160, 300, 300]) {
            assert!(
                within(*delay, Duration::from_secs(seconds)),
                "{delay:?} for {seconds} s"
            );
        }
        assert!(
            within(backoff.failed("b"), Duration::from_secs(5)),
            "keys are apart"
        );
        backoff.forget("a");
        assert!(within(backoff.failed("a"), Duration::from_secs(5)));
        backoff.forget("a");
        backoff.forget("b");
        assert_eq!(backoff.tracked(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_default_limiter_allows_a_burst_of_100_then_10_a_second() {
        let backoff = Backoff::controller_default();
        let first: Vec<Duration> = (0..100).map(|i| backoff.failed(&format!("n{i}"))).collect();
        assert!(
            first.iter().all(|d| *d < Duration::from_millis(6)),
            "a burst of 100 at the base"
        );
        let next = backoff.failed("n100");
        assert!(within(next, Duration::from_millis(100)), "{next:?}");
        let much_later = backoff.failed("n101");
        assert!(within(much_later, Duration::from_millis(200)), "{much_later:?}");
    }
}
