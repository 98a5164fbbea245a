//! The faults a real provider shows, switchable at run time through
//! `POST /sim/faults`, and the seeded draw that decides which one hits a
//! given request.

use serde::{Deserialize, Serialize};

/// Added latency and webhook delays are capped so a typo cannot hang a run.
pub const FAULT_DELAY_MS_MAX: u64 = 60_000;

/// The active fault set. Rates are probabilities in `[0, 1]`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// Share of provider calls answered 500. Half of them (seeded) fail
    /// before doing anything, half after the effect happened, as a real
    /// provider can do either.
    pub error_rate: f64,
    /// Share of provider calls that do their effect and then hang for
    /// `hang_ms` before answering, so the client times out.
    pub timeout_rate: f64,
    /// Added before every provider answer.
    pub latency_ms: u64,
    /// Share of webhook events sent twice (same id, same body).
    pub webhook_duplicate_rate: f64,
    /// Buffer a few events and send them shuffled.
    pub webhook_reorder: bool,
    /// Share of webhook events never sent.
    pub webhook_drop_rate: f64,
    /// Wait before the first delivery attempt of every event.
    pub webhook_delay_ms: u64,
    /// Setting it above 0 starts one period of that many ms, from now, in
    /// which the provider routes refuse service while every charge, key and
    /// operation is kept: standalone, the listener is closed (connections
    /// refused) and opened again on the same port; mounted, they answer 503
    /// `provider_unreachable` without acting. Reading it shows the length
    /// last set.
    #[serde(default)]
    pub unreachable_ms: u64,
    /// Captures and refunds answer `pending` ("received") and are decided
    /// `async_delay_ms` later, announced by an `operation.updated` webhook;
    /// the charge changes only then.
    #[serde(default)]
    pub async_modifications: bool,
    #[serde(default)]
    pub async_delay_ms: u64,
    /// Share of refunds that succeed and then, `refund_reversal_delay_ms`
    /// after succeeding, fail (`expired_or_canceled_card`), announced by an
    /// `operation.updated` webhook; the charge's `amount_refunded` goes back
    /// down.
    #[serde(default)]
    pub refund_reversal_rate: f64,
    #[serde(default)]
    pub refund_reversal_delay_ms: u64,
    /// The lookups by idempotency key (`GET /v1/charges?idempotency_key=`,
    /// `GET /v1/operations?idempotency_key=`) answer a bare 404 without the
    /// `resource_missing` code, as a provider without those routes does.
    #[serde(default)]
    pub lookup_disabled: bool,
    /// A write whose key's first request is still running (its answer held
    /// by latency, slowness or a hang) answers 409 `idempotency_key_in_use`
    /// instead of waiting or replaying.
    #[serde(default)]
    pub key_in_use_conflict: bool,
    /// The Adyen dialect sends a dispute's CHARGEBACK_REVERSED and SECOND_CHARGEBACK as Adyen's
    /// own examples (`Webhooks-v1.json`) show them: without `originalReference`, the dispute
    /// named by its pspReference and the payment by `merchantReference`. Other dialects ignore
    /// it.
    #[serde(default)]
    pub dispute_items_as_adyen_examples: bool,
}

/// `POST /sim/faults`: the fields present replace the current ones, the
/// others stay.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    pub error_rate: Option<f64>,
    pub timeout_rate: Option<f64>,
    pub latency_ms: Option<u64>,
    pub webhook_duplicate_rate: Option<f64>,
    pub webhook_reorder: Option<bool>,
    pub webhook_drop_rate: Option<f64>,
    pub webhook_delay_ms: Option<u64>,
    pub unreachable_ms: Option<u64>,
    pub async_modifications: Option<bool>,
    pub async_delay_ms: Option<u64>,
    pub refund_reversal_rate: Option<f64>,
    pub refund_reversal_delay_ms: Option<u64>,
    pub lookup_disabled: Option<bool>,
    pub key_in_use_conflict: Option<bool>,
    pub dispute_items_as_adyen_examples: Option<bool>,
}

