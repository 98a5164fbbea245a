//! Property tests over random command and provider-fact sequences, and over
//! random interleavings of concurrent transfers against a model event store
//! that appends several streams atomically with exact expected versions.
// Test code: a failed unwrap is a failed test, which is what we want.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use asiento_domain::account::{AccountName, PendingSide};
use asiento_domain::guard::{self, decide_entry, guarded_keys, DebitGuard, GuardKey, Origin};
use asiento_domain::hold::{self, HoldAction, SettleHold};
use asiento_domain::payment::table::{rule, Outcome};
use asiento_domain::payment::*;
use asiento_domain::transfer::{self, decide_with_guards, RequestTransfer, Transfer};
use asiento_domain::*;
use common::*;
use proptest::prelude::*;

/// Enough to explore the table on 2 CI cores in well under a second each.
const PAYMENT_CASES: u32 = 384;
const TRANSFER_CASES: u32 = 256;

#[derive(Debug, Clone, Copy)]
enum Part {
    Full,
    Percent(i64),
    Over,
}

#[derive(Debug, Clone)]
enum Step {
    Capture(Option<Part>),
    Refund(Part),
    /// The merchant cancels the authorization.
    Cancel,
    Expire,
    Flag(u8),
    Action(u8),
    Authorized(Part),
    Captured(Part),
    Failed(u8),
    Refunded(Part),
    DisputeOpened(u8, Part),
    /// Won (true) or lost, the loss a second chargeback when the last flag is set.
    DisputeClosed(u8, Part, bool, bool),
    /// The provider ended the authorization (`expired` or `canceled`).
    AuthorizationEnded(u8),
    OtherCharge,
    /// The provider's fee on balance transaction `txn_{0}` (a second report of one transaction
    /// with another fee contradicts the first).
    ProviderFee(u8, i64),
    /// The outcome of our capture (0), refund (1) or cancel (2) numbered 1..=3: pending (0),
    /// succeeded (1), failed (2) or reversed (3), for the amount asked (or another one when not
    /// `exact`).
    Outcome {
        kind: u8,
        sequence: u32,
        outcome: u8,
        exact: bool,
    },
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![3 => Just(Part::Full), 4 => (1i64..=100).prop_map(Part::Percent), 1 => Just(Part::Over)]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        1 => proptest::option::of(part()).prop_map(Step::Capture),
        1 => part().prop_map(Step::Refund),
        1 => Just(Step::Cancel),
        1 => Just(Step::Expire),
        1 => (0u8..2).prop_map(Step::Flag),
        1 => (0u8..2).prop_map(Step::Action),
        2 => part().prop_map(Step::Authorized),
        3 => part().prop_map(Step::Captured),
        1 => (0u8..2).prop_map(Step::Failed),
        3 => part().prop_map(Step::Refunded),
        1 => (0u8..2, part()).prop_map(|(d, p)| Step::DisputeOpened(d, p)),
        1 => (0u8..2, part(), any::<bool>(), any::<bool>())
            .prop_map(|(d, p, won, again)| Step::DisputeClosed(d, p, won, again)),
        1 => (0u8..2).prop_map(Step::AuthorizationEnded),
        1 => Just(Step::OtherCharge),
        2 => (0u8..3, -50i64..=500).prop_map(|(n, fee)| Step::ProviderFee(n, fee)),
        4 => (0u8..3, 1u32..=3, 0u8..4, prop_oneof![6 => Just(true), 1 => Just(false)])
            .prop_map(|(kind, sequence, outcome, exact)| Step::Outcome { kind, sequence, outcome, exact }),
    ]
}

fn resolve(part: Part, of: i64) -> Amount {
    amt(match part {
        Part::Full => of,
        Part::Percent(p) => (of * p / 100).max(1),
        Part::Over => of + 1,
    })
}

