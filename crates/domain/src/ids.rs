//! Identifiers: uuid newtypes shown with a Stripe-like prefix (`pay_…`), and
//! validated name segments for tenants, customers and providers.
//!
//! Names that end up inside account names and stream names (`customer:42`,
//! `account-{tenant}:…`) are validated as account segments here, so a name
//! can never smuggle a `:` or `-` boundary into a stream id it is not part of.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::account::{is_valid_segment, SEGMENT_CHARS_MAX};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    #[error("{kind} must look like {prefix}<32 hex digits>, got {value:?}")]
    Malformed {
        kind: &'static str,
        prefix: &'static str,
        value: String,
    },
    #[error(
        "{kind} must be 1 to {SEGMENT_CHARS_MAX} characters of a-z, 0-9, '_' or '-', got {value:?}"
    )]
    InvalidName { kind: &'static str, value: String },
}

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Uuid);

        impl $name {
            pub const PREFIX: &'static str = $prefix;

            #[must_use]
            pub const fn from_uuid(uuid: Uuid) -> Self {
                $name(uuid)
            }

            #[must_use]
            pub const fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// Accepts the prefixed form (`pay_0190…`) and, for callers that
            /// hold a bare uuid string, the hyphenated or simple uuid.
            pub fn parse(value: &str) -> Result<Self, IdError> {
                let bare = value.strip_prefix($prefix).unwrap_or(value);
                Uuid::try_parse(bare).map($name).map_err(|_| IdError::Malformed {
                    kind: $kind,
                    prefix: $prefix,
                    value: value.to_owned(),
                })
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}{}", $prefix, self.0.simple())
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(self, f)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::parse(s)
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = String::deserialize(deserializer)?;
                $name::parse(&value).map_err(serde::de::Error::custom)
            }
        }
    };
}

prefixed_id!(
    /// A payment, and the name of its stream (`payment-pay_…`).
    PaymentId, "pay_", "payment id"
);
prefixed_id!(
    /// A transfer between two accounts.
    TransferId, "tr_", "transfer id"
);
prefixed_id!(
    /// A journal entry. Entries posted by decisions get ids derived from what
    /// caused them (see `EntryId::derived`), so re-deciding the same thing
    /// yields the same entry id.
    EntryId, "je_", "journal entry id"
);

/// Namespace for [`EntryId::derived`]: a fixed random uuid, so derived ids
/// never collide with ids derived for another purpose.
const ENTRY_ID_NAMESPACE: Uuid = Uuid::from_u128(0x5d1b_2a3e_8c4f_4b7a_9e21_6f0c_d3a4_b5e6);

impl EntryId {
    /// A name-based (v5) id: the same cause always gets the same entry id,
    /// which keeps decisions pure and replays byte-identical.
    #[must_use]
    pub fn derived(cause: &str) -> Self {
        EntryId(Uuid::new_v5(&ENTRY_ID_NAMESPACE, cause.as_bytes()))
    }
}

macro_rules! segment_name {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub fn parse(value: &str) -> Result<Self, IdError> {
                if is_valid_segment(value) {
                    Ok($name(value.to_owned()))
                } else {
                    Err(IdError::InvalidName { kind: $kind, value: value.to_owned() })
                }
            }

            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::parse(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                if is_valid_segment(&value) {
                    Ok($name(value))
                } else {
                    Err(IdError::InvalidName { kind: $kind, value })
                }
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }
    };
}

segment_name!(
    /// A tenant: every account, payment and entry belongs to exactly one.
    TenantId, "tenant id"
);
segment_name!(
    /// The merchant's customer; owns the account `customer:{id}:available`.
    CustomerId, "customer"
);
segment_name!(
    /// A configured payment provider (`sim`); owns `psp:{name}:clearing`.
    ProviderName, "provider"
);

/// The idempotency key sent to the provider when charging a payment. Derived
/// from the payment id alone, so every retry, resume or reconciliation lookup
/// after a crash uses the same key and the provider charges at most once.
#[must_use]
pub fn psp_charge_key(payment: PaymentId) -> String {
    format!("psp_{}", payment.as_uuid().simple())
}

/// The provider idempotency key of the `sequence`-th capture request (1-based). A refused
/// capture may be asked again, under a new key, since the provider replays a key's first answer.
/// The first keeps the form it has always had, so that a capture recorded by an earlier version
/// resumes with the key it was sent with.
#[must_use]
pub fn psp_capture_key(payment: PaymentId, sequence: u32) -> String {
    if sequence <= 1 {
        format!("psp_{}_capture", payment.as_uuid().simple())
    } else {
        format!("psp_{}_capture_{sequence}", payment.as_uuid().simple())
    }
}

