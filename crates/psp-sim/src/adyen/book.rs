//! What the Adyen dialect keeps beside the simulator's charges: each payment as it was asked
//! (merchant account, reference, amount, the test trigger it carries), each modification with
//! its own pspReference and the charge-model operation it became (if the charge model took it),
//! each dispute's pspReference, the stored answers of idempotency keys, and the HMAC key that
//! signs notification items.
//!
//! A payment's pspReference is the id of its charge in the simulator's charge model, so the
//! control and truth routes (`/sim/charges/{id}/…`) take it as it is.

use std::collections::{HashMap, HashSet};

use axum::body::Bytes;
use axum::http::StatusCode;

use asiento_psp::adyen::wire::{Amount, ResultCode};
use asiento_psp::adyen::HmacKey;

/// The characters of a pspReference.
const PSP_REFERENCE_ALPHABET: &[u8; 36] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
/// Adyen's pspReferences are 16 characters.
pub(crate) const PSP_REFERENCE_LEN: usize = 16;

/// How a payment was refused, as Adyen's answer and its AUTHORISATION item say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub result_code: ResultCode,
    pub reason: &'static str,
    pub code: &'static str,
}

/// What a payment's test trigger makes happen after it is authorised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Aftermath {
    #[default]
    Nothing,
    /// `capture failed`: a capture succeeds, then fails (CAPTURE_FAILED).
    CaptureFails,
    /// `refund failed`: a refund succeeds, then fails (REFUND_FAILED).
    RefundFails,
    /// `Chargeback…`: a dispute opens once the payment is captured.
    Dispute(DisputePlan),
}

/// How a dispute a trigger opens goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DisputePlan {
    /// `Chargeback` (`Chargeback:<reason code>`): lost.
    Lost,
    /// `Chargeback Reversed`: won.
    Reversed,
    /// `Second Chargeback`: won, then lost after all.
    Second,
}

/// A payment as it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PaymentRecord {
    pub psp_reference: String,
    pub merchant_account: String,
    pub reference: String,
    pub amount: Amount,
    /// As the request set it; echoed as a string in the AUTHORISATION item.
    pub capture_delay_hours: Option<i64>,
    pub refusal: Option<Refusal>,
    pub aftermath: Aftermath,
    /// A `Chargeback:<code>` trigger's reason code, else the simulator's default.
    pub chargeback_reason_code: String,
    /// What was refunded outside the API (the simulator's out-of-band refunds) and announced.
    pub refunded_out_of_band: i64,
}

/// Which modification a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ModificationKind {
    Capture,
    Refund,
    Cancel,
    /// A cancel by our reference (`POST /cancels`).
    TechnicalCancel,
}

impl ModificationKind {
    /// The event code of its outcome.
    pub fn event_code(self) -> &'static str {
        match self {
            ModificationKind::Capture => "CAPTURE",
            ModificationKind::Refund => "REFUND",
            ModificationKind::Cancel => "CANCELLATION",
            ModificationKind::TechnicalCancel => "TECHNICAL_CANCEL",
        }
    }
}

/// A capture, refund or cancel, with its own pspReference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ModificationRecord {
    pub psp_reference: String,
    pub kind: ModificationKind,
    /// The payment's pspReference; `None` for a cancel by a reference no payment has.
    pub payment: Option<String>,
    pub merchant_account: String,
    /// The request's own `reference`.
    pub reference: Option<String>,
    /// The request's `paymentReference` (cancel by reference only).
    pub payment_reference: Option<String>,
    pub amount: Option<Amount>,
    /// The charge model's operation, when it took the request.
    pub operation_id: Option<String>,
    /// Why the charge model refused it, told by notification later.
    pub refusal: Option<String>,
}

/// A dispute's own pspReference, and how far it went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct DisputeRecord {
    pub psp_reference: String,
    /// Whether CHARGEBACK_REVERSED was sent: a loss after it is a second chargeback.
    pub reversed: bool,
}

/// An answer stored under an idempotency key, replayed byte for byte.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredAnswer {
    pub status: StatusCode,
    pub body: Bytes,
}

#[derive(Default)]
pub(crate) struct AdyenBook {
    payments: HashMap<String, PaymentRecord>,
    /// `(merchantAccount, reference)` → the payments made under it, oldest first.
    by_reference: HashMap<(String, String), Vec<String>>,
    modifications: HashMap<String, ModificationRecord>,
    /// Charge-model operation id → the modification's pspReference.
    by_operation: HashMap<String, String>,
    /// Charge id → its dispute.
    disputes: HashMap<String, DisputeRecord>,
    answers: HashMap<String, StoredAnswer>,
    /// Every pspReference handed out, so none is handed out twice.
    issued: HashSet<String>,
    hmac_key: Option<HmacKey>,
    /// The journal the reports are made of, and the batches closed.
    pub reports: super::reports::ReportBook,
}

