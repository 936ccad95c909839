//! Leader-election timings: one type, valid by construction, embedded wherever an elector is configured.
//!
//! Upstream's rules (`leaderelection.NewLeaderElector`): the lease duration exceeds the renew deadline,
//! which exceeds 1.2 × the retry period. Beyond upstream: the Lease stores the duration as whole seconds
//! in an int32, so it must be a whole number of seconds between 1 and 2³¹−1 (the API server refuses
//! anything else forever, which upstream only finds out at run time).

use std::time::Duration;

/// The largest lease duration the Lease API can store (`leaseDurationSeconds` is an int32).
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(i32::MAX as u64);

/// `--leader-elect-lease-duration`, `--leader-elect-renew-deadline`, `--leader-elect-retry-period`,
/// checked together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

/// Timings that cannot work; messages name the flags.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TimingsError {
    /// The Lease's duration field holds whole seconds in an int32.
    #[error(
        "--leader-elect-lease-duration must be a whole number of seconds between 1s and {max}s (got {got:?})",
        max = MAX_LEASE_DURATION.as_secs()
    )]
    LeaseDuration {
        /// The value given.
        got: Duration,
    },
    /// Upstream's rule: the renew deadline must end before others may take over.
    #[error(
        "--leader-elect-lease-duration ({lease:?}) must be greater than --leader-elect-renew-deadline ({renew:?})"
    )]
    RenewDeadline {
        /// Lease duration.
        lease: Duration,
        /// Renew deadline.
        renew: Duration,
    },
    /// Upstream's rule: at least one jittered retry must fit in the renew deadline.
    #[error(
        "--leader-elect-renew-deadline ({renew:?}) must be greater than 1.2 × --leader-elect-retry-period ({retry:?}), which must be positive"
    )]
    RetryPeriod {
        /// Renew deadline.
        renew: Duration,
        /// Retry period.
        retry: Duration,
    },
}

impl LeaseTimings {
    /// Checks the three together.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<LeaseTimings, TimingsError> {
        if lease_duration.subsec_nanos() != 0
            || lease_duration < Duration::from_secs(1)
            || lease_duration > MAX_LEASE_DURATION
        {
            return Err(TimingsError::LeaseDuration { got: lease_duration });
        }
        if lease_duration <= renew_deadline {
            return Err(TimingsError::RenewDeadline {
                lease: lease_duration,
                renew: renew_deadline,
            });
        }
        if retry_period.is_zero() || renew_deadline.as_secs_f64() <= 1.2 * retry_period.as_secs_f64() {
            return Err(TimingsError::RetryPeriod {
                renew: renew_deadline,
                retry: retry_period,
            });
        }
        Ok(LeaseTimings {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }

    /// Upstream's defaults: 15 s, 10 s, 2 s.
    pub const fn upstream_defaults() -> LeaseTimings {
        LeaseTimings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// How long others wait after the holder's last change before taking the Lease.
    pub const fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// How long the leader keeps trying to renew before it gives up.
    pub const fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// Time between renewals, and between attempts when polling.
    pub const fn retry_period(&self) -> Duration {
        self.retry_period
    }

    /// `leaseDurationSeconds` as the Lease stores it.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).expect("checked at construction")
    }

    /// How long a lock's controllers may take to stop once the lock is lost: half the margin between the
    /// renew deadline (when this process stops leading) and the lease duration (when others may lead), so
    /// they have stopped well before a successor can start.
    pub fn stop_grace(&self) -> Duration {
        ((self.lease_duration - self.renew_deadline) / 2).max(Duration::from_millis(100))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[track_caller]
    fn check(lease: Duration, renew: Duration, retry: Duration, expected: Result<(), &str>) {
        let actual = LeaseTimings::new(lease, renew, retry)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            actual,
            expected.map_err(str::to_owned),
            "{lease:?} {renew:?} {retry:?}"
        );
    }

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn upstream_rules_and_the_int32_bound() {
        check(15 * S, 10 * S, 2 * S, Ok(()));
        check(2 * S, S, Duration::from_millis(200), Ok(()));
        check(MAX_LEASE_DURATION, MAX_LEASE_DURATION - S, S, Ok(()));
        check(
            MAX_LEASE_DURATION + S,
            10 * S,
            S,
            Err(
                "--leader-elect-lease-duration must be a whole number of seconds between 1s and 2147483647s (got 2147483648s)",
            ),
        );
        check(
            Duration::from_millis(1500),
            S,
            Duration::from_millis(100),
            Err(
                "--leader-elect-lease-duration must be a whole number of seconds between 1s and 2147483647s (got 1.5s)",
            ),
        );
        check(
            10 * S,
            10 * S,
            2 * S,
            Err(
                "--leader-elect-lease-duration (10s) must be greater than --leader-elect-renew-deadline (10s)",
            ),
        );
        check(
            15 * S,
            10 * S,
            9 * S,
            Err(
                "--leader-elect-renew-deadline (10s) must be greater than 1.2 × --leader-elect-retry-period (9s), which must be positive",
            ),
        );
        check(
            15 * S,
            10 * S,
            Duration::ZERO,
            Err(
                "--leader-elect-renew-deadline (10s) must be greater than 1.2 × --leader-elect-retry-period (0ns), which must be positive",
            ),
        );
    }

    #[test]
    fn defaults_are_valid_and_the_grace_ends_before_a_successor_may_start() {
        let defaults = LeaseTimings::upstream_defaults();
        assert_eq!(
            LeaseTimings::new(
                defaults.lease_duration(),
                defaults.renew_deadline(),
                defaults.retry_period()
            ),
            Ok(defaults)
        );
        assert_eq!(defaults.stop_grace(), Duration::from_millis(2500));
        assert_eq!(defaults.lease_duration_seconds(), 15);
    }
}
