//! Token buckets in integer nanoseconds, one table for the process.
//!
//! A bucket is one number: the instant it is full again (the generic cell rate algorithm's
//! "theoretical arrival time"). Taking a request moves that instant one interval later; a take
//! that would push it more than the bucket's capacity past now is refused. Full buckets need no
//! row, so a missing row is a full bucket and the table only holds clients that spent something
//! recently; when it reaches [`BUCKETS_MAX`] rows the full ones are dropped (and, should most
//! still be spending, all of them: each client then starts again from a full bucket), which keeps
//! memory bounded whatever addresses or keys clients send. No float takes part in a decision.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::config::{ceil_s, Rate};

/// Rows the table holds at most (about 100 bytes each).
pub const BUCKETS_MAX: usize = 100_000;

/// Whose bucket a row is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum BucketKey {
    /// One API key, by its SHA-256 (the key itself is never kept).
    Key([u8; 32]),
    /// Every key of one tenant.
    Tenant(String),
    /// Requests without a known key from one client address (`None`: the peer is unknown, as
    /// when the router is driven in process).
    Address(Option<IpAddr>),
    /// Console sign-in attempts from one client address.
    Console(Option<IpAddr>),
}

/// One bucket a request draws on.
#[derive(Debug, Clone)]
pub struct Draw {
    pub key: BucketKey,
    pub rate: Rate,
}

/// A bucket as a decision left it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Level {
    /// Requests it would serve now.
    pub remaining: u64,
    /// Time until it is full again.
    pub full_in_ns: u64,
}

/// What a request's draws came to: every bucket gave one request, or none did (a bucket is
/// never charged for a request another bucket refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Taken(Vec<Level>),
    Refused {
        /// The index of the draw that refused, the one with the longest wait if several did.
        by: usize,
        /// Time until that draw would give a request.
        wait_ns: u64,
        levels: Vec<Level>,
    },
}

/// The instant a bucket full again at `full_at_ns` is full again once it has given one request
/// at `now_ns`; or, if it has none to give, the time until it has.
pub fn take_one(full_at_ns: u64, now_ns: u64, rate: Rate) -> Result<u64, u64> {
    let taken = full_at_ns.max(now_ns).saturating_add(rate.interval_ns);
    let limit = now_ns.saturating_add(rate.capacity_ns());
    if taken <= limit {
        Ok(taken)
    } else {
        Err(taken - limit)
    }
}

/// The bucket full again at `full_at_ns`, seen at `now_ns`.
pub fn level(full_at_ns: u64, now_ns: u64, rate: Rate) -> Level {
    let full_in_ns = full_at_ns.saturating_sub(now_ns);
    Level {
        remaining: rate.capacity_ns().saturating_sub(full_in_ns) / rate.interval_ns.max(1),
        full_in_ns,
    }
}

/// Whole seconds until a refused request may be sent again: at least 1.
pub fn retry_after_s(wait_ns: u64) -> u64 {
    ceil_s(wait_ns).max(1)
}

/// Every bucket of the process.
#[derive(Debug, Default)]
pub struct Buckets {
    full_at_ns: Mutex<HashMap<BucketKey, u64>>,
}

impl Buckets {
    /// One request from every bucket of `draws`, or from none.
    pub fn take(&self, draws: Vec<Draw>, now_ns: u64) -> Decision {
        let mut table = self.lock();
        let mut outcomes = Vec::with_capacity(draws.len());
        let mut refusal: Option<(usize, u64)> = None;
        for (index, draw) in draws.iter().enumerate() {
            let full_at = table.get(&draw.key).copied().unwrap_or(0);
            let outcome = take_one(full_at, now_ns, draw.rate);
            if let Err(wait_ns) = outcome {
                if refusal.is_none_or(|(_, longest)| wait_ns > longest) {
                    refusal = Some((index, wait_ns));
                }
            }
            outcomes.push((full_at, outcome));
        }
        if let Some((by, wait_ns)) = refusal {
            let levels = draws
                .iter()
                .zip(&outcomes)
                .map(|(draw, (full_at, _))| level(*full_at, now_ns, draw.rate))
                .collect();
            return Decision::Refused {
                by,
                wait_ns,
                levels,
            };
        }
        if table.len().saturating_add(draws.len()) > BUCKETS_MAX {
            evict(&mut table, now_ns);
        }
        let mut levels = Vec::with_capacity(draws.len());
        for (draw, (_, outcome)) in draws.into_iter().zip(outcomes) {
            let taken = outcome.unwrap_or(now_ns);
            levels.push(level(taken, now_ns, draw.rate));
            table.insert(draw.key, taken);
        }
        Decision::Taken(levels)
    }

