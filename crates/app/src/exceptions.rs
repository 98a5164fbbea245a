//! Reconciliation exceptions: recording, listing and resolving them.
//!
//! An exception is a stream of events (`exception-exc_…`, see `asiento_domain::exception`); its
//! row in `reconciliation_exceptions` is the read side, written in the same transaction as the
//! events it reflects, so a listing is never behind the log. Recording is idempotent: the id is
//! derived from the finding, and recording an exception that exists changes nothing.
//!
//! Scope: an exception carries its payment's tenant, and a tenant sees only its own (another
//! tenant's id answers "not found"). A charge or event that names no payment of ours has no
//! tenant; it belongs to the platform scope, which no API key reaches: operators list those with
//! `asiento reconcile --list` (see `docs/reconciliation.md`).

use asiento_domain::exception::{
    decide, evolve, Exception, ExceptionCommand, ExceptionEvent, ExceptionRecorded,
    ExceptionRejection, ExceptionStatus,
};
use asiento_domain::{exception_stream, ExceptionId, TenantId};
use asiento_eventstore::{
    AppendError, Database, EventStore, ExpectedVersion, Metadata, StreamAppend, Tx,
};
use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::log::{self, LogError};

/// The most exceptions one listing returns.
pub const EXCEPTIONS_PAGE_MAX: i64 = 500;

/// The note of an exception the sweep fixed itself.
pub const AUTO_RESOLUTION_NOTE: &str = "fixed by the reconciliation sweep";

#[derive(Debug, thiserror::Error)]
pub enum ExceptionError {
    #[error("exception table query failed: {0}")]
    Database(#[from] sqlx::Error),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("append failed: {0}")]
    Append(AppendError),
    /// A rejection of the exception's rules (already resolved, empty note, not found).
    #[error("refused: {0}")]
    Rejected(ExceptionRejection),
    #[error("stored exception is inconsistent: {0}")]
    Inconsistent(String),
}

impl From<asiento_eventstore::StoreError> for ExceptionError {
    fn from(error: asiento_eventstore::StoreError) -> Self {
        ExceptionError::Log(LogError::Store(error))
    }
}

/// One exception as the API lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct ExceptionView {
    pub id: String,
    pub tenant: Option<String>,
    pub payment_id: Option<String>,
    pub provider: String,
    pub charge_id: Option<String>,
    pub kind: String,
    pub local: Value,
    pub provider_state: Value,
    pub difference: Value,
    pub resolution: String,
    pub status: String,
    pub note: Option<String>,
    pub recorded_ms: i64,
    pub resolved_ms: Option<i64>,
}

/// Whose exceptions to list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Tenant(TenantId),
    /// Exceptions naming no payment of ours.
    Platform,
    /// Every exception (operators, the CLI).
    All,
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

fn metadata(tenant: Option<&TenantId>) -> Metadata {
    Metadata {
        tenant: tenant.map(ToString::to_string),
        ..Metadata::default()
    }
}

/// The events that record `recorded` (and, for an auto exception, resolve it at once).
pub fn record_events(recorded: ExceptionRecorded) -> Result<Vec<ExceptionEvent>, ExceptionError> {
    decide(
        &Exception::default(),
        ExceptionCommand::Record {
            recorded: Box::new(recorded),
            auto_note: AUTO_RESOLUTION_NOTE.to_owned(),
        },
    )
    .map_err(ExceptionError::Rejected)
}

