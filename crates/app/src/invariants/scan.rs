//! The checker's read of the log: stream versions, the hash chain against the seals, entries,
//! captures, guards and payouts, tallied while the events go by.
//!
//! Its memory is bounded, whatever the log's size. The tallies hold state per stream (the chain's
//! head, a capture count, a payment's clearing legs), so one pass over a log of millions of
//! payments would hold millions of entries, every time `serve` runs its scheduled check. A log
//! with at most [`super::Checker::streams_per_pass`] streams is read once, in the gap-free global
//! order, with every tally. A longer one is read in passes that together read it about twice,
//! however many there are:
//! - **crossing passes** read the whole log in the global order for what crosses streams: the
//!   guards (an entry's legs are tallied under the guard streams they change, and a pass keeps
//!   the guards whose id hashes to it: one pass unless there are more guards than a pass holds),
//!   and the positions of the payouts' events (the first pass);
//! - **stream passes** each read the events of the next streams in the store's order of stream
//!   ids, one page at a time, and check them; then the payouts' events, by position in the
//!   global order, for the lines of their payments (a payout line is tallied under its payment)
//!   and, for the payouts among the pass's streams, their own findings.
//!
//! Every pass reads the log as it stood when the check began: what is appended while it runs
//! waits for the next check. The passes' findings together are those of one pass over
//! everything, except about a payout line naming a payment whose stream is not in the log at
//! all: only the single pass tallies it, under no stream.

use std::collections::{BTreeMap, HashMap, HashSet};

use asiento_domain::guard;
use asiento_domain::stream::{GUARD_PREFIX, PAYMENT_PREFIX};
use asiento_domain::AmountError;
use asiento_domain::{
    payment_stream, DebitGuard, EntryId, Event, GuardEvent, JournalEntry, PaymentEvent, PaymentId,
    StreamKind,
};
use asiento_eventstore::{Cursor, Database, EventStore, RecordedEvent, StoreError};

use super::payouts::PayoutTally;
use super::{
    event_hash, seal_cursor, seals_at, Check, Checker, InvariantError, Report, EVENTS_PER_BATCH_MAX,
};

/// The streams one pass keeps state for.
pub(super) enum Share {
    /// Every stream: the log in one pass.
    All,
    /// A crossing pass: the guard streams whose id hashes to `pass` modulo `passes`.
    Guards { pass: u64, passes: u64 },
    /// A stream pass: the streams it reads.
    Listed {
        payments: HashSet<PaymentId>,
        named: HashSet<String>,
    },
}

impl Share {
    fn listed(stream_ids: &[String]) -> Share {
        let mut payments = HashSet::new();
        let mut named = HashSet::new();
        for stream_id in stream_ids {
            match canonical_payment(stream_id) {
                Some(payment) => {
                    payments.insert(payment);
                }
                None => {
                    named.insert(stream_id.clone());
                }
            }
        }
        Share::Listed { payments, named }
    }

    pub(super) fn holds(&self, stream_id: &str) -> bool {
        match self {
            Share::All => true,
            Share::Guards { pass, passes } => fnv1a(stream_id.as_bytes()) % passes == *pass,
            Share::Listed { payments, named } => match canonical_payment(stream_id) {
                Some(payment) => payments.contains(&payment),
                None => named.contains(stream_id),
            },
        }
    }

