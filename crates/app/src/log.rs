//! Between the domain and the event log: loading aggregates by folding their streams, loading
//! debit guards from their last event, and turning a decision (events for one aggregate plus the
//! guard events of the entries it posts) into one atomic multi-stream append with exact expected
//! versions. Every writer of money goes through [`decision_appends`], so no path can post an entry
//! without its guards.
//!
//! Every decision reads what its expected versions rest on (the aggregate and its guards) before
//! the transaction that appends it begins. Then a stream's versions also appear in the log's
//! `(xact, position)` order: a transaction that read a version after its first write could
//! overtake the writer of that version in the global order (the payments projection tolerates
//! versions out of order anyway).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use asiento_domain::{
    guard::{self, guarded_keys, GuardAppend},
    monitor::Monitor,
    payment_stream,
    payout::Payout,
    payout_stream, transfer_stream, DebitGuard, DecodeError, EncodeError, GuardEvent, GuardKey,
    JournalEntry, MonitorEvent, Payment, PaymentEvent, PaymentId, PayoutEvent, PayoutId,
    ProviderName, Transfer, TransferEvent, TransferId,
};
use asiento_eventstore::{
    AppendError, EventStore, ExpectedVersion, Metadata, NewEvent, RecordedEvent, StoreError,
    StreamAppend, READ_BATCH_MAX,
};
use uuid::Uuid;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("stored event does not decode: {0}")]
    Decode(#[from] DecodeError),
    #[error("event does not encode: {0}")]
    Encode(#[from] EncodeError),
    #[error("stream {stream_id} has a gap or a repeat at version {version}")]
    BrokenStream { stream_id: String, version: u64 },
}

/// An aggregate folded from its stream, with the raw events it came from.
#[derive(Debug, Clone)]
pub struct Loaded<A, E> {
    pub aggregate: A,
    pub events: Vec<(RecordedEvent, E)>,
}

impl<A, E> Loaded<A, E> {
    /// The global position of the stream's last event, if it has any.
    pub fn last_position(&self) -> Option<i64> {
        self.events.last().map(|(recorded, _)| recorded.position)
    }
}

/// Checks that a stream's events run at versions 1, 2, 3 … without a gap (an invariant written
/// by the store and checked again where it is read).
fn check_versions(stream_id: &str, events: &[RecordedEvent]) -> Result<(), LogError> {
    for (i, recorded) in events.iter().enumerate() {
        if recorded.version != i as u64 + 1 {
            return Err(LogError::BrokenStream {
                stream_id: stream_id.to_owned(),
                version: recorded.version,
            });
        }
    }
    Ok(())
}

/// Reads a whole stream, checking its versions.
async fn read_whole_stream(
    store: &dyn EventStore,
    stream_id: &str,
) -> Result<Vec<RecordedEvent>, LogError> {
    let mut events: Vec<RecordedEvent> = Vec::new();
    loop {
        let from_version = events.len() as u64 + 1;
        let page = store
            .read_stream(stream_id, from_version, READ_BATCH_MAX)
            .await?;
        let page_len = page.len();
        events.extend(page);
        check_versions(stream_id, &events)?;
        if page_len < READ_BATCH_MAX {
            return Ok(events);
        }
    }
}

fn fold_payment(recorded: Vec<RecordedEvent>) -> Result<Loaded<Payment, PaymentEvent>, LogError> {
    let mut payment = Payment::default();
    let mut events = Vec::with_capacity(recorded.len());
    for raw in recorded {
        let event = PaymentEvent::decode_raw(&raw.event_type, raw.schema, raw.data.raw())?;
        payment = asiento_domain::evolve_payment(payment, &event);
        events.push((raw, event));
    }
    Ok(Loaded {
        aggregate: payment,
        events,
    })
}

pub async fn load_payment(
    store: &dyn EventStore,
    id: PaymentId,
) -> Result<Loaded<Payment, PaymentEvent>, LogError> {
    fold_payment(read_whole_stream(store, &payment_stream(id)).await?)
}

/// [`load_payment`] for several payments, read together (one round trip on PostgreSQL). A
/// payment with no events maps to an empty one, as `load_payment` gives.
pub async fn load_payments(
    store: &dyn EventStore,
    ids: &[PaymentId],
) -> Result<HashMap<PaymentId, Loaded<Payment, PaymentEvent>>, LogError> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    let streams: Vec<String> = ids.iter().map(|id| payment_stream(*id)).collect();
    let mut by_stream: HashMap<String, Vec<RecordedEvent>> = HashMap::new();
    for recorded in store.read_streams(&streams).await? {
        by_stream
            .entry(recorded.stream_id.clone())
            .or_default()
            .push(recorded);
    }
    let mut loaded = HashMap::with_capacity(ids.len());
    for (id, stream_id) in ids.iter().zip(streams) {
        let recorded = by_stream.remove(&stream_id).unwrap_or_default();
        check_versions(&stream_id, &recorded)?;
        loaded.insert(*id, fold_payment(recorded)?);
    }
    Ok(loaded)
}

