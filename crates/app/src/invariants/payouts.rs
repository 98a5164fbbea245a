//! The payout checks of `asiento verify`, tallied while the log is read in order (a payment's
//! clearing legs and payout lines in the pass of its stream, a payout's own findings in its own:
//! `scan.rs`):
//!
//! - `payout_share`: each payout's entries are its lines, per tenant (`psp:{provider}:clearing`
//!   +share, `bank:{provider}:payouts` −share), its lines, unattributed part and other tenant
//!   cells' part add up to its amount, and a payout that failed after it was paid has every
//!   share reversed exactly once, in the cell its tenant is in when it failed; a share moved in
//!   from another cell has its entries with it, and one moved out is what its lines make;
//! - `payout_clearing`: once a payment's payout lines add up to everything the provider held
//!   for it (`provider_net_minor`, read when the payout was posted, where our books agreed at
//!   `agreed_at_version`), its clearing legs up to that version and those lines net to zero:
//!   the clearing account's share the payouts covered is gone from it.

use std::collections::{BTreeMap, HashMap};

use asiento_domain::payout::{PayoutEvent, PayoutLine};
use asiento_domain::{JournalEntry, PaymentId, TenantId};

use super::scan::Share;
use super::{Check, Report};

/// A payout's lines as a pass keeps them: their sums per tenant, and the lines of the share's
/// payments (a failure takes them back from what was paid out). Not the lines themselves: a
/// payout names thousands of payments, and every pass reads every payout.
#[derive(Default)]
struct LinesKept {
    by_tenant: BTreeMap<TenantId, i128>,
    in_share: Vec<(PaymentId, i128)>,
}

#[derive(Default)]
struct PayoutSeen {
    paid: Option<LinesKept>,
    failed: bool,
    /// Clearing legs of the payout's entries per tenant: shares, and reversals of shares.
    posted: BTreeMap<TenantId, i128>,
    reversed: BTreeMap<TenantId, i128>,
    /// Lines of shares moved in, per tenant, and whether each came reversed.
    moved_in: BTreeMap<TenantId, (LinesKept, bool)>,
    /// Shares moved out: what each says its lines make, and whether it left before the failure.
    moved_out: BTreeMap<TenantId, (i128, bool)>,
}

fn net_of(lines: &[PayoutLine]) -> i128 {
    lines
        .iter()
        .map(|line| i128::from(line.net_minor.minor()))
        .sum()
}

#[derive(Default)]
pub(super) struct PayoutTally {
    /// A payment's clearing legs summed at each version that posted one, in order.
    clearing: HashMap<PaymentId, Vec<(u64, i128)>>,
    /// Every payout line of a payment that stands (its payout not failed), summed.
    paid_out: HashMap<PaymentId, i128>,
    payouts: BTreeMap<String, PayoutSeen>,
}

fn clearing_legs(entry: &JournalEntry) -> i128 {
    entry
        .legs()
        .iter()
        .filter(|leg| {
            let name = leg.account.as_str();
            name.starts_with("psp:") && name.ends_with(":clearing")
        })
        .map(|leg| i128::from(leg.amount.minor()))
        .sum()
}

impl PayoutTally {
    pub(super) fn payment_entry(&mut self, payment: PaymentId, version: u64, entry: &JournalEntry) {
        let sums = self.clearing.entry(payment).or_default();
        let before = sums.last().map_or(0, |(_, sum)| *sum);
        // Most payments post one or two entries: no room kept for more.
        sums.reserve_exact(1);
        sums.push((version, before + clearing_legs(entry)));
    }

    /// The payment's clearing legs summed up to `version`.
    fn clearing_at(&self, payment: PaymentId, version: u64) -> i128 {
        self.clearing.get(&payment).map_or(0, |sums| {
            sums.iter()
                .take_while(|(at, _)| *at <= version)
                .last()
                .map_or(0, |(_, sum)| *sum)
        })
    }

    pub(super) fn payout_event(
        &mut self,
        stream_id: &str,
        event: &PayoutEvent,
        share: &Share,
        report: &mut Report,
    ) {
        // The payout's own findings are named in its stream's pass; a line is tallied in its
        // payment's (`scan.rs`).
        let named = share.holds(stream_id);
        match event {
            PayoutEvent::PayoutPaid(paid) => {
                let lines = net_of(&paid.lines);
                let unattributed = i128::from(paid.unattributed_minor.minor());
                let elsewhere = i128::from(paid.elsewhere_minor.minor());
                if named
                    && lines + unattributed + elsewhere != i128::from(paid.amount_minor.minor())
                {
                    report.push(
                        Check::PayoutShare,
                        stream_id,
                        format!(
                            "lines of {lines}, {unattributed} unattributed and {elsewhere} of other cells do not make its amount of {}",
                            paid.amount_minor.minor()
                        ),
                    );
                }
                let kept = self.keep_lines(stream_id, &paid.lines, true, share, report);
                self.seen(stream_id).paid = Some(kept);
            }
            PayoutEvent::PayoutShareMovedIn(moved) => {
                if named && moved.lines.iter().any(|line| line.tenant != moved.tenant) {
                    report.push(
                        Check::PayoutShare,
                        stream_id,
                        format!(
                            "the share of {} moved in has lines of other tenants",
                            moved.tenant
                        ),
                    );
                }
                // Reversed in the old cell already: no longer paid out.
                let kept = self.keep_lines(stream_id, &moved.lines, !moved.reversed, share, report);
                self.seen(stream_id)
                    .moved_in
                    .insert(moved.tenant.clone(), (kept, moved.reversed));
            }
            PayoutEvent::PayoutShareMovedOut(moved) => {
                let seen = self.seen(stream_id);
                let before_failure = !seen.failed;
                seen.moved_out.insert(
                    moved.tenant.clone(),
                    (i128::from(moved.net_minor.minor()), before_failure),
                );
            }
            PayoutEvent::PayoutFailed(_) => {
                let seen = self.payouts.entry(stream_id.to_owned()).or_default();
                seen.failed = true;
                let standing = seen
                    .moved_in
                    .values()
                    .filter(|(_, reversed)| !reversed)
                    .map(|(kept, _)| kept);
                for (payment, net) in seen
                    .paid
                    .iter()
                    .chain(standing)
                    .flat_map(|kept| &kept.in_share)
                {
                    *self.paid_out.entry(*payment).or_default() -= net;
                }
            }
            PayoutEvent::EntryPosted(posted) => {
                let seen = self.seen(stream_id);
                let sums = if posted.entry.reverses().is_some() {
                    &mut seen.reversed
                } else {
                    &mut seen.posted
                };
                *sums.entry(posted.entry.tenant().clone()).or_default() +=
                    clearing_legs(&posted.entry);
            }
        }
    }

