//! `asiento psp-sim`: the provider simulator as its own server, so that the
//! ledger can be run against a provider in another process (or another
//! machine) and its failures produced on demand. See
//! `asiento_psp_sim` for the routes and faults.

use std::net::SocketAddr;

use anyhow::Context;
use asiento_psp::adyen::HmacKey;
use asiento_psp_sim::{
    random_hmac_key, random_seed, random_webhook_secret, run as run_simulator, Dialect, SimConfig,
    Simulator,
};

#[derive(clap::Args, Debug)]
pub struct PspSimArgs {
    /// The provider it plays: `sim` (our own JSON protocol), `stripe` (Stripe's API: form
    /// bodies, PaymentIntents and refunds, `Stripe-Signature` events; any `sk_test_…` key) or
    /// `adyen` (Adyen's Checkout v71 at /v71/…: any `X-API-Key`, modifications decided by
    /// notification, batches of notification items signed with --webhook-hmac-key and sent
    /// with basic auth; no lookup routes).
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

    /// The Adyen dialect's HMAC key (hex, as Adyen's Customer Area shows it): every
    /// notification item is signed with it; unset: a random one, printed.
    #[arg(long, env = "ASIENTO_PSP_SIM_WEBHOOK_HMAC_KEY", hide_env_values = true)]
    pub webhook_hmac_key: Option<String>,

    /// Basic-auth username sent with every webhook delivery (Adyen's webhook username);
    /// unset: no Authorization header.
    #[arg(long, env = "ASIENTO_PSP_SIM_WEBHOOK_USERNAME")]
    pub webhook_username: Option<String>,

    /// Basic-auth password sent with the username.
    #[arg(long, env = "ASIENTO_PSP_SIM_WEBHOOK_PASSWORD", hide_env_values = true)]
    pub webhook_password: Option<String>,

    /// The Adyen dialect's report user: its CSV reports are served only with these basic-auth
    /// credentials; unset: every download is refused (401).
    #[arg(long, env = "ASIENTO_PSP_SIM_REPORT_USERNAME")]
    pub report_username: Option<String>,

    /// The report user's password.
    #[arg(long, env = "ASIENTO_PSP_SIM_REPORT_PASSWORD", hide_env_values = true)]
    pub report_password: Option<String>,

    /// How long after it is asked the Adyen dialect decides a capture, refund or cancel.
    #[arg(
        long,
        env = "ASIENTO_PSP_SIM_MODIFICATION_DELAY_MS",
        default_value_t = 300
    )]
    pub modification_delay_ms: u64,

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
    let (webhook_hmac_key, hmac_key_generated) = match args.webhook_hmac_key {
        Some(key) => {
            HmacKey::from_hex(&key).map_err(|error| {
                anyhow::anyhow!("--webhook-hmac-key (ASIENTO_PSP_SIM_WEBHOOK_HMAC_KEY): {error}")
            })?;
            (key, false)
        }
        None => (random_hmac_key(), true),
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
        webhook_hmac_key: webhook_hmac_key.clone(),
        webhook_username: args.webhook_username,
        webhook_password: args.webhook_password,
        modification_delay_ms: args.modification_delay_ms,
        report_username: args.report_username,
        report_password: args.report_password,
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
    if args.dialect == Dialect::Adyen && hmac_key_generated {
        println!("psp-sim webhook HMAC key (generated): {webhook_hmac_key}");
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
