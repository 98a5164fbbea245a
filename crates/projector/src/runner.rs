//! The runner: keeps one projection up to date, as the only active writer among any number of
//! runners (in this process or others) that share the database.
//!
//! A runner loops: take the lease (or wait for it), check the fingerprint, follow the log from
//! the checkpoint (catch-up, then live tail) applying bounded batches, each in one transaction
//! with its checkpoint, while a heartbeat renews the lease beside it. Everything runs inside
//! the `run` future itself (no spawned tasks), so dropping or aborting it behaves like a killed
//! process: the open batch is rolled back and the lease simply stops being renewed.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use asiento_eventstore::{Cursor, Database, EventStore};
use backon::BackoffBuilder;
use futures::StreamExt;

use crate::{registry, Projection, ProjectorError};

/// Events per batch (one transaction) unless configured otherwise.
pub const BATCH_SIZE_MAX_DEFAULT: usize = 500;
/// How long a lease lasts without renewal: the failover time after a crash.
pub const LEASE_MS_DEFAULT: u64 = 10_000;
/// How often the active runner renews its lease (and measures lag).
pub const HEARTBEAT_MS_DEFAULT: u64 = 2_000;
/// How often a standby runner tries to take an expired lease.
pub const IDLE_POLL_MS_DEFAULT: u64 = 1_000;
/// First pause after an error; doubles up to `backoff_ms_max`.
pub const BACKOFF_MS_MIN: u64 = 100;
pub const BACKOFF_MS_MAX_DEFAULT: u64 = 30_000;

/// How a runner behaves. `owner` must be unique among all runners (e.g. host, pid and a random
/// suffix): two runners with one owner name would both believe they hold the lease.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    pub owner: String,
    pub batch_size_max: usize,
    pub lease_ms: u64,
    pub heartbeat_ms: u64,
    pub idle_poll_ms: u64,
    pub backoff_ms_max: u64,
}

impl RunnerConfig {
    /// The defaults above, for the given owner.
    pub fn new(owner: impl Into<String>) -> RunnerConfig {
        RunnerConfig {
            owner: owner.into(),
            batch_size_max: BATCH_SIZE_MAX_DEFAULT,
            lease_ms: LEASE_MS_DEFAULT,
            heartbeat_ms: HEARTBEAT_MS_DEFAULT,
            idle_poll_ms: IDLE_POLL_MS_DEFAULT,
            backoff_ms_max: BACKOFF_MS_MAX_DEFAULT,
        }
    }
}

/// One projection's runner. See the module docs.
pub struct Runner {
    db: Database,
    store: Arc<dyn EventStore>,
    projection: Arc<dyn Projection>,
    config: RunnerConfig,
}

/// How one turn of leading ended without an error.
enum Turn {
    /// Someone else holds the lease.
    Standby,
    /// We held the lease and lost it (or our generation was swapped out): start over now.
    LeaseLost,
}

impl Runner {
    pub fn new(
        db: Database,
        store: Arc<dyn EventStore>,
        projection: Arc<dyn Projection>,
        config: RunnerConfig,
    ) -> Runner {
        Runner {
            db,
            store,
            projection,
            config,
        }
    }

