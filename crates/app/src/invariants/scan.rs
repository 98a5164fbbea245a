//! The checker's read of the log: stream versions, the hash chain against the seals, entries,
//! captures, guards and payouts, tallied while the events go by in the gap-free global order.
//!
//! Its memory is bounded, whatever the log's size. The tallies hold state per stream (the chain's
//! head, a capture count, a payment's clearing legs), so one pass over a log of millions of
//! payments would hold millions of entries, every time `serve` runs its scheduled check. A pass
//! keeps state only for the streams of its [`Share`]: a log with more streams than
//! [`super::Checker::streams_per_pass`] is read in as many passes as it takes, each one the same
//! stretch of the log (up to its head when the check began), and the passes' findings together are
//! those of one pass over everything. A check that crosses streams is tallied under the stream
//! its finding is named by: an entry's legs under the guard stream they change, a payout line
//! under its payment.

use std::collections::{BTreeMap, HashMap};

use asiento_domain::guard;
use asiento_domain::stream::PAYMENT_PREFIX;
use asiento_domain::{
    payment_stream, DebitGuard, EntryId, Event, GuardEvent, JournalEntry, PaymentEvent, PaymentId,
    StreamKind,
};
use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent};

use super::payouts::PayoutTally;
use super::{
    event_hash, seal_cursor, seals_at, Check, Checker, InvariantError, Report, EVENTS_PER_BATCH_MAX,
};

/// The streams one pass keeps state for: those whose id hashes to `pass` modulo `passes`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Share {
    pass: u64,
    passes: u64,
}

impl Share {
    pub(super) fn holds(&self, stream_id: &str) -> bool {
        self.passes == 1 || fnv1a(stream_id.as_bytes()) % self.passes == self.pass
    }

    /// Whether `payment`'s stream is in the share (a payout line is tallied under its payment).
    pub(super) fn holds_payment(&self, payment: PaymentId) -> bool {
        self.passes == 1 || self.holds(&payment_stream(payment))
    }
}

/// FNV-1a, 64 bits: a stream's share must not depend on the process (std's hasher is seeded).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Each stream's last version and chain hash: a payment's (most of the log's streams) keyed by
/// its id, in 16 bytes, any other by its name. Only a payment stream spelled exactly as
/// `payment_stream` spells it is keyed by id, so that two different names never share a key.
#[derive(Default)]
struct Heads {
    payments: HashMap<PaymentId, Head>,
    named: HashMap<String, Head>,
}

type Head = (u64, [u8; 32]);

impl Heads {
    fn get(&self, stream_id: &str) -> Option<Head> {
        match canonical_payment(stream_id) {
            Some(payment) => self.payments.get(&payment).copied(),
            None => self.named.get(stream_id).copied(),
        }
    }

    fn set(&mut self, stream_id: &str, head: Head) {
        match canonical_payment(stream_id) {
            Some(payment) => {
                self.payments.insert(payment, head);
            }
            None => match self.named.get_mut(stream_id) {
                Some(known) => *known = head,
                None => {
                    self.named.insert(stream_id.to_owned(), head);
                }
            },
        }
    }
}

/// The payment whose stream `stream_id` is, when it is spelled as `payment_stream` spells it.
fn canonical_payment(stream_id: &str) -> Option<PaymentId> {
    let hex = stream_id
        .strip_prefix(PAYMENT_PREFIX)?
        .strip_prefix(PaymentId::PREFIX)?;
    // `parse` also takes other spellings of a uuid: keep only the one `Display` writes.
    let payment = PaymentId::parse(hex).ok()?;
    let mut spelled = [0u8; uuid::fmt::Simple::LENGTH];
    (payment.as_uuid().simple().encode_lower(&mut spelled) == hex).then_some(payment)
}

/// Streams in the log (each has exactly one first event).
async fn count_streams(database: &Database) -> Result<u64, sqlx::Error> {
    let sql = "select count(*) from events where version = 1";
    let count: i64 = match database {
        Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
    };
    Ok(u64::try_from(count).unwrap_or(0))
}

