//! The fixed settings the server, the simulator and `asiento reconcile` run with: the tenant's API
//! key, the webhook secret, the secrets of provider `sim` in each dialect, and the timings each
//! dialect needs, each with the reason it is what it is. The server's start, the simulator's and
//! the manual sweeps all read them here, so the three agree.

/// The simulator's webhook secret, as the server's `--webhook-secret`.
pub const SECRET: &str = "whsec_chaos_0123456789";
/// The tenant's API key (tenant `acme`).
pub const API_KEY: &str = "sk_test_acme_0123456789abcdef";
/// The secrets of provider `sim` when the simulator speaks Stripe's dialect (its secret key) or
/// Adyen's (API key, merchant account, HMAC key, webhook and report users); a kind reads only
/// its own.
pub const PROVIDER_ENV: &[(&str, &str)] = &[
    ("ASIENTO_PROVIDER_SIM_API_KEY", "sk_test_chaos"),
    ("ASIENTO_PROVIDER_SIM_MERCHANT_ACCOUNT", ADYEN_MERCHANT),
    ("ASIENTO_PROVIDER_SIM_HMAC_KEY", ADYEN_HMAC_KEY),
    ("ASIENTO_PROVIDER_SIM_WEBHOOK_USERNAME", ADYEN_WEBHOOK_USER),
    (
        "ASIENTO_PROVIDER_SIM_WEBHOOK_PASSWORD",
        ADYEN_WEBHOOK_PASSWORD,
    ),
    ("ASIENTO_PROVIDER_SIM_REPORT_USERNAME", ADYEN_REPORT_USER),
    (
        "ASIENTO_PROVIDER_SIM_REPORT_PASSWORD",
        ADYEN_REPORT_PASSWORD,
    ),
];
const ADYEN_MERCHANT: &str = "AsientoChaosECOM";
pub const ADYEN_HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
pub const ADYEN_WEBHOOK_USER: &str = "adyen-chaos-webhooks";
pub const ADYEN_WEBHOOK_PASSWORD: &str = "chaos:webhook:pw";
pub const ADYEN_REPORT_USER: &str = "report@Company.Chaos";
pub const ADYEN_REPORT_PASSWORD: &str = "chaos-report-pw";
/// How long the Adyen dialect takes to decide a capture, refund or cancel.
pub const ADYEN_MODIFICATION_DELAY_MS: &str = "300";

/// How the server and `asiento reconcile` name the simulator as provider `sim`.
pub fn provider_args(dialect: &str, sim: &str) -> [String; 2] {
    match dialect {
        "stripe" => ["--providers".to_owned(), format!("sim=stripe:{sim}")],
        "adyen" => ["--providers".to_owned(), format!("sim=adyen:{sim}")],
        _ => ["--psp-url".to_owned(), sim.to_owned()],
    }
}

/// How long a payment stays pending before the sweeps look at it. Without a lookup by key
/// (Stripe), a payment whose report windows were compared is expired as never created, so this
/// must outlast the creating request itself (two calls of up to four 500 ms attempts with
/// backoff, about 6 s here): a shorter one expires a payment whose confirmation is still on its
/// way, and the charge then lands on an expired payment (a manual exception).
///
/// Adyen has no lookup of any kind: a payment whose creation answer was lost is sent again under
/// its key by the stale sweep from `--operation-timeout` (1 s) until this expiry, then cancelled
/// by reference; so it too must outlast the creating request, and leave the sweep a few rounds
/// to send it again.
pub fn pending_timeout(dialect: &str) -> &'static str {
    match dialect {
        "stripe" | "adyen" => "10s",
        _ => "2s",
    }
}

/// How long before now the server's settlement-report windows end. Without a lookup by key
/// (Stripe), a payment the provider never got is known absent only once a report window past its
/// expiry was compared, so the Stripe campaign settles windows sooner than the default minute.
///
/// Adyen tells money only by its daily accounting report: a notification the fault dropped (a
/// capture's or refund's outcome, a cancel's) reaches us only through it, so the Adyen campaign
/// settles windows as soon.
pub fn report_settle(dialect: &str) -> &'static str {
    match dialect {
        "stripe" | "adyen" => "5s",
        _ => "1m",
    }
}

/// How long a capture or refund the provider received may wait for its decision before it is a
/// manual exception. Adyen has no lookup, and its accounting report books no refused
/// modification and nets a refund that failed afterwards to nothing: when the fault dropped such
/// an operation's notifications, nothing can ever decide it, and docs/providers.md promises a
/// manual exception past this deadline. The Adyen campaign gives notifications (retried through
/// the kills) this long.
pub fn operation_pending_deadline(dialect: &str) -> &'static str {
    match dialect {
        "adyen" => "60s",
        _ => "3d",
    }
}
