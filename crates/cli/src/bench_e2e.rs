//! `asiento bench e2e`: the whole path of a payment over HTTP.
//!
//! `e2e` starts the real server as a child process (this binary, `serve`, the
//! in-process simulator, `pm_card_ok`), drives it with `--clients` concurrent
//! HTTP clients creating payments (every `--refund-every`-th one also
//! refunded) with unique Idempotency-Keys, and reports accepted payments/s,
//! latency percentiles, answers by status and the server's peak RSS. On
//! PostgreSQL the same clients drive, in the same run, the plain-SQL baseline
//! (`bench_baseline.rs`, a server process of its own, half its payments before
//! asiento's load and half after), and it prints
//! `E2E-postgres asiento=<payments/s> baseline=<payments/s> ratio=<x>` with each
//! side's CPU per payment. It also measures two floors: the HTTP floor (`GET
//! /healthz` requests/s with the same clients) and the database floor (plain
//! single-row INSERT transactions/s on the same database, with the same clients,
//! divided by the transactions one payment takes, counted in this run; half of
//! them before the server starts and half after it stops), which is the figure
//! of `E2E-sqlite asiento=<payments/s> limit=<database floor> ratio=<x>`.
//! With `--events-relay nats://…` the server also publishes its merchant events to
//! JetStream: the same figures with the relay running, to compare with a run without.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use asiento_eventstore::{Backend, Database};
use hdrhistogram::Histogram;
use sqlx::types::Json;
use tokio::io::{AsyncBufReadExt, BufReader};
use uuid::Uuid;

use super::bench_cpu::{cpu_s, postgres_cpu_s, postmaster_pid, CpuReading};
use super::{new_histogram, record, Target, PLAIN_INSERT_PG};

pub(super) const BENCH_TENANT: &str = "bench";
pub(super) const BENCH_API_KEY: &str = "sk_bench_0123456789abcdef";
/// How long the server may take to print its listening line.
const SERVER_START_MAX_S: u64 = 120;
/// How long the server may take to stop after SIGTERM.
const SERVER_STOP_MAX_S: u64 = 20;
/// After the load: wait until the webhook worker and the projectors are idle
/// (their counters unchanged for this long), at most `SETTLE_MAX_S`.
const SETTLE_QUIET_MS: u64 = 1_500;
const SETTLE_MAX_S: u64 = 60;
const SETTLE_POLL_MS: u64 = 250;
const PAYMENT_AMOUNT_MINOR: i64 = 10_000;
const REFUND_AMOUNT_MINOR: i64 = 2_500;
/// Payments are spread over this many customers.
const E2E_CUSTOMERS: u64 = 1_000;
/// Write transactions of one create (claim + intent, finalize) and of one
/// refund (claim + refund requested, finalize); see `TxCount`.
const TX_PER_CREATE: f64 = 2.0;
const TX_PER_REFUND: f64 = 2.0;
/// Write transactions per webhook: stored by the handler, applied and marked
/// processed by the worker.
const TX_PER_WEBHOOK: f64 = 2.0;

#[derive(clap::Args, Debug)]
pub struct E2eArgs {
    /// Database the server uses (postgres://… or sqlite://…); must hold no
    /// events. Default: a fresh PostgreSQL test database, dropped afterwards.
    #[arg(long, env = super::BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// Concurrent HTTP clients (also for both floors).
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Payments to create.
    #[arg(long, default_value_t = 5_000)]
    pub payments: u64,
    /// Every n-th payment is also refunded (partially); 0: none.
    #[arg(long, default_value_t = 5)]
    pub refund_every: u64,
    /// `GET /healthz` requests of the HTTP floor.
    #[arg(long, default_value_t = 20_000)]
    pub healthz_requests: u64,
    /// Plain INSERT transactions of the database floor.
    #[arg(long, default_value_t = 20_000)]
    pub floor_transactions: u64,
    /// The server binary (default: this executable; the baseline is always this executable's).
    #[arg(long)]
    pub server_bin: Option<std::path::PathBuf>,
    /// Also run the same load with every payment to one customer (a marketplace seller who
    /// receives every payment), after the spread load on the same server, and report its
    /// payments/s against the spread load's (`E2E-HOT-…`).
    #[arg(long)]
    pub hot_account: bool,
    /// A NATS server (`nats://…`) the server relays its merchant events to (`serve
    /// --events-relay`): the same load with the relay running, to compare with a run without.
    #[arg(long)]
    pub events_relay: Option<String>,
    /// Reads the server's peak RSS once this many payments are accepted, and reports the peak
    /// after the whole load against it (`E2E-MEMORY-…`): whether what the server keeps is
    /// bounded (`--payments 200000 --rss-after 20000`).
    #[arg(long)]
    pub rss_after: Option<u64>,
    /// Runs no baseline (on PostgreSQL): for a run that measures something else, such as
    /// `--rss-after`, at half the time.
    #[arg(long)]
    pub skip_baseline: bool,
    /// Runs the provider simulator as a process of its own (`asiento psp-sim`) instead of in the
    /// server, so that the server's memory and CPU are asiento's alone (with `--rss-after`).
    #[arg(long)]
    pub standalone_sim: bool,
    /// A hot standby of the database's server that the server under test sends its query routes
    /// to (`serve --read-database-url`; its database name is replaced with the bench's).
    #[arg(long)]
    pub read_database_url: Option<String>,
}