fn command(step: &Step, record: &PaymentRecord, fees: FeeSchedule, t: i64) -> PaymentCommand {
    let amount = record.amount.minor();
    let at = at(t);
    let provider = |fact| PaymentCommand::Provider { fact, fees, at };
    let charge = || CHARGE.to_owned();
    match step {
        Step::Capture(p) => PaymentCommand::RequestCapture {
            amount: p.map(|p| resolve(p, amount)),
            at,
        },
        Step::Refund(p) => PaymentCommand::RequestRefund {
            amount: resolve(*p, amount),
            at,
        },
        Step::Cancel => PaymentCommand::RequestCancel { at },
        Step::Expire => PaymentCommand::Expire { at },
        Step::Flag(n) => PaymentCommand::FlagForReview {
            note: format!("note {n}"),
            at,
        },
        Step::Action(n) => provider(ProviderFact::ActionRequired {
            charge_id: charge(),
            redirect_url: format!("https://sim.example/r/{n}"),
        }),
        Step::Authorized(p) => provider(ProviderFact::Authorized {
            charge_id: charge(),
            amount: resolve(*p, amount),
        }),
        Step::Captured(p) => provider(ProviderFact::Captured {
            charge_id: charge(),
            amount: resolve(*p, amount),
        }),
        Step::Failed(n) => provider(ProviderFact::Failed {
            charge_id: Some(charge()),
            reason: format!("reason {n}"),
        }),
        Step::Refunded(p) => provider(ProviderFact::Refunded {
            charge_id: charge(),
            amount_refunded: resolve(*p, amount),
            current: t % 2 == 0,
        }),
        Step::DisputeOpened(d, p) => provider(ProviderFact::DisputeOpened {
            charge_id: charge(),
            dispute_id: format!("dp_{d}"),
            amount: resolve(*p, amount),
        }),
        Step::DisputeClosed(d, p, won, again) => provider(ProviderFact::DisputeClosed {
            charge_id: charge(),
            dispute_id: format!("dp_{d}"),
            amount: resolve(*p, amount),
            outcome: if *won {
                DisputeOutcome::Won
            } else {
                DisputeOutcome::Lost
            },
            reinstated: *again,
        }),
        Step::AuthorizationEnded(n) => provider(ProviderFact::AuthorizationEnded {
            charge_id: charge(),
            reason: ["expired", "canceled"][usize::from(*n)].to_owned(),
        }),
        Step::OtherCharge => provider(ProviderFact::Captured {
            charge_id: "ch_other".into(),
            amount: amt(amount),
        }),
        Step::ProviderFee(n, fee) => provider(ProviderFact::ProviderFeeCharged {
            charge_id: charge(),
            transaction_id: format!("txn_{n}"),
            fee: amt(*fee),
        }),
        Step::Outcome {
            kind,
            sequence,
            outcome,
            exact,
        } => {
            let (kind, psp_key) = match kind {
                0 => (
                    OperationKind::Capture,
                    psp_capture_key(record.id, *sequence),
                ),
                1 => (OperationKind::Refund, psp_refund_key(record.id, *sequence)),
                _ => (
                    OperationKind::Cancel,
                    psp_authorization_cancel_key(record.id, *sequence),
                ),
            };
            let asked = record
                .operation(kind, *sequence)
                .map_or(amount, |op| op.amount.minor());
            provider(ProviderFact::Operation {
                kind,
                charge_id: charge(),
                psp_key,
                provider_id: Some(format!("op_{sequence}")),
                amount: amt(if *exact { asked } else { asked + 1 }),
                outcome: match outcome {
                    0 => OperationOutcome::Pending,
                    1 => OperationOutcome::Succeeded,
                    2 => OperationOutcome::Failed {
                        reason: "declined".into(),
                    },
                    _ => OperationOutcome::Reversed {
                        reason: "capture_failed".into(),
                    },
                },
                // An answer to our request names the provider's request; a replay of it the same.
                request: Some(ProviderRequest {
                    id: format!("req_{sequence}_{outcome}"),
                    replayed: t % 2 == 0,
                }),
            })
        }
    }
}

type Balances = BTreeMap<(AccountName, Currency), i64>;

fn post(balances: &mut Balances, entry: &JournalEntry) {
    let mut sums: BTreeMap<Currency, i64> = BTreeMap::new();
    for leg in entry.legs() {
        assert!(!leg.amount.is_zero(), "zero leg in {entry:?}");
        *sums.entry(leg.currency).or_default() += leg.amount.minor();
        *balances
            .entry((leg.account.clone(), leg.currency))
            .or_default() += leg.amount.minor();
    }
    assert!(
        sums.values().all(|s| *s == 0),
        "entry does not sum to zero: {entry:?}"
    );
    assert!(entry.legs().len() >= 2);
}

fn sum_per_currency(balances: &Balances) -> BTreeMap<Currency, i64> {
    let mut sums = BTreeMap::new();
    for ((_, currency), balance) in balances {
        *sums.entry(*currency).or_default() += balance;
    }
    sums
}

