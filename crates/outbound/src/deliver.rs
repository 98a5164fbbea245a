//! Sending deliveries: claimed under a lease (two workers never send one attempt twice), sent
//! signed with a bounded client, every attempt recorded, a failure tried again with backoff.
//!
//! Bounded so that one merchant cannot slow the others: a connect and a whole-answer timeout,
//! an answer read no further than [`ANSWER_BYTES_MAX`], no redirects followed, at most
//! `per_endpoint` attempts in flight to one endpoint and `in_flight` in all. The claim takes at
//! most `per_endpoint` due deliveries of each endpoint per round, so an endpoint with a backlog
//! cannot fill a round and hold the others back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asiento_domain::endpoint::{EndpointDisabled, EndpointEvent};
use asiento_domain::{endpoint_stream, TenantId};
use asiento_eventstore::{Database, ExpectedVersion, Metadata, NewEvent, StreamAppend};
use tokio::sync::Semaphore;

use crate::backoff::{Backoff, RETRY_WINDOW};
use crate::endpoints::{on_db, on_tx, secrets};
use crate::signature::{header, EVENT_ID_HEADER, SIGNATURE_HEADER};
use crate::url_policy::{PolicyResolver, UrlPolicy};
use crate::OutboundError;

/// How much of an endpoint's answer is read (and then dropped): enough to see that it answered.
pub const ANSWER_BYTES_MAX: usize = 4 * 1024;
/// Why an endpoint was disabled.
pub const DISABLED_REASON: &str = "every delivery failed for the whole retry window";
/// How much of an error or an answer an attempt's record keeps.
const RECORDED_CHARS_MAX: usize = 500;

/// How deliveries are sent.
#[derive(Debug, Clone)]
pub struct DeliveryConfig {
    pub connect_timeout: Duration,
    /// For the whole attempt: connect, send, the answer's head and its first bytes.
    pub timeout: Duration,
    pub per_endpoint: usize,
    pub in_flight: usize,
    pub backoff: Backoff,
    /// How long a delivery is retried from its first attempt, and how long an endpoint may fail
    /// every attempt before it is disabled ([`RETRY_WINDOW`]).
    pub retry_window: Duration,
    pub policy: Arc<UrlPolicy>,
}

impl Default for DeliveryConfig {
    fn default() -> Self {
        DeliveryConfig {
            connect_timeout: Duration::from_secs(5),
            timeout: Duration::from_secs(15),
            per_endpoint: 4,
            in_flight: 64,
            backoff: Backoff::default(),
            retry_window: RETRY_WINDOW,
            policy: Arc::new(UrlPolicy::default()),
        }
    }
}

/// One due delivery with what sending it needs.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Due {
    id: String,
    endpoint_id: String,
    tenant: String,
    event_id: String,
    attempts: i64,
    first_attempt_ms: Option<i64>,
    url: String,
    body: String,
}

/// What one attempt came to.
#[derive(Debug)]
struct Attempted {
    status: Option<u16>,
    error: Option<String>,
    latency_ms: i64,
}

impl Attempted {
    fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// The sender of one process.
#[derive(Clone)]
pub struct Deliverer {
    db: Database,
    http: reqwest::Client,
    config: DeliveryConfig,
    /// Attempts in flight per endpoint, in this process.
    busy: Arc<Mutex<HashMap<String, usize>>>,
    slots: Arc<Semaphore>,
}

impl Deliverer {
    pub fn new(db: Database, config: DeliveryConfig) -> Result<Deliverer, OutboundError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(PolicyResolver(Arc::clone(&config.policy))))
            .user_agent(concat!("asiento-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| OutboundError::Client(e.to_string()))?;
        Ok(Deliverer {
            db,
            http,
            slots: Arc::new(Semaphore::new(config.in_flight)),
            config,
            busy: Arc::new(Mutex::new(HashMap::new())),
        })
    }

    fn busy_with(&self, endpoint: &str) -> usize {
        self.busy
            .lock()
            .map(|busy| busy.get(endpoint).copied().unwrap_or(0))
            .unwrap_or(usize::MAX)
    }

    fn mark(&self, endpoint: &str, started: bool) {
        if let Ok(mut busy) = self.busy.lock() {
            let count = busy.entry(endpoint.to_owned()).or_default();
            if started {
                *count += 1;
            } else {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    busy.remove(endpoint);
                }
            }
        }
    }