/// A stream folded into its aggregate with the family's own decoder and `evolve`.
async fn load_folded<A: Default, E>(
    store: &dyn EventStore,
    stream_id: &str,
    decode: fn(&str, i32, &str) -> Result<E, DecodeError>,
    evolve: fn(A, &E) -> A,
) -> Result<Loaded<A, E>, LogError> {
    let recorded = read_whole_stream(store, stream_id).await?;
    let mut aggregate = A::default();
    let mut events = Vec::with_capacity(recorded.len());
    for raw in recorded {
        let event = decode(&raw.event_type, raw.schema, raw.data.raw())?;
        aggregate = evolve(aggregate, &event);
        events.push((raw, event));
    }
    Ok(Loaded { aggregate, events })
}

pub async fn load_transfer(
    store: &dyn EventStore,
    id: TransferId,
) -> Result<Loaded<Transfer, TransferEvent>, LogError> {
    load_folded(
        store,
        &transfer_stream(id),
        TransferEvent::decode_raw,
        asiento_domain::transfer::evolve,
    )
    .await
}

/// A balance monitor's stream folded; empty for an id the log has no stream of.
pub async fn load_monitor(
    store: &dyn EventStore,
    stream_id: &str,
) -> Result<Loaded<Monitor, MonitorEvent>, LogError> {
    load_folded(
        store,
        stream_id,
        MonitorEvent::decode_raw,
        asiento_domain::monitor::evolve,
    )
    .await
}

pub async fn load_payout(
    store: &dyn EventStore,
    provider: &ProviderName,
    id: &PayoutId,
) -> Result<Loaded<Payout, PayoutEvent>, LogError> {
    load_folded(
        store,
        &payout_stream(provider, id),
        PayoutEvent::decode_raw,
        asiento_domain::payout::evolve,
    )
    .await
}

/// The state of one guard from its stream's last event (each carries the balance after it).
pub async fn load_guard(store: &dyn EventStore, key: &GuardKey) -> Result<DebitGuard, LogError> {
    match store.last_event(&key.stream()).await? {
        None => Ok(DebitGuard::default()),
        Some(raw) => {
            let event = GuardEvent::decode_raw(&raw.event_type, raw.schema, raw.data.raw())?;
            Ok(DebitGuard::from_last(raw.version, &event))
        }
    }
}

/// The guards every entry in `entries` touches, loaded, each in a statement of its own sent at
/// once (a transfer's two guards cost one round trip of waiting, not two).
pub async fn load_guards<'a>(
    store: &dyn EventStore,
    entries: impl IntoIterator<Item = &'a JournalEntry>,
) -> Result<BTreeMap<GuardKey, DebitGuard>, LogError> {
    let keys: std::collections::BTreeSet<GuardKey> =
        entries.into_iter().flat_map(guarded_keys).collect();
    let states =
        futures::future::try_join_all(keys.iter().map(|key| load_guard(store, key))).await?;
    Ok(keys.into_iter().zip(states).collect())
}

/// The entries a payment decision posts.
pub fn payment_entries(events: &[PaymentEvent]) -> Vec<&JournalEntry> {
    let mut entries = Vec::new();
    for event in events {
        if let PaymentEvent::EntryPosted(posted) = event {
            entries.push(&posted.entry);
        }
    }
    entries
}

/// The entries a transfer decision posts.
pub fn transfer_entries(events: &[TransferEvent]) -> Vec<&JournalEntry> {
    let mut entries = Vec::new();
    for event in events {
        if let TransferEvent::EntryPosted(posted) = event {
            entries.push(&posted.entry);
        }
    }
    entries
}