fn balance(balances: &Balances, account: &AccountName) -> i64 {
    balances
        .get(&(account.clone(), usd()))
        .copied()
        .unwrap_or(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(PAYMENT_CASES))]

    #[test]
    fn random_payment_histories_keep_every_invariant(
        amount in 1i64..=20_000,
        manual in any::<bool>(),
        bps in prop_oneof![Just(300u32), 0u32..=10_000],
        fixed in prop_oneof![Just(0i64), 0i64..=100],
        steps in proptest::collection::vec(step(), 1..24),
    ) {
        let fees = FeeSchedule::new(bps, amt(fixed)).unwrap();
        let mode = if manual { CaptureMode::Manual } else { CaptureMode::Automatic };
        let mut payment = Payment::default();
        let mut all = decide(&payment, create_with(amount, mode)).unwrap();
        payment = all.iter().fold(payment, evolve);
        let mut balances = Balances::new();
        // Whether a dispute was ever lost: only that (a provider fact) may take the customer
        // below zero.
        let mut ever_lost = false;

        for (t, step) in steps.iter().enumerate() {
            let cmd = command(step, payment.record.as_ref().unwrap(), fees, t as i64 + 1);
            let from = payment.record.as_ref().unwrap().status;
            let input = cmd.input();
            let r = rule(Some(from), input);
            match decide(&payment, cmd.clone()) {
                Err(PaymentRejection::InvalidTransition { .. }) => {
                    prop_assert_eq!(r.outcome, Outcome::Reject);
                }
                Err(rejection) => {
                    prop_assert!(r.outcome != Outcome::Reject, "{rejection:?}");
                    prop_assert!(!input.is_provider_fact(), "a well-formed fact was refused: {rejection:?}");
                }
                Ok(events) => {
                    prop_assert!(r.outcome != Outcome::Reject, "{from} × {input} accepted");
                    if r.outcome == Outcome::Ignore {
                        prop_assert!(events.is_empty());
                    }
                    if r.outcome == Outcome::Flag {
                        prop_assert!(events.iter().all(|e| matches!(e, PaymentEvent::FlaggedForReview(_))));
                    }
                    for event in &events {
                        if let PaymentEvent::EntryPosted(posted) = event {
                            post(&mut balances, &posted.entry);
                        }
                        if let PaymentEvent::DisputeClosed(DisputeClosed { outcome: DisputeOutcome::Lost, .. }) = event {
                            ever_lost = true;
                        }
                    }
                    payment = events.iter().fold(payment, evolve);
                    all.extend(events);
                    let to = payment.record.as_ref().unwrap().status;
                    prop_assert!(to == from || r.to.contains(&to), "{from} × {input} → {to} is outside the table");
                    if input.is_provider_fact() {
                        // Applying a fact twice equals applying it once.
                        prop_assert_eq!(decide(&payment, cmd), Ok(vec![]), "{} twice", input);
                    }
                }
            }

            let record = payment.record.as_ref().unwrap();
            prop_assert_eq!(record.next_action.is_some(), record.status == PaymentStatus::RequiresAction);
            // At most one capture waits for the provider; an open refund is never already
            // counted in what our succeeded refunds account for.
            for kind in [OperationKind::Capture, OperationKind::Cancel] {
                prop_assert!(record.operations.iter().filter(|op| op.kind == kind && op.state.is_open()).count() <= 1);
            }
            // Only the merchant's cancel cancels, and a canceled payment captured nothing.
            if record.status == PaymentStatus::Canceled {
                prop_assert!(record.operations.iter().any(|op| op.kind == OperationKind::Cancel));
                prop_assert!(record.captured.is_zero());
            }
            // Each of the provider's requests is recorded once on the operation it answered.
            for op in &record.operations {
                let ids: std::collections::BTreeSet<&str> = op.requests.iter().map(|r| r.id.as_str()).collect();
                prop_assert_eq!(ids.len(), op.requests.len());
            }
            let settled_ops: i64 = record.operations.iter()
                .filter(|op| op.kind == OperationKind::Refund && matches!(op.state, OperationState::Succeeded | OperationState::Reversed))
                .map(|op| op.amount.minor()).sum();
            prop_assert!(settled_ops <= record.refunded.minor() + record.refund_reversed.minor());
            prop_assert_eq!(record.operations_refunded.minor(), settled_ops);
            prop_assert!(record.refunded <= record.captured);
            prop_assert!(record.fee_reversed <= record.fee && record.fee <= record.captured);
            prop_assert!(sum_per_currency(&balances).values().all(|s| *s == 0));
            // The ledger agrees with the payment's own amounts.
            prop_assert_eq!(balance(&balances, &revenue()), record.fee_net().unwrap().minor());
            // The provider's fees come off what it owes us, once per balance transaction.
            let provider_fees: i64 = record.provider_fees.iter().map(|f| f.fee.minor()).sum();
            prop_assert_eq!(balance(&balances, &provider_expense()), -provider_fees);
            prop_assert!(record.provider_fees.iter().all(|f| !f.fee.is_zero()));
            // A fee is the provider's on money it captured; a capture reversed since leaves the
            // fee posted until the provider says it gave it back (a negative fee), and then
            // the provider holds less than nothing for the payment.
            let capture_reversed = record.operations.iter()
                .any(|op| op.kind == OperationKind::Capture && op.state == OperationState::Reversed);
            prop_assert!(provider_fees == 0 || !record.captured.is_zero() || capture_reversed);
            // What an open dispute's withdrawal holds is the provider's until the outcome.
            let withdrawn = record.dispute.as_ref()
                .filter(|d| d.withdrawn && d.outcome.is_none())
                .map_or(0, |d| d.amount.minor());
            // A lost dispute (lost again after a win too) took its amount from the customer; a
            // win after a loss gave it back.
            let lost_disputes = record.dispute.as_ref()
                .filter(|d| d.outcome == Some(DisputeOutcome::Lost))
                .map_or(0, |d| d.amount.minor());
            prop_assert_eq!(balance(&balances, &disputed()), -withdrawn);
            prop_assert_eq!(
                balance(&balances, &clearing()),
                record.refunded.minor() - record.captured.minor() + lost_disputes + withdrawn + provider_fees
            );
            prop_assert_eq!(balance(&balances, &clearing()), -record.provider_holds().unwrap().minor());
            // An authorization holds its amount as a pending credit to the customer exactly
            // while the payment is authorized; leaving releases it whole.
            let held = if record.status == PaymentStatus::Authorized { record.authorized.minor() } else { 0 };
            prop_assert_eq!(record.authorization_held.minor(), held);
            prop_assert_eq!(balance(&balances, &customer().pending(PendingSide::Credits)), held);
            prop_assert_eq!(balance(&balances, &clearing().pending(PendingSide::Debits)), -held);
            // Refunds alone never take the customer below zero; only a lost
            // dispute (a provider fact) may.
            if !ever_lost {
                prop_assert!(balance(&balances, &customer()) >= 0);
            }
        }

        // Replaying the emitted events rebuilds the same state, also after
        // a trip through the stored form.
        prop_assert_eq!(&Payment::replay(&all), &payment);
        let stored: Vec<PaymentEvent> = all
            .iter()
            .map(|e| PaymentEvent::decode(e.event_type(), e.schema_version(), &e.encode().unwrap()).unwrap())
            .collect();
        prop_assert_eq!(&Payment::replay(&stored), &payment);
        for (batch, keep) in [(1, 0), (2, 1), (3, 2), (5, 0), (4, RECENT_OPERATIONS)] {
            windows_and_folds_without_operations_equal_the_whole_fold(&all, batch, keep)?;
        }
    }
}

