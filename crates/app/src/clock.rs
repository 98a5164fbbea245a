//! Time, injected. The domain never reads a clock; the use cases read this one, so that tests (and
//! the deterministic simulation) can move time by hand: lease expiry, pending timeouts, key purges.

use std::sync::atomic::{AtomicI64, Ordering};

use chrono::{DateTime, TimeZone as _, Utc};

pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;

    fn now_ms(&self) -> i64 {
        self.now().timestamp_millis()
    }
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn at_ms(now_ms: i64) -> Self {
        Self(AtomicI64::new(now_ms))
    }

    pub fn advance_ms(&self, delta_ms: i64) {
        self.0.fetch_add(delta_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        Utc.timestamp_millis_opt(self.0.load(Ordering::SeqCst))
            .single()
            .unwrap_or(DateTime::<Utc>::MIN_UTC)
    }
}
