//! `asiento bench append|replay`: the event log's throughput next to the
//! same workload done with plain SQL, in the same run, on the same database.
//!
//! The point is the ratio, not the absolute figure: the machine, the disk
//! and the other load change both sides alike. Each workload prints one line
//! `<name> asiento=<events/s> limit=<events/s> ratio=<asiento/limit>` on
//! stdout; latency percentiles and memory go to stderr.
//!
//! The plain-SQL side ("limit") writes to `bench_plain`, a table of the same
//! shape and constraints as `events` (on PostgreSQL literally `LIKE events
//! INCLUDING ALL`), with versions the client already knows, so it measures
//! what a database round trip with those constraints costs.
//!
//! `replay` seeds one log of domain events (`EntryPosted` journal entries of
//! payment streams, spread over `--customers` customer accounts) and runs two
//! workloads on it against the same limit, a plain streaming `SELECT`:
//! W3-read (a subscription catching up, folding a sum) and W3-rebuild
//! (`asiento_projector::rebuild` of the balances projection from position
//! zero, timed whole, then checked against a recomputation from the log);
//! then W3-past (`bench_past.rs`), balances in the past next to current ones.

#[path = "bench_baseline.rs"]
mod bench_baseline;
#[path = "bench_command.rs"]
mod bench_command;
#[path = "bench_cpu.rs"]
mod bench_cpu;
#[path = "bench_e2e.rs"]
mod bench_e2e;
#[path = "bench_past.rs"]
mod bench_past;
#[path = "bench_reads.rs"]
mod bench_reads;
#[path = "bench_streams.rs"]
mod bench_streams;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use asiento_domain::payment::EntryPosted;
use asiento_domain::{
    fee, payment_stream, AccountName, Amount, Currency, CustomerId, EntryId, FeeSchedule,
    JournalEntry, PaymentEvent, PaymentId, ProviderName, TenantId,
};
use asiento_eventstore::{
    scratch, AppendError, Cursor, Database, EventStore, ExpectedVersion, Metadata, NewEvent,
    StreamAppend,
};
use asiento_projector::RebuildConfig;
use futures::TryStreamExt;
use hdrhistogram::Histogram;
use sqlx::types::Json;
use uuid::Uuid;

/// Environment variable naming the database to benchmark (else a fresh
/// PostgreSQL database from `scratch::fresh_postgres_url`).
pub const BENCH_DATABASE_URL_ENV: &str = "ASIENTO_BENCH_DATABASE_URL";
/// Pool size: the writers plus room for the store's NOTIFY and the reader.
const POOL_CONNECTIONS_EXTRA: u32 = 4;
/// Latencies above this are clamped into the histogram's top bucket.
const LATENCY_MAX_US: u64 = 60_000_000;
/// Replay pool: the streaming reader, the subscription's producer, and the
/// rebuild's transaction next to its reads.
const REPLAY_POOL_CONNECTIONS: u32 = 4;
/// How long the seeded events may take to pass the read horizon.
const SETTLE_MAX_S: u64 = 60;
const SETTLE_POLL_MS: u64 = 10;
/// Seeded rows per statement on PostgreSQL (one UNNEST INSERT, one transaction).
const SEED_EVENTS_PER_STATEMENT_PG: u64 = 10_000;
/// Seeded rows per statement on SQLite: 7 bound values a row stays below
/// SQLite's 32,766 variables.
const SEED_EVENTS_PER_STATEMENT_SQLITE: u64 = 4_000;
const SEED_TENANT: &str = "bench";
const SEED_PROVIDER: &str = "sim";
const SEED_CURRENCY: &str = "USD";
/// The simulator's default fee schedule: 3 %.
const SEED_FEE_BPS: u32 = 300;
/// Seeded captures run from 5.00 to 1,004.99 USD.
const SEED_CAPTURE_MIN_MINOR: i64 = 500;
const SEED_CAPTURE_SPAN_MINOR: u64 = 100_000;
/// A prime stride, so that neighbouring events capture unrelated amounts.
const SEED_CAPTURE_STRIDE: u64 = 7_919;
/// The upper half of every seeded payment's uuid; the lower half is its index.
const SEED_PAYMENT_UUID_HIGH: u64 = 0xbe7c_4a51_e470_0000;
/// Seeded entries are 1 ms apart from 2026-01-01T00:00:00Z.
const SEED_START_UNIX_MS: i64 = 1_767_225_600_000;