/// Folds `all` as a read model does, in batches of `batch` events, through a [`PaymentWindow`]
/// archiving all but its latest `keep` operations after each batch (the archive a map here) and
/// through `evolve_without_operations`, against `evolve` of the whole stream: every field but the
/// operations equal at every event, every operation an event reads equal, the latest ones equal,
/// and after each batch the window with its archive is the whole payment.
fn windows_and_folds_without_operations_equal_the_whole_fold(
    all: &[PaymentEvent],
    batch: usize,
    keep: usize,
) -> Result<(), TestCaseError> {
    let without_operations = |payment: &Payment| {
        let mut payment = payment.clone();
        if let Some(record) = payment.record.as_mut() {
            record.operations.clear();
            record.operations_refunded = Amount::ZERO;
        }
        payment
    };
    let named = |payment: &Payment, kind: OperationKind, sequence: u32| {
        payment
            .record
            .as_ref()
            .and_then(|r| r.operation(kind, sequence))
            .cloned()
    };
    let mut archive: BTreeMap<u32, Operation> = BTreeMap::new();
    let (mut window, mut whole, mut bare) = (
        PaymentWindow::default(),
        Payment::default(),
        Payment::default(),
    );
    for events in all.chunks(batch) {
        let loaded = match window.needs(events) {
            ArchiveNeed::Nothing => Vec::new(),
            ArchiveNeed::All => rows(&archive, |_| true),
            ArchiveNeed::Some { named, open } => rows(&archive, |op| {
                named.contains(&(op.kind, op.sequence)) || (open && op.state.is_open())
            }),
        };
        window.load(loaded);
        for event in events {
            window = window.evolve(event);
            whole = evolve(whole, event);
            bare = evolve_without_operations(bare, event);
            prop_assert_eq!(&bare, &without_operations(&whole));
            prop_assert_eq!(&without_operations(&window.payment), &bare);
            let refunded = |p: &Payment| p.record.as_ref().map(|r| r.operations_refunded);
            prop_assert_eq!(refunded(&window.payment), refunded(&whole));
            let operations = whole.record.as_ref().map_or(&[][..], |r| &r.operations[..]);
            prop_assert_eq!(window.total() as usize, operations.len());
            match event.operations_read() {
                OperationsRead::None => {}
                OperationsRead::One(kind, sequence) => {
                    prop_assert_eq!(
                        named(&window.payment, kind, sequence),
                        named(&whole, kind, sequence)
                    );
                }
                OperationsRead::Open => {
                    let open = |ops: &[Operation]| {
                        ops.iter()
                            .filter(|op| op.state.is_open())
                            .cloned()
                            .collect::<Vec<_>>()
                    };
                    let held = window
                        .payment
                        .record
                        .as_ref()
                        .map_or(&[][..], |r| &r.operations[..]);
                    prop_assert_eq!(open(held), open(operations));
                }
                OperationsRead::All => {
                    let held = window
                        .payment
                        .record
                        .as_ref()
                        .map_or(&[][..], |r| &r.operations[..]);
                    prop_assert_eq!(held, operations);
                }
            }
            if keep >= RECENT_OPERATIONS {
                let from = operations.len().saturating_sub(RECENT_OPERATIONS);
                prop_assert_eq!(window.recent(), &operations[from..]);
            }
        }
        for row in window.archive(keep) {
            archive.insert(row.index, row.operation);
        }
        prop_assert_eq!(window.assemble(rows(&archive, |_| true)), Ok(whole.clone()));
    }
    Ok(())
}

fn rows(
    archive: &BTreeMap<u32, Operation>,
    keep: impl Fn(&Operation) -> bool,
) -> Vec<ArchivedOperation> {
    archive
        .iter()
        .filter(|(_, op)| keep(op))
        .map(|(index, op)| ArchivedOperation {
            index: *index,
            operation: op.clone(),
        })
        .collect()
}

// ------------------------------------------------------------- transfers

/// An in-memory event store with the one property that matters here:
/// an append of several streams is atomic and checks each stream's exact
/// expected version.
#[derive(Default)]
struct Store {
    versions: HashMap<String, u64>,
    guards: BTreeMap<GuardKey, DebitGuard>,
    balances: Balances,
}

impl Store {
    fn guards_for(&self, keys: &[GuardKey]) -> BTreeMap<GuardKey, DebitGuard> {
        keys.iter()
            .map(|k| (k.clone(), self.guards.get(k).copied().unwrap_or_default()))
            .collect()
    }

