//! Rate limits: a token bucket per API key and one per tenant across its keys, one per client
//! address for requests without a known key, and one per client address for the console's
//! sign-in, so that one client flooding the API costs other clients nothing but the few
//! microseconds it takes to refuse it.
//!
//! Why it is built this way:
//! - **After the key, before the handler.** The middleware sits on the `/v1` routes only
//!   ([`enforce`]), resolves the bearer key to its tenant through the same `KeyCache` as
//!   `auth`, and draws on the key's bucket and the tenant's; a request that one of them refuses
//!   is answered 429 problem+json (`code: rate_limited`) with `Retry-After` without reaching a
//!   handler or the database. An unknown or missing key is still answered 401 by `auth`, but
//!   draws on its client address's bucket first: guessing keys is paced. Provider webhooks (a
//!   provider retries what we refuse, and they are authenticated by signature), `/healthz`,
//!   `/readyz`, `/metrics` and `/openapi.json` are never limited.
//! - **The IETF fields on every answer.** Each answer of a limited route carries the
//!   `RateLimit-Policy` and `RateLimit` fields of draft-ietf-httpapi-ratelimit-headers (-11,
//!   <https://datatracker.ietf.org/doc/draft-ietf-httpapi-ratelimit-headers/>): one policy item per
//!   bucket the request drew on, `"key";q=<burst>;w=<seconds a spent bucket takes to fill>` (and
//!   `"tenant"`, or `"address"`), and its service limit `"key";r=<requests left>;t=<seconds
//!   until the bucket is full>`. On a 429 the refusing bucket says `r=0;t=<Retry-After>`: the
//!   draft asks that `Retry-After` never point before the end of the effective window.
//! - **Bounded, integer, one lock.** The buckets (`bucket.rs`) are integer nanoseconds in one
//!   table whose rows are bounded; a decision is two hash lookups under a mutex held for no await.
//! - **Counted.** Every refusal increments `asiento_rate_limited_total{scope}`, `scope` one of
//!   `key`, `tenant`, `address` and `console`.
//!
//! The limits come from `serve --rate-limit` (`config.rs` has the grammar); without it no `/v1`
//! request is limited and none carries the fields.

mod bucket;
mod config;

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest as _, Sha256};

pub use bucket::BUCKETS_MAX;
pub use config::{
    Rate, RateLimitConfig, RateLimitSpecError, ADDRESS_DEFAULT, CONSOLE_DEFAULT, COUNT_MAX,
    TENANT_FACTOR,
};

use crate::problem::Problem;
use crate::AppState;
use bucket::{BucketKey, Buckets, Decision, Draw, Level};

/// The field that names each bucket's shape.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// The field that says what each bucket has left.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// Which bucket refused a request: the label of `asiento_rate_limited_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Key,
    Tenant,
    Address,
    Console,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Key => "key",
            Scope::Tenant => "tenant",
            Scope::Address => "address",
            Scope::Console => "console",
        }
    }

    fn refused(self) {
        metrics::counter!("asiento_rate_limited_total", "scope" => self.as_str()).increment(1);
    }
}

/// A request refused for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limited {
    pub scope: Scope,
    /// Whole seconds until it may be sent again, at least 1.
    pub retry_after_s: u64,
}

/// The client address a request came from: the peer of its connection (`serve` hands it over as
/// `ConnectInfo`), an IPv6 address cut to its /64, since one host is commonly given a whole /64.
/// `None` when the router is driven without a connection (in-process tests): such requests share
/// one bucket. A proxy's `X-Forwarded-For` is not trusted: anyone can write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddress(pub Option<IpAddr>);

impl ClientAddress {
    fn of(extensions: &axum::http::Extensions) -> Self {
        let peer = extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(address)| address.ip());
        ClientAddress(peer.map(partition))
    }
}

/// The address whose bucket a peer draws on.
fn partition(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(prefix.into())
            }
        },
    }
}

impl<S: Send + Sync> FromRequestParts<S> for ClientAddress {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(ClientAddress::of(&parts.extensions))
    }
}

/// The process's limits and buckets (`AppState::rate_limits`).
#[derive(Debug)]
pub struct RateLimits {
    config: RateLimitConfig,
    buckets: Buckets,
    /// The origin of the buckets' nanoseconds.
    epoch: Instant,
}

impl Default for RateLimits {
    /// What `serve` runs without `--rate-limit`: no `/v1` limit, the console's sign-in limited.
    fn default() -> Self {
        RateLimits::new(RateLimitConfig::default())
    }
}

/// What the buckets a request drew on said: the fields to send, and the refusal if any.
#[derive(Debug)]
struct Verdict {
    /// Each bucket's policy name, shape and level.
    buckets: Vec<(&'static str, Rate, Level)>,
    refused: Option<Limited>,
}

impl RateLimits {
    pub fn new(config: RateLimitConfig) -> Self {
        Self {
            config,
            buckets: Buckets::default(),
            epoch: Instant::now(),
        }
    }