#[derive(clap::Subcommand, Debug)]
pub enum BenchCommand {
    /// W1: concurrent appends with `Exact` expectations (single events, then
    /// batches), next to plain INSERTs with the same constraints.
    Append(AppendArgs),
    /// W3: catch-up read of the whole log through a subscription, folding a
    /// sum (W3-read), and a rebuild of the balances projection (W3-rebuild),
    /// each next to a plain streaming SELECT of the same log.
    Replay(ReplayArgs),
    /// E2E: the real server over HTTP (payments and refunds), next to its
    /// HTTP floor (`/healthz`) and database floor (plain SQL transactions).
    E2e(bench_e2e::E2eArgs),
    /// The transfer command path without HTTP, among funded customer accounts.
    Command(bench_command::CommandArgs),
    /// The read models' time per event as payments' streams grow (200 refunds each), first
    /// rounds against last.
    Projections(bench_streams::StreamsArgs),
    /// The query routes with reads on a standby against the same reads on the primary.
    Reads(bench_reads::ReadsArgs),
    /// The plain-SQL payments service `e2e` measures asiento against, as a server of its own
    /// (`e2e` starts it).
    #[command(hide = true)]
    BaselineServe(bench_baseline::BaselineArgs),
}

#[derive(clap::Args, Debug)]
pub struct AppendArgs {
    /// Database to use (postgres://… or sqlite://…); must hold no events.
    /// Default: a fresh PostgreSQL test database, dropped afterwards.
    #[arg(long, env = BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// Concurrent writers.
    #[arg(long, default_value_t = 8)]
    pub writers: usize,
    /// Streams the appends are spread over (each owned by one writer).
    #[arg(long, default_value_t = 10_000)]
    pub streams: usize,
    /// Appends in W1-single (one event each).
    #[arg(long, default_value_t = 100_000)]
    pub appends: usize,
    /// Appends in W1-batch (`--batch-events` events each).
    #[arg(long, default_value_t = 100_000)]
    pub batch_appends: usize,
    /// Events per append in W1-batch.
    #[arg(long, default_value_t = 10)]
    pub batch_events: usize,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Database to use (postgres://… or sqlite://…); must hold no events.
    /// Default: a fresh PostgreSQL test database, dropped afterwards.
    #[arg(long, env = BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// `EntryPosted` events to seed, read back and rebuild from.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: u64,
    /// Payment streams the seeded events are spread over (the default gives
    /// each payment one capture entry).
    #[arg(long, default_value_t = 1_000_000)]
    pub streams: u64,
    /// Customer accounts the captures are paid into (each payment belongs to
    /// one customer); with `psp:sim:clearing` and `revenue:fees` they are the
    /// balances the rebuild maintains.
    #[arg(long, default_value_t = 1_000)]
    pub customers: u64,
    /// Events per subscription batch.
    #[arg(long, default_value_t = 1_000)]
    pub batch_size: usize,
    /// Reads of each side, alternating; the best of each is reported (the
    /// machine's other load only ever slows a round down).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Rebuilds of the balances projection; the best is reported.
    #[arg(long, default_value_t = 1)]
    pub rebuild_rounds: usize,
    /// Events per rebuild batch (`RebuildConfig::batch_size_max`); default:
    /// the projector's own default (2,000).
    #[arg(long)]
    pub rebuild_batch_size: Option<usize>,
}

pub async fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Append(args) => append(args).await,
        BenchCommand::Replay(args) => replay(args).await,
        BenchCommand::E2e(args) => bench_e2e::e2e(args).await,
        BenchCommand::Command(args) => bench_command::command(args).await,
        BenchCommand::Projections(args) => bench_streams::long_streams(args).await,
        BenchCommand::Reads(args) => bench_reads::reads(args).await,
        BenchCommand::BaselineServe(args) => bench_baseline::serve(args).await,
    }
}

/// The database under test; a fresh one is dropped when done.
struct Target {
    db: Database,
    url: String,
    fresh_url: Option<String>,
}

impl Target {
    async fn open(url: Option<String>, connections_max: u32) -> anyhow::Result<Target> {
        let (url, fresh) = match url {
            Some(url) => (url, false),
            None => (scratch::fresh_postgres_url().await, true),
        };
        let db = Database::connect_with_pool_size(&url, connections_max)
            .await
            .with_context(|| format!("connecting to {}", redact(&url)))?;
        db.migrate().await.context("migrating the bench database")?;
        let events: i64 = match &db {
            Database::Postgres(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM events")
                    .fetch_one(pool)
                    .await?
            }
            Database::Sqlite(pool) => {
                sqlx::query_scalar("SELECT count(*) FROM events")
                    .fetch_one(pool)
                    .await?
            }
        };
        if events > 0 {
            bail!("the bench needs a database without events (events cannot be deleted)");
        }
        eprintln!("bench database: {:?} {}", db.backend(), redact(&url));
        Ok(Target {
            db,
            fresh_url: fresh.then(|| url.clone()),
            url,
        })
    }

