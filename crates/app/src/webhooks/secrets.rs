//! Each provider's webhook signing secret, as configured (`ASIENTO_WEBHOOK_SECRETS`,
//! `--webhook-secret`, `ASIENTO_PROVIDER_<NAME>_WEBHOOK_SECRET`): the receiver verifies every
//! delivery against it, and reads the body in the provider's event format.

use std::collections::BTreeMap;
use std::str::FromStr;

use asiento_domain::ProviderName;
use asiento_psp::adyen::{BasicCredentials, HmacKey};
use asiento_psp::EventFormat;

/// Each provider's webhook signing secret and event format (the simulator's unless set).
/// `Debug` never shows a secret.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct WebhookSecrets {
    secrets: BTreeMap<String, String>,
    formats: BTreeMap<String, EventFormat>,
    /// A batch provider's HMAC key and the basic credentials it sends (Adyen's).
    batch: BTreeMap<String, (HmacKey, BasicCredentials)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error("webhook secret entry {index} is not `provider:secret`")]
    EntryMalformed { index: usize },
    #[error("webhook secret entry {index}: {name:?} is not a provider name")]
    ProviderNameInvalid { index: usize, name: String },
    #[error("webhook secret of provider {provider} is empty")]
    SecretEmpty { provider: String },
    #[error("provider {provider} has more than one webhook secret")]
    ProviderRepeated { provider: String },
    #[error("the HMAC key of provider {provider} is not hexadecimal")]
    HmacKeyInvalid { provider: String },
    #[error("the webhook username or password of provider {provider} is empty")]
    CredentialsEmpty { provider: String },
}

impl WebhookSecrets {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (or replaces) one provider's secret, e.g. `--webhook-secret` for `sim`.
    pub fn set(&mut self, provider: &ProviderName, secret: &str) -> Result<(), SecretsError> {
        if secret.is_empty() {
            return Err(SecretsError::SecretEmpty {
                provider: provider.to_string(),
            });
        }
        self.secrets.insert(provider.to_string(), secret.to_owned());
        Ok(())
    }

    pub fn get(&self, provider: &str) -> Option<&str> {
        self.secrets.get(provider).map(String::as_str)
    }

    /// How `provider` writes its webhook bodies.
    pub fn set_format(&mut self, provider: &ProviderName, format: EventFormat) {
        self.formats.insert(provider.to_string(), format);
    }

    pub fn format(&self, provider: &str) -> EventFormat {
        self.formats.get(provider).copied().unwrap_or_default()
    }

    /// Configures a provider that delivers batches of items signed one by one (Adyen): its hex
    /// HMAC key and the basic credentials its deliveries carry. Its format becomes
    /// [`EventFormat::Adyen`].
    pub fn set_batch(
        &mut self,
        provider: &ProviderName,
        hmac_key_hex: &str,
        credentials: BasicCredentials,
    ) -> Result<(), SecretsError> {
        let key = HmacKey::from_hex(hmac_key_hex).map_err(|_| SecretsError::HmacKeyInvalid {
            provider: provider.to_string(),
        })?;
        if credentials.username.is_empty() || credentials.password.is_empty() {
            return Err(SecretsError::CredentialsEmpty {
                provider: provider.to_string(),
            });
        }
        self.batch.insert(provider.to_string(), (key, credentials));
        self.set_format(provider, EventFormat::Adyen);
        Ok(())
    }

    /// A batch provider's HMAC key and credentials.
    pub fn batch_keys(&self, provider: &str) -> Option<(&HmacKey, &BasicCredentials)> {
        self.batch
            .get(provider)
            .map(|(key, credentials)| (key, credentials))
    }

    pub fn providers(&self) -> impl Iterator<Item = &str> {
        self.secrets
            .keys()
            .chain(self.batch.keys())
            .map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty() && self.batch.is_empty()
    }
}

/// `name:secret,name:secret` (`ASIENTO_WEBHOOK_SECRETS`). The secret is everything after the
/// first `:`, so it may itself contain colons; it may not contain commas.
impl FromStr for WebhookSecrets {
    type Err = SecretsError;

    fn from_str(text: &str) -> Result<Self, SecretsError> {
        let mut secrets = WebhookSecrets::new();
        for (index, entry) in text.split(',').enumerate() {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let (name, secret) = entry
                .split_once(':')
                .ok_or(SecretsError::EntryMalformed { index })?;
            let provider = ProviderName::parse(name.trim()).map_err(|_| {
                SecretsError::ProviderNameInvalid {
                    index,
                    name: name.trim().to_owned(),
                }
            })?;
            if secrets.get(provider.as_str()).is_some() {
                return Err(SecretsError::ProviderRepeated {
                    provider: provider.to_string(),
                });
            }
            secrets.set(&provider, secret.trim())?;
        }
        Ok(secrets)
    }
}

impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.providers().map(|provider| (provider, "***")))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_parse_several_providers_and_hide_them() {
        let secrets: WebhookSecrets = "sim:whsec_a, other:whsec:b:c,".parse().unwrap();
        assert_eq!(secrets.get("sim"), Some("whsec_a"));
        assert_eq!(secrets.get("other"), Some("whsec:b:c"));
        assert_eq!(secrets.get("nope"), None);
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("whsec"), "{shown}");
        assert!(shown.contains("sim"), "{shown}");
    }

    #[test]
    fn secrets_refuse_what_is_not_name_colon_secret() {
        let cases: [(&str, SecretsError); 4] = [
            ("sim", SecretsError::EntryMalformed { index: 0 }),
            (
                "sim:a,Bad Name:b",
                SecretsError::ProviderNameInvalid {
                    index: 1,
                    name: "Bad Name".into(),
                },
            ),
            (
                "sim:",
                SecretsError::SecretEmpty {
                    provider: "sim".into(),
                },
            ),
            (
                "sim:a,sim:b",
                SecretsError::ProviderRepeated {
                    provider: "sim".into(),
                },
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(text.parse::<WebhookSecrets>(), Err(expected), "{text}");
        }
    }
}
