//! One derivation of facts from what a provider says, shared by every path that hears it: the
//! synchronous answer, the webhook worker, the stale sweep, the operations sweep and the
//! settlement report. Each path used to read the provider's objects its own way, and only the
//! report checked that a charge was really this payment's; here every path gets the same facts
//! and the same checks.
//!
//! - [`charge_facts`]: what a charge, as the provider holds it now, stands for, in the order to
//!   apply them (a refund or dispute implies the capture of `amount_captured`, so that is first).
//! - [`operation_fact`]: what the provider says of one of our captures or refunds.
//! - [`dispute_of`]: a dispute as a fact, from a charge, a report line or a provider's notice of
//!   that dispute alone (Adyen's).
//! - [`authorization_end_fact`]: a provider's notice of the end of what is left of an
//!   authorization (an expiry, a cancel), which carries no charge (Adyen's).
//! - [`charge_outcome_facts`] / [`answer_facts`]: what an answer to a creation or an operation
//!   request means: the charge's status or the operation's outcome (a refusal included), then the
//!   fees the provider says it kept; or nothing (unknown: the payment or operation stays as it is
//!   and the sweep drives it).
//! - [`charge_misfit`] / [`operation_misfit`]: an object that is not the one we asked for (other
//!   currency, amount, reference or key) is never applied: the caller flags it for a person.

use asiento_domain::payment::{DisputeOutcome, ProviderRequest};
use asiento_domain::{Amount, ExceptionKind, OperationOutcome, PaymentRecord, ProviderFact};
use asiento_psp::event::AuthorizationEnd;
use asiento_psp::{
    Charge, ChargeOutcome, ChargeStatus, Dispute, DisputeStatus, Operation, OperationAnswer,
    OperationKind as ProviderOperationKind, OperationStatus, ProviderError, ProviderFee,
};

/// How fresh a charge is: read from the provider just now (a lookup, an answer), or a snapshot
/// taken when something happened (a webhook), which may predate a later change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    Now,
    Snapshot,
}

/// Why an object is not the one the payment asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Misfit {
    pub kind: ExceptionKind,
    /// What differs, stable across sweeps (it is part of the exception's id).
    pub fingerprint: String,
}

impl Misfit {
    fn new(kind: ExceptionKind, fingerprint: impl Into<String>) -> Misfit {
        Misfit {
            kind,
            fingerprint: fingerprint.into(),
        }
    }
}

/// The charge is not this payment's: another currency or amount, or another reference or key.
pub fn charge_misfit(record: &PaymentRecord, charge: &Charge) -> Option<Misfit> {
    if !charge.currency.eq_ignore_ascii_case(record.currency.code()) {
        return Some(Misfit::new(
            ExceptionKind::CurrencyMismatch,
            charge.currency.clone(),
        ));
    }
    if charge.amount_minor != record.amount.minor() {
        return Some(Misfit::new(
            ExceptionKind::AmountMismatch,
            charge.amount_minor.to_string(),
        ));
    }
    let id = record.id.to_string();
    if charge.reference.as_deref().is_some_and(|r| r != id)
        || (!charge.idempotency_key.is_empty() && charge.idempotency_key != record.psp_key)
    {
        return Some(Misfit::new(ExceptionKind::Ambiguous, "reference"));
    }
    None
}

/// The operation is not one this payment asked for under `psp_key`: another key, currency or
/// charge. (Its amount is checked by the domain against the operation it names.)
pub fn operation_misfit(record: &PaymentRecord, psp_key: &str, op: &Operation) -> Option<Misfit> {
    if op.idempotency_key != psp_key {
        return Some(Misfit::new(
            ExceptionKind::Ambiguous,
            format!("operation_key:{}", op.idempotency_key),
        ));
    }
    // A cancel moves what is left of the authorization, which a provider may not spell out (an
    // Adyen cancel's answer carries no amount).
    let names_currency = !(op.kind == ProviderOperationKind::Cancel && op.currency.is_empty());
    if names_currency && !op.currency.eq_ignore_ascii_case(record.currency.code()) {
        return Some(Misfit::new(
            ExceptionKind::CurrencyMismatch,
            op.currency.clone(),
        ));
    }
    if record
        .provider_charge_id
        .as_deref()
        .is_some_and(|known| known != op.charge)
    {
        return Some(Misfit::new(
            ExceptionKind::Ambiguous,
            format!("operation_charge:{}", op.charge),
        ));
    }
    None
}

