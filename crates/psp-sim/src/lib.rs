//! The provider simulator: a provider that fails on demand, over real HTTP,
//! speaking its own protocol or Stripe's or Adyen's ([`Dialect`]). It plays
//! someone else's system, so its state lives in memory and it knows nothing
//! of the ledger.
//!
//! Two ways to run it:
//! - standalone ([`run`], `asiento psp-sim`): provider routes at `/v1/…`
//!   (`/v71/…` in the Adyen dialect), control and truth routes at `/sim/…`;
//!   [`run`] also runs the webhook dispatcher and stops everything on
//!   shutdown;
//! - mounted inside asiento's own server: [`Simulator::mounted_router`]
//!   serves the provider routes of the simulator's own protocol at
//!   `/sim/v1/…` (base URL `http://host/sim`; the Stripe and Adyen dialects
//!   are served standalone only) and the control routes at the same `/sim/…`
//!   paths as standalone; the
//!   host must call [`Simulator::spawn_webhook_dispatcher`] once, with its
//!   own shutdown signal, for webhooks to leave.
//!
//! While the `unreachable_ms` fault runs, [`run`] closes the listener, so
//! that connections are refused as by a provider that is down, and opens it
//! again on the same address afterwards; the control routes share that
//! listener and are unreachable for the period too (it ends by itself).
//! Mounted, the provider routes answer 503 `provider_unreachable` without
//! acting instead, and the control routes stay up.
//!
//! Randomness is seeded ([`SimConfig::seed`]) in two independent streams,
//! one for the faults of provider calls and one for webhook faults, so the
//! same seed and the same order of requests replay the same failures even
//! though webhooks are dispatched concurrently with requests.

// `json!` literals of Stripe's objects (every field of its fixtures) nest past the default.
#![recursion_limit = "256"]

mod adyen;
mod faults;
mod fee;
mod routes;
mod state;
mod stripe;
mod webhooks;

use std::future::{Future, IntoFuture};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use faults::{Faults, FaultsError, FaultsPatch, FAULT_DELAY_MS_MAX};
pub use fee::provider_fee_minor;
pub use state::{
    SimError, CHARGES_MAX, EVENTS_RECORDED_MAX, FAILED_ON_DEMAND_REASON, PM_CARD_DECLINED,
    PM_CARD_OK, PM_CARD_SLOW, PM_CARD_TIMEOUT, PM_REDIRECT, REVERSAL_REASON,
};

use state::{Outgoing, Scheduled, SimState};

/// How long [`run`] keeps trying to bind its address again after an
/// unreachable period (another process may have taken the port).
pub const REBIND_TRIES_MAX: u32 = 100;
/// The wait between two of those tries.
pub const REBIND_PAUSE_MS: u64 = 20;

/// Events waiting for the dispatcher; beyond this the provider is
/// "overloaded" and drops them (logged).
pub const WEBHOOK_QUEUE_LEN_MAX: usize = 100_000;

/// The provider the simulator plays: its own protocol (`sim`, JSON at `/v1/charges`),
/// Stripe's (`stripe`, form-encoded PaymentIntents and refunds, Stripe's objects, errors and
/// `Stripe-Signature` events), or Adyen's (`adyen`, Checkout v71 at `/v71/…`: `X-API-Key`,
/// payments answered at once from Adyen's test triggers, every modification `received` and
/// decided by notification, batches of standard notifications signed item by item with an HMAC
/// key and sent with basic auth; no lookup routes). Faults, truth and control routes are the
/// same in all three; a payment's id in the truth routes is its pspReference in the Adyen
/// dialect.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Dialect {
    #[default]
    Sim,
    Stripe,
    Adyen,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Sim => "sim",
            Dialect::Stripe => "stripe",
            Dialect::Adyen => "adyen",
        }
    }
}

impl std::str::FromStr for Dialect {
    type Err = String;

    fn from_str(text: &str) -> Result<Dialect, String> {
        match text {
            "sim" => Ok(Dialect::Sim),
            "stripe" => Ok(Dialect::Stripe),
            "adyen" => Ok(Dialect::Adyen),
            other => Err(format!(
                "unknown dialect {other:?}: expected sim, stripe or adyen"
            )),
        }
    }
}

