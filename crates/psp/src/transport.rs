//! The HTTP transport every provider adapter sends through (the simulator's
//! protocol in [`crate::client`], Stripe's in [`crate::stripe::adapter`]).
//!
//! What it must survive, and how:
//! - **Slow or dead networks**: a connect timeout and a whole-request
//!   timeout on every call.
//! - **Transient failures** (a connect error, 429, 5xx, a connection broken
//!   mid-answer, or whatever the provider marks `Stripe-Should-Retry: true`;
//!   `false` makes an answer final): bounded retries with exponential backoff and *full* jitter
//!   (a delay drawn uniformly from `[0, min(cap, base·2ⁿ)]`, so that many
//!   clients failing together do not come back together). A `Retry-After`
//!   from the provider lengthens the delay, up to the cap.
//! - **A key still in use** (409: the key's first request is still running
//!   at the provider): transient too, retried with the same key.
//! - **Permanent refusals** (any other 4xx): never retried, and a refusal
//!   only when no earlier attempt of the call may have reached the provider
//!   (see below).
//! - **Double effects**: every attempt of a write carries the same
//!   idempotency key, so a retry after a 500 that the provider processed
//!   anyway returns the first charge instead of making a second.
//!
//! Why "unknown" and not "failed":
//! - A write that was sent and then timed out may have landed. It is
//!   reported as unknown at once, without a retry: the request timeout is
//!   the caller's latency budget, retrying would multiply it, and a later
//!   lookup by key (or the webhook, or the settlement report) settles it
//!   safely because the key is the same.
//! - When the retries on transient failures run out, a charge is unknown
//!   too, even if the last attempts never reached the provider: an earlier
//!   attempt may have landed (a 500 after the charge was created is a real
//!   provider behaviour). Even when *every* attempt failed to connect we
//!   still say unknown rather than "not charged": the ledger's answer to
//!   unknown (pending, then a lookup by key that finds nothing and expires
//!   the payment) is also right in that case, and one path is simpler to
//!   get right than two.
//! - Once an attempt of a write may have reached the provider (the
//!   connection broke mid-answer, it timed out after sending, a 5xx, a 409),
//!   a 4xx on a later attempt of the same call is unknown too, never a
//!   refusal: the retry may have been refused *because* the first attempt
//!   acted (a key now bound to an effect, a charge already captured), so
//!   the refusal says nothing about whether the effect happened.
//! - Reads (GET) are free of effects, so their timeouts are retried like
//!   any transient failure, and their 4xx are always what they say.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Bytes;
use backon::Retryable;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;

use crate::provider::{Capabilities, ProviderError, Rejection};

/// The header every write carries.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// The error code with which the provider says "no such object" (as
/// Stripe's `resource_missing`). Only a 404 carrying it means "none": a bare
/// 404 may be a wrong base URL, and reading that as "no charge" would fail
/// payments that were charged.
pub const CODE_RESOURCE_MISSING: &str = "resource_missing";

/// The answer header with which a provider overrides the status's retry
/// heuristics (Stripe's).
pub const SHOULD_RETRY_HEADER: &str = "Stripe-Should-Retry";

/// Adyen's word that an error is worth retrying with the same key (`true`); with a 409 or 422
/// it says the key's first request is still running.
pub const TRANSIENT_ERROR_HEADER: &str = crate::adyen::wire::TRANSIENT_ERROR_HEADER;

/// How much of an unreadable error body is kept in a message.
const ERROR_BODY_CHARS_MAX: usize = 300;

/// Timeouts, retry bounds and capabilities of an [`HttpProvider`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Time allowed to open a TCP (and TLS) connection.
    pub connect_timeout_ms: u64,
    /// Time allowed for one whole attempt, from sending to the last byte of
    /// the answer.
    pub request_timeout_ms: u64,
    /// Attempts per call, the first one included (at least 1).
    pub attempts_max: u32,
    /// The ceiling of the first retry's delay; it doubles on every retry.
    pub backoff_base_ms: u64,
    /// No retry delay ever exceeds this.
    pub backoff_max_ms: u64,
    /// What the provider behind the URL can do; [`Capabilities::SIM`] for
    /// the simulator's protocol. A test says "no lookup" here.
    pub capabilities: Capabilities,
    /// The most lines one settlement report request asks for (the simulator's `limit`; at
    /// Stripe, the most objects each of a report's listings may hold): a longer report ends
    /// early, and the reconciler asks for the rest of its window next.
    pub report_lines_max: usize,
}