    async fn close(self) {
        match &self.db {
            Database::Postgres(pool) => pool.close().await,
            Database::Sqlite(pool) => pool.close().await,
        }
        if let Some(url) = self.fresh_url {
            scratch::drop_postgres_database(&url).await;
        }
    }
}

/// The URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let userinfo = &url[scheme_end + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{user}@{}", &url[..scheme_end + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

fn report(name: &str, events: u64, asiento: Duration, limit: Duration) {
    let rate = |d: Duration| events as f64 / d.as_secs_f64().max(f64::EPSILON);
    let (a, l) = (rate(asiento), rate(limit));
    println!("{name} asiento={a:.0} limit={l:.0} ratio={:.2}", a / l);
}

fn report_latency(name: &str, side: &str, h: &Histogram<u64>) {
    eprintln!(
        "{name} {side} latency_us p50={} p99={} max={}",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    );
}

// ---------------------------------------------------------------- W1 append

/// One W1 workload: `appends` appends of `events_per_append` events, spread
/// over `streams` streams, by `writers` concurrent writers.
#[derive(Debug, Clone, Copy)]
struct W1 {
    name: &'static str,
    writers: usize,
    streams: usize,
    appends: usize,
    events_per_append: usize,
}

impl W1 {
    /// The streams a writer owns (so it always knows their exact version) and
    /// how many appends it makes.
    fn share(&self, writer: usize) -> (Vec<String>, usize) {
        let streams = (writer..self.streams)
            .step_by(self.writers)
            .map(|s| format!("{}-{s}", self.name))
            .collect();
        let appends =
            self.appends / self.writers + usize::from(writer < self.appends % self.writers);
        (streams, appends)
    }
}

fn bench_event(n: u64) -> NewEvent {
    NewEvent {
        event_id: Uuid::new_v4(),
        event_type: "Paid".to_owned(),
        schema: 1,
        data: serde_json::json!({ "amount_minor": n % 1000 + 1, "currency": "USD" }),
        metadata: Metadata {
            tenant: Some("bench".to_owned()),
            ..Metadata::default()
        },
    }
}

fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, LATENCY_MAX_US, 3)?)
}

fn record(h: &mut Histogram<u64>, started: Instant) {
    let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(LATENCY_MAX_US);
    h.saturating_record(us.clamp(1, LATENCY_MAX_US));
}

async fn append(args: AppendArgs) -> anyhow::Result<()> {
    if args.writers == 0 || args.streams < args.writers || args.batch_events == 0 {
        bail!("need at least one writer, one stream per writer and one event per batch");
    }
    let pool_size = u32::try_from(args.writers)?.saturating_add(POOL_CONNECTIONS_EXTRA);
    let target = Target::open(args.database_url.clone(), pool_size).await?;
    create_plain_table(&target.db).await?;
    let store = target.db.event_store();
    let single = W1 {
        name: "W1-single",
        writers: args.writers,
        streams: args.streams,
        appends: args.appends,
        events_per_append: 1,
    };
    let batch_name: &'static str = if args.batch_events == 10 {
        "W1-batch10"
    } else {
        "W1-batch"
    };
    let batch = W1 {
        name: batch_name,
        appends: args.batch_appends,
        events_per_append: args.batch_events,
        ..single
    };
    for w in [single, batch] {
        let events = (w.appends * w.events_per_append) as u64;
        let (limit, limit_latency) = run_w1_plain(&target.db, w).await?;
        let (asiento, asiento_latency) = run_w1_store(&store, w).await?;
        report(w.name, events, asiento, limit);
        report_latency(w.name, "asiento", &asiento_latency);
        report_latency(w.name, "limit", &limit_latency);
    }
    target.close().await;
    Ok(())
}

