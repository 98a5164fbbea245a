//! The events relay: the merchant events feed (`asiento_merchant_events`) published to a NATS
//! JetStream stream, every event once, in the feed's order (the log's).
//!
//! Each event is one message on `asiento.<tenant>.<event type>` ([`subject`]), its payload the
//! event object's JSON exactly as `GET /v1/events` and webhook deliveries send it, its
//! `Nats-Msg-Id` the event's id, and headers naming its tenant, type, feed `seq` and the relay.
//!
//! Why it is shaped this way:
//!
//! - **The cursor moves only after JetStream acknowledged.** A round reads a page of the feed
//!   after the relay's cursor ([`cursor`]), publishes each event and awaits its publish
//!   acknowledgement (the stream has stored it), then moves the cursor to the page's last event
//!   by compare-and-set. A relay killed mid-page, or a publish whose answer was lost, publishes
//!   again from the stored cursor; JetStream's duplicate window drops a message whose
//!   `Nats-Msg-Id` it has stored within the window (the acknowledgement says `duplicate`).
//! - **Many events in flight, and still the feed's order.** A message lost with a broken
//!   connection while a later one got through would put the later one first once the lost one
//!   is sent again. So the first event of a page is sent alone and acknowledged, and each later
//!   one (up to [`IN_FLIGHT`] unacknowledged) carries `Nats-Expected-Last-Msg-Id`, its
//!   predecessor's id: JetStream stores it only right after its predecessor, and refuses it
//!   (and so every one after it) when the predecessor was lost; the round then starts again from
//!   the cursor. JetStream checks duplicates first, so an event sent again is answered
//!   `duplicate`, not refused. Each stored copy of an event follows that of its predecessor,
//!   even when two relays overlap after a lease ran out. Where something else writes to the
//!   stream between two events (relays of other tenants sharing it), the expectation fails: the
//!   relay then sends one event at a time, each after its predecessor's acknowledgement, for the
//!   rest of its life.
//! - **Resuming past the duplicate window.** A relay that starts, or recovers from an error,
//!   reads the stream's last message: when it is this relay's and names a feed event past the
//!   cursor, every event up to it is stored (by the point above), and the cursor moves there
//!   first. So neither a crash nor a NATS server unreachable for longer than the window repeats
//!   an event of a relay that publishes alone to its stream; what can still come twice, later
//!   than the window, is in docs/operations.md (consumers dedup by id).
//! - **One relay per tenant set.** The relay's job lease (`asiento_app::reconcile::acquire_job`,
//!   job `events_relay:<relay name>`), renewed every round and every third of the lease while a
//!   page is published, lets one process of a deployment relay; the others wait and take over
//!   within the lease when it stops. The cursor's compare-and-set and the duplicate window cover
//!   the moment two overlap.
//! - **Errors delay, never lose.** Any failure (NATS unreachable, no acknowledgement in time,
//!   the database) ends the round; the relay backs off (up to 5 s) and starts again from the
//!   stored cursor. The client reconnects by itself; nothing is skipped.
//!
//! The relay's name is its stream's name, followed by `:` and its tenants when it relays only
//! some (`ASIENTO_EVENTS:acme,beta`): the cursor and the lease belong to that name, so a relay to
//! a new stream starts from the beginning of the feed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use asiento_app::clock::Clock;
use asiento_app::reconcile::{acquire_job, release_job};
use asiento_eventstore::Database;
use asiento_merchant_events::{read_after, read_one, FeedCursor, FeedEvent, FeedQuery};
use async_nats::header::{HeaderMap, NATS_EXPECTED_LAST_MESSAGE_ID, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, stream};
use rand::Rng as _;
use uuid::Uuid;

mod config;
pub mod cursor;
mod error;
pub mod subject;

pub use config::{
    redact, RelayConfig, ACK_TIMEOUT_DEFAULT, DUPLICATE_WINDOW_DEFAULT, LEASE_DEFAULT,
    STREAM_DEFAULT,
};
pub use error::RelayError;

