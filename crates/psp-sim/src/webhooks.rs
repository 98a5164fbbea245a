//! The webhook dispatcher: what a real provider's event delivery does, with
//! its faults.
//!
//! Each event is signed at every attempt (a fresh `t`, as Stripe does) and
//! POSTed until a 2xx, with exponential backoff and full jitter, for at most
//! `webhook_attempts_max` attempts; then it is dropped and logged.
//!
//! In the Adyen dialect an event is one notification item, signed when it was
//! made: every item waiting at one moment (up to `BATCH_ITEMS_MAX` items and
//! `BATCH_BYTES_MAX` bytes) leaves in one `NotificationRequest`, unsigned
//! itself, and a batch that fails is sent again as Adyen does: three quick
//! retries (`webhook_backoff_base_ms` × 1, 2, 3), then a queue whose waits
//! double from four times that up to `webhook_backoff_max_ms`, for at most
//! `webhook_attempts_max` attempts.
//! Every delivery carries basic auth when a webhook username is configured.
//! Deliveries run concurrently (bounded), so a receiver that is down for one
//! event does not hold back the others — which also means that, as with a
//! real provider, order is not guaranteed even without the reorder fault.
//!
//! Faults, drawn from the webhook random stream in event order (item by item
//! in the Adyen dialect, before items are batched):
//! - drop: the event is never sent;
//! - duplicate: the event is sent twice (same id, same body);
//! - reorder: events are buffered (up to [`REORDER_WINDOW_LEN`], or until
//!   [`REORDER_FLUSH_MS`] of quiet) and sent shuffled;
//! - delay: every delivery waits `webhook_delay_ms` first.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use backon::Retryable;
use chrono::Utc;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use reqwest::header::CONTENT_TYPE;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

use super::adyen::{batches, BATCH_ITEMS_MAX};
use super::state::Outgoing;
use super::Dialect;
use super::Simulator;
use asiento_psp::client::FullJitter;
use asiento_psp::signature::{sign, SIGNATURE_HEADER};

/// Events held back by the reorder fault before they are shuffled out.
pub const REORDER_WINDOW_LEN: usize = 4;
/// A partly filled reorder window leaves after this much quiet.
pub const REORDER_FLUSH_MS: u64 = 50;
/// Deliveries in flight at once.
pub const DELIVERIES_IN_FLIGHT_MAX: usize = 64;
/// Separates the webhook random stream from the call-fault stream.
const WEBHOOK_SEED_SALT: u64 = 0x5745_4248_4f4f_4b53; // "WEBHOOKS"

pub(super) struct Dispatcher {
    sim: Simulator,
    url: String,
    secret: Arc<str>,
    /// The signature's header: `Psp-Signature`, or `Stripe-Signature` in the Stripe dialect;
    /// none in the Adyen dialect, whose items carry their own signatures.
    header: Option<&'static str>,
    /// Whether events are Adyen notification items, sent in batches.
    batched: bool,
    /// Basic auth: the username and password.
    basic: Option<(Arc<str>, Option<Arc<str>>)>,
    http: reqwest::Client,
    rx: mpsc::Receiver<Outgoing>,
    rng: StdRng,
    attempts_max: u32,
    backoff_base_ms: u64,
    backoff_max_ms: u64,
}

#[derive(Debug)]
enum DeliveryError {
    Http(reqwest::Error),
    Status(reqwest::StatusCode),
}

impl std::fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeliveryError::Http(e) => write!(f, "{e}"),
            DeliveryError::Status(s) => write!(f, "receiver answered {s}"),
        }
    }
}

