//! Idempotency records: the client's `Idempotency-Key`, claimed insert-first.
//!
//! The primary key (tenant, method, route, key) is the lock: the first request inserts its record
//! in the same transaction as the first event it appends, so a claimed key always has its work
//! recorded and an unclaimed key has none. Every later request with the key finds the row and is
//! answered from it: a replay of the stored response, 422 for another body, 409 while the first
//! is in flight. A request whose process died leaves an in-flight record whose lease runs out; the
//! next retry takes the lease over (compare-and-set on the old owner) and resumes the work of the
//! `resource_id` the first request chose, so a key is never stuck and work is never done twice.

use asiento_eventstore::Tx;
use sha2::{Digest, Sha256};
use sqlx::error::BoxDynError;
use sqlx::postgres::PgArguments;
use sqlx::Arguments;
use uuid::Uuid;

/// Keys longer than this are refused (API.md: 1–255 printable ASCII characters).
pub const KEY_LENGTH_MAX: usize = 255;

/// A validated client idempotency key: 1–255 printable ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    #[error("the Idempotency-Key header is empty")]
    Empty,
    #[error("the Idempotency-Key header is longer than {KEY_LENGTH_MAX} characters")]
    TooLong,
    #[error("the Idempotency-Key header may hold only printable ASCII characters")]
    NotPrintableAscii,
}

impl IdempotencyKey {
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        if raw.is_empty() {
            return Err(KeyError::Empty);
        }
        if !raw.bytes().all(|byte| (0x20..=0x7e).contains(&byte)) {
            return Err(KeyError::NotPrintableAscii);
        }
        if raw.len() > KEY_LENGTH_MAX {
            return Err(KeyError::TooLong);
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Keys are scoped by tenant, method and route: the same key on two routes is two keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub tenant: String,
    pub method: String,
    /// The route template (`/v1/payments/{id}/refunds`) with the path's ids filled in, so that the
    /// same key used against two payments is two keys.
    pub route: String,
}

/// SHA-256 of a request body's canonical form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyHash(pub [u8; 32]);

/// Hashes the canonical form of a JSON body: objects with their keys sorted, no insignificant
/// whitespace. Two bodies that differ only in key order or spacing hash the same.
pub fn canonical_body_hash(body: &serde_json::Value) -> BodyHash {
    let mut canonical = Vec::with_capacity(512);
    write_canonical(body, &mut canonical);
    BodyHash(Sha256::digest(&canonical).into())
}

/// Writes `value` with object keys in byte order, whatever order the map iterates in (serde_json
/// keeps insertion order when any crate in the build enables its `preserve_order` feature).
/// Keys and scalars are written by serde_json's compact writer, as `Value`'s `Display` does,
/// straight into `out` (this runs for every request body and, in the sealer, every event).
fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by_key(|(key, _)| *key);
            out.push(b'{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_compact(key, out);
                out.push(b':');
                write_canonical(item, out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => write_compact(scalar, out),
    }
}

/// A string or a scalar `Value` in serde_json's compact form. Into memory this cannot fail:
/// serde_json fails only on the writer's I/O errors (none for a `Vec`) and on what a `Value`
/// cannot hold (non-string keys, non-finite numbers).
fn write_compact<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    let written = serde_json::to_writer(&mut *out, value);
    debug_assert!(written.is_ok(), "compact JSON into memory failed");
}

/// A response stored on a completed record and replayed byte for byte.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Who holds an in-flight key, and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub owner: Uuid,
    pub expires_ms: i64,
}

impl Lease {
    /// A new holder's lease, `lease_ms` from `now_ms`.
    pub fn new(now_ms: i64, lease_ms: i64) -> Lease {
        Lease {
            owner: Uuid::new_v4(),
            expires_ms: now_ms.saturating_add(lease_ms),
        }
    }
}

