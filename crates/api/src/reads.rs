//! Where a query reads: the primary, or a standby that streams its WAL (`serve
//! --read-database-url`).
//!
//! A standby is a consistent prefix of the primary: the log, the read models and their
//! checkpoints replicate together, in commit order. So a read that names a `min_position` is
//! answered by a standby once the standby's checkpoint of the read model it reads covers that
//! position; a standby that does not get there within its wait (paused, lagging, unreachable)
//! hands the read to the primary, which waits as it always does. A read without a position is as
//! fresh as its standby, except that a lookup by id the standby does not know is asked of the
//! primary (a client that has just created a payment must not get a 404), and a read that fails on
//! a standby is asked of the primary too. Writes, projectors and workers never come here: they
//! hold the primary's `Database` itself.
//!
//! `/metrics` shows each standby's lag in positions and seconds ([`Reads::watch_lag`]) and where
//! reads went (`asiento_standby_reads_total`).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use asiento_eventstore::{Database, EventStore};
use asiento_projector::WaitError;

/// How long a read with `min_position` waits for a standby before it asks the primary, unless
/// `serve --read-standby-wait` says otherwise.
pub const STANDBY_WAIT_DEFAULT: Duration = Duration::from_secs(1);

/// How often a read waiting for a standby's log looks again.
const LOG_POLL_MS: u64 = 20;

/// What a read needs a standby to have reached before it may answer a `min_position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// The read model of this projection, up to the position (its checkpoint covers it).
    Projection(&'static str),
    /// Only the log, up to the position (a balance is its snapshot plus the log after it).
    Log,
}

/// An error a read gives. One the client caused (a cursor no page gave out, a limit out of
/// range) is the answer wherever it is read; any other, on a standby, sends the read to the
/// primary.
pub trait ReadFailure: std::fmt::Display {
    fn clients_fault(&self) -> bool;
}

impl ReadFailure for asiento_payments_view::ViewError {
    fn clients_fault(&self) -> bool {
        use asiento_payments_view::ViewError;
        matches!(
            self,
            ViewError::InvalidCursor
                | ViewError::LimitOutOfRange { .. }
                | ViewError::TooManyMetadataFilters { .. }
        )
    }
}

impl ReadFailure for asiento_transfer_list::ListError {
    fn clients_fault(&self) -> bool {
        use asiento_transfer_list::ListError;
        matches!(
            self,
            ListError::InvalidCursor | ListError::LimitOutOfRange { .. }
        )
    }
}

/// An `UnknownPosition` from a standby is the standby's lag, not the client's fault: the primary
/// knew the position before the read began.
impl ReadFailure for asiento_balances::BalanceError {
    fn clients_fault(&self) -> bool {
        matches!(self, asiento_balances::BalanceError::InvalidCursor)
    }
}

impl ReadFailure for asiento_merchant_events::FeedError {
    fn clients_fault(&self) -> bool {
        matches!(self, asiento_merchant_events::FeedError::InvalidCursor)
    }
}

/// A database a query may read, with its event log.
#[derive(Clone)]
pub struct ReadSide {
    pub database: Database,
    pub store: Arc<dyn EventStore>,
    /// The standby's name (its host and port), or `None` for the primary.
    standby: Option<Arc<str>>,
}

impl ReadSide {
    /// The primary: where every write goes.
    pub fn primary(database: Database, store: Arc<dyn EventStore>) -> ReadSide {
        ReadSide {
            database,
            store,
            standby: None,
        }
    }

    /// A standby of the primary, named by its host and port for `/metrics` and the logs.
    pub fn standby(database: Database) -> ReadSide {
        let name = match &database {
            Database::Postgres(pool) => {
                let options = pool.connect_options();
                format!("{}:{}", options.get_host(), options.get_port())
            }
            Database::Sqlite(_) => "sqlite".to_owned(),
        };
        ReadSide {
            store: database.event_store(),
            database,
            standby: Some(name.into()),
        }
    }

    /// The standby's name, `None` on the primary.
    pub fn standby_name(&self) -> Option<&str> {
        self.standby.as_deref()
    }
}

