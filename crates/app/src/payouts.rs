//! Posting a provider's payouts: the payout read as it stands (a webhook names it, or the sweep
//! finds it in a report window), its covered transactions attributed to our payments, each of
//! those payments brought up to date with the charge the payout read, and the payout's stream
//! appended at the version it was read at (`asiento_domain::payout`). Called again for the same
//! payout, it finds nothing to do.

use std::collections::{BTreeMap, HashMap};

use asiento_domain::exception::{ExceptionRecorded, Resolution};
use asiento_domain::payout::{self, PayoutEvent, PayoutFact, PayoutId, PayoutLine};
use asiento_domain::{
    payout_stream, Amount, Currency, ExceptionId, ExceptionKind, PaymentId, ProviderName, TenantId,
};
use asiento_eventstore::{EventStore, Metadata, StreamAppend};
use asiento_psp::{Charge, DisputeStatus, Payout, PayoutStatus};
use serde_json::json;

use crate::exceptions::{self, ExceptionError};
use crate::facts::{self, Read};
use crate::leases::{self, LeaseError};
use crate::log::{self, LogError};
use crate::payments::{Finalize, FlowError, PaymentFlow};

/// Writers racing on one payout stream are at most the webhook worker and the sweep.
const APPEND_ATTEMPTS_MAX: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum PayoutError {
    #[error("the provider's payout does not read as one: {0}")]
    Invalid(String),
    #[error("payout {payout}: {rejection}")]
    Rejected {
        payout: String,
        rejection: payout::PayoutRejection,
    },
    #[error("payment {0} is held by another worker; the payout is posted later")]
    PaymentBusy(PaymentId),
    #[error("tenant {0} is paused for a move; payouts are posted once no tenant is")]
    TenantPaused(TenantId),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Flow(#[from] FlowError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Exception(#[from] ExceptionError),
}

/// What posting one payout did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    /// The payout's fact is recorded with its entries.
    Recorded,
    /// The log already says what the provider says.
    Already,
    /// The payout is not final yet (pending, in transit): nothing to post.
    NotFinal,
}

/// What the provider holds for a charge, all its balance transactions together: captured,
/// less refunded, less an open or lost dispute's withdrawal, less the provider's fees.
fn provider_net(charge: &Charge) -> Result<i64, PayoutError> {
    let disputed = match &charge.dispute {
        Some(dispute) if dispute.status != DisputeStatus::Won => dispute.amount_minor,
        _ => 0,
    };
    let mut out = summed(charge.amount_refunded, disputed)?;
    for fee in &charge.provider_fees {
        out = summed(out, fee.fee_minor)?;
    }
    summed(
        charge.amount_captured,
        out.checked_neg().unwrap_or(i64::MAX),
    )
}

/// `a + b` of the provider's amounts, refused when it does not fit.
fn summed(a: i64, b: i64) -> Result<i64, PayoutError> {
    a.checked_add(b)
        .ok_or_else(|| PayoutError::Invalid(format!("the payout's amounts overflow at {a} + {b}")))
}

