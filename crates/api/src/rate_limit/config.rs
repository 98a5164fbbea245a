//! The `--rate-limit` grammar (`ASIENTO_RATE_LIMIT`): which bucket shape each tenant's keys, the
//! requests without a known key and the console's sign-in get.
//!
//! ```text
//! spec   = entry *(";" entry)
//! entry  = name "=" rate ["," "burst=" count]
//! name   = "default" | "address" | "console" | tenant id
//! rate   = count "/" unit            ; unit: s, m (a minute) or h; count 1 to 1000000
//! ```
//!
//! `default=200/s,burst=400;acme=1000/s,burst=2000` gives each key of `acme` 1000 requests a
//! second with 2000 at once, and each key of every other tenant 200 and 400. A burst left out is
//! the rate's count (`200/s` holds 200). A tenant's keys together draw on a second bucket
//! [`TENANT_FACTOR`] times their key's, so that a tenant cannot multiply its share by minting keys.
//! `address` is the bucket of requests without a known key, per client address
//! ([`ADDRESS_DEFAULT`] unless given); `console` the console's sign-in attempts per client
//! address ([`CONSOLE_DEFAULT`] unless given, and limited even without the flag: a key guessed by
//! brute force is the threat). A tenant without an entry, and no `default`, is not limited; no
//! flag at all limits no `/v1` request, so that a benchmark can drive one key as fast as the
//! process goes. The limits live in the flag, not in the keys' records: one place to read them,
//! and a change is a restart, like every other setting.

use std::collections::BTreeMap;
use std::str::FromStr;

/// The largest count of a rate or a burst: a bucket's arithmetic stays far inside `u64`.
pub const COUNT_MAX: u64 = 1_000_000;

/// A tenant's bucket, across all of its keys, holds this many times its key's burst and refills
/// this many times as fast.
pub const TENANT_FACTOR: u64 = 4;

const NANOS_PER_S: u64 = 1_000_000_000;

/// Requests without a known key, per client address, while any `/v1` limit is set: 10 a second,
/// 20 at once. Enough for a client that mistyped its key to read the 401s; far too few to guess
/// a key.
pub const ADDRESS_DEFAULT: Rate = Rate {
    burst: 20,
    interval_ns: NANOS_PER_S / 10,
};

/// Console sign-in attempts per client address: 10 a minute, 10 at once.
pub const CONSOLE_DEFAULT: Rate = Rate {
    burst: 10,
    interval_ns: 60 * NANOS_PER_S / 10,
};

/// A token bucket's shape: how many requests may come at once, and how fast they come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    /// Requests a full bucket holds: the `q` of `RateLimit-Policy`.
    pub burst: u64,
    /// Nanoseconds to earn one request back (never 0).
    pub interval_ns: u64,
}

impl Rate {
    /// Whole seconds a spent bucket takes to fill again, at least 1: the policy's `w`.
    pub fn window_s(&self) -> u64 {
        ceil_s(self.capacity_ns()).max(1)
    }

    /// The time a spent bucket takes to fill again.
    pub(crate) fn capacity_ns(&self) -> u64 {
        self.burst.saturating_mul(self.interval_ns)
    }

    /// The bucket of a tenant whose keys have this one.
    pub(crate) fn for_tenant(self) -> Rate {
        Rate {
            burst: self.burst.saturating_mul(TENANT_FACTOR),
            interval_ns: (self.interval_ns / TENANT_FACTOR).max(1),
        }
    }
}

/// Nanoseconds as whole seconds, rounded up.
pub(crate) fn ceil_s(ns: u64) -> u64 {
    ns.div_ceil(NANOS_PER_S)
}

/// Every limit of a process. The default is what `serve` runs without `--rate-limit`: no `/v1`
/// limit, the console's sign-in limited per address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// The keys of every tenant without an entry of its own; `None`: they are not limited.
    pub default: Option<Rate>,
    /// Tenants' own entries, overriding `default`.
    pub tenants: BTreeMap<String, Rate>,
    /// Requests without a known key per client address; `None`: [`ADDRESS_DEFAULT`] while any
    /// other `/v1` limit is set, else none.
    pub address: Option<Rate>,
    pub console: Rate,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        Self {
            default: None,
            tenants: BTreeMap::new(),
            address: None,
            console: CONSOLE_DEFAULT,
        }
    }
}

