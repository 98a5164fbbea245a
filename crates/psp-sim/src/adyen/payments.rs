//! `POST /v71/payments`: a `PaymentRequest` read as Adyen reads it (every field of its schema
//! accepted, any other refused), its outcome from Adyen's test triggers, and the payment made in
//! the simulator's charge model under its pspReference.
//!
//! | `paymentMethod` | resultCode | later |
//! |---|---|---|
//! | `storedPaymentMethodId: pm_card_ok` / `holderName: APPROVED` / anything else | `Authorised` | |
//! | `pm_card_declined` / `DECLINED` | `Refused`, "Refused" (2) | |
//! | `CARD_EXPIRED` | `Refused`, "Expired Card" (6) | |
//! | `NOT_ENOUGH_BALANCE` | `Refused`, "Not enough balance" (12) | |
//! | `ISSUER_UNAVAILABLE` | `Refused`, "Issuer Unavailable" (9) | |
//! | `ERROR` | `Error`, "Acquirer Error" (4) | |
//! | `CANCELLED` | `Cancelled`, "Cancelled" (15) | |
//! | `PENDING` | `Received` | authorised `modification_delay_ms` later (AUTHORISATION) |
//! | `pm_redirect` | `RedirectShopper` with a redirect `action` | `/sim/charges/{psp}/complete` decides |
//! | `pm_card_timeout` / `pm_card_slow` | `Authorised`, after `hang_ms` / `slow_ms` | |
//! | `pm_capture_fails` / `capture failed` | `Authorised` | a capture succeeds, then CAPTURE_FAILED |
//! | `pm_refund_fails` / `refund failed` | `Authorised` | a refund succeeds, then REFUND_FAILED |
//! | `Chargeback`, `Chargeback:<code>` | `Authorised` | once captured, a dispute opens and is lost |
//! | `Chargeback Reversed` | `Authorised` | once captured, a dispute opens and is won |
//! | `Second Chargeback` | `Authorised` | once captured, a dispute is won, then lost again |
//!
//! Holder names are matched without regard to case. A `storedPaymentMethodId` decides the
//! outcome over the holder name; the later triggers of a holder name apply to any authorised
//! payment. An unknown `storedPaymentMethodId` is a 422 `800` "Contract not found"; a
//! `shopperReference` of fewer than 3 or more than 256 characters is a 422 `702`, as Adyen's
//! schema has it.

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use chrono::Utc;
use serde_json::{Map, Value};

use super::book::{Aftermath, DisputePlan, PaymentRecord, Refusal};
use super::later::Later;
use super::{check_fields, decoded, merchant_account, reply, write_call, AdyenError};
use crate::routes::redirect_base;
use crate::state::{
    CreateChargeRequest, LaterAction, Reply, SimError, SimState, CHARGES_MAX, PM_CARD_DECLINED,
    PM_CARD_OK, PM_CARD_SLOW, PM_CARD_TIMEOUT, PM_REDIRECT,
};
use crate::Simulator;
use asiento_psp::adyen::adapter::SHOPPER_REFERENCE_CHARS;
use asiento_psp::adyen::wire::{self, Action, Amount, PaymentResponse, ResultCode, MANUAL_CAPTURE};
use asiento_psp::provider::{Charge, ChargeStatus};

