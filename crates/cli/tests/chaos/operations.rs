//! The check of one payment's captures and refunds: ours against the provider's (matched by the
//! provider key we send each under) and against what the clients were answered. Every operation
//! ends closed and agrees with the provider, refunded amounts agree on both sides, and a client
//! answered for an operation finds exactly one. A refund the provider reversed without our
//! hearing of it, and an Adyen operation nothing can decide, pass only when the report has left
//! them to a person, and are counted.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::checks::Findings;
use crate::load::OpRecord;

/// The simulator's `failure_reason` of a refund that failed after succeeding.
const REVERSAL_REASON: &str = "expired_or_canceled_card";

/// The provider key of one of our operations (`app`'s `psp_capture_key` / `psp_refund_key`).
fn psp_operation_key(payment: &str, kind: &str, sequence: i64) -> String {
    let uuid = payment.strip_prefix("pay_").unwrap_or(payment);
    match (kind, sequence) {
        ("capture", ..=1) => format!("psp_{uuid}_capture"),
        ("capture", _) => format!("psp_{uuid}_capture_{sequence}"),
        _ => format!("psp_{uuid}_{kind}_{sequence}"),
    }
}

/// A client's final answer to a capture or refund counts as one operation of the payment: a 2xx,
/// or the provider's refusal (422 `capture_refused` / `refund_refused`, the operation recorded
/// as refused).
pub fn answer_names_operation(answer: &(u16, String)) -> bool {
    (200..300).contains(&answer.0) || (answer.0 == 422 && answer.1.ends_with("_refused"))
}