    pub fn config(&self) -> &RateLimitConfig {
        &self.config
    }

    fn now_ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// A request with a key of `tenant`: its key's bucket and its tenant's. `None` when the
    /// tenant's keys are not limited.
    fn check_key(&self, key_sha256: [u8; 32], tenant: String, now: Instant) -> Option<Verdict> {
        let rate = self.config.key_rate(&tenant)?;
        let draws = vec![
            Draw {
                key: BucketKey::Key(key_sha256),
                rate,
            },
            Draw {
                key: BucketKey::Tenant(tenant),
                rate: rate.for_tenant(),
            },
        ];
        Some(self.decide(
            draws,
            &[("key", Scope::Key), ("tenant", Scope::Tenant)],
            now,
        ))
    }

    /// A `/v1` request without a known key, by its client address.
    fn check_address(&self, address: ClientAddress, now: Instant) -> Option<Verdict> {
        let rate = self.config.address_rate()?;
        let draws = vec![Draw {
            key: BucketKey::Address(address.0),
            rate,
        }];
        Some(self.decide(draws, &[("address", Scope::Address)], now))
    }

    /// One console sign-in attempt from `address`: refused while that address has spent its
    /// attempts.
    pub fn console_attempt(&self, address: ClientAddress) -> Result<(), Limited> {
        let draws = vec![Draw {
            key: BucketKey::Console(address.0),
            rate: self.config.console,
        }];
        match self
            .decide(draws, &[("console", Scope::Console)], Instant::now())
            .refused
        {
            Some(limited) => Err(limited),
            None => Ok(()),
        }
    }

