//! What a payment can be found by: the terms each event of its stream contributes, and the
//! derivation of the index's rows from events, shared by the projection's `apply` (per batch)
//! and `verify` (over the whole log). Pure: no IO.
//!
//! The rows of a payment are a set: every event adds terms, none takes one away, so the rows
//! do not depend on the order the events arrive in, and an event applied twice adds nothing.

use std::collections::{BTreeMap, BTreeSet};

use asiento_domain::{PaymentEvent, StreamKind};
use asiento_eventstore::{Metadata, RecordedEvent};
use asiento_projector::ProjectionError;
use serde_json::Value;

/// The longest term kept, in characters; a longer value is not indexed (and never found).
pub const TERM_CHARS_MAX: usize = 255;

/// Which id or value of a payment a term is. The order is the order of preference when one
/// term names a payment in several ways: [`crate::find`] reports the first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// The payment's own id, `pay_…`.
    PaymentId,
    /// The client's Idempotency-Key of a request that wrote to the payment (its create,
    /// captures and refunds): any event's metadata.
    IdempotencyKey,
    /// A key we sent the provider: the charge's (`psp_…`), a capture's or a refund's.
    PspKey,
    /// The provider's id of the charge (Stripe's PaymentIntent `pi_…`, Adyen's pspReference).
    ChargeId,
    /// The provider's id of a capture or refund (Stripe's `re_…`, Adyen's modification
    /// pspReference).
    OperationId,
    /// The provider's id of a dispute.
    DisputeId,
    /// The provider's id of the request that answered an operation (Stripe's `Request-Id`).
    RequestId,
    /// The provider's balance transaction a fee was kept on (`txn_…`).
    TransactionId,
    /// A journal entry the payment posted (`je_…`).
    EntryId,
    /// A string (or integer) value of the payment's metadata: the merchant's references.
    Metadata,
    /// The payment's description.
    Description,
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::PaymentId,
        Kind::IdempotencyKey,
        Kind::PspKey,
        Kind::ChargeId,
        Kind::OperationId,
        Kind::DisputeId,
        Kind::RequestId,
        Kind::TransactionId,
        Kind::EntryId,
        Kind::Metadata,
        Kind::Description,
    ];

    /// The stored and reported name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::PaymentId => "payment_id",
            Kind::IdempotencyKey => "idempotency_key",
            Kind::PspKey => "psp_key",
            Kind::ChargeId => "charge_id",
            Kind::OperationId => "operation_id",
            Kind::DisputeId => "dispute_id",
            Kind::RequestId => "request_id",
            Kind::TransactionId => "transaction_id",
            Kind::EntryId => "entry_id",
            Kind::Metadata => "metadata",
            Kind::Description => "description",
        }
    }

    #[must_use]
    pub fn parse(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

/// A term as stored and looked up: trimmed, not empty, at most [`TERM_CHARS_MAX`] characters.
/// None: the value is never indexed.
#[must_use]
pub fn normalize(value: &str) -> Option<&str> {
    let trimmed = value.trim();
    let fits = !trimmed.is_empty() && trimmed.chars().count() <= TERM_CHARS_MAX;
    fits.then_some(trimmed)
}

/// One term of a payment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Term {
    pub term: String,
    pub kind: Kind,
}

