//! The HMAC signature of Adyen's standard notifications, item by item: the eight values
//! `pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success`
//! joined by `:` with no escaping (an absent value is empty), signed with HMAC-SHA256 under the
//! hex-decoded key, base64 in `additionalData.hmacSignature` (docs/adyen-wire.md §4; Adyen's libraries'
//! `generate_notification_sig` / `getDataToSign`). The signature covers the parsed fields, not the
//! raw body, so every item of a batch is checked on its own.
//!
//! The simulator signs with [`sign_item`]; the ledger's webhook endpoint checks with
//! [`verify_item`], which takes anything an attacker can send and compares in constant time.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::wire::NotificationItem;

type HmacSha256 = Hmac<Sha256>;

/// An Adyen HMAC key is 32 bytes (64 hex digits); anything over this is refused unread.
pub const KEY_HEX_LEN_MAX: usize = 256;
/// A base64 HMAC-SHA256 is 44 characters; a longer claimed signature is refused unread.
pub const SIGNATURE_LEN_MAX: usize = 128;

/// Why an item's signature was refused. Every variant means "do not trust the item".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HmacError {
    #[error("the HMAC key is not hexadecimal (Adyen's keys are 64 hex digits)")]
    KeyInvalid,
    #[error("the item carries no additionalData.hmacSignature")]
    SignatureMissing,
    #[error("the item's hmacSignature is not base64 of 32 bytes")]
    SignatureMalformed,
    #[error("the item's hmacSignature does not match its fields")]
    SignatureMismatch,
}

/// An HMAC key as Adyen's Customer Area shows it: hex, decoded once.
#[derive(Clone, PartialEq, Eq)]
pub struct HmacKey(Vec<u8>);

impl HmacKey {
    pub fn from_hex(hex_key: &str) -> Result<HmacKey, HmacError> {
        if hex_key.is_empty() || hex_key.len() > KEY_HEX_LEN_MAX {
            return Err(HmacError::KeyInvalid);
        }
        hex::decode(hex_key.trim())
            .map(HmacKey)
            .map_err(|_| HmacError::KeyInvalid)
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length.
        match HmacSha256::new_from_slice(&self.0) {
            Ok(mac) => mac,
            Err(_) => unreachable!("HMAC-SHA256 accepts keys of every length"),
        }
    }
}

impl std::fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HmacKey(***)")
    }
}

/// The string Adyen signs for `item`.
pub fn signing_string(item: &NotificationItem) -> String {
    [
        item.psp_reference.as_str(),
        item.original_reference.as_deref().unwrap_or_default(),
        item.merchant_account_code.as_str(),
        item.merchant_reference.as_str(),
        &item.amount.value.to_string(),
        item.amount.currency.as_str(),
        item.event_code.as_str(),
        item.success.as_str(),
    ]
    .join(":")
}