/// [`ClientConfig::report_lines_max`]: a few megabytes of lines at once.
pub const REPORT_LINES_MAX_DEFAULT: usize = 2_000;

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout_ms: 2_000,
            request_timeout_ms: 10_000,
            attempts_max: 4,
            backoff_base_ms: 100,
            backoff_max_ms: 2_000,
            capabilities: Capabilities::SIM,
            report_lines_max: REPORT_LINES_MAX_DEFAULT,
        }
    }
}

/// Why an [`HttpProvider`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientInitError {
    #[error("provider base URL {url:?} is not an absolute http(s) URL")]
    BaseUrlInvalid { url: String },
    #[error("attempts_max must be at least 1")]
    AttemptsMaxZero,
    #[error("could not build the HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

/// How the client waits between retries. Production sleeps on tokio's
/// clock; tests inject one that records the delays, which makes the backoff
/// and the jitter observable without waiting for them.
pub trait RetrySleeper: Send + Sync + 'static {
    fn sleep(&self, delay: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// Sleeps for real.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioSleeper;

impl RetrySleeper for TokioSleeper {
    fn sleep(&self, delay: Duration) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(tokio::time::sleep(delay))
    }
}

/// The ceiling of retry `n`'s delay (`n` from 0): `min(max, base·2ⁿ)`,
/// without overflow.
pub fn backoff_ceiling_ms(base_ms: u64, max_ms: u64, retry: u32) -> u64 {
    let factor = 1u64.checked_shl(retry).unwrap_or(u64::MAX);
    base_ms.saturating_mul(factor).min(max_ms)
}

/// Exponential backoff with full jitter ("Exponential Backoff And Jitter",
/// AWS Architecture Blog, 2015). backon's own jitter adds up to one more
/// delay on top of the exponential one, which keeps retries bunched, so
/// this iterator is handed to backon as the backoff instead.
#[derive(Debug)]
pub struct FullJitter {
    base_ms: u64,
    max_ms: u64,
    retries_left: u32,
    retry: u32,
    rng: StdRng,
}

impl FullJitter {
    /// Yields `retries` delays.
    pub fn new(base_ms: u64, max_ms: u64, retries: u32, seed: u64) -> FullJitter {
        FullJitter {
            base_ms,
            max_ms,
            retries_left: retries,
            retry: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }
}

impl Iterator for FullJitter {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        let ceiling_ms = backoff_ceiling_ms(self.base_ms, self.max_ms, self.retry);
        self.retry = self.retry.saturating_add(1);
        Some(Duration::from_millis(self.rng.random_range(0..=ceiling_ms)))
    }
}

/// One failed attempt.
#[derive(Debug)]
pub(crate) enum AttemptError {
    /// The connection could not be opened: the provider never saw the
    /// request.
    NotSent(reqwest::Error),
    /// Sent, and no (complete) answer within the request timeout.
    TimedOut,
    /// Sent, and the connection broke before the answer was complete.
    Broken(reqwest::Error),
    /// The provider answered with a status other than 2xx.
    Status {
        status: StatusCode,
        body: Bytes,
        retry_after: Option<Duration>,
        /// The provider's own word on retrying (`Stripe-Should-Retry`), which
        /// overrides the status.
        should_retry: Option<bool>,
        /// The provider says the key's first request is still running (Adyen's
        /// `transient-error: true` on a 409 or 422 with error code 704), so it reached.
        key_in_progress: bool,
    },
}

impl AttemptError {
    fn from_reqwest(error: reqwest::Error) -> AttemptError {
        // A connect timeout is both "connect" and "timeout"; it never left,
        // so "connect" wins.
        if error.is_connect() {
            AttemptError::NotSent(error)
        } else if error.is_timeout() {
            AttemptError::TimedOut
        } else {
            AttemptError::Broken(error)
        }
    }

    fn is_transient(&self, retry_timeouts: bool) -> bool {
        match self {
            AttemptError::NotSent(_) | AttemptError::Broken(_) => true,
            AttemptError::TimedOut => retry_timeouts,
            AttemptError::Status {
                should_retry: Some(retry),
                ..
            } => *retry,
            AttemptError::Status { status, .. } => {
                *status == StatusCode::TOO_MANY_REQUESTS
                    || *status == StatusCode::CONFLICT
                    || status.is_server_error()
            }
        }
    }

