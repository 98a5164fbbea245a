//! What the Stripe dialect keeps beside the simulator's charges: the PaymentIntents (a
//! PaymentIntent exists before its charge, unconfirmed, and a duplicate that is never confirmed
//! moves no money), the answers to writes that never reach the charge model (creating and
//! cancelling an unconfirmed PaymentIntent), the metadata of refunds, the refunds made outside
//! the API (a dashboard's), which Stripe has as Refund objects too, and the payouts.
//!
//! A PaymentIntent `pi_<x>` confirms into the simulator's charge `ch_<x>`, so either id names
//! the other without a table.

use std::collections::{BTreeMap, HashMap};

use axum::body::Bytes;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};

use asiento_psp::provider::{Charge, Operation, OperationKind, OperationStatus};

/// A PaymentIntent as created; what happens after its confirmation lives in its charge.
#[derive(Clone, Debug)]
pub(crate) struct IntentRecord {
    pub id: String,
    pub amount: i64,
    /// Lower case, as Stripe writes it.
    pub currency: String,
    pub capture_method: &'static str,
    pub description: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub payment_method: Option<String>,
    pub payment_method_types: Vec<String>,
    pub return_url: Option<String>,
    pub created: i64,
    /// Whether a confirmation reached the charge model (`ch_<x>` exists).
    pub confirmed: bool,
    /// When and why it was canceled, as the cancel request said.
    pub canceled: Option<(i64, Option<&'static str>)>,
}

/// A stored answer: replayed byte for byte to the same request under the same key.
#[derive(Clone, Debug)]
pub(crate) struct StoredAnswer {
    pub fingerprint: String,
    pub status: StatusCode,
    pub body: Bytes,
}

#[derive(Default)]
pub(crate) struct IntentBook {
    intents: HashMap<String, IntentRecord>,
    /// Intent ids in creation order, for listings.
    order: Vec<String>,
    answers: HashMap<String, StoredAnswer>,
    refund_metadata: HashMap<String, BTreeMap<String, String>>,
    /// Refunds made outside the API (the simulator's `refund_out_of_band`, Stripe's dashboard):
    /// Refund objects with no key of ours, in the order made.
    dashboard_refunds: Vec<Operation>,
    /// Payouts made, in the order made.
    payouts: Vec<PayoutRecord>,
}

/// A payout of the account's balance to its bank account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PayoutRecord {
    pub id: String,
    /// What reached (or was to reach) the bank: the net of the transactions it covers.
    pub amount: i64,
    pub currency: String,
    pub created: i64,
    /// When it failed after it was paid: its money is back in the balance.
    pub failed: Option<i64>,
    /// The balance transactions it paid out, oldest first.
    pub transactions: Vec<String>,
}

/// The charge a PaymentIntent confirms into.
pub(crate) fn charge_id_of(intent_id: &str) -> String {
    format!("ch_{}", intent_id.strip_prefix("pi_").unwrap_or(intent_id))
}

/// The PaymentIntent a simulator charge belongs to.
pub(crate) fn intent_id_of(charge_id: &str) -> String {
    format!("pi_{}", charge_id.strip_prefix("ch_").unwrap_or(charge_id))
}

impl IntentBook {
    pub fn insert(&mut self, record: IntentRecord) {
        self.order.push(record.id.clone());
        self.intents.insert(record.id.clone(), record);
    }

    pub fn get(&self, id: &str) -> Option<&IntentRecord> {
        self.intents.get(id)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut IntentRecord> {
        self.intents.get_mut(id)
    }

    pub fn len(&self) -> usize {
        self.intents.len()
    }

    /// Every intent, newest first.
    pub fn newest_first(&self) -> impl Iterator<Item = &IntentRecord> {
        self.order
            .iter()
            .rev()
            .filter_map(|id| self.intents.get(id))
    }

    pub fn answer(&self, key: &str) -> Option<&StoredAnswer> {
        self.answers.get(key)
    }

    pub fn store_answer(&mut self, key: &str, answer: StoredAnswer) {
        self.answers.insert(key.to_owned(), answer);
    }

    pub fn set_refund_metadata(&mut self, refund_id: &str, metadata: BTreeMap<String, String>) {
        if !metadata.is_empty() {
            self.refund_metadata.insert(refund_id.to_owned(), metadata);
        }
    }

    /// Records a refund of `amount_minor` on `charge` made outside the API.
    pub fn add_dashboard_refund(&mut self, charge: &Charge, amount_minor: i64, now: DateTime<Utc>) {
        let suffix = charge.id.strip_prefix("ch_").unwrap_or(&charge.id);
        let made = self
            .dashboard_refunds
            .iter()
            .filter(|refund| refund.charge == charge.id)
            .count();
        self.dashboard_refunds.push(Operation {
            id: format!("re_dash{made}_{suffix}"),
            kind: OperationKind::Refund,
            charge: charge.id.clone(),
            idempotency_key: String::new(),
            amount_minor,
            currency: charge.currency.clone(),
            status: OperationStatus::Succeeded,
            failure_reason: None,
            created: now,
            updated: now,
        });
    }

    pub fn dashboard_refunds_of<'a>(
        &'a self,
        charge_id: &'a str,
    ) -> impl Iterator<Item = &'a Operation> + 'a {
        self.dashboard_refunds
            .iter()
            .filter(move |refund| refund.charge == charge_id)
    }

    pub fn dashboard_refund(&self, id: &str) -> Option<&Operation> {
        self.dashboard_refunds.iter().find(|refund| refund.id == id)
    }

    pub fn add_payout(&mut self, payout: PayoutRecord) {
        self.payouts.push(payout);
    }

    /// Every payout, oldest first.
    pub fn payouts(&self) -> &[PayoutRecord] {
        &self.payouts
    }

    pub fn payout_mut(&mut self, id: &str) -> Option<&mut PayoutRecord> {
        self.payouts.iter_mut().find(|payout| payout.id == id)
    }

    pub fn refund_metadata(&self, refund_id: &str) -> BTreeMap<String, String> {
        self.refund_metadata
            .get(refund_id)
            .cloned()
            .unwrap_or_default()
    }
}
