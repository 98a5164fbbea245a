//! `asiento bench reads`: the query routes' throughput with reads on a standby against the same
//! reads on the primary, in one run, on the same data.
//!
//! Payments are made through a server on the primary; then two API servers share that primary,
//! one reading from it, the other with `--read-database-url` naming the standby, and the same
//! clients read from each in turn (alternating, `--rounds` times each) the routes a dashboard or
//! a finance export hits: the payments list, a customer's balance, the events feed and the
//! journal. Each phase prints its reads/s and p99; the last line is the median ratio
//! standby / primary, and how many of the standby server's reads the standby answered.
//!
//! The standby is the operator's: a hot standby of the primary's server (docs/benchmarks.md shows
//! how to make one on the machine). Without `--database-url` the bench makes a fresh database on
//! the primary and reads the database of that name on the standby, once replication brought it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;

use super::bench_e2e::{Server, BENCH_API_KEY};
use super::{new_histogram, record, Target};

/// Customers the payments are spread over; the balance reads pick among them.
const CUSTOMERS: u64 = 100;
/// How long the standby may take to bring the bench's payments.
const CATCH_UP_MAX: Duration = Duration::from_secs(120);

#[derive(clap::Args, Debug)]
pub struct ReadsArgs {
    /// The primary (postgres://…); must hold no events. Default: a fresh database on the test
    /// server, dropped afterwards.
    #[arg(long, env = super::BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// A hot standby of the primary's server (postgres://…): its database name is replaced with
    /// the primary's.
    #[arg(long)]
    pub read_database_url: String,
    /// Concurrent clients, for the payments and for the reads.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Payments made before the reads.
    #[arg(long, default_value_t = 2_000)]
    pub payments: u64,
    /// How long each phase of reads lasts.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5s")]
    pub phase: Duration,
    /// Phases on each side, alternating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

pub async fn reads(args: ReadsArgs) -> anyhow::Result<()> {
    if args.clients == 0 || args.payments == 0 || args.rounds == 0 {
        bail!("need at least one client, one payment and one round");
    }
    let target = Target::open(args.database_url.clone(), 4).await?;
    let result = reads_on(&target.url, &args).await;
    target.close().await;
    result
}

async fn reads_on(url: &str, args: &ReadsArgs) -> anyhow::Result<()> {
    let bin = std::env::current_exe()?;
    let standby = with_database_of(&args.read_database_url, url)?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.clients)
        .timeout(Duration::from_secs(60))
        .build()?;
    let writer = Server::start(&bin, url, &[]).await?;
    let made = make_payments(&client, &writer.base, args).await;
    let primary_reads = Server::start(&bin, url, &["--role", "api"]).await?;
    let standby_reads = Server::start(
        &bin,
        url,
        &["--role", "api", "--read-database-url", &standby],
    )
    .await?;
    let outcome = async {
        let newest = made?;
        catch_up(&client, &standby_reads.base, newest).await?;
        let mut ratios = Vec::new();
        for round in 1..=args.rounds {
            // Each side goes first in every other round: caches warmed by the first phase of a
            // round help both in turn.
            let (on_primary, on_standby) = if round % 2 == 1 {
                let on_primary = read_phase(&client, &primary_reads.base, args).await?;
                (
                    on_primary,
                    read_phase(&client, &standby_reads.base, args).await?,
                )
            } else {
                let on_standby = read_phase(&client, &standby_reads.base, args).await?;
                (
                    read_phase(&client, &primary_reads.base, args).await?,
                    on_standby,
                )
            };
            print_phase("primary", round, args, &on_primary);
            print_phase("standby", round, args, &on_standby);
            ratios.push(on_standby.reads as f64 / on_primary.reads.max(1) as f64);
        }
        ratios.sort_by(f64::total_cmp);
        let served = metric(&client, &standby_reads.base, "outcome=\"served\"").await?;
        let elsewhere = metric(&client, &standby_reads.base, "standby=").await? - served;
        println!(
            "READS ratio = standby / primary = {:.2} (median of {}; {:?}); the standby answered \
             {served} reads, the primary {elsewhere} of the standby server's",
            ratios[ratios.len() / 2],
            ratios.len(),
            ratios
                .iter()
                .map(|ratio| format!("{ratio:.2}"))
                .collect::<Vec<_>>()
        );
        anyhow::Ok(())
    }
    .await;
    for server in [standby_reads, primary_reads, writer] {
        server.stop().await?;
    }
    outcome
}

/// `standby`'s URL naming the database `primary` names.
pub(super) fn with_database_of(standby: &str, primary: &str) -> anyhow::Result<String> {
    let database = |url: &str| -> anyhow::Result<(usize, usize)> {
        let authority = url.find("://").context("a postgres:// URL")? + 3;
        let slash = url[authority..]
            .find('/')
            .map(|at| authority + at)
            .context("a URL naming its database")?;
        let end = url[slash..].find('?').map_or(url.len(), |at| slash + at);
        Ok((slash + 1, end))
    };
    let (start, end) = database(primary)?;
    let (standby_start, standby_end) = database(standby)?;
    Ok(format!(
        "{}{}{}",
        &standby[..standby_start],
        &primary[start..end],
        &standby[standby_end..]
    ))
}