/// The terms one event of a payment's stream contributes (the payment's own id comes with its
/// `PaymentIntended`).
pub(crate) fn terms(event: &PaymentEvent, metadata: &Metadata) -> BTreeSet<Term> {
    let mut found: Vec<(Kind, String)> = Vec::new();
    let mut add = |kind: Kind, value: &str| found.push((kind, value.to_owned()));
    if let Some(key) = &metadata.idempotency_key {
        add(Kind::IdempotencyKey, key);
    }
    match event {
        PaymentEvent::PaymentIntended(e) => {
            add(Kind::PaymentId, &e.payment_id.to_string());
            add(Kind::PspKey, &e.psp_key);
            if let Some(description) = &e.description {
                add(Kind::Description, description);
            }
            for value in e.metadata.values() {
                match value {
                    Value::String(text) => add(Kind::Metadata, text),
                    // An order number sent as a JSON integer is searched for as its digits.
                    Value::Number(n) if n.is_i64() || n.is_u64() => {
                        add(Kind::Metadata, &n.to_string());
                    }
                    _ => {}
                }
            }
        }
        PaymentEvent::ChargeRequested(e) => add(Kind::PspKey, &e.psp_key),
        PaymentEvent::ActionRequired(e) => add(Kind::ChargeId, &e.charge_id),
        PaymentEvent::ChargeAuthorized(e) => add(Kind::ChargeId, &e.charge_id),
        PaymentEvent::CaptureRequested(e) => add(Kind::PspKey, &e.psp_key),
        PaymentEvent::ChargeCaptured(e) => add(Kind::ChargeId, &e.charge_id),
        PaymentEvent::ChargeFailed(e) => {
            if let Some(charge_id) = &e.charge_id {
                add(Kind::ChargeId, charge_id);
            }
        }
        PaymentEvent::AuthorizationEnded(e) => add(Kind::ChargeId, &e.charge_id),
        PaymentEvent::RefundRequested(e) => add(Kind::PspKey, &e.psp_key),
        PaymentEvent::CancelRequested(e) => add(Kind::PspKey, &e.psp_key),
        PaymentEvent::CancelSucceeded(e) => {
            if let Some(provider_id) = &e.provider_id {
                add(Kind::OperationId, provider_id);
            }
        }
        PaymentEvent::RefundSettled(e) => {
            add(Kind::ChargeId, &e.charge_id);
            if let Some(refund_id) = &e.refund_id {
                add(Kind::OperationId, refund_id);
            }
        }
        PaymentEvent::OperationReceived(e) => {
            if let Some(provider_id) = &e.provider_id {
                add(Kind::OperationId, provider_id);
            }
        }
        PaymentEvent::OperationAnswered(e) => add(Kind::RequestId, &e.request_id),
        PaymentEvent::OperationIdentified(e) => add(Kind::OperationId, &e.provider_id),
        PaymentEvent::DisputeOpened(e) => add(Kind::DisputeId, &e.dispute_id),
        PaymentEvent::DisputeClosed(e) => add(Kind::DisputeId, &e.dispute_id),
        PaymentEvent::ProviderFeeCharged(e) => add(Kind::TransactionId, &e.transaction_id),
        PaymentEvent::EntryPosted(e) => add(Kind::EntryId, &e.entry.id().to_string()),
        PaymentEvent::PaymentExpired(_)
        | PaymentEvent::PaymentCanceled(_)
        | PaymentEvent::OperationRefused(_)
        | PaymentEvent::RefundReversed(_)
        | PaymentEvent::CaptureReversed(_)
        | PaymentEvent::FlaggedForReview(_) => {}
    }
    found
        .into_iter()
        .filter_map(|(kind, value)| {
            normalize(&value).map(|term| Term {
                term: term.to_owned(),
                kind,
            })
        })
        .collect()
}

/// Whose a payment is, from its `PaymentIntended`: the tenant every row is scoped to, and the
/// creation time results are ordered by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    pub tenant: String,
    pub created_ms: i64,
}

/// The payment id of a payment stream's event; None for every other stream.
pub(crate) fn payment_stream(event: &RecordedEvent) -> Option<String> {
    match StreamKind::parse(&event.stream_id) {
        Some(StreamKind::Payment(id)) => Some(id.to_string()),
        _ => None,
    }
}

/// The terms and owners a run of events gives, per payment.
#[derive(Debug, Default)]
pub(crate) struct Derived {
    /// Payments whose `PaymentIntended` was among the events.
    pub owners: BTreeMap<String, Owner>,
    pub terms: BTreeMap<String, BTreeSet<Term>>,
}

impl Derived {
    /// Adds one event of the log (events of other streams add nothing).
    pub fn push(&mut self, event: &RecordedEvent) -> Result<(), ProjectionError> {
        let Some(payment_id) = payment_stream(event) else {
            return Ok(());
        };
        let decoded = PaymentEvent::decode_raw(&event.event_type, event.schema, event.data.raw())
            .map_err(|e| ProjectionError::Malformed {
            position: event.position,
            reason: e.to_string(),
        })?;
        if let PaymentEvent::PaymentIntended(intent) = &decoded {
            if intent.payment_id.to_string() != payment_id {
                return Err(ProjectionError::Malformed {
                    position: event.position,
                    reason: format!(
                        "PaymentIntended of {} in the stream of {payment_id}",
                        intent.payment_id
                    ),
                });
            }
            self.owners.insert(
                payment_id.clone(),
                Owner {
                    tenant: intent.tenant.as_str().to_owned(),
                    created_ms: intent.at.timestamp_millis(),
                },
            );
        }
        self.terms
            .entry(payment_id)
            .or_default()
            .extend(terms(&decoded, &event.metadata));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_trimmed_and_bounded() {
        assert_eq!(normalize("  pi_123 \n"), Some("pi_123"));
        assert_eq!(normalize("   "), None);
        assert_eq!(normalize(""), None);
        let longest = "é".repeat(TERM_CHARS_MAX);
        assert_eq!(normalize(&longest), Some(longest.as_str()));
        assert_eq!(normalize(&format!("{longest}x")), None);
    }

    #[test]
    fn kinds_round_trip_by_name() {
        for kind in Kind::ALL {
            assert_eq!(Kind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(Kind::parse("provider"), None);
    }
}
