//! Provider configuration from flags and the environment: which providers exist, what they are
//! (`sim`, `stripe` or `adyen`), where they live and what the platform charges on each (`--psp-url`,
//! `--providers`, `--fees`), and their secrets, which come only from the environment
//! (`ASIENTO_PROVIDER_<NAME>_API_KEY`, `ASIENTO_PROVIDER_<NAME>_WEBHOOK_SECRET`; for Adyen also
//! `_MERCHANT_ACCOUNT`, `_RETURN_URL`, `_HMAC_KEY`, `_WEBHOOK_USERNAME`, `_WEBHOOK_PASSWORD`; or
//! the same names with `_FILE` naming a file that holds the secret), never from the command line.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_domain::{Amount, FeeSchedule, ProviderName};
use asiento_psp::adyen::adapter::RETURN_URL_DEFAULT;
use asiento_psp::adyen::{AdyenAccount, AdyenProvider, BasicCredentials, ReportsAccess};
use asiento_psp::stripe::StripeProvider;
use asiento_psp::{ClientConfig, EventFormat, HttpProvider, Provider};

/// The provider a payment uses when it names none, and the one `--psp-url` configures.
pub const DEFAULT_PROVIDER: &str = "sim";

/// Which protocol a provider's adapter speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProviderKind {
    /// The simulator's protocol (`asiento psp-sim`, or the in-process simulator).
    Sim,
    /// Stripe's API (`https://api.stripe.com`, or `asiento psp-sim --dialect stripe`).
    Stripe,
    /// Adyen's Checkout API (`https://checkout-test.adyen.com`, or `asiento psp-sim --dialect
    /// adyen`).
    Adyen,
}

impl ProviderKind {
    fn parse(text: &str) -> Option<ProviderKind> {
        match text {
            "sim" => Some(ProviderKind::Sim),
            "stripe" => Some(ProviderKind::Stripe),
            "adyen" => Some(ProviderKind::Adyen),
            _ => None,
        }
    }

    /// How its webhook bodies are written.
    pub fn event_format(self) -> EventFormat {
        match self {
            ProviderKind::Sim => EventFormat::Sim,
            ProviderKind::Stripe => EventFormat::Stripe,
            ProviderKind::Adyen => EventFormat::Adyen,
        }
    }
}

/// One configured provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpec {
    pub name: ProviderName,
    pub kind: ProviderKind,
    pub url: String,
}

/// `name=kind:url,…` from `--providers` (`name=url` is kind `sim`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderSpecs(pub Vec<ProviderSpec>);

impl ProviderSpecs {
    /// One provider of the simulator's protocol.
    pub fn sim(name: ProviderName, url: String) -> ProviderSpecs {
        ProviderSpecs(vec![ProviderSpec {
            name,
            kind: ProviderKind::Sim,
            url,
        }])
    }
}

pub fn parse_providers(raw: &str) -> Result<ProviderSpecs, String> {
    let mut specs: Vec<ProviderSpec> = Vec::new();
    for item in raw
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (name, target) = item
            .split_once('=')
            .ok_or_else(|| format!("expected name=kind:url, got {item:?}"))?;
        let name = ProviderName::parse(name.trim()).map_err(|error| error.to_string())?;
        let target = target.trim();
        let (kind, url) = match target.split_once(':') {
            Some((kind, url)) if !url.starts_with("//") => (
                ProviderKind::parse(kind).ok_or_else(|| {
                    format!(
                        "provider {name}: unknown kind {kind:?} (expected sim, stripe or adyen)"
                    )
                })?,
                url,
            ),
            _ => (ProviderKind::Sim, target),
        };
        if specs.iter().any(|existing| existing.name == name) {
            return Err(format!("provider {name} is configured twice"));
        }
        specs.push(ProviderSpec {
            name,
            kind,
            url: url.to_owned(),
        });
    }
    if specs.is_empty() {
        return Err("no name=kind:url pair given".to_owned());
    }
    Ok(ProviderSpecs(specs))
}

/// `ASIENTO_PROVIDER_<NAME>_<WHAT>`: the name upper case, `-` as `_`.
fn secret_variable(name: &ProviderName, what: &str) -> String {
    format!(
        "ASIENTO_PROVIDER_{}_{what}",
        name.as_str().to_ascii_uppercase().replace('-', "_")
    )
}

