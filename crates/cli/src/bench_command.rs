//! `asiento bench command`: transfers through the command path without HTTP, against the same
//! transfers as plain SQL in the same run.
//!
//! "asiento" runs `LedgerFlow::transfer` (load the guards, decide, append with `Exact` versions,
//! retry on conflict, store the idempotency record) in process with `--tasks` concurrent tasks
//! among `--accounts` customer accounts funded from `treasury:main`. The limit is the same
//! transfers (the same accounts, amounts and order) as a plain ledger would write them: one
//! statement per transfer on PostgreSQL (lock both account rows in id order, debit with the
//! balance check, credit, insert the transfer row and its two entries: pgledger's shape), one
//! transaction of plain statements on SQLite. The two sides take turns (`--rounds`), each making
//! an equal share of the transfers per turn, so that a machine whose speed drifts during a run (a
//! shared VM) slows both alike. It prints `COMMAND-<backend> asiento=<transfers/s>
//! limit=<transfers/s> ratio=<x>` over all rounds, and on stderr each round's figures and the CPU
//! per transfer of each side (this process and, when it runs on this machine, the PostgreSQL
//! server), which tells a side that waits from a side that works.
//!
//! With `--batch N` each request is an atomic batch of N transfers (`LedgerFlow::transfer_batch`,
//! `POST /v1/transfers/batch`), and the limit writes the same N transfers in one SQL transaction
//! (on PostgreSQL locking every account of the batch in id order first, as a plain ledger must
//! to avoid deadlocks); the line is `COMMAND-BATCH<N>-<backend>`, still in transfers per second.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::bail;
use asiento_app::clock::SystemClock;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope};
use asiento_app::ledger::{LedgerFlow, NewTransfer};
use asiento_app::payments::Idempotent;
use asiento_app::reply::Answer;
use asiento_domain::{AccountName, Amount, Currency, TenantId};
use asiento_eventstore::Database;
use hdrhistogram::Histogram;
use uuid::Uuid;

use super::bench_cpu::{postmaster_pid, CpuReading};
use super::bench_e2e::{backend_name, BENCH_TENANT};
use super::{new_histogram, record, Target};

/// Funding of each customer account in `bench command`, in minor units.
const COMMAND_FUNDING_MINOR: i64 = 1_000_000_000;
const COMMAND_TRANSFER_MAX_MINOR: u64 = 1_000;
const COMMAND_POOL_EXTRA: u32 = 4;

#[derive(clap::Args, Debug)]
pub struct CommandArgs {
    /// Database to use (postgres://… or sqlite://…); must hold no events.
    /// Default: a fresh PostgreSQL test database, dropped afterwards.
    #[arg(long, env = super::BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// Customer accounts the transfers move money among.
    #[arg(long, default_value_t = 1_000)]
    pub accounts: u64,
    /// Concurrent tasks.
    #[arg(long, default_value_t = 8)]
    pub tasks: usize,
    /// Transfers to make (after funding).
    #[arg(long, default_value_t = 20_000)]
    pub commands: u64,
    /// Turns the two sides take, each making an equal share of the transfers per turn.
    #[arg(long, default_value_t = 4)]
    pub rounds: u64,
    /// Transfers per request: 1 for single transfers, up to 100 for atomic batches
    /// (`--commands` must be a multiple of it).
    #[arg(long, default_value_t = 1)]
    pub batch: u64,
}

fn idempotent(key: &str, route: &str, body: &serde_json::Value) -> anyhow::Result<Idempotent> {
    Ok(Idempotent {
        scope: Scope {
            tenant: BENCH_TENANT.to_owned(),
            method: "POST".to_owned(),
            route: route.to_owned(),
        },
        key: IdempotencyKey::parse(key).map_err(|e| anyhow::anyhow!("{e:?}"))?,
        body: canonical_body_hash(body),
        correlation_id: None,
    })
}

fn customer(i: u64) -> anyhow::Result<AccountName> {
    Ok(AccountName::parse(&format!("customer:{i}:available"))?)
}

