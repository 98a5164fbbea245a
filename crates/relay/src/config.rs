//! A relay's settings (`serve --events-relay…`), checked before `serve` starts, and the name its
//! cursor and lease go by.

use std::time::Duration;

use crate::RelayError;

/// The stream the relay publishes to unless told otherwise.
pub const STREAM_DEFAULT: &str = "ASIENTO_EVENTS";
/// The duplicate window of a stream the relay creates: a re-publish after a crash or a lost
/// acknowledgement comes well within it.
pub const DUPLICATE_WINDOW_DEFAULT: Duration = Duration::from_secs(120);
/// How long the relay's lease holds without renewal: a killed relay's successor takes over
/// within it.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(10);
/// How long a publish waits for JetStream's acknowledgement before the round fails.
pub const ACK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// What a relay publishes, where, and how it holds on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayConfig {
    /// The NATS server(s): `nats://host:4222`, or several separated by commas (one cluster).
    pub url: String,
    /// The JetStream stream, created with subjects `asiento.>` when it does not exist.
    pub stream: String,
    /// The tenants whose events it relays, sorted; empty for every tenant.
    pub tenants: Vec<String>,
    /// The duplicate window of a stream the relay creates (an existing stream keeps its own).
    pub duplicate_window: Duration,
    pub lease: Duration,
    pub ack_timeout: Duration,
}

impl RelayConfig {
    /// Every tenant's events to [`STREAM_DEFAULT`] on `url`, with the default timings.
    #[must_use]
    pub fn new(url: impl Into<String>) -> RelayConfig {
        RelayConfig {
            url: url.into(),
            stream: STREAM_DEFAULT.to_owned(),
            tenants: Vec::new(),
            duplicate_window: DUPLICATE_WINDOW_DEFAULT,
            lease: LEASE_DEFAULT,
            ack_timeout: ACK_TIMEOUT_DEFAULT,
        }
    }

    /// Only these tenants' events (comma-separated tenant ids; empty for every tenant).
    pub fn with_tenants(mut self, list: &str) -> Result<RelayConfig, RelayError> {
        let mut tenants = Vec::new();
        for tenant in list.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            asiento_domain::TenantId::parse(tenant)
                .map_err(|error| RelayError::Config(format!("tenant {tenant:?}: {error}")))?;
            tenants.push(tenant.to_owned());
        }
        tenants.sort();
        tenants.dedup();
        self.tenants = tenants;
        Ok(self)
    }

    /// Checks what the server would refuse later, so that `serve` refuses to start instead.
    pub fn validate(&self) -> Result<(), RelayError> {
        let stream_ok = !self.stream.is_empty()
            && self.stream.len() <= 255
            && self
                .stream
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !stream_ok {
            return Err(RelayError::Config(format!(
                "stream name {:?}: use 1 to 255 of A-Z, a-z, 0-9, _ and -",
                self.stream
            )));
        }
        self.servers()?;
        if self.lease < Duration::from_secs(1) {
            return Err(RelayError::Config(
                "the lease must be at least 1s".to_owned(),
            ));
        }
        if self.ack_timeout.is_zero() || self.ack_timeout >= self.lease {
            return Err(RelayError::Config(
                "the acknowledgement timeout must be above zero and below the lease".to_owned(),
            ));
        }
        if self.duplicate_window < Duration::from_secs(1) {
            return Err(RelayError::Config(
                "the duplicate window must be at least 1s".to_owned(),
            ));
        }
        Ok(())
    }

    pub(crate) fn servers(&self) -> Result<Vec<async_nats::ServerAddr>, RelayError> {
        let servers: Vec<async_nats::ServerAddr> = self
            .url
            .split(',')
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| {
                url.parse().map_err(|error| {
                    RelayError::Config(format!("NATS URL {:?}: {error}", redact(url)))
                })
            })
            .collect::<Result<_, _>>()?;
        if servers.is_empty() {
            return Err(RelayError::Config("no NATS URL given".to_owned()));
        }
        Ok(servers)
    }

    /// The relay's name: its stream, and its tenants when it relays only some.
    #[must_use]
    pub fn name(&self) -> String {
        if self.tenants.is_empty() {
            self.stream.clone()
        } else {
            format!("{}:{}", self.stream, self.tenants.join(","))
        }
    }

    /// Whether the relay publishes this tenant's events.
    #[must_use]
    pub fn relays(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.iter().any(|t| t == tenant)
    }
}

/// A NATS URL without its password or token, for messages.
#[must_use]
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            format!("{}***{}", &url[..scheme_end + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_name_is_the_stream_and_the_tenant_set() {
        let all = RelayConfig::new("nats://127.0.0.1:4222");
        assert_eq!(all.name(), "ASIENTO_EVENTS");
        assert!(all.relays("anyone"));
        let some = all
            .clone()
            .with_tenants(" beta,acme,beta ")
            .expect("tenants");
        assert_eq!(some.name(), "ASIENTO_EVENTS:acme,beta");
        assert!(some.relays("acme") && !some.relays("gamma"));
        assert!(all.clone().with_tenants("Acme").is_err());
        assert!(all.clone().with_tenants("a.b").is_err());
    }

    #[test]
    fn settings_the_server_would_refuse_are_refused_first() {
        let ok = RelayConfig::new("nats://127.0.0.1:4222, nats://127.0.0.1:4223");
        assert!(ok.validate().is_ok());
        for stream in ["", "A.B", "A B", "A*", "A>"] {
            let bad = RelayConfig {
                stream: stream.to_owned(),
                ..ok.clone()
            };
            assert!(bad.validate().is_err(), "{stream:?}");
        }
        let no_url = RelayConfig::new(" , ");
        assert!(no_url.validate().is_err());
        let slow_ack = RelayConfig {
            ack_timeout: ok.lease,
            ..ok.clone()
        };
        assert!(slow_ack.validate().is_err());
    }

    #[test]
    fn urls_are_redacted_in_messages() {
        assert_eq!(redact("nats://u:secret@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("nats://token@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("nats://h:4222"), "nats://h:4222");
    }
}