    /// Whether the provider may have acted on this attempt: it was sent and
    /// got no complete answer, or the answer does not rule an effect out (a
    /// 5xx may come after the effect; a 409 says the key's first request is
    /// running). A connect failure never left; a 429 and other 4xx are
    /// refusals made before acting.
    fn may_have_reached(&self) -> bool {
        match self {
            AttemptError::NotSent(_) => false,
            AttemptError::TimedOut | AttemptError::Broken(_) => true,
            AttemptError::Status {
                status,
                key_in_progress,
                ..
            } => *key_in_progress || *status == StatusCode::CONFLICT || status.is_server_error(),
        }
    }

    fn describe(&self) -> String {
        match self {
            AttemptError::NotSent(e) => format!("could not connect: {e}"),
            AttemptError::TimedOut => "no answer within the request timeout".to_string(),
            AttemptError::Broken(e) => format!("connection broke: {e}"),
            AttemptError::Status { status, body, .. } => {
                format!(
                    "HTTP {status}: {}",
                    truncate(&String::from_utf8_lossy(body))
                )
            }
        }
    }
}

pub(crate) fn truncate(text: &str) -> String {
    text.chars().take(ERROR_BODY_CHARS_MAX).collect()
}

/// The final failure of a call, after retries.
#[derive(Debug)]
pub(crate) struct CallError {
    last: AttemptError,
    attempts: u32,
    retry_timeouts: bool,
    /// The call is a write (it has effects).
    write: bool,
    /// An attempt before the last may have reached the provider.
    earlier_reached: bool,
}

impl CallError {
    /// The last attempt's status and body, when the provider answered it.
    pub(crate) fn answered(&self) -> Option<(StatusCode, &[u8])> {
        match &self.last {
            AttemptError::Status { status, body, .. } => Some((*status, body)),
            _ => None,
        }
    }

    /// A non-transient status: what the provider answered the last attempt.
    fn refusal(&self) -> Option<Rejection> {
        // A 5xx or a 409 stays a possible effect even when the provider says not to retry it
        // (`Stripe-Should-Retry: false`): never a refusal.
        match &self.last {
            AttemptError::Status { status, body, .. }
                if !self.last.is_transient(false) && !self.last.may_have_reached() =>
            {
                Some(parse_rejection(*status, body))
            }
            _ => None,
        }
    }

    /// A refusal the provider meant: a non-transient status on a read, or
    /// on a write none of whose earlier attempts may have reached it.
    pub(crate) fn rejection(&self) -> Option<Rejection> {
        if self.write && self.earlier_reached {
            return None;
        }
        self.refusal()
    }

    pub(crate) fn unknown_reason(&self) -> String {
        if self.write && self.earlier_reached {
            if let Some(r) = self.refusal() {
                return format!(
                    "an earlier attempt may have reached the provider, so the refusal of attempt {} \
                     ({} {}: {}) does not say the effect did not happen",
                    self.attempts, r.status, r.code, r.message
                );
            }
        }
        if matches!(self.last, AttemptError::TimedOut) && !self.retry_timeouts {
            "sent, then no answer within the request timeout; the effect may have happened"
                .to_string()
        } else {
            format!(
                "gave up after {} attempt(s); last: {}",
                self.attempts,
                self.last.describe()
            )
        }
    }

    pub(crate) fn into_provider_error(self) -> ProviderError {
        match self.rejection() {
            Some(rejection) => ProviderError::Rejected(rejection),
            None => ProviderError::Unknown {
                reason: self.unknown_reason(),
            },
        }
    }
}

/// An error body: `{"error": {"code", "message"}}` (the simulator's protocol, Stripe), or
/// Adyen's `{"errorCode", "message"}` (RFC 7807's `detail` and `title` in its newer APIs).
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ErrorEnvelope {
    #[serde(default)]
    error: Option<ErrorBody>,
    #[serde(default)]
    error_code: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    detail: Option<String>,
    #[serde(default)]
    title: Option<String>,
}

#[derive(serde::Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

fn parse_rejection(status: StatusCode, body: &[u8]) -> Rejection {
    let parsed = serde_json::from_slice::<ErrorEnvelope>(body).ok();
    let (code, message) = match parsed {
        Some(ErrorEnvelope {
            error: Some(error), ..
        }) => (error.code, error.message),
        Some(envelope) => (
            envelope.error_code,
            envelope.message.or(envelope.detail).or(envelope.title),
        ),
        None => (None, None),
    };
    let code = code.unwrap_or_else(|| format!("http_{}", status.as_u16()));
    let message = message.unwrap_or_else(|| truncate(&String::from_utf8_lossy(body)));
    Rejection {
        status: status.as_u16(),
        code,
        message,
    }
}

