//! Adyen's Checkout API (v71) and standard notifications as the ledger speaks them: only the
//! fields the adapter sends or reads, named as Adyen names them (camelCase). Decoding is tolerant
//! (unknown fields ignored, unknown result codes kept as `Other`), because Adyen adds fields and
//! values without asking; what the adapter sends and what the simulator's Adyen dialect answers
//! are checked in tests against Adyen's own OpenAPI 3.1 schemas
//! (`tests/fixtures/adyen/`), every one of which refuses unknown properties.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The Checkout API version the adapter pins in its paths (`/v71/payments`).
pub const API_VERSION: &str = "v71";

/// Where a notification item carries its HMAC signature, in `additionalData`.
pub const HMAC_SIGNATURE: &str = "hmacSignature";
/// `additionalData` of a payment request: capture only when asked (`"true"`).
pub const MANUAL_CAPTURE: &str = "manualCapture";
/// `additionalData` of an AUTHORISATION item: the hours after which the authorisation is
/// captured by itself; present when the payment asked for automatic capture (the adapter sends
/// `captureDelayHours: 0` then, and `manualCapture` otherwise).
pub const CAPTURE_DELAY_HOURS: &str = "captureDelayHours";
/// `additionalData` of a dispute item: where the dispute stands.
pub const DISPUTE_STATUS: &str = "disputeStatus";

/// The `status` of every modification's answer: Adyen decides it later.
pub const STATUS_RECEIVED: &str = "received";

/// The error code while an idempotency key's first request is still running.
pub const ERROR_KEY_IN_PROGRESS: &str = "704";
/// The header Adyen sets on an error worth retrying with the same key.
pub const TRANSIENT_ERROR_HEADER: &str = "transient-error";

/// `{"value": minor units, "currency": "EUR"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Amount {
    pub currency: String,
    pub value: i64,
}

/// A card payment method (`CardDetails`): a token Adyen stored (`storedPaymentMethodId`), or
/// card fields; `holderName` is where Adyen's test platform reads its outcome triggers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CardDetails {
    /// `scheme` for cards.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_payment_method_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_card_number: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number: Option<String>,
}

/// `POST /payments` (`PaymentRequest`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequest {
    pub amount: Amount,
    pub merchant_account: String,
    pub payment_method: CardDetails,
    /// Our payment id: unique per payment, echoed in its notifications and reports.
    pub reference: String,
    pub return_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_delay_hours: Option<i64>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_data: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shopper_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shopper_interaction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recurring_processing_model: Option<String>,
}

/// `PaymentResponse.resultCode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ResultCode {
    Authorised,
    PartiallyAuthorised,
    Refused,
    Error,
    Cancelled,
    RedirectShopper,
    IdentifyShopper,
    ChallengeShopper,
    PresentToShopper,
    Pending,
    Received,
    AuthenticationFinished,
    AuthenticationNotRequired,
    Success,
    /// A code this version does not know: read as "not known yet".
    #[serde(other)]
    Other,
}

/// `PaymentResponse.action`: what the shopper must do (`redirect` carries the URL).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Action {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method_type: Option<String>,
}

/// The answer to `POST /payments` (`PaymentResponse`; every field optional).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentResponse {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psp_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_code: Option<ResultCode>,
    /// What was authorised (less than asked when `PartiallyAuthorised`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal_reason_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_data: BTreeMap<String, String>,
}

/// The body of a capture, refund or cancel of one payment (`PaymentCaptureRequest`,
/// `PaymentRefundRequest`, `PaymentCancelRequest`), and of a cancel by our reference
/// (`StandalonePaymentCancelRequest`: `paymentReference`, no amount).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModificationRequest {
    pub merchant_account: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    /// Ours for this modification (its PSP key), echoed as the `merchantReference` of its
    /// notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The `reference` of the payment to cancel (cancel by reference only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_reference: Option<String>,
}

/// The answer to a modification: always `status: "received"`, the outcome comes by
/// notification. `paymentPspReference` names the payment (absent for a cancel by reference,
/// which echoes `paymentReference`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModificationResponse {
    pub merchant_account: String,
    /// The modification's own reference at Adyen.
    pub psp_reference: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_psp_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_reference: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// A refund's reason, as its request said it (`FRAUD`, `CUSTOMER REQUEST`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merchant_refund_reason: Option<String>,
}

/// An error answer: Checkout's `ServiceError` (`errorCode`, `message`), or the RFC 7807 shape of
/// newer APIs (`title`, `detail`); both are read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub psp_reference: Option<String>,
    #[serde(default, skip_serializing)]
    pub title: Option<String>,
    #[serde(default, skip_serializing)]
    pub detail: Option<String>,
}

impl ServiceError {
    pub fn text(&self) -> Option<&str> {
        self.message
            .as_deref()
            .or(self.detail.as_deref())
            .or(self.title.as_deref())
    }
}

/// A batch of standard notifications (`NotificationRequest`). `live` is the string `"true"` or
/// `"false"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotificationRequest {
    pub live: String,
    pub notification_items: Vec<NotificationItemWrapper>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotificationItemWrapper {
    #[serde(rename = "NotificationRequestItem")]
    pub item: NotificationItem,
}

/// One notification (`NotificationRequestItem`). Every value is a string, booleans included
/// (`success` is `"true"` or `"false"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotificationItem {
    /// Adyen's reference of what the item is about: the payment (AUTHORISATION), the
    /// modification (CAPTURE, REFUND…), the dispute, or the report's file name.
    pub psp_reference: String,
    /// The payment a modification or dispute belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_reference: Option<String>,
    pub merchant_account_code: String,
    /// Ours: the payment's `reference`, or the modification's.
    pub merchant_reference: String,
    pub amount: Amount,
    pub event_code: String,
    pub success: String,
    pub event_date: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payment_method: Option<String>,
    /// A refusal's reason; for REPORT_AVAILABLE, the report's download URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_data: BTreeMap<String, String>,
}

impl NotificationItem {
    pub fn succeeded(&self) -> bool {
        self.success == "true"
    }

    /// What identifies this item among every notification of the account, for deduplication:
    /// a repeated delivery carries the same four values (docs/adyen-wire.md §4).
    pub fn dedup_id(&self) -> String {
        format!(
            "{}:{}:{}",
            self.psp_reference, self.event_code, self.success
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn booleans_are_strings_and_unknown_fields_and_codes_are_tolerated() {
        let item: NotificationItem = serde_json::from_str(include_str!(
            "../../tests/fixtures/adyen/colon_notification.json"
        ))
        .unwrap();
        assert!(item.succeeded());
        assert_eq!(item.event_code, "AUTHORISATION");
        assert_eq!(item.amount.value, 1000);
        assert_eq!(item.dedup_id(), "M8NB66SBZSGLNK82:AUTHORISATION:true");
        let answer: PaymentResponse =
            serde_json::from_str(r#"{"resultCode":"SomethingNew","pspReference":"X","new":1}"#)
                .unwrap();
        assert_eq!(answer.result_code, Some(ResultCode::Other));
        let error: ServiceError =
            serde_json::from_str(r#"{"type":"x","title":"Too many requests","status":429}"#)
                .unwrap();
        assert_eq!(error.text(), Some("Too many requests"));
    }
}