    /// Appends the entry and its guard events, or nothing on a conflict.
    fn append(&mut self, entry: &JournalEntry, appends: &[guard::GuardAppend]) -> bool {
        let conflict = appends.iter().any(|a| {
            self.versions.get(&a.key.stream()).copied().unwrap_or(0) != a.expected_version
        });
        if conflict {
            return false;
        }
        for a in appends {
            let state = self.guards.get(&a.key).copied().unwrap_or_default();
            let state = a.events.iter().fold(state, guard::evolve);
            self.versions.insert(a.key.stream(), state.version);
            self.guards.insert(a.key.clone(), state);
        }
        post(&mut self.balances, entry);
        true
    }
}

#[derive(Debug, Clone)]
enum Op {
    /// A provider fact credits a customer (a capture).
    Fund(usize, i64),
    /// A provider fact debits a customer (a refund or lost dispute).
    Claw(usize, i64),
    /// Transfers decided against the same snapshot, appended in this order.
    Concurrent(Vec<(usize, usize, i64)>),
}

const ACCOUNTS: [&str; 5] = [
    "customer:1:available",
    "customer:2:available",
    "customer:3:available",
    "merchant:ops",
    "psp:sim:clearing",
];

fn op() -> impl Strategy<Value = Op> {
    let transfer = (0..ACCOUNTS.len(), 0..ACCOUNTS.len(), 1i64..=1_000);
    prop_oneof![
        2 => (0usize..3, 1i64..=1_000).prop_map(|(c, n)| Op::Fund(c, n)),
        1 => (0usize..3, 1i64..=500).prop_map(|(c, n)| Op::Claw(c, n)),
        5 => proptest::collection::vec(transfer, 1..4).prop_map(Op::Concurrent),
    ]
}

fn account(i: usize) -> AccountName {
    AccountName::parse(ACCOUNTS[i]).unwrap()
}

fn fact_entry(store: &mut Store, n: u64, customer: usize, amount: i64) {
    let entry = JournalEntry::in_one_currency(
        EntryId::derived(&format!("fact:{n}")),
        tenant(),
        usd(),
        [(account(4), amt(-amount)), (account(customer), amt(amount))],
    )
    .unwrap();
    let guards = store.guards_for(&guarded_keys(&entry));
    let appends = decide_entry(&entry, Origin::ProviderFact, &guards, at(0)).unwrap();
    assert!(store.append(&entry, &appends), "no concurrency here");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TRANSFER_CASES))]

    #[test]
    fn transfers_never_take_a_customer_below_zero(ops in proptest::collection::vec(op(), 1..30)) {
        let mut store = Store::default();
        let mut n = 0u64;
        for op in ops {
            n += 1;
            match op {
                Op::Fund(c, amount) => fact_entry(&mut store, n, c, amount),
                Op::Claw(c, amount) => fact_entry(&mut store, n, c, -amount),
                Op::Concurrent(transfers) => {
                    // Every transfer reads the same snapshot, as concurrent
                    // requests would; then they append one after the other.
                    let decided: Vec<_> = transfers
                        .iter()
                        .enumerate()
                        .map(|(i, (from, to, amount))| {
                            let request = RequestTransfer {
                                id: TransferId::from_uuid(uuid::Uuid::from_u128(u128::from(n) << 8 | i as u128)),
                                tenant: tenant(),
                                from: account(*from),
                                to: account(*to),
                                amount: amt(*amount),
                                currency: usd(),
                                description: None,
                                pending: false,
                                expires_at: None,
                                at: at(0),
                            };
                            let keys: Vec<GuardKey> =
                                [account(*from), account(*to)].iter().filter(|a| a.is_guarded()).map(|a| GuardKey {
                                    tenant: tenant(),
                                    account: a.clone(),
                                    currency: usd(),
                                }).collect();
                            let decision = decide_with_guards(&Transfer::default(), request.clone(), &store.guards_for(&keys));
                            (request, keys, decision)
                        })
                        .collect();
                    for (request, keys, decision) in decided {
                        let Ok(mut decision) = decision else { continue };
                        let mut attempts = 0;
                        loop {
                            let entry = decision.events.iter().find_map(|e| match e {
                                TransferEvent::EntryPosted(p) => Some(p.entry.clone()),
                                _ => None,
                            }).unwrap();
                            let debited: Vec<AccountName> = entry.legs().iter()
                                .filter(|l| l.amount.is_negative() && l.account.is_customer())
                                .map(|l| l.account.clone()).collect();
                            if store.append(&entry, &decision.guards) {
                                for account in debited {
                                    prop_assert!(balance(&store.balances, &account) >= 0, "{account} went negative");
                                }
                                break;
                            }
                            // Conflict: re-read and re-decide, as the app does.
                            attempts += 1;
                            prop_assert!(attempts < 3, "a conflict that re-deciding cannot resolve");
                            match decide_with_guards(&Transfer::default(), request.clone(), &store.guards_for(&keys)) {
                                Ok(again) => decision = again,
                                Err(rejection) => {
                                    prop_assert_eq!(rejection.code(), "insufficient_funds");
                                    break;
                                }
                            }
                        }
                    }
                }
            }
            // The guard's balance is the account's balance from entries, and
            // the ledger sums to zero.
            for (key, guard) in &store.guards {
                prop_assert_eq!(guard.balance.minor(), balance(&store.balances, &key.account));
            }
            prop_assert!(sum_per_currency(&store.balances).values().all(|s| *s == 0));
        }
    }
}