async fn run_w1_store(
    store: &Arc<dyn EventStore>,
    w: W1,
) -> anyhow::Result<(Duration, Histogram<u64>)> {
    let started = Instant::now();
    let mut writers = Vec::with_capacity(w.writers);
    for writer in 0..w.writers {
        let store = Arc::clone(store);
        writers.push(tokio::spawn(async move {
            let (streams, appends) = w.share(writer);
            let mut versions = vec![0u64; streams.len()];
            let mut latency = new_histogram()?;
            for i in 0..appends {
                let s = i % streams.len();
                let request = [StreamAppend {
                    stream_id: streams[s].clone(),
                    expected: ExpectedVersion::Exact(versions[s]),
                    events: (0..w.events_per_append)
                        .map(|e| bench_event((i + e) as u64))
                        .collect(),
                }];
                let t = Instant::now();
                match store.append(&request).await {
                    Ok(appended) => versions[s] = appended.streams[0].1,
                    Err(AppendError::Conflict { .. }) => {
                        bail!("conflict on a stream only this writer appends to")
                    }
                    Err(e) => return Err(e.into()),
                }
                record(&mut latency, t);
            }
            anyhow::Ok(latency)
        }));
    }
    let mut latency = new_histogram()?;
    for writer in writers {
        latency.add(writer.await??)?;
    }
    Ok((started.elapsed(), latency))
}

const PLAIN_INSERT_PG: &str = "INSERT INTO bench_plain \
     (stream_id, version, event_id, event_type, schema, data, metadata) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const PLAIN_INSERT_MANY_PG: &str = "INSERT INTO bench_plain \
     (stream_id, version, event_id, event_type, schema, data, metadata) \
     SELECT * FROM unnest($1::text[], $2::int8[], $3::uuid[], $4::text[], $5::int4[], \
                          $6::jsonb[], $7::jsonb[])";

/// `bench_plain`: the shape and constraints of `events`, without the store.
async fn create_plain_table(db: &Database) -> anyhow::Result<()> {
    match db {
        Database::Postgres(pool) => {
            sqlx::query("DROP TABLE IF EXISTS bench_plain")
                .execute(pool)
                .await?;
            sqlx::query("CREATE TABLE bench_plain (LIKE events INCLUDING ALL)")
                .execute(pool)
                .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query("DROP TABLE IF EXISTS bench_plain")
                .execute(pool)
                .await?;
            sqlx::query(
                "CREATE TABLE bench_plain (
                    position    INTEGER PRIMARY KEY,
                    stream_id   TEXT    NOT NULL,
                    version     INTEGER NOT NULL CHECK (version >= 1),
                    event_id    BLOB    NOT NULL UNIQUE,
                    event_type  TEXT    NOT NULL,
                    schema      INTEGER NOT NULL,
                    data        TEXT    NOT NULL,
                    metadata    TEXT    NOT NULL,
                    recorded_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
                    UNIQUE (stream_id, version)
                )",
            )
            .execute(pool)
            .await?;
        }
    }
    Ok(())
}

/// The same workload as [`run_w1_store`], as plain INSERTs: each writer on
/// one connection, one statement per append (a multi-row INSERT for batches).
async fn run_w1_plain(db: &Database, w: W1) -> anyhow::Result<(Duration, Histogram<u64>)> {
    let started = Instant::now();
    let mut writers = Vec::with_capacity(w.writers);
    for writer in 0..w.writers {
        let db = db.clone();
        writers.push(tokio::spawn(async move {
            let (streams, appends) = w.share(writer);
            let mut versions = vec![0i64; streams.len()];
            let mut latency = new_histogram()?;
            match db {
                Database::Postgres(pool) => {
                    let mut conn = pool.acquire().await?;
                    for i in 0..appends {
                        let s = i % streams.len();
                        let events: Vec<NewEvent> = (0..w.events_per_append)
                            .map(|e| bench_event((i + e) as u64))
                            .collect();
                        let t = Instant::now();
                        if let [e] = events.as_slice() {
                            sqlx::query(PLAIN_INSERT_PG)
                                .bind(&streams[s])
                                .bind(versions[s] + 1)
                                .bind(e.event_id)
                                .bind(&e.event_type)
                                .bind(e.schema)
                                .bind(Json(&e.data))
                                .bind(Json(&e.metadata))
                                .execute(&mut *conn)
                                .await?;
                        } else {
                            let n = events.len();
                            sqlx::query(PLAIN_INSERT_MANY_PG)
                                .bind(vec![streams[s].as_str(); n])
                                .bind((1..=n as i64).map(|k| versions[s] + k).collect::<Vec<_>>())
                                .bind(events.iter().map(|e| e.event_id).collect::<Vec<_>>())
                                .bind(
                                    events
                                        .iter()
                                        .map(|e| e.event_type.as_str())
                                        .collect::<Vec<_>>(),
                                )
                                .bind(events.iter().map(|e| e.schema).collect::<Vec<_>>())
                                .bind(events.iter().map(|e| Json(&e.data)).collect::<Vec<_>>())
                                .bind(events.iter().map(|e| Json(&e.metadata)).collect::<Vec<_>>())
                                .execute(&mut *conn)
                                .await?;
                        }
                        record(&mut latency, t);
                        versions[s] += events.len() as i64;
                    }
                }
                Database::Sqlite(pool) => {
                    let mut conn = pool.acquire().await?;
                    for i in 0..appends {
                        let s = i % streams.len();
                        let events: Vec<NewEvent> = (0..w.events_per_append)
                            .map(|e| bench_event((i + e) as u64))
                            .collect();
                        let t = Instant::now();
                        let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                            "INSERT INTO bench_plain \
                             (stream_id, version, event_id, event_type, schema, data, metadata) ",
                        );
                        let base = versions[s];
                        insert.push_values(events.iter().enumerate(), |mut row, (k, e)| {
                            row.push_bind(streams[s].as_str())
                                .push_bind(base + 1 + k as i64)
                                .push_bind(e.event_id)
                                .push_bind(e.event_type.as_str())
                                .push_bind(e.schema)
                                .push_bind(Json(&e.data))
                                .push_bind(Json(&e.metadata));
                        });
                        insert.build().execute(&mut *conn).await?;
                        record(&mut latency, t);
                        versions[s] += events.len() as i64;
                    }
                }
            }
            anyhow::Ok(latency)
        }));
    }
    let mut latency = new_histogram()?;
    for writer in writers {
        latency.add(writer.await??)?;
    }
    Ok((started.elapsed(), latency))
}