    /// Claims what is due and has room, and starts sending it; the number started.
    pub async fn round(&self, now_ms: i64) -> Result<usize, OutboundError> {
        let per_endpoint = i64::try_from(self.config.per_endpoint).unwrap_or(i64::MAX);
        let due: Vec<Due> = on_db!(&self.db, pool => sqlx::query_as(
            "select d.id, d.endpoint_id, d.tenant, d.event_id, d.attempts, d.first_attempt_ms, e.url, \
             m.body \
             from (select id, endpoint_id, tenant, event_id, attempts, first_attempt_ms, \
                          row_number() over (partition by endpoint_id \
                                             order by next_attempt_ms, seq) as rank \
                   from webhook_deliveries \
                   where status = 'pending' and next_attempt_ms <= $1 and lease_until_ms <= $1) d \
             join webhook_endpoints e on e.id = d.endpoint_id and e.status = 'enabled' \
             join merchant_events m on m.event_id = d.event_id \
             where d.rank <= $2 order by d.rank limit 500",
        )
        .bind(now_ms)
        .bind(per_endpoint)
        .fetch_all(pool)
        .await?);
        let lease_ms = i64::try_from(self.config.timeout.as_millis())
            .unwrap_or(i64::MAX / 4)
            .saturating_mul(2)
            .saturating_add(5_000);
        let mut started = 0;
        for delivery in due {
            if self.busy_with(&delivery.endpoint_id) >= self.config.per_endpoint {
                continue;
            }
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                break;
            };
            let claimed = on_db!(&self.db, pool => sqlx::query(
                "update webhook_deliveries set lease_until_ms = $3 \
                 where id = $1 and status = 'pending' and lease_until_ms <= $2",
            )
            .bind(&delivery.id)
            .bind(now_ms)
            .bind(now_ms.saturating_add(lease_ms))
            .execute(pool)
            .await?
            .rows_affected());
            if claimed != 1 {
                continue;
            }
            self.mark(&delivery.endpoint_id, true);
            started += 1;
            let deliverer = self.clone();
            tokio::spawn(async move {
                let endpoint = delivery.endpoint_id.clone();
                if let Err(error) = deliverer.send(delivery).await {
                    tracing::warn!(%error, endpoint, "recording a webhook delivery failed; its lease runs out and it is sent again");
                }
                deliverer.mark(&endpoint, false);
                drop(slot);
            });
        }
        Ok(started)
    }

    async fn send(&self, delivery: Due) -> Result<(), OutboundError> {
        // The form again (the operator's allow-list may have changed since registration); a
        // name's addresses are checked by the client's resolver as it connects.
        if let Err(refused) = self.config.policy.check_form(&delivery.url) {
            let attempted = Attempted {
                status: None,
                error: Some(format!("refused: {refused}")),
                latency_ms: 0,
            };
            return self.record(&delivery, &attempted).await;
        }
        let now = chrono::Utc::now();
        let secrets = secrets(&self.db, &delivery.endpoint_id, now.timestamp_millis()).await?;
        let signature = header(&secrets, now.timestamp(), delivery.body.as_bytes());
        let started = Instant::now();
        let answer = self
            .http
            .post(&delivery.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature)
            .header(EVENT_ID_HEADER, &delivery.event_id)
            .body(delivery.body.clone())
            .send()
            .await;
        let attempted = match answer {
            Ok(mut response) => {
                let status = response.status().as_u16();
                let mut read = 0;
                let mut error = None;
                while read < ANSWER_BYTES_MAX {
                    match response.chunk().await {
                        Ok(Some(chunk)) => read += chunk.len(),
                        Ok(None) => break,
                        Err(e) => {
                            error = Some(describe(&e));
                            break;
                        }
                    }
                }
                Attempted {
                    status: Some(status),
                    error,
                    latency_ms: elapsed_ms(started),
                }
            }
            Err(e) => Attempted {
                status: None,
                error: Some(describe(&e)),
                latency_ms: elapsed_ms(started),
            },
        };
        metrics::counter!(
            "asiento_webhook_deliveries_total",
            "outcome" => if attempted.succeeded() { "succeeded" } else { "failed" },
        )
        .increment(1);
        metrics::histogram!("asiento_webhook_delivery_duration_seconds")
            .record(started.elapsed().as_secs_f64());
        self.record(&delivery, &attempted).await
    }

    /// The attempt's row, the delivery's next state and the endpoint's failing streak, in one
    /// transaction.
    async fn record(&self, delivery: &Due, attempted: &Attempted) -> Result<(), OutboundError> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let attempt = delivery.attempts + 1;
        let window_ms = i64::try_from(self.config.retry_window.as_millis()).unwrap_or(i64::MAX);
        let first = delivery.first_attempt_ms.unwrap_or(now_ms);
        let status = attempted.status.map(i32::from);
        let error = attempted.error.as_deref().map(truncate);
        let mut tx = self.db.begin().await?;
        on_tx!(&mut tx, conn => sqlx::query(
            "insert into webhook_delivery_attempts (delivery_id, attempt, at_ms, latency_ms, \
             response_status, error) values ($1, $2, $3, $4, $5, $6) \
             on conflict (delivery_id, attempt) do nothing",
        )
        .bind(&delivery.id)
        .bind(attempt)
        .bind(now_ms)
        .bind(attempted.latency_ms)
        .bind(status)
        .bind(&error)
        .execute(conn)
        .await?
        .rows_affected());
        if attempted.succeeded() {
            on_tx!(&mut tx, conn => sqlx::query(
                "update webhook_deliveries set status = 'succeeded', attempts = $2, \
                 first_attempt_ms = $3, last_status = $4, last_error = null, lease_until_ms = 0 \
                 where id = $1",
            )
            .bind(&delivery.id)
            .bind(attempt)
            .bind(first)
            .bind(status)
            .execute(conn)
            .await?
            .rows_affected());
            on_tx!(&mut tx, conn => sqlx::query(
                "update webhook_endpoints set failing_since_ms = null where id = $1",
            )
            .bind(&delivery.endpoint_id)
            .execute(conn)
            .await?
            .rows_affected());
        } else {
            let failures = u32::try_from(attempt).unwrap_or(u32::MAX);
            let delay = self.config.backoff.delay(failures, &mut rand::rng());
            let next = now_ms.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX));
            let gives_up = now_ms.saturating_sub(first) >= window_ms;
            on_tx!(&mut tx, conn => sqlx::query(
                "update webhook_deliveries set status = $2, attempts = $3, first_attempt_ms = $4, \
                 next_attempt_ms = $5, last_status = $6, last_error = $7, lease_until_ms = 0 \
                 where id = $1",
            )
            .bind(&delivery.id)
            .bind(if gives_up { "failed" } else { "pending" })
            .bind(attempt)
            .bind(first)
            .bind(next)
            .bind(status)
            .bind(&error)
            .execute(conn)
            .await?
            .rows_affected());
            on_tx!(&mut tx, conn => sqlx::query(
                "update webhook_endpoints set failing_since_ms = coalesce(failing_since_ms, $2) \
                 where id = $1",
            )
            .bind(&delivery.endpoint_id)
            .bind(now_ms)
            .execute(conn)
            .await?
            .rows_affected());
            let disabled = on_tx!(&mut tx, conn => sqlx::query(
                "update webhook_endpoints set status = 'disabled', disabled_ms = $2, \
                 disabled_reason = $4 \
                 where id = $1 and status = 'enabled' and failing_since_ms <= $3",
            )
            .bind(&delivery.endpoint_id)
            .bind(now_ms)
            .bind(now_ms.saturating_sub(window_ms))
            .bind(DISABLED_REASON)
            .execute(conn)
            .await?
            .rows_affected());
            if disabled == 1 {
                self.tell_disabled(&mut tx, delivery, now_ms).await?;
                tracing::warn!(
                    endpoint = delivery.endpoint_id,
                    "webhook endpoint disabled: every delivery failed for the whole retry window"
                );
            }
        }
        tx.commit().await?;
        Ok(())
    }
}