/// Per client account and currency (keyed by its guard stream's name): the posted balance and
/// the pending debits and credits its last guard event carries, and the same three summed from
/// the legs of journal entries (a leg on a pending account counts for the account it reserves
/// for, see [`guard::guard_changes`]).
#[derive(Default)]
struct GuardTally {
    guards: HashMap<String, [i128; 3]>,
    entries: HashMap<String, [i128; 3]>,
}

impl GuardTally {
    fn guard(&mut self, stream_id: &str, event: &GuardEvent) {
        let guard = DebitGuard::from_last(0, event);
        let state = [guard.balance, guard.pending_debits, guard.pending_credits]
            .map(|amount| i128::from(amount.minor()));
        self.guards.insert(stream_id.to_owned(), state);
    }

    /// Adds the entry's changes to the guards of `share`; `named` when the entry's own stream is
    /// in it (an entry that cannot be split into guard changes is named once).
    fn entry(&mut self, entry: &JournalEntry, share: Share, named: bool, report: &mut Report) {
        let changes = match guard::guard_changes(entry) {
            Ok(changes) => changes,
            Err(error) => {
                if named {
                    report.push(
                        Check::GuardBalance,
                        entry.id().to_string(),
                        format!("its legs do not add up: {error}"),
                    );
                }
                return;
            }
        };
        for (key, change) in changes {
            let stream = key.stream();
            if !share.holds(&stream) {
                continue;
            }
            let sums = self.entries.entry(stream).or_default();
            for (sum, amount) in
                sums.iter_mut()
                    .zip([change.posted, change.pending_debits, change.pending_credits])
            {
                *sum += i128::from(amount.minor());
            }
        }
    }

    fn report(self, report: &mut Report) {
        let mut keys: Vec<&String> = self.guards.keys().chain(self.entries.keys()).collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let subject = key.strip_prefix("account-").unwrap_or(key);
            let entries = self.entries.get(key).copied().unwrap_or_default();
            match self.guards.get(key) {
                Some(guard) if *guard == entries => {}
                Some([posted, debits, credits]) => report.push(
                    Check::GuardBalance,
                    subject,
                    format!(
                        "the guard says {posted} posted, {debits} pending debits, {credits} \
                         pending credits; the entries say {}, {}, {}",
                        entries[0], entries[1], entries[2]
                    ),
                ),
                None if entries == [0; 3] => {}
                None => report.push(
                    Check::GuardBalance,
                    subject,
                    format!(
                        "entries sum to {} posted, {} pending debits, {} pending credits but \
                         the account has no guard",
                        entries[0], entries[1], entries[2]
                    ),
                ),
            }
        }
    }
}

/// Per payment: ChargeCaptured events seen, capture postings seen.
#[derive(Default)]
struct CaptureCount {
    captured: u32,
    postings: u32,
}

/// What one pass keeps, for the streams of its share: about 200 bytes a payment.
#[derive(Default)]
struct Tallies {
    heads: Heads,
    /// Per stream, the first event the sealer passed that no seal covers yet (version,
    /// position): a later seal of its stream covers it; one left at the end has none.
    awaiting_seal: HashMap<String, (u64, i64)>,
    captures: HashMap<PaymentId, CaptureCount>,
    guards: GuardTally,
    payouts: PayoutTally,
}

impl Checker {
    pub(super) async fn scan_log(&self, report: &mut Report) -> Result<(), InvariantError> {
        // Payloads as stored: the chain covers the bytes written, not an upcast view of them.
        let store = self.database.event_store();
        let sealed_through = seal_cursor(&self.database).await?;
        // The log as it stands now: what is appended while the check runs waits for the next
        // one (a check chasing a log that grows under load would never end, nor its tallies).
        let until = store.head().await?;
        let streams = count_streams(&self.database).await?;
        let per_pass = u64::try_from(self.streams_per_pass.max(1)).unwrap_or(u64::MAX);
        let passes = streams.div_ceil(per_pass).max(1);
        for pass in 0..passes {
            let share = Share { pass, passes };
            self.scan_pass(store.as_ref(), share, sealed_through, until, report)
                .await?;
        }
        report.passes = passes;
        Ok(())
    }