/// How the simulator behaves. [`SimConfig::default`] is for tests; set a
/// real `webhook_secret`.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The wire format it speaks.
    pub dialect: Dialect,
    /// Where events are POSTed; `None`: events are only recorded
    /// (`GET /sim/events`).
    pub webhook_url: Option<String>,
    /// The HMAC secret of the `Psp-Signature` header.
    pub webhook_secret: String,
    /// Seeds every fault draw.
    pub seed: u64,
    /// How long `pm_card_slow` takes to answer.
    pub slow_ms: u64,
    /// How long a "timeout" (`pm_card_timeout`, `timeout_rate`) holds its
    /// answer: longer than any client waits. Cut short on shutdown.
    pub hang_ms: u64,
    /// The provider's own processing fee, reported in the settlement report.
    pub fee_bps: u32,
    /// The simulator's public base URL for redirect links; `None`: taken
    /// from each request's `Host` header.
    pub public_url: Option<String>,
    /// Delivery attempts per event before it is dropped (and logged).
    pub webhook_attempts_max: u32,
    /// Ceiling of the first redelivery delay; doubles per attempt.
    pub webhook_backoff_base_ms: u64,
    pub webhook_backoff_max_ms: u64,
    /// Time allowed for one delivery attempt.
    pub webhook_timeout_ms: u64,
    /// The Adyen dialect's HMAC key, hex as Adyen's Customer Area shows it: every notification
    /// item carries `additionalData.hmacSignature` under it. Empty or not hex: items go
    /// unsigned (and a warning says so).
    pub webhook_hmac_key: String,
    /// The basic auth every delivery carries (Adyen's webhook username and password); `None`:
    /// no `Authorization` header.
    pub webhook_username: Option<String>,
    pub webhook_password: Option<String>,
    /// How long after it is asked the Adyen dialect decides a capture, refund or cancel (and
    /// authorises a `PENDING` payment, and takes each step of a triggered dispute).
    pub modification_delay_ms: u64,
    /// The Adyen dialect's report user: its reports are served only to these basic-auth
    /// credentials (`None`: to no one, every download is a 401).
    pub report_username: Option<String>,
    pub report_password: Option<String>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            dialect: Dialect::Sim,
            webhook_url: None,
            webhook_secret: String::new(),
            seed: 0,
            slow_ms: 2_000,
            hang_ms: 30_000,
            fee_bps: 0,
            public_url: None,
            webhook_attempts_max: 12,
            webhook_backoff_base_ms: 250,
            webhook_backoff_max_ms: 30_000,
            webhook_timeout_ms: 5_000,
            webhook_hmac_key: String::new(),
            webhook_username: None,
            webhook_password: None,
            modification_delay_ms: 300,
            report_username: None,
            report_password: None,
        }
    }
}

/// Why the webhook dispatcher could not start.
#[derive(Debug, thiserror::Error)]
pub enum DispatcherError {
    #[error("the webhook dispatcher of this simulator is already running")]
    AlreadyRunning,
    #[error("could not build the webhook HTTP client: {0}")]
    Http(#[from] reqwest::Error),
}

struct Inner {
    config: SimConfig,
    state: Mutex<SimState>,
    /// Taken by the one dispatcher.
    outbox: Mutex<Option<mpsc::Receiver<Outgoing>>>,
    /// Flipped once on shutdown: releases hanging answers and stops the
    /// dispatcher.
    stop: watch::Sender<bool>,
    /// The end of the current unreachable period, for [`run`]'s listener.
    unreachable: watch::Sender<Option<tokio::time::Instant>>,
}

/// A simulated provider. Cheap to clone; clones share one provider.
#[derive(Clone)]
pub struct Simulator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Simulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Simulator")
            .field("seed", &self.inner.config.seed)
            .field("webhook_url", &self.inner.config.webhook_url)
            .finish_non_exhaustive()
    }
}

impl Simulator {
    /// Starts no task: see [`Simulator::spawn_webhook_dispatcher`].
    pub fn new(config: SimConfig) -> Simulator {
        let (tx, rx) = match config.webhook_url {
            Some(_) => {
                let (tx, rx) = mpsc::channel(WEBHOOK_QUEUE_LEN_MAX);
                (Some(tx), Some(rx))
            }
            None => (None, None),
        };
        let (stop, _) = watch::channel(false);
        let (unreachable, _) = watch::channel(None);
        let mut state = SimState::new(config.seed, config.fee_bps, config.dialect, tx);
        if config.dialect == Dialect::Adyen {
            state.set_modification_delay(config.modification_delay_ms);
            let key = asiento_psp::adyen::HmacKey::from_hex(&config.webhook_hmac_key).ok();
            if key.is_none() {
                tracing::warn!("no usable webhook HMAC key: Adyen notification items go unsigned");
            }
            state.adyen.set_hmac_key(key);
        }
        Simulator {
            inner: Arc::new(Inner {
                state: Mutex::new(state),
                outbox: Mutex::new(rx),
                stop,
                unreachable,
                config,
            }),
        }
    }