/// Every property of Checkout v71's `PaymentRequest`.
const PAYMENT_REQUEST_FIELDS: &[&str] = &[
    "accountInfo",
    "additionalAmount",
    "additionalData",
    "amount",
    "applicationInfo",
    "authenticationData",
    "bankAccount",
    "billingAddress",
    "browserInfo",
    "captureDelayHours",
    "channel",
    "checkoutAttemptId",
    "company",
    "conversionId",
    "countryCode",
    "dateOfBirth",
    "dccQuote",
    "deliverAt",
    "deliveryAddress",
    "deliveryDate",
    "deviceFingerprint",
    "enableOneClick",
    "enablePayOut",
    "enableRecurring",
    "enhancedSchemeData",
    "entityType",
    "fraudOffset",
    "fundOrigin",
    "fundRecipient",
    "industryUsage",
    "installments",
    "lineItems",
    "localizedShopperStatement",
    "mandate",
    "mcc",
    "merchantAccount",
    "merchantOrderReference",
    "merchantRiskIndicator",
    "metadata",
    "mpiData",
    "order",
    "orderReference",
    "origin",
    "paymentMethod",
    "paymentValidations",
    "platformChargebackLogic",
    "recurringExpiry",
    "recurringFrequency",
    "recurringProcessingModel",
    "redirectFromIssuerMethod",
    "redirectToIssuerMethod",
    "reference",
    "returnUrl",
    "riskData",
    "sessionValidity",
    "shopperConversionId",
    "shopperEmail",
    "shopperIP",
    "shopperInteraction",
    "shopperLocale",
    "shopperName",
    "shopperReference",
    "shopperStatement",
    "shopperTaxInfo",
    "socialSecurityNumber",
    "splits",
    "store",
    "storePaymentMethod",
    "subMerchants",
    "surcharge",
    "telephoneNumber",
    "threeDS2RequestData",
    "threeDSAuthenticationOnly",
    "trustedShopper",
];

/// Adyen's limits (`PaymentRequest.reference`, `captureDelayHours`, `metadata`).
pub const REFERENCE_LEN_MAX: usize = 80;
pub const CAPTURE_DELAY_HOURS_MAX: i64 = 672;
pub const METADATA_KEYS_MAX: usize = 20;
pub const METADATA_KEY_LEN_MAX: usize = 20;
pub const METADATA_VALUE_LEN_MAX: usize = 80;

/// The chargeback reason code of a `Chargeback` trigger that names none (Visa's fraud code).
pub const CHARGEBACK_REASON_CODE_DEFAULT: &str = "10.4";
/// A `Chargeback:<code>` trigger's code is cut to this many characters.
pub const REASON_CODE_LEN_MAX: usize = 16;

pub(super) const REFUSED: Refusal = Refusal {
    result_code: ResultCode::Refused,
    reason: "Refused",
    code: "2",
};

/// What a payment's trigger makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Outcome {
    /// The simulator's test method it becomes in the charge model.
    method: &'static str,
    refusal: Option<Refusal>,
    /// `PENDING`: `Received` now, authorised later.
    received: bool,
}

const fn outcome(method: &'static str) -> Outcome {
    Outcome {
        method,
        refusal: None,
        received: false,
    }
}

const fn refused(result_code: ResultCode, reason: &'static str, code: &'static str) -> Outcome {
    Outcome {
        method: PM_CARD_DECLINED,
        refusal: Some(Refusal {
            result_code,
            reason,
            code,
        }),
        received: false,
    }
}

/// Adyen's result-code triggers in `holderName`.
fn holder_outcome(holder: &str) -> Option<Outcome> {
    Some(match holder.to_ascii_uppercase().as_str() {
        "APPROVED" => outcome(PM_CARD_OK),
        "DECLINED" => refused(ResultCode::Refused, "Refused", "2"),
        "CARD_EXPIRED" => refused(ResultCode::Refused, "Expired Card", "6"),
        "NOT_ENOUGH_BALANCE" => refused(ResultCode::Refused, "Not enough balance", "12"),
        "ISSUER_UNAVAILABLE" => refused(ResultCode::Refused, "Issuer Unavailable", "9"),
        "ERROR" => refused(ResultCode::Error, "Acquirer Error", "4"),
        "CANCELLED" => refused(ResultCode::Cancelled, "Cancelled", "15"),
        "PENDING" => Outcome {
            method: PM_REDIRECT,
            refusal: None,
            received: true,
        },
        _ => return None,
    })
}

