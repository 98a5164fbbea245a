//! Replays of stored answers, and the one rule that overrides byte-for-byte replay: a
//! `next_action` (a redirect URL that lets whoever holds it act on the payment) is handed out
//! only while its payment is `requires_action`. A replayed create whose payment has since moved on
//! (the redirect completed: captured, authorized, failed; or expired) answers the stored status
//! and body with `next_action` taken out and nothing else changed: the stored `status` stays what
//! the first answer said, because a replay answers what the request did, and the payment's current
//! state is what `GET /v1/payments/{id}` is for.
//!
//! Only a create's answer can carry a `next_action` (a capture or refund answers a payment past
//! `requires_action`, or a rejection), so the payment flow applies this to create replays alone.

use asiento_domain::PaymentStatus;

use crate::log;
use crate::payments::{FlowError, PaymentFlow};
use crate::reply::Answer;

impl PaymentFlow {
    /// `answer` as it may be sent: a replay whose stored body carries a `next_action` loses it
    /// once the payment has left `requires_action`; every other answer passes unchanged. The
    /// payment's stream is read only for a replay that carries one (the rare case: a client
    /// retrying a create that needed a redirect), so a replay otherwise costs no read.
    pub(crate) async fn without_stale_next_action(
        &self,
        answer: Answer,
    ) -> Result<Answer, FlowError> {
        let Answer::Replayed(stored) = answer else {
            return Ok(answer);
        };
        let Some(found) = self.render.next_action_in(&stored) else {
            return Ok(Answer::Replayed(stored));
        };
        let loaded = log::load_payment(self.store.as_ref(), found.payment).await?;
        let still_requires_action = loaded
            .aggregate
            .record
            .as_ref()
            .is_some_and(|record| record.status == PaymentStatus::RequiresAction);
        Ok(Answer::Replayed(if still_requires_action {
            stored
        } else {
            found.without
        }))
    }
}
