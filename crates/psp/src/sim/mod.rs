//! The provider simulator: a Stripe-like provider that fails on demand, over
//! real HTTP. It plays someone else's system, so its state lives in memory
//! and it knows nothing of the ledger.
//!
//! Two ways to run it:
//! - standalone ([`run`], `asiento psp-sim`): provider routes at `/v1/…`,
//!   control and truth routes at `/sim/…`; [`run`] also runs the webhook
//!   dispatcher and stops everything on shutdown;
//! - mounted inside asiento's own server: [`Simulator::mounted_router`]
//!   serves the provider routes at `/sim/v1/…` (base URL `http://host/sim`)
//!   and the control routes at the same `/sim/…` paths as standalone; the
//!   host must call [`Simulator::spawn_webhook_dispatcher`] once, with its
//!   own shutdown signal, for webhooks to leave.
//!
//! Randomness is seeded ([`SimConfig::seed`]) in two independent streams,
//! one for the faults of provider calls and one for webhook faults, so the
//! same seed and the same order of requests replay the same failures even
//! though webhooks are dispatched concurrently with requests.

mod faults;
mod routes;
mod state;
mod webhooks;

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use faults::{Faults, FaultsError, FaultsPatch, FAULT_DELAY_MS_MAX};
pub use state::{
    fee_minor, SimError, CHARGES_MAX, EVENTS_RECORDED_MAX, PM_CARD_DECLINED, PM_CARD_OK,
    PM_CARD_SLOW, PM_CARD_TIMEOUT, PM_REDIRECT,
};

use state::{Outgoing, SimState};

/// Events waiting for the dispatcher; beyond this the provider is
/// "overloaded" and drops them (logged).
pub const WEBHOOK_QUEUE_LEN_MAX: usize = 100_000;

/// How the simulator behaves. [`SimConfig::default`] is for tests; set a
/// real `webhook_secret`.
#[derive(Clone, Debug)]
pub struct SimConfig {
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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
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
        Simulator {
            inner: Arc::new(Inner {
                state: Mutex::new(SimState::new(config.seed, config.fee_bps, tx)),
                outbox: Mutex::new(rx),
                stop,
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

    /// Applies `patch` to the active faults.
    pub fn set_faults(&self, patch: &FaultsPatch) -> Result<Faults, FaultsError> {
        let mut state = self.state();
        state.faults = state.faults.patched(patch)?;
        Ok(state.faults.clone())
    }

    /// Every charge, in creation order.
    pub fn charges(&self) -> Vec<crate::provider::Charge> {
        self.state().charges()
    }

    /// The most recent events ([`EVENTS_RECORDED_MAX`]), oldest first.
    pub fn events(&self) -> Vec<crate::event::WebhookEvent> {
        self.state().events()
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

/// A fresh webhook secret for a run that was given none.
pub fn random_webhook_secret() -> String {
    format!("whsec_{}", uuid::Uuid::new_v4().simple())
}

/// Serves the standalone simulator on `listener` and runs its webhook
/// dispatcher until `shutdown` resolves.
pub async fn run(
    listener: tokio::net::TcpListener,
    sim: Simulator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let dispatcher = sim
        .spawn_webhook_dispatcher(shutdown)
        .map_err(std::io::Error::other)?;
    let served = axum::serve(listener, sim.router())
        .with_graceful_shutdown(sim.stopped())
        .await;
    // The server only stops on shutdown (or a listener error), so tell the
    // dispatcher in the second case too before waiting for it.
    sim.inner.stop.send_replace(true);
    if let Err(error) = dispatcher.await {
        tracing::error!(%error, "webhook dispatcher task failed");
    }
    served
}