/// What a holder name makes happen after the payment is authorised, and the reason code of
/// the chargeback it asks for.
fn holder_aftermath(holder: &str) -> (Aftermath, String) {
    let lower = holder.to_ascii_lowercase();
    let aftermath = match lower.as_str() {
        "capture failed" => Aftermath::CaptureFails,
        "refund failed" => Aftermath::RefundFails,
        "chargeback" => Aftermath::Dispute(DisputePlan::Lost),
        "chargeback reversed" => Aftermath::Dispute(DisputePlan::Reversed),
        "second chargeback" => Aftermath::Dispute(DisputePlan::Second),
        _ => match holder.split_once(':') {
            Some((name, code))
                if name.eq_ignore_ascii_case("chargeback") && !code.trim().is_empty() =>
            {
                let code: String = code.trim().chars().take(REASON_CODE_LEN_MAX).collect();
                return (Aftermath::Dispute(DisputePlan::Lost), code);
            }
            _ => Aftermath::Nothing,
        },
    };
    (aftermath, CHARGEBACK_REASON_CODE_DEFAULT.to_owned())
}

/// The stored methods that authorise and then fail later, for a caller that sends no holder
/// name (asiento sends a `storedPaymentMethodId` only).
const PM_CAPTURE_FAILS: &str = "pm_capture_fails";
const PM_REFUND_FAILS: &str = "pm_refund_fails";

/// What a stored method makes happen after the payment is authorised.
fn stored_aftermath(id: &str) -> Option<Aftermath> {
    match id {
        PM_CAPTURE_FAILS => Some(Aftermath::CaptureFails),
        PM_REFUND_FAILS => Some(Aftermath::RefundFails),
        _ => None,
    }
}

/// The simulator's own test methods, named by `storedPaymentMethodId`.
fn stored_outcome(id: &str) -> Result<Outcome, AdyenError> {
    match id {
        PM_CAPTURE_FAILS | PM_REFUND_FAILS => Ok(outcome(PM_CARD_OK)),
        PM_CARD_OK | PM_CARD_TIMEOUT | PM_CARD_SLOW | PM_REDIRECT => Ok(outcome(match id {
            PM_CARD_TIMEOUT => PM_CARD_TIMEOUT,
            PM_CARD_SLOW => PM_CARD_SLOW,
            PM_REDIRECT => PM_REDIRECT,
            _ => PM_CARD_OK,
        })),
        PM_CARD_DECLINED => Ok(Outcome {
            method: PM_CARD_DECLINED,
            refusal: Some(REFUSED),
            received: false,
        }),
        _ => Err(AdyenError::validation("800", "Contract not found")),
    }
}

/// A payment request as read.
pub(super) struct NewPayment {
    merchant_account: String,
    amount: Amount,
    reference: String,
    outcome: Outcome,
    aftermath: Aftermath,
    chargeback_reason_code: String,
    capture: bool,
    capture_delay_hours: Option<i64>,
    metadata: BTreeMap<String, String>,
}

/// `{"value": int64 > 0, "currency": "EUR"}`, checked as Adyen does.
pub(super) fn amount_of(object: &Map<String, Value>) -> Result<Option<Amount>, AdyenError> {
    let Some(value) = object.get("amount").filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let Value::Object(fields) = value else {
        return Err(AdyenError::invalid("amount", "an object"));
    };
    check_fields(fields, &["currency", "value"], "Amount")?;
    let amount: Amount = serde_json::from_value(value.clone()).map_err(|_| {
        AdyenError::invalid(
            "amount",
            "{\"value\": an integer of minor units, \"currency\": a code}",
        )
    })?;
    let currency_ok =
        amount.currency.len() == 3 && amount.currency.bytes().all(|b| b.is_ascii_uppercase());
    if !currency_ok {
        return Err(AdyenError::validation(
            "138",
            "Unsupported currency specified",
        ));
    }
    if amount.value <= 0 {
        return Err(AdyenError::validation("137", "Invalid amount specified"));
    }
    Ok(Some(amount))
}

