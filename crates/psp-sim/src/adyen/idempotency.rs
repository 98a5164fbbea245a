//! Adyen's idempotency layer (docs/adyen-wire.md §2): the first answer under an `Idempotency-Key` is
//! stored and replayed byte for byte, a refusal made after the request began included; a key
//! whose first request still runs answers 422 `704` with `transient-error: true` (the
//! simulator's `provider_call` says so while the answer is held); keys are kept for the
//! simulator's life, longer than Adyen's documented minimum.
//!
//! The same key with another body replays the first answer: Adyen documents no check of the
//! body, so the dialect makes none (the adapter must send the same bytes under a key). Unlike
//! Stripe's, the key space is one for every route: a key first used on `/payments` replays
//! that answer on `/captures` too. A request without a key is not idempotent.

use axum::http::HeaderMap;

use super::book::StoredAnswer;
use super::AdyenError;
use crate::state::{AnswerDelay, Reply, SimError, SimState, CHARGES_MAX};
use asiento_psp::client::IDEMPOTENCY_KEY_HEADER;

/// Adyen's limit on a key.
pub const IDEMPOTENCY_KEY_LEN_MAX: usize = 64;
/// Stored answers at most (the simulator keeps everything in memory).
pub const ANSWERS_MAX: usize = 4 * CHARGES_MAX;
/// The header every answer to a keyed request echoes the key in, as Adyen writes it.
pub const ECHO_HEADER: &str = "idempotency-key";

/// The key a request carried, to echo, whether or not it is usable.
pub(super) fn echoed_key(headers: &HeaderMap) -> Option<String> {
    headers
        .get(IDEMPOTENCY_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
}

/// The request's key: the header's when it is usable, else a fresh one that no request will
/// send again.
pub(super) fn request_key(headers: &HeaderMap) -> Result<String, AdyenError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY_HEADER) else {
        return Ok(format!("asiento_sim_{}", uuid::Uuid::new_v4().simple()));
    };
    let key = value.to_str().map_err(|_| {
        AdyenError::validation("702", "The Idempotency-Key must be printable ASCII.")
    })?;
    if key.is_empty() || key.len() > IDEMPOTENCY_KEY_LEN_MAX {
        return Err(AdyenError::validation(
            "702",
            format!("The Idempotency-Key must be 1 to {IDEMPOTENCY_KEY_LEN_MAX} characters."),
        ));
    }
    Ok(key.to_owned())
}

/// Replays the answer stored under `key`, or runs `op` and stores what it answered. A key in
/// use, or an error of the provider's own (5xx), is not stored: the same request may be sent
/// again.
pub(super) fn stored_write(
    state: &mut SimState,
    key: &str,
    op: impl FnOnce(&mut SimState) -> Result<Reply, AdyenError>,
) -> Result<Reply, AdyenError> {
    if let Some(stored) = state.adyen.answer(key) {
        return Ok(Reply {
            status: stored.status,
            body: stored.body.clone(),
            replayed: true,
            delay: AnswerDelay::None,
        });
    }
    if state.adyen.answers_len() >= ANSWERS_MAX {
        return Err(SimError::CapacityExhausted.into());
    }
    let reply = match op(state) {
        Ok(reply) => reply,
        Err(error) if error.transient || error.status.is_server_error() => return Err(error),
        Err(error) => Reply {
            status: error.status,
            body: error.body(),
            replayed: false,
            delay: AnswerDelay::None,
        },
    };
    state.adyen.store_answer(
        key,
        StoredAnswer {
            status: reply.status,
            body: reply.body.clone(),
        },
    );
    Ok(reply)
}
