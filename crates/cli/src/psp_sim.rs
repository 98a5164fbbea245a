//! `asiento psp-sim`: the provider simulator as its own server, so that the
//! ledger can be run against a provider in another process (or another
//! machine) and its failures produced on demand. See
//! `asiento_psp::sim` for the routes and faults.

use std::net::SocketAddr;

use anyhow::Context;
use asiento_psp::sim::{
    random_seed, random_webhook_secret, run as run_simulator, Dialect, SimConfig, Simulator,
};

#[derive(clap::Args, Debug)]
pub struct PspSimArgs {
    /// The provider it plays: `sim` (our own JSON protocol) or `stripe` (Stripe's API: form
    /// bodies, PaymentIntents and refunds, `Stripe-Signature` events; any `sk_test_…` key).
    #[arg(long, env = "ASIENTO_PSP_SIM_DIALECT", default_value = "sim")]
    pub dialect: Dialect,

    /// Address to listen on.
    #[arg(long, env = "ASIENTO_PSP_SIM_LISTEN", default_value = "127.0.0.1:8081")]
    pub listen: SocketAddr,

    /// Where webhook events are POSTed (e.g. http://127.0.0.1:8080/webhooks/sim);
    /// unset: events are only recorded (GET /sim/events).
    #[arg(long, env = "ASIENTO_PSP_SIM_WEBHOOK_URL")]
    pub webhook_url: Option<String>,

    /// Secret of the webhook signature (`Psp-Signature`, or `Stripe-Signature` in the Stripe
    /// dialect); unset: a random one, printed.
    #[arg(long, env = "ASIENTO_PSP_SIM_WEBHOOK_SECRET", hide_env_values = true)]
    pub webhook_secret: Option<String>,

    /// Seed of every fault draw, to replay a failing run; unset: random, printed.
    #[arg(long, env = "ASIENTO_PSP_SIM_SEED")]
    pub seed: Option<u64>,

    /// How long pm_card_slow takes to answer.
    #[arg(long, env = "ASIENTO_PSP_SIM_SLOW_MS", default_value_t = 2_000)]
    pub slow_ms: u64,

    /// How long a timed-out answer (pm_card_timeout, timeout_rate) hangs.
    #[arg(long, env = "ASIENTO_PSP_SIM_HANG_MS", default_value_t = 30_000)]
    pub hang_ms: u64,

    /// The provider's own fee in the settlement report, in basis points.
    #[arg(long, env = "ASIENTO_PSP_SIM_FEE_BPS", default_value_t = 0)]
    pub fee_bps: u32,

    /// Public base URL for redirect links; unset: taken from the Host header.
    #[arg(long, env = "ASIENTO_PSP_SIM_PUBLIC_URL")]
    pub public_url: Option<String>,
}

pub async fn run(args: PspSimArgs) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(random_seed);
    let (webhook_secret, secret_generated) = match args.webhook_secret {
        Some(secret) => (secret, false),
        None => (random_webhook_secret(), true),
    };
    let config = SimConfig {
        dialect: args.dialect,
        webhook_url: args.webhook_url.clone(),
        webhook_secret: webhook_secret.clone(),
        seed,
        slow_ms: args.slow_ms,
        hang_ms: args.hang_ms,
        fee_bps: args.fee_bps,
        public_url: args.public_url,
        ..SimConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let addr = listener.local_addr().context("reading the bound address")?;
    println!(
        "psp-sim listening on http://{addr} (dialect {}; seed {seed}; replay with --seed {seed})",
        args.dialect.as_str()
    );
    match &args.webhook_url {
        Some(url) => println!("psp-sim webhooks to {url}"),
        None => println!("psp-sim webhooks: no --webhook-url, events are only recorded"),
    }
    if secret_generated {
        println!("psp-sim webhook secret (generated): {webhook_secret}");
    }
    let shutdown = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C; stopping");
        }
    };
    run_simulator(listener, Simulator::new(config), shutdown)
        .await
        .context("running the provider simulator")
}