fn read(object: Map<String, Value>) -> Result<NewPayment, AdyenError> {
    check_fields(&object, PAYMENT_REQUEST_FIELDS, "PaymentRequest")?;
    let merchant_account = merchant_account(&object)?;
    let amount =
        amount_of(&object)?.ok_or_else(|| AdyenError::validation("100", "No amount specified"))?;
    let reference = match object.get("reference") {
        None | Some(Value::Null) => None,
        Some(Value::String(reference)) => Some(reference.clone()),
        Some(_) => return Err(AdyenError::invalid("reference", "a string")),
    };
    let reference = reference
        .filter(|reference| !reference.trim().is_empty())
        .ok_or_else(|| AdyenError::validation("130", "Reference Missing"))?;
    if reference.chars().count() > REFERENCE_LEN_MAX {
        return Err(AdyenError::invalid(
            "reference",
            &format!("at most {REFERENCE_LEN_MAX} characters"),
        ));
    }
    match object.get("paymentMethod") {
        None | Some(Value::Null) => return Err(AdyenError::missing("paymentMethod")),
        Some(Value::Object(_)) => {}
        Some(_) => return Err(AdyenError::invalid("paymentMethod", "an object")),
    }
    if object.get("returnUrl").is_none_or(Value::is_null) {
        return Err(AdyenError::missing("returnUrl"));
    }
    let request: wire::PaymentRequest =
        serde_json::from_value(Value::Object(object)).map_err(|error| {
            AdyenError::validation("702", format!("Invalid PaymentRequest: {error}"))
        })?;
    if let Some(hours) = request.capture_delay_hours {
        if !(0..=CAPTURE_DELAY_HOURS_MAX).contains(&hours) {
            return Err(AdyenError::invalid(
                "captureDelayHours",
                &format!("between 0 and {CAPTURE_DELAY_HOURS_MAX}"),
            ));
        }
    }
    if let Some(shopper) = &request.shopper_reference {
        if !SHOPPER_REFERENCE_CHARS.contains(&shopper.chars().count()) {
            return Err(AdyenError::invalid(
                "shopperReference",
                &format!(
                    "{} to {} characters",
                    SHOPPER_REFERENCE_CHARS.start(),
                    SHOPPER_REFERENCE_CHARS.end()
                ),
            ));
        }
    }
    let metadata_ok = request.metadata.len() <= METADATA_KEYS_MAX
        && request.metadata.iter().all(|(key, value)| {
            key.chars().count() <= METADATA_KEY_LEN_MAX
                && value.chars().count() <= METADATA_VALUE_LEN_MAX
        });
    if !metadata_ok {
        return Err(AdyenError::validation("177", "Metadata size exceeds limit"));
    }
    let method = &request.payment_method;
    let holder = method.holder_name.as_deref().unwrap_or_default();
    let outcome = match method.stored_payment_method_id.as_deref() {
        Some(id) => stored_outcome(id)?,
        None => holder_outcome(holder).unwrap_or(outcome(PM_CARD_OK)),
    };
    let (mut aftermath, chargeback_reason_code) = holder_aftermath(holder);
    if let Some(stored) = method
        .stored_payment_method_id
        .as_deref()
        .and_then(stored_aftermath)
    {
        aftermath = stored;
    }
    let capture = request
        .additional_data
        .get(MANUAL_CAPTURE)
        .is_none_or(|manual| manual != "true");
    Ok(NewPayment {
        merchant_account,
        amount,
        reference,
        outcome,
        aftermath,
        chargeback_reason_code,
        capture,
        capture_delay_hours: request.capture_delay_hours,
        metadata: request.metadata,
    })
}

pub(super) async fn create(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let redirect = redirect_base(&sim, &headers);
    write_call(&sim, &headers, &body, read, |state, key, new| {
        create_payment(state, key, new, &redirect)
    })
    .await
}

