//! Receiving Adyen's standard notifications (docs/adyen-wire.md §4): a batch arrives with HTTP basic auth,
//! and every item in it carries its own HMAC over its fields. The endpoint checks the
//! credentials, verifies every item, and stores each item on its own (a batch is only a
//! transport: Adyen retries it whole, and each item is deduplicated by its own id).

use base64::Engine as _;
use serde::Deserialize as _;
use subtle::ConstantTimeEq;

use super::hmac::{verify_item, HmacError, HmacKey};
use super::wire::NotificationItem;

/// The most items one delivery may carry; Adyen sends a handful.
pub const BATCH_ITEMS_MAX: usize = 1_000;

/// The user and password Adyen is configured to send to our endpoint. `Debug` hides both.
#[derive(Clone, PartialEq, Eq)]
pub struct BasicCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for BasicCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BasicCredentials(***)")
    }
}

impl BasicCredentials {
    /// The `Authorization` header value that sends these credentials.
    pub fn header_value(&self) -> String {
        let pair = format!("{}:{}", self.username, self.password);
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(pair)
        )
    }

    /// Whether `header` (`Authorization`) carries exactly these credentials; compared in
    /// constant time, so that a guess learns nothing from the time of the answer.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        let Some(header) = header else {
            return false;
        };
        let expected = self.header_value();
        let header = header.trim();
        // The scheme name is case-insensitive (RFC 9110 §11.1).
        let matches_scheme = header
            .get(..6)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("basic "));
        matches_scheme && bool::from(header.as_bytes()[6..].ct_eq(&expected.as_bytes()[6..]))
    }
}

/// One verified item, as the inbox stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedItem {
    /// `pspReference:eventCode:success`, unique per notification of the account.
    pub id: String,
    pub event_code: String,
    /// Ours: the payment id, or the PSP key of a modification.
    pub merchant_reference: String,
    /// The item as it arrived (`NotificationRequestItem`'s object, every field kept).
    pub payload: Vec<u8>,
}

/// Why a delivery was refused: nothing of it is stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("the body is not an Adyen notification batch: {0}")]
    NotABatch(String),
    #[error("the batch carries no item")]
    Empty,
    #[error("the batch carries more than {BATCH_ITEMS_MAX} items")]
    TooManyItems,
    #[error("item {index} is not a notification item: {error}")]
    ItemInvalid { index: usize, error: String },
    #[error("item {index}: {error}")]
    Signature { index: usize, error: HmacError },
}

