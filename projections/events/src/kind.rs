//! The merchant event types: their stable names, which clients filter and subscribe by.

use std::fmt;

/// What happened, as a merchant reads it. The names are part of the API (docs/API.md): never
/// renamed, only added to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    PaymentCreated,
    PaymentRequiresAction,
    PaymentAuthorized,
    PaymentCaptured,
    PaymentCaptureFailed,
    PaymentFailed,
    PaymentExpired,
    PaymentCanceled,
    PaymentCancelFailed,
    PaymentRefunded,
    PaymentRefundFailed,
    PaymentDisputed,
    PaymentDisputeClosed,
    TransferPosted,
    TransferPending,
    TransferVoided,
    TransferExpired,
    ExceptionOpened,
    ExceptionResolved,
    WebhookEndpointDisabled,
    BalanceThresholdCrossed,
}

impl EventKind {
    pub const ALL: [EventKind; 21] = [
        EventKind::PaymentCreated,
        EventKind::PaymentRequiresAction,
        EventKind::PaymentAuthorized,
        EventKind::PaymentCaptured,
        EventKind::PaymentCaptureFailed,
        EventKind::PaymentFailed,
        EventKind::PaymentExpired,
        EventKind::PaymentCanceled,
        EventKind::PaymentCancelFailed,
        EventKind::PaymentRefunded,
        EventKind::PaymentRefundFailed,
        EventKind::PaymentDisputed,
        EventKind::PaymentDisputeClosed,
        EventKind::TransferPosted,
        EventKind::TransferPending,
        EventKind::TransferVoided,
        EventKind::TransferExpired,
        EventKind::ExceptionOpened,
        EventKind::ExceptionResolved,
        EventKind::WebhookEndpointDisabled,
        EventKind::BalanceThresholdCrossed,
    ];

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::PaymentCreated => "payment.created",
            EventKind::PaymentRequiresAction => "payment.requires_action",
            EventKind::PaymentAuthorized => "payment.authorized",
            EventKind::PaymentCaptured => "payment.captured",
            EventKind::PaymentCaptureFailed => "payment.capture_failed",
            EventKind::PaymentFailed => "payment.failed",
            EventKind::PaymentExpired => "payment.expired",
            EventKind::PaymentCanceled => "payment.canceled",
            EventKind::PaymentCancelFailed => "payment.cancel_failed",
            EventKind::PaymentRefunded => "payment.refunded",
            EventKind::PaymentRefundFailed => "payment.refund_failed",
            EventKind::PaymentDisputed => "payment.disputed",
            EventKind::PaymentDisputeClosed => "payment.dispute_closed",
            EventKind::TransferPosted => "transfer.posted",
            EventKind::TransferPending => "transfer.pending",
            EventKind::TransferVoided => "transfer.voided",
            EventKind::TransferExpired => "transfer.expired",
            EventKind::ExceptionOpened => "exception.opened",
            EventKind::ExceptionResolved => "exception.resolved",
            EventKind::WebhookEndpointDisabled => "webhook_endpoint.disabled",
            EventKind::BalanceThresholdCrossed => "balance.threshold_crossed",
        }
    }

    /// The type of a name, or None for a name no event has.
    #[must_use]
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL
            .into_iter()
            .find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_its_kind_and_no_two_share_one() {
        let mut names: Vec<&str> = EventKind::ALL.iter().map(|k| k.as_str()).collect();
        for kind in EventKind::ALL {
            assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), EventKind::ALL.len());
        assert_eq!(EventKind::parse("payment.teleported"), None);
    }
}
