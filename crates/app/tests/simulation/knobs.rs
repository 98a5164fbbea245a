//! What a seed is made of besides its steps: the simulated world's fixed numbers (the epoch,
//! the leases, the timeouts, the sweep interval, the customers and payment methods), the kind of
//! provider a seed plays against (`Profile`, drawn once per seed from its generator) and how a
//! provider write goes wrong (`Fault`, drawn per write). They live apart so that the provider,
//! the world, the steps and the checks read one set of numbers. How many seeds and steps run is
//! the root's business (environment variables).

use asiento_psp::Capabilities;
use asiento_testkit::Rng;

/// Attempts of one request within a step (the first, then retries after crashes).
pub const ATTEMPTS_PER_STEP_MAX: u32 = 3;
/// The simulated epoch: 2023-11-14T22:13:20Z.
pub const EPOCH_MS: i64 = 1_700_000_000_000;
pub const IDEMPOTENCY_LEASE_MS: i64 = 60_000;
/// How often the simulated `serve` runs a reconciler sweep while time passes.
pub const SWEEP_INTERVAL_MS: i64 = 5 * 60_000;
/// The longest single clock jump (a sweep runs every `SWEEP_INTERVAL_MS` inside it).
pub const CLOCK_JUMP_MS_MAX: i64 = 20 * 60_000;
/// The reconciler drives a capture or refund this long after its request (the clock is manual,
/// so small is cheap).
pub const OPERATION_TIMEOUT_MS: i64 = 30_000;
/// How long a pending capture or refund may wait for its decision: above the longest
/// asynchronous delay plus a sweep, so that only a profile without lookups ever reaches it.
pub const OPERATION_PENDING_DEADLINE_MS: i64 = 2 * 3_600_000;
/// Of the provider's `operation.updated` events, the share delivered as they happen.
pub const EVENTS_DELIVERED_PERCENT: u64 = 75;
/// A key lifetime no seed outlives (Stripe's day).
const KEY_LIFETIME_MS_LONG: i64 = 24 * 3_600_000;
/// The longer absence window a profile may have; the end of a seed runs past it.
const ABSENCE_CONFIRMED_AFTER_MS_LONG: i64 = 90 * 60_000;
pub const FEE_BPS: u32 = 300;
pub const TENANT: &str = "acme";
pub const PROVIDER: &str = "sim";
pub const CUSTOMERS: [&str; 3] = ["c1", "c2", "c3"];
pub const METHODS: [&str; 3] = ["pm_card_ok", "pm_card_declined", "pm_card_3ds"];

/// What kind of provider a seed plays against, drawn once per seed: which lookups exist,
/// whether captures and refunds are decided later, how long it remembers a key, whether
/// refunds bounce and whether a dispute's webhooks get through.
#[derive(Debug, Clone, Copy)]
pub struct Profile {
    pub lookup_by_key: bool,
    pub lookup_by_id: bool,
    pub async_modifications: bool,
    /// How long after its request an asynchronous capture or refund is decided.
    pub async_delay_ms: i64,
    /// Of asynchronous decisions, the percentage that fail.
    pub async_fail_percent: u64,
    /// Of succeeded refunds, the percentage that fail later (a late reversal).
    pub reversal_percent: u64,
    pub reversal_delay_ms: i64,
    /// How long a capture's or refund's key is remembered; a write under an older key is new.
    pub key_lifetime_ms: i64,
    /// Of disputes, the percentage whose charge's webhooks are all dropped from then on.
    pub dispute_dark_percent: u64,
    /// Whether what a charge request made can be cancelled by our reference (Adyen's
    /// technical cancel): an authorisation whose answer was lost is then cancelled once its
    /// payment expired.
    pub cancel_by_reference: bool,
    /// How far past a payment's expiry the report must have been compared before a charge never
    /// answered is concluded absent.
    absence_confirmed_after_ms: i64,
    /// How much of a report window is asked at once (0: the whole window).
    report_slice_ms: i64,
}

impl Profile {
    pub fn draw(rng: &mut Rng) -> Profile {
        Profile {
            lookup_by_key: rng.chance(50),
            lookup_by_id: rng.chance(60),
            async_modifications: rng.chance(50),
            async_delay_ms: rng.between(1_000, 20 * 60_000),
            async_fail_percent: *rng.pick(&[0, 15, 40]),
            reversal_percent: *rng.pick(&[0, 0, 20, 50]),
            reversal_delay_ms: rng.between(1_000, 30 * 60_000),
            key_lifetime_ms: *rng.pick(&[KEY_LIFETIME_MS_LONG, KEY_LIFETIME_MS_LONG, 10 * 60_000]),
            dispute_dark_percent: *rng.pick(&[0, 50, 100]),
            cancel_by_reference: rng.chance(50),
            absence_confirmed_after_ms: *rng.pick(&[0, 0, ABSENCE_CONFIRMED_AFTER_MS_LONG]),
            report_slice_ms: *rng.pick(&[0, 60_000, 10 * 60_000]),
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            lookup_by_key: self.lookup_by_key,
            lookup_by_id: self.lookup_by_id,
            async_modifications: self.async_modifications,
            key_lifetime: std::time::Duration::from_millis(self.key_lifetime_ms as u64),
            absence_confirmed_after: std::time::Duration::from_millis(
                self.absence_confirmed_after_ms as u64,
            ),
            report_slice: (self.report_slice_ms > 0)
                .then(|| std::time::Duration::from_millis(self.report_slice_ms as u64)),
        }
    }

    /// The provider tells of a pending operation only by webhook (and, for a refund, by the
    /// report's cumulative total).
    pub fn webhooks_only(&self) -> bool {
        !self.lookup_by_key && !self.lookup_by_id
    }
}

/// How the next provider write goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    #[default]
    None,
    /// The request never reached the provider: `Unknown`, nothing happened.
    FailBefore,
    /// The provider acted, the answer was lost (a timeout after sending): `Unknown`.
    LoseAnswer,
    /// The process dies before the request leaves.
    CrashBefore,
    /// The provider acts, and the process dies before it reads the answer.
    CrashAfter,
}