    fn decide(&self, draws: Vec<Draw>, names: &[(&'static str, Scope)], now: Instant) -> Verdict {
        let rates: Vec<Rate> = draws.iter().map(|draw| draw.rate).collect();
        let (levels, refused) = match self.buckets.take(draws, self.now_ns(now)) {
            Decision::Taken(levels) => (levels, None),
            Decision::Refused {
                by,
                wait_ns,
                levels,
            } => {
                let scope = names.get(by).map_or(Scope::Key, |(_, scope)| *scope);
                scope.refused();
                let limited = Limited {
                    scope,
                    retry_after_s: bucket::retry_after_s(wait_ns),
                };
                (levels, Some((by, limited)))
            }
        };
        let mut buckets: Vec<(&'static str, Rate, Level)> = names
            .iter()
            .zip(rates)
            .zip(levels)
            .map(|(((name, _), rate), level)| (*name, rate, level))
            .collect();
        if let Some((by, limited)) = refused {
            // The refusing bucket's effective window ends when the request may come again.
            if let Some((_, _, level)) = buckets.get_mut(by) {
                *level = Level {
                    remaining: 0,
                    full_in_ns: limited.retry_after_s.saturating_mul(1_000_000_000),
                };
            }
        }
        Verdict {
            buckets,
            refused: refused.map(|(_, limited)| limited),
        }
    }
}

impl Verdict {
    /// `RateLimit-Policy` and `RateLimit` as sent.
    fn fields(&self) -> (String, String) {
        let policy = self
            .buckets
            .iter()
            .map(|(name, rate, _)| format!("\"{name}\";q={};w={}", rate.burst, rate.window_s()))
            .collect::<Vec<_>>()
            .join(", ");
        let limit = self
            .buckets
            .iter()
            .map(|(name, _, level)| {
                format!(
                    "\"{name}\";r={};t={}",
                    level.remaining,
                    config::ceil_s(level.full_in_ns)
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        (policy, limit)
    }

    fn write(&self, headers: &mut HeaderMap) {
        let (policy, limit) = self.fields();
        // Built of digits, names and punctuation only: always a valid header value.
        if let (Ok(policy), Ok(limit)) = (
            HeaderValue::from_str(&policy),
            HeaderValue::from_str(&limit),
        ) {
            headers.insert(RATELIMIT_POLICY, policy);
            headers.insert(RATELIMIT, limit);
        }
    }

    fn refusal(&self, limited: Limited) -> Response {
        let detail = match limited.scope {
            Scope::Key => "this API key has sent more requests than its rate limit allows",
            Scope::Tenant => {
                "this tenant's API keys together have sent more requests than its rate limit allows"
            }
            Scope::Address | Scope::Console => {
                "too many requests without a known API key from this address"
            }
        };
        let mut response = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!(
                "{detail}; retry after {} s (see the RateLimit header)",
                limited.retry_after_s
            ),
        )
        .with_retry_after(limited.retry_after_s)
        .into_response();
        self.write(response.headers_mut());
        response
    }
}

/// The bearer key of a request, read as `auth` reads it (which answers every malformed header).
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|key| !key.is_empty())
}

/// The `/v1` routes' layer: a request that its buckets refuse is answered 429; every other one
/// goes on, and its answer carries the buckets' fields.
pub async fn enforce(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let limits = &state.rate_limits;
    if !limits.config.limits_api() {
        return next.run(request).await;
    }
    let now = Instant::now();
    let verdict = match bearer(request.headers()) {
        Some(key) => match state.key_cache.tenant_for_key(&state.database, key).await {
            Ok(Some(tenant)) => {
                limits.check_key(Sha256::digest(key.as_bytes()).into(), tenant, now)
            }
            Ok(None) => limits.check_address(ClientAddress::of(request.extensions()), now),
            // `auth` reads the key again and answers the database's error as it does.
            Err(_) => None,
        },
        None => limits.check_address(ClientAddress::of(request.extensions()), now),
    };
    let Some(verdict) = verdict else {
        return next.run(request).await;
    };
    if let Some(limited) = verdict.refused {
        return verdict.refusal(limited);
    }
    let mut response = next.run(request).await;
    verdict.write(response.headers_mut());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(spec: &str) -> RateLimits {
        RateLimits::new(spec.parse().expect("a valid spec"))
    }

    #[test]
    fn the_fields_name_each_bucket_with_its_shape_and_level() {
        let limits = limits("default=2/s,burst=5");
        let now = Instant::now();
        let verdict = limits
            .check_key([1; 32], "acme".to_owned(), now)
            .expect("limited");
        assert_eq!(verdict.refused, None);
        assert_eq!(
            verdict.fields(),
            (
                "\"key\";q=5;w=3, \"tenant\";q=20;w=3".to_owned(),
                "\"key\";r=4;t=1, \"tenant\";r=19;t=1".to_owned()
            )
        );
        for _ in 0..4 {
            limits.check_key([1; 32], "acme".to_owned(), now);
        }
        let refused = limits
            .check_key([1; 32], "acme".to_owned(), now)
            .expect("limited");
        assert_eq!(
            refused.refused,
            Some(Limited {
                scope: Scope::Key,
                retry_after_s: 1
            })
        );
        assert_eq!(refused.fields().1, "\"key\";r=0;t=1, \"tenant\";r=15;t=1");
        // Another key of the tenant has its own bucket, and the tenant's still has requests.
        let other = limits
            .check_key([2; 32], "acme".to_owned(), now)
            .expect("limited");
        assert_eq!(other.refused, None);
        assert_eq!(other.fields().1, "\"key\";r=4;t=1, \"tenant\";r=14;t=1");
    }

    #[test]
    fn a_tenant_s_keys_together_are_refused_at_its_bucket() {
        let limits = limits("acme=1/m,burst=1");
        let now = Instant::now();
        for key in 0..TENANT_FACTOR {
            let verdict = limits
                .check_key([key as u8; 32], "acme".to_owned(), now)
                .expect("limited");
            assert_eq!(verdict.refused, None, "key {key}");
        }
        let refused = limits
            .check_key([99; 32], "acme".to_owned(), now)
            .expect("limited");
        assert_eq!(
            refused.refused.map(|limited| limited.scope),
            Some(Scope::Tenant)
        );
        // Tenants without an entry, and no default: not limited.
        assert!(limits.check_key([1; 32], "beta".to_owned(), now).is_none());
    }

    #[test]
    fn addresses_are_limited_apart_and_ipv6_by_its_slash_64() {
        let limits = limits("address=1/m,burst=1");
        let now = Instant::now();
        let one = ClientAddress(Some(partition("2001:db8::1".parse().expect("ip"))));
        let same_host = ClientAddress(Some(partition("2001:db8::ffff:2".parse().expect("ip"))));
        let other = ClientAddress(Some(partition("192.0.2.7".parse().expect("ip"))));
        let check = |address| limits.check_address(address, now).expect("limited").refused;
        assert_eq!(check(one), None);
        assert_eq!(
            check(same_host).map(|limited| limited.scope),
            Some(Scope::Address)
        );
        assert_eq!(check(other), None);
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().expect("ip");
        assert_eq!(partition(mapped), other.0.expect("an address"));
    }

    #[test]
    fn console_sign_in_is_limited_without_any_flag() {
        let limits = RateLimits::default();
        assert!(!limits.config().limits_api());
        let address = ClientAddress(Some("192.0.2.1".parse().expect("ip")));
        for attempt in 0..CONSOLE_DEFAULT.burst {
            assert_eq!(limits.console_attempt(address), Ok(()), "attempt {attempt}");
        }
        assert_eq!(
            limits.console_attempt(address),
            Err(Limited {
                scope: Scope::Console,
                retry_after_s: 6
            })
        );
        let elsewhere = ClientAddress(Some("192.0.2.2".parse().expect("ip")));
        assert_eq!(limits.console_attempt(elsewhere), Ok(()));
    }
}