/// Posts `payout`, read from `provider` as it stands.
pub async fn post(
    flow: &PaymentFlow,
    provider: &ProviderName,
    payout: &Payout,
) -> Result<Posted, PayoutError> {
    let id = PayoutId::parse(&payout.id).map_err(|e| PayoutError::Invalid(e.to_string()))?;
    let fact = match payout.status {
        PayoutStatus::Paid => paid_fact(flow, provider, payout).await?,
        PayoutStatus::Failed | PayoutStatus::Canceled => PayoutFact::Failed {
            failure_code: payout.failure_code.clone(),
        },
        PayoutStatus::Pending | PayoutStatus::InTransit | PayoutStatus::Other => {
            return Ok(Posted::NotFinal)
        }
    };
    let unattributed = match &fact {
        PayoutFact::Paid { unattributed, .. } => *unattributed,
        PayoutFact::Failed { .. } => Amount::ZERO,
    };
    let stream_id = payout_stream(provider, &id);
    let mut recorded = None;
    for _ in 0..APPEND_ATTEMPTS_MAX {
        let loaded = log::load_payout(flow.store.as_ref(), provider, &id).await?;
        let events = payout::decide(
            &loaded.aggregate,
            provider,
            &id,
            fact.clone(),
            flow.clock.now(),
        )
        .map_err(|rejection| PayoutError::Rejected {
            payout: payout.id.clone(),
            rejection,
        })?;
        if events.is_empty() {
            return Ok(Posted::Already);
        }
        let append = StreamAppend {
            stream_id: stream_id.clone(),
            expected: log::expected(loaded.aggregate.version),
            events: log::encode(&events, &Metadata::default(), log::payout_codec)?,
        };
        match flow.store.append(&[append]).await {
            Ok(_) => {
                recorded = Some(events);
                break;
            }
            // Another worker wrote the payout meanwhile: decided again on what it wrote.
            Err(error) if log::is_conflict(&error) => {}
            Err(error) => return Err(FlowError::Append(error).into()),
        }
    }
    let Some(events) = recorded else {
        return Err(FlowError::Inconsistent(format!(
            "payout {} kept losing races to other writers",
            payout.id
        ))
        .into());
    };
    if unattributed != Amount::ZERO {
        record_unattributed(flow, provider, payout, unattributed).await?;
    }
    if events
        .iter()
        .any(|event| matches!(event, PayoutEvent::PayoutPaid(_)))
    {
        tracing::info!(%provider, payout = %payout.id, amount = payout.amount_minor, "payout posted");
    } else {
        tracing::warn!(%provider, payout = %payout.id, "payout failed; its postings are reversed");
    }
    Ok(Posted::Recorded)
}

/// One log of a tenant move: its event store and its cell's name.
pub struct CellLog<'a> {
    pub store: &'a dyn EventStore,
    pub cell: &'a str,
}

/// Carries `tenant`'s share of one posted payout from the log of the cell it moves out of to
/// the log of the cell it moves to (`asiento cells move`): the share's lines and entries into
/// the new cell's payout stream, then its moving out into the old cell's. Run again after a cut,
/// it finishes what is missing; `false` when the old log holds no share of the tenant's there.
pub async fn move_share(
    from: &CellLog<'_>,
    to: &CellLog<'_>,
    provider: &ProviderName,
    id: &PayoutId,
    tenant: &TenantId,
    at: chrono::DateTime<chrono::Utc>,
) -> Result<bool, PayoutError> {
    let rejected = |rejection| PayoutError::Rejected {
        payout: id.to_string(),
        rejection,
    };
    let source = log::load_payout(from.store, provider, id).await?;
    let Some(share) = source.aggregate.share_of(tenant) else {
        return Ok(source.aggregate.moved_out.contains_key(tenant));
    };
    // The new cell's workers may post the payout meanwhile: decided again on what they wrote.
    for attempt in 1..=APPEND_ATTEMPTS_MAX {
        let target = log::load_payout(to.store, provider, id).await?;
        let events = payout::move_in(
            &target.aggregate,
            provider,
            id,
            tenant,
            from.cell,
            share.clone(),
            at,
        )
        .map_err(rejected)?;
        if appended(to.store, provider, id, target.aggregate.version, &events).await? {
            break;
        }
        if attempt == APPEND_ATTEMPTS_MAX {
            return Err(FlowError::Inconsistent(format!(
                "payout {id} kept changing in cell {} while {tenant}'s share moved in",
                to.cell
            ))
            .into());
        }
    }
    let events =
        payout::move_out(&source.aggregate, provider, id, tenant, to.cell, at).map_err(rejected)?;
    if !appended(from.store, provider, id, source.aggregate.version, &events).await? {
        return Err(FlowError::Inconsistent(format!(
            "payout {id} changed in cell {} while {tenant}'s share moved out: run the move again",
            from.cell
        ))
        .into());
    }
    Ok(true)
}

