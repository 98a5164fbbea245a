//! Which merchant event a log event is, decided from the object before and after it.
//!
//! Pure: the projection folds each touched stream through the domain's own `evolve` and asks
//! here, event by event, what a merchant is told. At most one merchant event per log event, so
//! the log event's id names it for good (a rebuild derives the same ids).

use asiento_domain::endpoint::EndpointEvent;
use asiento_domain::exception::{self, Exception, ExceptionEvent};
use asiento_domain::payment::PaymentEvent;
use asiento_domain::payment::PaymentWindow;
use asiento_domain::transfer::{self, Transfer, TransferEvent, TransferStatus};
use asiento_domain::{
    Event, OperationKind, OperationState, Payment, PaymentRecord, PaymentStatus, StreamKind,
};
use asiento_objects::{exception_json, operation_json, payment_listing, transfer_json};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::EventKind;

/// What a merchant event shows in place of a field it withholds (as the events view does).
pub const REDACTED: &str = "[redacted]";

/// A stream that can tell merchants something, folded so far. One lives per touched stream of
/// a batch, so the size difference between the variants costs nothing worth a box. A payment
/// keeps its recent operations only (`crate::archive` the rest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(clippy::large_enum_variant)]
pub(crate) enum Folded {
    Payment(PaymentWindow),
    Transfer(Transfer),
    Exception(Exception),
    /// A webhook endpoint's stream: its version is all there is to fold.
    Endpoint(u64),
}

impl Folded {
    /// The empty fold of a stream with merchant events of its own; None for the others (guards,
    /// payouts, monitors: `crate::monitors` reads those).
    pub fn of_stream(stream_id: &str) -> Option<Folded> {
        match StreamKind::parse(stream_id)? {
            StreamKind::Payment(_) => Some(Folded::Payment(PaymentWindow::default())),
            StreamKind::Transfer(_) => Some(Folded::Transfer(Transfer::default())),
            StreamKind::Exception(_) => Some(Folded::Exception(Exception::default())),
            StreamKind::WebhookEndpoint(_) => Some(Folded::Endpoint(0)),
            StreamKind::Guard { .. }
            | StreamKind::Payout { .. }
            | StreamKind::BalanceMonitor(_) => None,
        }
    }

    /// The stream version folded so far.
    pub fn version(&self) -> u64 {
        match self {
            Folded::Payment(w) => w.payment.version,
            Folded::Transfer(t) => t.version,
            Folded::Exception(e) => e.version,
            Folded::Endpoint(version) => *version,
        }
    }

    /// Folds the next event; an event of another family is a stored stream that is wrong.
    pub fn evolve(self, event: &Event) -> Result<Folded, &'static str> {
        match (self, event) {
            (Folded::Payment(w), Event::Payment(e)) => Ok(Folded::Payment(w.evolve(e))),
            (Folded::Transfer(t), Event::Transfer(e)) => {
                Ok(Folded::Transfer(transfer::evolve(t, e)))
            }
            (Folded::Exception(x), Event::Exception(e)) => {
                Ok(Folded::Exception(exception::evolve(x, e)))
            }
            (Folded::Endpoint(version), Event::WebhookEndpoint(_)) => {
                Ok(Folded::Endpoint(version + 1))
            }
            _ => Err("an event of another stream family"),
        }
    }
}

/// A merchant event before it is given its place in the feed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Derived {
    pub kind: EventKind,
    pub tenant: String,
    /// The object as the API renders it at this event.
    pub object: Value,
    /// The capture, refund or cancel the event is about, as the payment's `operations` lists it.
    pub operation: Option<Value>,
}

/// What `event` (at `position`), which took the stream from `before` to `after`, tells a
/// merchant; None for bookkeeping (requests, entries, fees, guard events) and for events that
/// changed nothing a merchant sees.
pub(crate) fn derive(
    before: &Folded,
    after: &Folded,
    event: &Event,
    position: i64,
) -> Option<Derived> {
    match (before, after, event) {
        (Folded::Payment(before), Folded::Payment(after), Event::Payment(event)) => {
            payment_event(before, after, event, position)
        }
        (Folded::Transfer(before), Folded::Transfer(after), Event::Transfer(event)) => {
            transfer_event(before, after, event, position)
        }
        (Folded::Exception(_), Folded::Exception(after), Event::Exception(event)) => {
            exception_event(after, event)
        }
        (_, Folded::Endpoint(_), Event::WebhookEndpoint(EndpointEvent::EndpointDisabled(e))) => {
            Some(Derived {
                kind: EventKind::WebhookEndpointDisabled,
                tenant: e.tenant.as_str().to_owned(),
                object: serde_json::json!({
                    "id": e.endpoint_id,
                    "object": "webhook_endpoint",
                    "url": e.url,
                    "status": "disabled",
                    "disabled_reason": e.reason,
                    "disabled_at": asiento_objects::time(&e.at),
                }),
                operation: None,
            })
        }
        _ => None,
    }
}

