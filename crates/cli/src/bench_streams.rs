//! `asiento bench projections`: what the read models spend on an event as its stream grows.
//!
//! `--payments` payments are created and captured, then each receives `--refunds` partial refunds
//! of 0.01, round by round (round r holds every payment's r-th refund: its request, the
//! provider's word and the refund's entry). Every projection `serve` runs applies each round's
//! events, one transaction per projection as a runner's batch would; the first three rounds and
//! the last three are timed. It prints `PROJ-LONG first_us=<µs per event, first rounds>
//! last_us=<µs per event, last rounds> ratio=<last/first>`: a read model that folds each stream
//! once pays the same for a payment's 200th refund as for its first (target ≤ 1.5); one that
//! folds a stream's whole history again pays for every event before it. Stderr has each
//! projection's share of the last rounds.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use asiento_domain::{
    decide_payment, evolve_payment, payment_stream, Amount, CaptureMode, CreatePayment, Currency,
    CustomerId, FeeSchedule, Payment, PaymentCommand, PaymentId, ProviderFact, ProviderName,
    TenantId,
};
use asiento_eventstore::{
    Cursor, Database, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StreamAppend,
};
use asiento_projector::Projection;
use chrono::Utc;
use uuid::Uuid;

use super::Target;

/// Rounds timed at each end.
const TIMED_ROUNDS: u64 = 3;
/// Events per log read of a round.
const READ_PAGE_EVENTS: usize = 2_000;
const TENANT: &str = "bench";

#[derive(clap::Args, Debug)]
pub struct StreamsArgs {
    /// Database to use (postgres://… or sqlite://…); must hold no events. Default: a fresh
    /// PostgreSQL test database, dropped afterwards.
    #[arg(long, env = super::BENCH_DATABASE_URL_ENV)]
    pub database_url: Option<String>,
    /// Payments, each a long stream.
    #[arg(long, default_value_t = 20)]
    pub payments: u64,
    /// Partial refunds of each payment.
    #[arg(long, default_value_t = 200)]
    pub refunds: u64,
}

/// One payment's stream as the bench decides it.
struct Stream {
    payment: Payment,
    id: PaymentId,
    charge_id: String,
}

impl Stream {
    /// Decides `command` on the payment and appends what it decided.
    async fn run(&mut self, store: &dyn EventStore, command: PaymentCommand) -> anyhow::Result<()> {
        let events = decide_payment(&self.payment, command)
            .map_err(|refusal| anyhow::anyhow!("the bench's command was refused: {refusal:?}"))?;
        let mut new_events = Vec::with_capacity(events.len());
        for event in &events {
            new_events.push(NewEvent {
                event_id: Uuid::new_v4(),
                event_type: event.event_type().to_owned(),
                schema: event.schema_version(),
                data: event.encode()?,
                metadata: Metadata {
                    tenant: Some(TENANT.to_owned()),
                    ..Metadata::default()
                },
            });
        }
        store
            .append(&[StreamAppend {
                stream_id: payment_stream(self.id),
                expected: ExpectedVersion::Exact(self.payment.version),
                events: new_events,
            }])
            .await?;
        for event in &events {
            self.payment = evolve_payment(std::mem::take(&mut self.payment), event);
        }
        Ok(())
    }
}

fn fact(fact: ProviderFact) -> anyhow::Result<PaymentCommand> {
    Ok(PaymentCommand::Provider {
        fact,
        fees: FeeSchedule::new(300, Amount::ZERO)?,
        at: Utc::now(),
    })
}

pub(crate) async fn long_streams(args: StreamsArgs) -> anyhow::Result<()> {
    if args.payments == 0 || args.refunds < 2 * TIMED_ROUNDS {
        anyhow::bail!("need a payment and at least {} refunds", 2 * TIMED_ROUNDS);
    }
    let target = Target::open(args.database_url.clone(), 4).await?;
    let result = run(&target.db, &args).await;
    target.close().await;
    result
}