/// Reads a delivery and verifies every item's HMAC under `key`; any item that does not verify
/// refuses the whole delivery (a sender that cannot sign one item is not Adyen).
pub fn verify_batch(key: &HmacKey, body: &[u8]) -> Result<Vec<VerifiedItem>, BatchError> {
    let batch: serde_json::Value =
        serde_json::from_slice(body).map_err(|error| BatchError::NotABatch(error.to_string()))?;
    let items = batch
        .get("notificationItems")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(|| BatchError::NotABatch("no notificationItems array".to_owned()))?;
    if items.is_empty() {
        return Err(BatchError::Empty);
    }
    if items.len() > BATCH_ITEMS_MAX {
        return Err(BatchError::TooManyItems);
    }
    items
        .iter()
        .enumerate()
        .map(|(index, wrapper)| {
            let invalid = |error: String| BatchError::ItemInvalid { index, error };
            let raw = wrapper
                .get("NotificationRequestItem")
                .ok_or_else(|| invalid("no NotificationRequestItem".to_owned()))?;
            let item = NotificationItem::deserialize(raw).map_err(|e| invalid(e.to_string()))?;
            verify_item(key, &item).map_err(|error| BatchError::Signature { index, error })?;
            let payload = serde_json::to_vec(raw).map_err(|e| invalid(e.to_string()))?;
            Ok(VerifiedItem {
                id: item.dedup_id(),
                event_code: item.event_code,
                merchant_reference: item.merchant_reference,
                payload,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::adyen::hmac::sign_item;
    use crate::adyen::wire::{Amount, NotificationItemWrapper, NotificationRequest};

    const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";

    fn signed(psp_reference: &str, key: &HmacKey) -> NotificationItem {
        let mut item = NotificationItem {
            psp_reference: psp_reference.into(),
            original_reference: Some("PAYMENT000000001".into()),
            merchant_account_code: "Acme".into(),
            merchant_reference: "psp_x_capture".into(),
            amount: Amount {
                currency: "EUR".into(),
                value: 1130,
            },
            event_code: "CAPTURE".into(),
            success: "true".into(),
            event_date: "2026-12-01T10:00:00+01:00".into(),
            payment_method: None,
            reason: None,
            additional_data: Default::default(),
        };
        let signature = sign_item(key, &item);
        item.additional_data
            .insert("hmacSignature".into(), signature);
        item
    }

    fn body(items: Vec<NotificationItem>) -> Vec<u8> {
        serde_json::to_vec(&NotificationRequest {
            live: "false".into(),
            notification_items: items
                .into_iter()
                .map(|item| NotificationItemWrapper { item })
                .collect(),
        })
        .unwrap()
    }

    #[test]
    fn every_item_is_verified_and_kept_whole() {
        let key = HmacKey::from_hex(KEY).unwrap();
        let mut value: serde_json::Value =
            serde_json::from_slice(&body(vec![signed("A", &key), signed("B", &key)])).unwrap();
        value["notificationItems"][1]["NotificationRequestItem"]["operations"] =
            serde_json::json!(["REFUND"]);
        let items = verify_batch(&key, &serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(
            items
                .iter()
                .map(|item| item.id.as_str())
                .collect::<Vec<_>>(),
            ["A:CAPTURE:true", "B:CAPTURE:true"]
        );
        let kept: serde_json::Value = serde_json::from_slice(&items[1].payload).unwrap();
        assert_eq!(kept["operations"][0], "REFUND", "unknown fields are stored");
    }

    #[test]
    fn one_bad_item_refuses_the_delivery() {
        let key = HmacKey::from_hex(KEY).unwrap();
        let mut forged = signed("B", &key);
        forged.amount.value += 1;
        assert!(matches!(
            verify_batch(&key, &body(vec![signed("A", &key), forged])),
            Err(BatchError::Signature { index: 1, .. })
        ));
        let other = HmacKey::from_hex(&"00".repeat(32)).unwrap();
        assert!(matches!(
            verify_batch(&other, &body(vec![signed("A", &key)])),
            Err(BatchError::Signature { index: 0, .. })
        ));
        for (text, expected) in [
            ("not json", "NotABatch"),
            (r#"{"live":"false"}"#, "NotABatch"),
            (r#"{"notificationItems":[]}"#, "Empty"),
            (r#"{"notificationItems":[{"x":1}]}"#, "ItemInvalid"),
            (
                r#"{"notificationItems":[{"NotificationRequestItem":{"pspReference":1}}]}"#,
                "ItemInvalid",
            ),
        ] {
            let error = verify_batch(&key, text.as_bytes()).unwrap_err();
            assert!(
                format!("{error:?}").starts_with(expected),
                "{text}: {error:?}"
            );
        }
    }

    #[test]
    fn basic_auth_accepts_only_the_configured_pair() {
        let credentials = BasicCredentials {
            username: "adyen".into(),
            password: "s3cret:with:colons".into(),
        };
        let header = credentials.header_value();
        assert!(credentials.accepts(Some(&header)));
        assert!(credentials.accepts(Some(&header.replacen("Basic", "basic", 1))));
        let other = BasicCredentials {
            password: "wrong".into(),
            ..credentials.clone()
        };
        for refused in [
            None,
            Some(""),
            Some("Basic"),
            Some("Bearer x"),
            Some(other.header_value().as_str()),
            Some("Basic é"),
        ] {
            assert!(!credentials.accepts(refused), "{refused:?}");
        }
        assert!(!format!("{credentials:?}").contains("s3cret"));
    }
}