/// What a request may do with its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// The key is new: this request holds it and does the work for `resource_id`.
    Fresh { lease: Lease },
    /// An earlier request died mid-flight and its lease ran out: this request now holds the key and
    /// resumes the work of `resource_id`, which the earlier request chose.
    Resumed { lease: Lease, resource_id: String },
    /// The work is done: replay its response.
    Completed(StoredResponse),
    /// Another request holds the key: answer 409 with `Retry-After`.
    InProgress { retry_after_s: u64 },
    /// The key was used with another body: answer 422.
    KeyReused,
}

#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    /// The lease ran out and another request took the key over; this one must not store anything.
    #[error("the idempotency lease was lost to another request")]
    LeaseLost,
    #[error("idempotency record is inconsistent: {0}")]
    Corrupt(&'static str),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// One stored record, as read back.
#[derive(Clone, Debug)]
struct Record {
    body_sha256: Vec<u8>,
    resource_id: String,
    completed: bool,
    lease_owner: Uuid,
    lease_expires_ms: i64,
    response_status: Option<i32>,
    response_body: Option<Vec<u8>>,
}

/// Claims `key` inside `tx`, which the caller commits together with the first event of the work.
/// `resource_id` is what a fresh claim records as its work (the payment id it will create).
pub async fn claim(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
    body: BodyHash,
    resource_id: &str,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Claim, IdempotencyError> {
    let lease = Lease::new(now_ms, lease_ms);
    if insert_fresh(tx, scope, key, body, resource_id, lease, now_ms).await? {
        return Ok(Claim::Fresh { lease });
    }
    let record = read(tx, scope, key)
        .await?
        .ok_or(IdempotencyError::Corrupt("a conflicting record vanished"))?;
    if record.body_sha256 != body.0 {
        return Ok(Claim::KeyReused);
    }
    if record.completed {
        let (Some(status), Some(body)) = (record.response_status, record.response_body) else {
            return Err(IdempotencyError::Corrupt("completed without a response"));
        };
        let status = u16::try_from(status)
            .map_err(|_| IdempotencyError::Corrupt("stored status out of range"))?;
        return Ok(Claim::Completed(StoredResponse { status, body }));
    }
    if record.lease_expires_ms > now_ms {
        let wait_ms = record.lease_expires_ms - now_ms;
        let retry_after_s = u64::try_from(wait_ms.div_euclid(1000) + 1).unwrap_or(1);
        return Ok(Claim::InProgress { retry_after_s });
    }
    // The holder's lease ran out: take the key over, but only from that holder, so that two
    // retries racing for an expired key cannot both win.
    let taken = take_over(tx, scope, key, record.lease_owner, lease).await?;
    if taken {
        Ok(Claim::Resumed {
            lease,
            resource_id: record.resource_id,
        })
    } else {
        Ok(Claim::InProgress { retry_after_s: 1 })
    }
}

/// A key to claim as new (group commit: see `crate::commit`).
#[derive(Debug, Clone)]
pub struct FreshClaim {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub body: BodyHash,
    pub resource_id: String,
    pub lease: Lease,
    pub now_ms: i64,
}

/// A held key to complete with its response (group commit).
#[derive(Debug, Clone)]
pub struct Completing {
    pub scope: Scope,
    pub key: IdempotencyKey,
    pub lease: Lease,
    pub response: StoredResponse,
    pub now_ms: i64,
}

/// Claims each key that nobody has claimed yet, inside `tx`: `true` for those now held (with the
/// claim's lease), `false` for a key that exists (the caller claims it the usual way, which
/// tells a replay, a key in flight or a reused key apart). One statement on PostgreSQL, its rows
/// in key order (concurrent batches then wait for each other in one order: no deadlock).
pub async fn claim_fresh_each(
    tx: &mut Tx,
    claims: &[FreshClaim],
) -> Result<Vec<bool>, IdempotencyError> {
    let Tx::Postgres(conn) = tx else {
        // SQLite runs in process: a statement per key costs no round trip.
        let mut held = Vec::with_capacity(claims.len());
        for c in claims {
            let fresh = insert_fresh(
                tx,
                &c.scope,
                &c.key,
                c.body,
                &c.resource_id,
                c.lease,
                c.now_ms,
            );
            held.push(fresh.await?);
        }
        return Ok(held);
    };
    let mut arguments = PgArguments::default();
    add_claims(&mut arguments, claims.iter().zip(0..)).map_err(sqlx::Error::Encode)?;
    let sql = format!(
        "WITH {} SELECT lease_owner FROM claimed",
        claims_ctes(1, "true")
    );
    let owners: Vec<Uuid> = sqlx::query_scalar_with(&sql, arguments)
        .fetch_all(&mut **conn)
        .await?;
    Ok(claims
        .iter()
        .map(|c| owners.contains(&c.lease.owner))
        .collect())
}

/// The CTEs `claim_input` (the claims, each with `step`, a caller's index) and `claimed` (the
/// insert of those for which `filter`, a condition on `step`, holds as fresh in-flight records,
/// in key order, skipping keys that exist, `RETURNING lease_owner`), without `WITH`, reading
/// [`add_claims`]'s ten arrays from `$first` on.
pub(crate) fn claims_ctes(first: usize, filter: &str) -> String {
    format!(
        "claim_input AS ({}), \
         claimed AS (insert into idempotency_keys (tenant, method, route, key, body_sha256, \
         resource_id, state, lease_owner, lease_expires_ms, created_ms) \
         select t, m, r, k, b, res, 'in_flight', o, e, c from claim_input where {filter} \
         order by t, m, r, k, i on conflict do nothing returning lease_owner)",
        claims_unnest(first)
    )
}

/// [`add_claims`]'s ten arrays from `$first` on as rows `(step, t, m, r, k, b, res, o, e, c, i)`.
fn claims_unnest(first: usize) -> String {
    let p: Vec<usize> = (first..first + 10).collect();
    format!(
        "SELECT * FROM unnest(${}::int8[], ${}::text[], ${}::text[], ${}::text[], \
         ${}::text[], ${}::bytea[], ${}::text[], ${}::uuid[], ${}::int8[], ${}::int8[]) \
         WITH ORDINALITY AS u(step, t, m, r, k, b, res, o, e, c, i)",
        p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]
    )
}

/// The CTEs `settle_input` and `settled` (without `WITH`; `settled` reads `each_written`, so it
/// comes after the events and `settle_input` before them): keys claimed and completed at once,
/// for a step that needs no time between the two (a ledger command: claim, events and answer in
/// one go). Their claims are [`add_claims`]'s ten arrays from `$claims_first` on, their answers
/// [`add_answers`]'s four from `$answers_first` on (matched by `step`). `settle_input`
/// holds them with `fresh`: whether the key did not exist when the statement began (only then may
/// the step write its events). (The look-up is a scalar subquery, one probe of the key's index per
/// step: as `NOT EXISTS` the planner may hash the whole table, which it did on a table without
/// statistics.) `settled` inserts those for which `filter` (a condition on `u.step`) holds as
/// completed records, each response with the decimal text of `position` (an SQL expression over
/// `u`) between its two parts, `RETURNING lease_owner`. A key claimed meanwhile (by a writer that
/// inserted it after the statement began) fails the insert with a unique violation, which undoes
/// the whole statement.
pub(crate) fn settles_ctes(
    claims_first: usize,
    answers_first: usize,
    filter: &str,
    position: &str,
) -> [String; 2] {
    let input = format!(
        "settle_input AS (SELECT c.*, a.s, a.b AS answer, a.tail, (SELECT 1 FROM \
         idempotency_keys k WHERE k.tenant = c.t AND k.method = c.m AND k.route = c.r \
         AND k.key = c.k) IS NULL AS fresh FROM ({claims}) c JOIN ({answers}) a ON a.step = c.step)",
        claims = claims_unnest(claims_first),
        answers = answers_unnest(answers_first),
    );
    let settled = format!(
        "settled AS (insert into idempotency_keys (tenant, method, route, key, body_sha256, \
         resource_id, state, lease_owner, lease_expires_ms, created_ms, response_status, \
         response_body, completed_ms) \
         select u.t, u.m, u.r, u.k, u.b, u.res, 'completed', u.o, u.e, u.c, u.s, \
         case when u.tail is null then u.answer \
         else u.answer || convert_to(({position})::text, 'UTF8') || u.tail end, u.c \
         from settle_input u where {filter} \
         order by u.t, u.m, u.r, u.k, u.i returning lease_owner)"
    );
    [input, settled]
}

/// Adds the claims with their steps, as [`claims_ctes`] reads them, to `arguments`.
pub(crate) fn add_claims<'c>(
    arguments: &mut PgArguments,
    claims: impl Iterator<Item = (&'c FreshClaim, i64)> + Clone,
) -> Result<(), BoxDynError> {
    let column =
        |f: &dyn Fn(&FreshClaim) -> &str| claims.clone().map(|(c, _)| f(c)).collect::<Vec<&str>>();
    arguments.add(claims.clone().map(|(_, step)| step).collect::<Vec<_>>())?;
    arguments.add(column(&|c| &c.scope.tenant))?;
    arguments.add(column(&|c| &c.scope.method))?;
    arguments.add(column(&|c| &c.scope.route))?;
    arguments.add(column(&|c| c.key.as_str()))?;
    arguments.add(
        claims
            .clone()
            .map(|(c, _)| &c.body.0[..])
            .collect::<Vec<_>>(),
    )?;
    arguments.add(column(&|c| &c.resource_id))?;
    arguments.add(
        claims
            .clone()
            .map(|(c, _)| c.lease.owner)
            .collect::<Vec<_>>(),
    )?;
    arguments.add(
        claims
            .clone()
            .map(|(c, _)| c.lease.expires_ms)
            .collect::<Vec<_>>(),
    )?;
    arguments.add(claims.map(|(c, _)| c.now_ms).collect::<Vec<_>>())
}

/// Completes each held key with its response, inside `tx`: `false` where the lease was lost (the
/// caller must then roll back what it wrote for that request). One statement on PostgreSQL.
pub async fn complete_each(
    tx: &mut Tx,
    completions: &[Completing],
) -> Result<Vec<bool>, IdempotencyError> {
    let Tx::Postgres(conn) = tx else {
        let mut held = Vec::with_capacity(completions.len());
        for c in completions {
            match complete(tx, &c.scope, &c.key, c.lease, &c.response, c.now_ms).await {
                Ok(()) => held.push(true),
                Err(IdempotencyError::LeaseLost) => held.push(false),
                Err(e) => return Err(e),
            }
        }
        return Ok(held);
    };
    let mut arguments = PgArguments::default();
    add_completions(
        &mut arguments,
        completions.iter().zip(0..).map(|(c, step)| (c, step, None)),
    )
    .map_err(sqlx::Error::Encode)?;
    let sql = format!(
        "WITH {} SELECT lease_owner FROM completed",
        completions_cte(1, "NULL", "true")
    );
    let owners: Vec<Uuid> = sqlx::query_scalar_with(&sql, arguments)
        .fetch_all(&mut **conn)
        .await?;
    Ok(completions
        .iter()
        .map(|c| owners.contains(&c.lease.owner))
        .collect())
}

/// The CTE `completed` (without `WITH`): completes each held key of [`add_completions`]'s ten
/// arrays, read from `$first` on, for which `filter` (a condition on `u.step`) holds, where the
/// caller still holds its lease, `RETURNING lease_owner`. A response given in two parts gets the
/// decimal text of `position` between them: an SQL expression over `u`, the completion's row
/// (`u.step` is the caller's index).
pub(crate) fn completions_cte(first: usize, position: &str, filter: &str) -> String {
    format!(
        "completed AS (update idempotency_keys k set state = 'completed', response_status = u.s, \
         response_body = case when u.tail is null then u.b \
         else u.b || convert_to(({position})::text, 'UTF8') || u.tail end, \
         completed_ms = u.c \
         from ({}) u \
         where k.tenant = u.t and k.method = u.m and k.route = u.r and k.key = u.key \
         and k.state = 'in_flight' and k.lease_owner = u.o and {filter} \
         returning k.lease_owner)",
        completions_unnest(first)
    )
}

/// [`add_completions`]'s ten arrays from `$first` on as rows `(step, t, m, r, key, s, b, tail,
/// c, o)`.
fn completions_unnest(first: usize) -> String {
    let p: Vec<usize> = (first..first + 10).collect();
    format!(
        "SELECT * FROM unnest(${}::int8[], ${}::text[], ${}::text[], ${}::text[], ${}::text[], \
         ${}::int4[], ${}::bytea[], ${}::bytea[], ${}::int8[], ${}::uuid[]) \
         AS u(step, t, m, r, key, s, b, tail, c, o)",
        p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]
    )
}