/// Appends `events` to a payout's stream at `version`: `false` when another writer appended
/// there first.
async fn appended(
    store: &dyn EventStore,
    provider: &ProviderName,
    id: &PayoutId,
    version: u64,
    events: &[PayoutEvent],
) -> Result<bool, PayoutError> {
    if events.is_empty() {
        return Ok(true);
    }
    let append = StreamAppend {
        stream_id: payout_stream(provider, id),
        expected: log::expected(version),
        events: log::encode(events, &Metadata::default(), log::payout_codec)?,
    };
    match store.append(&[append]).await {
        Ok(_) => Ok(true),
        Err(error) if log::is_conflict(&error) => Ok(false),
        Err(error) => Err(FlowError::Append(error).into()),
    }
}

/// A paid payout's lines: its transactions grouped by our payment, each payment brought up to
/// date with its charge first, so that its clearing legs are what the payout read.
async fn paid_fact(
    flow: &PaymentFlow,
    provider: &ProviderName,
    payout: &Payout,
) -> Result<PayoutFact, PayoutError> {
    // While a tenant moves between cells, no cell posts a payout: which cell posts the tenant's
    // share (and which counts it as another cell's) changes with the move, so every cell posts
    // it on the same side of the move (`asiento cells move` carries the shares posted before).
    if let Some(tenant) = flow.paused().first() {
        return Err(PayoutError::TenantPaused(tenant.clone()));
    }
    let currency =
        Currency::parse(&payout.currency).map_err(|e| PayoutError::Invalid(e.to_string()))?;
    let charges: HashMap<&str, &Charge> = payout
        .charges
        .iter()
        .map(|charge| (charge.id.as_str(), charge))
        .collect();
    let mut covered: BTreeMap<PaymentId, (i64, Vec<String>, &Charge)> = BTreeMap::new();
    let mut unattributed: i64 = 0;
    // What other tenant cells' payments make of the payout: those cells post it.
    let mut elsewhere: i64 = 0;
    for txn in &payout.transactions {
        let charge = txn.charge_id.as_deref().and_then(|id| charges.get(id));
        let payment = charge.and_then(|charge| PaymentId::parse(charge.reference.as_deref()?).ok());
        match (charge, payment) {
            (Some(charge), Some(payment)) => {
                let line = covered.entry(payment).or_insert((0, Vec::new(), charge));
                line.0 = summed(line.0, txn.net_minor)?;
                line.1.push(txn.id.clone());
            }
            _ if flow.answers_for(None, None) => {
                unattributed = summed(unattributed, txn.net_minor)?;
            }
            _ => elsewhere = summed(elsewhere, txn.net_minor)?,
        }
    }
    let ids: Vec<PaymentId> = covered.keys().copied().collect();
    let loaded = log::load_payments(flow.store.as_ref(), &ids).await?;
    let mut ours = Vec::with_capacity(covered.len());
    for (payment, line) in covered {
        let record = loaded
            .get(&payment)
            .and_then(|loaded| loaded.aggregate.record.as_ref());
        if !flow.answers_for(Some(payment), record.map(|record| &record.tenant)) {
            elsewhere = summed(elsewhere, line.0)?;
            continue;
        }
        let Some(record) = record.filter(|record| &record.provider == provider) else {
            unattributed = summed(unattributed, line.0)?;
            continue;
        };
        if facts::charge_misfit(record, line.2).is_none() {
            bring_up_to_date(flow, payment, line.2).await?;
        }
        ours.push((payment, line));
    }
    // Read again after the updates: what our books hold for each payment, at which version.
    let ids: Vec<PaymentId> = ours.iter().map(|(payment, _)| *payment).collect();
    let updated = log::load_payments(flow.store.as_ref(), &ids).await?;
    let mut lines = Vec::with_capacity(ours.len());
    for (payment, (net, transactions, charge)) in ours {
        let Some((record, version)) = updated
            .get(&payment)
            .and_then(|loaded| Some((loaded.aggregate.record.as_ref()?, loaded.aggregate.version)))
        else {
            unattributed = summed(unattributed, net)?;
            continue;
        };
        let provider_net = Amount::new(provider_net(charge)?);
        let agreed = record.provider_holds().ok() == Some(provider_net);
        if !agreed {
            tracing::warn!(%payment, provider_net = provider_net.minor(), "our books for the payment disagree with what the provider holds for it");
        }
        lines.push(PayoutLine {
            payment,
            tenant: record.tenant.clone(),
            net_minor: Amount::new(net),
            provider_net_minor: provider_net,
            agreed_at_version: agreed.then_some(version),
            transactions,
        });
    }
    Ok(PayoutFact::Paid {
        currency,
        amount: Amount::new(payout.amount_minor),
        lines,
        unattributed: Amount::new(unattributed),
        elsewhere: Amount::new(elsewhere),
        created: payout.created,
    })
}