    /// Runs until `shutdown` resolves, then gives the lease up. Errors never end it: they are
    /// logged, and the runner starts over from the registry after a growing pause.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let name = self.projection.name();
        let mut shutdown = pin!(shutdown);
        let mut backoff = self.backoff();
        loop {
            let turn = tokio::select! {
                biased;
                () = &mut shutdown => break,
                turn = self.lead() => turn,
            };
            self.set_owner_metric(false);
            let pause_ms = match turn {
                Ok(Turn::Standby) => {
                    backoff = self.backoff();
                    self.config.idle_poll_ms
                }
                Ok(Turn::LeaseLost) => {
                    tracing::info!(projection = name, owner = %self.config.owner, "projection lease lost");
                    backoff = self.backoff();
                    0
                }
                Err(e) => {
                    let pause = backoff
                        .next()
                        .unwrap_or(Duration::from_millis(self.config.backoff_ms_max));
                    tracing::error!(projection = name, error = %e, pause_ms = pause.as_millis() as u64, "projection runner failed; retrying");
                    pause
                        .as_millis()
                        .try_into()
                        .unwrap_or(self.config.backoff_ms_max)
                }
            };
            if pause_ms > 0 {
                tokio::select! {
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(Duration::from_millis(pause_ms)) => {}
                }
            }
        }
        self.set_owner_metric(false);
        if let Err(e) = registry::release(&self.db, name, &self.config.owner).await {
            tracing::warn!(projection = name, error = %e, "projection lease not released; it expires by itself");
        }
    }

    fn backoff(&self) -> backon::ExponentialBackoff {
        backon::ExponentialBuilder::default()
            .with_min_delay(Duration::from_millis(BACKOFF_MS_MIN))
            .with_max_delay(Duration::from_millis(self.config.backoff_ms_max))
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// One turn: take the lease and follow the log until the lease is lost or something fails.
    async fn lead(&self) -> Result<Turn, ProjectorError> {
        let name = self.projection.name();
        let owner = self.config.owner.as_str();
        registry::install(&self.db, self.projection.as_ref()).await?;
        let Some(registered) =
            registry::acquire(&self.db, name, owner, self.config.lease_ms).await?
        else {
            return Ok(Turn::Standby);
        };
        let code = self.projection.fingerprint();
        if registered.fingerprint != code {
            // Let a runner with matching code (an older deployment still running) carry on.
            registry::release(&self.db, name, owner).await?;
            return Err(ProjectorError::FingerprintChanged {
                name: name.to_owned(),
                stored: registered.fingerprint,
                code: code.to_owned(),
            });
        }
        self.set_owner_metric(true);
        tracing::info!(projection = name, owner, generation = registered.generation, checkpoint = %registered.cursor, "projection lease taken");
        // Tables of a generation swapped out by a rebuild; we no longer write them.
        if let Err(e) = registry::drop_retired(&self.db, self.projection.as_ref()).await {
            tracing::warn!(projection = name, error = %e, "retired generations not dropped yet");
        }
        let generation = registered.generation;
        tokio::select! {
            turn = self.follow(generation, registered.cursor) => turn,
            turn = self.heartbeat(generation, registered.cursor) => turn,
        }
    }

    /// Applies the log from `checkpoint` on, batch by batch, until something stops it.
    async fn follow(
        &self,
        generation: i64,
        mut checkpoint: Cursor,
    ) -> Result<Turn, ProjectorError> {
        let name = self.projection.name();
        let owner = self.config.owner.as_str();
        let mut events = self
            .store
            .subscribe(checkpoint, self.config.batch_size_max.max(1));
        loop {
            let batch = match events.next().await {
                None => return Err(ProjectorError::SubscriptionEnded),
                Some(Err(e)) => return Err(e.into()),
                Some(Ok(batch)) => batch,
            };
            let Some(last) = batch.last().map(|e| e.cursor) else {
                continue;
            };
            let started = Instant::now();
            let mut tx = self.db.begin().await?;
            // The registry guard comes first: its row lock (PostgreSQL; SQLite's transaction holds
            // the write lock anyway) serialises this batch with a rebuild's swap, so a batch never
            // writes into a generation that was swapped out and is about to be dropped. On an
            // error the transaction is dropped, which rolls it back.
            let advanced = registry::advance(
                &mut tx,
                name,
                owner,
                generation,
                checkpoint,
                last,
                self.config.lease_ms,
            )
            .await?;
            if !advanced {
                tx.rollback().await?;
                return Ok(Turn::LeaseLost);
            }
            self.projection.apply(&mut tx, generation, &batch).await?;
            tx.commit().await?;
            checkpoint = last;
            metrics::histogram!("asiento_projection_batch_seconds", "projection" => name)
                .record(started.elapsed().as_secs_f64());
            tracing::debug!(projection = name, events = batch.len(), checkpoint = %checkpoint, "projection batch applied");
        }
    }

    /// Renews the lease every `heartbeat_ms` (concurrently with a running batch, so a slow batch
    /// does not let the lease lapse) and measures lag. Ends only when the lease is gone.
    async fn heartbeat(&self, generation: i64, start: Cursor) -> Result<Turn, ProjectorError> {
        let name = self.projection.name();
        self.record_lag(start).await;
        let period = Duration::from_millis(self.config.heartbeat_ms.max(1));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match registry::renew(
                &self.db,
                name,
                &self.config.owner,
                generation,
                self.config.lease_ms,
            )
            .await
            {
                Ok(Some(checkpoint)) => self.record_lag(checkpoint).await,
                Ok(None) => return Ok(Turn::LeaseLost),
                // Not fatal: a batch's checkpoint update renews the lease too, and it refuses to
                // commit if the lease was lost meanwhile.
                Err(e) => {
                    tracing::warn!(projection = name, error = %e, "projection lease not renewed")
                }
            }
        }
    }

    /// Lag in events (approximate on PostgreSQL, where positions are not dense in commit order)
    /// and in seconds (age of the oldest event not yet applied; 0 when caught up).
    async fn record_lag(&self, checkpoint: Cursor) {
        let name = self.projection.name();
        let measured = async {
            let head = self.store.head().await?;
            let next = self.store.read_all(checkpoint, 1).await?;
            Ok::<_, asiento_eventstore::StoreError>((head, next))
        }
        .await;
        let (events, seconds) = match measured {
            Ok((_, next)) if next.is_empty() => (0, 0.0),
            Ok((head, next)) => {
                let events = (head.position() - checkpoint.position()).max(1);
                let age = chrono::Utc::now() - next[0].recorded_at;
                (events, age.num_milliseconds().max(0) as f64 / 1000.0)
            }
            Err(e) => {
                tracing::debug!(projection = name, error = %e, "projection lag not measured");
                return;
            }
        };
        metrics::gauge!("asiento_projection_lag_events", "projection" => name).set(events as f64);
        metrics::gauge!("asiento_projection_lag_seconds", "projection" => name).set(seconds);
    }

    fn set_owner_metric(&self, active: bool) {
        metrics::gauge!(
            "asiento_projection_owner",
            "projection" => self.projection.name(),
            "owner" => self.config.owner.clone()
        )
        .set(if active { 1.0 } else { 0.0 });
    }
}