impl Dispatcher {
    /// `sim` is kept to read the live fault set.
    pub(super) fn new(
        sim: Simulator,
        url: String,
        rx: mpsc::Receiver<Outgoing>,
    ) -> Result<Dispatcher, reqwest::Error> {
        let config = sim.config().clone();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_millis(config.webhook_timeout_ms))
            .redirect(reqwest::redirect::Policy::none())
            .user_agent("asiento-psp-sim/webhooks")
            .build()?;
        Ok(Dispatcher {
            sim,
            url,
            secret: Arc::from(config.webhook_secret.as_str()),
            header: match config.dialect {
                Dialect::Sim => Some(SIGNATURE_HEADER),
                Dialect::Stripe => Some(asiento_psp::stripe::SIGNATURE_HEADER),
                Dialect::Adyen => None,
            },
            batched: config.dialect == Dialect::Adyen,
            basic: config.webhook_username.as_deref().map(|user| {
                (
                    Arc::from(user),
                    config.webhook_password.as_deref().map(Arc::from),
                )
            }),
            http,
            rx,
            rng: StdRng::seed_from_u64(config.seed ^ WEBHOOK_SEED_SALT),
            attempts_max: config.webhook_attempts_max.max(1),
            backoff_base_ms: config.webhook_backoff_base_ms,
            backoff_max_ms: config.webhook_backoff_max_ms,
        })
    }

    pub(super) async fn run(mut self, stopped: impl Future<Output = ()> + Send) {
        tokio::pin!(stopped);
        let permits = Arc::new(Semaphore::new(DELIVERIES_IN_FLIGHT_MAX));
        let mut deliveries = JoinSet::new();
        let mut window: Vec<Outgoing> = Vec::new();
        loop {
            // Reap finished deliveries so the set stays as small as the work.
            while deliveries.try_join_next().is_some() {}
            let quiet = tokio::time::sleep(Duration::from_millis(REORDER_FLUSH_MS));
            tokio::select! {
                biased;
                () = &mut stopped => break,
                () = quiet, if !window.is_empty() => {
                    self.flush(&mut window, &mut deliveries, &permits);
                }
                next = self.rx.recv() => {
                    let Some(event) = next else { break };
                    let faults = self.sim.faults();
                    self.admit(event, &faults, &mut window);
                    if self.batched {
                        // Every item ready now leaves in the same batch.
                        while window.len() < BATCH_ITEMS_MAX {
                            let Ok(event) = self.rx.try_recv() else { break };
                            self.admit(event, &faults, &mut window);
                        }
                    }
                    if !faults.webhook_reorder || window.len() >= REORDER_WINDOW_LEN {
                        self.flush(&mut window, &mut deliveries, &permits);
                    }
                }
            }
        }
        // Deliveries in flight are abandoned, as by a provider that stops.
        deliveries.shutdown().await;
    }

    /// Draws the drop and duplicate faults of one event and puts what is left in `window`.
    fn admit(&mut self, event: Outgoing, faults: &super::Faults, window: &mut Vec<Outgoing>) {
        let drop_draw = self.rng.random::<f64>();
        let duplicate_draw = self.rng.random::<f64>();
        if drop_draw < faults.webhook_drop_rate {
            tracing::info!(event_id = %event.event_id, "webhook dropped by fault");
            return;
        }
        let copies = if duplicate_draw < faults.webhook_duplicate_rate {
            2
        } else {
            1
        };
        for _ in 0..copies {
            window.push(event.clone());
        }
    }

    /// What leaves: each event, or in the Adyen dialect batches of items.
    fn deliverables(&self, window: &mut Vec<Outgoing>) -> Vec<Outgoing> {
        if !self.batched {
            return std::mem::take(window);
        }
        batches(&std::mem::take(window))
    }

    fn flush(
        &mut self,
        window: &mut Vec<Outgoing>,
        deliveries: &mut JoinSet<()>,
        permits: &Arc<Semaphore>,
    ) {
        let faults = self.sim.faults();
        if faults.webhook_reorder {
            window.shuffle(&mut self.rng);
        }
        for event in self.deliverables(window) {
            let backoff = if self.batched {
                Schedule::Adyen(AdyenRetries::new(
                    self.backoff_base_ms,
                    self.backoff_max_ms,
                    self.attempts_max - 1,
                ))
            } else {
                Schedule::Jitter(Box::new(FullJitter::new(
                    self.backoff_base_ms,
                    self.backoff_max_ms,
                    self.attempts_max - 1,
                    self.rng.random(),
                )))
            };
            let delivery = Delivery {
                http: self.http.clone(),
                url: self.url.clone(),
                secret: Arc::clone(&self.secret),
                header: self.header,
                basic: self.basic.clone(),
                delay_ms: faults.webhook_delay_ms,
                backoff,
                event,
            };
            let permits = Arc::clone(permits);
            deliveries.spawn(async move {
                // The semaphore is never closed, so this only waits.
                let Ok(_permit) = permits.acquire_owned().await else {
                    return;
                };
                delivery.run().await;
            });
        }
    }
}

