//! Provider configuration from flags: which providers exist, where they live and what the
//! platform charges on each (`--psp-url`, `--providers`, `--fees`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Context as _;
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_domain::{Amount, FeeSchedule, ProviderName};
use asiento_psp::{ClientConfig, HttpProvider};

/// The provider a payment uses when it names none, and the one `--psp-url` configures.
pub const DEFAULT_PROVIDER: &str = "sim";

/// `name=url,name=url` from `--providers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderUrls(pub Vec<(ProviderName, String)>);

pub fn parse_provider_urls(raw: &str) -> Result<ProviderUrls, String> {
    let mut pairs: Vec<(ProviderName, String)> = Vec::new();
    for item in raw
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (name, url) = item
            .split_once('=')
            .ok_or_else(|| format!("expected name=url, got {item:?}"))?;
        let name = ProviderName::parse(name.trim()).map_err(|error| error.to_string())?;
        if pairs.iter().any(|(existing, _)| existing == &name) {
            return Err(format!("provider {name} is configured twice"));
        }
        pairs.push((name, url.trim().to_owned()));
    }
    if pairs.is_empty() {
        return Err("no name=url pair given".to_owned());
    }
    Ok(ProviderUrls(pairs))
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

/// Builds the HTTP adapters for every configured provider.
pub fn build(urls: &ProviderUrls, fees: &Fees, client: &ClientConfig) -> anyhow::Result<Providers> {
    let mut providers = Vec::new();
    for (name, url) in &urls.0 {
        let adapter = HttpProvider::new(name.as_str(), url, client.clone())
            .with_context(|| format!("configuring provider {name} at {url}"))?;
        providers.push((
            name.clone(),
            ConfiguredProvider {
                adapter: Arc::new(adapter),
                fees: fees.for_provider(name),
            },
        ));
    }
    for name in fees.per_provider.keys() {
        if !urls.0.iter().any(|(configured, _)| configured == name) {
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

    #[test]
    fn provider_urls_are_name_equals_url() {
        let parsed = parse_provider_urls("sim=http://127.0.0.1:8081, acme=http://127.0.0.1:9000")
            .expect("valid");
        assert_eq!(
            parsed.0,
            vec![
                (name("sim"), "http://127.0.0.1:8081".to_owned()),
                (name("acme"), "http://127.0.0.1:9000".to_owned()),
            ]
        );
        for bad in ["", "sim", "Sim=http://x", "sim=http://a,sim=http://b"] {
            assert!(parse_provider_urls(bad).is_err(), "{bad:?}");
        }
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