    /// Reads the log up to `until`, checking the streams of `share`.
    async fn scan_pass(
        &self,
        store: &dyn EventStore,
        share: Share,
        sealed_through: Cursor,
        until: Cursor,
        report: &mut Report,
    ) -> Result<(), InvariantError> {
        let mut tallies = Tallies::default();
        let mut cursor = Cursor::START;
        loop {
            let batch = store.read_all(cursor, EVENTS_PER_BATCH_MAX).await?;
            let read = batch.len();
            let kept = batch.partition_point(|event| event.cursor <= until);
            let events = &batch[..kept];
            let Some(last) = events.last() else {
                break;
            };
            cursor = last.cursor;
            let positions: Vec<i64> = events
                .iter()
                .filter(|event| share.holds(&event.stream_id))
                .map(|event| event.position)
                .collect();
            let seals = seals_at(&self.database, &positions).await?;
            for event in events {
                let named = share.holds(&event.stream_id);
                if named {
                    chain(event, &seals, sealed_through, &mut tallies, report);
                }
                self.check_event(event, share, named, &mut tallies, report);
            }
            if read < EVENTS_PER_BATCH_MAX || kept < read {
                break;
            }
        }
        let mut awaiting_seal: Vec<_> = tallies.awaiting_seal.into_iter().collect();
        awaiting_seal.sort_by_key(|(_, (_, position))| *position);
        for (stream, (version, position)) in awaiting_seal {
            report.push(
                Check::HashChain,
                stream,
                format!(
                    "version {version} (position {position}) has no seal at or after it although \
                     the sealer passed it"
                ),
            );
        }
        tallies.guards.report(report);
        tallies.payouts.report(share, report);
        let mut payments: Vec<_> = tallies.captures.into_iter().collect();
        payments.sort_by_key(|(payment, _)| *payment);
        for (payment, count) in payments {
            let expected = u32::from(count.captured > 0);
            if count.postings != expected || count.captured > 1 {
                report.push(
                    Check::CapturePosting,
                    payment.to_string(),
                    format!(
                        "{} capture fact(s) and {} capture posting(s); expected exactly one posting per captured payment",
                        count.captured, count.postings
                    ),
                );
            }
        }
        Ok(())
    }

    /// The checks of one event's payload. `named`: its stream is in the pass's share, so what
    /// is found about the event itself is reported in this pass; otherwise only what it adds to
    /// the share's streams is tallied (an entry's legs, a payout's lines).
    fn check_event(
        &self,
        event: &RecordedEvent,
        share: Share,
        named: bool,
        tallies: &mut Tallies,
        report: &mut Report,
    ) {
        let kind = StreamKind::parse(&event.stream_id);
        let crosses =
            event.event_type == "EntryPosted" || matches!(kind, Some(StreamKind::Payout { .. }));
        if !named && !crosses {
            return;
        }
        let decoded = Event::decode_raw(
            &event.stream_id,
            &event.event_type,
            event.schema,
            event.data.raw(),
        );
        let decoded = match decoded {
            Ok(decoded) => decoded,
            Err(error) if named => {
                // An unbalanced entry cannot decode: name it by the id it claims.
                if event.event_type == "EntryPosted" {
                    let id = event.data["entry"]["id"].as_str().unwrap_or("(no id)");
                    report.push(
                        Check::EntryZeroSum,
                        id,
                        format!(
                            "entry in {} version {} is not a valid journal entry: {error}",
                            event.stream_id, event.version
                        ),
                    );
                } else {
                    report.push(
                        Check::Undecodable,
                        &event.stream_id,
                        format!("version {}: {error}", event.version),
                    );
                }
                return;
            }
            Err(_) => return,
        };
        if let (true, Some(StreamKind::Guard { .. }), Event::Guard(guard_event)) =
            (named, &kind, &decoded)
        {
            tallies.guards.guard(&event.stream_id, guard_event);
        }
        if let Some(entry) = decoded.entry() {
            tallies.guards.entry(entry, share, named, report);
            if named {
                zero_sum(entry, report);
            }
        }
        if let Event::Payout(payout_event) = &decoded {
            tallies
                .payouts
                .payout_event(&event.stream_id, payout_event, share, report);
        }
        if let (true, Some(StreamKind::Payment(id)), Event::Payment(payment_event)) =
            (named, &kind, &decoded)
        {
            let id = *id;
            if let PaymentEvent::EntryPosted(posted) = payment_event {
                tallies
                    .payouts
                    .payment_entry(id, event.version, &posted.entry);
            }
            let count = tallies.captures.entry(id).or_default();
            match payment_event {
                PaymentEvent::ChargeCaptured(_) => count.captured += 1,
                PaymentEvent::EntryPosted(posted)
                    if posted.entry.id() == EntryId::derived(&format!("{id}:capture")) =>
                {
                    count.postings += 1
                }
                _ => {}
            }
        }
    }
}

