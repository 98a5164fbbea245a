//! When a failed delivery is tried again: exponential backoff with full jitter (a random delay
//! in `[0, min(max, base · 2^(n-1))]` after the n-th failure), for up to three days from its
//! first attempt. Full jitter spreads the retries of many deliveries that failed together (an
//! endpoint that was down) instead of sending them back all at once.

use std::time::Duration;

use rand::Rng;

/// How long a delivery is retried, and how long an endpoint may fail before it is disabled.
pub const RETRY_WINDOW: Duration = Duration::from_secs(3 * 24 * 3_600);

/// The backoff of one deployment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(5),
            max: Duration::from_secs(3_600),
        }
    }
}

impl Backoff {
    /// The ceiling of the delay after the `failures`-th failure (1 for the first).
    #[must_use]
    pub fn ceiling(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(40);
        self.base
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max)
    }

    /// The delay before the next attempt: uniform in `[0, ceiling]`.
    pub fn delay(&self, failures: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = u64::try_from(self.ceiling(failures).as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(rng.random_range(0..=ceiling))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_cap_and_delays_stay_under_them() {
        let backoff = Backoff::default();
        assert_eq!(backoff.ceiling(1), Duration::from_secs(5));
        assert_eq!(backoff.ceiling(2), Duration::from_secs(10));
        assert_eq!(backoff.ceiling(5), Duration::from_secs(80));
        assert_eq!(backoff.ceiling(20), Duration::from_secs(3_600));
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(3_600));
        let mut rng = rand::rng();
        let mut below_half = 0;
        for _ in 0..1_000 {
            let delay = backoff.delay(3, &mut rng);
            assert!(delay <= Duration::from_secs(20), "{delay:?}");
            below_half += usize::from(delay < Duration::from_secs(10));
        }
        // Full jitter: the whole range is used, not only its top.
        assert!((300..=700).contains(&below_half), "{below_half}");
    }
}