// ------------------------------------------------------------------ the server

/// The server under test, a child process.
pub(super) struct Server {
    child: tokio::process::Child,
    pub(super) pid: u32,
    pub(super) base: String,
}

impl Server {
    /// `asiento serve` on `database_url` with the bench tenant's key and `extra` arguments.
    pub(super) async fn start(
        bin: &std::path::Path,
        database_url: &str,
        extra: &[&str],
    ) -> anyhow::Result<Server> {
        Server::start_at(bin, database_url, extra, &free_address()?).await
    }

    /// [`Server::start`] listening on `listen`.
    async fn start_at(
        bin: &std::path::Path,
        database_url: &str,
        extra: &[&str],
        listen: &str,
    ) -> anyhow::Result<Server> {
        let key = format!("{BENCH_TENANT}:{BENCH_API_KEY}");
        let args = ["serve", "--database-url", database_url, "--api-keys", &key];
        Server::spawn(bin, &[&args[..], extra].concat(), listen).await
    }

    /// The provider simulator as a process of its own (`asiento psp-sim`), delivering its
    /// webhooks to `webhook_url` signed with `secret`.
    async fn start_simulator(
        bin: &std::path::Path,
        webhook_url: &str,
        secret: &str,
    ) -> anyhow::Result<Server> {
        let args = [
            "psp-sim",
            "--webhook-url",
            webhook_url,
            "--webhook-secret",
            secret,
        ];
        Server::spawn(bin, &args, &free_address()?).await
    }

    /// The plain-SQL baseline (`bench baseline-serve`) on `database_url`, with the same key.
    async fn start_baseline(bin: &std::path::Path, database_url: &str) -> anyhow::Result<Server> {
        let key = format!("{BENCH_TENANT}:{BENCH_API_KEY}");
        let args = [
            "bench",
            "baseline-serve",
            "--database-url",
            database_url,
            "--api-key",
            &key,
        ];
        Server::spawn(bin, &args, &free_address()?).await
    }

    /// `bin args… --listen <listen>`, once it prints its listening line.
    async fn spawn(bin: &std::path::Path, args: &[&str], listen: &str) -> anyhow::Result<Server> {
        let mut child = tokio::process::Command::new(bin)
            .args(args)
            .args(["--listen", listen])
            .env("ASIENTO_LOG", "warn,sqlx=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().context("the server exited at once")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let listening = tokio::time::timeout(Duration::from_secs(SERVER_START_MAX_S), async {
            while let Some(line) = lines.next_line().await? {
                if line.contains("listening on http://") {
                    return anyhow::Ok(());
                }
            }
            bail!("the server exited before listening")
        })
        .await;
        match listening {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => bail!("the server did not listen within {SERVER_START_MAX_S}s"),
        }
        // Keep draining stdout, so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        eprintln!("e2e server pid {pid} on http://{listen}");
        Ok(Server {
            child,
            pid,
            base: format!("http://{listen}"),
        })
    }

    /// SIGTERM (a graceful stop), then SIGKILL if it takes too long.
    pub(super) async fn stop(mut self) -> anyhow::Result<()> {
        let _ = tokio::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .await;
        match tokio::time::timeout(Duration::from_secs(SERVER_STOP_MAX_S), self.child.wait()).await
        {
            Ok(status) => {
                status?;
            }
            Err(_) => {
                eprintln!("e2e server did not stop within {SERVER_STOP_MAX_S}s: killing it");
                self.child.kill().await?;
            }
        }
        Ok(())
    }
}

/// A loopback address with a port free right now.
fn free_address() -> anyhow::Result<String> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(format!("127.0.0.1:{port}"))
}

/// A line of /proc/<pid>/status in kB (0 where there is no procfs).
pub(super) fn proc_kb(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
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

/// The server's counters the transaction count needs, from `/metrics`, and the group commit
/// steps written alone after their batch's statement refused itself.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counters {
    projector_batches: f64,
    webhooks_received: f64,
    webhooks_processed: f64,
    retried_alone: f64,
}