/// Checked again where it is read, though a JournalEntry cannot be built unbalanced.
fn zero_sum(entry: &JournalEntry, report: &mut Report) {
    let mut sums: BTreeMap<&str, i128> = BTreeMap::new();
    for leg in entry.legs() {
        *sums.entry(leg.currency.code()).or_default() += i128::from(leg.amount.minor());
    }
    for (currency, sum) in sums {
        if sum != 0 {
            report.push(
                Check::EntryZeroSum,
                entry.id().to_string(),
                format!("{currency} legs sum to {sum}"),
            );
        }
    }
}

/// The stream's version and hash chain at one event, against its seal if it has one.
fn chain(
    event: &RecordedEvent,
    seals: &HashMap<i64, (String, i64, Vec<u8>)>,
    sealed_through: Cursor,
    tallies: &mut Tallies,
    report: &mut Report,
) {
    report.events_checked += 1;
    let heads = &mut tallies.heads;
    let (last_version, previous) = match heads.get(&event.stream_id) {
        Some((version, hash)) => (version, Some(hash)),
        None => {
            report.streams_checked += 1;
            (0, None)
        }
    };
    if event.version != last_version + 1 {
        report.push(
            Check::StreamVersions,
            &event.stream_id,
            format!(
                "version {} follows version {last_version} (position {})",
                event.version, event.position
            ),
        );
    }
    let hash = event_hash(previous.as_ref().map(|h| &h[..]), event);
    heads.set(&event.stream_id, (event.version, hash));
    match seals.get(&event.position) {
        Some((stream, version, sealed)) => {
            let seals_this_event =
                stream == &event.stream_id && u64::try_from(*version).ok() == Some(event.version);
            if !seals_this_event {
                report.push(
                    Check::HashChain,
                    &event.stream_id,
                    format!(
                        "position {} holds version {} but was sealed as {stream} version {version}",
                        event.position, event.version
                    ),
                );
            } else {
                tallies.awaiting_seal.remove(&event.stream_id);
                if sealed.as_slice() != hash {
                    // Go on from the sealed hash, so that only the changed events are named, not
                    // every event after them.
                    if let Ok(sealed) = <[u8; 32]>::try_from(sealed.as_slice()) {
                        heads.set(&event.stream_id, (event.version, sealed));
                    }
                    report.push(
                        Check::HashChain,
                        &event.stream_id,
                        format!(
                            "version {} (position {}) does not match its seal: it or an event of \
                             its stream after the previous seal was changed",
                            event.version, event.position
                        ),
                    );
                }
            }
        }
        None if event.cursor <= sealed_through => {
            tallies
                .awaiting_seal
                .entry(event.stream_id.clone())
                .or_insert((event.version, event.position));
        }
        None => report.unsealed += 1,
    }
}
