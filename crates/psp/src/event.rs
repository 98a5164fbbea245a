//! The webhook event a provider sends when a charge changes, as API.md
//! fixes it: `{"id": "evt_…", "type": "charge.succeeded", "created": <unix
//! seconds>, "data": {"charge": {…}}}`, plus `data.operation` when the
//! event is about an operation (`operation.updated`). The simulator sends it
//! and the ledger's webhook endpoint reads it with the same type.

use serde::{Deserialize, Serialize};

use crate::provider::{Charge, Dispute, Operation, ProviderError};

/// What happened to the charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    #[serde(rename = "charge.succeeded")]
    ChargeSucceeded,
    #[serde(rename = "charge.authorized")]
    ChargeAuthorized,
    #[serde(rename = "charge.captured")]
    ChargeCaptured,
    #[serde(rename = "charge.failed")]
    ChargeFailed,
    /// `data.charge.amount_refunded` is cumulative, so a late or repeated
    /// event never undoes a later one.
    #[serde(rename = "charge.refunded")]
    ChargeRefunded,
    #[serde(rename = "charge.dispute.created")]
    ChargeDisputeCreated,
    #[serde(rename = "charge.dispute.closed")]
    ChargeDisputeClosed,
    /// An operation's status changed after its first answer: an
    /// asynchronous capture or refund was decided, or a refund failed after
    /// succeeding. `data.operation` is the operation as it now stands and
    /// `data.charge` the charge after the change.
    #[serde(rename = "operation.updated")]
    OperationUpdated,
    /// A type this version does not know. A provider adds event types
    /// without asking; the receiver acknowledges and ignores them.
    #[serde(other, rename = "unknown")]
    Unknown,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::ChargeSucceeded => "charge.succeeded",
            EventType::ChargeAuthorized => "charge.authorized",
            EventType::ChargeCaptured => "charge.captured",
            EventType::ChargeFailed => "charge.failed",
            EventType::ChargeRefunded => "charge.refunded",
            EventType::ChargeDisputeCreated => "charge.dispute.created",
            EventType::ChargeDisputeClosed => "charge.dispute.closed",
            EventType::OperationUpdated => "operation.updated",
            EventType::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventData {
    /// The charge as it stood right after the change. The simulator's and Stripe's events
    /// always carry it; an asynchronous provider's notice of one operation or one dispute
    /// (Adyen's) names only that, and then `reference` names the payment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<Charge>,
    /// The operation the event is about (`operation.updated`); absent on
    /// charge events, so their bodies stay as API.md shows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<Operation>,
    /// The dispute the event is about, when the event carries no charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispute: Option<ChargeDispute>,
    /// The end of a charge's authorization the event is about, when the event carries no
    /// charge (Adyen's EXPIRE, CANCELLATION, TECHNICAL_CANCEL say only that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_end: Option<AuthorizationEnd>,
    /// Our payment id, when no charge in the event carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl EventData {
    /// The event's charge and nothing else, as the simulator's and Stripe's events are.
    pub fn of_charge(charge: Charge, operation: Option<Operation>) -> EventData {
        EventData {
            charge: Some(charge),
            operation,
            dispute: None,
            authorization_end: None,
            reference: None,
        }
    }

    /// Our payment id, as the charge or the event names it.
    pub fn payment_ref(&self) -> Option<&str> {
        self.charge
            .as_ref()
            .and_then(|charge| charge.reference.as_deref())
            .or(self.reference.as_deref())
    }
}

/// A dispute of one charge, by the provider's id of the charge. A notice that does not name the
/// charge (Adyen's CHARGEBACK_REVERSED and SECOND_CHARGEBACK, as its examples show them, carry
/// no `originalReference`) is about the charge of the payment the event names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChargeDispute {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charge: Option<String>,
    pub dispute: Dispute,
}

/// The provider ended what was left of a charge's authorization (it expired, or a cancel took
/// it): nothing more can be captured, and what a capture took stays captured. Unlike a failed
/// charge, it says nothing of a capture made before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorizationEnd {
    pub charge: String,
    /// Why: `expired`, `canceled`.
    pub reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebhookEvent {
    /// Unique per event (`evt_…`); a duplicate delivery carries the same id.
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// Unix seconds.
    pub created: i64,
    pub data: EventData,
}

/// Reads a body of the simulator's protocol: the event itself.
pub fn read(body: &[u8]) -> Result<WebhookEvent, ProviderError> {
    serde_json::from_slice(body).map_err(|error| ProviderError::Protocol {
        reason: format!("the body is not a webhook event: {error}"),
    })
}

/// How a provider writes its webhook bodies, for what the receiver reads before storing one:
/// the event's id, its type, and the payment it names when the body says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventFormat {
    /// The simulator's protocol: [`WebhookEvent`].
    #[default]
    Sim,
    /// Stripe's event object; its `data.object` carries our payment id in its metadata when it
    /// is a PaymentIntent or a charge.
    Stripe,
    /// Adyen's standard notifications: a batch of items under basic auth, each signed on its
    /// own and stored as its own event (`crate::adyen::notifications`), never read here.
    Adyen,
}

/// What the receiver stores beside a verified body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    pub id: String,
    pub kind: String,
    pub payment_ref: Option<String>,
}

impl EventFormat {
    pub fn envelope(self, body: &[u8]) -> Result<Envelope, String> {
        match self {
            EventFormat::Sim => {
                let event = read(body).map_err(|error| error.to_string())?;
                Ok(Envelope {
                    id: event.id,
                    kind: event.kind.as_str().to_owned(),
                    payment_ref: event.data.payment_ref().map(str::to_owned),
                })
            }
            EventFormat::Stripe => {
                let event: crate::stripe::wire::Event =
                    serde_json::from_slice(body).map_err(|error| error.to_string())?;
                let payment_ref = event.data.object["metadata"]
                    [crate::stripe::reading::METADATA_PAYMENT_ID]
                    .as_str()
                    .map(str::to_owned);
                Ok(Envelope {
                    id: event.id,
                    kind: event.kind,
                    payment_ref,
                })
            }
            EventFormat::Adyen => Err(
                "an Adyen delivery is a batch of items, each stored as its own event".to_owned(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_use_the_dotted_names_of_api_md() {
        for kind in [
            EventType::ChargeSucceeded,
            EventType::ChargeAuthorized,
            EventType::ChargeCaptured,
            EventType::ChargeFailed,
            EventType::ChargeRefunded,
            EventType::ChargeDisputeCreated,
            EventType::ChargeDisputeClosed,
            EventType::OperationUpdated,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(serde_json::from_str::<EventType>(&json).unwrap(), kind);
        }
        let unknown: EventType = serde_json::from_str("\"charge.expired\"").unwrap();
        assert_eq!(unknown, EventType::Unknown);
    }
}
