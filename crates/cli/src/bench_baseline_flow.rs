//! The baseline's write paths (`bench_baseline.rs`): a payment, a refund and a webhook, each a
//! transaction or two of plain SQL around the provider's call, and the one state guard both the
//! answer and the webhook go through (`settle_payment`, `settle_refund`).

use asiento_psp::event::{EventType, WebhookEvent};
use asiento_psp::provider::{ChargeOutcome, CreateCharge, OperationKind, OperationStatus};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::AUTHORIZATION;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use sqlx::types::Json as SqlJson;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::Baseline;

/// The account the provider's money arrives on; the other side of every entry is the tenant's.
const CLEARING: &str = "psp:sim:clearing";

type Outcome = Result<Response, sqlx::Error>;

fn error(status: StatusCode, code: &str) -> Response {
    (status, Json(json!({ "code": code }))).into_response()
}

fn answer(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(body)).into_response()
}

/// A database error is the baseline's own failure: a 500, logged.
fn or_500(outcome: Outcome) -> Response {
    outcome.unwrap_or_else(|e| {
        tracing::error!(error = %e, "baseline: database error");
        error(StatusCode::INTERNAL_SERVER_ERROR, "internal")
    })
}

/// Whether the request's bearer key is the baseline's (its one tenant's).
fn authorized(baseline: &Baseline, headers: &HeaderMap) -> bool {
    headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .is_some_and(|key| key == &*baseline.api_key)
}

fn idempotency_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get("Idempotency-Key")
        .and_then(|value| value.to_str().ok())
        .filter(|key| !key.is_empty() && key.len() <= 255)
        .map(str::to_owned)
}

/// What a request's key found.
enum Claim {
    /// The key is this request's now.
    New,
    /// The key was there: its stored answer, a conflict while its request runs, or a misuse.
    Answered(Response),
}