async fn run(db: &Database, args: &StreamsArgs) -> anyhow::Result<()> {
    let store = db.event_store();
    let projections = crate::projections::all();
    let mut generations = Vec::with_capacity(projections.len());
    for projection in &projections {
        asiento_projector::install(db, projection.as_ref()).await?;
        let checkpoint = asiento_projector::checkpoint(db, projection.name())
            .await?
            .context("a projection just installed has no checkpoint")?;
        generations.push(checkpoint.generation);
    }
    let mut streams = Vec::new();
    for i in 0..args.payments {
        let id = PaymentId::from_uuid(Uuid::new_v4());
        let mut stream = Stream {
            payment: Payment::default(),
            id,
            charge_id: format!("ch_{}", id.as_uuid().simple()),
        };
        stream
            .run(
                store.as_ref(),
                PaymentCommand::Create(CreatePayment {
                    id,
                    tenant: TenantId::parse(TENANT)?,
                    amount: Amount::new(100_000),
                    currency: Currency::parse("USD")?,
                    customer: CustomerId::parse(&format!("c{i}"))?,
                    provider: ProviderName::parse("sim")?,
                    capture_mode: CaptureMode::Automatic,
                    description: None,
                    metadata: serde_json::Map::new(),
                    payment_method: None,
                    at: Utc::now(),
                }),
            )
            .await?;
        let captured = fact(ProviderFact::Captured {
            charge_id: stream.charge_id.clone(),
            amount: Amount::new(100_000),
        })?;
        stream.run(store.as_ref(), captured).await?;
        streams.push(stream);
    }
    let mut apply = Apply {
        db,
        store: store.as_ref(),
        projections: &projections,
        generations: &generations,
        reached: Cursor::START,
        spent: vec![Duration::ZERO; projections.len()],
    };
    apply.round().await?;
    let (mut first, mut last) = ((0usize, Duration::ZERO), (0usize, Duration::ZERO));
    for round in 1..=args.refunds {
        for stream in &mut streams {
            let refund = PaymentCommand::RequestRefund {
                amount: Amount::new(1),
                at: Utc::now(),
            };
            stream.run(store.as_ref(), refund).await?;
            let refunded = fact(ProviderFact::Refunded {
                charge_id: stream.charge_id.clone(),
                amount_refunded: Amount::new(i64::try_from(round)?),
                current: false,
            })?;
            stream.run(store.as_ref(), refunded).await?;
        }
        if round == args.refunds - TIMED_ROUNDS + 1 {
            apply.spent.fill(Duration::ZERO);
        }
        let (events, elapsed) = apply.round().await?;
        let into = if round <= TIMED_ROUNDS {
            Some(&mut first)
        } else if round > args.refunds - TIMED_ROUNDS {
            Some(&mut last)
        } else {
            None
        };
        if let Some((n, time)) = into {
            *n += events;
            *time += elapsed;
        }
    }
    let per_event_us = |(n, time): (usize, Duration)| time.as_secs_f64() * 1e6 / n.max(1) as f64;
    let (first_us, last_us) = (per_event_us(first), per_event_us(last));
    println!(
        "PROJ-LONG first_us={first_us:.1} last_us={last_us:.1} ratio={:.2}",
        last_us / first_us.max(f64::EPSILON)
    );
    let total: f64 = apply.spent.iter().map(Duration::as_secs_f64).sum();
    let shares: Vec<String> = projections
        .iter()
        .zip(&apply.spent)
        .map(|(p, spent)| {
            format!(
                "{} {:.0} %",
                p.name(),
                spent.as_secs_f64() * 100.0 / total.max(f64::EPSILON)
            )
        })
        .collect();
    eprintln!(
        "PROJ-LONG {} payments, {} refunds each; the last rounds' time by projection: {}",
        args.payments,
        args.refunds,
        shares.join(", ")
    );
    Ok(())
}

/// The projections applying the log round by round, and what each spent.
struct Apply<'a> {
    db: &'a Database,
    store: &'a dyn EventStore,
    projections: &'a [std::sync::Arc<dyn Projection>],
    generations: &'a [i64],
    reached: Cursor,
    spent: Vec<Duration>,
}

impl Apply<'_> {
    /// Every event after the last round's, applied by each projection in a transaction of its
    /// own: how many, and how long the projections took.
    async fn round(&mut self) -> anyhow::Result<(usize, Duration)> {
        let mut batch: Vec<RecordedEvent> = Vec::new();
        loop {
            let page = self.store.read_all(self.reached, READ_PAGE_EVENTS).await?;
            let Some(last) = page.last() else { break };
            self.reached = last.cursor;
            batch.extend(page);
        }
        let mut elapsed = Duration::ZERO;
        for ((projection, generation), spent) in self
            .projections
            .iter()
            .zip(self.generations)
            .zip(&mut self.spent)
        {
            let started = Instant::now();
            let mut tx = self.db.begin().await?;
            projection.apply(&mut tx, *generation, &batch).await?;
            tx.commit().await?;
            *spent += started.elapsed();
            elapsed += started.elapsed();
        }
        Ok((batch.len(), elapsed))
    }
}