/// One payment's captures and refunds against the provider's and against the clients' answers:
/// each closed, each provider operation one of ours, the same outcome on both sides, refunded
/// amounts equal (a reversed refund counts on neither side), and one operation per key a client
/// was answered for.
///
/// Answers the refunded amount that differs for a documented reason: refunds the provider
/// reversed without our hearing of it, once the report has left them to a person.
pub fn check_operations(
    id: &str,
    payment: &Value,
    charge: Option<&Value>,
    provider: &BTreeMap<String, Vec<Value>>,
    client_ops: &[&OpRecord],
    open_exceptions: &[Value],
    findings: &mut Findings,
) -> i64 {
    let ours = payment["operations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    findings.operations += ours.len();
    let mut by_key: BTreeMap<String, &Value> = BTreeMap::new();
    for op in &ours {
        let kind = op["kind"].as_str().unwrap_or_default();
        let sequence = op["sequence"].as_i64().unwrap_or_default();
        let state = op["state"].as_str().unwrap_or_default();
        if state == "reversed" {
            findings.reversed += 1;
        }
        by_key.insert(psp_operation_key(id, kind, sequence), op);
    }
    let theirs: BTreeMap<String, &Value> = charge
        .and_then(|charge| charge["id"].as_str())
        .and_then(|charge| provider.get(charge))
        .into_iter()
        .flatten()
        .filter(|op| matches!(op["kind"].as_str(), Some("capture" | "refund")))
        .map(|op| {
            let key = op["idempotency_key"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (key, op)
        })
        .collect();
    let unresolved_for_a_person = payment["needs_review"] == true
        && open_exceptions.iter().any(|exception| {
            exception["payment_id"] == id && exception["kind"] == "operation_unresolved"
        });
    for (key, op) in &by_key {
        let state = op["state"].as_str().unwrap_or_default();
        let failed_there = theirs.get(key).is_some_and(|op| op["status"] == "failed");
        // Only the Adyen campaign's deadline is short enough to raise that exception.
        if state == "pending" && failed_there && unresolved_for_a_person {
            findings.unresolved_operations.push(format!(
                "{id}: {} {} pending, failed at the provider, left to a manual exception",
                op["kind"], op["sequence"]
            ));
        } else if matches!(state, "requested" | "pending") {
            findings.open_operations.push(format!(
                "{id}: {} {} is {state} (the provider's: {:?})",
                op["kind"],
                op["sequence"],
                theirs
                    .get(key)
                    .map(|op| (&op["id"], &op["status"], &op["failure_reason"]))
            ));
        }
    }
    for (key, op) in &theirs {
        if !by_key.contains_key(key) && op["status"] != "failed" {
            findings.operation_mismatches.push(format!(
                "{id}: the provider's {} {} ({key}, {}, {}) is none of ours",
                op["kind"], op["id"], op["amount_minor"], op["status"]
            ));
        }
    }
    // A refund the provider reversed whose news never came: a person's, once the report has
    // raised it (an open `ambiguous` exception of this payment, the payment flagged).
    let left_to_a_person = payment["needs_review"] == true
        && open_exceptions
            .iter()
            .any(|exception| exception["payment_id"] == id && exception["kind"] == "ambiguous");
    let mut unposted = 0;
    let mut refunded_ours = 0;
    let mut refunded_theirs = 0;
    for (key, op) in &by_key {
        let state = op["state"].as_str().unwrap_or_default();
        let at_provider = theirs.get(key);
        let status = at_provider.and_then(|op| op["status"].as_str());
        let reversed_there = at_provider.is_some_and(|theirs| {
            theirs["status"] == "failed" && theirs["failure_reason"] == REVERSAL_REASON
        });
        if op["kind"] == "refund" && state == "succeeded" && reversed_there && left_to_a_person {
            let amount = op["amount_minor"].as_i64().unwrap_or_default();
            unposted += amount;
            findings.unposted_reversals.push(format!(
                "{id}: refund {} ({amount}) reversed at the provider, left to a manual exception",
                op["sequence"]
            ));
            refunded_ours += amount;
            continue;
        }
        let agrees = match state {
            "succeeded" => {
                status == Some("succeeded")
                    && at_provider.map(|theirs| &theirs["amount_minor"])
                        == Some(&op["amount_minor"])
            }
            "reversed" => status == Some("failed"),
            "refused" => matches!(status, None | Some("failed")),
            // Open: reported above; the comparison waits for its outcome.
            _ => true,
        };
        if !agrees {
            findings.operation_mismatches.push(format!(
                "{id}: our {} {} is {state}, the provider's is {:?}",
                op["kind"],
                op["sequence"],
                at_provider.map(|op| (&op["id"], &op["status"], &op["amount_minor"]))
            ));
        }
        if op["kind"] == "refund" && state == "succeeded" {
            refunded_ours += op["amount_minor"].as_i64().unwrap_or_default();
        }
    }
    for op in theirs.values() {
        if op["kind"] == "refund" && op["status"] == "succeeded" {
            refunded_theirs += op["amount_minor"].as_i64().unwrap_or_default();
        }
    }
    let refunded = payment["refunded_minor"].as_i64().unwrap_or_default();
    if refunded_ours != refunded || refunded_theirs + unposted != refunded {
        findings.operation_mismatches.push(format!(
            "{id}: refunded {refunded}; our succeeded refunds sum to {refunded_ours}, the \
             provider's to {refunded_theirs}"
        ));
    }
    for kind in ["capture", "refund"] {
        let mine: Vec<&&OpRecord> = client_ops.iter().filter(|op| op.kind == kind).collect();
        let named = mine
            .iter()
            .filter(|op| op.answer.as_ref().is_some_and(answer_names_operation))
            .count();
        let definite = mine
            .iter()
            .filter(|op| {
                op.answer.as_ref().is_some_and(|(status, _)| {
                    (kind == "capture" && *status == 200) || (kind == "refund" && *status == 201)
                })
            })
            .count();
        let of_kind: Vec<&Value> = ours.iter().filter(|op| op["kind"] == kind).collect();
        let done = of_kind
            .iter()
            .filter(|op| matches!(op["state"].as_str(), Some("succeeded" | "reversed")))
            .count();
        if of_kind.len() != named || done < definite {
            findings.operation_mismatches.push(format!(
                "{id}: clients were answered for {named} {kind}(s) ({definite} definite), the \
                 payment has {} ({done} succeeded or reversed)",
                of_kind.len()
            ));
        }
    }
    unposted
}