/// The charge a creation answered with is not this payment's (see [`charge_misfit`]).
pub fn outcome_misfit(record: &PaymentRecord, outcome: &ChargeOutcome) -> Option<Misfit> {
    match outcome {
        ChargeOutcome::Succeeded(charge)
        | ChargeOutcome::Authorized(charge)
        | ChargeOutcome::RequiresAction(charge)
        | ChargeOutcome::Declined(charge) => charge_misfit(record, charge),
        ChargeOutcome::Rejected(_) | ChargeOutcome::Unknown { .. } => None,
    }
}

/// What a provider's answer to a charge creation means for the payment: its status, then the
/// fees the provider says it kept; nothing when unknown.
pub fn charge_outcome_facts(outcome: ChargeOutcome) -> Vec<ProviderFact> {
    match outcome {
        ChargeOutcome::Succeeded(charge)
        | ChargeOutcome::Authorized(charge)
        | ChargeOutcome::RequiresAction(charge)
        | ChargeOutcome::Declined(charge) => {
            std::iter::once(charge_status_fact(&charge, Read::Now))
                .chain(provider_fee_facts(&charge.id, &charge.provider_fees))
                .collect()
        }
        ChargeOutcome::Rejected(rejection) => vec![ProviderFact::Failed {
            charge_id: None,
            reason: format!("rejected by the provider: {}", rejection.code),
        }],
        ChargeOutcome::Unknown { reason } => {
            tracing::warn!(%reason, "provider outcome unknown; the payment stays pending");
            Vec::new()
        }
    }
}

/// The fact a charge's status stands for. A succeeded charge with refunds stands for its
/// cumulative refund (which implies the capture); [`charge_facts`] also names the capture and
/// any dispute.
pub fn charge_status_fact(charge: &Charge, read: Read) -> ProviderFact {
    match charge.status {
        ChargeStatus::Succeeded if charge.amount_refunded > 0 => ProviderFact::Refunded {
            charge_id: charge.id.clone(),
            amount_refunded: Amount::new(charge.amount_refunded),
            current: read == Read::Now,
        },
        ChargeStatus::Succeeded => ProviderFact::Captured {
            charge_id: charge.id.clone(),
            amount: Amount::new(charge.amount_captured),
        },
        ChargeStatus::RequiresCapture => ProviderFact::Authorized {
            charge_id: charge.id.clone(),
            amount: Amount::new(charge.amount_minor),
        },
        ChargeStatus::RequiresAction => ProviderFact::ActionRequired {
            charge_id: charge.id.clone(),
            redirect_url: charge
                .next_action
                .as_ref()
                .map(|action| action.redirect_url.clone())
                .unwrap_or_default(),
        },
        ChargeStatus::Failed => ProviderFact::Failed {
            charge_id: Some(charge.id.clone()),
            reason: charge
                .failure_code
                .clone()
                .unwrap_or_else(|| "declined".to_owned()),
        },
    }
}

/// Every fact a charge, as the provider holds it now, stands for, in the order to apply them:
/// the capture it implies, its cumulative refund, its dispute (opened or closed), then the fees
/// the provider kept (which need the captured money to exist).
pub fn charge_facts(charge: &Charge, read: Read) -> Vec<ProviderFact> {
    let mut facts = Vec::with_capacity(3 + charge.provider_fees.len());
    let status = charge_status_fact(charge, read);
    if matches!(status, ProviderFact::Refunded { .. }) || charge.dispute.is_some() {
        facts.extend(captured(charge));
        if charge.amount_refunded > 0 {
            facts.push(ProviderFact::Refunded {
                charge_id: charge.id.clone(),
                amount_refunded: Amount::new(charge.amount_refunded),
                current: read == Read::Now,
            });
        }
    } else {
        facts.push(status);
    }
    facts.extend(dispute_fact(charge));
    facts.extend(provider_fee_facts(&charge.id, &charge.provider_fees));
    facts
}