    pub fn config(&self) -> &SimConfig {
        &self.inner.config
    }

    /// A poisoned lock only means another request panicked mid-change;
    /// every change is checked before it is applied, so the state is whole.
    fn state(&self) -> MutexGuard<'_, SimState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The active faults.
    pub fn faults(&self) -> Faults {
        self.state().faults.clone()
    }

    /// Applies `patch` to the active faults; an `unreachable_ms` above 0
    /// starts an unreachable period now.
    pub fn set_faults(&self, patch: &FaultsPatch) -> Result<Faults, FaultsError> {
        let mut state = self.state();
        state.faults = state.faults.patched(patch)?;
        if let Some(ms) = patch.unreachable_ms.filter(|ms| *ms > 0) {
            let until = tokio::time::Instant::now() + Duration::from_millis(ms);
            state.unreachable_until = Some(until.into_std());
            self.inner.unreachable.send_replace(Some(until));
        }
        Ok(state.faults.clone())
    }

    /// Clears every fault, an unreachable period included.
    pub fn reset_faults(&self) -> Faults {
        let mut state = self.state();
        state.faults = Faults::default();
        state.unreachable_until = None;
        self.inner.unreachable.send_replace(None);
        state.faults.clone()
    }

    /// Every capture, refund and cancel, in request order.
    pub fn operations(&self) -> Vec<asiento_psp::provider::Operation> {
        self.state().operations()
    }

    /// Starts the timers of later changes (asynchronous decisions,
    /// reversals); each may queue more, started in turn.
    pub(crate) fn spawn_scheduled(&self, items: Vec<Scheduled>) {
        for item in items {
            let sim = self.clone();
            tokio::spawn(async move {
                sim.hold(item.after_ms).await;
                if *sim.inner.stop.borrow() {
                    return;
                }
                let next = {
                    let mut state = sim.state();
                    if let Err(error) = state.run_scheduled(&item, chrono::Utc::now()) {
                        tracing::warn!(operation = %item.operation_id, %error, "scheduled change not applied");
                    }
                    state.take_scheduled()
                };
                sim.spawn_scheduled(next);
            });
        }
    }

    /// Every charge, in creation order.
    pub fn charges(&self) -> Vec<asiento_psp::provider::Charge> {
        self.state().charges()
    }

    /// The most recent events ([`EVENTS_RECORDED_MAX`]), oldest first.
    pub fn events(&self) -> Vec<asiento_psp::event::WebhookEvent> {
        self.state().events()
    }

    /// The windows settlement reports were asked for, oldest first (the latest
    /// [`EVENTS_RECORDED_MAX`]).
    pub fn report_windows(&self) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
        self.state().report_windows()
    }

    /// Standalone routes: `/v1/…` and `/sim/…`.
    pub fn router(&self) -> axum::Router {
        routes::standalone(self.clone())
    }

    /// Routes for mounting inside another server: `/sim/v1/…` and `/sim/…`.
    /// Merge it into the host's router after the host's own `with_state`.
    pub fn mounted_router(&self) -> axum::Router {
        routes::mounted(self.clone())
    }

    /// Starts delivering webhooks (when a `webhook_url` is set; otherwise
    /// the task only waits for shutdown). When `shutdown` resolves, hanging
    /// answers are released and the dispatcher stops, abandoning deliveries
    /// in flight, as a provider that goes away would. Only one dispatcher
    /// may run per simulator.
    pub fn spawn_webhook_dispatcher(
        &self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<JoinHandle<()>, DispatcherError> {
        let taken = self
            .inner
            .outbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let dispatcher = match (&self.inner.config.webhook_url, taken) {
            (Some(url), Some(rx)) => {
                Some(webhooks::Dispatcher::new(self.clone(), url.clone(), rx)?)
            }
            (Some(_), None) => return Err(DispatcherError::AlreadyRunning),
            (None, _) => None,
        };
        let sim = self.clone();
        Ok(tokio::spawn(async move {
            let stop = sim.inner.stop.clone();
            let stopper = tokio::spawn(async move {
                shutdown.await;
                stop.send_replace(true);
            });
            if let Some(dispatcher) = dispatcher {
                dispatcher.run(sim.stopped()).await;
            } else {
                sim.stopped().await;
            }
            stopper.abort();
        }))
    }

    /// Resolves once the simulator has been told to stop.
    pub(crate) fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.inner.stop.subscribe();
        async move {
            // An error means the sender is gone, i.e. the simulator too.
            let _ = rx.wait_for(|stopped| *stopped).await;
        }
    }

    /// Waits `ms`, or less if the simulator stops.
    pub(crate) async fn hold(&self, ms: u64) {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
            _ = self.stopped() => {}
        }
    }
}