/// [`add_answers`]'s four arrays from `$first` on as rows `(step, s, b, tail)`.
fn answers_unnest(first: usize) -> String {
    let p: Vec<usize> = (first..first + 4).collect();
    format!(
        "SELECT * FROM unnest(${}::int8[], ${}::int4[], ${}::bytea[], ${}::bytea[]) \
         AS u(step, s, b, tail)",
        p[0], p[1], p[2], p[3]
    )
}

/// Adds the answers of keys settled at once (their claims carry the rest), each with its step and
/// the part of its response after the position where the statement fills that in, as
/// [`settles_ctes`] reads them, to `arguments`.
pub(crate) fn add_answers<'c>(
    arguments: &mut PgArguments,
    answers: impl Iterator<Item = (&'c Completing, i64, Option<&'c [u8]>)> + Clone,
) -> Result<(), BoxDynError> {
    arguments.add(answers.clone().map(|(_, step, _)| step).collect::<Vec<_>>())?;
    add_responses(arguments, answers)
}

/// Adds each response's status, body and the part after its position (see [`add_completions`]).
fn add_responses<'c>(
    arguments: &mut PgArguments,
    responses: impl Iterator<Item = (&'c Completing, i64, Option<&'c [u8]>)> + Clone,
) -> Result<(), BoxDynError> {
    arguments.add(
        responses
            .clone()
            .map(|(c, _, _)| i32::from(c.response.status))
            .collect::<Vec<_>>(),
    )?;
    arguments.add(
        responses
            .clone()
            .map(|(c, _, _)| &c.response.body[..])
            .collect::<Vec<_>>(),
    )?;
    arguments.add(responses.map(|(_, _, tail)| tail).collect::<Vec<_>>())
}