/// base64(HMAC-SHA256(key, data)).
pub fn sign(key: &HmacKey, data: &str) -> String {
    let mut mac = key.mac();
    mac.update(data.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

/// The signature of `item`'s fields, as the simulator puts it in `additionalData.hmacSignature`.
pub fn sign_item(key: &HmacKey, item: &NotificationItem) -> String {
    sign(key, &signing_string(item))
}

/// Checks `item`'s `additionalData.hmacSignature` against its fields, in constant time.
pub fn verify_item(key: &HmacKey, item: &NotificationItem) -> Result<(), HmacError> {
    let claimed = item
        .additional_data
        .get(super::wire::HMAC_SIGNATURE)
        .ok_or(HmacError::SignatureMissing)?;
    if claimed.len() > SIGNATURE_LEN_MAX {
        return Err(HmacError::SignatureMalformed);
    }
    let claimed = base64::engine::general_purpose::STANDARD
        .decode(claimed)
        .map_err(|_| HmacError::SignatureMalformed)?;
    let mut mac = key.mac();
    mac.update(signing_string(item).as_bytes());
    let expected = mac.finalize().into_bytes();
    if claimed.len() != expected.len() {
        return Err(HmacError::SignatureMalformed);
    }
    if bool::from(expected.as_slice().ct_eq(&claimed)) {
        Ok(())
    } else {
        Err(HmacError::SignatureMismatch)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::adyen::wire::Amount;

    /// The key of the library's mocks (`test/UtilTest.py`).
    const LIBRARY_MOCK_KEY: &str =
        "74F490DD33F7327BAECC88B2947C011FC02D014A473AAA33A8EC93E4DC069174";

    /// Adyen's published vector (adyen-python-api-library `test/UtilTest.py`).
    const KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
    const DATA: &str =
        "7914073381342284::TestMerchant:TestPayment-1407325143704:1130:EUR:AUTHORISATION:true";
    const SIGNATURE: &str = "coqCmt/IZ4E3CzPvMY8zTjQVL5hYJUiBRg8UU+iCWo0=";

    fn vector_item() -> NotificationItem {
        NotificationItem {
            psp_reference: "7914073381342284".into(),
            original_reference: None,
            merchant_account_code: "TestMerchant".into(),
            merchant_reference: "TestPayment-1407325143704".into(),
            amount: Amount {
                currency: "EUR".into(),
                value: 1130,
            },
            event_code: "AUTHORISATION".into(),
            success: "true".into(),
            event_date: "2014-08-06T13:19:03+02:00".into(),
            payment_method: None,
            reason: None,
            additional_data: Default::default(),
        }
    }

    #[test]
    fn adyens_published_vector_signs_and_verifies() {
        let key = HmacKey::from_hex(KEY).unwrap();
        assert_eq!(sign(&key, DATA), SIGNATURE);
        let mut item = vector_item();
        assert_eq!(signing_string(&item), DATA);
        assert_eq!(sign_item(&key, &item), SIGNATURE);
        item.additional_data
            .insert("hmacSignature".into(), SIGNATURE.into());
        assert_eq!(verify_item(&key, &item), Ok(()));
    }

    #[test]
    fn any_changed_field_fails_and_garbage_is_refused_without_panicking() {
        let key = HmacKey::from_hex(KEY).unwrap();
        let mut signed = vector_item();
        signed
            .additional_data
            .insert("hmacSignature".into(), SIGNATURE.into());
        let changes: [fn(&mut NotificationItem); 8] = [
            |i| i.psp_reference.push('1'),
            |i| i.original_reference = Some("x".into()),
            |i| i.merchant_account_code.push('x'),
            |i| i.merchant_reference.push('x'),
            |i| i.amount.value += 1,
            |i| i.amount.currency = "USD".into(),
            |i| i.event_code = "CAPTURE".into(),
            |i| i.success = "false".into(),
        ];
        for (n, change) in changes.iter().enumerate() {
            let mut item = signed.clone();
            change(&mut item);
            assert_eq!(
                verify_item(&key, &item),
                Err(HmacError::SignatureMismatch),
                "change {n}"
            );
        }
        for (claimed, error) in [
            ("", HmacError::SignatureMalformed),
            ("not base64!", HmacError::SignatureMalformed),
            ("AAAA", HmacError::SignatureMalformed),
            (&"A".repeat(4096), HmacError::SignatureMalformed),
        ] {
            let mut item = signed.clone();
            item.additional_data
                .insert("hmacSignature".into(), claimed.to_owned());
            assert_eq!(verify_item(&key, &item), Err(error), "{claimed:.20}");
        }
        let mut unsigned = signed.clone();
        unsigned.additional_data.clear();
        assert_eq!(
            verify_item(&key, &unsigned),
            Err(HmacError::SignatureMissing)
        );
        assert_eq!(HmacKey::from_hex("xyz"), Err(HmacError::KeyInvalid));
        assert_eq!(HmacKey::from_hex(""), Err(HmacError::KeyInvalid));
    }

    /// Adyen's library mocks, items whose merchant references hold `:`, `\\` and `/`: they
    /// verify only without escaping (adyen-python-api-library `test/mocks/util/`, key from
    /// `test/UtilTest.py`).
    #[test]
    fn colons_and_backslashes_are_signed_as_they_are() {
        let key = HmacKey::from_hex(LIBRARY_MOCK_KEY).unwrap();
        for body in [
            include_str!("../../tests/fixtures/adyen/colon_notification.json"),
            include_str!("../../tests/fixtures/adyen/backslash_notification.json"),
            include_str!("../../tests/fixtures/adyen/forwardslash_notification.json"),
            include_str!("../../tests/fixtures/adyen/mixed_notification.json"),
        ] {
            let item: NotificationItem = serde_json::from_str(body).unwrap();
            assert_eq!(
                verify_item(&key, &item),
                Ok(()),
                "{}",
                item.merchant_reference
            );
            // The legacy HPP scheme's escaping would break exactly the references that hold them.
            let mut escaped = item.clone();
            escaped.merchant_reference = item
                .merchant_reference
                .replace('\\', "\\\\")
                .replace(':', "\\:");
            if escaped.merchant_reference == item.merchant_reference {
                continue;
            }
            assert_eq!(
                verify_item(&key, &escaped),
                Err(HmacError::SignatureMismatch),
                "{}",
                item.merchant_reference
            );
        }
    }
}