fn codec(
    event: &ExceptionEvent,
) -> Result<(&'static str, i32, Value), asiento_domain::EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

/// Whether the exception's stream exists. Read through the pool: call it before any `Tx`.
pub async fn exists(store: &dyn EventStore, id: ExceptionId) -> Result<bool, ExceptionError> {
    Ok(store.stream_version(&exception_stream(id)).await?.is_some())
}

/// Appends a new exception's events and its row inside `tx`. A conflict means the exception was
/// recorded meanwhile (the caller rolls back and treats it as existing).
pub async fn record_in(
    store: &dyn EventStore,
    tx: &mut Tx,
    recorded: ExceptionRecorded,
) -> Result<(), ExceptionError> {
    let id = recorded.exception_id;
    let tenant = recorded.tenant.clone();
    let events = record_events(recorded)?;
    let meta = metadata(tenant.as_ref());
    let encoded = log::encode(&events, &meta, codec)?;
    store
        .append_in(
            tx,
            &[StreamAppend {
                stream_id: exception_stream(id),
                expected: ExpectedVersion::NoStream,
                events: encoded,
            }],
        )
        .await
        .map_err(ExceptionError::Append)?;
    let exception = events.iter().fold(Exception::default(), evolve);
    upsert_row(tx, &exception).await?;
    for event in &events {
        if let ExceptionEvent::ExceptionRecorded(e) = event {
            metrics::counter!(
                "asiento_reconciliation_exceptions_total",
                "kind" => e.kind.as_str(),
                "resolution" => e.resolution.as_str()
            )
            .increment(1);
        }
    }
    Ok(())
}

/// Records an exception in its own transaction; `false` when it existed already.
pub async fn record(
    database: &Database,
    store: &dyn EventStore,
    recorded: ExceptionRecorded,
) -> Result<bool, ExceptionError> {
    if exists(store, recorded.exception_id).await? {
        return Ok(false);
    }
    let mut tx = database.begin().await?;
    match record_in(store, &mut tx, recorded).await {
        Ok(()) => {
            tx.commit().await?;
            Ok(true)
        }
        Err(ExceptionError::Append(error)) if log::is_conflict(&error) => Ok(false),
        Err(error) => Err(error),
    }
}

async fn load(
    store: &dyn EventStore,
    id: ExceptionId,
) -> Result<(Exception, Option<i64>), ExceptionError> {
    let stream = exception_stream(id);
    let raw = store
        .read_stream(&stream, 1, asiento_eventstore::READ_BATCH_MAX)
        .await?;
    let mut exception = Exception::default();
    let mut last_position = None;
    for recorded in raw {
        if recorded.version != exception.version + 1 {
            return Err(LogError::BrokenStream {
                stream_id: stream,
                version: recorded.version,
            }
            .into());
        }
        let event =
            ExceptionEvent::decode_raw(&recorded.event_type, recorded.schema, recorded.data.raw())
                .map_err(LogError::Decode)?;
        exception = evolve(exception, &event);
        last_position = Some(recorded.position);
    }
    Ok((exception, last_position))
}

/// `POST /v1/reconciliation/exceptions/{id}/resolve`: a person closes a manual exception. Another
/// tenant's exception (or a platform one, for a tenant) is `NotFound`.
pub async fn resolve(
    database: &Database,
    store: &dyn EventStore,
    scope: &Scope,
    id: ExceptionId,
    note: String,
    at: DateTime<Utc>,
) -> Result<ExceptionView, ExceptionError> {
    let (exception, _) = load(store, id).await?;
    let visible = match (&exception.record, scope) {
        (None, _) => false,
        (Some(_), Scope::All) => true,
        (Some(record), Scope::Tenant(tenant)) => record.recorded.tenant.as_ref() == Some(tenant),
        (Some(record), Scope::Platform) => record.recorded.tenant.is_none(),
    };
    if !visible {
        return Err(ExceptionError::Rejected(ExceptionRejection::NotFound));
    }
    let events = decide(&exception, ExceptionCommand::Resolve { note, at })
        .map_err(ExceptionError::Rejected)?;
    let tenant = exception
        .record
        .as_ref()
        .and_then(|record| record.recorded.tenant.clone());
    let meta = metadata(tenant.as_ref());
    let encoded = log::encode(&events, &meta, codec)?;
    let after = events.iter().fold(exception.clone(), evolve);
    let mut tx = database.begin().await?;
    store
        .append_in(
            &mut tx,
            &[StreamAppend {
                stream_id: exception_stream(id),
                expected: ExpectedVersion::Exact(exception.version),
                events: encoded,
            }],
        )
        .await
        .map_err(|error| {
            // Two people resolving at once: the second finds it resolved.
            if log::is_conflict(&error) {
                ExceptionError::Rejected(ExceptionRejection::AlreadyResolved)
            } else {
                ExceptionError::Append(error)
            }
        })?;
    upsert_row(&mut tx, &after).await?;
    tx.commit().await?;
    view_of(&after)
}

fn view_of(exception: &Exception) -> Result<ExceptionView, ExceptionError> {
    let record = exception
        .record
        .as_ref()
        .ok_or_else(|| ExceptionError::Inconsistent("an exception without its record".into()))?;
    let r = &record.recorded;
    Ok(ExceptionView {
        id: r.exception_id.to_string(),
        tenant: r.tenant.as_ref().map(ToString::to_string),
        payment_id: r.payment_id.map(|id| id.to_string()),
        provider: r.provider.to_string(),
        charge_id: r.charge_id.clone(),
        kind: r.kind.as_str().to_owned(),
        local: r.local.clone(),
        provider_state: r.provider_state.clone(),
        difference: r.difference.clone(),
        resolution: r.resolution.as_str().to_owned(),
        status: record.status.as_str().to_owned(),
        note: record.note.clone(),
        recorded_ms: r.at.timestamp_millis(),
        resolved_ms: record.resolved_at.map(|at| at.timestamp_millis()),
    })
}

/// Writes the read row of `exception` as its events leave it, inside the transaction that
/// appends them.
async fn upsert_row(tx: &mut Tx, exception: &Exception) -> Result<(), ExceptionError> {
    let view = view_of(exception)?;
    let version = i64::try_from(exception.version)
        .map_err(|_| ExceptionError::Inconsistent("version out of range".into()))?;
    let sql =
        "insert into reconciliation_exceptions (id, tenant, payment_id, provider, charge_id, \
               kind, resolution, status, local, provider_state, difference, note, recorded_ms, \
               resolved_ms, version) \
               values ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15) \
               on conflict (id) do update set status = excluded.status, note = excluded.note, \
               resolved_ms = excluded.resolved_ms, version = excluded.version";
    match tx {
        Tx::Postgres(tx) => {
            sqlx::query(sql)
                .bind(&view.id)
                .bind(&view.tenant)
                .bind(&view.payment_id)
                .bind(&view.provider)
                .bind(&view.charge_id)
                .bind(&view.kind)
                .bind(&view.resolution)
                .bind(&view.status)
                .bind(&view.local)
                .bind(&view.provider_state)
                .bind(&view.difference)
                .bind(&view.note)
                .bind(view.recorded_ms)
                .bind(view.resolved_ms)
                .bind(version)
                .execute(&mut **tx)
                .await?;
        }
        Tx::Sqlite(tx) => {
            sqlx::query(&sqlite(sql))
                .bind(&view.id)
                .bind(&view.tenant)
                .bind(&view.payment_id)
                .bind(&view.provider)
                .bind(&view.charge_id)
                .bind(&view.kind)
                .bind(&view.resolution)
                .bind(&view.status)
                .bind(view.local.to_string())
                .bind(view.provider_state.to_string())
                .bind(view.difference.to_string())
                .bind(&view.note)
                .bind(view.recorded_ms)
                .bind(view.resolved_ms)
                .bind(version)
                .execute(&mut **tx)
                .await?;
        }
    }
    Ok(())
}

type Row = (
    String,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
);

/// Exceptions of `scope`, optionally with `status`, oldest first, at most `limit` (clamped to
/// [`EXCEPTIONS_PAGE_MAX`]).
pub async fn list(
    database: &Database,
    scope: &Scope,
    status: Option<ExceptionStatus>,
    limit: i64,
) -> Result<Vec<ExceptionView>, ExceptionError> {
    let (scope_sql, tenant) = match scope {
        Scope::Tenant(tenant) => ("tenant = $1", Some(tenant.to_string())),
        Scope::Platform => ("tenant is null and $1 is null", None),
        Scope::All => ("($1 is null or true)", None),
    };
    select_where(
        database,
        &format!("{scope_sql} and ($2 is null or status = $2)"),
        [tenant.as_deref(), status.map(ExceptionStatus::as_str)],
        limit,
    )
    .await
}

/// The exceptions about payment `payment_id` of `tenant`, oldest first.
pub async fn of_payment(
    database: &Database,
    tenant: &TenantId,
    payment_id: &str,
) -> Result<Vec<ExceptionView>, ExceptionError> {
    select_where(
        database,
        "tenant = $1 and payment_id = $2",
        [Some(tenant.as_str()), Some(payment_id)],
        EXCEPTIONS_PAGE_MAX,
    )
    .await
}

/// Exception `id` if `scope` sees it (another tenant's, or a platform one for a tenant, is
/// `None`, as one that does not exist).
pub async fn get(
    database: &Database,
    scope: &Scope,
    id: &str,
) -> Result<Option<ExceptionView>, ExceptionError> {
    let found = select_where(database, "id = $1 and $2 is null", [Some(id), None], 1).await?;
    Ok(found.into_iter().next().filter(|view| match scope {
        Scope::All => true,
        Scope::Platform => view.tenant.is_none(),
        Scope::Tenant(tenant) => view.tenant.as_deref() == Some(tenant.as_str()),
    }))
}

/// The rows matching `condition` (on the text parameters `$1` and `$2`, either of which may be
/// compared with null), oldest first, at most `limit` (clamped to [`EXCEPTIONS_PAGE_MAX`]).
async fn select_where(
    database: &Database,
    condition: &str,
    [first, second]: [Option<&str>; 2],
    limit: i64,
) -> Result<Vec<ExceptionView>, ExceptionError> {
    let limit = limit.clamp(1, EXCEPTIONS_PAGE_MAX);
    let sql = format!(
        "select id, tenant, payment_id, provider, charge_id, kind, {{local}}, \
         {{provider_state}}, {{difference}}, resolution, status, note, recorded_ms, resolved_ms \
         from reconciliation_exceptions where {condition} order by recorded_ms, id limit $3"
    );
    let rows: Vec<Row> = match database {
        Database::Postgres(pool) => {
            // PostgreSQL needs a parameter's type where it is only compared with null.
            let sql = sql
                .replace("{local}", "local::text")
                .replace("{provider_state}", "provider_state::text")
                .replace("{difference}", "difference::text")
                .replace("$1 is null", "$1::text is null")
                .replace("$2 is null", "$2::text is null");
            sqlx::query_as(&sql)
                .bind(first)
                .bind(second)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            let sql = sqlite(
                &sql.replace("{local}", "local")
                    .replace("{provider_state}", "provider_state")
                    .replace("{difference}", "difference"),
            );
            sqlx::query_as(&sql)
                .bind(first)
                .bind(second)
                .bind(limit)
                .fetch_all(pool)
                .await?
        }
    };
    views(rows)
}

fn views(rows: Vec<Row>) -> Result<Vec<ExceptionView>, ExceptionError> {
    rows.into_iter()
        .map(
            |(
                id,
                tenant,
                payment_id,
                provider,
                charge_id,
                kind,
                local,
                provider_state,
                difference,
                resolution,
                status,
                note,
                recorded_ms,
                resolved_ms,
            )| {
                let json = |text: &str| {
                    serde_json::from_str(text).map_err(|error| {
                        ExceptionError::Inconsistent(format!("exception {id}: {error}"))
                    })
                };
                Ok(ExceptionView {
                    local: json(&local)?,
                    provider_state: json(&provider_state)?,
                    difference: json(&difference)?,
                    id: id.clone(),
                    tenant,
                    payment_id,
                    provider,
                    charge_id,
                    kind,
                    resolution,
                    status,
                    note,
                    recorded_ms,
                    resolved_ms,
                })
            },
        )
        .collect()
}

/// How many exceptions are open, in every scope: for the sweep summary.
pub async fn open_count(database: &Database) -> Result<i64, ExceptionError> {
    let sql = "select count(*) from reconciliation_exceptions where status = 'open'";
    let count: i64 = match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
    };
    Ok(count)
}