impl AdyenBook {
    pub fn set_hmac_key(&mut self, key: Option<HmacKey>) {
        self.hmac_key = key;
    }

    pub fn hmac_key(&self) -> Option<&HmacKey> {
        self.hmac_key.as_ref()
    }

    /// A fresh pspReference: 16 upper-case alphanumerics, never handed out before.
    pub fn new_psp_reference(&mut self) -> String {
        loop {
            let mut bits = uuid::Uuid::new_v4().as_u128();
            let mut reference = String::with_capacity(PSP_REFERENCE_LEN);
            for _ in 0..PSP_REFERENCE_LEN {
                let digit = usize::try_from(bits % 36).unwrap_or_default();
                bits /= 36;
                reference.push(char::from(PSP_REFERENCE_ALPHABET[digit]));
            }
            if self.issued.insert(reference.clone()) {
                return reference;
            }
        }
    }

    pub fn insert_payment(&mut self, record: PaymentRecord) {
        self.by_reference
            .entry((record.merchant_account.clone(), record.reference.clone()))
            .or_default()
            .push(record.psp_reference.clone());
        self.payments.insert(record.psp_reference.clone(), record);
    }

    /// Forgets a payment the charge model did not take.
    pub fn remove_payment(&mut self, psp_reference: &str) {
        if let Some(record) = self.payments.remove(psp_reference) {
            let key = (record.merchant_account, record.reference);
            if let Some(list) = self.by_reference.get_mut(&key) {
                list.retain(|psp| psp != psp_reference);
                if list.is_empty() {
                    self.by_reference.remove(&key);
                }
            }
        }
    }

    pub fn payment(&self, psp_reference: &str) -> Option<&PaymentRecord> {
        self.payments.get(psp_reference)
    }

    pub fn payment_mut(&mut self, psp_reference: &str) -> Option<&mut PaymentRecord> {
        self.payments.get_mut(psp_reference)
    }

    /// The latest payment of `merchant_account` made under `reference`.
    pub fn payment_by_reference(&self, merchant_account: &str, reference: &str) -> Option<&str> {
        self.by_reference
            .get(&(merchant_account.to_owned(), reference.to_owned()))
            .and_then(|list| list.last())
            .map(String::as_str)
    }

    pub fn insert_modification(&mut self, record: ModificationRecord) {
        if let Some(operation_id) = &record.operation_id {
            self.by_operation
                .insert(operation_id.clone(), record.psp_reference.clone());
        }
        self.modifications
            .insert(record.psp_reference.clone(), record);
    }

    pub fn modification(&self, psp_reference: &str) -> Option<&ModificationRecord> {
        self.modifications.get(psp_reference)
    }

    /// The modification a charge-model operation stands for.
    pub fn modification_of_operation(&self, operation_id: &str) -> Option<&ModificationRecord> {
        self.by_operation
            .get(operation_id)
            .and_then(|psp| self.modifications.get(psp))
    }

    /// The dispute of a charge, opened now if it has none.
    pub fn dispute_of(&mut self, charge_id: &str) -> &mut DisputeRecord {
        if !self.disputes.contains_key(charge_id) {
            let psp_reference = self.new_psp_reference();
            self.disputes.insert(
                charge_id.to_owned(),
                DisputeRecord {
                    psp_reference,
                    reversed: false,
                },
            );
        }
        self.disputes
            .get_mut(charge_id)
            .expect("the dispute was inserted above")
    }

    /// The payment (its charge's id) whose dispute is `psp_reference`.
    pub fn payment_of_dispute(&self, psp_reference: &str) -> Option<&str> {
        self.disputes
            .iter()
            .find(|(_, dispute)| dispute.psp_reference == psp_reference)
            .map(|(charge, _)| charge.as_str())
    }

    pub fn answer(&self, key: &str) -> Option<&StoredAnswer> {
        self.answers.get(key)
    }

    pub fn store_answer(&mut self, key: &str, answer: StoredAnswer) {
        self.answers.insert(key.to_owned(), answer);
    }

    pub fn answers_len(&self) -> usize {
        self.answers.len()
    }

    pub fn payments_len(&self) -> usize {
        self.payments.len()
    }

    pub fn modifications_len(&self) -> usize {
        self.modifications.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psp_references_are_sixteen_upper_case_alphanumerics_and_unique() {
        let mut book = AdyenBook::default();
        let references: HashSet<String> = (0..1_000).map(|_| book.new_psp_reference()).collect();
        assert_eq!(references.len(), 1_000);
        for reference in &references {
            assert_eq!(reference.len(), PSP_REFERENCE_LEN);
            assert!(reference
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase()));
        }
    }
}