impl Counters {
    fn parse(text: &str) -> Counters {
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let metric = name.split('{').next().unwrap_or(name);
            match metric {
                "asiento_projection_batch_seconds_count" => c.projector_batches += value,
                "asiento_webhooks_received_total" => c.webhooks_received += value,
                "asiento_webhook_events_processed_total" => c.webhooks_processed += value,
                "asiento_group_commit_retried_alone_total" => c.retried_alone += value,
                _ => {}
            }
        }
        c
    }

    fn minus(self, before: Counters) -> Counters {
        Counters {
            projector_batches: self.projector_batches - before.projector_batches,
            webhooks_received: self.webhooks_received - before.webhooks_received,
            webhooks_processed: self.webhooks_processed - before.webhooks_processed,
            retried_alone: self.retried_alone - before.retried_alone,
        }
    }
}

async fn scrape(client: &reqwest::Client, base: &str) -> anyhow::Result<Counters> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    Ok(Counters::parse(&text))
}

/// Write transactions per payment, counted in this run: every create takes
/// two (the claim + `PaymentIntended`, the finalize), every
/// refund two (the claim + `RefundRequested`, the finalize), every webhook the
/// simulator sends two (stored by the handler; applied and marked processed
/// by the worker), and every projector batch one.
#[derive(Debug, Clone, Copy)]
struct TxCount {
    payments: u64,
    refunds: u64,
    counters: Counters,
}

impl TxCount {
    fn total(&self) -> f64 {
        self.payments as f64 * TX_PER_CREATE
            + self.refunds as f64 * TX_PER_REFUND
            + self
                .counters
                .webhooks_received
                .max(self.counters.webhooks_processed)
                * TX_PER_WEBHOOK
            + self.counters.projector_batches
    }

    fn per_payment(&self) -> f64 {
        self.total() / (self.payments.max(1) as f64)
    }
}

// -------------------------------------------------------------------- the load

#[derive(Debug, Default)]
struct LoadResult {
    accepted: u64,
    refunds: u64,
    statuses: BTreeMap<u16, u64>,
    create_latency: Option<Histogram<u64>>,
    refund_latency: Option<Histogram<u64>>,
}

fn merge(into: &mut Option<Histogram<u64>>, h: Histogram<u64>) -> anyhow::Result<()> {
    match into {
        Some(total) => total.add(h)?,
        None => *into = Some(h),
    }
    Ok(())
}

impl LoadResult {
    /// Adds what another part of the same load did.
    fn add(&mut self, other: LoadResult) -> anyhow::Result<()> {
        self.accepted += other.accepted;
        self.refunds += other.refunds;
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        if let Some(h) = other.create_latency {
            merge(&mut self.create_latency, h)?;
        }
        if let Some(h) = other.refund_latency {
            merge(&mut self.refund_latency, h)?;
        }
        Ok(())
    }
}

/// `payments` payments spread over `customers` customers.
async fn run_load(
    client: &reqwest::Client,
    base: &str,
    args: &E2eArgs,
    payments: u64,
    run_id: &str,
    customers: u64,
) -> anyhow::Result<(Duration, LoadResult)> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        let (client, base, next) = (client.clone(), base.to_owned(), Arc::clone(&next));
        let (refund_every, run_id) = (args.refund_every, run_id.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut out = LoadResult::default();
            let (mut create, mut refund) = (new_histogram()?, new_histogram()?);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= payments {
                    break;
                }
                let body = serde_json::json!({
                    "amount_minor": PAYMENT_AMOUNT_MINOR,
                    "currency": "USD",
                    "customer": format!("c{}", i % customers),
                    "provider": "sim",
                    "payment_method": "pm_card_ok",
                    "description": format!("bench {i}"),
                });
                let t = Instant::now();
                let answer = client
                    .post(format!("{base}/v1/payments"))
                    .bearer_auth(BENCH_API_KEY)
                    .header("Idempotency-Key", format!("{run_id}-pay-{i}"))
                    .json(&body)
                    .send()
                    .await;
                let (status, id) = match answer {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let json: serde_json::Value = response.json().await.unwrap_or_default();
                        let id = json["id"].as_str().map(str::to_owned);
                        (status, id)
                    }
                    Err(_) => (0, None),
                };
                record(&mut create, t);
                *out.statuses.entry(status).or_default() += 1;
                if !(status == 201 || status == 202) {
                    continue;
                }
                out.accepted += 1;
                let (Some(id), true) = (id, refund_every > 0 && (i + 1) % refund_every == 0) else {
                    continue;
                };
                let t = Instant::now();
                let answer = client
                    .post(format!("{base}/v1/payments/{id}/refunds"))
                    .bearer_auth(BENCH_API_KEY)
                    .header("Idempotency-Key", format!("{run_id}-refund-{i}"))
                    .json(&serde_json::json!({ "amount_minor": REFUND_AMOUNT_MINOR }))
                    .send()
                    .await;
                let status = match answer {
                    Ok(response) => {
                        let status = response.status().as_u16();
                        let _ = response.bytes().await;
                        status
                    }
                    Err(_) => 0,
                };
                record(&mut refund, t);
                *out.statuses.entry(status).or_default() += 1;
                if status == 201 || status == 202 {
                    out.refunds += 1;
                }
            }
            out.create_latency = Some(create);
            out.refund_latency = Some(refund);
            anyhow::Ok(out)
        }));
    }
    let mut total = LoadResult::default();
    for task in tasks {
        total.add(task.await??)?;
    }
    Ok((started.elapsed(), total))
}