impl RateLimitConfig {
    /// Whether any `/v1` request is limited (and so answered with the RateLimit fields).
    pub fn limits_api(&self) -> bool {
        self.default.is_some() || !self.tenants.is_empty() || self.address.is_some()
    }

    /// The bucket of each of `tenant`'s keys, if its keys are limited.
    pub fn key_rate(&self, tenant: &str) -> Option<Rate> {
        self.tenants.get(tenant).copied().or(self.default)
    }

    /// The bucket of requests without a known key, per client address, if they are limited.
    pub fn address_rate(&self) -> Option<Rate> {
        match self.address {
            Some(rate) => Some(rate),
            None if self.limits_api() => Some(ADDRESS_DEFAULT),
            None => None,
        }
    }
}

/// Why a `--rate-limit` value was refused: each variant names the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateLimitSpecError {
    #[error("no entry: expected e.g. default=200/s,burst=400;acme=1000/s")]
    EntriesMissing,
    #[error("{entry:?}: an entry is name=count/unit (e.g. default=200/s)")]
    EntryWithoutRate { entry: String },
    #[error(
        "{name:?} is neither default, address, console nor a tenant id (lowercase letters, digits, _ and -)"
    )]
    NameInvalid { name: String },
    #[error("{name} is given twice")]
    NameRepeated { name: String },
    #[error("{text:?}: a rate is count/unit, the count 1 to {COUNT_MAX}, the unit s, m or h")]
    RateInvalid { text: String },
    #[error("{text:?}: a burst is burst=count, the count 1 to {COUNT_MAX}")]
    BurstInvalid { text: String },
    #[error("{option:?}: the only option of an entry is burst=count")]
    OptionUnknown { option: String },
}

impl FromStr for RateLimitConfig {
    type Err = RateLimitSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut config = RateLimitConfig::default();
        let mut named = std::collections::BTreeSet::new();
        let entries = spec.split(';').map(str::trim).filter(|e| !e.is_empty());
        for entry in entries {
            let (name, rate) = parse_entry(entry)?;
            if !named.insert(name.to_owned()) {
                return Err(RateLimitSpecError::NameRepeated {
                    name: name.to_owned(),
                });
            }
            match name {
                "default" => config.default = Some(rate),
                "address" => config.address = Some(rate),
                "console" => config.console = rate,
                tenant => {
                    config.tenants.insert(tenant.to_owned(), rate);
                }
            }
        }
        if named.is_empty() {
            return Err(RateLimitSpecError::EntriesMissing);
        }
        Ok(config)
    }
}

/// `name=count/unit[,burst=count]`.
fn parse_entry(entry: &str) -> Result<(&str, Rate), RateLimitSpecError> {
    let mut parts = entry.split(',').map(str::trim);
    let head = parts.next().unwrap_or_default();
    let (name, rate) =
        head.split_once('=')
            .ok_or_else(|| RateLimitSpecError::EntryWithoutRate {
                entry: entry.to_owned(),
            })?;
    let name = name.trim();
    if asiento_domain::TenantId::parse(name).is_err() {
        return Err(RateLimitSpecError::NameInvalid {
            name: name.to_owned(),
        });
    }
    let (count, window_ns) = parse_rate(rate.trim())?;
    let mut burst = count;
    for option in parts.filter(|part| !part.is_empty()) {
        let Some(value) = option.strip_prefix("burst=") else {
            return Err(RateLimitSpecError::OptionUnknown {
                option: option.to_owned(),
            });
        };
        burst = parse_count(value.trim()).ok_or_else(|| RateLimitSpecError::BurstInvalid {
            text: option.to_owned(),
        })?;
    }
    Ok((
        name,
        Rate {
            burst,
            interval_ns: window_ns / count,
        },
    ))
}

/// `count/unit` as the count and the unit in nanoseconds.
fn parse_rate(text: &str) -> Result<(u64, u64), RateLimitSpecError> {
    let invalid = || RateLimitSpecError::RateInvalid {
        text: text.to_owned(),
    };
    let (count, unit) = text.split_once('/').ok_or_else(invalid)?;
    let count = parse_count(count.trim()).ok_or_else(invalid)?;
    let window_ns = match unit.trim() {
        "s" => NANOS_PER_S,
        "m" | "min" => 60 * NANOS_PER_S,
        "h" => 3_600 * NANOS_PER_S,
        _ => return Err(invalid()),
    };
    Ok((count, window_ns))
}