/// Inserts the key first; a key already there answers what its request stored.
async fn claim(
    conn: &mut PgConnection,
    tenant: &str,
    key: &str,
    body: &[u8],
) -> Result<Claim, sqlx::Error> {
    let hash = hex::encode(Sha256::digest(body));
    let inserted = sqlx::query(
        "INSERT INTO baseline_keys (tenant, key, request_hash) VALUES ($1, $2, $3) \
         ON CONFLICT DO NOTHING",
    )
    .bind(tenant)
    .bind(key)
    .bind(&hash)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if inserted == 1 {
        return Ok(Claim::New);
    }
    let (stored, status, response): (String, Option<i32>, Option<SqlJson<Value>>) = sqlx::query_as(
        "SELECT request_hash, status, response FROM baseline_keys WHERE tenant = $1 AND key = $2",
    )
    .bind(tenant)
    .bind(key)
    .fetch_one(&mut *conn)
    .await?;
    Ok(Claim::Answered(match (status, response) {
        _ if stored != hash => error(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused"),
        (Some(status), Some(SqlJson(body))) => answer(u16::try_from(status).unwrap_or(500), body),
        _ => error(StatusCode::CONFLICT, "idempotency_key_in_use"),
    }))
}

async fn store_answer(
    conn: &mut PgConnection,
    tenant: &str,
    key: &str,
    status: u16,
    body: &Value,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE baseline_keys SET status = $3, response = $4 WHERE tenant = $1 AND key = $2",
    )
    .bind(tenant)
    .bind(key)
    .bind(i32::from(status))
    .bind(SqlJson(body))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

#[derive(Deserialize)]
struct NewPayment {
    amount_minor: i64,
    currency: String,
    customer: String,
    payment_method: String,
    #[serde(default)]
    description: Option<String>,
}

pub(super) async fn create_payment(
    State(baseline): State<Baseline>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    or_500(create(&baseline, &headers, &body).await)
}

async fn create(baseline: &Baseline, headers: &HeaderMap, body: &[u8]) -> Outcome {
    if !authorized(baseline, headers) {
        return Ok(error(StatusCode::UNAUTHORIZED, "unauthorized"));
    }
    let Some(key) = idempotency_key(headers) else {
        return Ok(error(StatusCode::BAD_REQUEST, "idempotency_key_missing"));
    };
    let Ok(new) = serde_json::from_slice::<NewPayment>(body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid_request"));
    };
    if new.amount_minor <= 0 || new.currency.len() != 3 {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid_request"));
    }
    let tenant = &*baseline.tenant;
    let id = Uuid::new_v4();
    let mut tx = baseline.pool.begin().await?;
    if let Claim::Answered(response) = claim(&mut tx, tenant, &key, body).await? {
        return Ok(response);
    }
    let now = Utc::now();
    sqlx::query(
        "INSERT INTO baseline_payments \
         (id, tenant, customer, amount_minor, currency, status, description, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7, $7)",
    )
    .bind(id)
    .bind(tenant)
    .bind(&new.customer)
    .bind(new.amount_minor)
    .bind(&new.currency)
    .bind(&new.description)
    .bind(now)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let outcome = baseline
        .provider
        .create_charge(&CreateCharge {
            idempotency_key: format!("psp_{id}"),
            amount_minor: new.amount_minor,
            currency: new.currency.clone(),
            payment_method: new.payment_method.clone(),
            capture: true,
            reference: Some(id.to_string()),
            customer: Some(new.customer.clone()),
            metadata: Default::default(),
        })
        .await;
    let (status, charge) = match outcome {
        ChargeOutcome::Succeeded(charge) => ("succeeded", Some(charge.id)),
        ChargeOutcome::Authorized(charge) => ("authorized", Some(charge.id)),
        ChargeOutcome::RequiresAction(charge) => ("requires_action", Some(charge.id)),
        ChargeOutcome::Declined(charge) => ("failed", Some(charge.id)),
        ChargeOutcome::Rejected(_) => ("failed", None),
        ChargeOutcome::Unknown { .. } => ("pending", None),
    };
    let mut tx = baseline.pool.begin().await?;
    let payment = settle_payment(&mut tx, id, status, charge.as_deref())
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let code = if payment.pending() { 202 } else { 201 };
    let body = payment.json();
    store_answer(&mut tx, tenant, &key, code, &body).await?;
    tx.commit().await?;
    Ok(answer(code, body))
}

/// A payment row as the answers show it.
struct Payment {
    id: Uuid,
    amount_minor: i64,
    currency: String,
    customer: String,
    status: String,
    refunded_minor: i64,
    created_at: DateTime<Utc>,
}

impl Payment {
    fn pending(&self) -> bool {
        matches!(self.status.as_str(), "pending" | "requires_action")
    }

    fn json(&self) -> Value {
        json!({
            "id": self.id,
            "object": "payment",
            "amount_minor": self.amount_minor,
            "currency": self.currency,
            "customer": self.customer,
            "status": self.status,
            "refunded_minor": self.refunded_minor,
            "created_at": self.created_at,
        })
    }
}

/// The state guard of a payment: under its lock, a pending payment moves to `status` (with its
/// entries when it succeeded); a payment already moved stays as it is. Answers it as it stands;
/// None for a payment the baseline does not have.
async fn settle_payment(
    conn: &mut PgConnection,
    id: Uuid,
    status: &str,
    charge: Option<&str>,
) -> Result<Option<Payment>, sqlx::Error> {
    let Some(row) = sqlx::query(
        "SELECT tenant, amount_minor, currency, customer, status, refunded_minor, created_at \
         FROM baseline_payments WHERE id = $1 FOR UPDATE",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?
    else {
        return Ok(None);
    };
    let tenant: String = row.try_get("tenant")?;
    let mut payment = Payment {
        id,
        amount_minor: row.try_get("amount_minor")?,
        currency: row.try_get("currency")?,
        customer: row.try_get("customer")?,
        status: row.try_get("status")?,
        refunded_minor: row.try_get("refunded_minor")?,
        created_at: row.try_get("created_at")?,
    };
    if !payment.pending() || status == payment.status {
        return Ok(Some(payment));
    }
    if status == "succeeded" {
        sqlx::query(
            "INSERT INTO baseline_entries (payment_id, account, currency, amount_minor) \
             VALUES ($1, $2, $3, $4), ($1, $5, $3, $6)",
        )
        .bind(id)
        .bind(CLEARING)
        .bind(&payment.currency)
        .bind(payment.amount_minor)
        .bind(format!("merchant:{tenant}"))
        .bind(-payment.amount_minor)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(
        "UPDATE baseline_payments SET status = $2, charge_id = COALESCE($3, charge_id), \
         updated_at = now() WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(charge)
    .execute(&mut *conn)
    .await?;
    payment.status = status.to_owned();
    Ok(Some(payment))
}

#[derive(Deserialize)]
struct NewRefund {
    amount_minor: i64,
}

pub(super) async fn create_refund(
    State(baseline): State<Baseline>,
    Path(payment): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    or_500(refund(&baseline, &payment, &headers, &body).await)
}

async fn refund(baseline: &Baseline, payment: &str, headers: &HeaderMap, body: &[u8]) -> Outcome {
    if !authorized(baseline, headers) {
        return Ok(error(StatusCode::UNAUTHORIZED, "unauthorized"));
    }
    let Some(key) = idempotency_key(headers) else {
        return Ok(error(StatusCode::BAD_REQUEST, "idempotency_key_missing"));
    };
    let (Ok(payment), Ok(new)) = (
        Uuid::parse_str(payment),
        serde_json::from_slice::<NewRefund>(body),
    ) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid_request"));
    };
    if new.amount_minor <= 0 {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid_request"));
    }
    let tenant = &*baseline.tenant;
    let id = Uuid::new_v4();
    let mut tx = baseline.pool.begin().await?;
    if let Claim::Answered(response) = claim(&mut tx, tenant, &key, body).await? {
        return Ok(response);
    }
    // What is left to refund, under the payment's lock; a refusal rolls the key back too.
    let found: Option<(String, i64, i64, String, Option<String>)> = sqlx::query_as(
        "SELECT status, amount_minor, refunded_minor, currency, charge_id \
         FROM baseline_payments WHERE id = $1 AND tenant = $2 FOR UPDATE",
    )
    .bind(payment)
    .bind(tenant)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((status, amount, refunded, currency, Some(charge))) = found else {
        return Ok(error(StatusCode::NOT_FOUND, "payment_not_found"));
    };
    if status != "succeeded" {
        return Ok(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "payment_not_refundable",
        ));
    }
    if new.amount_minor > amount - refunded {
        return Ok(error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "refund_exceeds_captured",
        ));
    }
    sqlx::query(
        "UPDATE baseline_payments SET refunded_minor = refunded_minor + $2, updated_at = now() \
         WHERE id = $1",
    )
    .bind(payment)
    .bind(new.amount_minor)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "INSERT INTO baseline_refunds (id, payment_id, amount_minor, status, created_at, updated_at) \
         VALUES ($1, $2, $3, 'pending', now(), now())",
    )
    .bind(id)
    .bind(payment)
    .bind(new.amount_minor)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    let outcome = baseline
        .provider
        .refund(&charge, new.amount_minor, &currency, &format!("psp_{id}"))
        .await;
    let (status, operation) = match outcome {
        Ok(answer) => (
            refund_status(answer.operation.status),
            Some(answer.operation.id),
        ),
        Err(_) => ("pending", None),
    };
    let mut tx = baseline.pool.begin().await?;
    let status = settle_refund(&mut tx, id, status, operation.as_deref())
        .await?
        .ok_or(sqlx::Error::RowNotFound)?;
    let code = if status == "pending" { 202 } else { 201 };
    let body = json!({
        "id": id,
        "object": "refund",
        "payment_id": payment,
        "amount_minor": new.amount_minor,
        "currency": currency,
        "status": status,
    });
    store_answer(&mut tx, tenant, &key, code, &body).await?;
    tx.commit().await?;
    Ok(answer(code, body))
}