/// The HTTP floor: `GET /healthz` with the same clients.
async fn run_healthz(
    client: &reqwest::Client,
    base: &str,
    clients: usize,
    requests: u64,
) -> anyhow::Result<(f64, u64)> {
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (client, url, next) = (client.clone(), format!("{base}/healthz"), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            let mut failed = 0u64;
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                match client.get(&url).send().await {
                    Ok(r) if r.status().is_success() => {
                        let _ = r.bytes().await;
                    }
                    _ => failed += 1,
                }
            }
            failed
        }));
    }
    let mut failed = 0;
    for task in tasks {
        failed += task.await?;
    }
    Ok((
        requests as f64 / started.elapsed().as_secs_f64().max(f64::EPSILON),
        failed,
    ))
}

/// One part of the database floor: the transactions numbered `range`, single-row INSERT
/// transactions (an event-sized row into `bench_plain`, the shape and constraints of `events`)
/// with `clients` concurrent connections, and the wall time and CPU (this process and
/// PostgreSQL's) they took.
async fn run_plain_transactions(
    db: &Database,
    clients: usize,
    range: std::ops::Range<u64>,
    postgres: Option<&str>,
) -> anyhow::Result<FloorPart> {
    let cpu_before = CpuReading::now(postgres);
    let next = Arc::new(AtomicU64::new(range.start));
    let end = range.end;
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (db, next) = (db.clone(), Arc::clone(&next));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                let e = super::bench_event(i);
                let stream = format!("floor-{i}");
                match &db {
                    Database::Postgres(pool) => {
                        sqlx::query(PLAIN_INSERT_PG)
                            .bind(&stream)
                            .bind(1i64)
                            .bind(e.event_id)
                            .bind(&e.event_type)
                            .bind(e.schema)
                            .bind(Json(&e.data))
                            .bind(Json(&e.metadata))
                            .execute(pool)
                            .await?;
                    }
                    Database::Sqlite(pool) => {
                        sqlx::query(
                            "INSERT INTO bench_plain \
                             (stream_id, version, event_id, event_type, schema, data, metadata) \
                             VALUES (?, ?, ?, ?, ?, ?, ?)",
                        )
                        .bind(&stream)
                        .bind(1i64)
                        .bind(e.event_id)
                        .bind(&e.event_type)
                        .bind(e.schema)
                        .bind(Json(&e.data))
                        .bind(Json(&e.metadata))
                        .execute(pool)
                        .await?;
                    }
                }
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    Ok(FloorPart {
        transactions: range.end - range.start,
        elapsed_s,
        cpu_s: CpuReading::now(postgres).since(&cpu_before).total_s(),
    })
}

/// What a part of the database floor did and took.
#[derive(Debug, Clone, Copy)]
struct FloorPart {
    transactions: u64,
    elapsed_s: f64,
    cpu_s: f64,
}

impl std::ops::Add for FloorPart {
    type Output = FloorPart;

    fn add(self, other: FloorPart) -> FloorPart {
        FloorPart {
            transactions: self.transactions + other.transactions,
            elapsed_s: self.elapsed_s + other.elapsed_s,
            cpu_s: self.cpu_s + other.cpu_s,
        }
    }
}

/// What the baseline's load did and took (both its halves).
#[derive(Debug, Default)]
struct BaselineRun {
    elapsed: Duration,
    load: LoadResult,
    cpu_server_s: f64,
    cpu_postgres_s: f64,
}

