//! Payouts: the provider paying what it holds for us into our bank account.
//!
//! A provider pays out many payments of many tenants at once (Stripe: every balance
//! transaction not yet paid out, per currency). A payout is a stream of its own,
//! `payout-{provider}:{payout id}`, because it belongs to no single payment. When the provider
//! says it is paid, [`PayoutPaid`] records what it covered, one [`PayoutLine`] per payment, and
//! posts one entry per tenant: its share moves from `psp:{provider}:clearing` to
//! `bank:{provider}:payouts`, so the clearing account keeps only what the provider still owes.
//! A payout that fails after it was paid (the bank refused it) puts the money back: its entries
//! are reversed. A payout that fails before it was paid posts nothing.
//!
//! A payout's facts are read as they stand at the provider (events are hints), so a late
//! `paid` after `failed` changes nothing, and a repeated one finds nothing to do.
//!
//! In a deployment of tenant cells each cell's log holds its own part of a payout: its own
//! tenants' lines, and what other cells' payments make of the amount as `elsewhere_minor`. A
//! tenant moved to another cell (`asiento cells move`) takes its share of each payout posted
//! before the move with it: the old cell's stream records [`PayoutShareMovedOut`] (the lines and
//! entries stay there, frozen, and a later failure of the payout reverses the share in the new
//! cell, not there); the new cell's stream records [`PayoutShareMovedIn`] with the share's lines
//! and the share's entries as they were posted, and a later `PayoutPaid` there leaves that
//! tenant's lines to the share moved in.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::account::AccountName;
use crate::entry::{EntryError, JournalEntry, Leg};
use crate::ids::{EntryId, PaymentId, ProviderName, TenantId};
use crate::money::{Amount, AmountError, Currency};
use crate::payment::EntryPosted;

/// A provider's id is at most this long.
pub const PAYOUT_ID_CHARS_MAX: usize = 255;
/// A payout names at most this many payments; a larger one is split by the provider's
/// schedule long before (and would not fit one append).
pub const PAYOUT_LINES_MAX: usize = 10_000;

/// The provider's id of a payout (`po_…`): ASCII letters, digits, `_` and `-`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PayoutId(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "payout id {0:?} must be 1 to {PAYOUT_ID_CHARS_MAX} characters from A-Z, a-z, 0-9, '_' and '-'"
)]
pub struct PayoutIdError(String);

impl PayoutId {
    pub fn parse(id: &str) -> Result<Self, PayoutIdError> {
        let valid = !id.is_empty()
            && id.len() <= PAYOUT_ID_CHARS_MAX
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if valid {
            Ok(PayoutId(id.to_owned()))
        } else {
            Err(PayoutIdError(id.to_owned()))
        }
    }

    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PayoutId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for PayoutId {
    type Error = PayoutIdError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        PayoutId::parse(&value)
    }
}

impl From<PayoutId> for String {
    fn from(value: PayoutId) -> String {
        value.0
    }
}

/// What a payout paid out of one payment's money.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayoutLine {
    pub payment: PaymentId,
    pub tenant: TenantId,
    /// The sum of the nets of the payment's balance transactions this payout covered (negative
    /// when its refunds outweigh what it brought in).
    pub net_minor: Amount,
    /// Everything the provider holds for the payment, all its balance transactions, as read
    /// when the payout was applied.
    pub provider_net_minor: Amount,
    /// The payment's stream version at which our books held exactly `provider_net_minor` for
    /// it (`PaymentRecord::provider_holds`), `None` when they did not. Once the payment's payout
    /// lines add up to it, its clearing legs up to that version and those lines net to zero
    /// (`asiento verify` checks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreed_at_version: Option<u64>,
    /// The provider's balance transactions (`txn_…`) the line covers.
    pub transactions: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PayoutPaid {
    pub provider: ProviderName,
    pub payout_id: PayoutId,
    pub currency: Currency,
    /// What reached the bank.
    pub amount_minor: Amount,
    pub lines: Vec<PayoutLine>,
    /// The part of the amount that stems from no payment of ours (money moved on the provider's
    /// account by something else); posted nowhere, and a manual exception.
    pub unattributed_minor: Amount,
    /// In a deployment of tenant cells, the part of the amount that other cells' payments make:
    /// each cell posts its own tenants' shares, and `asiento verify --cells` checks that the
    /// cells' parts add up to the payout.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub elsewhere_minor: Amount,
    /// When the provider created the payout.
    pub created: DateTime<Utc>,
    pub at: DateTime<Utc>,
}