/// The provider idempotency key of the cancel of an abandoned charge of this payment.
#[must_use]
pub fn psp_cancel_key(payment: PaymentId) -> String {
    format!("psp_{}_cancel", payment.as_uuid().simple())
}

/// The provider idempotency key of the merchant's `sequence`-th cancel of an authorization
/// (1-based): a refused cancel may be asked again under a new key. Apart from the key of the
/// stale sweep's cancel of an abandoned charge, which asks something else of the provider.
#[must_use]
pub fn psp_authorization_cancel_key(payment: PaymentId, sequence: u32) -> String {
    format!("psp_{}_cancel_{sequence}", payment.as_uuid().simple())
}

/// The provider idempotency key of the `sequence`-th refund request (1-based).
#[must_use]
pub fn psp_refund_key(payment: PaymentId, sequence: u32) -> String {
    format!("psp_{}_refund_{sequence}", payment.as_uuid().simple())
}

/// The payment a provider idempotency key of ours was derived from (the charge's, a capture's,
/// a refund's or the cancel's), for a provider whose notices name an operation only by the
/// reference we sent with it (Adyen's `merchantReference`). `None` for any other text.
#[must_use]
pub fn payment_of_psp_key(key: &str) -> Option<PaymentId> {
    let rest = key.strip_prefix("psp_")?;
    let (uuid, suffix) = rest.split_at_checked(32)?;
    let known_suffix = suffix.is_empty()
        || suffix == "_cancel"
        || suffix == "_capture"
        || ["_capture_", "_refund_", "_cancel_"].iter().any(|prefix| {
            suffix
                .strip_prefix(prefix)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        });
    if !known_suffix || !uuid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Uuid::try_parse(uuid).ok().map(PaymentId::from_uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_psp_key_names_its_payment_and_nothing_else_does() {
        let payment =
            PaymentId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001));
        for key in [
            psp_charge_key(payment),
            psp_capture_key(payment, 1),
            psp_capture_key(payment, 7),
            psp_refund_key(payment, 12),
            psp_cancel_key(payment),
            psp_authorization_cancel_key(payment, 3),
        ] {
            assert_eq!(payment_of_psp_key(&key), Some(payment), "{key}");
        }
        let charge = psp_charge_key(payment);
        for other in [
            String::new(),
            "psp_".to_owned(),
            payment.to_string(),
            format!("{charge}_refund_"),
            format!("{charge}_refund_x"),
            format!("{charge}_other"),
            format!("x{charge}"),
            charge.replacen('0', "g", 1),
            format!("{}é", &charge[..charge.len() - 1]),
        ] {
            assert_eq!(payment_of_psp_key(&other), None, "{other}");
        }
    }

    #[test]
    fn ids_display_with_prefix_and_parse_back() {
        let id = PaymentId::from_uuid(Uuid::from_u128(0x0190_0000_0000_7000_8000_0000_0000_0001));
        let shown = id.to_string();
        assert_eq!(shown, "pay_01900000000070008000000000000001");
        assert_eq!(PaymentId::parse(&shown).unwrap(), id);
        assert_eq!(PaymentId::parse(&id.as_uuid().to_string()).unwrap(), id);
        assert!(PaymentId::parse("pay_nope").is_err());
        assert_eq!(serde_json::to_value(id).unwrap(), serde_json::json!(shown));
    }

    #[test]
    fn derived_keys_are_deterministic() {
        let id = PaymentId::from_uuid(Uuid::from_u128(7));
        assert_eq!(psp_charge_key(id), "psp_00000000000000000000000000000007");
        assert_eq!(psp_charge_key(id), psp_charge_key(id));
        assert_ne!(psp_refund_key(id, 1), psp_refund_key(id, 2));
        assert_eq!(
            psp_capture_key(id, 1),
            "psp_00000000000000000000000000000007_capture"
        );
        assert_eq!(
            psp_capture_key(id, 2),
            "psp_00000000000000000000000000000007_capture_2"
        );
        assert_eq!(EntryId::derived("a"), EntryId::derived("a"));
        assert_ne!(EntryId::derived("a"), EntryId::derived("b"));
    }

    #[test]
    fn names_are_validated_segments() {
        assert!(TenantId::parse("acme_1").is_ok());
        assert!(CustomerId::parse("42").is_ok());
        for bad in ["", "Acme", "a:b", "a b", &"x".repeat(65)] {
            assert!(TenantId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(serde_json::from_str::<ProviderName>("\"SIM\"").is_err());
    }
}