impl BaselineRun {
    fn rate(&self) -> f64 {
        self.load.accepted as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// `payments` payments against the plain-SQL baseline (`bench_baseline.rs`), a server process of
/// its own on the same database, added to `run`.
async fn run_baseline(
    run: &mut BaselineRun,
    (bin, url): (&std::path::Path, &str),
    client: &reqwest::Client,
    args: &E2eArgs,
    payments: u64,
    postgres: Option<&str>,
) -> anyhow::Result<()> {
    let server = Server::start_baseline(bin, url).await?;
    let outcome = async {
        let pid = server.pid.to_string();
        let before = (cpu_s(&pid), postgres.map(postgres_cpu_s));
        let run_id = format!("baseline-{}", Uuid::new_v4().simple());
        let (elapsed, load) =
            run_load(client, &server.base, args, payments, &run_id, E2E_CUSTOMERS).await?;
        run.elapsed += elapsed;
        run.load.add(load)?;
        run.cpu_server_s += cpu_s(&pid) - before.0;
        if let (Some(after), Some(before)) = (postgres.map(postgres_cpu_s), before.1) {
            run.cpu_postgres_s += after - before;
        }
        anyhow::Ok(())
    }
    .await;
    server.stop().await?;
    outcome
}

/// The baseline's books after its load: its entries sum to zero, its clearing account holds what
/// its succeeded payments took less what its succeeded refunds gave back, two legs each, and
/// every payment and refund it answered as accepted succeeded. A baseline that did less than its
/// answers say would flatter nothing but itself.
async fn check_baseline(db: &Database, run: &BaselineRun) -> anyhow::Result<String> {
    let Database::Postgres(pool) = db else {
        bail!("the baseline runs on PostgreSQL only");
    };
    type Books = (i64, i64, i64, i64, i64, i64);
    let (sum, legs, clearing, owed, payments, refunds): Books = sqlx::query_as(
        "SELECT (SELECT COALESCE(SUM(amount_minor), 0)::bigint FROM baseline_entries), \
                (SELECT COUNT(*) FROM baseline_entries), \
                (SELECT COALESCE(SUM(amount_minor), 0)::bigint FROM baseline_entries \
                 WHERE account = 'psp:sim:clearing'), \
                (SELECT COALESCE(SUM(amount_minor), 0)::bigint FROM baseline_payments \
                 WHERE status = 'succeeded') \
                - (SELECT COALESCE(SUM(amount_minor), 0)::bigint FROM baseline_refunds \
                   WHERE status = 'succeeded'), \
                (SELECT COUNT(*) FROM baseline_payments WHERE status = 'succeeded'), \
                (SELECT COUNT(*) FROM baseline_refunds WHERE status = 'succeeded')",
    )
    .fetch_one(pool)
    .await?;
    let (payments, refunds) = (u64::try_from(payments)?, u64::try_from(refunds)?);
    let books = format!(
        "entries sum to {sum}, {legs} legs, clearing {clearing} of {owed} owed, {payments} payments \
         and {refunds} refunds succeeded"
    );
    let legs_right = u64::try_from(legs)? == 2 * (payments + refunds);
    if sum != 0 || !legs_right || clearing != owed {
        bail!("the baseline's books do not add up: {books}");
    }
    if payments < run.load.accepted || refunds < run.load.refunds {
        bail!(
            "the baseline answered {} payments and {} refunds as accepted: {books}",
            run.load.accepted,
            run.load.refunds
        );
    }
    Ok(books)
}

/// Waits until the webhook worker and the projectors have finished what the
/// load left them (their counters still for a while).
async fn settle(client: &reqwest::Client, base: &str) -> anyhow::Result<Counters> {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_MAX_S);
    let mut last = scrape(client, base).await?;
    let mut still_since = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(SETTLE_POLL_MS)).await;
        let now = scrape(client, base).await?;
        if now != last {
            last = now;
            still_since = Instant::now();
        } else if still_since.elapsed() >= Duration::from_millis(SETTLE_QUIET_MS) {
            return Ok(now);
        }
        if Instant::now() > deadline {
            eprintln!("e2e: the server was still busy {SETTLE_MAX_S}s after the load");
            return Ok(now);
        }
    }
}

pub(super) fn backend_name(db: &Database) -> &'static str {
    match db.backend() {
        Backend::Postgres => "postgres",
        Backend::Sqlite => "sqlite",
    }
}

pub async fn e2e(args: E2eArgs) -> anyhow::Result<()> {
    if args.clients == 0 || args.payments == 0 {
        bail!("need at least one client and one payment");
    }
    let bin = match &args.server_bin {
        Some(bin) => bin.clone(),
        None => std::env::current_exe()?,
    };
    let pool_size = u32::try_from(args.clients)?.saturating_add(super::POOL_CONNECTIONS_EXTRA);
    let target = Target::open(args.database_url.clone(), pool_size).await?;
    let url = match (&args.database_url, &target.fresh_url) {
        (Some(url), _) | (None, Some(url)) => url.clone(),
        (None, None) => bail!("no database"),
    };
    let backend = backend_name(&target.db);
    let result = e2e_on(&target.db, &url, &bin, &args, backend).await;
    target.close().await;
    result
}