/// One logical call: the same for every attempt. Owned, so that the retry
/// future is `'static` (borrowed data inside backon's generic future trips
/// the compiler's `Send` inference under `async_trait`).
pub(crate) struct Call {
    method: Method,
    url: Url,
    idempotency_key: Option<String>,
    /// The body and its content type.
    body: Option<(Bytes, &'static str)>,
    /// Reads may be retried after a timeout; writes may not (see the module
    /// doc).
    retry_timeouts: bool,
}

impl Call {
    /// A POST with effects, under `key`.
    pub(crate) fn write(url: Url, key: &str, body: Bytes, content_type: &'static str) -> Call {
        Call {
            method: Method::POST,
            url,
            idempotency_key: Some(key.to_string()),
            body: Some((body, content_type)),
            retry_timeouts: false,
        }
    }

    /// A GET.
    pub(crate) fn read(url: Url) -> Call {
        Call {
            method: Method::GET,
            url,
            idempotency_key: None,
            body: None,
            retry_timeouts: true,
        }
    }
}

/// A 2xx answer.
#[derive(Debug)]
pub(crate) struct Answered {
    pub body: Bytes,
    pub headers: HeaderMap,
}

/// Sends [`Call`]s to one provider's base URL, with the timeouts and retries above.
pub(crate) struct Transport {
    name: String,
    base: Url,
    http: reqwest::Client,
    config: ClientConfig,
    sleeper: Arc<dyn RetrySleeper>,
    /// Seeds one [`FullJitter`] per call; seedable so a test can replay.
    jitter_seeds: Mutex<StdRng>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("name", &self.name)
            .field("base", &self.base.as_str())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Transport {
    /// `base_url` is where the provider's `/v1` routes live, e.g.
    /// `http://127.0.0.1:8081` or `http://127.0.0.1:8080/sim`.
    /// `headers` go on every request (a provider's credentials and version).
    pub fn new(
        name: impl Into<String>,
        base_url: &str,
        config: ClientConfig,
        headers: HeaderMap,
    ) -> Result<Transport, ClientInitError> {
        let invalid = || ClientInitError::BaseUrlInvalid {
            url: base_url.to_string(),
        };
        let mut base = Url::parse(base_url).map_err(|_| invalid())?;
        if !matches!(base.scheme(), "http" | "https") || base.path_segments_mut().is_err() {
            return Err(invalid());
        }
        if config.attempts_max == 0 {
            return Err(ClientInitError::AttemptsMaxZero);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .timeout(Duration::from_millis(config.request_timeout_ms))
            // A payment API does not redirect; following one could replay a
            // write somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("asiento-psp/", env!("CARGO_PKG_VERSION")))
            .default_headers(headers)
            .build()?;
        Ok(Transport {
            name: name.into(),
            base,
            http,
            config,
            sleeper: Arc::new(TokioSleeper),
            jitter_seeds: Mutex::new(StdRng::from_os_rng()),
        })
    }

    /// Waits between retries with `sleeper` instead of tokio's clock.
    pub fn with_sleeper(mut self, sleeper: Arc<dyn RetrySleeper>) -> Transport {
        self.sleeper = sleeper;
        self
    }

    /// Makes the jitter replayable.
    pub fn with_jitter_seed(self, seed: u64) -> Transport {
        Transport {
            jitter_seeds: Mutex::new(StdRng::seed_from_u64(seed)),
            ..self
        }
    }

    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn url(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        // `new` checked that the base can take path segments.
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    fn backoff(&self) -> FullJitter {
        let seed = self
            .jitter_seeds
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .random::<u64>();
        FullJitter::new(
            self.config.backoff_base_ms,
            self.config.backoff_max_ms,
            self.config.attempts_max.saturating_sub(1),
            seed,
        )
    }

    pub async fn call(&self, call: Call) -> Result<Answered, CallError> {
        let retry_timeouts = call.retry_timeouts;
        let write = call.idempotency_key.is_some();
        let (future, attempts, reached) = retry(
            self.http.clone(),
            call,
            self.backoff(),
            Arc::clone(&self.sleeper),
            self.name.clone(),
            Duration::from_millis(self.config.backoff_max_ms),
        );
        let result = future.await;
        result.map_err(|last| CallError {
            last,
            attempts: attempts.load(Ordering::Relaxed),
            retry_timeouts,
            write,
            earlier_reached: reached.load(Ordering::Relaxed),
        })
    }

    /// A write or read whose answer is an object: decode failures are
    /// protocol errors.
    pub async fn object<T: DeserializeOwned>(&self, call: Call) -> Result<T, ProviderError> {
        let body = self
            .call(call)
            .await
            .map_err(CallError::into_provider_error)?;
        decode(&body.body)
    }

    /// A lookup: a `resource_missing` 404 is `None`.
    pub async fn lookup<T: DeserializeOwned>(&self, url: Url) -> Result<Option<T>, ProviderError> {
        match self.call(Call::read(url)).await {
            Ok(answered) => decode(&answered.body).map(Some),
            Err(error) => match error.rejection() {
                Some(r) if r.status == 404 && r.code == CODE_RESOURCE_MISSING => Ok(None),
                _ => Err(error.into_provider_error()),
            },
        }
    }
}

/// The retry future, boxed as `Send` and built from owned values only, with
/// the counter of attempts it makes and whether an attempt that was retried
/// may have reached the provider. backon's future carries closures whose
/// bounds take references (`FnMut(&E, Duration)`); inside an `async` body
/// the compiler cannot prove such a future `Send` for every lifetime
/// (rust-lang/rust#110338), so it is coerced here, outside any `async`.
type RetryFuture = Pin<Box<dyn Future<Output = Result<Answered, AttemptError>> + Send>>;

fn retry(
    http: reqwest::Client,
    call: Call,
    backoff: FullJitter,
    sleeper: Arc<dyn RetrySleeper>,
    provider: String,
    delay_max: Duration,
) -> (RetryFuture, Arc<AtomicU32>, Arc<AtomicBool>) {
    let attempts = Arc::new(AtomicU32::new(0));
    let reached = Arc::new(AtomicBool::new(false));
    let reached_by_retried = Arc::clone(&reached);
    let retry_timeouts = call.retry_timeouts;
    let url = call.url.to_string();
    let call = Arc::new(call);
    let counter = Arc::clone(&attempts);
    let future = (move || {
        counter.fetch_add(1, Ordering::Relaxed);
        attempt(http.clone(), Arc::clone(&call))
    })
    .retry(backoff)
    .sleep(move |delay: Duration| sleeper.sleep(delay))
    .when(move |e: &AttemptError| e.is_transient(retry_timeouts))
    .adjust(move |e: &AttemptError, delay: Option<Duration>| {
        delay.map(|delay| match e {
            AttemptError::Status {
                retry_after: Some(asked),
                ..
            } => delay.max((*asked).min(delay_max)),
            _ => delay,
        })
    })
    .notify(move |e: &AttemptError, delay: Duration| {
        // Called for every attempt that is retried, i.e. every one before
        // the last.
        if e.may_have_reached() {
            reached_by_retried.store(true, Ordering::Relaxed);
        }
        tracing::warn!(
            provider = %provider,
            url = %url,
            delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            error = %e.describe(),
            "provider call failed; retrying"
        );
    });
    (Box::pin(future), attempts, reached)
}

async fn attempt(http: reqwest::Client, call: Arc<Call>) -> Result<Answered, AttemptError> {
    let mut request = http.request(call.method.clone(), call.url.clone());
    if let Some(key) = &call.idempotency_key {
        request = request.header(IDEMPOTENCY_KEY_HEADER, key.as_str());
    }
    if let Some((body, content_type)) = &call.body {
        request = request
            .header(CONTENT_TYPE, HeaderValue::from_static(content_type))
            .body(body.clone());
    }
    let response = request.send().await.map_err(AttemptError::from_reqwest)?;
    let status = response.status();
    let retry_after = response
        .headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let transient = response
        .headers()
        .get(TRANSIENT_ERROR_HEADER)
        .is_some_and(|value| value == "true");
    let should_retry = match response.headers().get(SHOULD_RETRY_HEADER) {
        Some(value) if value == "true" => Some(true),
        Some(value) if value == "false" => Some(false),
        _ if transient => Some(true),
        _ => None,
    };
    let key_in_progress = transient
        && call.idempotency_key.is_some()
        && matches!(
            status,
            StatusCode::CONFLICT | StatusCode::UNPROCESSABLE_ENTITY
        );
    let headers = response.headers().clone();
    let body = response.bytes().await.map_err(AttemptError::from_reqwest)?;
    if status.is_success() {
        Ok(Answered { body, headers })
    } else {
        Err(AttemptError::Status {
            status,
            body,
            retry_after,
            should_retry,
            key_in_progress,
        })
    }
}

pub(crate) fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ProviderError> {
    serde_json::from_slice(body).map_err(|e| ProviderError::Protocol {
        reason: format!("{e}: {}", truncate(&String::from_utf8_lossy(body))),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_and_is_capped_without_overflow() {
        let ceilings: Vec<u64> = (0..6).map(|n| backoff_ceiling_ms(100, 2_000, n)).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1_600, 2_000]);
        assert_eq!(backoff_ceiling_ms(100, 2_000, 64), 2_000);
        assert_eq!(backoff_ceiling_ms(u64::MAX, 5, 3), 5);
    }

    #[test]
    fn full_jitter_yields_the_bound_and_stays_under_each_ceiling() {
        let delays: Vec<Duration> = FullJitter::new(100, 1_000, 5, 42).collect();
        assert_eq!(delays.len(), 5);
        for (n, delay) in delays.iter().enumerate() {
            let ceiling = backoff_ceiling_ms(100, 1_000, u32::try_from(n).unwrap());
            assert!(
                delay.as_millis() <= u128::from(ceiling),
                "retry {n}: {delay:?}"
            );
        }
        assert_eq!(FullJitter::new(100, 1_000, 0, 42).count(), 0);
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_range_and_replays_with_its_seed() {
        // Full jitter, not "exponential plus a little": over many draws of
        // the same retry, delays cover [0, ceiling] from near 0 to near the
        // ceiling.
        let first_delays: Vec<u64> = (0..500u64)
            .map(|seed| {
                let mut backoff = FullJitter::new(1_000, 1_000, 1, seed);
                u64::try_from(backoff.next().unwrap().as_millis()).unwrap()
            })
            .collect();
        let min = *first_delays.iter().min().unwrap();
        let max = *first_delays.iter().max().unwrap();
        assert!(min < 50, "min {min}");
        assert!(max > 950, "max {max}");
        let mean = first_delays.iter().sum::<u64>() / 500;
        assert!((400..600).contains(&mean), "mean {mean}");

        let a: Vec<Duration> = FullJitter::new(100, 2_000, 6, 7).collect();
        let b: Vec<Duration> = FullJitter::new(100, 2_000, 6, 7).collect();
        assert_eq!(a, b);
    }

    #[test]
    fn transient_means_connect_429_5xx_never_4xx() {
        let status = |code: u16| AttemptError::Status {
            should_retry: None,
            status: StatusCode::from_u16(code).unwrap(),
            body: Bytes::new(),
            retry_after: None,
            key_in_progress: false,
        };
        for code in [409, 429, 500, 502, 503, 504] {
            assert!(status(code).is_transient(false), "{code}");
        }
        for code in [400, 401, 402, 404, 422] {
            assert!(!status(code).is_transient(true), "{code}");
        }
        assert!(!AttemptError::TimedOut.is_transient(false));
        assert!(AttemptError::TimedOut.is_transient(true));
    }

    fn status_error(code: u16, body: &'static [u8]) -> AttemptError {
        AttemptError::Status {
            should_retry: None,
            status: StatusCode::from_u16(code).unwrap(),
            body: Bytes::from_static(body),
            retry_after: None,
            key_in_progress: false,
        }
    }

    #[test]
    fn only_answers_that_rule_an_effect_out_count_as_not_reached() {
        assert!(AttemptError::TimedOut.may_have_reached());
        for code in [409, 500, 502, 503] {
            assert!(status_error(code, b"").may_have_reached(), "{code}");
        }
        for code in [400, 402, 404, 422, 429] {
            assert!(!status_error(code, b"").may_have_reached(), "{code}");
        }
    }

    #[test]
    fn a_write_refused_after_an_attempt_that_may_have_reached_is_unknown() {
        let refused = |write: bool, earlier_reached: bool| CallError {
            last: status_error(
                402,
                br#"{"error":{"code":"card_declined","message":"declined"}}"#,
            ),
            attempts: 2,
            retry_timeouts: !write,
            write,
            earlier_reached,
        };
        let first = refused(true, false).rejection().unwrap();
        assert_eq!((first.status, first.code.as_str()), (402, "card_declined"));
        assert_eq!(refused(true, true).rejection(), None);
        match refused(true, true).into_provider_error() {
            ProviderError::Unknown { reason } => {
                assert!(
                    reason.contains("earlier attempt may have reached"),
                    "{reason}"
                );
                assert!(reason.contains("card_declined"), "{reason}");
            }
            other => panic!("expected unknown, got {other:?}"),
        }
        // A read has no effect to be unsure of: its 4xx stays what it says.
        assert!(refused(false, true).rejection().is_some());
        // 409 retries ran out: unknown, never a refusal.
        let in_use = CallError {
            last: status_error(409, br#"{"error":{"code":"idempotency_key_in_use"}}"#),
            attempts: 4,
            retry_timeouts: false,
            write: true,
            earlier_reached: true,
        };
        assert!(matches!(
            in_use.into_provider_error(),
            ProviderError::Unknown { reason } if reason.contains("4 attempt")
        ));
    }

    #[test]
    fn the_provider_s_word_on_retrying_never_makes_a_possible_effect_a_refusal() {
        let answered = |code: u16, should_retry: Option<bool>| AttemptError::Status {
            should_retry,
            status: StatusCode::from_u16(code).unwrap(),
            body: Bytes::from_static(br#"{"error":{"type":"api_error"}}"#),
            retry_after: None,
            key_in_progress: false,
        };
        // `Stripe-Should-Retry` decides whether to retry, either way.
        assert!(!answered(500, Some(false)).is_transient(false));
        assert!(answered(400, Some(true)).is_transient(false));
        // A 500 it says not to retry may still have had its effect: unknown, for a write and a
        // read alike, never a refusal.
        for write in [true, false] {
            let error = CallError {
                last: answered(500, Some(false)),
                attempts: 1,
                retry_timeouts: !write,
                write,
                earlier_reached: false,
            };
            assert_eq!(error.rejection(), None);
            assert!(matches!(
                error.into_provider_error(),
                ProviderError::Unknown { .. }
            ));
        }
    }

    #[test]
    fn rejections_carry_the_provider_code_or_the_status() {
        let body = br#"{"error":{"type":"invalid_request_error","code":"refund_exceeds_captured","message":"too much"}}"#;
        let r = parse_rejection(StatusCode::UNPROCESSABLE_ENTITY, body);
        assert_eq!(r.code, "refund_exceeds_captured");
        assert_eq!(r.message, "too much");
        let r = parse_rejection(StatusCode::NOT_FOUND, b"<html>nope</html>");
        assert_eq!(r.code, "http_404");
        assert_eq!(r.message, "<html>nope</html>");
    }

    /// Adyen's 704 (`transient-error: true`): the key's first request still runs, so the write
    /// reached Adyen; retried, and unknown when the retries run out, never a refusal.
    #[test]
    fn a_key_still_in_progress_is_retried_and_never_a_refusal() {
        let in_progress = AttemptError::Status {
            should_retry: Some(true),
            status: StatusCode::UNPROCESSABLE_ENTITY,
            body: Bytes::from_static(
                br#"{"status":422,"errorCode":"704","message":"request already processed or in progress","errorType":"validation"}"#,
            ),
            retry_after: None,
            key_in_progress: true,
        };
        assert!(in_progress.is_transient(false));
        assert!(in_progress.may_have_reached());
        let error = CallError {
            last: in_progress,
            attempts: 3,
            retry_timeouts: false,
            write: true,
            earlier_reached: true,
        };
        assert_eq!(error.rejection(), None);
        assert!(matches!(
            error.into_provider_error(),
            ProviderError::Unknown { .. }
        ));
        // Adyen's other refusals are read with their code.
        let refused = parse_rejection(
            StatusCode::UNPROCESSABLE_ENTITY,
            br#"{"status":422,"errorCode":"130","message":"Reference Missing","errorType":"validation"}"#,
        );
        assert_eq!(
            (refused.code.as_str(), refused.message.as_str()),
            ("130", "Reference Missing")
        );
        let problem = parse_rejection(
            StatusCode::TOO_MANY_REQUESTS,
            br#"{"type":"x","title":"Too many","detail":"too many requests","errorCode":"00_500","status":429}"#,
        );
        assert_eq!(
            (problem.code.as_str(), problem.message.as_str()),
            ("00_500", "too many requests")
        );
    }
}