/// One transfer through the flow; the answer's status (201 posted).
async fn transfer(
    flow: &LedgerFlow,
    key: &str,
    from: AccountName,
    to: AccountName,
    amount_minor: i64,
) -> anyhow::Result<u16> {
    let body = serde_json::json!({
        "from": from.as_str(), "to": to.as_str(), "amount_minor": amount_minor, "currency": "USD"
    });
    let request = idempotent(key, "/v1/transfers", &body)?;
    let answer = flow
        .transfer(
            &request,
            NewTransfer {
                tenant: TenantId::parse(BENCH_TENANT)?,
                from,
                to,
                amount: Amount::new(amount_minor),
                currency: Currency::parse("USD")?,
                description: None,
                pending: false,
                expires_at: None,
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("transfer failed: {e:?}"))?;
    Ok(match answer {
        Answer::Done(response) | Answer::Replayed(response) => response.status,
        Answer::InProgress { .. } => 409,
        Answer::KeyReused => 422,
    })
}

/// One atomic batch through the flow; the answer's status (201 all posted).
async fn transfer_batch(
    flow: &LedgerFlow,
    key: &str,
    draws: &[(u64, u64, i64)],
) -> anyhow::Result<u16> {
    let mut items = Vec::with_capacity(draws.len());
    let mut transfers = Vec::with_capacity(draws.len());
    for &(from, to, amount_minor) in draws {
        let (from, to) = (customer(from)?, customer(to)?);
        items.push(serde_json::json!({
            "from": from.as_str(), "to": to.as_str(), "amount_minor": amount_minor, "currency": "USD"
        }));
        transfers.push(NewTransfer {
            tenant: TenantId::parse(BENCH_TENANT)?,
            from,
            to,
            amount: Amount::new(amount_minor),
            currency: Currency::parse("USD")?,
            description: None,
            pending: false,
            expires_at: None,
        });
    }
    let body = serde_json::json!({ "transfers": items });
    let request = idempotent(key, "/v1/transfers/batch", &body)?;
    let answer = flow
        .transfer_batch(&request, transfers)
        .await
        .map_err(|e| anyhow::anyhow!("transfer batch failed: {e:?}"))?;
    Ok(match answer {
        Answer::Done(response) | Answer::Replayed(response) => response.status,
        Answer::InProgress { .. } => 409,
        Answer::KeyReused => 422,
    })
}

/// A small xorshift, so that each task picks its own pairs reproducibly.
fn xorshift(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

pub async fn command(args: CommandArgs) -> anyhow::Result<()> {
    if args.tasks == 0 || args.accounts < 2 {
        bail!("need at least one task and two accounts");
    }
    let batch_max = asiento_domain::transfer_batch::BATCH_TRANSFERS_MAX as u64;
    if !(1..=batch_max).contains(&args.batch) || args.commands % args.batch != 0 {
        bail!("--batch is 1 to {batch_max} and divides --commands");
    }
    let pool_size = u32::try_from(args.tasks)?.saturating_add(COMMAND_POOL_EXTRA);
    let target = Target::open(args.database_url.clone(), pool_size).await?;
    let result = command_on(&target.db, &args).await;
    target.close().await;
    result
}

async fn command_on(db: &Database, args: &CommandArgs) -> anyhow::Result<()> {
    let flow = LedgerFlow::new(
        db.clone(),
        asiento_app::commit::Writer::new(db.event_store()),
        Arc::new(SystemClock),
        Arc::new(asiento_api::render::JsonRender),
    );
    let run_id = Uuid::new_v4().simple().to_string();
    let treasury = AccountName::parse("treasury:main")?;
    let funding = Instant::now();
    for i in 0..args.accounts {
        let status = transfer(
            &flow,
            &format!("{run_id}-fund-{i}"),
            treasury.clone(),
            customer(i)?,
            COMMAND_FUNDING_MINOR,
        )
        .await?;
        if status != 201 {
            bail!("funding customer {i} answered {status}");
        }
    }
    eprintln!(
        "command funded {} accounts in {:.1}s",
        args.accounts,
        funding.elapsed().as_secs_f64()
    );

    let postmaster = postmaster_pid(db).await;
    create_plain_ledger(db, args.accounts).await?;
    let mut asiento = Side::new(args.tasks, args.accounts)?;
    let mut plain = Side::new(args.tasks, args.accounts)?;
    // The work is counted in requests: a transfer, or a batch of `--batch` transfers.
    let requests = args.commands / args.batch;
    let rounds = args.rounds.clamp(1, requests.max(1));
    for round in 0..rounds {
        let range = requests * round / rounds..requests * (round + 1) / rounds;
        let asiento_s = {
            let (flow, run_id) = (flow.clone(), run_id.clone());
            let one = move |i: u64, draws: Vec<(u64, u64, i64)>| {
                let (flow, key) = (flow.clone(), format!("{run_id}-t-{i}"));
                async move {
                    match draws[..] {
                        [(from, to, amount)] => {
                            transfer(&flow, &key, customer(from)?, customer(to)?, amount).await
                        }
                        _ => transfer_batch(&flow, &key, &draws).await,
                    }
                }
            };
            asiento
                .run(postmaster.as_deref(), range.clone(), args.batch, one)
                .await?
        };
        let plain_s = {
            let db = db.clone();
            let one = move |_: u64, draws: Vec<(u64, u64, i64)>| {
                let db = db.clone();
                async move {
                    let posted = match draws[..] {
                        [(from, to, amount)] => {
                            let (from, to) = (i64::try_from(from)?, i64::try_from(to)?);
                            plain_transfer(&db, from, to, amount).await?
                        }
                        _ => plain_batch(&db, &draws).await?,
                    };
                    Ok(if posted { 201 } else { 422 })
                }
            };
            plain
                .run(postmaster.as_deref(), range.clone(), args.batch, one)
                .await?
        };
        let transfers = ((range.end - range.start) * args.batch) as f64;
        eprintln!(
            "command round {}: asiento={:.0} limit={:.0} ratio={:.2}",
            round + 1,
            transfers / asiento_s,
            transfers / plain_s,
            plain_s / asiento_s.max(f64::EPSILON)
        );
    }
    let rate = args.commands as f64 / asiento.elapsed_s.max(f64::EPSILON);
    let limit = args.commands as f64 / plain.elapsed_s.max(f64::EPSILON);
    let name = match args.batch {
        1 => format!("COMMAND-{}", backend_name(db)),
        batch => format!("COMMAND-BATCH{batch}-{}", backend_name(db)),
    };
    println!(
        "{name} asiento={rate:.0} limit={limit:.0} ratio={:.2}",
        rate / limit.max(f64::EPSILON)
    );
    let plain_posted = plain.statuses.get(&201).copied().unwrap_or(0) * args.batch;
    eprintln!(
        "{name} tasks={} accounts={} commands={} rounds={rounds} in {:.1}s; answers {:?}; \
         latency_us p50={} p99={} max={}; plain posted {plain_posted}",
        args.tasks,
        args.accounts,
        args.commands,
        asiento.elapsed_s,
        asiento.statuses,
        asiento.latency.value_at_quantile(0.5),
        asiento.latency.value_at_quantile(0.99),
        asiento.latency.max()
    );
    let per_transfer_ms = |s: f64| s * 1e3 / (args.commands.max(1) as f64);
    let side = |cpu: &CpuReading| match cpu.postgres_s {
        Some(postgres_s) => format!(
            "process {:.3} ms, postgresql {:.3} ms, all {:.3} ms",
            per_transfer_ms(cpu.process_s),
            per_transfer_ms(postgres_s),
            per_transfer_ms(cpu.total_s())
        ),
        None => format!("process {:.3} ms", per_transfer_ms(cpu.process_s)),
    };
    // The limit's CPU per transfer against asiento's: the ratio a CPU-bound run would reach.
    eprintln!(
        "{name} cpu per transfer: asiento {}; limit {}; cpu_ratio={:.2}",
        side(&asiento.cpu),
        side(&plain.cpu),
        plain.cpu.total_s() / asiento.cpu.total_s().max(f64::EPSILON)
    );
    if plain_posted != args.commands {
        bail!(
            "the plain ledger posted {plain_posted} of {} transfers",
            args.commands
        );
    }
    let posted = asiento.statuses.get(&201).copied().unwrap_or(0) * args.batch;
    if posted != args.commands {
        bail!(
            "{} of {} transfers were not posted",
            args.commands - posted,
            args.commands
        );
    }
    Ok(())
}

/// One side of the run across its rounds: each task's draws carry on from round to round, so
/// both sides make the same transfers in the same order per task.
struct Side {
    rngs: Vec<u64>,
    accounts: u64,
    elapsed_s: f64,
    cpu: CpuReading,
    latency: Histogram<u64>,
    statuses: BTreeMap<u16, u64>,
}

impl Side {
    fn new(tasks: usize, accounts: u64) -> anyhow::Result<Side> {
        Ok(Side {
            rngs: (0..tasks).map(task_seed).collect(),
            accounts,
            elapsed_s: 0.0,
            cpu: CpuReading::none(),
            latency: new_histogram()?,
            statuses: BTreeMap::new(),
        })
    }

    /// Makes the requests numbered `range`, a task per draw state, each of `batch` transfers by
    /// `one(number, [(from, to, amount)])`, which answers its status (201: posted); the round's
    /// seconds.
    async fn run<F, Fut>(
        &mut self,
        postmaster: Option<&str>,
        range: std::ops::Range<u64>,
        batch: u64,
        one: F,
    ) -> anyhow::Result<f64>
    where
        F: Fn(u64, Vec<(u64, u64, i64)>) -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = anyhow::Result<u16>> + Send + 'static,
    {
        let next = Arc::new(AtomicU64::new(range.start));
        let accounts = self.accounts;
        let started = Instant::now();
        let cpu_before = CpuReading::now(postmaster);
        let mut tasks = Vec::with_capacity(self.rngs.len());
        for &seed in &self.rngs {
            let (next, one, end) = (Arc::clone(&next), one.clone(), range.end);
            tasks.push(tokio::spawn(async move {
                let mut rng = seed;
                let mut latency = new_histogram()?;
                let mut statuses = BTreeMap::<u16, u64>::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= end {
                        break;
                    }
                    let drawn = (0..batch).map(|_| draw(&mut rng, accounts)).collect();
                    let t = Instant::now();
                    let status = one(i, drawn).await?;
                    record(&mut latency, t);
                    *statuses.entry(status).or_default() += 1;
                }
                anyhow::Ok((rng, latency, statuses))
            }));
        }
        for (task, handle) in tasks.into_iter().enumerate() {
            let (rng, latency, statuses) = handle.await??;
            self.rngs[task] = rng;
            self.latency.add(latency)?;
            for (status, n) in statuses {
                *self.statuses.entry(status).or_default() += n;
            }
        }
        let elapsed_s = started.elapsed().as_secs_f64();
        self.cpu = self
            .cpu
            .plus(&CpuReading::now(postmaster).since(&cpu_before));
        self.elapsed_s += elapsed_s;
        Ok(elapsed_s)
    }
}

/// The transfers of a run: task `task`'s `n`-th draw is the same on both sides.
fn draw(rng: &mut u64, accounts: u64) -> (u64, u64, i64) {
    let from = xorshift(rng) % accounts;
    let to = (from + 1 + xorshift(rng) % (accounts - 1)) % accounts;
    let amount = 1 + xorshift(rng) % COMMAND_TRANSFER_MAX_MINOR;
    (from, to, i64::try_from(amount).unwrap_or(1))
}

fn task_seed(task: usize) -> u64 {
    0x9e37_79b9_7f4a_7c15u64 ^ (task as u64 + 1)
}

/// The plain ledger's tables, dropped first.
async fn create_plain_ledger(db: &Database, accounts: u64) -> anyhow::Result<()> {
    let statements: &[&str] = match db {
        Database::Postgres(_) => &[
            "DROP TABLE IF EXISTS bench_ledger_entries, bench_ledger_transfers, bench_ledger_accounts",
            "CREATE TABLE bench_ledger_accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL)",
            "CREATE TABLE bench_ledger_transfers (id BIGSERIAL PRIMARY KEY, from_id BIGINT NOT NULL \
             REFERENCES bench_ledger_accounts, to_id BIGINT NOT NULL REFERENCES bench_ledger_accounts, \
             amount BIGINT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())",
            "CREATE TABLE bench_ledger_entries (id BIGSERIAL PRIMARY KEY, transfer_id BIGINT NOT NULL \
             REFERENCES bench_ledger_transfers, account_id BIGINT NOT NULL REFERENCES \
             bench_ledger_accounts, amount BIGINT NOT NULL)",
        ],
        Database::Sqlite(_) => &[
            "DROP TABLE IF EXISTS bench_ledger_entries",
            "DROP TABLE IF EXISTS bench_ledger_transfers",
            "DROP TABLE IF EXISTS bench_ledger_accounts",
            "CREATE TABLE bench_ledger_accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
            "CREATE TABLE bench_ledger_transfers (id INTEGER PRIMARY KEY, from_id INTEGER NOT NULL \
             REFERENCES bench_ledger_accounts, to_id INTEGER NOT NULL REFERENCES bench_ledger_accounts, \
             amount INTEGER NOT NULL, created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
            "CREATE TABLE bench_ledger_entries (id INTEGER PRIMARY KEY, transfer_id INTEGER NOT NULL \
             REFERENCES bench_ledger_transfers, account_id INTEGER NOT NULL REFERENCES \
             bench_ledger_accounts, amount INTEGER NOT NULL)",
        ],
    };
    for statement in statements {
        match db {
            Database::Postgres(pool) => sqlx::query(statement).execute(pool).await?.rows_affected(),
            Database::Sqlite(pool) => sqlx::query(statement).execute(pool).await?.rows_affected(),
        };
    }
    let funding = "INSERT INTO bench_ledger_accounts (id, balance) VALUES ($1, $2)";
    for id in 0..accounts {
        let id = i64::try_from(id)?;
        match db {
            Database::Postgres(pool) => sqlx::query(funding)
                .bind(id)
                .bind(COMMAND_FUNDING_MINOR)
                .execute(pool)
                .await?
                .rows_affected(),
            Database::Sqlite(pool) => sqlx::query(funding)
                .bind(id)
                .bind(COMMAND_FUNDING_MINOR)
                .execute(pool)
                .await?
                .rows_affected(),
        };
    }
    Ok(())
}

/// One transfer as a plain ledger writes it: locks both rows in id order, debits with the
/// balance check, credits, and records the transfer and its two entries. Whether it posted.
const PLAIN_TRANSFER_PG: &str = "WITH locked AS (
        SELECT id FROM bench_ledger_accounts WHERE id IN ($1, $2) ORDER BY id FOR UPDATE),
    debit AS (
        UPDATE bench_ledger_accounts SET balance = balance - $3
        WHERE id = $1 AND balance >= $3 AND (SELECT count(*) FROM locked) = 2 RETURNING id),
    credit AS (
        UPDATE bench_ledger_accounts SET balance = balance + $3
        WHERE id = $2 AND EXISTS (SELECT 1 FROM debit) RETURNING id),
    transfer AS (
        INSERT INTO bench_ledger_transfers (from_id, to_id, amount)
        SELECT $1, $2, $3 FROM credit RETURNING id)
    INSERT INTO bench_ledger_entries (transfer_id, account_id, amount)
    SELECT id, $1, -$3 FROM transfer UNION ALL SELECT id, $2, $3 FROM transfer";

