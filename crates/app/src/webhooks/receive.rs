//! Receiving a delivery: what must happen before the provider gets its 200. The signature is
//! verified over the raw bytes, the body parsed, and the event stored in the inbox,
//! deduplicated by (provider, event id), in one statement; the inbox insert here is also the one
//! that group commit batches with other requests' steps.

use std::collections::HashSet;
use std::sync::Arc;

use asiento_eventstore::{Database, Tx};
use asiento_psp::adyen::BatchError;
use asiento_psp::{SignatureError, SIGNATURE_HEADER};
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::Arguments;

use super::{truncate, WebhookSecrets};
use crate::clock::Clock;
use crate::commit::{CommitError, Committed, Step, Writer};

/// Provider event ids longer than this are refused as malformed (Stripe's are ~30 characters).
pub const EVENT_ID_LEN_MAX: usize = 255;
/// A charge reference longer than this cannot be one of our payment ids; it is not indexed.
pub const PAYMENT_REF_LEN_MAX: usize = 255;
/// A provider name from the URL is cut to this many characters before it appears in an error.
pub(super) const PROVIDER_ECHO_CHARS_MAX: usize = 64;

/// What the HTTP handler needs: where to store, which secrets, which clock.
#[derive(Clone)]
pub struct WebhookReceiver {
    pub database: Database,
    /// Stores each verified event with other requests' steps (see `crate::commit`).
    pub writer: Arc<Writer>,
    pub secrets: WebhookSecrets,
    pub clock: Arc<dyn Clock>,
    /// How far the signature's timestamp may be from our clock, either way.
    pub tolerance_s: i64,
}

/// A verified event, stored (or found stored already).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    /// The provider sent this event id before: nothing was changed.
    pub duplicate: bool,
}

/// Why an event was refused (every client-fault variant stores nothing) or could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum ReceiveError {
    #[error("no webhook secret is configured for provider {0:?}")]
    UnknownProvider(String),
    #[error("the {SIGNATURE_HEADER} header is missing or not text")]
    SignatureMissing,
    #[error("the signature's timestamp is outside the tolerance: {0}")]
    SignatureStale(SignatureError),
    #[error("the signature does not verify: {0}")]
    SignatureInvalid(SignatureError),
    #[error("the body is not a webhook event: {0}")]
    InvalidBody(String),
    #[error("the endpoint's credentials are missing or wrong")]
    Unauthorized,
    #[error("the batch is refused: {0}")]
    BatchRefused(BatchError),
    #[error("storing the event failed: {0}")]
    Store(#[from] CommitError),
}

impl ReceiveError {
    /// The stable problem code of a refusal; `internal_error` for our own failures.
    pub fn code(&self) -> &'static str {
        match self {
            ReceiveError::UnknownProvider(_) => "unknown_provider",
            ReceiveError::SignatureMissing | ReceiveError::SignatureInvalid(_) => {
                "signature_invalid"
            }
            ReceiveError::SignatureStale(_) => "signature_stale",
            ReceiveError::InvalidBody(_) => "invalid_body",
            ReceiveError::Unauthorized => "unauthorized",
            ReceiveError::BatchRefused(BatchError::Signature { .. }) => "signature_invalid",
            ReceiveError::BatchRefused(_) => "invalid_body",
            ReceiveError::Store(_) => "internal_error",
        }
    }

    /// The sender's fault (answer 400), as opposed to ours (answer 500 so the provider retries).
    pub fn is_client_fault(&self) -> bool {
        !matches!(self, ReceiveError::Store(_))
    }
}