/// Applies what the payout's read of `charge` says to the payment, under its lease.
async fn bring_up_to_date(
    flow: &PaymentFlow,
    payment: PaymentId,
    charge: &Charge,
) -> Result<(), PayoutError> {
    let now_ms = flow.clock.now_ms();
    let Some(lease) =
        leases::acquire(&flow.database, payment, now_ms, flow.payment_lease_ms).await?
    else {
        return Err(PayoutError::PaymentBusy(payment));
    };
    let applied = flow
        .finalize(Finalize::facts(
            payment,
            facts::charge_facts(charge, Read::Snapshot),
        ))
        .await;
    if let Err(error) = leases::release(&flow.database, &lease).await {
        tracing::warn!(%payment, %error, "payment lease not released; it runs out");
    }
    applied?;
    Ok(())
}

async fn record_unattributed(
    flow: &PaymentFlow,
    provider: &ProviderName,
    payout: &Payout,
    unattributed: Amount,
) -> Result<(), PayoutError> {
    let kind = ExceptionKind::PayoutUnattributed;
    let recorded = ExceptionRecorded {
        exception_id: ExceptionId::derived(provider, &payout.id, kind, ""),
        tenant: None,
        payment_id: None,
        provider: provider.clone(),
        charge_id: Some(payout.id.clone()),
        kind,
        local: json!({"attributed_minor": payout.amount_minor - unattributed.minor()}),
        provider_state: json!({
            "payout": payout.id,
            "amount_minor": payout.amount_minor,
            "currency": payout.currency,
        }),
        difference: json!({"unattributed_minor": unattributed.minor()}),
        resolution: Resolution::Manual,
        at: flow.clock.now(),
    };
    if exceptions::record(&flow.database, flow.store.as_ref(), recorded).await? {
        tracing::error!(%provider, payout = %payout.id, unattributed = unattributed.minor(), "a payout paid out money of no payment of ours");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use chrono::Utc;

    use super::*;
    use asiento_psp::{ChargeStatus, Dispute, ProviderFee};

    #[test]
    fn a_charge_s_provider_net_is_what_its_balance_transactions_add_up_to() {
        let now = Utc::now();
        let mut charge = Charge {
            id: "pi_1".into(),
            status: ChargeStatus::Succeeded,
            amount_minor: 10_000,
            currency: "USD".into(),
            amount_captured: 10_000,
            amount_refunded: 2_500,
            reference: None,
            idempotency_key: "k".into(),
            payment_method: "pm_card_visa".into(),
            capture: true,
            failure_code: None,
            next_action: None,
            dispute: None,
            metadata: Default::default(),
            provider_fees: vec![ProviderFee {
                transaction_id: "txn_1".into(),
                fee_minor: 320,
            }],
            created: now,
            updated: now,
        };
        assert_eq!(provider_net(&charge).unwrap(), 10_000 - 2_500 - 320);
        let dispute = |status| Dispute {
            status,
            amount_minor: 7_500,
            created: now,
            closed: None,
            id: None,
            reinstated: false,
        };
        charge.provider_fees.push(ProviderFee {
            transaction_id: "txn_dw_1".into(),
            fee_minor: 1_500,
        });
        charge.dispute = Some(dispute(DisputeStatus::Open));
        assert_eq!(
            provider_net(&charge).unwrap(),
            10_000 - 2_500 - 320 - 7_500 - 1_500
        );
        charge.dispute = Some(dispute(DisputeStatus::Lost));
        assert_eq!(
            provider_net(&charge).unwrap(),
            10_000 - 2_500 - 320 - 7_500 - 1_500
        );
        charge.dispute = Some(dispute(DisputeStatus::Won));
        assert_eq!(provider_net(&charge).unwrap(), 10_000 - 2_500 - 320 - 1_500);
    }
}