/// Makes the payment in the charge model under a fresh pspReference and answers it.
fn create_payment(
    state: &mut SimState,
    key: &str,
    new: NewPayment,
    redirect: &str,
) -> Result<Reply, AdyenError> {
    if state.adyen.payments_len() >= CHARGES_MAX {
        return Err(SimError::CapacityExhausted.into());
    }
    let psp_reference = state.adyen.new_psp_reference();
    // Recorded first: the charge model's events are rendered from it as they happen.
    state.adyen.insert_payment(PaymentRecord {
        psp_reference: psp_reference.clone(),
        merchant_account: new.merchant_account.clone(),
        reference: new.reference.clone(),
        amount: new.amount.clone(),
        capture_delay_hours: new.capture_delay_hours,
        refusal: new.outcome.refusal,
        aftermath: new.aftermath,
        chargeback_reason_code: new.chargeback_reason_code,
        refunded_out_of_band: 0,
    });
    let request = CreateChargeRequest {
        amount_minor: new.amount.value,
        currency: new.amount.currency.clone(),
        payment_method: new.outcome.method.to_owned(),
        capture: new.capture,
        reference: Some(new.reference.clone()),
        metadata: new.metadata,
    };
    let made = state.create_charge_as(key, &request, Utc::now(), redirect, psp_reference.clone());
    let made = match made {
        Ok(made) => made,
        Err(error) => {
            state.adyen.remove_payment(&psp_reference);
            return Err(error.into());
        }
    };
    let charge: Charge = decoded(&made);
    if new.outcome.received {
        let delay = state.modification_delay_ms();
        state.schedule(delay, &psp_reference, LaterAction::Adyen(Later::Authorise));
    }
    let mut answer = PaymentResponse {
        psp_reference: Some(psp_reference),
        result_code: Some(ResultCode::Authorised),
        amount: Some(new.amount),
        merchant_reference: Some(new.reference),
        refusal_reason: None,
        refusal_reason_code: None,
        action: None,
        additional_data: BTreeMap::new(),
    };
    match charge.status {
        ChargeStatus::RequiresAction if new.outcome.received => {
            answer.result_code = Some(ResultCode::Received);
        }
        ChargeStatus::RequiresAction => {
            answer.result_code = Some(ResultCode::RedirectShopper);
            answer.action = charge.next_action.map(|next| Action {
                kind: "redirect".to_owned(),
                url: Some(next.redirect_url),
                method: Some("GET".to_owned()),
                payment_method_type: Some("scheme".to_owned()),
            });
        }
        ChargeStatus::Failed => {
            let refusal = new.outcome.refusal.unwrap_or(REFUSED);
            answer.result_code = Some(refusal.result_code);
            answer.refusal_reason = Some(refusal.reason.to_owned());
            answer.refusal_reason_code = Some(refusal.code.to_owned());
        }
        ChargeStatus::RequiresCapture | ChargeStatus::Succeeded => {}
    }
    Ok(Reply {
        delay: made.delay,
        ..reply(StatusCode::OK, &answer)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names_are_adyen_s_test_triggers() {
        assert_eq!(holder_outcome("APPROVED").unwrap().method, PM_CARD_OK);
        let expired = holder_outcome("card_expired").unwrap().refusal.unwrap();
        assert_eq!((expired.reason, expired.code), ("Expired Card", "6"));
        assert_eq!(
            holder_outcome("ERROR")
                .unwrap()
                .refusal
                .unwrap()
                .result_code,
            ResultCode::Error
        );
        assert!(holder_outcome("PENDING").unwrap().received);
        assert_eq!(
            holder_outcome("REFUSED"),
            None,
            "not one of Adyen's triggers"
        );
        assert_eq!(
            holder_aftermath("Chargeback:4837"),
            (Aftermath::Dispute(DisputePlan::Lost), "4837".to_owned())
        );
        assert_eq!(
            holder_aftermath("capture failed").0,
            Aftermath::CaptureFails
        );
        assert_eq!(holder_aftermath("John Smith").0, Aftermath::Nothing);
        assert!(stored_outcome("pm_nope").is_err());
        assert!(stored_outcome(PM_CAPTURE_FAILS).is_ok());
        assert_eq!(
            stored_aftermath(PM_CAPTURE_FAILS),
            Some(Aftermath::CaptureFails)
        );
        assert_eq!(
            stored_aftermath(PM_REFUND_FAILS),
            Some(Aftermath::RefundFails)
        );
        assert_eq!(stored_aftermath(PM_CARD_OK), None);
    }
}