async fn plain_transfer(db: &Database, from: i64, to: i64, amount: i64) -> anyhow::Result<bool> {
    match db {
        Database::Postgres(pool) => {
            let mut conn = pool.acquire().await?;
            pg_transfer(&mut conn, from, to, amount).await
        }
        Database::Sqlite(pool) => {
            let mut tx = pool.begin().await?;
            if !sqlite_transfer(&mut tx, from, to, amount).await? {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            Ok(true)
        }
    }
}

/// A batch of transfers as a plain ledger writes it, in one transaction: on PostgreSQL every
/// account of the batch locked in id order first (two batches locking pair by pair would
/// deadlock), then each transfer's statement; all posted or none. Whether it posted.
async fn plain_batch(db: &Database, draws: &[(u64, u64, i64)]) -> anyhow::Result<bool> {
    let mut transfers = Vec::with_capacity(draws.len());
    for &(from, to, amount) in draws {
        transfers.push((i64::try_from(from)?, i64::try_from(to)?, amount));
    }
    match db {
        Database::Postgres(pool) => {
            let mut ids: Vec<i64> = transfers.iter().flat_map(|&(f, t, _)| [f, t]).collect();
            ids.sort_unstable();
            ids.dedup();
            let mut tx = pool.begin().await?;
            sqlx::query(
                "SELECT id FROM bench_ledger_accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            )
            .bind(&ids)
            .fetch_all(&mut *tx)
            .await?;
            for &(from, to, amount) in &transfers {
                if !pg_transfer(&mut tx, from, to, amount).await? {
                    tx.rollback().await?;
                    return Ok(false);
                }
            }
            tx.commit().await?;
            Ok(true)
        }
        Database::Sqlite(pool) => {
            let mut tx = pool.begin().await?;
            for &(from, to, amount) in &transfers {
                if !sqlite_transfer(&mut tx, from, to, amount).await? {
                    tx.rollback().await?;
                    return Ok(false);
                }
            }
            tx.commit().await?;
            Ok(true)
        }
    }
}

/// [`PLAIN_TRANSFER_PG`] on `conn`; whether it posted.
async fn pg_transfer(
    conn: &mut sqlx::PgConnection,
    from: i64,
    to: i64,
    amount: i64,
) -> anyhow::Result<bool> {
    let rows = sqlx::query(PLAIN_TRANSFER_PG)
        .bind(from)
        .bind(to)
        .bind(amount)
        .execute(conn)
        .await?
        .rows_affected();
    Ok(rows == 2)
}

/// One transfer's plain statements on SQLite, in the caller's transaction; whether it posted
/// (false: the debit found too little, and the caller rolls back).
async fn sqlite_transfer(
    conn: &mut sqlx::SqliteConnection,
    from: i64,
    to: i64,
    amount: i64,
) -> anyhow::Result<bool> {
    let debited = sqlx::query(
        "UPDATE bench_ledger_accounts SET balance = balance - $2 WHERE id = $1 AND balance >= $2",
    )
    .bind(from)
    .bind(amount)
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if debited != 1 {
        return Ok(false);
    }
    sqlx::query("UPDATE bench_ledger_accounts SET balance = balance + $2 WHERE id = $1")
        .bind(to)
        .bind(amount)
        .execute(&mut *conn)
        .await?;
    let transfer: i64 = sqlx::query_scalar(
        "INSERT INTO bench_ledger_transfers (from_id, to_id, amount) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(from)
    .bind(to)
    .bind(amount)
    .fetch_one(&mut *conn)
    .await?;
    sqlx::query(
        "INSERT INTO bench_ledger_entries (transfer_id, account_id, amount) VALUES ($1, $2, $3), ($1, $4, $5)",
    )
    .bind(transfer)
    .bind(from)
    .bind(-amount)
    .bind(to)
    .bind(amount)
    .execute(&mut *conn)
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use asiento_eventstore::scratch;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn command_runs_small_on_sqlite() {
        let (_dir, url) = scratch::temp_sqlite_url();
        command(CommandArgs {
            database_url: Some(url),
            accounts: 20,
            tasks: 3,
            commands: 150,
            rounds: 2,
            batch: 1,
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn command_runs_batches_on_sqlite() {
        let (_dir, url) = scratch::temp_sqlite_url();
        command(CommandArgs {
            database_url: Some(url),
            accounts: 20,
            tasks: 3,
            commands: 150,
            rounds: 2,
            batch: 10,
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn command_runs_batches_on_postgres() {
        command(CommandArgs {
            database_url: None,
            accounts: 20,
            tasks: 4,
            commands: 150,
            rounds: 3,
            batch: 10,
        })
        .await
        .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn command_runs_small_on_postgres() {
        command(CommandArgs {
            database_url: None,
            accounts: 20,
            tasks: 4,
            commands: 150,
            rounds: 3,
            batch: 1,
        })
        .await
        .unwrap();
    }
}