/// The primary and the standbys, taken in turn: built once per process by `serve`.
pub struct Reads {
    primary: ReadSide,
    standbys: Vec<ReadSide>,
    next: AtomicUsize,
    standby_wait_ms: u64,
}

impl std::fmt::Debug for Reads {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .standbys
            .iter()
            .filter_map(ReadSide::standby_name)
            .collect();
        formatter
            .debug_struct("Reads")
            .field("standbys", &names)
            .field("standby_wait_ms", &self.standby_wait_ms)
            .finish()
    }
}

/// Why a read meant for a standby went to the primary, or that it did not
/// (`asiento_standby_reads_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// The standby answered.
    Served,
    /// The standby's read model did not reach `min_position` within the wait.
    Lagging,
    /// The standby does not have the object looked up.
    Missing,
    /// The standby failed (unreachable, recovering, an error).
    Failed,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::Lagging => "lagging",
            Outcome::Missing => "missing",
            Outcome::Failed => "failed",
        }
    }
}

impl Reads {
    /// Every read on the primary (no standby configured).
    pub fn primary_only(primary: ReadSide) -> Reads {
        Reads::new(primary, Vec::new(), STANDBY_WAIT_DEFAULT)
    }

    pub fn new(primary: ReadSide, standbys: Vec<ReadSide>, standby_wait: Duration) -> Reads {
        assert!(
            primary.standby.is_none() && standbys.iter().all(|side| side.standby.is_some()),
            "the primary and the standbys are told apart by their names"
        );
        Reads {
            primary,
            standbys,
            next: AtomicUsize::new(0),
            standby_wait_ms: u64::try_from(standby_wait.as_millis()).unwrap_or(u64::MAX),
        }
    }

    /// Reads `read` from a standby when one has what it `needs` at `min_position`, if given.
    /// Otherwise, or when the standby's answer is an error the client did not cause, from the
    /// primary.
    pub async fn read<T, E, F, Fut>(
        &self,
        needs: Needs,
        min_position: Option<i64>,
        read: F,
    ) -> Result<T, E>
    where
        F: Fn(ReadSide) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: ReadFailure,
    {
        self.answer(needs, min_position, read, |_| true).await
    }

    /// [`Reads::read`] of one object by id: an object the standby does not have (yet) is looked up
    /// on the primary.
    pub async fn find<T, E, F, Fut>(
        &self,
        needs: Needs,
        min_position: Option<i64>,
        find: F,
    ) -> Result<Option<T>, E>
    where
        F: Fn(ReadSide) -> Fut,
        Fut: Future<Output = Result<Option<T>, E>>,
        E: ReadFailure,
    {
        self.answer(needs, min_position, find, Option::is_some)
            .await
    }

    /// `read` on a standby that has what it `needs`, kept when the standby's answer is `found`
    /// (or an error the client caused); else, or without such a standby, `read` on the primary.
    async fn answer<T, E, F, Fut>(
        &self,
        needs: Needs,
        min_position: Option<i64>,
        read: F,
        found: impl Fn(&T) -> bool,
    ) -> Result<T, E>
    where
        F: Fn(ReadSide) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: ReadFailure,
    {
        let Some(standby) = self.standby_for(needs, min_position).await else {
            return read(self.primary.clone()).await;
        };
        let outcome = match read(standby.clone()).await {
            Ok(answer) if found(&answer) => {
                count(&standby, Outcome::Served);
                return Ok(answer);
            }
            Err(error) if error.clients_fault() => {
                count(&standby, Outcome::Served);
                return Err(error);
            }
            Ok(_) => Outcome::Missing,
            Err(error) => {
                tracing::warn!(standby = standby.standby_name(), %error, "a read failed on a standby: asking the primary");
                Outcome::Failed
            }
        };
        count(&standby, outcome);
        read(self.primary.clone()).await
    }