fn payment_event(
    before: &PaymentWindow,
    after: &PaymentWindow,
    event: &PaymentEvent,
    position: i64,
) -> Option<Derived> {
    let before = &before.payment;
    let record = after.payment.record.as_ref()?;
    let was = before.record.as_ref().map(|r| r.status);
    let became = |status: PaymentStatus| record.status == status && was != Some(status);
    let (kind, operation) = match event {
        PaymentEvent::PaymentIntended(_) => (EventKind::PaymentCreated, None),
        PaymentEvent::ActionRequired(_) if became(PaymentStatus::RequiresAction) => {
            (EventKind::PaymentRequiresAction, None)
        }
        PaymentEvent::ChargeAuthorized(_) if became(PaymentStatus::Authorized) => {
            (EventKind::PaymentAuthorized, None)
        }
        PaymentEvent::ChargeCaptured(_)
            if before.record.as_ref().map(|r| r.captured) != Some(record.captured) =>
        {
            (EventKind::PaymentCaptured, None)
        }
        PaymentEvent::ChargeFailed(_) | PaymentEvent::CaptureReversed(_)
            if became(PaymentStatus::Failed) =>
        {
            (EventKind::PaymentFailed, None)
        }
        PaymentEvent::PaymentExpired(_) if became(PaymentStatus::Expired) => {
            (EventKind::PaymentExpired, None)
        }
        PaymentEvent::PaymentCanceled(_) if became(PaymentStatus::Canceled) => {
            let cancel = record.operations_of(OperationKind::Cancel);
            (
                EventKind::PaymentCanceled,
                Some((OperationKind::Cancel, cancel)),
            )
        }
        PaymentEvent::RefundSettled(e) => (
            EventKind::PaymentRefunded,
            e.sequence
                .or_else(|| settled_refund(before, record))
                .map(|s| (OperationKind::Refund, s)),
        ),
        PaymentEvent::OperationRefused(e) => match e.kind {
            OperationKind::Capture => (
                EventKind::PaymentCaptureFailed,
                Some((OperationKind::Capture, e.sequence)),
            ),
            OperationKind::Refund => (
                EventKind::PaymentRefundFailed,
                Some((OperationKind::Refund, e.sequence)),
            ),
            OperationKind::Cancel => (
                EventKind::PaymentCancelFailed,
                Some((OperationKind::Cancel, e.sequence)),
            ),
        },
        PaymentEvent::RefundReversed(e) => (
            EventKind::PaymentRefundFailed,
            Some((OperationKind::Refund, e.sequence)),
        ),
        PaymentEvent::DisputeOpened(_) => (EventKind::PaymentDisputed, None),
        PaymentEvent::DisputeClosed(_) => (EventKind::PaymentDisputeClosed, None),
        _ => return None,
    };
    // The latest operations only (a payment may have thousands), and how many there are.
    let mut object = payment_listing(record, position, after.recent());
    object["operations_total"] = Value::from(after.total());
    // History never hands out what lets someone act on the payment (the events view withholds
    // it too): the redirect is the payment object's while it requires action, not the feed's.
    if let Some(url) = object
        .get_mut("next_action")
        .and_then(|action| action.get_mut("redirect_url"))
        .filter(|url| !url.is_null())
    {
        *url = Value::String(REDACTED.to_owned());
    }
    let operation = operation
        .and_then(|(kind, sequence)| record.operation(kind, sequence))
        .map(operation_json);
    Some(Derived {
        kind,
        tenant: record.tenant.as_str().to_owned(),
        object,
        operation,
    })
}

/// The refund a settlement named by no sequence settled (a cumulative total read from the
/// provider): the one that became succeeded.
fn settled_refund(before: &Payment, after: &PaymentRecord) -> Option<u32> {
    let was_succeeded = |sequence: u32| {
        before.record.as_ref().is_some_and(|r| {
            r.operation(OperationKind::Refund, sequence)
                .is_some_and(|op| op.state == OperationState::Succeeded)
        })
    };
    after
        .operations
        .iter()
        .find(|op| {
            op.kind == OperationKind::Refund
                && op.state == OperationState::Succeeded
                && !was_succeeded(op.sequence)
        })
        .map(|op| op.sequence)
}

/// A transfer's event is told once its entry is written (a hold's ending writes one too), so
/// that the object names the entry.
fn transfer_event(
    before: &Transfer,
    after: &Transfer,
    event: &TransferEvent,
    position: i64,
) -> Option<Derived> {
    let TransferEvent::EntryPosted(_) = event else {
        return None;
    };
    let record = after.record.as_ref()?;
    let ended_before = before
        .record
        .as_ref()
        .and_then(|r| r.settled.as_ref())
        .and_then(|s| s.entry_id)
        .is_some();
    let kind = match (record.settled.as_ref(), record.status()) {
        (None, TransferStatus::Pending) => EventKind::TransferPending,
        (None, _) => EventKind::TransferPosted,
        (Some(_), _) if ended_before => return None,
        (Some(_), TransferStatus::Posted) => EventKind::TransferPosted,
        (Some(_), TransferStatus::Voided) => EventKind::TransferVoided,
        (Some(_), TransferStatus::Expired) => EventKind::TransferExpired,
        (Some(_), TransferStatus::Pending) => return None,
    };
    Some(Derived {
        kind,
        tenant: record.requested.tenant.as_str().to_owned(),
        object: transfer_json(record, position),
        operation: None,
    })
}

/// Exceptions of the platform's scope (naming no payment of ours) belong to no tenant and are
/// not told.
fn exception_event(after: &Exception, event: &ExceptionEvent) -> Option<Derived> {
    let record = after.record.as_ref()?;
    let tenant = record.recorded.tenant.as_ref()?;
    let kind = match event {
        ExceptionEvent::ExceptionRecorded(_) => EventKind::ExceptionOpened,
        ExceptionEvent::ExceptionResolved(_) => EventKind::ExceptionResolved,
    };
    Some(Derived {
        kind,
        tenant: tenant.as_str().to_owned(),
        object: exception_json(record),
        operation: None,
    })
}