impl Deliverer {
    /// The merchant is told, in its feed (`webhook_endpoint.disabled`), in the transaction that
    /// disables the endpoint.
    async fn tell_disabled(
        &self,
        tx: &mut asiento_eventstore::Tx,
        delivery: &Due,
        now_ms: i64,
    ) -> Result<(), OutboundError> {
        let stream_id = endpoint_stream(&delivery.endpoint_id).ok_or_else(|| {
            OutboundError::Corrupt(format!("endpoint id {}", delivery.endpoint_id))
        })?;
        let tenant = TenantId::parse(&delivery.tenant)
            .map_err(|_| OutboundError::Corrupt(format!("tenant {}", delivery.tenant)))?;
        let event = EndpointEvent::EndpointDisabled(EndpointDisabled {
            endpoint_id: delivery.endpoint_id.clone(),
            tenant,
            url: delivery.url.clone(),
            reason: DISABLED_REASON.to_owned(),
            at: chrono::DateTime::from_timestamp_millis(now_ms).unwrap_or_default(),
        });
        let data = event
            .encode()
            .map_err(|e| OutboundError::Corrupt(e.to_string()))?;
        self.db
            .event_store()
            .append_in(
                tx,
                &[StreamAppend {
                    stream_id,
                    expected: ExpectedVersion::Any,
                    events: vec![NewEvent {
                        event_id: uuid::Uuid::new_v4(),
                        event_type: event.event_type().to_owned(),
                        schema: event.schema_version(),
                        data,
                        metadata: Metadata {
                            tenant: Some(delivery.tenant.clone()),
                            ..Metadata::default()
                        },
                    }],
                }],
            )
            .await
            .map_err(|e| OutboundError::Append(e.to_string()))?;
        Ok(())
    }
}

fn elapsed_ms(started: Instant) -> i64 {
    i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX)
}

fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut text = format!("{kind}: {error}");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

fn truncate(text: &str) -> String {
    text.chars().take(RECORDED_CHARS_MAX).collect()
}