/// Adds the completions, each with its step and, for a response whose position the statement
/// fills in, the part after the position (the response's body is then the part before it), as
/// [`completions_cte`] reads them, to `arguments`.
pub(crate) fn add_completions<'c>(
    arguments: &mut PgArguments,
    completions: impl Iterator<Item = (&'c Completing, i64, Option<&'c [u8]>)> + Clone,
) -> Result<(), BoxDynError> {
    let column = |f: &dyn Fn(&Completing) -> &str| {
        completions
            .clone()
            .map(|(c, _, _)| f(c))
            .collect::<Vec<&str>>()
    };
    arguments.add(
        completions
            .clone()
            .map(|(_, step, _)| step)
            .collect::<Vec<_>>(),
    )?;
    arguments.add(column(&|c| &c.scope.tenant))?;
    arguments.add(column(&|c| &c.scope.method))?;
    arguments.add(column(&|c| &c.scope.route))?;
    arguments.add(column(&|c| c.key.as_str()))?;
    add_responses(arguments, completions.clone())?;
    arguments.add(
        completions
            .clone()
            .map(|(c, _, _)| c.now_ms)
            .collect::<Vec<_>>(),
    )?;
    arguments.add(
        completions
            .map(|(c, _, _)| c.lease.owner)
            .collect::<Vec<_>>(),
    )
}