fn parse_count(text: &str) -> Option<u64> {
    if !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|count| (1..=COUNT_MAX).contains(count))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(burst: u64, interval_ns: u64) -> Rate {
        Rate { burst, interval_ns }
    }

    #[test]
    fn entries_give_each_tenant_its_rate_and_burst() {
        let config: RateLimitConfig = "default=200/s,burst=400; acme=1000/s,burst=2000;beta=30/m"
            .parse()
            .expect("a valid spec");
        assert_eq!(config.default, Some(rate(400, 5_000_000)));
        assert_eq!(config.key_rate("acme"), Some(rate(2_000, 1_000_000)));
        // A burst left out is the rate's count.
        assert_eq!(config.key_rate("beta"), Some(rate(30, 2_000_000_000)));
        assert_eq!(config.key_rate("gamma"), config.default);
        assert_eq!(config.address_rate(), Some(ADDRESS_DEFAULT));
        assert_eq!(config.console, CONSOLE_DEFAULT);
        assert!(config.limits_api());
    }

    #[test]
    fn without_default_only_the_named_tenants_are_limited() {
        let config: RateLimitConfig = "acme=5/s;console=3/h,burst=3".parse().expect("valid");
        assert_eq!(config.key_rate("acme"), Some(rate(5, 200_000_000)));
        assert_eq!(config.key_rate("beta"), None);
        assert_eq!(config.console, rate(3, 1_200_000_000_000));
        let console_only: RateLimitConfig = "console=20/m".parse().expect("valid");
        assert!(!console_only.limits_api());
        assert_eq!(console_only.address_rate(), None);
        assert!(!RateLimitConfig::default().limits_api());
        let address: RateLimitConfig = "address=1/s,burst=3".parse().expect("valid");
        assert_eq!(address.address_rate(), Some(rate(3, 1_000_000_000)));
        assert_eq!(address.key_rate("acme"), None);
    }

    #[test]
    fn a_spec_that_breaks_a_rule_is_refused_by_name() {
        use RateLimitSpecError as E;
        let text = String::new;
        let table = [
            ("", E::EntriesMissing),
            (" ; ", E::EntriesMissing),
            ("default", E::EntryWithoutRate { entry: text() }),
            ("Acme=5/s", E::NameInvalid { name: text() }),
            ("a b=5/s", E::NameInvalid { name: text() }),
            ("default=5/s;default=6/s", E::NameRepeated { name: text() }),
            ("default=5", E::RateInvalid { text: text() }),
            ("default=0/s", E::RateInvalid { text: text() }),
            ("default=-1/s", E::RateInvalid { text: text() }),
            ("default=1.5/s", E::RateInvalid { text: text() }),
            ("default=5/d", E::RateInvalid { text: text() }),
            ("default=1000001/s", E::RateInvalid { text: text() }),
            ("default=5/s,burst=0", E::BurstInvalid { text: text() }),
            ("default=5/s,burst=x", E::BurstInvalid { text: text() }),
            (
                "default=5/s,tenant=9/s",
                E::OptionUnknown { option: text() },
            ),
        ];
        for (spec, rule) in table {
            let error = spec
                .parse::<RateLimitConfig>()
                .expect_err(&format!("{spec:?} should be refused"));
            assert_eq!(
                std::mem::discriminant(&error),
                std::mem::discriminant(&rule),
                "{spec:?}: {error}"
            );
        }
    }

    #[test]
    fn a_tenant_bucket_is_the_factor_times_its_keys() {
        let key = rate(400, 5_000_000);
        let tenant = key.for_tenant();
        assert_eq!(tenant, rate(400 * TENANT_FACTOR, 5_000_000 / TENANT_FACTOR));
        assert_eq!((key.window_s(), tenant.window_s()), (2, 2));
        // A window below a second is still announced as one.
        assert_eq!(rate(1, 1_000).window_s(), 1);
        assert_eq!(CONSOLE_DEFAULT.window_s(), 60);
    }
}