fn is_zero(amount: &Amount) -> bool {
    amount.is_zero()
}

impl PayoutPaid {
    /// What this log posts of the payout: its lines and its unattributed part.
    pub fn posted_here(&self) -> Result<Amount, AmountError> {
        self.amount_minor.checked_sub(self.elsewhere_minor)
    }
}

/// A tenant's share of this payout, brought from the tenant cell the tenant moved out of: its
/// lines as that cell posted them. The share's entries follow as `EntryPosted` events, as they
/// were posted there (the share, and its reversal when the payout had failed there already).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PayoutShareMovedIn {
    pub provider: ProviderName,
    pub payout_id: PayoutId,
    pub tenant: TenantId,
    /// The cell the tenant moved from.
    pub from_cell: String,
    pub currency: Currency,
    pub lines: Vec<PayoutLine>,
    /// The share comes reversed: the payout had failed in the old cell (its reversal follows as
    /// it was posted there), or here (reversed as it arrives).
    pub reversed: bool,
    pub at: DateTime<Utc>,
}

/// A tenant's share of this payout moved to another tenant cell with the tenant. Its lines and
/// entries stay in this log; a later failure of the payout reverses the share in the new cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PayoutShareMovedOut {
    pub provider: ProviderName,
    pub payout_id: PayoutId,
    pub tenant: TenantId,
    /// The cell the tenant moved to.
    pub to_cell: String,
    /// The tenant's lines in this log, summed.
    pub net_minor: Amount,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PayoutFailed {
    pub provider: ProviderName,
    pub payout_id: PayoutId,
    /// The provider's reason (`account_closed`…).
    pub failure_code: Option<String>,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of a `payout-…` stream.
    PayoutEvent {
        PayoutPaid = 1,
        PayoutFailed = 1,
        EntryPosted = 1,
        PayoutShareMovedIn = 1,
        PayoutShareMovedOut = 1,
    }
}

/// Where a payout stands in our log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Payout {
    pub version: u64,
    pub paid: Option<PayoutPaid>,
    pub failed: bool,
    /// The entries the payout posted, in order (the shares, then their reversals), and those of
    /// shares moved in.
    pub entries: Vec<EntryPosted>,
    /// Shares moved in from other cells with their tenants.
    pub moved_in: Vec<PayoutShareMovedIn>,
    /// Shares moved out to other cells with their tenants: what each share's lines make.
    pub moved_out: BTreeMap<TenantId, Amount>,
}

#[must_use]
pub fn evolve(mut payout: Payout, event: &PayoutEvent) -> Payout {
    payout.version += 1;
    match event {
        PayoutEvent::PayoutPaid(paid) => payout.paid = Some(paid.clone()),
        PayoutEvent::PayoutFailed(_) => payout.failed = true,
        PayoutEvent::EntryPosted(posted) => payout.entries.push(posted.clone()),
        PayoutEvent::PayoutShareMovedIn(moved) => payout.moved_in.push(moved.clone()),
        PayoutEvent::PayoutShareMovedOut(moved) => {
            payout
                .moved_out
                .insert(moved.tenant.clone(), moved.net_minor);
        }
    }
    payout
}

/// A tenant's share of a payout as one log holds it: what moves with the tenant.
#[derive(Debug, Clone, PartialEq)]
pub struct Share {
    pub currency: Currency,
    pub lines: Vec<PayoutLine>,
    /// The share's entries as posted: the share, and its reversal when the payout failed.
    pub entries: Vec<EntryPosted>,
    pub reversed: bool,
}