/// How often an idle relay looks for new events (and a waiting one for the lease).
pub const ROUND_INTERVAL: Duration = Duration::from_millis(200);
/// Events read (and published before the cursor moves) per round.
pub const PAGE: u32 = 200;
/// Events published and not yet acknowledged, at most.
pub const IN_FLIGHT: usize = 64;
/// The longest pause between failed rounds.
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The job lease of relay `name` is `events_relay:<name>`.
pub const JOB_PREFIX: &str = "events_relay:";

/// The header with the event's tenant (raw, not encoded).
pub const HEADER_TENANT: &str = "Asiento-Tenant";
/// The header with the event's type (`payment.created`).
pub const HEADER_EVENT_TYPE: &str = "Asiento-Event-Type";
/// The header with the event's place in the feed: the `seq` of `GET /v1/events`' cursors.
pub const HEADER_SEQ: &str = "Asiento-Seq";
/// The header with the name of the relay that published the message.
pub const HEADER_RELAY: &str = "Asiento-Relay";

/// How a round ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    /// A full page was published: more may follow at once.
    More,
    /// The relay caught up with the feed.
    Idle,
    /// Another process holds the relay's lease.
    Standby,
}

/// What a relay keeps between rounds.
struct Session {
    jetstream: jetstream::Context,
    /// The stream exists (created or found) since the last failure.
    stream_ready: bool,
    /// The cursor was checked against the stream's last message since the lease was taken or
    /// the last failure.
    synced: bool,
    /// When the lease was last taken or renewed; None while another process holds it.
    renewed_ms: Option<i64>,
    /// Events after a page's first are sent without waiting (see the crate docs); false once
    /// the stream was found written by someone else between two events.
    pipelined: bool,
}

impl Session {
    fn reset(&mut self) {
        self.stream_ready = false;
        self.synced = false;
    }
}

/// The relay of one process. Build it with [`Relay::new`], run it with [`Relay::run`].
pub struct Relay {
    db: Database,
    clock: Arc<dyn Clock>,
    config: RelayConfig,
    name: String,
    job: String,
    /// Fresh per relay: the job lease it holds carries it.
    owner: Uuid,
}

impl Relay {
    pub fn new(
        db: Database,
        clock: Arc<dyn Clock>,
        config: RelayConfig,
    ) -> Result<Relay, RelayError> {
        config.validate()?;
        let name = config.name();
        Ok(Relay {
            db,
            clock,
            job: format!("{JOB_PREFIX}{name}"),
            name,
            config,
            owner: Uuid::new_v4(),
        })
    }