// ------------------------------------------------------- batches of transfers

/// The keys of every client account of [`ACCOUNTS`], with the states `store` holds.
fn all_guards(store: &Store) -> BTreeMap<GuardKey, DebitGuard> {
    let keys: Vec<GuardKey> = (0..ACCOUNTS.len())
        .map(account)
        .filter(AccountName::is_guarded)
        .map(|account| GuardKey {
            tenant: tenant(),
            account,
            currency: usd(),
        })
        .collect();
    store.guards_for(&keys)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TRANSFER_CASES))]

    /// A batch is its transfers decided one at a time, each on what the ones before leave: the
    /// same events and the same guard states when all pass, and otherwise refused at the first
    /// that one-at-a-time refuses, with the same reason.
    #[test]
    fn a_batch_equals_its_transfers_one_at_a_time(
        funds in proptest::collection::vec(0i64..=400, 3),
        batch in proptest::collection::vec((0usize..4, 0usize..4, 1i64..=300, any::<bool>()), 1..8),
    ) {
        let mut store = Store::default();
        for (customer, amount) in funds.iter().enumerate() {
            if *amount > 0 {
                fact_entry(&mut store, customer as u64, customer, *amount);
            }
        }
        let requests: Vec<RequestTransfer> = batch
            .iter()
            .enumerate()
            .map(|(i, (from, to, amount, pending))| RequestTransfer {
                id: TransferId::from_uuid(uuid::Uuid::from_u128(1_000 + i as u128)),
                tenant: tenant(),
                from: account(*from),
                to: account(*to),
                amount: amt(*amount),
                currency: usd(),
                description: None,
                pending: *pending,
                expires_at: None,
                at: at(0),
            })
            .collect();
        let read = all_guards(&store);
        let batched = asiento_domain::transfer_batch::decide_batch(requests.clone(), &read);
        let mut states = read.clone();
        let mut events = Vec::new();
        let mut refused = None;
        for (index, request) in requests.into_iter().enumerate() {
            match decide_with_guards(&Transfer::default(), request, &states) {
                Ok(decision) => {
                    for append in &decision.guards {
                        prop_assert_eq!(states[&append.key].version, append.expected_version);
                        let after = append.events.iter().fold(states[&append.key], guard::evolve);
                        states.insert(append.key.clone(), after);
                    }
                    events.push(decision.events);
                }
                Err(rejection) => {
                    refused = Some((index, rejection));
                    break;
                }
            }
        }
        match (batched, refused) {
            (Ok(batch), None) => {
                prop_assert_eq!(batch.transfers, events);
                let mut keys = std::collections::BTreeSet::new();
                for append in &batch.guards {
                    prop_assert!(keys.insert(append.key.clone()), "two appends to one guard");
                    prop_assert_eq!(append.expected_version, read[&append.key].version);
                    let after = append.events.iter().fold(read[&append.key], guard::evolve);
                    prop_assert_eq!(after, states[&append.key]);
                }
                for (key, state) in &states {
                    prop_assert!(keys.contains(key) || *state == read[key]);
                }
            }
            (Err(rejection), Some((index, reason))) => {
                prop_assert_eq!(rejection.index, index);
                prop_assert_eq!(rejection.rejection, reason);
            }
            (batched, refused) => prop_assert!(false, "batch {batched:?}, one at a time {refused:?}"),
        }
    }
}

// ------------------------------------------------------- bounded amounts

/// Amounts a client might send: ordinary ones, ones at and around the default and the largest
/// limits, and the extremes of i64.
fn any_amount() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => 1i64..=100_000,
        2 => Just(AMOUNT_MAX_DEFAULT),
        2 => Just(AMOUNT_MAX_CEILING),
        1 => Just(AMOUNT_MAX_CEILING + 1),
        1 => Just(i64::MAX),
        2 => 1i64..=i64::MAX,
    ]
}