/// A provider's secret from the environment: `ASIENTO_PROVIDER_<NAME>_<WHAT>`, or the file
/// `ASIENTO_PROVIDER_<NAME>_<WHAT>_FILE` names (its contents, trimmed).
pub fn provider_secret(
    name: &ProviderName,
    what: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<String>> {
    let variable = secret_variable(name, what);
    let file_variable = format!("{variable}_FILE");
    let secret = match (env(&variable), env(&file_variable)) {
        (Some(_), Some(_)) => {
            anyhow::bail!("set {variable} or {file_variable}, not both")
        }
        (Some(secret), None) => secret,
        (None, Some(path)) => std::fs::read_to_string(&path)
            .with_context(|| format!("reading {file_variable} ({path})"))?
            .trim()
            .to_owned(),
        (None, None) => return Ok(None),
    };
    if secret.is_empty() {
        anyhow::bail!("{variable} is empty");
    }
    Ok(Some(secret))
}

/// What a provider's webhooks are verified with, from the environment: a signing secret
/// (`…_WEBHOOK_SECRET`), or for Adyen its hex HMAC key (`…_HMAC_KEY`) and the basic credentials
/// its deliveries carry (`…_WEBHOOK_USERNAME`, `…_WEBHOOK_PASSWORD`). `None` when unset.
pub enum WebhookAuth {
    Secret(String),
    Batch {
        hmac_key: String,
        credentials: BasicCredentials,
    },
}

pub fn webhook_auth(
    spec: &ProviderSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<WebhookAuth>> {
    let name = &spec.name;
    if spec.kind != ProviderKind::Adyen {
        return Ok(provider_secret(name, "WEBHOOK_SECRET", env)?.map(WebhookAuth::Secret));
    }
    let parts = (
        provider_secret(name, "HMAC_KEY", env)?,
        provider_secret(name, "WEBHOOK_USERNAME", env)?,
        provider_secret(name, "WEBHOOK_PASSWORD", env)?,
    );
    match parts {
        (Some(hmac_key), Some(username), Some(password)) => Ok(Some(WebhookAuth::Batch {
            hmac_key,
            credentials: BasicCredentials { username, password },
        })),
        (None, None, None) => Ok(None),
        _ => anyhow::bail!(
            "provider {name} (adyen) verifies webhooks with {}, {} and {}: set all three",
            secret_variable(name, "HMAC_KEY"),
            secret_variable(name, "WEBHOOK_USERNAME"),
            secret_variable(name, "WEBHOOK_PASSWORD")
        ),
    }
}

/// Where an Adyen provider's reports are and who reads them, from the environment: the report
/// user (`…_REPORT_USERNAME`, `…_REPORT_PASSWORD`, both or neither) and the reports' base URL
/// (`…_REPORTS_URL`; by default Adyen's Customer Area of the Checkout URL's environment,
/// `https://ca-test.adyen.com` or `https://ca-live.adyen.com`, and otherwise the Checkout URL
/// itself, where the simulator serves them). `None`: no report user, no reports.
pub fn adyen_reports(
    spec: &ProviderSpec,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<ReportsAccess>> {
    let name = &spec.name;
    let parts = (
        provider_secret(name, "REPORT_USERNAME", env)?,
        provider_secret(name, "REPORT_PASSWORD", env)?,
    );
    let credentials = match parts {
        (Some(username), Some(password)) => BasicCredentials { username, password },
        (None, None) => {
            if provider_secret(name, "REPORTS_URL", env)?.is_some() {
                anyhow::bail!(
                    "provider {name} (adyen) sets {} without the report user ({} and {})",
                    secret_variable(name, "REPORTS_URL"),
                    secret_variable(name, "REPORT_USERNAME"),
                    secret_variable(name, "REPORT_PASSWORD")
                );
            }
            return Ok(None);
        }
        _ => anyhow::bail!(
            "provider {name} (adyen) reads its reports as {} with {}: set both",
            secret_variable(name, "REPORT_USERNAME"),
            secret_variable(name, "REPORT_PASSWORD")
        ),
    };
    let base_url = match provider_secret(name, "REPORTS_URL", env)? {
        Some(url) => url,
        None if spec.url.contains("checkout-test.adyen.com") => {
            "https://ca-test.adyen.com".to_owned()
        }
        None if spec.url.contains("adyenpayments.com") => "https://ca-live.adyen.com".to_owned(),
        None => spec.url.clone(),
    };
    Ok(Some(ReportsAccess {
        base_url,
        credentials,
    }))
}

/// `--fees`: `300` (basis points for every provider) or `name:bps[+fixed],…` per provider.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fees {
    pub default: FeeSchedule,
    pub per_provider: BTreeMap<ProviderName, FeeSchedule>,
}

impl Fees {
    pub fn for_provider(&self, name: &ProviderName) -> FeeSchedule {
        self.per_provider.get(name).copied().unwrap_or(self.default)
    }
}

fn parse_schedule(raw: &str) -> Result<FeeSchedule, String> {
    let (bps, fixed) = match raw.split_once('+') {
        Some((bps, fixed)) => (bps, fixed),
        None => (raw, "0"),
    };
    let bps: u32 = bps
        .trim()
        .parse()
        .map_err(|_| format!("fee basis points must be a whole number, got {bps:?}"))?;
    let fixed: i64 = fixed
        .trim()
        .parse()
        .map_err(|_| format!("fixed fee must be whole minor units, got {fixed:?}"))?;
    FeeSchedule::new(bps, Amount::new(fixed)).map_err(|error| error.to_string())
}

pub fn parse_fees(raw: &str) -> Result<Fees, String> {
    let raw = raw.trim();
    if !raw.contains(':') {
        return Ok(Fees {
            default: parse_schedule(raw)?,
            per_provider: BTreeMap::new(),
        });
    }
    let mut fees = Fees::default();
    for item in raw
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (name, schedule) = item
            .split_once(':')
            .ok_or_else(|| format!("expected name:bps[+fixed], got {item:?}"))?;
        let name = ProviderName::parse(name.trim()).map_err(|error| error.to_string())?;
        fees.per_provider.insert(name, parse_schedule(schedule)?);
    }
    Ok(fees)
}

/// Builds the adapter of every configured provider; `env` reads the environment (their API keys).
pub fn build(
    specs: &ProviderSpecs,
    fees: &Fees,
    client: &ClientConfig,
    env: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Providers> {
    let mut providers = Vec::new();
    for spec in &specs.0 {
        let (name, url) = (&spec.name, &spec.url);
        let adapter: Arc<dyn Provider> = match spec.kind {
            ProviderKind::Sim => Arc::new(
                HttpProvider::new(name.as_str(), url, client.clone())
                    .with_context(|| format!("configuring provider {name} at {url}"))?,
            ),
            ProviderKind::Stripe => {
                let key = provider_secret(name, "API_KEY", env)?.with_context(|| {
                    format!(
                        "provider {name} (stripe) needs its secret key in {} (or _FILE)",
                        secret_variable(name, "API_KEY")
                    )
                })?;
                Arc::new(
                    StripeProvider::new(name.as_str(), url, &key, client.clone())
                        .with_context(|| format!("configuring provider {name} at {url}"))?,
                )
            }
            ProviderKind::Adyen => {
                let required = |what: &str| -> anyhow::Result<String> {
                    provider_secret(name, what, env)?.with_context(|| {
                        format!(
                            "provider {name} (adyen) needs {} (or _FILE)",
                            secret_variable(name, what)
                        )
                    })
                };
                let key = required("API_KEY")?;
                let account = AdyenAccount {
                    merchant_account: required("MERCHANT_ACCOUNT")?,
                    return_url: provider_secret(name, "RETURN_URL", env)?
                        .unwrap_or_else(|| RETURN_URL_DEFAULT.to_owned()),
                };
                let mut adyen =
                    AdyenProvider::new(name.as_str(), url, &key, account, client.clone())
                        .with_context(|| format!("configuring provider {name} at {url}"))?;
                if let Some(access) = adyen_reports(spec, env)? {
                    adyen = adyen.with_reports(&access).with_context(|| {
                        format!(
                            "configuring provider {name}'s reports at {}",
                            access.base_url
                        )
                    })?;
                }
                Arc::new(adyen)
            }
        };
        providers.push((
            name.clone(),
            ConfiguredProvider {
                adapter,
                fees: fees.for_provider(name),
            },
        ));
    }
    for name in fees.per_provider.keys() {
        if !specs.0.iter().any(|spec| &spec.name == name) {
            anyhow::bail!("--fees names provider {name}, which is not configured");
        }
    }
    Ok(Providers::new(providers))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(raw: &str) -> ProviderName {
        ProviderName::parse(raw).expect("name")
    }

    fn spec(raw: &str, kind: ProviderKind, url: &str) -> ProviderSpec {
        ProviderSpec {
            name: name(raw),
            kind,
            url: url.to_owned(),
        }
    }

    #[test]
    fn adyen_reports_are_read_as_the_report_user_at_the_customer_area_or_the_given_url() {
        let vars = |pairs: &[(&str, &str)]| {
            let pairs: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            move |key: &str| pairs.get(key).cloned()
        };
        let test = spec(
            "adyen",
            ProviderKind::Adyen,
            "https://checkout-test.adyen.com",
        );
        let live = spec(
            "adyen",
            ProviderKind::Adyen,
            "https://1797a841fbb37ca7-AdyenDemo-checkout-live.adyenpayments.com/checkout",
        );
        let sim = spec("adyen", ProviderKind::Adyen, "http://127.0.0.1:8090");
        let user = [
            (
                "ASIENTO_PROVIDER_ADYEN_REPORT_USERNAME",
                "report_123@Company.Acme",
            ),
            ("ASIENTO_PROVIDER_ADYEN_REPORT_PASSWORD", "pw"),
        ];
        let base = |spec: &ProviderSpec, pairs: &[(&str, &str)]| {
            adyen_reports(spec, &vars(pairs))
                .expect("valid")
                .map(|access| access.base_url)
        };
        assert_eq!(
            base(&test, &user).as_deref(),
            Some("https://ca-test.adyen.com")
        );
        assert_eq!(
            base(&live, &user).as_deref(),
            Some("https://ca-live.adyen.com")
        );
        assert_eq!(base(&sim, &user).as_deref(), Some("http://127.0.0.1:8090"));
        let mut with_url = user.to_vec();
        with_url.push((
            "ASIENTO_PROVIDER_ADYEN_REPORTS_URL",
            "http://127.0.0.1:9999",
        ));
        assert_eq!(
            base(&test, &with_url).as_deref(),
            Some("http://127.0.0.1:9999")
        );
        let access = adyen_reports(&sim, &vars(&user))
            .expect("valid")
            .expect("some");
        assert_eq!(access.credentials.username, "report_123@Company.Acme");
        assert_eq!(access.credentials.password, "pw");
        assert_eq!(base(&sim, &[]), None);
        for partial in [
            &user[..1],
            &user[1..],
            &[(
                "ASIENTO_PROVIDER_ADYEN_REPORTS_URL",
                "http://127.0.0.1:9999",
            )][..],
        ] {
            assert!(adyen_reports(&sim, &vars(partial)).is_err(), "{partial:?}");
        }
    }

    #[test]
    fn providers_are_name_equals_kind_and_url() {
        let parsed = parse_providers(
            "sim=http://127.0.0.1:8081, acme=sim:http://127.0.0.1:9000,\
             stripe=stripe:https://api.stripe.com",
        )
        .expect("valid");
        assert_eq!(
            parsed.0,
            vec![
                spec("sim", ProviderKind::Sim, "http://127.0.0.1:8081"),
                spec("acme", ProviderKind::Sim, "http://127.0.0.1:9000"),
                spec("stripe", ProviderKind::Stripe, "https://api.stripe.com"),
            ]
        );
        for bad in [
            "",
            "sim",
            "Sim=http://x",
            "sim=http://a,sim=http://b",
            "x=worldpay:https://a",
        ] {
            assert!(parse_providers(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn secrets_come_from_the_environment_or_a_file_it_names() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("key");
        std::fs::write(&file, "sk_test_from_file\n").expect("write");
        let file = file.display().to_string();
        let env = |variable: &str| match variable {
            "ASIENTO_PROVIDER_STRIPE_API_KEY" => Some("sk_test_env".to_owned()),
            "ASIENTO_PROVIDER_EU_STRIPE_API_KEY_FILE" => Some(file.clone()),
            "ASIENTO_PROVIDER_BOTH_API_KEY" | "ASIENTO_PROVIDER_BOTH_API_KEY_FILE" => {
                Some("x".to_owned())
            }
            "ASIENTO_PROVIDER_EMPTY_API_KEY" => Some(String::new()),
            _ => None,
        };
        let read = |raw: &str| provider_secret(&name(raw), "API_KEY", &env);
        assert_eq!(read("stripe").expect("set").as_deref(), Some("sk_test_env"));
        assert_eq!(
            read("eu-stripe").expect("file").as_deref(),
            Some("sk_test_from_file")
        );
        assert_eq!(read("other").expect("unset"), None);
        assert!(read("both").is_err());
        assert!(read("empty").is_err());

        let specs = parse_providers("stripe=stripe:http://127.0.0.1:1").expect("valid");
        let none = |_: &str| None;
        let Err(error) = build(&specs, &Fees::default(), &ClientConfig::default(), &none) else {
            panic!("a Stripe provider needs its key");
        };
        assert!(
            error
                .to_string()
                .contains("ASIENTO_PROVIDER_STRIPE_API_KEY"),
            "{error}"
        );
        build(&specs, &Fees::default(), &ClientConfig::default(), &env).expect("with its key");
    }

    #[test]
    fn fees_are_one_rate_or_one_per_provider() {
        let all = parse_fees("250").expect("valid");
        assert_eq!(
            all.for_provider(&name("any")),
            FeeSchedule::new(250, Amount::ZERO).expect("fee")
        );
        let per = parse_fees("sim:300,acme:290+30").expect("valid");
        assert_eq!(
            per.for_provider(&name("sim")),
            FeeSchedule::new(300, Amount::ZERO).expect("fee")
        );
        assert_eq!(
            per.for_provider(&name("acme")),
            FeeSchedule::new(290, Amount::new(30)).expect("fee")
        );
        assert_eq!(per.for_provider(&name("other")), FeeSchedule::default());
        for bad in [
            "",
            "3.5",
            "sim:",
            "sim:abc",
            "sim:300+-1",
            "sim:10001",
            "SIM:300",
        ] {
            assert!(parse_fees(bad).is_err(), "{bad:?}");
        }
    }
}
