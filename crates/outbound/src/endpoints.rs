//! A tenant's webhook endpoints: registered, listed, deleted, their secret rotated, enabled
//! again after they were disabled. Registration and rotation are idempotent like every write
//! (the key's claim and the stored answer commit with the change), and the secret is shown only
//! in their answers.

use asiento_app::idempotency::{self, Claim, StoredResponse};
use asiento_app::payments::Idempotent;
use asiento_app::reply::Answer;
use asiento_eventstore::{Database, Tx};
use asiento_merchant_events::EventKind;
use rand::RngCore;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::url_policy::UrlPolicy;
use crate::OutboundError;

/// The longest description an endpoint may have.
pub const DESCRIPTION_CHARS_MAX: usize = 500;
/// Endpoints one tenant may have (deleted ones do not count).
pub const ENDPOINTS_PER_TENANT_MAX: i64 = 16;
/// How long the previous secret stays valid after a rotation, at most.
pub const PREVIOUS_SECRET_S_MAX: i64 = 7 * 24 * 3_600;

/// What every subscription to every type is written as.
pub const EVERY_TYPE: &str = "*";

/// One endpoint as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub id: String,
    pub tenant: String,
    pub url: String,
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
    /// `enabled`, or `disabled` once every delivery failed for the retry window (three days by
    /// default), until it is enabled again.
    pub status: String,
    pub disabled_reason: Option<String>,
    pub created_ms: i64,
}

impl Endpoint {
    /// Whether an event of this type goes to this endpoint.
    #[must_use]
    pub fn wants(&self, event_type: &str) -> bool {
        self.enabled_events
            .iter()
            .any(|t| t == EVERY_TYPE || t == event_type)
    }

    /// The endpoint object of API.md; the secret only where it is shown.
    #[must_use]
    pub fn json(&self, secret: Option<&str>) -> Value {
        let mut object = json!({
            "id": self.id,
            "object": "webhook_endpoint",
            "url": self.url,
            "enabled_events": self.enabled_events,
            "description": self.description,
            "status": self.status,
            "disabled_reason": self.disabled_reason,
            "created_at": time(self.created_ms),
        });
        if let Some(secret) = secret {
            object["secret"] = Value::from(secret);
        }
        object
    }
}

fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|at| asiento_objects::time(&at))
        .unwrap_or_default()
}

/// A registration as the client asked for it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewEndpoint {
    pub url: String,
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
}

/// Checks a registration: the URL against the policy (resolving its name), each type a known
/// one (or `*` alone), the description's length.
pub async fn check(
    policy: &UrlPolicy,
    url: &str,
    enabled_events: Vec<String>,
    description: Option<String>,
) -> Result<NewEndpoint, OutboundError> {
    policy.check(url).await.map_err(OutboundError::UrlRefused)?;
    if enabled_events.is_empty() {
        return Err(OutboundError::Invalid(
            "enabled_events: name at least one type, or \"*\"".into(),
        ));
    }
    for kind in &enabled_events {
        let every = kind == EVERY_TYPE && enabled_events.len() == 1;
        if !every && EventKind::parse(kind).is_none() {
            return Err(OutboundError::Invalid(format!(
                "enabled_events: unknown type {kind:?}"
            )));
        }
    }
    if description
        .as_ref()
        .is_some_and(|d| d.chars().count() > DESCRIPTION_CHARS_MAX)
    {
        return Err(OutboundError::Invalid(format!(
            "description: at most {DESCRIPTION_CHARS_MAX} characters"
        )));
    }
    let mut enabled_events = enabled_events;
    enabled_events.sort();
    enabled_events.dedup();
    Ok(NewEndpoint {
        url: url.to_owned(),
        enabled_events,
        description,
    })
}

/// A fresh signing secret: `whsec_` and 32 random bytes in hex.
#[must_use]
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("whsec_{}", hex::encode(bytes))
}

/// Runs a database statement on either backend (the text uses `$n`, which both accept).
macro_rules! on_tx {
    ($tx:expr, $conn:ident => $body:expr) => {
        match $tx {
            asiento_eventstore::Tx::Postgres(t) => {
                let $conn = &mut **t;
                $body
            }
            asiento_eventstore::Tx::Sqlite(t) => {
                let $conn = &mut **t;
                $body
            }
        }
    };
}
pub(crate) use on_tx;

macro_rules! on_db {
    ($db:expr, $pool:ident => $body:expr) => {
        match $db {
            asiento_eventstore::Database::Postgres($pool) => $body,
            asiento_eventstore::Database::Sqlite($pool) => $body,
        }
    };
}
pub(crate) use on_db;

type EndpointRow = (
    String,
    String,
    String,
    String,
    Option<String>,
    String,
    Option<String>,
    i64,
);

const COLUMNS: &str =
    "id, tenant, url, enabled_events, description, status, disabled_reason, created_ms";