impl WebhookReceiver {
    /// Verifies and stores one delivery. Checks run cheapest and least trusting first: the
    /// provider must be configured, the signature must verify over the exact bytes, and only then
    /// is the body parsed.
    #[tracing::instrument(skip_all, fields(provider = %truncate(provider, PROVIDER_ECHO_CHARS_MAX)))]
    pub async fn receive(
        &self,
        provider: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<Received, ReceiveError> {
        let result = self.receive_inner(provider, signature, body).await;
        match &result {
            Ok(Received { duplicate: true }) => count_received("duplicate", 1),
            Ok(Received { duplicate: false }) => count_received("stored", 1),
            Err(error) => refused(error),
        }
        result
    }

    async fn receive_inner(
        &self,
        provider: &str,
        signature: Option<&str>,
        body: &[u8],
    ) -> Result<Received, ReceiveError> {
        let secret = self.secrets.get(provider).ok_or_else(|| {
            ReceiveError::UnknownProvider(truncate(provider, PROVIDER_ECHO_CHARS_MAX))
        })?;
        let signature = signature.ok_or(ReceiveError::SignatureMissing)?;
        let now_ms = self.clock.now_ms();
        asiento_psp::verify(
            secret,
            signature,
            body,
            now_ms.div_euclid(1000),
            self.tolerance_s,
        )
        .map_err(|error| match error {
            SignatureError::TimestampOutsideTolerance { .. } => ReceiveError::SignatureStale(error),
            other => ReceiveError::SignatureInvalid(other),
        })?;
        let event = self
            .secrets
            .format(provider)
            .envelope(body)
            .map_err(ReceiveError::InvalidBody)?;
        if event.id.is_empty() || event.id.len() > EVENT_ID_LEN_MAX {
            return Err(ReceiveError::InvalidBody(format!(
                "the event id must be 1 to {EVENT_ID_LEN_MAX} bytes"
            )));
        }
        let payment_ref = event
            .payment_ref
            .filter(|reference| reference.len() <= PAYMENT_REF_LEN_MAX);
        let row = InboxRow {
            provider: provider.to_owned(),
            event_id: event.id,
            event_type: event.kind,
            payment_ref,
            payload: body.to_vec(),
            now_ms,
        };
        let duplicate = match self.writer.commit(Step::Inbox(row)).await? {
            Committed::Written(_) | Committed::Rebased(..) => false,
            Committed::NotFresh => true,
            other => {
                return Err(ReceiveError::Store(CommitError::Unexpected(format!(
                    "{other:?}"
                ))))
            }
        };
        Ok(Received { duplicate })
    }
}

/// Counts `n` events received with `outcome` (`stored`, `duplicate`, or a refusal's code).
pub(super) fn count_received(outcome: &'static str, n: usize) {
    if n > 0 {
        metrics::counter!("asiento_webhooks_received_total", "outcome" => outcome)
            .increment(u64::try_from(n).unwrap_or(u64::MAX));
    }
}

/// Counts and logs a refused or unstored delivery.
pub(super) fn refused(error: &ReceiveError) {
    count_received(error.code(), 1);
    if error.is_client_fault() {
        tracing::warn!(%error, "webhook refused");
    } else {
        tracing::error!(%error, "webhook could not be stored");
    }
}

/// A verified provider event, as the inbox stores it.
#[derive(Debug, Clone)]
pub struct InboxRow {
    pub provider: String,
    pub event_id: String,
    pub event_type: String,
    pub payment_ref: Option<String>,
    pub payload: Vec<u8>,
    pub now_ms: i64,
}

/// Stores each event not stored before, inside `tx`: `true` for those new, `false` for an event
/// id the provider sent before (or twice among `rows`). One statement on PostgreSQL.
pub async fn insert_inbox_each(tx: &mut Tx, rows: &[&InboxRow]) -> Result<Vec<bool>, sqlx::Error> {
    let conn = match tx {
        Tx::Postgres(conn) => conn,
        Tx::Sqlite(conn) => {
            // SQLite runs in process: a statement per row costs no round trip.
            let sql = "insert into webhook_inbox (provider, event_id, event_type, payment_ref, \
                       payload, next_attempt_ms, received_ms) values (?1, ?2, ?3, ?4, ?5, ?6, ?6) \
                       on conflict (provider, event_id) do nothing";
            let mut stored = Vec::with_capacity(rows.len());
            for row in rows {
                let inserted = sqlx::query(sql)
                    .bind(&row.provider)
                    .bind(&row.event_id)
                    .bind(&row.event_type)
                    .bind(row.payment_ref.as_deref())
                    .bind(&row.payload)
                    .bind(row.now_ms)
                    .execute(&mut **conn)
                    .await?
                    .rows_affected();
                stored.push(inserted == 1);
            }
            return Ok(stored);
        }
    };
    let mut arguments = PgArguments::default();
    add_inbox(&mut arguments, rows).map_err(sqlx::Error::Encode)?;
    let sql = format!(
        "WITH {} SELECT provider, event_id FROM stored",
        inbox_cte(1)
    );
    let stored: Vec<(String, String)> = sqlx::query_as_with(&sql, arguments)
        .fetch_all(&mut **conn)
        .await?;
    Ok(stored_each(rows, stored))
}

/// The CTE `stored` (without `WITH`): stores each event of [`add_inbox`]'s six arrays, read from
/// `$first` on, unless stored before, `RETURNING provider, event_id` of those new. Rows go in by
/// event id (one lock order for concurrent batches), then in the order given: of two rows with
/// one event id the first is the one stored.
pub(crate) fn inbox_cte(first: usize) -> String {
    let p: Vec<usize> = (first..first + 6).collect();
    format!(
        "stored AS (insert into webhook_inbox (provider, event_id, event_type, payment_ref, \
         payload, next_attempt_ms, received_ms) \
         select p, e, t, r, b, n, n from unnest(${}::text[], ${}::text[], ${}::text[], \
         ${}::text[], ${}::bytea[], ${}::int8[]) with ordinality as u(p, e, t, r, b, n, i) \
         order by p, e, i on conflict (provider, event_id) do nothing \
         returning provider, event_id)",
        p[0], p[1], p[2], p[3], p[4], p[5]
    )
}

/// Adds the rows, as [`inbox_cte`] reads them, to `arguments`.
pub(crate) fn add_inbox(
    arguments: &mut PgArguments,
    rows: &[&InboxRow],
) -> Result<(), BoxDynError> {
    let text = |f: &dyn Fn(&InboxRow) -> &str| rows.iter().map(|r| f(r)).collect::<Vec<&str>>();
    arguments.add(text(&|r| &r.provider))?;
    arguments.add(text(&|r| &r.event_id))?;
    arguments.add(text(&|r| &r.event_type))?;
    arguments.add(
        rows.iter()
            .map(|r| r.payment_ref.as_deref())
            .collect::<Vec<_>>(),
    )?;
    arguments.add(rows.iter().map(|r| &r.payload[..]).collect::<Vec<_>>())?;
    arguments.add(rows.iter().map(|r| r.now_ms).collect::<Vec<_>>())
}

/// For each of `rows`, whether `stored` (what `stored` returned) holds it: of two rows with one
/// event id, only the first.
pub(crate) fn stored_each(rows: &[&InboxRow], stored: Vec<(String, String)>) -> Vec<bool> {
    let mut new: HashSet<(String, String)> = stored.into_iter().collect();
    rows.iter()
        .map(|r| new.remove(&(r.provider.clone(), r.event_id.clone())))
        .collect()
}