/// The provider's fees on `charge_id`, one fact per balance transaction.
pub fn provider_fee_facts<'a>(
    charge_id: &'a str,
    fees: &'a [ProviderFee],
) -> impl Iterator<Item = ProviderFact> + 'a {
    fees.iter()
        .map(move |fee| ProviderFact::ProviderFeeCharged {
            charge_id: charge_id.to_owned(),
            transaction_id: fee.transaction_id.clone(),
            fee: Amount::new(fee.fee_minor),
        })
}

fn captured(charge: &Charge) -> Option<ProviderFact> {
    (charge.amount_captured > 0).then(|| ProviderFact::Captured {
        charge_id: charge.id.clone(),
        amount: Amount::new(charge.amount_captured),
    })
}

/// The charge's dispute as a fact.
pub fn dispute_fact(charge: &Charge) -> Option<ProviderFact> {
    charge
        .dispute
        .as_ref()
        .map(|dispute| dispute_of(&charge.id, dispute))
}

/// A dispute of `charge_id` as a fact. The provider gives a charge at most one dispute at a
/// time; its id, or else its creation time, tells a later one apart, and every report of one
/// dispute (webhook, lookup, settlement report) carries the same, so all of them name it alike.
pub fn dispute_of(charge_id: &str, dispute: &Dispute) -> ProviderFact {
    let dispute_id = match &dispute.id {
        Some(id) => format!("dp_{charge_id}_{id}"),
        None => format!("dp_{charge_id}_{}", dispute.created.timestamp_millis()),
    };
    let amount = Amount::new(dispute.amount_minor);
    match dispute.status {
        DisputeStatus::Open => ProviderFact::DisputeOpened {
            charge_id: charge_id.to_owned(),
            dispute_id,
            amount,
        },
        DisputeStatus::Won | DisputeStatus::Lost => ProviderFact::DisputeClosed {
            charge_id: charge_id.to_owned(),
            dispute_id,
            amount,
            outcome: if dispute.status == DisputeStatus::Won {
                DisputeOutcome::Won
            } else {
                DisputeOutcome::Lost
            },
            reinstated: dispute.reinstated,
        },
    }
}

/// The end of a charge's authorization (an expiry, a cancel) as a fact: it ends only what was
/// not captured, so it fails a payment only where nothing was or will be captured.
pub fn authorization_end_fact(end: &AuthorizationEnd) -> ProviderFact {
    ProviderFact::AuthorizationEnded {
        charge_id: end.charge.clone(),
        reason: end.reason.clone(),
    }
}

/// What the provider says of one of our operations, as a fact, with the provider's request
/// when this is its answer to ours.
pub fn operation_fact(
    op: &Operation,
    request: Option<&asiento_psp::ProviderRequest>,
) -> ProviderFact {
    let kind = match op.kind {
        ProviderOperationKind::Capture => asiento_domain::OperationKind::Capture,
        ProviderOperationKind::Refund => asiento_domain::OperationKind::Refund,
        ProviderOperationKind::Cancel => asiento_domain::OperationKind::Cancel,
    };
    let outcome = match op.status {
        OperationStatus::Pending => OperationOutcome::Pending,
        OperationStatus::Succeeded => OperationOutcome::Succeeded,
        OperationStatus::Failed => OperationOutcome::Failed {
            reason: op
                .failure_reason
                .clone()
                .unwrap_or_else(|| "failed".to_owned()),
        },
        OperationStatus::Reversed => OperationOutcome::Reversed {
            reason: op
                .failure_reason
                .clone()
                .unwrap_or_else(|| "reversed".to_owned()),
        },
    };
    ProviderFact::Operation {
        kind,
        charge_id: op.charge.clone(),
        psp_key: op.idempotency_key.clone(),
        provider_id: Some(op.id.clone()),
        amount: Amount::new(op.amount_minor),
        outcome,
        request: request.map(|request| ProviderRequest {
            id: request.id.clone(),
            replayed: request.replayed,
        }),
    }
}