fn endpoint_of(row: EndpointRow) -> Result<Endpoint, OutboundError> {
    let (id, tenant, url, events, description, status, disabled_reason, created_ms) = row;
    let enabled_events = serde_json::from_str(&events)
        .map_err(|_| OutboundError::Corrupt(format!("endpoint {id}: enabled_events")))?;
    Ok(Endpoint {
        id,
        tenant,
        url,
        enabled_events,
        description,
        status,
        disabled_reason,
        created_ms,
    })
}

/// What a claim that is not this request's to work on answers.
fn without_work(claim: Claim) -> Answer {
    match claim {
        Claim::Completed(response) => Answer::Replayed(response),
        Claim::InProgress { retry_after_s } => Answer::InProgress { retry_after_s },
        Claim::KeyReused => Answer::KeyReused,
        Claim::Fresh { .. } | Claim::Resumed { .. } => Answer::InProgress { retry_after_s: 1 },
    }
}

fn stored(status: u16, body: &Value) -> StoredResponse {
    StoredResponse {
        status,
        body: serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec()),
    }
}

/// The idempotency lease of these writes (they take milliseconds).
const LEASE_MS: i64 = 30_000;

/// Registers an endpoint; its answer (201, with the secret) is stored with the key.
pub async fn create(
    db: &Database,
    tenant: &str,
    request: &Idempotent,
    new: NewEndpoint,
    now_ms: i64,
) -> Result<Answer, OutboundError> {
    let fresh_id = format!("we_{}", Uuid::new_v4().simple());
    let mut tx = db.begin().await?;
    let claim = idempotency::claim(
        &mut tx,
        &request.scope,
        &request.key,
        request.body,
        &fresh_id,
        now_ms,
        LEASE_MS,
    )
    .await?;
    let (lease, id) = match claim {
        Claim::Fresh { lease } => (lease, fresh_id),
        Claim::Resumed { lease, resource_id } => (lease, resource_id),
        other => {
            tx.rollback().await?;
            return Ok(without_work(other));
        }
    };
    let count: i64 = on_tx!(&mut tx, conn => sqlx::query_scalar(
        "select count(*) from webhook_endpoints where tenant = $1 and status <> 'deleted'",
    )
    .bind(tenant)
    .fetch_one(conn)
    .await?);
    let response = if count >= ENDPOINTS_PER_TENANT_MAX {
        let problem = json!({
            "type": "about:blank", "title": "Unprocessable Content", "status": 422,
            "code": "webhook_endpoints_limit",
            "detail": format!("a tenant may have at most {ENDPOINTS_PER_TENANT_MAX} endpoints"),
        });
        stored(422, &problem)
    } else {
        let endpoint = Endpoint {
            id: id.clone(),
            tenant: tenant.to_owned(),
            url: new.url,
            enabled_events: new.enabled_events,
            description: new.description,
            status: "enabled".to_owned(),
            disabled_reason: None,
            created_ms: now_ms,
        };
        let events = serde_json::to_string(&endpoint.enabled_events)
            .map_err(|e| OutboundError::Corrupt(e.to_string()))?;
        let secret = new_secret();
        on_tx!(&mut tx, conn => sqlx::query(
            "insert into webhook_endpoints (id, tenant, url, enabled_events, description, status, \
             created_ms) values ($1, $2, $3, $4, $5, 'enabled', $6)",
        )
        .bind(&endpoint.id)
        .bind(tenant)
        .bind(&endpoint.url)
        .bind(&events)
        .bind(&endpoint.description)
        .bind(now_ms)
        .execute(conn)
        .await?
        .rows_affected());
        insert_secret(&mut tx, &endpoint.id, &secret, now_ms).await?;
        stored(201, &endpoint.json(Some(&secret)))
    };
    idempotency::complete(
        &mut tx,
        &request.scope,
        &request.key,
        lease,
        &response,
        now_ms,
    )
    .await?;
    tx.commit().await?;
    Ok(Answer::Done(response))
}

async fn insert_secret(
    tx: &mut Tx,
    endpoint: &str,
    secret: &str,
    now_ms: i64,
) -> Result<(), OutboundError> {
    on_tx!(tx, conn => sqlx::query(
        "insert into webhook_endpoint_secrets (endpoint_id, secret, created_ms) values ($1, $2, $3)",
    )
    .bind(endpoint)
    .bind(secret)
    .bind(now_ms)
    .execute(conn)
    .await?
    .rows_affected());
    Ok(())
}