/// `args.payments` payments through `base`; the newest position answered.
async fn make_payments(
    client: &reqwest::Client,
    base: &str,
    args: &ReadsArgs,
) -> anyhow::Result<i64> {
    let next = Arc::new(AtomicU64::new(0));
    let newest = Arc::new(AtomicU64::new(0));
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (client, base, next, newest, run) = (
            client.clone(),
            base.to_owned(),
            Arc::clone(&next),
            Arc::clone(&newest),
            run.clone(),
        );
        let payments = args.payments;
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= payments {
                    return anyhow::Ok(());
                }
                let body = serde_json::json!({
                    "amount_minor": 10_000,
                    "currency": "USD",
                    "customer": format!("c{}", i % CUSTOMERS),
                    "payment_method": "pm_card_ok",
                });
                let answer: serde_json::Value = client
                    .post(format!("{base}/v1/payments"))
                    .bearer_auth(BENCH_API_KEY)
                    .header("Idempotency-Key", format!("{run}-{i}"))
                    .json(&body)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let position = answer["position"].as_u64().context("a position")?;
                newest.fetch_max(position, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(i64::try_from(newest.load(Ordering::Relaxed))?)
}

/// Waits until the standby server's standby has the payments view at `position`.
async fn catch_up(client: &reqwest::Client, base: &str, position: i64) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP_MAX;
    loop {
        let before = metric(client, base, "outcome=\"served\"").await?;
        let answer = client
            .get(format!(
                "{base}/v1/payments?limit=1&min_position={position}"
            ))
            .bearer_auth(BENCH_API_KEY)
            .send()
            .await?;
        if answer.status().is_success()
            && metric(client, base, "outcome=\"served\"").await? > before
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the standby did not bring position {position} in {CATCH_UP_MAX:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One phase's reads: how many answered 200, and their latency.
struct Phase {
    reads: u64,
    failed: u64,
    latency: Histogram<u64>,
}

/// `args.clients` clients reading through `base` for `args.phase`, each taking the next of the
/// dashboard's routes in turn.
async fn read_phase(
    client: &reqwest::Client,
    base: &str,
    args: &ReadsArgs,
) -> anyhow::Result<Phase> {
    let until = Instant::now() + args.phase;
    let mut tasks = Vec::new();
    for number in 0..args.clients {
        let (client, base) = (client.clone(), base.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut phase = Phase {
                reads: 0,
                failed: 0,
                latency: new_histogram()?,
            };
            let mut turn = number as u64;
            while Instant::now() < until {
                let path = match turn % 4 {
                    0 => "/v1/payments?limit=50".to_owned(),
                    1 => format!(
                        "/v1/accounts/customer:c{}:available/balance?currency=USD",
                        turn % CUSTOMERS
                    ),
                    2 => "/v1/events?limit=50".to_owned(),
                    _ => "/v1/journal?limit=50".to_owned(),
                };
                turn += 1;
                let started = Instant::now();
                let answer = client
                    .get(format!("{base}{path}"))
                    .bearer_auth(BENCH_API_KEY)
                    .send()
                    .await;
                let ok = match answer {
                    Ok(response) => {
                        let ok = response.status().is_success();
                        let _ = response.bytes().await;
                        ok
                    }
                    Err(_) => false,
                };
                record(&mut phase.latency, started);
                if ok {
                    phase.reads += 1;
                } else {
                    phase.failed += 1;
                }
            }
            anyhow::Ok(phase)
        }));
    }
    let mut total = Phase {
        reads: 0,
        failed: 0,
        latency: new_histogram()?,
    };
    for task in tasks {
        let phase = task.await??;
        total.reads += phase.reads;
        total.failed += phase.failed;
        total.latency.add(&phase.latency)?;
    }
    Ok(total)
}

fn print_phase(side: &str, round: usize, args: &ReadsArgs, phase: &Phase) {
    println!(
        "READS-{side} round {round}: {:.0} reads/s ({} reads, {} failed, {} clients, {:?}), p50 \
         {:.1} ms, p99 {:.1} ms",
        phase.reads as f64 / args.phase.as_secs_f64(),
        phase.reads,
        phase.failed,
        args.clients,
        args.phase,
        phase.latency.value_at_quantile(0.5) as f64 / 1_000.0,
        phase.latency.value_at_quantile(0.99) as f64 / 1_000.0,
    );
}

/// The sum of the standby reads counted by `base` whose labels contain `label`.
async fn metric(client: &reqwest::Client, base: &str, label: &str) -> anyhow::Result<f64> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|line| line.starts_with("asiento_standby_reads_total{") && line.contains(label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_standby_url_names_the_primary_s_database() {
        assert_eq!(
            with_database_of(
                "postgres://postgres@127.0.0.1:5433/postgres?sslmode=disable",
                "postgres://postgres@127.0.0.1:5432/asiento_bench_1"
            )
            .unwrap(),
            "postgres://postgres@127.0.0.1:5433/asiento_bench_1?sslmode=disable"
        );
    }
}