    /// Whether `payment`'s stream is in the share (a payout line is tallied under its payment).
    pub(super) fn holds_payment(&self, payment: PaymentId) -> bool {
        match self {
            Share::All => true,
            Share::Listed { payments, .. } => payments.contains(&payment),
            Share::Guards { .. } => self.holds(&payment_stream(payment)),
        }
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

/// Streams in the log with `prefix` (each has exactly one first event).
async fn count_streams(database: &Database, prefix: &str) -> Result<u64, sqlx::Error> {
    // LIKE ignores case on SQLite: the prefix is compared exactly too.
    let sql = "select count(*) from events where version = 1 and stream_id like $1 \
               and substr(stream_id, 1, $2) = $3";
    let pattern = format!("{prefix}%");
    let length = i32::try_from(prefix.len()).unwrap_or(i32::MAX);
    let count: i64 = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar(sql)
                .bind(pattern)
                .bind(length)
                .bind(prefix)
                .fetch_one(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar(&super::sqlite(sql))
                .bind(pattern)
                .bind(length)
                .bind(prefix)
                .fetch_one(pool)
                .await?
        }
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

    /// Adds the entry's changes to the guards of `share`; an entry that cannot be split into
    /// guard changes adds nothing (its own stream's pass names it).
    fn entry(&mut self, entry: &JournalEntry, share: &Share) -> Result<(), AmountError> {
        for (key, change) in guard::guard_changes(entry)? {
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
        Ok(())
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
    /// `None` in a stream pass: the crossing passes tally the guards.
    guards: Option<GuardTally>,
    payouts: PayoutTally,
    /// A stream pass reads the payouts' events after its streams, by position, instead of as
    /// they go by.
    payouts_by_position: bool,
}

/// Streams a stream pass asks for at once: a payment's stream holds about eight events.
const STREAMS_PER_PAGE: usize = EVENTS_PER_BATCH_MAX / 8;

/// The next page of the log after `cursor`, up to `until`, moving `cursor` on; empty at the end.
async fn next_page(
    store: &dyn EventStore,
    cursor: &mut Cursor,
    until: Cursor,
) -> Result<Vec<RecordedEvent>, StoreError> {
    if *cursor >= until {
        return Ok(Vec::new());
    }
    let mut page = store.read_all(*cursor, EVENTS_PER_BATCH_MAX).await?;
    page.truncate(page.partition_point(|event| event.cursor <= until));
    if let Some(last) = page.last() {
        *cursor = last.cursor;
    }
    Ok(page)
}

/// Up to `count` ids of the streams after `after`, in the store's order.
async fn next_streams(
    store: &dyn EventStore,
    after: Option<&str>,
    count: usize,
) -> Result<Vec<String>, StoreError> {
    let mut streams: Vec<String> = Vec::new();
    while streams.len() < count {
        let from = streams.last().map(String::as_str).or(after);
        let page = store.stream_ids_after(from, count - streams.len()).await?;
        if page.is_empty() {
            break;
        }
        streams.extend(page);
    }
    Ok(streams)
}

impl Checker {
    pub(super) async fn scan_log(&self, report: &mut Report) -> Result<(), InvariantError> {
        // Payloads as stored: the chain covers the bytes written, not an upcast view of them.
        let store = self.database.event_store();
        let store = store.as_ref();
        let sealed_through = seal_cursor(&self.database).await?;
        // The log as it stands now: what is appended while the check runs waits for the next
        // one (a check chasing a log that grows under load would never end, nor its tallies).
        let until = store.head().await?;
        let per_pass = self.streams_per_pass.max(1);
        let per_pass_u64 = u64::try_from(per_pass).unwrap_or(u64::MAX);
        if count_streams(&self.database, "").await? <= per_pass_u64 {
            let mut tallies = Tallies {
                guards: Some(GuardTally::default()),
                ..Tallies::default()
            };
            let mut cursor = Cursor::START;
            loop {
                let page = next_page(store, &mut cursor, until).await?;
                if page.is_empty() {
                    break;
                }
                report.events_read += page.len() as u64;
                self.check_page(&page, &Share::All, sealed_through, &mut tallies, report)
                    .await?;
            }
            finish(tallies, &Share::All, report);
            report.passes = 1;
            return Ok(());
        }
        let guards = count_streams(&self.database, GUARD_PREFIX).await?;
        let crossing = guards.div_ceil(per_pass_u64).max(1);
        let mut payouts = Vec::new();
        for pass in 0..crossing {
            let share = Share::Guards {
                pass,
                passes: crossing,
            };
            let payouts = (pass == 0).then_some(&mut payouts);
            scan_crossing(store, &share, until, payouts, report).await?;
        }
        report.passes = crossing;
        let mut streams = next_streams(store, None, per_pass).await?;
        while !streams.is_empty() {
            self.scan_streams(store, &streams, sealed_through, until, &payouts, report)
                .await?;
            report.passes += 1;
            let last = streams.last().cloned();
            streams = next_streams(store, last.as_deref(), per_pass).await?;
        }
        Ok(())
    }

    /// A stream pass: the events of `streams` up to `until`, then the payouts' events at
    /// `payouts` (positions, in the global order) for the lines of the streams' payments.
    async fn scan_streams(
        &self,
        store: &dyn EventStore,
        streams: &[String],
        sealed_through: Cursor,
        until: Cursor,
        payouts: &[i64],
        report: &mut Report,
    ) -> Result<(), InvariantError> {
        let share = Share::listed(streams);
        let mut tallies = Tallies {
            payouts_by_position: true,
            ..Tallies::default()
        };
        // The first stream not yet read whole, and where in it the next page starts.
        let mut from = 0;
        let mut after: Option<(String, u64)> = None;
        while from < streams.len() {
            // Streams asked for: the database reads every event of them after `after` to sort
            // the page, so about as many as a page of payments' streams holds.
            let asked = &streams[from..streams.len().min(from + STREAMS_PER_PAGE)];
            let at = after
                .as_ref()
                .map(|(stream, version)| (stream.as_str(), *version));
            let mut page = store
                .read_streams_page(asked, at, EVENTS_PER_BATCH_MAX)
                .await?;
            match page.last().filter(|_| page.len() == EVENTS_PER_BATCH_MAX) {
                Some(last) => {
                    let offset = asked
                        .iter()
                        .position(|stream| *stream == last.stream_id)
                        .expect("a page holds only the streams it asked for");
                    from += offset;
                    after = Some((last.stream_id.clone(), last.version));
                }
                None => {
                    from += asked.len();
                    after = None;
                }
            }
            page.retain(|event| event.cursor <= until);
            report.events_read += page.len() as u64;
            self.check_page(&page, &share, sealed_through, &mut tallies, report)
                .await?;
        }
        for positions in payouts.chunks(EVENTS_PER_BATCH_MAX) {
            let events = store.read_positions(positions).await?;
            report.events_read += events.len() as u64;
            for event in events {
                let decoded = Event::decode_raw(
                    &event.stream_id,
                    &event.event_type,
                    event.schema,
                    event.data.raw(),
                );
                // One that does not decode is named in its own stream's pass.
                if let Ok(Event::Payout(payout_event)) = decoded {
                    tallies
                        .payouts
                        .payout_event(&event.stream_id, &payout_event, &share, report);
                }
            }
        }
        finish(tallies, &share, report);
        Ok(())
    }

    /// Checks a page of events of the pass's streams.
    async fn check_page(
        &self,
        events: &[RecordedEvent],
        share: &Share,
        sealed_through: Cursor,
        tallies: &mut Tallies,
        report: &mut Report,
    ) -> Result<(), InvariantError> {
        let positions: Vec<i64> = events.iter().map(|event| event.position).collect();
        let seals = seals_at(&self.database, &positions).await?;
        for event in events {
            chain(event, &seals, sealed_through, tallies, report);
            check_event(event, share, tallies, report);
        }
        Ok(())
    }
}

/// A crossing pass: the guards of `share` against every entry's legs, and the positions of the
/// payouts' events into `payouts` when given.
async fn scan_crossing(
    store: &dyn EventStore,
    share: &Share,
    until: Cursor,
    mut payouts: Option<&mut Vec<i64>>,
    report: &mut Report,
) -> Result<(), InvariantError> {
    let mut guards = GuardTally::default();
    let mut cursor = Cursor::START;
    loop {
        let page = next_page(store, &mut cursor, until).await?;
        if page.is_empty() {
            break;
        }
        report.events_read += page.len() as u64;
        for event in &page {
            let kind = StreamKind::parse(&event.stream_id);
            if let (Some(payouts), Some(StreamKind::Payout { .. })) = (payouts.as_mut(), &kind) {
                payouts.push(event.position);
            }
            let guard_event =
                matches!(kind, Some(StreamKind::Guard { .. })) && share.holds(&event.stream_id);
            if !guard_event && event.event_type != "EntryPosted" {
                continue;
            }
            let decoded = Event::decode_raw(
                &event.stream_id,
                &event.event_type,
                event.schema,
                event.data.raw(),
            );
            // One that does not decode is named in its own stream's pass.
            let Ok(decoded) = decoded else {
                continue;
            };
            if let (true, Event::Guard(guard_event)) = (guard_event, &decoded) {
                guards.guard(&event.stream_id, guard_event);
            }
            if let Some(entry) = decoded.entry() {
                // An entry that does not split into guard changes is named in its stream's pass.
                guards.entry(entry, share).ok();
            }
        }
    }
    guards.report(report);
    Ok(())
}

/// What a pass found once its events are read: events the sealer passed without a seal, guards
/// against their entries, payouts, and captures.
fn finish(tallies: Tallies, share: &Share, report: &mut Report) {
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
    if let Some(guards) = tallies.guards {
        guards.report(report);
    }
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
}

/// The checks of one event's payload, of a stream of the pass's share.
fn check_event(event: &RecordedEvent, share: &Share, tallies: &mut Tallies, report: &mut Report) {
    let kind = StreamKind::parse(&event.stream_id);
    let decoded = Event::decode_raw(
        &event.stream_id,
        &event.event_type,
        event.schema,
        event.data.raw(),
    );
    let decoded = match decoded {
        Ok(decoded) => decoded,
        Err(error) => {
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
    };
    if let (Some(StreamKind::Guard { .. }), Event::Guard(guard_event), Some(guards)) =
        (&kind, &decoded, tallies.guards.as_mut())
    {
        guards.guard(&event.stream_id, guard_event);
    }
    if let Some(entry) = decoded.entry() {
        let split = match tallies.guards.as_mut() {
            Some(guards) => guards.entry(entry, share),
            None => guard::guard_changes(entry).map(drop),
        };
        if let Err(error) = split {
            report.push(
                Check::GuardBalance,
                entry.id().to_string(),
                format!("its legs do not add up: {error}"),
            );
        }
        zero_sum(entry, report);
    }
    if let (Event::Payout(payout_event), false) = (&decoded, tallies.payouts_by_position) {
        tallies
            .payouts
            .payout_event(&event.stream_id, payout_event, share, report);
    }
    if let (Some(StreamKind::Payment(id)), Event::Payment(payment_event)) = (&kind, &decoded) {
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