/// A new secret for the endpoint; the current one stays valid for `previous_valid_s` more
/// seconds (0: it ends now). The answer (with the new secret) is stored with the key.
pub async fn rotate(
    db: &Database,
    tenant: &str,
    id: &str,
    request: &Idempotent,
    previous_valid_s: i64,
    now_ms: i64,
) -> Result<Answer, OutboundError> {
    let mut tx = db.begin().await?;
    let claim = idempotency::claim(
        &mut tx,
        &request.scope,
        &request.key,
        request.body,
        id,
        now_ms,
        LEASE_MS,
    )
    .await?;
    let lease = match claim {
        Claim::Fresh { lease } | Claim::Resumed { lease, .. } => lease,
        other => {
            tx.rollback().await?;
            return Ok(without_work(other));
        }
    };
    let Some(endpoint) = find_in(&mut tx, tenant, id).await? else {
        // Nothing is stored for a 404: the key stays free for a request that names a real one.
        tx.rollback().await?;
        return Err(OutboundError::NotFound);
    };
    let until = now_ms.saturating_add(previous_valid_s.saturating_mul(1_000));
    on_tx!(&mut tx, conn => sqlx::query(
        "update webhook_endpoint_secrets set expires_ms = $2 \
         where endpoint_id = $1 and (expires_ms is null or expires_ms > $2)",
    )
    .bind(id)
    .bind(until)
    .execute(conn)
    .await?
    .rows_affected());
    let secret = new_secret();
    insert_secret(&mut tx, id, &secret, now_ms).await?;
    let response = stored(200, &endpoint.json(Some(&secret)));
    idempotency::complete(
        &mut tx,
        &request.scope,
        &request.key,
        lease,
        &response,
        now_ms,
    )
    .await?;
    tx.commit().await?;
    Ok(Answer::Done(response))
}

/// One of a tenant's endpoints that is not deleted, by id.
fn one_endpoint_sql() -> String {
    format!(
        "select {COLUMNS} from webhook_endpoints where id = $1 and tenant = $2 \
         and status <> 'deleted'"
    )
}

async fn find_in(tx: &mut Tx, tenant: &str, id: &str) -> Result<Option<Endpoint>, OutboundError> {
    let sql = one_endpoint_sql();
    let row: Option<EndpointRow> = on_tx!(tx, conn => sqlx::query_as(&sql)
        .bind(id)
        .bind(tenant)
        .fetch_optional(conn)
        .await?);
    row.map(endpoint_of).transpose()
}

/// One of the tenant's endpoints; None for another tenant's, a deleted or an unknown one.
pub async fn find(
    db: &Database,
    tenant: &str,
    id: &str,
) -> Result<Option<Endpoint>, OutboundError> {
    let sql = one_endpoint_sql();
    let row: Option<EndpointRow> = on_db!(db, pool => sqlx::query_as(&sql)
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await?);
    row.map(endpoint_of).transpose()
}

/// The tenant's endpoints, oldest first.
pub async fn list(db: &Database, tenant: &str) -> Result<Vec<Endpoint>, OutboundError> {
    let sql = format!(
        "select {COLUMNS} from webhook_endpoints where tenant = $1 and status <> 'deleted' \
         order by created_ms, id"
    );
    let rows: Vec<EndpointRow> = on_db!(db, pool => sqlx::query_as(&sql)
        .bind(tenant)
        .fetch_all(pool)
        .await?);
    rows.into_iter().map(endpoint_of).collect()
}

/// Every enabled endpoint, for the dispatcher.
pub async fn enabled(db: &Database) -> Result<Vec<Endpoint>, OutboundError> {
    let sql = format!("select {COLUMNS} from webhook_endpoints where status = 'enabled'");
    let rows: Vec<EndpointRow> = on_db!(db, pool => sqlx::query_as(&sql).fetch_all(pool).await?);
    rows.into_iter().map(endpoint_of).collect()
}

/// Deletes the endpoint: nothing more is sent to it, and its pending deliveries end.
pub async fn delete(db: &Database, tenant: &str, id: &str) -> Result<bool, OutboundError> {
    let mut tx = db.begin().await?;
    let changed = on_tx!(&mut tx, conn => sqlx::query(
        "update webhook_endpoints set status = 'deleted' where id = $1 and tenant = $2 \
         and status <> 'deleted'",
    )
    .bind(id)
    .bind(tenant)
    .execute(conn)
    .await?
    .rows_affected());
    on_tx!(&mut tx, conn => sqlx::query(
        "update webhook_deliveries set status = 'failed', last_error = 'endpoint deleted' \
         where endpoint_id = $1 and status = 'pending'",
    )
    .bind(id)
    .execute(conn)
    .await?
    .rows_affected());
    tx.commit().await?;
    Ok(changed == 1)
}

/// Enables a disabled endpoint again; deliveries that waited for it go out.
pub async fn enable(
    db: &Database,
    tenant: &str,
    id: &str,
) -> Result<Option<Endpoint>, OutboundError> {
    on_db!(db, pool => sqlx::query(
        "update webhook_endpoints set status = 'enabled', disabled_reason = null, \
         disabled_ms = null, failing_since_ms = null where id = $1 and tenant = $2 \
         and status = 'disabled'",
    )
    .bind(id)
    .bind(tenant)
    .execute(pool)
    .await?
    .rows_affected());
    find(db, tenant, id).await
}

/// The secrets valid at `now_ms` for each endpoint named, current one first.
pub async fn secrets(
    db: &Database,
    endpoint: &str,
    now_ms: i64,
) -> Result<Vec<String>, OutboundError> {
    let rows: Vec<String> = on_db!(db, pool => sqlx::query_scalar(
        "select secret from webhook_endpoint_secrets \
         where endpoint_id = $1 and (expires_ms is null or expires_ms > $2) \
         order by created_ms desc",
    )
    .bind(endpoint)
    .bind(now_ms)
    .fetch_all(pool)
    .await?);
    Ok(rows)
}