    /// The relay's name (its cursor's and its lease's).
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Relays until `shutdown`, then gives its lease back.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut failures: u32 = 0;
        let client = loop {
            match self.connect().await {
                Ok(client) => break client,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    record(&self.name, &error);
                    tokio::select! {
                        () = &mut shutdown => return,
                        () = tokio::time::sleep(backoff(failures)) => {}
                    }
                }
            }
        };
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(self.config.ack_timeout);
        let mut session = Session {
            jetstream,
            stream_ready: false,
            synced: false,
            renewed_ms: None,
            pipelined: true,
        };
        let mut delay = Duration::ZERO;
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep(delay) => {}
            }
            // A round cut short by the shutdown has not moved the cursor: the next holder starts
            // from it (or from the stream's last message, when this relay published it).
            let outcome = tokio::select! {
                () = &mut shutdown => break,
                outcome = self.round(&mut session) => outcome,
            };
            delay = match outcome {
                Ok(Round::More) => {
                    failures = 0;
                    Duration::ZERO
                }
                Ok(Round::Idle | Round::Standby) => {
                    failures = 0;
                    ROUND_INTERVAL
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    record(&self.name, &error);
                    session.reset();
                    backoff(failures)
                }
            };
        }
        metrics::gauge!("asiento_events_relay_active", "relay" => self.name.clone()).set(0.0);
        if session.renewed_ms.is_some() {
            if let Err(error) = release_job(&self.db, &self.job, self.owner).await {
                tracing::warn!(%error, "events relay lease not released; it runs out by itself");
            }
        }
        if let Err(error) = tokio::time::timeout(Duration::from_secs(2), client.flush())
            .await
            .unwrap_or(Ok(()))
        {
            tracing::debug!(%error, "flushing the NATS connection at shutdown failed");
        }
    }

    /// The client: it connects in the background and reconnects by itself, so an unreachable
    /// server delays the first round instead of failing here.
    async fn connect(&self) -> Result<async_nats::Client, RelayError> {
        let servers = self.config.servers()?;
        let client = async_nats::ConnectOptions::new()
            .name(format!("asiento events relay {}", self.name))
            .retry_on_initial_connect()
            .max_reconnects(None)
            // The stream's administration (its info, its last message) waits no longer than a
            // publish does.
            .request_timeout(Some(self.config.ack_timeout))
            .connect(servers)
            .await?;
        Ok(client)
    }

    /// Takes or renews the lease; false when another process holds it.
    async fn hold(&self, session: &mut Session) -> Result<bool, RelayError> {
        let now_ms = self.clock.now_ms();
        let lease_ms = i64::try_from(self.config.lease.as_millis()).unwrap_or(i64::MAX);
        let held = acquire_job(&self.db, &self.job, self.owner, now_ms, lease_ms)
            .await?
            .is_some();
        match (held, session.renewed_ms.is_some()) {
            (true, false) => {
                tracing::info!(relay = %self.name, owner = %self.owner, "events relay active")
            }
            (false, true) => {
                tracing::warn!(relay = %self.name, "events relay lease lost to another process")
            }
            _ => {}
        }
        if held {
            session.renewed_ms = Some(now_ms);
        } else {
            session.renewed_ms = None;
            session.synced = false;
        }
        metrics::gauge!("asiento_events_relay_active", "relay" => self.name.clone()).set(if held {
            1.0
        } else {
            0.0
        });
        if !held {
            // The holder reports the lag; a waiting process would report a stale one.
            metrics::gauge!("asiento_events_relay_lag_events", "relay" => self.name.clone())
                .set(0.0);
        }
        Ok(held)
    }

    async fn round(&self, session: &mut Session) -> Result<Round, RelayError> {
        if !self.hold(session).await? {
            return Ok(Round::Standby);
        }
        if !session.stream_ready {
            self.ensure_stream(&session.jetstream).await?;
            session.stream_ready = true;
        }
        let mut at = cursor::load(&self.db, &self.name, self.clock.now_ms()).await?;
        if !session.synced {
            at = self.sync(&session.jetstream, at).await?;
            session.synced = true;
        }
        let events = read_after(
            &self.db,
            &FeedQuery {
                tenant: match self.config.tenants.as_slice() {
                    [one] => Some(one.clone()),
                    _ => None,
                },
                after: FeedCursor::after(at),
                types: Vec::new(),
                limit: PAGE,
            },
        )
        .await?;
        let Some(last) = events.last() else {
            metrics::gauge!("asiento_events_relay_lag_events", "relay" => self.name.clone())
                .set(0.0);
            return Ok(Round::Idle);
        };
        let renew_after_ms = i64::try_from(self.config.lease.as_millis() / 3).unwrap_or(i64::MAX);
        let mut previous: Option<&str> = None;
        let mut in_flight = Vec::with_capacity(IN_FLIGHT);
        for event in &events {
            if !self.config.relays(&event.tenant) {
                continue;
            }
            let renewed_ms = session.renewed_ms.unwrap_or(i64::MIN);
            if self.clock.now_ms().saturating_sub(renewed_ms) > renew_after_ms
                && !self.hold(session).await?
            {
                return Ok(Round::Standby);
            }
            let after = previous.filter(|_| session.pipelined);
            let ack = self.send(&session.jetstream, event, after).await?;
            in_flight.push(ack);
            if after.is_none() || in_flight.len() >= IN_FLIGHT {
                self.confirm_all(session, &mut in_flight).await?;
            }
            previous = Some(event.event_id.as_str());
        }
        self.confirm_all(session, &mut in_flight).await?;
        if !cursor::advance(&self.db, &self.name, at, last.seq, self.clock.now_ms()).await? {
            tracing::warn!(
                relay = %self.name,
                "another events relay moved the cursor during this page; reading it again"
            );
            session.synced = false;
            return Ok(Round::More);
        }
        let head = cursor::feed_head(&self.db).await?;
        metrics::gauge!("asiento_events_relay_lag_events", "relay" => self.name.clone())
            .set(head.saturating_sub(last.seq).max(0) as f64);
        Ok(if events.len() >= PAGE as usize {
            Round::More
        } else {
            Round::Idle
        })
    }

    /// Creates the stream, or finds it as it is (an operator may have created it with their own
    /// retention and replicas).
    async fn ensure_stream(&self, jetstream: &jetstream::Context) -> Result<(), RelayError> {
        let config = stream::Config {
            name: self.config.stream.clone(),
            subjects: vec![subject::STREAM_SUBJECTS.to_owned()],
            duplicate_window: self.config.duplicate_window,
            description: Some("asiento merchant events (crates/relay)".to_owned()),
            ..stream::Config::default()
        };
        let stream = jetstream
            .get_or_create_stream(config)
            .await
            .map_err(|source| RelayError::Stream {
                stream: self.config.stream.clone(),
                source,
            })?;
        let found = &stream.cached_info().config;
        if found.duplicate_window < self.config.duplicate_window {
            tracing::warn!(
                stream = %self.config.stream,
                window = ?found.duplicate_window,
                "the stream's duplicate window is shorter than the relay's setting; a re-publish \
                 after it can be stored twice"
            );
        }
        Ok(())
    }

    /// The cursor after checking the stream's last message: when this relay published it and
    /// it names a feed event past `at`, every event up to it is stored (one event in flight,
    /// in feed order), so the cursor moves there.
    async fn sync(&self, jetstream: &jetstream::Context, at: i64) -> Result<i64, RelayError> {
        let Some(seq) = self.last_published(jetstream).await? else {
            return Ok(at);
        };
        if seq <= at {
            return Ok(at);
        }
        if cursor::advance(&self.db, &self.name, at, seq, self.clock.now_ms()).await? {
            tracing::info!(
                relay = %self.name,
                from = at,
                to = seq,
                "the stream already holds events past the cursor; resuming after them"
            );
            Ok(seq)
        } else {
            Ok(cursor::load(&self.db, &self.name, self.clock.now_ms()).await?)
        }
    }

    /// The feed `seq` of the stream's last message, when this relay published it.
    async fn last_published(
        &self,
        jetstream: &jetstream::Context,
    ) -> Result<Option<i64>, RelayError> {
        let failed = |detail: String| RelayError::LastMessage {
            stream: self.config.stream.clone(),
            detail,
        };
        let stream = jetstream
            .get_stream(&self.config.stream)
            .await
            .map_err(|error| failed(error.to_string()))?;
        let info = stream
            .get_info()
            .await
            .map_err(|error| failed(error.to_string()))?;
        if info.state.messages == 0 {
            return Ok(None);
        }
        let message = match stream.get_raw_message(info.state.last_sequence).await {
            Ok(message) => message,
            Err(error)
                if matches!(
                    error.kind(),
                    stream::LastRawMessageErrorKind::NoMessageFound
                ) =>
            {
                return Ok(None)
            }
            Err(error) => return Err(failed(error.to_string())),
        };
        let header = |name: &str| {
            message
                .headers
                .get(name)
                .map(|value| value.as_str().to_owned())
        };
        if header(HEADER_RELAY).as_deref() != Some(self.name.as_str()) {
            return Ok(None);
        }
        let (Some(tenant), Some(id)) = (
            header(HEADER_TENANT),
            message
                .headers
                .get(NATS_MESSAGE_ID)
                .map(|value| value.as_str().to_owned()),
        ) else {
            return Ok(None);
        };
        Ok(read_one(&self.db, &tenant, &id)
            .await?
            .map(|event| event.seq))
    }

    /// Hands one event to the client; the answer is JetStream's acknowledgement. With `after`,
    /// JetStream stores it only right after the event of that id.
    async fn send(
        &self,
        jetstream: &jetstream::Context,
        event: &FeedEvent,
        after: Option<&str>,
    ) -> Result<jetstream::context::PublishAckFuture, RelayError> {
        let mut headers = HeaderMap::new();
        headers.insert(NATS_MESSAGE_ID, event.event_id.as_str());
        if let Some(after) = after {
            headers.insert(NATS_EXPECTED_LAST_MESSAGE_ID, after);
        }
        headers.insert(HEADER_TENANT, event.tenant.as_str());
        headers.insert(HEADER_EVENT_TYPE, event.event_type.as_str());
        headers.insert(HEADER_SEQ, event.seq.to_string());
        headers.insert(HEADER_RELAY, self.name.as_str());
        headers.insert("Content-Type", "application/json");
        Ok(jetstream
            .publish_with_headers(
                subject::subject(&event.tenant, &event.event_type),
                headers,
                event.body.clone().into(),
            )
            .await?)
    }

    /// Waits, in order, until JetStream has stored every event in flight (or had it already).
    async fn confirm_all(
        &self,
        session: &mut Session,
        in_flight: &mut Vec<jetstream::context::PublishAckFuture>,
    ) -> Result<(), RelayError> {
        for ack in in_flight.drain(..) {
            let ack = match ack.await {
                Ok(ack) => ack,
                Err(error) => {
                    if error.kind() == jetstream::context::PublishErrorKind::WrongLastMessageId {
                        tracing::warn!(
                            relay = %self.name,
                            stream = %self.config.stream,
                            "something else writes to the stream between this relay's events; \
                             publishing one event at a time from now on"
                        );
                        session.pipelined = false;
                    }
                    return Err(error.into());
                }
            };
            if ack.stream != self.config.stream {
                return Err(RelayError::WrongStream {
                    expected: self.config.stream.clone(),
                    actual: ack.stream,
                });
            }
            let counter = if ack.duplicate {
                "asiento_events_relay_duplicates_total"
            } else {
                "asiento_events_relay_published_total"
            };
            metrics::counter!(counter, "relay" => self.name.clone()).increment(1);
        }
        Ok(())
    }
}

/// Counts and logs a failed round.
fn record(relay: &str, error: &RelayError) {
    metrics::counter!(
        "asiento_events_relay_errors_total",
        "relay" => relay.to_owned(),
        "kind" => error.kind()
    )
    .increment(1);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64());
    metrics::gauge!(
        "asiento_events_relay_last_error_timestamp_seconds",
        "relay" => relay.to_owned()
    )
    .set(now_s);
    tracing::warn!(%relay, %error, "events relay round failed; retrying from the stored cursor");
}

/// The pause after the `failures`-th failure in a row: doubling from the round interval up to
/// [`BACKOFF_MAX`], with jitter in its upper half.
fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let ceiling = ROUND_INTERVAL
        .saturating_mul(1u32 << doublings)
        .min(BACKOFF_MAX);
    let ceiling_ms = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(ceiling_ms / 2..=ceiling_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        for _ in 0..100 {
            let first = backoff(1);
            assert!(
                first >= ROUND_INTERVAL / 2 && first <= ROUND_INTERVAL,
                "{first:?}"
            );
            let late = backoff(40);
            assert!(late >= BACKOFF_MAX / 2 && late <= BACKOFF_MAX, "{late:?}");
        }
    }
}
