//! The end-of-run checks, once faults are off and everything has had time to settle: every key
//! that got a 2xx names exactly one payment and replays it, the provider holds at most one charge
//! per payment and per key and at most one operation per key, every payment agrees with its
//! charge at the provider (status, captured and refunded amounts) and its captures and refunds
//! with the provider's and with the clients' answers (`operations.rs`), nothing a client was
//! answered for is lost, and nothing is left pending. What is found is gathered in [`Findings`],
//! not asserted at once, so that one run reports everything.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::Value;

use crate::common::expected_status;
use crate::http::{get_json, list_payments, sim_list};
use crate::load::{OpRecord, Record};
use crate::operations::{answer_names_operation, check_operations};
use crate::settings::API_KEY;

/// What the final check found.
#[derive(Default, Debug)]
pub struct Findings {
    pub payments: usize,
    pub charges: usize,
    pub pending: Vec<String>,
    pub mismatches: Vec<String>,
    pub double_charges: Vec<String>,
    pub lost: Vec<String>,
    pub keys_split: Vec<String>,
    pub review: Vec<String>,
    /// Captures and refunds of ours, and of the provider's.
    pub operations: usize,
    pub provider_operations: usize,
    pub reversed: usize,
    /// Operations still `requested` or `pending`.
    pub open_operations: Vec<String>,
    /// Operations that disagree with the provider, or with what the clients were answered.
    pub operation_mismatches: Vec<String>,
    /// More than one provider operation under one key.
    pub double_operations: Vec<String>,
    /// Captures and refunds whose final answer was none or not one a client can expect.
    pub operation_answers: Vec<String>,
    /// Refunds reversed at the provider whose reversal we never heard of (its webhook lost): the
    /// settlement report leaves them to a person (an open `ambiguous` exception, the payment
    /// flagged), as docs/reconciliation.md says. Counted, and a failure with `CHAOS_STRICT=1`.
    pub unposted_reversals: Vec<String>,
    /// Adyen only: payments still `pending` past their expiry that the provider holds no charge
    /// for (their creation never reached it, and the sweep did not send it again before the
    /// expiry). Without a lookup they are concluded absent only once two days of reports were
    /// compared past it (`Capabilities::absence_confirmed_after`), so they rightly stay pending.
    pub absent_pending: Vec<String>,
    /// Adyen only: captures and refunds still `pending` that the provider decided as failed (a
    /// refusal, or a refund that failed after it succeeded) when every notification of it was
    /// dropped: no lookup and no report line can decide them (the report books no refusal and
    /// nets a failed refund to nothing), so past `--operation-pending-deadline` they are left to
    /// a person (an open `operation_unresolved` exception, the payment flagged), as
    /// docs/providers.md says. Counted, and a failure with `CHAOS_STRICT=1`.
    pub unresolved_operations: Vec<String>,
}

impl Findings {
    pub fn settled(&self) -> bool {
        self.pending.is_empty()
            && self.mismatches.is_empty()
            && self.double_charges.is_empty()
            && self.lost.is_empty()
            && self.keys_split.is_empty()
            && self.open_operations.is_empty()
            && self.operation_mismatches.is_empty()
            && self.double_operations.is_empty()
    }
}

