//! `asiento bench baseline-serve`: the plain design asiento is measured against in `bench e2e`,
//! a payments service written the way the articles this project grew from write one, in plain
//! SQL on PostgreSQL, served by the same HTTP stack (axum, tokio, sqlx with asiento's pool
//! settings) to the same clients, against the same in-process simulator (the same provider
//! adapter, charges and refunds over loopback HTTP, signed webhooks back):
//!
//! - a payment: one transaction inserts the idempotency key (insert first, with the request's
//!   hash) and the pending payment; the provider is called outside any transaction; one
//!   transaction locks the pending payment, inserts its zero-sum entries, moves its state and
//!   stores the key's response;
//! - a refund: the same, the first transaction also checking what is left to refund under the
//!   payment's lock;
//! - a webhook: stored once by its id in the transaction that applies it, through the same state
//!   guard (a payment or refund already moved is left as it is).
//!
//! It keeps no log, no read model and no worker: what it does not do is what asiento's figures
//! are judged by. Its routes: `POST /v1/payments`, `POST /v1/payments/{id}/refunds`,
//! `POST /webhooks/sim`, `GET /healthz`, and the simulator under `/sim`.

#[path = "bench_baseline_flow.rs"]
mod flow;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use asiento_eventstore::Database;
use asiento_psp::{ClientConfig, HttpProvider, Provider};
use asiento_psp_sim::{SimConfig, Simulator};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::watch;

/// The baseline's tables, created if missing (the bench gives it a database of its own).
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS baseline_keys (
        tenant       TEXT NOT NULL,
        key          TEXT NOT NULL,
        request_hash TEXT NOT NULL,
        status       INTEGER,
        response     JSONB,
        created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (tenant, key))",
    "CREATE TABLE IF NOT EXISTS baseline_payments (
        id             UUID PRIMARY KEY,
        tenant         TEXT NOT NULL,
        customer       TEXT NOT NULL,
        amount_minor   BIGINT NOT NULL CHECK (amount_minor > 0),
        currency       TEXT NOT NULL,
        status         TEXT NOT NULL,
        charge_id      TEXT,
        refunded_minor BIGINT NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0),
        description    TEXT,
        created_at     TIMESTAMPTZ NOT NULL,
        updated_at     TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS baseline_refunds (
        id           UUID PRIMARY KEY,
        payment_id   UUID NOT NULL REFERENCES baseline_payments (id),
        amount_minor BIGINT NOT NULL CHECK (amount_minor > 0),
        status       TEXT NOT NULL,
        operation_id TEXT,
        created_at   TIMESTAMPTZ NOT NULL,
        updated_at   TIMESTAMPTZ NOT NULL)",
    "CREATE TABLE IF NOT EXISTS baseline_entries (
        id           BIGSERIAL PRIMARY KEY,
        payment_id   UUID NOT NULL REFERENCES baseline_payments (id),
        refund_id    UUID REFERENCES baseline_refunds (id),
        account      TEXT NOT NULL,
        currency     TEXT NOT NULL,
        amount_minor BIGINT NOT NULL,
        created_at   TIMESTAMPTZ NOT NULL DEFAULT now())",
    "CREATE TABLE IF NOT EXISTS baseline_webhooks (
        event_id    TEXT PRIMARY KEY,
        event_type  TEXT NOT NULL,
        received_at TIMESTAMPTZ NOT NULL DEFAULT now())",
];

#[derive(clap::Args, Debug)]
pub struct BaselineArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// A PostgreSQL database of its own.
    #[arg(long)]
    pub database_url: String,
    /// The one tenant's API key, `tenant:key` (as `serve --api-keys` takes one).
    #[arg(long)]
    pub api_key: String,
}

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct Baseline {
    pool: sqlx::PgPool,
    provider: Arc<dyn Provider>,
    tenant: Arc<str>,
    api_key: Arc<str>,
    webhook_secret: Arc<str>,
}

pub async fn serve(args: BaselineArgs) -> anyhow::Result<()> {
    let (tenant, api_key) = args
        .api_key
        .split_once(':')
        .context("--api-key is tenant:key")?;
    // The same pool as `asiento serve` opens.
    let Database::Postgres(pool) = Database::connect(&args.database_url)
        .await
        .context("connecting to the baseline's database")?
    else {
        anyhow::bail!("the baseline runs on PostgreSQL only");
    };
    for statement in SCHEMA {
        sqlx::query(statement).execute(&pool).await?;
    }
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let address = listener.local_addr()?;
    let (stop, stopped) = watch::channel(false);
    let webhook_secret = asiento_psp_sim::random_webhook_secret();
    let simulator = Simulator::new(SimConfig {
        seed: asiento_psp_sim::random_seed(),
        webhook_url: Some(format!("http://{address}/webhooks/sim")),
        webhook_secret: webhook_secret.clone(),
        ..SimConfig::default()
    });
    let mut on_stop = stopped;
    simulator.spawn_webhook_dispatcher(async move {
        let _ = on_stop.wait_for(|stopped| *stopped).await;
    })?;
    let provider = HttpProvider::new(
        "sim",
        &format!("http://{address}/sim"),
        ClientConfig::default(),
    )?;
    let baseline = Baseline {
        pool,
        provider: Arc::new(provider),
        tenant: tenant.into(),
        api_key: api_key.into(),
        webhook_secret: webhook_secret.into(),
    };
    let app = Router::new()
        .route("/v1/payments", post(flow::create_payment))
        .route("/v1/payments/{id}/refunds", post(flow::create_refund))
        .route("/webhooks/sim", post(flow::receive_webhook))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(baseline)
        .merge(simulator.mounted_router());
    // The same line `serve` prints, which `bench e2e` waits for.
    println!("asiento listening on http://{address} (the plain-SQL baseline)");
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            crate::serve::shutdown_signal().await;
            let _ = stop.send(true);
        })
        .await?;
    Ok(())
}