// ------------------------------------------------------- W3 replay and rebuild

/// The seeded log: `events` journal entries posted as a capture posts them
/// (`psp:sim:clearing` −C, `customer:{c}:available` +(C − fee), `revenue:fees`
/// +fee), as `EntryPosted` events of `payment-pay_…` streams, encoded by the
/// domain. Both W3 workloads read this one log.
struct SeedPlan {
    events: u64,
    streams: u64,
    tenant: TenantId,
    currency: Currency,
    fees: FeeSchedule,
    clearing: AccountName,
    revenue: AccountName,
    customers: Vec<AccountName>,
    metadata: serde_json::Value,
}

/// One seeded row of `events`.
struct SeedRow {
    stream_id: String,
    version: i64,
    event_id: Uuid,
    event_type: &'static str,
    schema: i32,
    data: serde_json::Value,
}

impl SeedPlan {
    fn new(events: u64, streams: u64, customers: u64) -> anyhow::Result<SeedPlan> {
        let tenant = TenantId::parse(SEED_TENANT)?;
        let customers = (0..customers)
            .map(|c| {
                Ok(AccountName::customer_available(&CustomerId::parse(
                    &format!("c{c}"),
                )?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let metadata = serde_json::to_value(Metadata {
            tenant: Some(tenant.as_str().to_owned()),
            ..Metadata::default()
        })?;
        Ok(SeedPlan {
            events,
            streams,
            tenant,
            currency: Currency::parse(SEED_CURRENCY)?,
            fees: FeeSchedule::new(SEED_FEE_BPS, Amount::ZERO)?,
            clearing: AccountName::psp_clearing(&ProviderName::parse(SEED_PROVIDER)?),
            revenue: AccountName::revenue_fees(),
            customers,
            metadata,
        })
    }

    /// What event `g` captures, in minor units: what both W3 folds sum.
    fn captured_minor(g: u64) -> i64 {
        let spread = g.wrapping_mul(SEED_CAPTURE_STRIDE) % SEED_CAPTURE_SPAN_MINOR;
        SEED_CAPTURE_MIN_MINOR + i64::try_from(spread).unwrap_or_default()
    }

    fn expected_sum(&self) -> i64 {
        (0..self.events).map(SeedPlan::captured_minor).sum()
    }

    /// Event `g`: payment `g % streams` (whose customer is fixed by the
    /// payment), at version `g / streams + 1`.
    fn row(&self, g: u64) -> anyhow::Result<SeedRow> {
        let payment_index = g % self.streams;
        let version = g / self.streams + 1;
        let payment =
            PaymentId::from_uuid(Uuid::from_u64_pair(SEED_PAYMENT_UUID_HIGH, payment_index));
        let customer = &self.customers[usize::try_from(payment_index)? % self.customers.len()];
        let captured = Amount::new(SeedPlan::captured_minor(g));
        let fee = fee(captured, self.fees)?;
        let entry = JournalEntry::in_one_currency(
            EntryId::derived(&format!("{payment}:bench:{version}")),
            self.tenant.clone(),
            self.currency,
            [
                (self.clearing.clone(), captured.checked_neg()?),
                (customer.clone(), captured.checked_sub(fee)?),
                (self.revenue.clone(), fee),
            ],
        )?;
        let at = chrono::DateTime::from_timestamp_millis(SEED_START_UNIX_MS + i64::try_from(g)?)
            .context("a seeded instant out of range")?;
        let event = PaymentEvent::EntryPosted(EntryPosted {
            entry,
            at,
            transfer: None,
        });
        Ok(SeedRow {
            stream_id: payment_stream(payment),
            version: i64::try_from(version)?,
            event_id: Uuid::new_v4(),
            event_type: event.event_type(),
            schema: event.schema_version(),
            data: event.encode()?,
        })
    }

    fn rows(&self, from: u64, to: u64) -> anyhow::Result<Vec<SeedRow>> {
        (from..to).map(|g| self.row(g)).collect()
    }
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    if args.streams == 0 || args.customers == 0 || args.batch_size == 0 {
        bail!("need at least one stream, one customer and a positive batch size");
    }
    let plan = SeedPlan::new(args.events, args.streams, args.customers)?;
    let target = Target::open(args.database_url.clone(), REPLAY_POOL_CONNECTIONS).await?;
    let seeding = Instant::now();
    seed(&target.db, &plan).await?;
    eprintln!(
        "W3 seeded {} EntryPosted events ({} payment streams, {} customers) in {:.1}s",
        args.events,
        args.streams.min(args.events),
        args.customers,
        seeding.elapsed().as_secs_f64()
    );
    // Every seeded transaction must be below the horizon before timing starts.
    let store = target.db.event_store();
    let settle_deadline = Instant::now() + Duration::from_secs(SETTLE_MAX_S);
    while store.head().await?.position() == 0 && args.events > 0 {
        if Instant::now() > settle_deadline {
            bail!("the seeded events never became readable");
        }
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
    }
    let expected_sum = plan.expected_sum();
    drop(plan);

    // The peak from here on is the reads', not the seeding's.
    let peak_reset = reset_peak_rss();
    let rss_before_kb = rss_kb("VmRSS");
    let (mut limit, mut asiento) = (Duration::MAX, Duration::MAX);
    let (mut rss_after_limit_kb, mut rss_after_kb) = (0, 0);
    for _ in 0..args.rounds.max(1) {
        let started = Instant::now();
        let (count, sum) = plain_streaming_read(&target.db).await?;
        limit = limit.min(started.elapsed());
        check_fold("limit", count, sum, args.events, expected_sum)?;
        rss_after_limit_kb = rss_after_limit_kb.max(rss_kb("VmRSS"));

        let started = Instant::now();
        let (count, sum) = subscription_read(&store, args.events, args.batch_size).await?;
        asiento = asiento.min(started.elapsed());
        check_fold("asiento", count, sum, args.events, expected_sum)?;
        rss_after_kb = rss_after_kb.max(rss_kb("VmRSS"));
    }
    report("W3-read", args.events, asiento, limit);
    eprintln!(
        "W3-read rss_kb before={rss_before_kb} after_limit={rss_after_limit_kb} \
         after_asiento={rss_after_kb} peak={}{}",
        rss_kb("VmHWM"),
        if peak_reset {
            ""
        } else {
            " (peak not reset: includes seeding)"
        }
    );

    let rebuild = rebuild_balances(&target.db, &store, &args).await?;
    report("W3-rebuild", args.events, rebuild, limit);
    let clearing = AccountName::psp_clearing(&ProviderName::parse(SEED_PROVIDER)?);
    bench_past::past(
        &target.db,
        &store,
        SEED_TENANT,
        &clearing,
        SEED_CURRENCY,
        args.rounds,
    )
    .await?;
    bench_past::export(&target.url, args.events).await?;
    target.close().await;
    Ok(())
}

/// W3-rebuild: `asiento_projector::rebuild` of the balances projection from
/// position zero, timed whole (claim, batches, swap, drop of the old
/// generation); the best of `--rebuild-rounds`. Then the rebuilt balances are
/// checked against a recomputation from the log (untimed).
async fn rebuild_balances(
    db: &Database,
    store: &Arc<dyn EventStore>,
    args: &ReplayArgs,
) -> anyhow::Result<Duration> {
    asiento_balances::install(db).await?;
    let projection = asiento_balances::projection();
    let mut config = RebuildConfig::new(format!("bench-{}", std::process::id()));
    if let Some(batch_size) = args.rebuild_batch_size {
        config.batch_size_max = batch_size;
    }
    let mut best = Duration::MAX;
    for _ in 0..args.rebuild_rounds.max(1) {
        reset_peak_rss();
        let rss_before_kb = rss_kb("VmRSS");
        let started = Instant::now();
        let done = asiento_projector::rebuild(
            db,
            store,
            projection.as_ref(),
            &config,
            std::future::pending(),
        )
        .await?;
        let elapsed = started.elapsed();
        if done.events_applied != args.events {
            bail!(
                "the rebuild applied {} events; the log holds {}",
                done.events_applied,
                args.events
            );
        }
        best = best.min(elapsed);
        eprintln!(
            "W3-rebuild generation={} batch={} {:.1}s rss_kb before={rss_before_kb} after={} peak={}",
            done.generation,
            config.batch_size_max,
            elapsed.as_secs_f64(),
            rss_kb("VmRSS"),
            rss_kb("VmHWM")
        );
    }
    let checking = Instant::now();
    let mismatches = asiento_balances::verify(db, store.as_ref()).await?;
    if let Some(first) = mismatches.first() {
        bail!(
            "{} rebuilt balances disagree with the log, e.g. {first:?}",
            mismatches.len()
        );
    }
    let (_, balances) = asiento_balances::snapshot_all(db).await?;
    let accounts_expected = args.customers.min(args.streams).min(args.events) + 2;
    if args.events > 0 && balances.len() as u64 != accounts_expected {
        bail!(
            "the rebuild produced {} balances; expected {accounts_expected}",
            balances.len()
        );
    }
    eprintln!(
        "W3-rebuild verified: {} balances match a recomputation from the log ({:.1}s)",
        balances.len(),
        checking.elapsed().as_secs_f64()
    );
    Ok(best)
}

fn check_fold(side: &str, count: u64, sum: i64, events: u64, expected: i64) -> anyhow::Result<()> {
    if count != events || sum != expected {
        bail!(
            "{side} read {count} events summing to {sum}; expected {events} summing to {expected}"
        );
    }
    Ok(())
}

/// Writes the plan's events straight into `events` (the log's own table, as a
/// bulk import would), in statements of a few thousand rows, each its own
/// transaction. Rows are generated per statement, so memory stays flat.
async fn seed(db: &Database, plan: &SeedPlan) -> anyhow::Result<()> {
    let per_statement = match db {
        Database::Postgres(_) => SEED_EVENTS_PER_STATEMENT_PG,
        Database::Sqlite(_) => SEED_EVENTS_PER_STATEMENT_SQLITE,
    };
    let mut from = 0u64;
    while from < plan.events {
        let to = (from + per_statement).min(plan.events);
        let rows = plan.rows(from, to)?;
        match db {
            Database::Postgres(pool) => {
                sqlx::query(
                    "INSERT INTO events \
                         (stream_id, version, event_id, event_type, schema, data, metadata) \
                     SELECT s, v, i, t, sc, d, $7 FROM unnest($1::text[], $2::int8[], \
                         $3::uuid[], $4::text[], $5::int4[], $6::jsonb[]) AS r(s, v, i, t, sc, d)",
                )
                .bind(
                    rows.iter()
                        .map(|r| r.stream_id.as_str())
                        .collect::<Vec<_>>(),
                )
                .bind(rows.iter().map(|r| r.version).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_id).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.event_type).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| r.schema).collect::<Vec<_>>())
                .bind(rows.iter().map(|r| Json(&r.data)).collect::<Vec<_>>())
                .bind(Json(&plan.metadata))
                .execute(pool)
                .await?;
            }
            Database::Sqlite(pool) => {
                let mut insert = sqlx::QueryBuilder::<sqlx::Sqlite>::new(
                    "INSERT INTO events \
                     (stream_id, version, event_id, event_type, schema, data, metadata) ",
                );
                insert.push_values(&rows, |mut row, r| {
                    row.push_bind(r.stream_id.as_str())
                        .push_bind(r.version)
                        .push_bind(r.event_id)
                        .push_bind(r.event_type)
                        .push_bind(r.schema)
                        .push_bind(Json(&r.data))
                        .push_bind(Json(&plan.metadata));
                });
                insert.build().execute(pool).await?;
            }
        }
        from = to;
    }
    // Fresh statistics, as autovacuum would gather after a bulk load: without
    // them the planner may sort instead of walking the (xact, position) index.
    match db {
        Database::Postgres(pool) => {
            sqlx::query("VACUUM ANALYZE events").execute(pool).await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query("ANALYZE").execute(pool).await?;
        }
    }
    Ok(())
}

/// The W3 fold: what an `EntryPosted` captured (minus its first leg, the
/// provider's clearing account). Both sides navigate the same decoded JSON.
fn captured(data: &serde_json::Value) -> i64 {
    data.pointer("/entry/legs/0/amount_minor")
        .and_then(serde_json::Value::as_i64)
        .map_or(0, |minor| -minor)
}

/// Decoded like the store decodes a row, so both sides do the same work.
type PlainRow = (
    i64,
    i64,
    String,
    i64,
    Uuid,
    String,
    i32,
    Json<serde_json::Value>,
    Json<Metadata>,
    chrono::DateTime<chrono::Utc>,
);

/// The limit: one streaming SELECT over the whole table, in position order.
async fn plain_streaming_read(db: &Database) -> anyhow::Result<(u64, i64)> {
    let (mut count, mut sum) = (0u64, 0i64);
    match db {
        Database::Postgres(pool) => {
            let mut rows = sqlx::query_as::<_, PlainRow>(
                "SELECT position, xact, stream_id, version, event_id, event_type, schema, data, \
                 metadata, recorded_at FROM events ORDER BY position",
            )
            .fetch(pool);
            while let Some(row) = rows.try_next().await? {
                count += 1;
                sum += captured(&row.7 .0);
            }
        }
        Database::Sqlite(pool) => {
            let mut rows = sqlx::query_as::<_, PlainRow>(
                "SELECT position, 0, stream_id, version, event_id, event_type, schema, data, \
                 metadata, recorded_at FROM events ORDER BY position",
            )
            .fetch(pool);
            while let Some(row) = rows.try_next().await? {
                count += 1;
                sum += captured(&row.7 .0);
            }
        }
    }
    Ok((count, sum))
}

/// The store: catch up from the start through a subscription, folding as
/// batches arrive and keeping none of them.
async fn subscription_read(
    store: &Arc<dyn EventStore>,
    events: u64,
    batch_size: usize,
) -> anyhow::Result<(u64, i64)> {
    let (mut count, mut sum) = (0u64, 0i64);
    let mut subscription = store.subscribe(Cursor::START, batch_size);
    while count < events {
        let Some(batch) = subscription.try_next().await? else {
            bail!("the subscription ended");
        };
        for event in &batch {
            count += 1;
            sum += captured(&event.data);
        }
    }
    Ok((count, sum))
}

/// Resets the peak RSS (VmHWM) to the current RSS, so that a phase's peak is
/// its own and not the seeding's (Linux ≥ 4.0); false where that is not possible.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A line of /proc/self/status in kB (0 where there is no procfs).
fn rss_kb(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse().ok())
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_share_all_appends_and_streams() {
        let w = W1 {
            name: "W",
            writers: 3,
            streams: 10,
            appends: 100,
            events_per_append: 1,
        };
        let shares: Vec<_> = (0..3).map(|k| w.share(k)).collect();
        assert_eq!(shares.iter().map(|s| s.1).sum::<usize>(), 100);
        let mut streams: Vec<String> = shares.into_iter().flat_map(|s| s.0).collect();
        streams.sort();
        streams.dedup();
        assert_eq!(streams.len(), 10);
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(redact("postgres://u:secret@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://x.db"), "sqlite://x.db");
    }

    /// `bench append`, small, on SQLite (`bench replay` runs through the real binary in
    /// `tests/bench_replay.rs`: its W3-export starts the binary as a server).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn append_runs_small_on_sqlite() {
        let (_dir, url) = scratch::temp_sqlite_url();
        run(BenchCommand::Append(AppendArgs {
            database_url: Some(url),
            writers: 3,
            streams: 7,
            appends: 40,
            batch_appends: 12,
            batch_events: 10,
        }))
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn append_runs_small_on_postgres() {
        run(BenchCommand::Append(AppendArgs {
            database_url: None,
            writers: 4,
            streams: 9,
            appends: 60,
            batch_appends: 20,
            batch_events: 10,
        }))
        .await
        .unwrap();
    }
}