/// `absence_unconfirmed`: the provider can conclude a charge absent only after days (Adyen), so
/// a payment past its expiry without any charge at the provider may stay pending.
pub async fn check(
    http: &reqwest::Client,
    base: &str,
    sim: &str,
    record: &Record,
    absence_unconfirmed: Option<Duration>,
) -> Findings {
    let mut findings = Findings::default();
    let charges = sim_list(http, sim, "charges").await;
    findings.charges = charges.len();
    let mut provider_ops: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut op_keys: BTreeMap<String, usize> = BTreeMap::new();
    for op in sim_list(http, sim, "operations").await {
        if !matches!(op["kind"].as_str(), Some("capture" | "refund")) {
            continue;
        }
        findings.provider_operations += 1;
        *op_keys
            .entry(
                op["idempotency_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
            .or_default() += 1;
        let charge = op["charge"].as_str().unwrap_or_default().to_owned();
        provider_ops.entry(charge).or_default().push(op);
    }
    for (key, count) in &op_keys {
        if *count > 1 {
            findings
                .double_operations
                .push(format!("{count} provider operations under key {key}"));
        }
    }
    let (status, exceptions) = get_json(
        http,
        &format!("{base}/v1/reconciliation/exceptions?status=open&limit=500"),
    )
    .await;
    assert_eq!(status, 200, "{exceptions}");
    let open_exceptions = exceptions
        .as_array()
        .or(exceptions["data"].as_array())
        .cloned()
        .unwrap_or_default();
    let mut client_ops: BTreeMap<&str, Vec<&OpRecord>> = BTreeMap::new();
    for op in &record.ops {
        client_ops.entry(op.payment.as_str()).or_default().push(op);
        match &op.answer {
            Some(answer) if answer_names_operation(answer) => {}
            other => findings.operation_answers.push(format!(
                "{} {} of {}: final answer {other:?}",
                op.kind, op.key, op.payment
            )),
        }
    }
    let mut by_reference: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut charge_keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for charge in &charges {
        let reference = charge["reference"].as_str().unwrap_or_default().to_owned();
        if let Some(key) = charge["metadata"]["chaos_key"].as_str() {
            charge_keys
                .entry(key.to_owned())
                .or_default()
                .insert(reference.clone());
        }
        by_reference
            .entry(reference)
            .or_default()
            .push(charge.clone());
    }
    for (reference, list) in &by_reference {
        if list.len() > 1 {
            findings
                .double_charges
                .push(format!("{reference}: {} charges", list.len()));
        }
    }
    for (key, references) in &charge_keys {
        if references.len() > 1 {
            findings
                .double_charges
                .push(format!("key {key}: charged for payments {references:?}"));
        }
    }

    // Every payment we know of: listed, named by an answer, or charged at the provider.
    let listed = list_payments(http, base).await;
    let mut ids: BTreeSet<String> = listed
        .iter()
        .filter_map(|payment| payment["id"].as_str().map(str::to_owned))
        .collect();
    let mut payments_by_key: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (key, named) in &record.ids {
        if named.len() != 1 {
            findings
                .keys_split
                .push(format!("key {key}: 2xx answers named {named:?}"));
        }
        ids.extend(named.iter().cloned());
        payments_by_key
            .entry(key.clone())
            .or_default()
            .extend(named.iter().cloned());
    }
    ids.extend(by_reference.keys().filter(|r| !r.is_empty()).cloned());
    findings.payments = ids.len();

    for id in &ids {
        let (status, payment) = get_json(http, &format!("{base}/v1/payments/{id}")).await;
        if status != 200 {
            findings.lost.push(format!(
                "{id}: {status} {payment} (charge: {:?})",
                by_reference.get(id)
            ));
            continue;
        }
        if let Some(key) = payment["metadata"]["chaos_key"].as_str() {
            payments_by_key
                .entry(key.to_owned())
                .or_default()
                .insert(id.clone());
        }
        if payment["needs_review"].as_bool() == Some(true) {
            findings.review.push(id.clone());
        }
        let have = (
            payment["status"].as_str().unwrap_or_default().to_owned(),
            payment["captured_minor"].as_i64().unwrap_or_default(),
            payment["refunded_minor"].as_i64().unwrap_or_default(),
        );
        if matches!(have.0.as_str(), "pending" | "requires_action") {
            // Past its expiry (created + the pending timeout), so the sweep sends it no more.
            let expired = absence_unconfirmed.is_some_and(|pending_timeout| {
                payment["created_at"]
                    .as_str()
                    .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
                    .is_some_and(|at| {
                        let age = chrono::Utc::now().signed_duration_since(at);
                        age.to_std().is_ok_and(|age| age > pending_timeout)
                    })
            });
            if have.0 == "pending" && expired && !by_reference.contains_key(id) {
                findings.absent_pending.push(id.clone());
            } else {
                findings.pending.push(id.clone());
            }
            continue;
        }
        let charge = by_reference.get(id).and_then(|list| list.first());
        let unposted = check_operations(
            id,
            &payment,
            charge,
            &provider_ops,
            client_ops.get(id.as_str()).map_or(&[][..], Vec::as_slice),
            &open_exceptions,
            &mut findings,
        );
        match charge {
            Some(charge) => {
                let mut want = (
                    expected_status(charge).to_owned(),
                    charge["amount_captured"].as_i64().unwrap_or_default(),
                    charge["amount_refunded"].as_i64().unwrap_or_default(),
                );
                if unposted > 0 {
                    // Our books still count the reversed refund (documented above).
                    want.0.clone_from(&have.0);
                    want.2 += unposted;
                }
                if want != have {
                    findings
                        .mismatches
                        .push(format!("{id}: provider says {want:?}, we say {have:?}"));
                }
            }
            None => {
                // Never charged: it must have ended without money moving.
                if !matches!(have.0.as_str(), "failed" | "expired") || have.1 != 0 {
                    findings
                        .mismatches
                        .push(format!("{id}: no charge at the provider, we say {have:?}"));
                }
            }
        }
    }
    for (key, payments) in &payments_by_key {
        if payments.len() > 1 {
            findings
                .keys_split
                .push(format!("key {key}: payments {payments:?}"));
        }
    }
    for (key, answer) in &record.refused {
        findings.lost.push(format!("key {key} refused: {answer}"));
    }
    for key in &record.unfinished {
        findings
            .lost
            .push(format!("key {key}: no final answer in time"));
    }
    findings
}

/// Every exception of the tenant, open and resolved, counted by kind, resolution and status.
pub async fn exception_counts(http: &reqwest::Client, base: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for status in ["open", "resolved"] {
        let (_, listed) = get_json(
            http,
            &format!("{base}/v1/reconciliation/exceptions?status={status}&limit=500"),
        )
        .await;
        for exception in listed
            .as_array()
            .or(listed["data"].as_array())
            .into_iter()
            .flatten()
        {
            let name = format!(
                "{}/{}/{status}",
                exception["kind"].as_str().unwrap_or("?"),
                exception["resolution"].as_str().unwrap_or("?")
            );
            *counts.entry(name).or_default() += 1;
        }
    }
    counts
}

/// Every key that got a 2xx replays the same payment: each key is sent again with its body until
/// it gets an answer that is neither 409 nor 5xx (50 tries); the keys whose answer named another
/// payment, or none.
pub async fn replay_keys(http: &reqwest::Client, base: &str, record: &Record) -> Vec<String> {
    let mut replay_mismatches = Vec::new();
    for (key, named) in &record.ids {
        let body = &record.bodies[key];
        let mut answer = None;
        for _ in 0..50 {
            let sent = http
                .post(format!("{base}/v1/payments"))
                .bearer_auth(API_KEY)
                .header("idempotency-key", key)
                .json(body)
                .send()
                .await;
            if let Ok(response) = sent {
                let status = response.status().as_u16();
                if status != 409 && status < 500 {
                    let value: Value = response.json().await.unwrap_or(Value::Null);
                    answer = Some((status, value));
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        match answer {
            Some((status, value))
                if (200..300).contains(&status)
                    && named.contains(value["id"].as_str().unwrap_or_default()) => {}
            other => replay_mismatches.push(format!("key {key}: {named:?} then {other:?}")),
        }
    }
    replay_mismatches
}