    /// The standby to read from, if one has what the read `needs` at `min_position` within the
    /// wait.
    async fn standby_for(&self, needs: Needs, min_position: Option<i64>) -> Option<ReadSide> {
        let standby = self.next_standby()?;
        let Some(position) = min_position.filter(|position| *position > 0) else {
            return Some(standby);
        };
        let waited = match needs {
            Needs::Projection(name) => asiento_projector::wait_for_position(
                &standby.database,
                standby.store.as_ref(),
                name,
                position,
                self.standby_wait_ms,
            )
            .await
            .map(drop),
            Needs::Log => self.wait_for_log(&standby, position).await,
        };
        match waited {
            Ok(_) => Some(standby),
            Err(WaitError::Lagging { .. }) => {
                count(&standby, Outcome::Lagging);
                None
            }
            Err(error) => {
                tracing::warn!(standby = standby.standby_name(), %error, "a standby's checkpoint could not be read: asking the primary");
                count(&standby, Outcome::Failed);
                None
            }
        }
    }

    /// Waits (at most the standby wait) until the standby's log has the event at `position`.
    async fn wait_for_log(&self, standby: &ReadSide, position: i64) -> Result<(), WaitError> {
        let started = std::time::Instant::now();
        loop {
            if standby.store.cursor_of_position(position).await?.is_some() {
                return Ok(());
            }
            let waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            if waited_ms >= self.standby_wait_ms {
                return Err(WaitError::Lagging {
                    position,
                    waited_ms,
                });
            }
            tokio::time::sleep(Duration::from_millis(LOG_POLL_MS)).await;
        }
    }

    fn next_standby(&self) -> Option<ReadSide> {
        if self.standbys.is_empty() {
            return None;
        }
        let turn = self.next.fetch_add(1, Ordering::Relaxed) % self.standbys.len();
        Some(self.standbys[turn].clone())
    }

    /// Sets each standby's lag gauges every `interval` until `shutdown`: how many positions the
    /// primary's log is ahead of the standby's, and how long ago the newest transaction the
    /// standby applied was committed while it has WAL left to apply (0 when it has applied all it
    /// received).
    pub async fn watch_lag(
        self: Arc<Self>,
        interval: Duration,
        shutdown: impl Future<Output = ()>,
    ) {
        if self.standbys.is_empty() {
            return;
        }
        tokio::pin!(shutdown);
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => return,
                _ = ticks.tick() => {}
            }
            let primary = match self.primary.store.head().await {
                Ok(head) => head.position(),
                Err(error) => {
                    tracing::warn!(%error, "the primary's log head could not be read");
                    continue;
                }
            };
            for standby in &self.standbys {
                let name = standby.standby_name().unwrap_or_default().to_owned();
                match lag_of(standby).await {
                    Ok((head, seconds)) => {
                        let behind = primary.saturating_sub(head).max(0);
                        metrics::gauge!("asiento_standby_lag_positions", "standby" => name.clone())
                            .set(behind as f64);
                        metrics::gauge!("asiento_standby_lag_seconds", "standby" => name)
                            .set(seconds);
                    }
                    Err(error) => {
                        tracing::warn!(standby = %name, %error, "a standby's lag could not be read");
                    }
                }
            }
        }
    }
}

/// A standby's log head (position) and replay delay in seconds.
async fn lag_of(standby: &ReadSide) -> Result<(i64, f64), LagError> {
    let head = standby.store.head().await?.position();
    let Database::Postgres(pool) = &standby.database else {
        return Err(LagError::NotPostgres);
    };
    let seconds: Option<f64> = sqlx::query_scalar(
        "SELECT CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0 \
         ELSE EXTRACT(EPOCH FROM now() - pg_last_xact_replay_timestamp())::float8 END",
    )
    .fetch_one(pool)
    .await?;
    Ok((head, seconds.unwrap_or(0.0).max(0.0)))
}

#[derive(Debug, thiserror::Error)]
enum LagError {
    #[error(transparent)]
    Store(#[from] asiento_eventstore::StoreError),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("a standby is a PostgreSQL database")]
    NotPostgres,
}

fn count(standby: &ReadSide, outcome: Outcome) {
    metrics::counter!(
        "asiento_standby_reads_total",
        "standby" => standby.standby_name().unwrap_or_default().to_owned(),
        "outcome" => outcome.as_str(),
    )
    .increment(1);
}