impl Payout {
    /// `tenant`'s share as this log holds it (posted here or moved in), `None` when it has none
    /// here or it moved out already.
    #[must_use]
    pub fn share_of(&self, tenant: &TenantId) -> Option<Share> {
        if self.moved_out.contains_key(tenant) {
            return None;
        }
        let posted = self
            .paid
            .iter()
            .flat_map(|paid| &paid.lines)
            .filter(|line| &line.tenant == tenant);
        let moved_in = self
            .moved_in
            .iter()
            .filter(|moved| &moved.tenant == tenant)
            .flat_map(|moved| &moved.lines);
        let lines: Vec<PayoutLine> = posted.chain(moved_in).cloned().collect();
        let currency = self
            .paid
            .as_ref()
            .map(|paid| paid.currency)
            .or_else(|| self.moved_in.first().map(|moved| moved.currency))?;
        if lines.is_empty() {
            return None;
        }
        let entries: Vec<EntryPosted> = self
            .entries
            .iter()
            .filter(|posted| posted.entry.tenant() == tenant)
            .cloned()
            .collect();
        let reversed = entries
            .iter()
            .any(|posted| posted.entry.reverses().is_some());
        Some(Share {
            currency,
            lines,
            entries,
            reversed,
        })
    }

    /// Tenants whose shares moved in.
    fn moved_in_tenants(&self) -> BTreeSet<&TenantId> {
        self.moved_in.iter().map(|moved| &moved.tenant).collect()
    }

    /// What this log posts of the payout: its lines and unattributed part, with the shares moved
    /// in and without those moved out (`asiento verify --cells` adds the cells' parts up).
    pub fn posted_here(&self) -> Result<Amount, AmountError> {
        let mut here = match &self.paid {
            Some(paid) => paid.posted_here()?,
            None => Amount::ZERO,
        };
        for line in self.moved_in.iter().flat_map(|moved| &moved.lines) {
            here = here.checked_add(line.net_minor)?;
        }
        for share in self.moved_out.values() {
            here = here.checked_sub(*share)?;
        }
        Ok(here)
    }
}