async fn e2e_on(
    db: &Database,
    url: &str,
    bin: &std::path::Path,
    args: &E2eArgs,
    backend: &str,
) -> anyhow::Result<()> {
    // PostgreSQL's server process, when it runs here: its CPU is counted for the load and the floor.
    let postgres = postmaster_pid(db).await;
    let postgres_cpu = || postgres.as_deref().map(postgres_cpu_s);
    // The database floor runs in two halves on the same database, before the server starts and
    // after it stops, so that the machine's speed drifting during the run (on a shared VM it
    // does, by ±15 % within a minute) moves the floor and the load alike.
    super::create_plain_table(db).await?;
    let floor_half = args.floor_transactions / 2;
    let floor_before =
        run_plain_transactions(db, args.clients, 0..floor_half, postgres.as_deref()).await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients)
        .timeout(Duration::from_secs(60))
        .build()?;
    // The baseline, on PostgreSQL: half its payments before asiento's load and half after, as
    // the floor, so that drift moves both sides alike.
    let with_baseline = db.backend() == Backend::Postgres && !args.skip_baseline;
    let baseline_half = args.payments / 2;
    // Always this binary's baseline, whatever `--server-bin` names: it must not move.
    let baseline_bin = std::env::current_exe()?;
    let mut baseline = BaselineRun::default();
    if with_baseline {
        let target = (baseline_bin.as_path(), url);
        run_baseline(
            &mut baseline,
            target,
            &client,
            args,
            baseline_half,
            postgres.as_deref(),
        )
        .await?;
    }
    let mut extra: Vec<String> = args
        .events_relay
        .iter()
        .flat_map(|url| ["--events-relay".to_owned(), url.clone()])
        .collect();
    if let Some(standby) = &args.read_database_url {
        let standby = super::bench_reads::with_database_of(standby, url)?;
        extra.extend(["--read-database-url".to_owned(), standby]);
    }
    // With `--standalone-sim` the simulator, whose records of charges grow with the load as a
    // provider's do, runs as a process of its own: the server's memory is asiento's alone.
    let listen = free_address()?;
    let simulator = if args.standalone_sim {
        let secret = asiento_psp_sim::random_webhook_secret();
        let webhooks = format!("http://{listen}/webhooks/sim");
        let simulator = Server::start_simulator(&baseline_bin, &webhooks, &secret).await?;
        extra.extend(["--psp-url".to_owned(), simulator.base.clone()]);
        extra.extend(["--webhook-secret".to_owned(), secret]);
        Some(simulator)
    } else {
        None
    };
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let server = Server::start_at(bin, url, &extra, &listen).await?;
    let outcome = async {
        let rss_idle_kb = proc_kb(server.pid, "VmRSS");
        let before = scrape(&client, &server.base).await?;
        let run_id = Uuid::new_v4().simple().to_string();
        let server_pid = server.pid.to_string();
        let cpu_before = (cpu_s(&server_pid), cpu_s("self"), postgres_cpu());
        // With `--rss-after`, the load in two parts, the server's peak read between them.
        let (first, rest) = match args.rss_after.filter(|n| *n < args.payments) {
            Some(n) => (n, args.payments - n),
            None => (args.payments, 0),
        };
        let (mut elapsed, mut load) =
            run_load(&client, &server.base, args, first, &run_id, E2E_CUSTOMERS).await?;
        let rss_after_first_kb = (rest > 0).then(|| (first, proc_kb(server.pid, "VmHWM")));
        if rest > 0 {
            let rest_id = format!("{run_id}-rest");
            let (more, more_load) =
                run_load(&client, &server.base, args, rest, &rest_id, E2E_CUSTOMERS).await?;
            elapsed += more;
            load.add(more_load)?;
        }
        let cpu = (
            cpu_s(&server_pid) - cpu_before.0,
            cpu_s("self") - cpu_before.1,
            postgres_cpu()
                .zip(cpu_before.2)
                .map(|(after, before)| after - before),
        );
        let rss_peak_load_kb = proc_kb(server.pid, "VmHWM");
        let after = settle(&client, &server.base).await?;
        let (healthz_rate, healthz_failed) =
            run_healthz(&client, &server.base, args.clients, args.healthz_requests).await?;
        let rss_peak_kb = proc_kb(server.pid, "VmHWM");
        let hot = if args.hot_account {
            let before = settle(&client, &server.base).await?;
            let hot_run = format!("{run_id}-hot");
            let (elapsed, load) =
                run_load(&client, &server.base, args, args.payments, &hot_run, 1).await?;
            let after = settle(&client, &server.base).await?;
            Some((elapsed, load, after.minus(before)))
        } else {
            None
        };
        anyhow::Ok((
            cpu,
            rss_after_first_kb,
            rss_idle_kb,
            rss_peak_load_kb,
            rss_peak_kb,
            after.minus(before),
            elapsed,
            load,
            healthz_rate,
            healthz_failed,
            hot,
        ))
    }
    .await;
    server.stop().await?;
    if let Some(simulator) = simulator {
        simulator.stop().await?;
    }
    let (
        (cpu_server_s, cpu_client_s, cpu_postgres_s),
        rss_after_first_kb,
        rss_idle_kb,
        rss_peak_load_kb,
        rss_peak_kb,
        counters,
        elapsed,
        load,
        healthz_rate,
        healthz_failed,
        hot,
    ) = outcome?;

    if with_baseline {
        let rest = args.payments - baseline_half;
        let target = (baseline_bin.as_path(), url);
        run_baseline(
            &mut baseline,
            target,
            &client,
            args,
            rest,
            postgres.as_deref(),
        )
        .await?;
    }
    // The floor's second half, with the server stopped.
    let plain = floor_before
        + run_plain_transactions(
            db,
            args.clients,
            floor_half..args.floor_transactions,
            postgres.as_deref(),
        )
        .await?;
    let plain_rate = plain.transactions as f64 / plain.elapsed_s.max(f64::EPSILON);
    let tx = TxCount {
        payments: load.accepted,
        refunds: load.refunds,
        counters,
    };
    let floor = plain_rate / tx.per_payment();
    let rate = load.accepted as f64 / elapsed.as_secs_f64().max(f64::EPSILON);
    let name = format!("E2E-{backend}");
    if with_baseline {
        println!(
            "{name} asiento={rate:.0} baseline={:.0} ratio={:.2}",
            baseline.rate(),
            rate / baseline.rate().max(f64::EPSILON)
        );
    } else {
        println!(
            "{name} asiento={rate:.0} limit={floor:.0} ratio={:.2}",
            rate / floor
        );
    }
    print_load(&name, "", args.clients, elapsed, &load);
    if with_baseline {
        print_load(
            &name,
            "baseline ",
            args.clients,
            baseline.elapsed,
            &baseline.load,
        );
        eprintln!(
            "{name} baseline books: {}",
            check_baseline(db, &baseline).await?
        );
    }
    eprintln!(
        "{name} http_floor healthz/s={healthz_rate:.0} (failed {healthz_failed}) \
         ratio_to_http_floor={:.3}",
        rate / healthz_rate
    );
    eprintln!(
        "{name} db_floor plain_tx/s={plain_rate:.0} tx_per_payment={:.2} \
         (creates {} x{TX_PER_CREATE}, refunds {} x{TX_PER_REFUND}, webhooks received {} / \
         processed {} x{TX_PER_WEBHOOK}, projector batches {})",
        tx.per_payment(),
        tx.payments,
        tx.refunds,
        counters.webhooks_received,
        counters.webhooks_processed,
        counters.projector_batches
    );
    eprintln!(
        "{name} cpu during the load: server {cpu_server_s:.1}s, load generator \
         {cpu_client_s:.1}s, wall {:.1}s",
        elapsed.as_secs_f64()
    );
    let per_payment_ms = |s: f64| s * 1e3 / (load.accepted.max(1) as f64);
    match cpu_postgres_s {
        Some(postgres_s) => {
            // What the floor's payment (tx_per_payment plain transactions) cost in CPU, both
            // sides, against a payment's CPU (server, PostgreSQL, load generator): the ratio a
            // CPU-bound run would reach, and steadier than the rates on a noisy machine.
            // CPU per plain transaction, both sides (this process is the floor's client).
            let floor_ms = plain.cpu_s * 1e3 / (plain.transactions.max(1) as f64);
            let payment_ms = per_payment_ms(cpu_server_s + postgres_s + cpu_client_s);
            eprintln!(
                "{name} cpu per payment: server {:.3} ms, postgresql {:.3} ms, all {payment_ms:.3} \
                 ms; floor {:.3} ms per plain transaction, {:.3} ms per floor payment; \
                 cpu_ratio={:.2}",
                per_payment_ms(cpu_server_s),
                per_payment_ms(postgres_s),
                floor_ms,
                floor_ms * tx.per_payment(),
                floor_ms * tx.per_payment() / payment_ms.max(f64::EPSILON),
            );
            if with_baseline {
                // Server and PostgreSQL on each side: what a payment costs the machine that
                // serves it (the load generator is the same for both).
                let ours = per_payment_ms(cpu_server_s + postgres_s);
                let accepted = baseline.load.accepted.max(1) as f64;
                let theirs = (baseline.cpu_server_s + baseline.cpu_postgres_s) * 1e3 / accepted;
                eprintln!(
                    "{name} baseline cpu per payment: server {:.3} ms, postgresql {:.3} ms, both \
                     {theirs:.3} ms; asiento both {ours:.3} ms; cpu_ratio={:.2} (asiento/baseline)",
                    baseline.cpu_server_s * 1e3 / accepted,
                    baseline.cpu_postgres_s * 1e3 / accepted,
                    ours / theirs.max(f64::EPSILON)
                );
            }
        }
        None => eprintln!(
            "{name} cpu per payment: server {:.3} ms (no PostgreSQL server process on this machine)",
            per_payment_ms(cpu_server_s)
        ),
    }
    eprintln!(
        "{name} server rss_kb idle={rss_idle_kb} peak_after_load={rss_peak_load_kb} \
         peak={rss_peak_kb}"
    );
    if let Some((first, peak_kb)) = rss_after_first_kb {
        println!(
            "E2E-MEMORY-{backend} rss_peak_kb_after_{first}={peak_kb} \
             rss_peak_kb_after_{}={rss_peak_load_kb} ratio={:.2}",
            args.payments,
            rss_peak_load_kb as f64 / peak_kb.max(1) as f64
        );
    }
    eprintln!(
        "{name} group commit steps written alone after a refused batch: {} ({:.2} % of payments)",
        counters.retried_alone,
        counters.retried_alone * 100.0 / (load.accepted.max(1) as f64)
    );
    let mut server_errors = server_errors_of(&load) + server_errors_of(&baseline.load);
    if let Some((hot_elapsed, hot, hot_counters)) = hot {
        let hot_rate = hot.accepted as f64 / hot_elapsed.as_secs_f64().max(f64::EPSILON);
        let hot_errors = server_errors_of(&hot);
        println!(
            "E2E-HOT-{backend} asiento={hot_rate:.0} limit={rate:.0} ratio={:.2}",
            hot_rate / rate
        );
        eprintln!(
            "E2E-HOT-{backend} every payment to one customer: accepted={} in {:.1}s, \
             5xx or transport errors {hot_errors}, group commit steps written alone {}; \
             limit: the spread load's payments/s",
            hot.accepted,
            hot_elapsed.as_secs_f64(),
            hot_counters.retried_alone
        );
        server_errors += hot_errors;
    }
    if server_errors > 0 {
        eprintln!("{name} !!! {server_errors} answers were 5xx or transport errors !!!");
        bail!("{server_errors} requests failed with 5xx or a transport error");
    }
    Ok(())
}