/// Why a fault set was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultsError {
    #[error("{field} must be a probability between 0 and 1, got {value}")]
    RateOutOfRange { field: &'static str, value: f64 },
    #[error("{field} must be at most {FAULT_DELAY_MS_MAX} ms, got {value}")]
    DelayTooLong { field: &'static str, value: u64 },
}

impl Faults {
    /// `self` with `patch` applied, or why the result would be invalid.
    pub fn patched(&self, patch: &FaultsPatch) -> Result<Faults, FaultsError> {
        let next = Faults {
            error_rate: patch.error_rate.unwrap_or(self.error_rate),
            timeout_rate: patch.timeout_rate.unwrap_or(self.timeout_rate),
            latency_ms: patch.latency_ms.unwrap_or(self.latency_ms),
            webhook_duplicate_rate: patch
                .webhook_duplicate_rate
                .unwrap_or(self.webhook_duplicate_rate),
            webhook_reorder: patch.webhook_reorder.unwrap_or(self.webhook_reorder),
            webhook_drop_rate: patch.webhook_drop_rate.unwrap_or(self.webhook_drop_rate),
            webhook_delay_ms: patch.webhook_delay_ms.unwrap_or(self.webhook_delay_ms),
            unreachable_ms: patch.unreachable_ms.unwrap_or(self.unreachable_ms),
            async_modifications: patch
                .async_modifications
                .unwrap_or(self.async_modifications),
            async_delay_ms: patch.async_delay_ms.unwrap_or(self.async_delay_ms),
            refund_reversal_rate: patch
                .refund_reversal_rate
                .unwrap_or(self.refund_reversal_rate),
            refund_reversal_delay_ms: patch
                .refund_reversal_delay_ms
                .unwrap_or(self.refund_reversal_delay_ms),
            lookup_disabled: patch.lookup_disabled.unwrap_or(self.lookup_disabled),
            key_in_use_conflict: patch
                .key_in_use_conflict
                .unwrap_or(self.key_in_use_conflict),
            dispute_items_as_adyen_examples: patch
                .dispute_items_as_adyen_examples
                .unwrap_or(self.dispute_items_as_adyen_examples),
        };
        next.validate()?;
        Ok(next)
    }

    fn validate(&self) -> Result<(), FaultsError> {
        for (field, value) in [
            ("error_rate", self.error_rate),
            ("timeout_rate", self.timeout_rate),
            ("webhook_duplicate_rate", self.webhook_duplicate_rate),
            ("webhook_drop_rate", self.webhook_drop_rate),
            ("refund_reversal_rate", self.refund_reversal_rate),
        ] {
            if !(0.0..=1.0).contains(&value) {
                return Err(FaultsError::RateOutOfRange { field, value });
            }
        }
        for (field, value) in [
            ("latency_ms", self.latency_ms),
            ("webhook_delay_ms", self.webhook_delay_ms),
            ("unreachable_ms", self.unreachable_ms),
            ("async_delay_ms", self.async_delay_ms),
            ("refund_reversal_delay_ms", self.refund_reversal_delay_ms),
        ] {
            if value > FAULT_DELAY_MS_MAX {
                return Err(FaultsError::DelayTooLong { field, value });
            }
        }
        Ok(())
    }
}

/// What happens to one provider call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallFault {
    None,
    /// 500 before any effect.
    ErrorBefore,
    /// The effect happens, then 500.
    ErrorAfter,
    /// The effect happens, then the answer hangs.
    Hang,
}

/// Decides a call's fault from three uniform draws in `[0, 1)`. Always
/// three draws per call, whatever the rates, so a run replays with the same
/// seed and the same request order even when faults are switched mid-run.
pub(crate) fn call_fault(faults: &Faults, error: f64, after: f64, timeout: f64) -> CallFault {
    if error < faults.error_rate {
        if after < 0.5 {
            CallFault::ErrorAfter
        } else {
            CallFault::ErrorBefore
        }
    } else if timeout < faults.timeout_rate {
        CallFault::Hang
    } else {
        CallFault::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_merges_and_validates() {
        let base = Faults {
            error_rate: 0.1,
            ..Faults::default()
        };
        let patched = base
            .patched(&FaultsPatch {
                latency_ms: Some(5),
                ..FaultsPatch::default()
            })
            .unwrap();
        assert_eq!(patched.error_rate, 0.1);
        assert_eq!(patched.latency_ms, 5);
        for bad in [-0.1, 1.5, f64::NAN] {
            let patch = FaultsPatch {
                timeout_rate: Some(bad),
                ..FaultsPatch::default()
            };
            assert!(base.patched(&patch).is_err(), "{bad}");
        }
        let slow = FaultsPatch {
            webhook_delay_ms: Some(FAULT_DELAY_MS_MAX + 1),
            ..FaultsPatch::default()
        };
        assert!(base.patched(&slow).is_err());
        for bad in [
            FaultsPatch {
                refund_reversal_rate: Some(1.01),
                ..FaultsPatch::default()
            },
            FaultsPatch {
                unreachable_ms: Some(FAULT_DELAY_MS_MAX + 1),
                ..FaultsPatch::default()
            },
            FaultsPatch {
                async_delay_ms: Some(FAULT_DELAY_MS_MAX + 1),
                ..FaultsPatch::default()
            },
            FaultsPatch {
                refund_reversal_delay_ms: Some(FAULT_DELAY_MS_MAX + 1),
                ..FaultsPatch::default()
            },
        ] {
            assert!(base.patched(&bad).is_err(), "{bad:?}");
        }
        let on = base
            .patched(&FaultsPatch {
                async_modifications: Some(true),
                lookup_disabled: Some(true),
                key_in_use_conflict: Some(true),
                refund_reversal_rate: Some(0.5),
                ..FaultsPatch::default()
            })
            .unwrap();
        assert!(on.async_modifications && on.lookup_disabled && on.key_in_use_conflict);
        assert_eq!((on.refund_reversal_rate, on.error_rate), (0.5, 0.1));
    }

    #[test]
    fn zero_rates_never_fault_and_one_always_does() {
        let none = Faults::default();
        assert_eq!(call_fault(&none, 0.0, 0.0, 0.0), CallFault::None);
        let all_errors = Faults {
            error_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(
            call_fault(&all_errors, 0.999, 0.1, 0.0),
            CallFault::ErrorAfter
        );
        assert_eq!(
            call_fault(&all_errors, 0.999, 0.9, 0.0),
            CallFault::ErrorBefore
        );
        let all_hangs = Faults {
            timeout_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(call_fault(&all_hangs, 0.5, 0.5, 0.999), CallFault::Hang);
    }
}