    /// Rows in the table now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<BucketKey, u64>> {
        self.full_at_ns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Drops the full buckets; if three quarters of the rows are still spending, drops every row, so
/// that a full table costs one sweep per quarter of its size, never one per request.
fn evict(table: &mut HashMap<BucketKey, u64>, now_ns: u64) {
    table.retain(|_, full_at| *full_at > now_ns);
    if table.len() > BUCKETS_MAX / 4 * 3 {
        tracing::warn!(
            rows = table.len(),
            "rate-limit table full of spending clients; every bucket starts again full"
        );
        table.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    /// 5 a second, 5 at once.
    const FIVE: Rate = Rate {
        burst: 5,
        interval_ns: S / 5,
    };

    fn key(n: u8) -> BucketKey {
        BucketKey::Key([n; 32])
    }

    fn draw(n: u8, rate: Rate) -> Draw {
        Draw { key: key(n), rate }
    }

    #[test]
    fn a_full_bucket_gives_its_burst_then_refuses_until_a_request_is_earned_back() {
        let buckets = Buckets::default();
        let now = 10 * S;
        for remaining in (0..5).rev() {
            let Decision::Taken(levels) = buckets.take(vec![draw(1, FIVE)], now) else {
                panic!("refused with {remaining} left");
            };
            assert_eq!(levels[0].remaining, remaining);
            assert_eq!(levels[0].full_in_ns, (5 - remaining) * FIVE.interval_ns);
        }
        let refused = buckets.take(vec![draw(1, FIVE)], now);
        assert_eq!(
            refused,
            Decision::Refused {
                by: 0,
                wait_ns: FIVE.interval_ns,
                levels: vec![Level {
                    remaining: 0,
                    full_in_ns: S
                }],
            }
        );
        // One interval later, exactly one request is back.
        let later = now + FIVE.interval_ns;
        assert!(matches!(
            buckets.take(vec![draw(1, FIVE)], later),
            Decision::Taken(_)
        ));
        assert!(matches!(
            buckets.take(vec![draw(1, FIVE)], later),
            Decision::Refused { .. }
        ));
        // After a full window the whole burst is back, and no more.
        let idle = later + 10 * S;
        let Decision::Taken(levels) = buckets.take(vec![draw(1, FIVE)], idle) else {
            panic!("refused after idling");
        };
        assert_eq!(levels[0].remaining, 4);
    }

    #[test]
    fn a_request_is_taken_from_every_bucket_or_from_none() {
        let buckets = Buckets::default();
        let tight = Rate {
            burst: 1,
            interval_ns: S,
        };
        let now = S;
        // The second bucket refuses: the first keeps its request.
        assert!(matches!(
            buckets.take(vec![draw(1, FIVE), draw(2, tight)], now),
            Decision::Taken(_)
        ));
        let refused = buckets.take(vec![draw(1, FIVE), draw(2, tight)], now);
        let Decision::Refused {
            by,
            wait_ns,
            levels,
        } = refused
        else {
            panic!("not refused");
        };
        assert_eq!((by, wait_ns), (1, S));
        assert_eq!(levels[0].remaining, 4, "charged for a refused request");
        assert_eq!(levels[1].remaining, 0);
        // Another key is untouched by either.
        let Decision::Taken(levels) = buckets.take(vec![draw(3, FIVE)], now) else {
            panic!("another key refused");
        };
        assert_eq!(levels[0].remaining, 4);
    }

    #[test]
    fn retry_after_is_whole_seconds_and_at_least_one() {
        assert_eq!(retry_after_s(0), 1);
        assert_eq!(retry_after_s(1), 1);
        assert_eq!(retry_after_s(S), 1);
        assert_eq!(retry_after_s(S + 1), 2);
        assert_eq!(take_one(0, S, FIVE), Ok(S + FIVE.interval_ns));
        assert_eq!(take_one(2 * S, S, FIVE), Err(FIVE.interval_ns));
    }

    #[test]
    fn the_table_stays_bounded_and_forgets_full_buckets_first() {
        let buckets = Buckets::default();
        let now = S;
        let address = |n: usize| {
            BucketKey::Address(Some(IpAddr::from(
                u32::try_from(n).expect("small").to_be_bytes(),
            )))
        };
        for n in 0..BUCKETS_MAX {
            let draws = vec![Draw {
                key: address(n),
                rate: FIVE,
            }];
            assert!(matches!(buckets.take(draws, now), Decision::Taken(_)));
        }
        assert_eq!(buckets.len(), BUCKETS_MAX);
        // A second later every one of them is full again: the next new row sweeps them out.
        let later = now + S;
        let spent = Rate {
            burst: 1,
            interval_ns: 60 * S,
        };
        assert!(matches!(
            buckets.take(vec![draw(1, spent)], later),
            Decision::Taken(_)
        ));
        assert_eq!(buckets.len(), 1);
        // Rows still spending are kept until the table is full of them.
        for n in 0..BUCKETS_MAX {
            let draws = vec![Draw {
                key: address(n),
                rate: spent,
            }];
            buckets.take(draws, later);
        }
        assert!(buckets.len() <= BUCKETS_MAX);
    }
}