fn any_limit() -> impl Strategy<Value = AmountLimit> {
    prop_oneof![
        Just(AmountLimit::DEFAULT),
        Just(AmountLimit::CEILING),
        (1i64..=AMOUNT_MAX_CEILING).prop_map(|max| AmountLimit::new(max).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TRANSFER_CASES))]

    /// The edge's limit, then the domain's decision: whatever a client sends, an accepted amount
    /// is within the limit, no balance a projection keeps (i128) overflows, and a guarded
    /// account's balance (i64 in its guard) is refused at decision time rather than wrapped.
    #[test]
    fn no_sequence_of_accepted_commands_overflows_a_balance(
        limit in any_limit(),
        transfers in proptest::collection::vec((0..ACCOUNTS.len(), 0..ACCOUNTS.len(), any_amount()), 1..60),
    ) {
        let mut balances: BTreeMap<AccountName, Balance> = BTreeMap::new();
        let mut guards: BTreeMap<GuardKey, DebitGuard> = BTreeMap::new();
        for (n, (from, to, minor)) in transfers.into_iter().enumerate() {
            let Ok(amount) = limit.check(amt(minor)) else {
                prop_assert!(minor > limit.max().minor());
                continue;
            };
            let request = RequestTransfer {
                id: TransferId::from_uuid(uuid::Uuid::from_u128(n as u128 + 1)),
                tenant: tenant(),
                from: account(from),
                to: account(to),
                amount,
                currency: usd(),
                description: None,
                pending: false,
                expires_at: None,
                at: at(0),
            };
            let decision = match decide_with_guards(&Transfer::default(), request, &guards_of(&guards, from, to)) {
                Ok(decision) => decision,
                Err(rejection) => {
                    prop_assert!(
                        ["insufficient_funds", "accounts_must_be_different", "account_reserved", "amount_overflow"].contains(&rejection.code()),
                        "{rejection}"
                    );
                    continue;
                }
            };
            for event in &decision.events {
                if let transfer::TransferEvent::EntryPosted(posted) = event {
                    for leg in posted.entry.legs() {
                        prop_assert!(leg.amount.minor().abs() <= limit.max().minor());
                        let slot = balances.entry(leg.account.clone()).or_default();
                        *slot = slot.checked_add(leg.amount).expect("an i128 balance of bounded amounts");
                    }
                }
            }
            for append in decision.guards {
                let state = guards.get(&append.key).copied().unwrap_or_default();
                prop_assert_eq!(state.version, append.expected_version);
                guards.insert(append.key.clone(), append.events.iter().fold(state, guard::evolve));
            }
        }
        for (key, guard) in &guards {
            prop_assert_eq!(i128::from(guard.balance.minor()), balances[&key.account].minor());
        }
        let total = balances.values().try_fold(Balance::ZERO, |sum, b| sum.checked_sum(*b));
        prop_assert_eq!(total, Ok(Balance::ZERO));
    }
}

fn guards_of(
    guards: &BTreeMap<GuardKey, DebitGuard>,
    from: usize,
    to: usize,
) -> BTreeMap<GuardKey, DebitGuard> {
    [account(from), account(to)]
        .into_iter()
        .filter(AccountName::is_guarded)
        .map(|account| {
            let key = GuardKey {
                tenant: tenant(),
                account,
                currency: usd(),
            };
            let state = guards.get(&key).copied().unwrap_or_default();
            (key, state)
        })
        .collect()
}

// ----------------------------------------------------------------- holds

#[derive(Debug, Clone)]
enum HoldOp {
    /// A provider fact credits a customer.
    Fund(usize, i64),
    /// A hold from one account to another.
    Hold(usize, usize, i64),
    /// A plain transfer, competing for the same money.
    Transfer(usize, usize, i64),
    /// Endings of one hold (a post of some amount or all of it, or a void) decided against one
    /// snapshot, as concurrent requests are, then appended in this order.
    End(usize, Vec<HoldAction>),
}

fn hold_op() -> impl Strategy<Value = HoldOp> {
    let accounts = (0usize..4, 0usize..4, 1i64..=600);
    let action = prop_oneof![
        (proptest::option::of(1i64..=700)).prop_map(|amount| HoldAction::Post {
            amount: amount.map(amt)
        }),
        Just(HoldAction::Void),
    ];
    prop_oneof![
        2 => (0usize..3, 1i64..=1_000).prop_map(|(c, n)| HoldOp::Fund(c, n)),
        4 => accounts.clone().prop_map(|(f, t, n)| HoldOp::Hold(f, t, n)),
        2 => accounts.prop_map(|(f, t, n)| HoldOp::Transfer(f, t, n)),
        4 => (0usize..8, proptest::collection::vec(action, 1..4)).prop_map(|(h, a)| HoldOp::End(h, a)),
    ]
}

/// The holds of the run: each transfer aggregate and its stream version.
#[derive(Default)]
struct Holds {
    transfers: Vec<(TransferId, Transfer)>,
    /// How many endings each hold's stream took.
    endings: BTreeMap<TransferId, u32>,
}