/// What the provider says of a payout, read as it stands.
#[derive(Debug, Clone, PartialEq)]
pub enum PayoutFact {
    Paid {
        currency: Currency,
        amount: Amount,
        lines: Vec<PayoutLine>,
        unattributed: Amount,
        /// What other tenant cells' payments make of the amount (zero outside cells).
        elsewhere: Amount,
        created: DateTime<Utc>,
    },
    Failed {
        failure_code: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayoutRejection {
    #[error(
        "payout of {amount} is not its lines ({lines}) plus its unattributed part ({unattributed}) plus other cells' part ({elsewhere})"
    )]
    Unbalanced {
        amount: Amount,
        lines: Amount,
        unattributed: Amount,
        elsewhere: Amount,
    },
    #[error("a payout names at most {PAYOUT_LINES_MAX} payments, this one {0}")]
    TooManyLines(usize),
    #[error("payment {0} has two lines in one payout")]
    DuplicateLine(PaymentId),
    #[error("the payout's shares do not fit: {0}")]
    Amount(#[from] AmountError),
    #[error("posting rule produced an invalid entry: {0}")]
    InvalidEntry(String),
    #[error("tenant {0} has a share of this payout in this log already")]
    ShareHere(TenantId),
    #[error("tenant {0} has no share of this payout in this log")]
    NoShare(TenantId),
    #[error("the share is in {share}, the payout here in {here}")]
    ShareCurrency { share: Currency, here: Currency },
}

impl From<EntryError> for PayoutRejection {
    fn from(e: EntryError) -> Self {
        PayoutRejection::InvalidEntry(e.to_string())
    }
}

/// `bank:{provider}:payouts`: what the provider paid into our bank account.
#[must_use]
pub fn bank_account(provider: &ProviderName) -> AccountName {
    AccountName::provider_payouts(provider)
}

fn share_entry_id(provider: &ProviderName, payout: &PayoutId, tenant: &TenantId) -> EntryId {
    EntryId::derived(&format!("payout:{provider}:{payout}:{tenant}"))
}

/// The events that record `fact` on `payout`: nothing when the log already says it (a repeated
/// or late read), otherwise the fact and its postings.
pub fn decide(
    payout: &Payout,
    provider: &ProviderName,
    payout_id: &PayoutId,
    fact: PayoutFact,
    at: DateTime<Utc>,
) -> Result<Vec<PayoutEvent>, PayoutRejection> {
    match fact {
        PayoutFact::Paid { .. } if payout.paid.is_some() || payout.failed => Ok(Vec::new()),
        PayoutFact::Paid {
            currency,
            amount,
            lines,
            unattributed,
            elsewhere,
            created,
        } => {
            if lines.len() > PAYOUT_LINES_MAX {
                return Err(PayoutRejection::TooManyLines(lines.len()));
            }
            // A tenant whose share moved in with it has that share posted here already.
            let moved_in = payout.moved_in_tenants();
            let (lines, posted_already): (Vec<PayoutLine>, Vec<PayoutLine>) = lines
                .into_iter()
                .partition(|line| !moved_in.contains(&line.tenant));
            let mut elsewhere = elsewhere;
            for line in &posted_already {
                elsewhere = elsewhere.checked_add(line.net_minor)?;
            }
            let mut shares: BTreeMap<&TenantId, Amount> = BTreeMap::new();
            let mut seen = std::collections::HashSet::new();
            let mut total = Amount::ZERO;
            for line in &lines {
                if !seen.insert(line.payment) {
                    return Err(PayoutRejection::DuplicateLine(line.payment));
                }
                let share = shares.entry(&line.tenant).or_default();
                *share = share.checked_add(line.net_minor)?;
                total = total.checked_add(line.net_minor)?;
            }
            // Other cells' part is negative when their refunds outweigh what they brought in.
            if total.checked_add(unattributed)?.checked_add(elsewhere)? != amount {
                return Err(PayoutRejection::Unbalanced {
                    amount,
                    lines: total,
                    unattributed,
                    elsewhere,
                });
            }
            let mut events = Vec::with_capacity(1 + shares.len());
            for (tenant, share) in shares.into_iter().filter(|(_, s)| *s != Amount::ZERO) {
                let entry = JournalEntry::new(
                    share_entry_id(provider, payout_id, tenant),
                    tenant.clone(),
                    vec![
                        Leg::new(AccountName::psp_clearing(provider), currency, share),
                        Leg::new(bank_account(provider), currency, share.checked_neg()?),
                    ],
                    None,
                )?;
                events.push(PayoutEvent::EntryPosted(EntryPosted {
                    entry,
                    at,
                    transfer: None,
                }));
            }
            events.insert(
                0,
                PayoutEvent::PayoutPaid(PayoutPaid {
                    provider: provider.clone(),
                    payout_id: payout_id.clone(),
                    currency,
                    amount_minor: amount,
                    lines,
                    unattributed_minor: unattributed,
                    elsewhere_minor: elsewhere,
                    created,
                    at,
                }),
            );
            Ok(events)
        }
        PayoutFact::Failed { .. } if payout.failed => Ok(Vec::new()),
        PayoutFact::Failed { failure_code } => {
            let mut events = vec![PayoutEvent::PayoutFailed(PayoutFailed {
                provider: provider.clone(),
                payout_id: payout_id.clone(),
                failure_code,
                at,
            })];
            // Every share once: not one reversed already (moved in reversed), nor one that moved
            // out with its tenant (its new cell reverses it).
            let reversed: HashSet<EntryId> = payout
                .entries
                .iter()
                .filter_map(|posted| posted.entry.reverses())
                .collect();
            let standing = payout
                .entries
                .iter()
                .map(|posted| &posted.entry)
                .filter(|entry| {
                    entry.reverses().is_none()
                        && !reversed.contains(&entry.id())
                        && !payout.moved_out.contains_key(entry.tenant())
                });
            for entry in standing {
                let id = EntryId::derived(&format!("{}:failed", entry.id()));
                events.push(PayoutEvent::EntryPosted(EntryPosted {
                    entry: entry.reversal(id)?,
                    at,
                    transfer: None,
                }));
            }
            Ok(events)
        }
    }
}

/// The events that bring `tenant`'s `share`, moved from cell `from_cell`, into this log's
/// `payout`: nothing when it is here already (a move run again).
pub fn move_in(
    payout: &Payout,
    provider: &ProviderName,
    payout_id: &PayoutId,
    tenant: &TenantId,
    from_cell: &str,
    share: Share,
    at: DateTime<Utc>,
) -> Result<Vec<PayoutEvent>, PayoutRejection> {
    if payout.moved_in.iter().any(|moved| &moved.tenant == tenant) {
        return Ok(Vec::new());
    }
    let posted_here = payout
        .paid
        .iter()
        .flat_map(|paid| &paid.lines)
        .any(|line| &line.tenant == tenant);
    if posted_here || payout.moved_out.contains_key(tenant) {
        return Err(PayoutRejection::ShareHere(tenant.clone()));
    }
    if let Some(paid) = &payout.paid {
        if paid.currency != share.currency {
            return Err(PayoutRejection::ShareCurrency {
                share: share.currency,
                here: paid.currency,
            });
        }
    }
    if share.lines.is_empty() || share.lines.iter().any(|line| &line.tenant != tenant) {
        return Err(PayoutRejection::NoShare(tenant.clone()));
    }
    // The payout failed here while the old cell had not heard of it yet: the share arrives after
    // this log reversed its shares, so it is reversed as it arrives.
    let reverse_here = payout.failed && !share.reversed;
    let mut reversals = Vec::new();
    if reverse_here {
        for posted in share
            .entries
            .iter()
            .filter(|p| p.entry.reverses().is_none())
        {
            let id = EntryId::derived(&format!("{}:failed", posted.entry.id()));
            reversals.push(PayoutEvent::EntryPosted(EntryPosted {
                entry: posted.entry.reversal(id)?,
                at,
                transfer: None,
            }));
        }
    }
    let mut events = vec![PayoutEvent::PayoutShareMovedIn(PayoutShareMovedIn {
        provider: provider.clone(),
        payout_id: payout_id.clone(),
        tenant: tenant.clone(),
        from_cell: from_cell.to_owned(),
        currency: share.currency,
        lines: share.lines,
        reversed: share.reversed || reverse_here,
        at,
    })];
    events.extend(share.entries.into_iter().map(PayoutEvent::EntryPosted));
    events.extend(reversals);
    Ok(events)
}

/// The event that records `tenant`'s share of `payout` moved to cell `to_cell`: nothing when it
/// moved already.
pub fn move_out(
    payout: &Payout,
    provider: &ProviderName,
    payout_id: &PayoutId,
    tenant: &TenantId,
    to_cell: &str,
    at: DateTime<Utc>,
) -> Result<Vec<PayoutEvent>, PayoutRejection> {
    if payout.moved_out.contains_key(tenant) {
        return Ok(Vec::new());
    }
    let share = payout
        .share_of(tenant)
        .ok_or_else(|| PayoutRejection::NoShare(tenant.clone()))?;
    let mut net = Amount::ZERO;
    for line in &share.lines {
        net = net.checked_add(line.net_minor)?;
    }
    Ok(vec![PayoutEvent::PayoutShareMovedOut(
        PayoutShareMovedOut {
            provider: provider.clone(),
            payout_id: payout_id.clone(),
            tenant: tenant.clone(),
            to_cell: to_cell.to_owned(),
            net_minor: net,
            at,
        },
    )])
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;
    use uuid::Uuid;

    use super::*;

    fn at() -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000, 0).unwrap()
    }

    fn line(n: u128, tenant: &str, net: i64) -> PayoutLine {
        PayoutLine {
            payment: PaymentId::from_uuid(Uuid::from_u128(n)),
            tenant: TenantId::parse(tenant).unwrap(),
            net_minor: Amount::new(net),
            provider_net_minor: Amount::new(net),
            agreed_at_version: Some(2),
            transactions: vec![format!("txn_{n}")],
        }
    }

    fn paid(lines: Vec<PayoutLine>, unattributed: i64) -> PayoutFact {
        let total: i64 = lines.iter().map(|l| l.net_minor.minor()).sum();
        PayoutFact::Paid {
            currency: Currency::parse("USD").unwrap(),
            amount: Amount::new(total + unattributed),
            lines,
            unattributed: Amount::new(unattributed),
            elsewhere: Amount::ZERO,
            created: at(),
        }
    }

    fn apply(payout: Payout, events: &[PayoutEvent]) -> Payout {
        events.iter().fold(payout, evolve)
    }

    /// `payout` of stripe's `po_1Abc` with `fact` decided and applied.
    fn decided(payout: Payout, fact: PayoutFact) -> Payout {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let events = decide(&payout, &provider, &id, fact, at()).unwrap();
        apply(payout, &events)
    }

    fn legs(events: &[PayoutEvent]) -> Vec<(String, String, i64)> {
        events
            .iter()
            .filter_map(|e| match e {
                PayoutEvent::EntryPosted(posted) => Some(posted),
                _ => None,
            })
            .flat_map(|posted| {
                posted.entry.legs().iter().map(|leg| {
                    (
                        posted.entry.tenant().to_string(),
                        leg.account.to_string(),
                        leg.amount.minor(),
                    )
                })
            })
            .collect()
    }

    #[test]
    fn a_paid_payout_moves_each_tenant_s_share_from_clearing_to_the_bank() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let fact = paid(
            vec![
                line(1, "acme", 9_710),
                line(2, "acme", -500),
                line(3, "globex", 4_855),
            ],
            300,
        );
        let events = decide(&Payout::default(), &provider, &id, fact.clone(), at()).unwrap();
        assert_eq!(
            legs(&events),
            [
                ("acme".into(), "psp:stripe:clearing".into(), 9_210),
                ("acme".into(), "bank:stripe:payouts".into(), -9_210),
                ("globex".into(), "psp:stripe:clearing".into(), 4_855),
                ("globex".into(), "bank:stripe:payouts".into(), -4_855),
            ]
        );
        let payout = apply(Payout::default(), &events);
        assert!(decide(&payout, &provider, &id, fact, at())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_failure_after_paid_reverses_every_share_once_and_a_late_paid_changes_nothing() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let fact = paid(vec![line(1, "acme", 9_710), line(3, "globex", 4_855)], 0);
        let payout = apply(
            Payout::default(),
            &decide(&Payout::default(), &provider, &id, fact.clone(), at()).unwrap(),
        );
        let failed = PayoutFact::Failed {
            failure_code: Some("account_closed".into()),
        };
        let events = decide(&payout, &provider, &id, failed.clone(), at()).unwrap();
        assert!(matches!(events[0], PayoutEvent::PayoutFailed(_)));
        assert_eq!(
            legs(&events),
            [
                ("acme".into(), "psp:stripe:clearing".into(), -9_710),
                ("acme".into(), "bank:stripe:payouts".into(), 9_710),
                ("globex".into(), "psp:stripe:clearing".into(), -4_855),
                ("globex".into(), "bank:stripe:payouts".into(), 4_855),
            ]
        );
        let payout = apply(payout, &events);
        assert!(decide(&payout, &provider, &id, failed, at())
            .unwrap()
            .is_empty());
        assert!(decide(&payout, &provider, &id, fact, at())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_failure_before_paid_posts_nothing_and_bars_a_later_paid() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let failed = PayoutFact::Failed { failure_code: None };
        let events = decide(&Payout::default(), &provider, &id, failed, at()).unwrap();
        assert_eq!(events.len(), 1);
        assert!(legs(&events).is_empty());
        let payout = apply(Payout::default(), &events);
        let fact = paid(vec![line(1, "acme", 9_710)], 0);
        assert!(decide(&payout, &provider, &id, fact, at())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn a_payout_that_is_not_its_lines_is_refused() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let PayoutFact::Paid {
            currency,
            lines,
            unattributed,
            created,
            ..
        } = paid(vec![line(1, "acme", 9_710)], 0)
        else {
            unreachable!("paid() builds a paid fact")
        };
        let fact = PayoutFact::Paid {
            currency,
            amount: Amount::new(9_711),
            lines: lines.clone(),
            unattributed,
            elsewhere: Amount::ZERO,
            created,
        };
        assert!(matches!(
            decide(&Payout::default(), &provider, &id, fact, at()),
            Err(PayoutRejection::Unbalanced { .. })
        ));
        // A cell's part: its lines and what other cells' payments make of the amount.
        let part = |elsewhere: i64| PayoutFact::Paid {
            currency,
            amount: Amount::new(9_711),
            lines: lines.clone(),
            unattributed,
            elsewhere: Amount::new(elsewhere),
            created,
        };
        let events = decide(&Payout::default(), &provider, &id, part(1), at()).unwrap();
        let PayoutEvent::PayoutPaid(fact) = &events[0] else {
            unreachable!("a paid payout's first event is its fact")
        };
        assert_eq!(fact.posted_here().unwrap(), Amount::new(9_710));
        assert_eq!(
            legs(&events)
                .iter()
                .map(|(_, _, minor)| minor.abs())
                .sum::<i64>(),
            2 * 9_710
        );
        for wrong in [0, 2, -1] {
            assert!(
                matches!(
                    decide(&Payout::default(), &provider, &id, part(wrong), at()),
                    Err(PayoutRejection::Unbalanced { .. })
                ),
                "elsewhere {wrong}"
            );
        }
        // Other cells' refunds outweigh what their payments brought in: their part is negative.
        let outweighed = PayoutFact::Paid {
            currency,
            amount: Amount::new(9_709),
            lines: lines.clone(),
            unattributed,
            elsewhere: Amount::new(-1),
            created,
        };
        assert!(decide(&Payout::default(), &provider, &id, outweighed, at()).is_ok());
        let twice = paid([lines.clone(), lines].concat(), 0);
        assert!(matches!(
            decide(&Payout::default(), &provider, &id, twice, at()),
            Err(PayoutRejection::DuplicateLine(_))
        ));
    }

    /// One payout of acme (cell A), globex (cell A) and initech (cell B); globex moves to B.
    #[test]
    fn a_share_moves_with_its_tenant_and_the_cells_still_post_the_payout_once() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let globex = TenantId::parse("globex").unwrap();
        let all = [
            line(1, "acme", 9_710),
            line(2, "globex", 4_855),
            line(3, "globex", -500),
            line(4, "initech", 1_000),
        ];
        let amount = 9_710 + 4_855 - 500 + 1_000;
        let part = |lines: &[PayoutLine], elsewhere: i64| PayoutFact::Paid {
            currency: Currency::parse("USD").unwrap(),
            amount: Amount::new(amount),
            lines: lines.to_vec(),
            unattributed: Amount::ZERO,
            elsewhere: Amount::new(elsewhere),
            created: at(),
        };
        let parts = |a: &Payout, b: &Payout| {
            a.posted_here().unwrap().minor() + b.posted_here().unwrap().minor()
        };
        let a = decided(Payout::default(), part(&all[..3], 1_000));
        let share = a.share_of(&globex).unwrap();
        assert_eq!(share.lines.len(), 2);
        assert_eq!(share.entries.len(), 1);
        assert!(!share.reversed);

        let moved_in = move_in(
            &Payout::default(),
            &provider,
            &id,
            &globex,
            "a",
            share.clone(),
            at(),
        )
        .unwrap();
        assert_eq!(moved_in.len(), 2, "the share and its entry");
        let b = apply(Payout::default(), &moved_in);
        let a = apply(
            a.clone(),
            &move_out(&a, &provider, &id, &globex, "b", at()).unwrap(),
        );
        assert!(move_out(&a, &provider, &id, &globex, "b", at())
            .unwrap()
            .is_empty());
        assert!(
            move_in(&b, &provider, &id, &globex, "a", share.clone(), at())
                .unwrap()
                .is_empty()
        );
        assert!(a.share_of(&globex).is_none());
        assert_eq!(b.share_of(&globex).unwrap().lines, share.lines);
        assert_eq!(
            parts(&a, &b),
            9_710 + 4_355,
            "B has not posted its own part yet"
        );

        // B's own part, read after the move, names globex's payments too: posted once.
        let b = decided(b, part(&all[1..], 9_710));
        assert_eq!(b.paid.as_ref().unwrap().lines, [line(4, "initech", 1_000)]);
        assert_eq!(parts(&a, &b), amount);
        assert!(matches!(
            move_in(
                &b,
                &provider,
                &id,
                &TenantId::parse("initech").unwrap(),
                "a",
                share,
                at()
            ),
            Err(PayoutRejection::ShareHere(_))
        ));

        // The payout fails: each cell reverses the shares it holds, globex's in B.
        let failed = PayoutFact::Failed { failure_code: None };
        let tenants_reversed = |payout: &Payout| {
            let events = decide(payout, &provider, &id, failed.clone(), at()).unwrap();
            legs(&events)
                .into_iter()
                .filter(|(_, account, _)| account.ends_with("clearing"))
                .map(|(tenant, _, minor)| (tenant, minor))
                .collect::<Vec<_>>()
        };
        assert_eq!(tenants_reversed(&a), [("acme".to_owned(), -9_710)]);
        assert_eq!(
            tenants_reversed(&b),
            [
                ("globex".to_owned(), -4_355),
                ("initech".to_owned(), -1_000)
            ]
        );
    }

    #[test]
    fn a_share_moved_after_its_payout_failed_comes_reversed_and_is_not_reversed_again() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let acme = TenantId::parse("acme").unwrap();
        let failed = PayoutFact::Failed { failure_code: None };
        let a = decided(Payout::default(), paid(vec![line(1, "acme", 9_710)], 0));
        let a = decided(a, failed.clone());
        let share = a.share_of(&acme).unwrap();
        assert!(share.reversed);
        let b = apply(
            Payout::default(),
            &move_in(&Payout::default(), &provider, &id, &acme, "a", share, at()).unwrap(),
        );
        assert_eq!(b.entries.len(), 2);
        let events = decide(&b, &provider, &id, failed.clone(), at()).unwrap();
        assert_eq!(events.len(), 1, "the failure only: {events:?}");
    }

    #[test]
    fn a_share_moved_into_a_log_that_saw_the_payout_fail_is_reversed_as_it_arrives() {
        let provider = ProviderName::parse("stripe").unwrap();
        let id = PayoutId::parse("po_1Abc").unwrap();
        let acme = TenantId::parse("acme").unwrap();
        let a = decided(Payout::default(), paid(vec![line(1, "acme", 9_710)], 0));
        let b = decided(Payout::default(), PayoutFact::Failed { failure_code: None });
        let share = a.share_of(&acme).unwrap();
        assert!(!share.reversed, "the old cell has not heard of the failure");
        let events = move_in(&b, &provider, &id, &acme, "a", share, at()).unwrap();
        let PayoutEvent::PayoutShareMovedIn(moved) = &events[0] else {
            unreachable!("a move in starts with the share")
        };
        assert!(moved.reversed);
        assert_eq!(
            legs(&events),
            [
                ("acme".into(), "psp:stripe:clearing".into(), 9_710),
                ("acme".into(), "bank:stripe:payouts".into(), -9_710),
                ("acme".into(), "psp:stripe:clearing".into(), -9_710),
                ("acme".into(), "bank:stripe:payouts".into(), 9_710),
            ]
        );
    }

    #[test]
    fn payout_ids_are_what_providers_name_them() {
        assert!(PayoutId::parse("po_1OaBcD2eZvKYlo2C").is_ok());
        for bad in ["", "po 1", "po:1", "po/1", &"p".repeat(256)] {
            assert!(PayoutId::parse(bad).is_err(), "{bad:?}");
        }
    }
}