    /// What a pass keeps of a payout's `lines`; the share's lines are paid out if they `stand`.
    fn keep_lines(
        &mut self,
        stream_id: &str,
        lines: &[PayoutLine],
        stand: bool,
        share: &Share,
        report: &mut Report,
    ) -> LinesKept {
        let mut kept = LinesKept::default();
        for line in lines {
            let net = i128::from(line.net_minor.minor());
            *kept.by_tenant.entry(line.tenant.clone()).or_default() += net;
            if share.holds_payment(line.payment) {
                kept.in_share.push((line.payment, net));
                if stand {
                    self.line_paid_out(stream_id, line, report);
                }
            }
        }
        kept
    }

    /// A payout line that stands: the payment's paid-out sum grows, and once it is everything
    /// the provider held for the payment, its clearing legs up to the agreed version must be gone.
    fn line_paid_out(&mut self, stream_id: &str, line: &PayoutLine, report: &mut Report) {
        let paid_out = self.paid_out.entry(line.payment).or_default();
        *paid_out += i128::from(line.net_minor.minor());
        let paid_out = *paid_out;
        let Some(version) = line.agreed_at_version else {
            return;
        };
        if paid_out != i128::from(line.provider_net_minor.minor()) {
            return;
        }
        let clearing = self.clearing_at(line.payment, version);
        if clearing + paid_out != 0 {
            report.push(
                Check::PayoutClearing,
                line.payment.to_string(),
                format!(
                    "paid out in full ({paid_out}, last by {stream_id}) but its clearing legs up to version {version} sum to {clearing}, not {}",
                    -paid_out
                ),
            );
        }
    }

    fn seen(&mut self, stream_id: &str) -> &mut PayoutSeen {
        self.payouts.entry(stream_id.to_owned()).or_default()
    }

    /// The payouts of `share`, each against its own entries.
    pub(super) fn report(self, share: &Share, report: &mut Report) {
        for (stream_id, seen) in self.payouts {
            if !share.holds(&stream_id) {
                continue;
            }
            let mut shares: BTreeMap<TenantId, i128> = BTreeMap::new();
            let moved_in = seen.moved_in.values().map(|(kept, _)| kept);
            for (tenant, net) in seen
                .paid
                .iter()
                .chain(moved_in)
                .flat_map(|kept| &kept.by_tenant)
            {
                *shares.entry(tenant.clone()).or_default() += net;
            }
            for (tenant, (net, _)) in &seen.moved_out {
                let lines = shares.get(tenant).copied().unwrap_or(0);
                if lines != *net {
                    report.push(
                        Check::PayoutShare,
                        &stream_id,
                        format!("the share of {tenant} moved out says {net}, its lines here make {lines}"),
                    );
                }
            }
            shares.retain(|_, share| *share != 0);
            if seen.posted != shares {
                report.push(
                    Check::PayoutShare,
                    &stream_id,
                    format!(
                        "its entries move {:?} from clearing, its lines say {shares:?}",
                        seen.posted
                    ),
                );
            }
            // A share is reversed when the payout failed while its tenant was here, or when it
            // moved in reversed.
            let reversed: BTreeMap<TenantId, i128> = seen
                .posted
                .iter()
                .filter(|(tenant, _)| {
                    let left_before = seen
                        .moved_out
                        .get(*tenant)
                        .is_some_and(|(_, before)| *before);
                    let came_reversed = seen
                        .moved_in
                        .get(*tenant)
                        .is_some_and(|(_, reversed)| *reversed);
                    seen.failed && !left_before || came_reversed
                })
                .map(|(tenant, share)| (tenant.clone(), -share))
                .collect();
            if seen.reversed != reversed {
                report.push(
                    Check::PayoutShare,
                    &stream_id,
                    format!(
                        "its reversals move {:?} back to clearing, {} says {reversed:?}",
                        seen.reversed,
                        if seen.failed {
                            "its failure"
                        } else {
                            "a payout that did not fail"
                        }
                    ),
                );
            }
        }
    }
}