fn keys_of(entry_events: &[TransferEvent]) -> Vec<GuardKey> {
    entry_events
        .iter()
        .filter_map(|event| match event {
            TransferEvent::EntryPosted(posted) => Some(guarded_keys(&posted.entry)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn entry_of(events: &[TransferEvent]) -> JournalEntry {
    events
        .iter()
        .find_map(|event| match event {
            TransferEvent::EntryPosted(posted) => Some(posted.entry.clone()),
            _ => None,
        })
        .expect("a decision with its entry")
}

/// What a customer may still spend, from the entries alone: its balance less what holds reserve
/// to leave it (the negated balance of its `pending_debits:` account).
fn available_from_entries(balances: &Balances, account: &AccountName) -> i64 {
    balance(balances, account) + balance(balances, &account.pending(PendingSide::Debits))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(TRANSFER_CASES))]

    /// Holds, transfers and concurrent endings of one hold: no command takes a customer's
    /// available balance below zero, every guard agrees with the entries on its posted balance
    /// and on both pending amounts, a hold ends at most once (of racing endings exactly one
    /// wins), and once every hold has ended nothing is left on any pending account.
    #[test]
    fn holds_reserve_exactly_and_end_once(ops in proptest::collection::vec(hold_op(), 1..40)) {
        let mut store = Store::default();
        let mut holds = Holds::default();
        for (n, op) in ops.into_iter().enumerate() {
            let id = TransferId::from_uuid(uuid::Uuid::from_u128(n as u128 + 1));
            match op {
                HoldOp::Fund(c, amount) => fact_entry(&mut store, n as u64, c, amount),
                HoldOp::Hold(from, to, amount) | HoldOp::Transfer(from, to, amount) => {
                    let pending = matches!(op, HoldOp::Hold(..));
                    let request = RequestTransfer {
                        id,
                        tenant: tenant(),
                        from: account(from),
                        to: account(to),
                        amount: amt(amount),
                        currency: usd(),
                        description: None,
                        pending,
                        expires_at: None,
                        at: at(0),
                    };
                    let Ok(events) = transfer::decide(&Transfer::default(), request.clone()) else {
                        prop_assert_eq!(from, to);
                        continue;
                    };
                    let guards = store.guards_for(&keys_of(&events));
                    match decide_with_guards(&Transfer::default(), request, &guards) {
                        Ok(decision) => {
                            prop_assert!(store.append(&entry_of(&decision.events), &decision.guards));
                            if pending {
                                let transfer = decision.events.iter().fold(Transfer::default(), transfer::evolve);
                                holds.transfers.push((id, transfer));
                            }
                        }
                        Err(rejection) => prop_assert_eq!(rejection.code(), "insufficient_funds"),
                    }
                }
                HoldOp::End(which, actions) => {
                    if holds.transfers.is_empty() {
                        continue;
                    }
                    let slot = which % holds.transfers.len();
                    let (hold_id, snapshot) = holds.transfers[slot].clone();
                    let commands: Vec<SettleHold> = actions
                        .into_iter()
                        .map(|action| SettleHold { id: hold_id, tenant: tenant(), action, at: at(1) })
                        .collect();
                    let decided: Vec<_> = commands
                        .iter()
                        .map(|command| {
                            let guards = hold::decide(&snapshot, command)
                                .map(|events| store.guards_for(&keys_of(&events)))
                                .unwrap_or_default();
                            hold::decide_with_guards(&snapshot, command, &guards)
                        })
                        .collect();
                    for (command, decision) in commands.iter().zip(decided) {
                        let Ok(decision) = decision else { continue };
                        let (_, current) = &holds.transfers[slot];
                        // The transfer's stream version decides: only an append at the version
                        // the decision read wins.
                        if current.version != snapshot.version {
                            let again = hold::decide(current, command).unwrap_err();
                            prop_assert!(["hold_posted", "hold_voided"].contains(&again.code()), "{again}");
                            continue;
                        }
                        prop_assert!(store.append(&entry_of(&decision.events), &decision.guards));
                        let ended = decision.events.iter().fold(current.clone(), transfer::evolve);
                        holds.transfers[slot].1 = ended;
                        *holds.endings.entry(hold_id).or_default() += 1;
                    }
                }
            }
            for c in 0..3 {
                let customer = account(c);
                prop_assert!(available_from_entries(&store.balances, &customer) >= 0, "{customer}");
            }
            for (key, guard) in &store.guards {
                prop_assert_eq!(guard.balance.minor(), balance(&store.balances, &key.account));
                prop_assert_eq!(guard.pending_debits.minor(), -balance(&store.balances, &key.account.pending(PendingSide::Debits)));
                prop_assert_eq!(guard.pending_credits.minor(), balance(&store.balances, &key.account.pending(PendingSide::Credits)));
            }
            prop_assert!(sum_per_currency(&store.balances).values().all(|s| *s == 0));
        }
        prop_assert!(holds.endings.values().all(|count| *count == 1));
        // Void what is still open: then nothing is reserved anywhere.
        for (hold_id, transfer) in &holds.transfers {
            let command = SettleHold { id: *hold_id, tenant: tenant(), action: HoldAction::Void, at: at(2) };
            let Ok(events) = hold::decide(transfer, &command) else { continue };
            let guards = store.guards_for(&keys_of(&events));
            let decision = hold::decide_with_guards(transfer, &command, &guards);
            prop_assert!(decision.is_ok(), "a void is never refused: {:?}", decision);
            let decision = decision.unwrap();
            prop_assert!(store.append(&entry_of(&decision.events), &decision.guards));
        }
        for ((account, _), balance) in &store.balances {
            if account.pending_of().is_some() {
                prop_assert_eq!(*balance, 0, "{} keeps a reservation", account);
            }
        }
    }
}

#[test]
fn transfer_rejections_surface_through_the_transfer_family() {
    let request = RequestTransfer {
        id: TransferId::from_uuid(uuid::Uuid::from_u128(1)),
        tenant: tenant(),
        from: account(0),
        to: account(1),
        amount: amt(1),
        currency: usd(),
        description: None,
        pending: false,
        expires_at: None,
        at: at(0),
    };
    let keys: Vec<GuardKey> = [0, 1]
        .iter()
        .map(|i| GuardKey {
            tenant: tenant(),
            account: account(*i),
            currency: usd(),
        })
        .collect();
    let store = Store::default();
    let refused = decide_with_guards(&Transfer::default(), request, &store.guards_for(&keys));
    assert!(matches!(
        refused,
        Err(transfer::TransferRejection::Guard(_))
    ));
}