/// The waits between the attempts of one delivery.
enum Schedule {
    Jitter(Box<FullJitter>),
    Adyen(AdyenRetries),
}

impl Iterator for Schedule {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        match self {
            Schedule::Jitter(jitter) => jitter.next(),
            Schedule::Adyen(retries) => retries.next(),
        }
    }
}

/// Adyen's retries (its 9 s, 18 s, 27 s, then a queue at 2 min, 5 min, … 8 h), scaled: three
/// quick ones at `base_ms` × 1, 2, 3, then waits doubling from `base_ms` × 4 up to `max_ms`.
pub(crate) struct AdyenRetries {
    base_ms: u64,
    max_ms: u64,
    retries_left: u32,
    retry: u32,
}

/// How many of Adyen's retries are quick.
pub(crate) const QUICK_RETRIES: u32 = 3;

impl AdyenRetries {
    pub(crate) fn new(base_ms: u64, max_ms: u64, retries: u32) -> AdyenRetries {
        AdyenRetries {
            base_ms,
            max_ms,
            retries_left: retries,
            retry: 0,
        }
    }
}

impl Iterator for AdyenRetries {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.retries_left == 0 {
            return None;
        }
        self.retries_left -= 1;
        self.retry = self.retry.saturating_add(1);
        let wait_ms = if self.retry <= QUICK_RETRIES {
            self.base_ms.saturating_mul(u64::from(self.retry))
        } else {
            let doublings = (self.retry - QUICK_RETRIES - 1).min(32);
            self.base_ms
                .saturating_mul(4)
                .saturating_mul(1_u64 << doublings)
        };
        Some(Duration::from_millis(
            wait_ms.min(self.max_ms.max(self.base_ms)),
        ))
    }
}

struct Delivery {
    http: reqwest::Client,
    url: String,
    secret: Arc<str>,
    header: Option<&'static str>,
    basic: Option<(Arc<str>, Option<Arc<str>>)>,
    delay_ms: u64,
    backoff: Schedule,
    event: Outgoing,
}

impl Delivery {
    async fn run(self) {
        if self.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
        }
        let attempt = || async {
            let mut request = self
                .http
                .post(&self.url)
                .header(CONTENT_TYPE, "application/json")
                .body(self.event.body.clone());
            if let Some(header) = self.header {
                let signature = sign(&self.secret, Utc::now().timestamp(), &self.event.body);
                request = request.header(header, signature);
            }
            if let Some((user, password)) = &self.basic {
                request = request.basic_auth(user, password.as_deref());
            }
            let response = request.send().await.map_err(DeliveryError::Http)?;
            if response.status().is_success() {
                Ok(())
            } else {
                Err(DeliveryError::Status(response.status()))
            }
        };
        let event_id = &self.event.event_id;
        let result = attempt
            .retry(self.backoff)
            .notify(|error, delay| {
                tracing::debug!(%event_id, %error, delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX), "webhook delivery failed; retrying");
            })
            .await;
        match result {
            Ok(()) => tracing::debug!(%event_id, "webhook delivered"),
            Err(error) => {
                tracing::warn!(%event_id, %error, "webhook given up after its last attempt")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adyen_retries_three_times_quickly_then_backs_off_up_to_the_ceiling() {
        let waits: Vec<u64> = AdyenRetries::new(10, 200, 8)
            .map(|wait| u64::try_from(wait.as_millis()).unwrap())
            .collect();
        assert_eq!(waits, [10, 20, 30, 40, 80, 160, 200, 200]);
        assert_eq!(AdyenRetries::new(10, 200, 0).count(), 0);
    }
}