/// Whether a request for `resource_id` may still be running: its key is in flight under a lease
/// that has not run out (a lease outlives the provider client's worst case). The stale sweep
/// never expires a payment whose creation may still reach its provider.
pub async fn resource_in_flight(
    database: &asiento_eventstore::Database,
    resource_id: &str,
    now_ms: i64,
) -> Result<bool, IdempotencyError> {
    use asiento_eventstore::Database;
    let found: Option<i64> = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar(
                "select 1::bigint from idempotency_keys where state = 'in_flight' \
                 and lease_expires_ms > $1 and resource_id = $2 limit 1",
            )
            .bind(now_ms)
            .bind(resource_id)
            .fetch_optional(pool)
            .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar(
                "select 1 from idempotency_keys where state = 'in_flight' \
                 and lease_expires_ms > ?1 and resource_id = ?2 limit 1",
            )
            .bind(now_ms)
            .bind(resource_id)
            .fetch_optional(pool)
            .await?
        }
    };
    Ok(found.is_some())
}

/// Inserts a new in-flight record under `lease`; `false` if the key exists.
async fn insert_fresh(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
    body: BodyHash,
    resource_id: &str,
    lease: Lease,
    now_ms: i64,
) -> Result<bool, IdempotencyError> {
    let inserted = match tx {
        Tx::Postgres(tx) => sqlx::query(
            "insert into idempotency_keys (tenant, method, route, key, body_sha256, resource_id, \
             state, lease_owner, lease_expires_ms, created_ms) \
             values ($1, $2, $3, $4, $5, $6, 'in_flight', $7, $8, $9) on conflict do nothing",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(&body.0[..])
        .bind(resource_id)
        .bind(lease.owner)
        .bind(lease.expires_ms)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
        Tx::Sqlite(tx) => sqlx::query(
            "insert into idempotency_keys (tenant, method, route, key, body_sha256, resource_id, \
             state, lease_owner, lease_expires_ms, created_ms) \
             values (?1, ?2, ?3, ?4, ?5, ?6, 'in_flight', ?7, ?8, ?9) on conflict do nothing",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(&body.0[..])
        .bind(resource_id)
        .bind(lease.owner.to_string())
        .bind(lease.expires_ms)
        .bind(now_ms)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
    };
    Ok(inserted == 1)
}

async fn take_over(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
    previous_owner: Uuid,
    lease: Lease,
) -> Result<bool, IdempotencyError> {
    let updated = match tx {
        Tx::Postgres(tx) => sqlx::query(
            "update idempotency_keys set lease_owner = $5, lease_expires_ms = $6 \
             where tenant = $1 and method = $2 and route = $3 and key = $4 \
             and state = 'in_flight' and lease_owner = $7",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(lease.owner)
        .bind(lease.expires_ms)
        .bind(previous_owner)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
        Tx::Sqlite(tx) => sqlx::query(
            "update idempotency_keys set lease_owner = ?5, lease_expires_ms = ?6 \
             where tenant = ?1 and method = ?2 and route = ?3 and key = ?4 \
             and state = 'in_flight' and lease_owner = ?7",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(lease.owner.to_string())
        .bind(lease.expires_ms)
        .bind(previous_owner.to_string())
        .execute(&mut **tx)
        .await?
        .rows_affected(),
    };
    Ok(updated == 1)
}

async fn read(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<Record>, IdempotencyError> {
    use sqlx::Row as _;
    const COLUMNS: &str = "body_sha256, resource_id, state, lease_owner, lease_expires_ms, \
                           response_status, response_body";
    let record = match tx {
        Tx::Postgres(tx) => {
            let row = sqlx::query(&format!(
                "select {COLUMNS} from idempotency_keys \
                 where tenant = $1 and method = $2 and route = $3 and key = $4"
            ))
            .bind(&scope.tenant)
            .bind(&scope.method)
            .bind(&scope.route)
            .bind(key.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            match row {
                None => None,
                Some(row) => Some(Record {
                    body_sha256: row.try_get("body_sha256")?,
                    resource_id: row.try_get("resource_id")?,
                    completed: row.try_get::<String, _>("state")? == "completed",
                    lease_owner: row.try_get("lease_owner")?,
                    lease_expires_ms: row.try_get("lease_expires_ms")?,
                    response_status: row.try_get("response_status")?,
                    response_body: row.try_get("response_body")?,
                }),
            }
        }
        Tx::Sqlite(tx) => {
            let row = sqlx::query(&format!(
                "select {COLUMNS} from idempotency_keys \
                 where tenant = ?1 and method = ?2 and route = ?3 and key = ?4"
            ))
            .bind(&scope.tenant)
            .bind(&scope.method)
            .bind(&scope.route)
            .bind(key.as_str())
            .fetch_optional(&mut **tx)
            .await?;
            match row {
                None => None,
                Some(row) => {
                    let owner: String = row.try_get("lease_owner")?;
                    Some(Record {
                        body_sha256: row.try_get("body_sha256")?,
                        resource_id: row.try_get("resource_id")?,
                        completed: row.try_get::<String, _>("state")? == "completed",
                        lease_owner: Uuid::parse_str(&owner)
                            .map_err(|_| IdempotencyError::Corrupt("lease owner is not a uuid"))?,
                        lease_expires_ms: row.try_get("lease_expires_ms")?,
                        response_status: row.try_get("response_status")?,
                        response_body: row.try_get("response_body")?,
                    })
                }
            }
        }
    };
    Ok(record)
}

/// Stores the response on the record and marks it completed, inside the transaction that appends
/// the work's last events. Fails with `LeaseLost` if another request took the key over meanwhile,
/// so that the caller's transaction (and its events) roll back.
pub async fn complete(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
    lease: Lease,
    response: &StoredResponse,
    now_ms: i64,
) -> Result<(), IdempotencyError> {
    let status = i32::from(response.status);
    let updated = match tx {
        Tx::Postgres(tx) => sqlx::query(
            "update idempotency_keys set state = 'completed', response_status = $5, \
             response_body = $6, completed_ms = $7 \
             where tenant = $1 and method = $2 and route = $3 and key = $4 \
             and state = 'in_flight' and lease_owner = $8",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(status)
        .bind(&response.body)
        .bind(now_ms)
        .bind(lease.owner)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
        Tx::Sqlite(tx) => sqlx::query(
            "update idempotency_keys set state = 'completed', response_status = ?5, \
             response_body = ?6, completed_ms = ?7 \
             where tenant = ?1 and method = ?2 and route = ?3 and key = ?4 \
             and state = 'in_flight' and lease_owner = ?8",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(status)
        .bind(&response.body)
        .bind(now_ms)
        .bind(lease.owner.to_string())
        .execute(&mut **tx)
        .await?
        .rows_affected(),
    };
    if updated == 1 {
        Ok(())
    } else {
        Err(IdempotencyError::LeaseLost)
    }
}

/// Ends this request's lease at once (the work failed on our side and may be retried now), without
/// storing a response. Only the current holder can release. The lease is marked as ending `now_ms`
/// (not at 0), so the stuck-key check counts its grace from the release, not from 1970.
pub async fn release(
    tx: &mut Tx,
    scope: &Scope,
    key: &IdempotencyKey,
    lease: Lease,
    now_ms: i64,
) -> Result<(), IdempotencyError> {
    match tx {
        Tx::Postgres(tx) => sqlx::query(
            "update idempotency_keys set lease_expires_ms = $6 \
             where tenant = $1 and method = $2 and route = $3 and key = $4 \
             and state = 'in_flight' and lease_owner = $5",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(lease.owner)
        .bind(now_ms)
        .execute(&mut **tx)
        .await
        .map(|_| ())?,
        Tx::Sqlite(tx) => sqlx::query(
            "update idempotency_keys set lease_expires_ms = ?6 \
             where tenant = ?1 and method = ?2 and route = ?3 and key = ?4 \
             and state = 'in_flight' and lease_owner = ?5",
        )
        .bind(&scope.tenant)
        .bind(&scope.method)
        .bind(&scope.route)
        .bind(key.as_str())
        .bind(lease.owner.to_string())
        .bind(now_ms)
        .execute(&mut **tx)
        .await
        .map(|_| ())?,
    }
    Ok(())
}

/// Deletes completed records created before `created_before_ms` (API.md keeps keys at least 24
/// hours). In-flight records are never purged: the sweeper finishes them first.
pub async fn purge_completed(tx: &mut Tx, created_before_ms: i64) -> Result<u64, IdempotencyError> {
    let deleted = match tx {
        Tx::Postgres(tx) => sqlx::query(
            "delete from idempotency_keys where state = 'completed' and created_ms < $1",
        )
        .bind(created_before_ms)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
        Tx::Sqlite(tx) => sqlx::query(
            "delete from idempotency_keys where state = 'completed' and created_ms < ?1",
        )
        .bind(created_before_ms)
        .execute(&mut **tx)
        .await?
        .rows_affected(),
    };
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_parsing_follows_the_contract() {
        let long = "k".repeat(KEY_LENGTH_MAX);
        let too_long = "k".repeat(KEY_LENGTH_MAX + 1);
        let table: [(&str, Result<(), KeyError>); 6] = [
            ("order-1001", Ok(())),
            (long.as_str(), Ok(())),
            ("", Err(KeyError::Empty)),
            (too_long.as_str(), Err(KeyError::TooLong)),
            ("clé", Err(KeyError::NotPrintableAscii)),
            ("tab\there", Err(KeyError::NotPrintableAscii)),
        ];
        for (raw, want) in table {
            assert_eq!(IdempotencyKey::parse(raw).map(|_| ()), want, "{raw:?}");
        }
    }

    #[test]
    fn key_order_and_whitespace_do_not_change_the_hash() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"amount_minor": 100, "currency": "USD", "metadata": {"b": 1, "a": [1, {"y": 2, "x": 1}]}}"#)
                .expect("json");
        let b: serde_json::Value = serde_json::from_str(
            r#"{"metadata":{"a":[1,{"x":1,"y":2}],"b":1},"currency":"USD","amount_minor":100}"#,
        )
        .expect("json");
        assert_eq!(canonical_body_hash(&a), canonical_body_hash(&b));
    }

    #[test]
    fn any_change_of_value_changes_the_hash() {
        let base = serde_json::json!({"amount_minor": 100, "currency": "USD", "list": [1, 2]});
        let changed = [
            serde_json::json!({"amount_minor": 101, "currency": "USD", "list": [1, 2]}),
            serde_json::json!({"amount_minor": 100, "currency": "EUR", "list": [1, 2]}),
            serde_json::json!({"amount_minor": 100, "currency": "USD", "list": [2, 1]}),
            serde_json::json!({"amount_minor": 100, "currency": "USD", "list": [1, 2], "x": null}),
            serde_json::json!({"amount_minor": "100", "currency": "USD", "list": [1, 2]}),
        ];
        for other in changed {
            assert_ne!(
                canonical_body_hash(&base),
                canonical_body_hash(&other),
                "{other}"
            );
        }
    }
}