/// What we asked the provider for, to read its answer against.
#[derive(Debug, Clone)]
pub struct Asked<'a> {
    pub kind: asiento_domain::OperationKind,
    pub charge_id: &'a str,
    pub psp_key: &'a str,
    pub amount: Amount,
}

/// What the answer to an operation request means: the operation's outcome, then the fees the
/// provider says it kept on the charge it answered with (a capture's). A refusal fails the
/// operation (releasing what it reserved); an answer for another key, currency or charge is a
/// misfit; an unknown or unreadable answer is nothing: the operation stays requested and the
/// sweep drives it.
pub fn answer_facts(
    record: &PaymentRecord,
    asked: &Asked<'_>,
    answer: &Result<OperationAnswer, ProviderError>,
) -> Result<Vec<ProviderFact>, Misfit> {
    match answer {
        Ok(answer) => {
            if let Some(misfit) = operation_misfit(record, asked.psp_key, &answer.operation) {
                return Err(misfit);
            }
            let fees = answer
                .charge
                .iter()
                .filter(|charge| charge.id == asked.charge_id)
                .flat_map(|charge| provider_fee_facts(&charge.id, &charge.provider_fees));
            Ok(
                std::iter::once(operation_fact(&answer.operation, answer.request.as_ref()))
                    .chain(fees)
                    .collect(),
            )
        }
        Err(ProviderError::Rejected(rejection)) => Ok(vec![ProviderFact::Operation {
            kind: asked.kind,
            charge_id: asked.charge_id.to_owned(),
            psp_key: asked.psp_key.to_owned(),
            provider_id: None,
            amount: asked.amount,
            outcome: OperationOutcome::Failed {
                reason: rejection.code.clone(),
            },
            request: None,
        }]),
        Err(error) => {
            tracing::warn!(key = asked.psp_key, %error, "operation outcome unknown; the sweep drives it");
            Ok(Vec::new())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use asiento_domain::{
        CaptureMode, CreatePayment, Currency, CustomerId, OperationKind, Payment, PaymentCommand,
        PaymentId, ProviderName, TenantId,
    };
    use chrono::Utc;

    fn record() -> PaymentRecord {
        let create = CreatePayment {
            id: PaymentId::from_uuid(uuid::Uuid::from_u128(9)),
            tenant: TenantId::parse("acme").expect("tenant"),
            amount: Amount::new(10_000),
            currency: Currency::parse("USD").expect("currency"),
            customer: CustomerId::parse("42").expect("customer"),
            provider: ProviderName::parse("sim").expect("provider"),
            capture_mode: CaptureMode::Automatic,
            description: None,
            metadata: serde_json::Map::new(),
            payment_method: None,
            at: Utc::now(),
        };
        let events =
            asiento_domain::decide_payment(&Payment::default(), PaymentCommand::Create(create))
                .expect("create");
        let payment = events
            .iter()
            .fold(Payment::default(), asiento_domain::evolve_payment);
        payment.record.expect("record")
    }

    fn charge(record: &PaymentRecord) -> Charge {
        let now = Utc::now();
        Charge {
            id: "ch_1".into(),
            status: ChargeStatus::Succeeded,
            amount_minor: record.amount.minor(),
            currency: "usd".into(),
            amount_captured: record.amount.minor(),
            amount_refunded: 0,
            reference: Some(record.id.to_string()),
            idempotency_key: record.psp_key.clone(),
            payment_method: "pm_card_ok".into(),
            capture: true,
            provider_fees: Vec::new(),
            failure_code: None,
            next_action: None,
            dispute: None,
            metadata: Default::default(),
            created: now,
            updated: now,
        }
    }

    #[test]
    fn a_charge_fits_only_with_our_currency_amount_reference_and_key() {
        let record = record();
        let ours = charge(&record);
        assert_eq!(
            charge_misfit(&record, &ours),
            None,
            "currency case is ignored"
        );
        type Change = fn(&mut Charge);
        let cases: [(Change, ExceptionKind); 4] = [
            (
                |c| c.currency = "eur".into(),
                ExceptionKind::CurrencyMismatch,
            ),
            (|c| c.amount_minor += 1, ExceptionKind::AmountMismatch),
            (
                |c| c.reference = Some("pay_other".into()),
                ExceptionKind::Ambiguous,
            ),
            (
                |c| c.idempotency_key = "psp_other".into(),
                ExceptionKind::Ambiguous,
            ),
        ];
        for (change, kind) in cases {
            let mut other = ours.clone();
            change(&mut other);
            assert_eq!(charge_misfit(&record, &other).map(|m| m.kind), Some(kind));
            assert!(outcome_misfit(&record, &ChargeOutcome::Succeeded(other)).is_some());
        }
    }

    #[test]
    fn a_refused_operation_fails_and_an_unknown_answer_is_nothing() {
        let record = record();
        let asked = Asked {
            kind: OperationKind::Refund,
            charge_id: "ch_1",
            psp_key: "psp_x_refund_1",
            amount: Amount::new(500),
        };
        let refused = Err(ProviderError::Rejected(asiento_psp::Rejection {
            status: 400,
            code: "charge_disputed".into(),
            message: "disputed".into(),
        }));
        let facts = answer_facts(&record, &asked, &refused).expect("fits");
        assert!(matches!(
            facts.as_slice(),
            [ProviderFact::Operation {
                outcome: OperationOutcome::Failed { ref reason },
                ..
            }] if reason == "charge_disputed"
        ));
        let unknown = Err(ProviderError::Unknown {
            reason: "timeout".into(),
        });
        assert_eq!(answer_facts(&record, &asked, &unknown), Ok(Vec::new()));
    }

    #[test]
    fn an_answer_carries_its_request_and_the_provider_s_fees_after_the_outcome() {
        let record = record();
        let mut charge = charge(&record);
        charge.provider_fees.push(asiento_psp::ProviderFee {
            transaction_id: "txn_1".into(),
            fee_minor: 290,
        });
        let fee = ProviderFact::ProviderFeeCharged {
            charge_id: "ch_1".into(),
            transaction_id: "txn_1".into(),
            fee: Amount::new(290),
        };
        let created = charge_outcome_facts(ChargeOutcome::Succeeded(charge.clone()));
        assert!(
            matches!(created.as_slice(), [ProviderFact::Captured { .. }, last] if *last == fee)
        );
        let asked = Asked {
            kind: OperationKind::Capture,
            charge_id: "ch_1",
            psp_key: "psp_x_capture_1",
            amount: Amount::new(10_000),
        };
        let captured = Ok(OperationAnswer {
            operation: asiento_psp::Operation {
                id: "ch_1/capture".into(),
                kind: asiento_psp::OperationKind::Capture,
                charge: "ch_1".into(),
                idempotency_key: "psp_x_capture_1".into(),
                amount_minor: 10_000,
                currency: "USD".into(),
                status: OperationStatus::Succeeded,
                failure_reason: None,
                created: charge.created,
                updated: charge.created,
            },
            charge: Some(charge),
            request: Some(asiento_psp::ProviderRequest {
                id: "req_1".into(),
                replayed: true,
            }),
        });
        let facts = answer_facts(&record, &asked, &captured).expect("fits");
        assert!(matches!(
            facts.as_slice(),
            [ProviderFact::Operation { request: Some(request), .. }, last]
                if *last == fee && request.id == "req_1" && request.replayed
        ));
    }
}