/// A load's answers by status and its latency percentiles, on stderr.
fn print_load(name: &str, side: &str, clients: usize, elapsed: Duration, load: &LoadResult) {
    let statuses: Vec<String> = load
        .statuses
        .iter()
        .map(|(status, n)| {
            if *status == 0 {
                format!("io_error={n}")
            } else {
                format!("{status}={n}")
            }
        })
        .collect();
    eprintln!(
        "{name} {side}clients={clients} accepted={} refunds={} in {:.1}s; answers {}",
        load.accepted,
        load.refunds,
        elapsed.as_secs_f64(),
        statuses.join(" ")
    );
    for (kind, h) in [
        ("create", &load.create_latency),
        ("refund", &load.refund_latency),
    ] {
        if let Some(h) = h.as_ref().filter(|h| !h.is_empty()) {
            eprintln!(
                "{name} {side}{kind} latency_us p50={} p99={} p99.9={} max={}",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.value_at_quantile(0.999),
                h.max()
            );
        }
    }
}

/// Answers that were 5xx or no answer at all.
fn server_errors_of(load: &LoadResult) -> u64 {
    load.statuses
        .iter()
        .filter(|(status, _)| **status >= 500 || **status == 0)
        .map(|(_, n)| n)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read() {
        let text = "# TYPE x summary\n\
            asiento_projection_batch_seconds_count{projection=\"balances\"} 3\n\
            asiento_projection_batch_seconds_count{projection=\"payments\"} 4\n\
            asiento_webhooks_received_total{outcome=\"stored\"} 10\n\
            asiento_webhook_events_processed_total{outcome=\"applied\"} 9\n\
            asiento_group_commit_retried_alone_total 6\n\
            asiento_projection_batch_seconds_sum{projection=\"balances\"} 0.5\n";
        let c = Counters::parse(text);
        assert_eq!(c.retried_alone, 6.0);
        assert_eq!(c.projector_batches, 7.0);
        assert_eq!(c.webhooks_received, 10.0);
        assert_eq!(c.webhooks_processed, 9.0);
        let tx = TxCount {
            payments: 10,
            refunds: 2,
            counters: c,
        };
        assert!((tx.per_payment() - (20.0 + 4.0 + 20.0 + 7.0) / 10.0).abs() < 1e-9);
    }
}