/// A seed for a run that was given none (print it, so the run can be
/// replayed).
pub fn random_seed() -> u64 {
    rand::random()
}

/// A fresh HMAC key for an Adyen run that was given none: 32 random bytes, 64 hex digits.
pub fn random_hmac_key() -> String {
    hex::encode_upper(rand::random::<[u8; 32]>())
}

/// A fresh webhook secret for a run that was given none.
pub fn random_webhook_secret() -> String {
    format!("whsec_{}", uuid::Uuid::new_v4().simple())
}

/// Serves the standalone simulator on `listener` and runs its webhook
/// dispatcher until `shutdown` resolves. During an unreachable period the
/// listener is closed (connections are refused; idle connections are
/// closed, answers in progress finish) and bound again on the same address
/// when the period ends.
pub async fn run(
    listener: tokio::net::TcpListener,
    sim: Simulator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let dispatcher = sim
        .spawn_webhook_dispatcher(shutdown)
        .map_err(std::io::Error::other)?;
    let served = serve_until_stopped(listener, &sim).await;
    // The server only stops on shutdown (or a listener error), so tell the
    // dispatcher in the second case too before waiting for it.
    sim.inner.stop.send_replace(true);
    if let Err(error) = dispatcher.await {
        tracing::error!(%error, "webhook dispatcher task failed");
    }
    served
}

/// Why one listener's serving ended.
enum Ended {
    Stopped,
    Unreachable(tokio::time::Instant),
}

async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    sim: &Simulator,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let mut listener = Some(listener);
    let mut servers: Vec<JoinHandle<std::io::Result<()>>> = Vec::new();
    let result = loop {
        let current = match listener.take() {
            Some(l) => l,
            None => match rebind(addr, sim).await {
                Ok(Some(l)) => l,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            },
        };
        let (ended_tx, ended_rx) = tokio::sync::oneshot::channel::<Ended>();
        let signal = {
            let sim = sim.clone();
            async move {
                let ended = ended_of(&sim).await;
                let _ = ended_tx.send(ended);
            }
        };
        // Each listener's server is its own task: closing it drops the
        // listener at once, while its connections finish in the background.
        servers.push(tokio::spawn(
            axum::serve(current, sim.router())
                .with_graceful_shutdown(signal)
                .into_future(),
        ));
        match ended_rx.await {
            Ok(Ended::Unreachable(until)) => {
                tracing::info!(%addr, "provider unreachable: listener closed");
                tokio::select! {
                    _ = tokio::time::sleep_until(until) => {}
                    _ = sim.stopped() => break Ok(()),
                }
            }
            Ok(Ended::Stopped) => break Ok(()),
            // The server ended by itself (a listener error).
            Err(_) => break Ok(()),
        }
    };
    for server in servers {
        match server.await {
            Ok(Err(error)) => return Err(error),
            Err(error) => tracing::error!(%error, "simulator server task failed"),
            Ok(Ok(())) => {}
        }
    }
    result
}

/// Resolves on shutdown, or when an unreachable period starts.
async fn ended_of(sim: &Simulator) -> Ended {
    let mut unreachable = sim.inner.unreachable.subscribe();
    let stopped = sim.stopped();
    tokio::pin!(stopped);
    loop {
        if let Some(until) = *unreachable.borrow_and_update() {
            if until > tokio::time::Instant::now() {
                return Ended::Unreachable(until);
            }
        }
        tokio::select! {
            () = &mut stopped => return Ended::Stopped,
            changed = unreachable.changed() => {
                if changed.is_err() {
                    return Ended::Stopped;
                }
            }
        }
    }
}

/// Binds `addr` again after an unreachable period; `None` on shutdown.
async fn rebind(
    addr: std::net::SocketAddr,
    sim: &Simulator,
) -> std::io::Result<Option<tokio::net::TcpListener>> {
    let mut tries = 0;
    loop {
        if *sim.inner.stop.borrow() {
            return Ok(None);
        }
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "provider reachable again: listener open");
                return Ok(Some(listener));
            }
            Err(error) if tries < REBIND_TRIES_MAX => {
                tries += 1;
                tracing::debug!(%addr, %error, "rebinding the simulator's address; trying again");
                sim.hold(REBIND_PAUSE_MS).await;
            }
            Err(error) => return Err(error),
        }
    }
}
