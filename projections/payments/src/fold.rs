//! Folding a payment stream into a row, through the domain's own decoder and `evolve`.
//!
//! Pure (no IO), so the projection's `apply` and the checker `verify` share exactly one
//! definition of what a row must be: the fold of the stream's contiguous prefix of versions.

use asiento_domain::payment::evolve_without_operations;
use asiento_domain::{Payment, PaymentEvent, StreamKind};
use asiento_eventstore::RecordedEvent;
use asiento_projector::ProjectionError;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use asiento_projector::history::{Kept, StreamFold};

use crate::PaymentRow;

/// The payment id of a payment stream's event; None for every other stream.
pub(crate) fn payment_stream(event: &RecordedEvent) -> Option<String> {
    match StreamKind::parse(&event.stream_id) {
        Some(StreamKind::Payment(id)) => Some(id.to_string()),
        _ => None,
    }
}

fn malformed(position: i64, reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position,
        reason: reason.into(),
    }
}

/// A payment folded event by event, in version order, through the domain's `evolve` without its
/// operations (the row shows none, and nothing else `evolve` gives reads them), so that what a
/// row stores (`state`), and the next batch folds its new events onto, does not grow with the
/// stream.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Folder {
    payment: Payment,
    /// The position of the last event folded in.
    position: i64,
}

impl StreamFold for Folder {
    fn version(&self) -> u64 {
        self.payment.version
    }

    fn push(&mut self, kept: &Kept) -> Result<(), ProjectionError> {
        let event = PaymentEvent::decode_raw(&kept.event_type, kept.schema, kept.data.get())
            .map_err(|e| malformed(kept.position, e.to_string()))?;
        // `evolve` asserts these in debug builds; here they are a stored stream that is wrong,
        // reported as a value so the projection stops at it instead of panicking.
        let intended = matches!(event, PaymentEvent::PaymentIntended(_));
        if intended == self.payment.record.is_some() {
            return Err(malformed(
                kept.position,
                "a payment stream must start with PaymentIntended, and only once",
            ));
        }
        if kept.version != self.payment.version + 1 {
            return Err(malformed(
                kept.position,
                format!(
                    "payment stream version {} follows version {}",
                    kept.version, self.payment.version
                ),
            ));
        }
        self.payment = evolve_without_operations(std::mem::take(&mut self.payment), &event);
        self.position = kept.position;
        Ok(())
    }
}

impl Folder {
    /// The row the events so far fold to; None before `PaymentIntended`.
    pub fn row(&self) -> Result<Option<PaymentRow>, ProjectionError> {
        let Some(record) = self.payment.record.as_ref() else {
            return Ok(None);
        };
        let fee = record
            .fee_net()
            .map_err(|e| malformed(self.position, format!("net fee: {e}")))?;
        Ok(Some(PaymentRow {
            id: record.id,
            tenant: record.tenant.as_str().to_owned(),
            status: record.status,
            amount_minor: record.amount.minor(),
            currency: record.currency.code().to_owned(),
            customer: record.customer.as_str().to_owned(),
            provider: record.provider.as_str().to_owned(),
            captured_minor: record.captured.minor(),
            refunded_minor: record.refunded.minor(),
            fee_minor: fee.minor(),
            description: record.description.clone(),
            metadata: record.metadata.clone(),
            created_at: record.created_at,
            updated_at: record.updated_at,
            next_action: record.next_action.clone(),
            version: self.payment.version,
            position: self.position,
        }))
    }
}

/// Unix nanoseconds, the stored form of a row's timestamps. Exact from 1677 to 2262.
pub(crate) fn to_ns(at: DateTime<Utc>) -> Option<i64> {
    at.timestamp_nanos_opt()
}

pub(crate) fn from_ns(ns: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_nanos(ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_that_does_not_start_with_payment_intended_is_malformed() {
        let result = Folder::default().push(&Kept {
            version: 1,
            position: 7,
            event_type: "ChargeRequested".into(),
            schema: 1,
            data: serde_json::value::to_raw_value(
                &serde_json::json!({"psp_key": "psp_x", "at": "2025-01-01T00:00:00Z"}),
            )
            .unwrap(),
        });
        assert!(matches!(
            result,
            Err(ProjectionError::Malformed { position: 7, .. })
        ));
        assert_eq!(Folder::default().row().ok(), Some(None));
    }

    #[test]
    fn nanosecond_bounds_clamp_outside_the_representable_range() {
        let far_past = DateTime::<Utc>::MIN_UTC;
        let far_future = DateTime::<Utc>::MAX_UTC;
        assert_eq!(asiento_projector::keyset::bound_ns(far_past), i64::MIN);
        assert_eq!(asiento_projector::keyset::bound_ns(far_future), i64::MAX);
        let now = from_ns(1_764_000_000_123_456_789);
        assert_eq!(to_ns(now), Some(1_764_000_000_123_456_789));
    }
}