fn refund_status(status: OperationStatus) -> &'static str {
    match status {
        OperationStatus::Pending => "pending",
        OperationStatus::Succeeded => "succeeded",
        OperationStatus::Failed | OperationStatus::Reversed => "failed",
    }
}

/// The state guard of a refund: under its lock, a pending refund moves to `status` (with its
/// entries when it succeeded; a failed one gives its amount back to the payment); one already
/// moved stays as it is. Answers its status as it stands; None for a refund the baseline does not
/// have.
async fn settle_refund(
    conn: &mut PgConnection,
    id: Uuid,
    status: &str,
    operation: Option<&str>,
) -> Result<Option<String>, sqlx::Error> {
    let found: Option<(String, Uuid, i64, String, String)> = sqlx::query_as(
        "SELECT r.status, r.payment_id, r.amount_minor, p.currency, p.tenant \
         FROM baseline_refunds r JOIN baseline_payments p ON p.id = r.payment_id \
         WHERE r.id = $1 FOR UPDATE OF r",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((current, payment, amount, currency, tenant)) = found else {
        return Ok(None);
    };
    if current != "pending" || status == "pending" {
        return Ok(Some(current));
    }
    if status == "succeeded" {
        sqlx::query(
            "INSERT INTO baseline_entries (payment_id, refund_id, account, currency, amount_minor) \
             VALUES ($1, $2, $3, $4, $5), ($1, $2, $6, $4, $7)",
        )
        .bind(payment)
        .bind(id)
        .bind(CLEARING)
        .bind(&currency)
        .bind(-amount)
        .bind(format!("merchant:{tenant}"))
        .bind(amount)
        .execute(&mut *conn)
        .await?;
    } else {
        sqlx::query(
            "UPDATE baseline_payments SET refunded_minor = refunded_minor - $2, updated_at = now() \
             WHERE id = $1",
        )
        .bind(payment)
        .bind(amount)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query(
        "UPDATE baseline_refunds SET status = $2, operation_id = COALESCE($3, operation_id), \
         updated_at = now() WHERE id = $1",
    )
    .bind(id)
    .bind(status)
    .bind(operation)
    .execute(&mut *conn)
    .await?;
    Ok(Some(status.to_owned()))
}

pub(super) async fn receive_webhook(
    State(baseline): State<Baseline>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    or_500(webhook(&baseline, &headers, &body).await)
}

async fn webhook(baseline: &Baseline, headers: &HeaderMap, body: &[u8]) -> Outcome {
    let signed = headers
        .get(asiento_psp::SIGNATURE_HEADER)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|header| {
            asiento_psp::verify(
                &baseline.webhook_secret,
                header,
                body,
                Utc::now().timestamp(),
                asiento_psp::TOLERANCE_S_DEFAULT,
            )
            .is_ok()
        });
    if !signed {
        return Ok(error(StatusCode::BAD_REQUEST, "signature_invalid"));
    }
    let Ok(event) = asiento_psp::event::read(body) else {
        return Ok(error(StatusCode::BAD_REQUEST, "invalid_request"));
    };
    let mut tx = baseline.pool.begin().await?;
    let stored = sqlx::query(
        "INSERT INTO baseline_webhooks (event_id, event_type) VALUES ($1, $2) \
         ON CONFLICT DO NOTHING",
    )
    .bind(&event.id)
    .bind(event.kind.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if stored == 1 {
        apply(&mut tx, &event).await?;
    }
    tx.commit().await?;
    Ok(StatusCode::OK.into_response())
}

/// What an event moves, through the state guards: a payment's charge decided, a refund decided.
/// Events of payments or refunds the baseline does not have are stored and left.
async fn apply(conn: &mut PgConnection, event: &WebhookEvent) -> Result<(), sqlx::Error> {
    let payment = event
        .data
        .payment_ref()
        .and_then(|reference| Uuid::parse_str(reference).ok());
    let charge = event.data.charge.as_ref().map(|charge| charge.id.as_str());
    match (event.kind, payment, &event.data.operation) {
        (EventType::ChargeSucceeded | EventType::ChargeCaptured, Some(payment), _) => {
            settle_payment(conn, payment, "succeeded", charge).await?;
        }
        (EventType::ChargeFailed, Some(payment), _) => {
            settle_payment(conn, payment, "failed", charge).await?;
        }
        (EventType::OperationUpdated | EventType::ChargeRefunded, _, Some(operation))
            if operation.kind == OperationKind::Refund =>
        {
            let refund = operation
                .idempotency_key
                .strip_prefix("psp_")
                .and_then(|id| Uuid::parse_str(id).ok());
            if let Some(refund) = refund {
                let status = refund_status(operation.status);
                settle_refund(conn, refund, status, Some(&operation.id)).await?;
            }
        }
        _ => {}
    }
    Ok(())
}