pub(crate) fn expected(version: u64) -> ExpectedVersion {
    if version == 0 {
        ExpectedVersion::NoStream
    } else {
        ExpectedVersion::Exact(version)
    }
}

/// Encodes events for the store. Event ids are fresh: a decision is identified by the stream
/// version it expects, never by its event ids, so that two different decisions for the same
/// version can never be mistaken for a re-sent append.
pub fn encode<'a, E: 'a>(
    events: impl IntoIterator<Item = &'a E>,
    metadata: &Metadata,
    codec: impl Fn(&E) -> Result<(&'static str, i32, serde_json::Value), EncodeError>,
) -> Result<Vec<NewEvent>, LogError> {
    events
        .into_iter()
        .map(|event| {
            let (event_type, schema, data) = codec(event)?;
            Ok(NewEvent {
                event_id: Uuid::now_v7(),
                event_type: event_type.to_owned(),
                schema,
                data,
                metadata: metadata.clone(),
            })
        })
        .collect()
}

pub fn payment_codec(
    event: &PaymentEvent,
) -> Result<(&'static str, i32, serde_json::Value), EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

pub fn transfer_codec(
    event: &TransferEvent,
) -> Result<(&'static str, i32, serde_json::Value), EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

pub fn payout_codec(
    event: &PayoutEvent,
) -> Result<(&'static str, i32, serde_json::Value), EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

pub(crate) fn monitor_codec(
    event: &MonitorEvent,
) -> Result<(&'static str, i32, serde_json::Value), EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

pub(crate) fn guard_codec(
    event: &GuardEvent,
) -> Result<(&'static str, i32, serde_json::Value), EncodeError> {
    Ok((event.event_type(), event.schema_version(), event.encode()?))
}

/// One aggregate's stream, its expected version and its new events, plus the guard appends of the
/// entries among them: everything one decision writes, as one atomic append.
pub fn decision_appends(
    stream_id: String,
    stream_version: u64,
    events: Vec<NewEvent>,
    guards: &[GuardAppend],
    metadata: &Metadata,
) -> Result<Vec<StreamAppend>, LogError> {
    let mut appends = Vec::with_capacity(1 + guards.len());
    appends.push(StreamAppend {
        stream_id,
        expected: expected(stream_version),
        events,
    });
    appends.extend(guard_appends(guards, metadata)?);
    Ok(appends)
}

/// Guard appends alone (an account declaration writes nothing else).
pub fn guard_appends(
    guards: &[GuardAppend],
    metadata: &Metadata,
) -> Result<Vec<StreamAppend>, LogError> {
    guards
        .iter()
        .map(|guard| {
            Ok(StreamAppend {
                stream_id: guard.key.stream(),
                expected: expected(guard.expected_version),
                events: encode(&guard.events, metadata, guard_codec)?,
            })
        })
        .collect()
}

/// The guard appends for the entries a payment decision posts. Provider facts are never refused:
/// an account they take below zero is flagged instead.
pub fn payment_guard_appends(
    events: &[PaymentEvent],
    guards: &BTreeMap<GuardKey, DebitGuard>,
) -> Result<Vec<GuardAppend>, guard::GuardRejection> {
    let mut appends: Vec<GuardAppend> = Vec::new();
    // Two entries of one decision touching one guard must chain: the second sees the first's
    // balance and version.
    let mut guards = guards.clone();
    for event in events {
        if let PaymentEvent::EntryPosted(posted) = event {
            for append in guard::decide_entry(
                &posted.entry,
                asiento_domain::Origin::ProviderFact,
                &guards,
                posted.at,
            )? {
                let state = append.events.iter().fold(
                    guards.get(&append.key).copied().unwrap_or_default(),
                    guard::evolve,
                );
                guards.insert(append.key.clone(), state);
                match appends
                    .iter_mut()
                    .find(|existing| existing.key == append.key)
                {
                    Some(existing) => existing.events.extend(append.events),
                    None => appends.push(append),
                }
            }
        }
    }
    Ok(appends)
}

/// Whether an append error is a lost version race (re-read and re-decide) rather than a failure.
pub fn is_conflict(error: &AppendError) -> bool {
    matches!(error, AppendError::Conflict { .. })
}

/// The store as the use cases hold it.
pub type Store = Arc<dyn EventStore>;
