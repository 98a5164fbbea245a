//! The simulated provider's idempotency: one key space for every write, as Stripe's. A key's
//! first request is stored with a fingerprint of its route, target and body; the same request
//! again is a replay, another one a reuse. A key whose request still holds its answer back is in
//! flight: a second request with it is refused at once where the dialect or a fault says so
//! (`SimState::conflicts_while_in_flight`), and otherwise served.

use axum::body::Bytes;
use axum::http::StatusCode;
use serde::Serialize;

use super::answers::{to_bytes, AnswerDelay, Reply, SimError, IDEMPOTENCY_KEY_LEN_MAX};
use super::SimState;
use asiento_psp::provider::OperationAnswer;

pub(super) enum IdempotencyRecord {
    /// A charge creation: a replay answers the charge as it stands now.
    Charge {
        fingerprint: String,
        charge_id: String,
    },
    /// A capture, refund or cancel: a replay answers the stored answer; a
    /// lookup by key finds the operation as it stands now.
    Answer {
        fingerprint: String,
        body: Bytes,
        operation_id: String,
    },
}

pub(super) fn fingerprint(route: &str, target: &str, body: &impl Serialize) -> String {
    format!(
        "{route} {target} {}",
        String::from_utf8_lossy(&to_bytes(body))
    )
}

pub(crate) fn check_idempotency_key(key: Option<&str>) -> Result<&str, SimError> {
    let key = key.ok_or(SimError::IdempotencyKeyMissing)?;
    let printable = key.bytes().all(|b| (0x20..=0x7e).contains(&b));
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_LEN_MAX || !printable {
        return Err(SimError::IdempotencyKeyInvalid);
    }
    Ok(key)
}

impl SimState {
    /// Whether a request with `key` is still running (its answer held).
    pub fn in_use(&self, key: &str) -> bool {
        self.in_flight.contains_key(key)
    }

    /// A request with `key` holds its answer back.
    pub fn enter(&mut self, key: &str) {
        *self.in_flight.entry(key.to_string()).or_insert(0) += 1;
    }

    /// A request with `key` has answered (or was abandoned).
    pub fn leave(&mut self, key: &str) {
        if let Some(n) = self.in_flight.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(key);
            }
        }
    }

    /// Replays a stored operation answer, refuses a reused key, or runs
    /// `op` and stores its answer under the key.
    pub(super) fn keyed_write(
        &mut self,
        key: &str,
        fingerprint: String,
        op: impl FnOnce(&mut SimState) -> Result<OperationAnswer, SimError>,
    ) -> Result<Reply, SimError> {
        if let Some(record) = self.keys.get(key) {
            return match record {
                IdempotencyRecord::Answer {
                    fingerprint: stored,
                    body,
                    ..
                } if *stored == fingerprint => Ok(Reply {
                    status: StatusCode::OK,
                    body: body.clone(),
                    replayed: true,
                    delay: AnswerDelay::None,
                }),
                _ => Err(SimError::IdempotencyKeyReused),
            };
        }
        // Refusals are not stored: the request changed nothing, and the
        // same key may succeed once the charge allows it.
        let answer = op(self)?;
        let body = to_bytes(&answer);
        self.keys.insert(
            key.to_string(),
            IdempotencyRecord::Answer {
                fingerprint,
                body: body.clone(),
                operation_id: answer.operation.id,
            },
        );
        Ok(Reply {
            status: StatusCode::OK,
            body,
            replayed: false,
            delay: AnswerDelay::None,
        })
    }
}
