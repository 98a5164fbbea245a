//! The client's side of a request: what it asks (`Work`), under which idempotency key and body,
//! and what it learnt (the first answer that did the work, the payment a create named). Stored
//! responses render as small JSON bodies (`SimRender`) so that the simulation can read back which
//! payment a key named and compare a replay with the first answer byte for byte.

use asiento_app::idempotency::StoredResponse;
use asiento_app::ledger::NewTransfer;
use asiento_app::payments::{Idempotent, NewPayment};
use asiento_app::reply::{Answer, Render, Reply};
use asiento_domain::{Amount, PaymentId, PaymentStatus, TenantId};
use serde_json::json;

use super::knobs::TENANT;

/// Stored responses as JSON the simulation can read back: the payment id names what a key did.
pub struct SimRender;

impl Render for SimRender {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse {
        let (status, body) = match reply {
            Reply::Payment {
                payment, position, ..
            } => (
                if payment.status == PaymentStatus::Pending {
                    202
                } else {
                    201
                },
                json!({
                    "id": payment.id.to_string(),
                    "status": payment.status.as_str(),
                    "captured": payment.captured.minor(),
                    "refunded": payment.refunded.minor(),
                    "position": position,
                }),
            ),
            Reply::Transfer {
                transfer, position, ..
            } => (
                201,
                json!({"entry": transfer.entry_id.map(|id| id.to_string()), "position": position}),
            ),
            Reply::TransferBatch { position, .. }
            | Reply::Account { position, .. }
            | Reply::Monitor { position, .. } => (201, json!({"position": position})),
            Reply::Rejected(rejected) => (422, json!({"rejected": format!("{rejected:?}")})),
        };
        StoredResponse {
            status,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Work {
    Create(NewPayment),
    Capture {
        payment: PaymentId,
        amount: Option<Amount>,
    },
    Refund {
        payment: PaymentId,
        amount: Amount,
    },
    Transfer(NewTransfer),
}

/// One client request and what the client learnt from it.
pub struct Request {
    pub work: Work,
    pub idem: Idempotent,
    /// The first answer that did the work (or its stored rejection).
    pub answered: Option<StoredResponse>,
    /// For a create: the payment its 2xx named.
    pub payment: Option<PaymentId>,
}

impl Request {
    pub fn settled(&self) -> bool {
        self.answered.is_some()
    }
}

/// How one attempt ended.
pub enum Outcome {
    Answer(Answer),
    Crashed,
}

pub fn tenant() -> TenantId {
    TenantId::parse(TENANT).unwrap()
}

pub fn describe_answer(answer: &Answer) -> String {
    match answer {
        Answer::Done(response) => format!(
            "done {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        ),
        Answer::Replayed(response) => format!(
            "replayed {} {}",
            response.status,
            String::from_utf8_lossy(&response.body)
        ),
        Answer::InProgress { retry_after_s } => {
            format!("in progress (retry after {retry_after_s}s)")
        }
        Answer::KeyReused => "key reused".into(),
    }
}
