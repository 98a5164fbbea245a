//! Balance monitors in the feed: `balance.threshold_crossed`, told when an entry takes a watched
//! balance figure from not matching its monitor's condition to matching it
//! (`asiento_domain::monitor`).
//!
//! Why here: a crossing is a merchant event, so it belongs in the feed's numbering (log order,
//! the same after a rebuild) and reaches the events feed, the outbound webhooks and the relay
//! like every other event. Deciding it needs the balances before and after each entry, in log
//! order, for every client account a monitor may be put on later; so this projection keeps its
//! own running balances of client accounts (`merchant_event_accounts_g{n}`) beside the monitors
//! and whether each matches (`merchant_event_monitors_g{n}`), instead of reading another read
//! model whose lag and rebuilds are its own. `verify` derives the feed again from the log alone,
//! so a crossing told twice, or one never told, is a mismatch.

mod read;
mod store;

use std::collections::{BTreeMap, HashMap, HashSet};

use asiento_domain::monitor::{self, Balances, LegTarget, MonitorCreated, Standing, Tracked};
use asiento_domain::{Amount, Event, GuardEvent, MonitorEvent, StreamKind};
use asiento_eventstore::RecordedEvent;
use asiento_objects::{balances_json, monitor_json};
use asiento_projector::ProjectionError;
use chrono::{DateTime, Utc};
use serde_json::json;

use crate::projection::Row;
use crate::EventKind;

pub use read::{
    active_monitors, list_monitors, MonitorPage, MonitorQuery, MONITORS_LIMIT_MAX,
    MONITORS_PER_TENANT_MAX,
};
pub(crate) use store::{ddl, load, store, MONITORS_TABLE, MONITORS_VIEW, TABLES};

/// Which balance: (tenant, account, currency).
pub(crate) type Key = (String, String, String);

/// A monitor as this projection keeps it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Watched {
    pub created: MonitorCreated,
    pub deleted_at: Option<DateTime<Utc>>,
    pub matching: bool,
}

impl Watched {
    fn key(&self) -> Key {
        let c = &self.created;
        (
            c.tenant.as_str().to_owned(),
            c.account.as_str().to_owned(),
            c.currency.code().to_owned(),
        )
    }
}

/// The client accounts' balances and the monitors, as the events so far leave them: everything
/// from nothing (`verify`), or the rows a batch touches, loaded before it (`apply`).
#[derive(Debug, Default)]
pub(crate) struct Watch {
    pub accounts: HashMap<Key, Tracked>,
    pub monitors: HashMap<String, Watched>,
    /// Active monitors per account, by id (the order crossings of one entry are told in).
    by_key: HashMap<Key, Vec<String>>,
    pub changed_accounts: HashSet<Key>,
    pub changed_monitors: HashSet<String>,
    /// Events `needed` decoded already, by position: each is decoded once per batch.
    decoded: HashMap<i64, Event>,
}

/// What a batch needs loaded before its events are derived, and the events decoded to know it.
#[derive(Debug, Default)]
pub(crate) struct Needed {
    pub keys: HashSet<Key>,
    pub monitors: HashSet<String>,
    pub decoded: HashMap<i64, Event>,
}

/// The accounts and monitors `events` touch, read from their types and stream names (and the
/// entries' legs).
pub(crate) fn needed(events: &[RecordedEvent]) -> Result<Needed, ProjectionError> {
    let mut needed = Needed::default();
    for event in events {
        match event.event_type.as_str() {
            "EntryPosted" => {
                let decoded = decode(event)?;
                if let Some(entry) = decoded.entry() {
                    for leg in entry.legs() {
                        if let Some((owner, _)) = monitor::leg_owner(&leg.account) {
                            needed.keys.insert((
                                entry.tenant().as_str().to_owned(),
                                owner.as_str().to_owned(),
                                leg.currency.code().to_owned(),
                            ));
                        }
                    }
                }
                needed.decoded.insert(event.position, decoded);
            }
            "AccountDeclared" => {
                if let Some(StreamKind::Guard {
                    tenant,
                    account,
                    currency,
                }) = StreamKind::parse(&event.stream_id)
                {
                    needed.keys.insert((
                        tenant.as_str().to_owned(),
                        account.as_str().to_owned(),
                        currency.code().to_owned(),
                    ));
                }
            }
            "MonitorCreated" | "MonitorDeleted" => {
                if let Some(StreamKind::BalanceMonitor(id)) = StreamKind::parse(&event.stream_id) {
                    let decoded = decode(event)?;
                    if let Event::BalanceMonitor(MonitorEvent::MonitorCreated(c)) = &decoded {
                        needed.keys.insert((
                            c.tenant.as_str().to_owned(),
                            c.account.as_str().to_owned(),
                            c.currency.code().to_owned(),
                        ));
                    }
                    needed.monitors.insert(id);
                    needed.decoded.insert(event.position, decoded);
                }
            }
            _ => {}
        }
    }
    Ok(needed)
}

fn decode(event: &RecordedEvent) -> Result<Event, ProjectionError> {
    Event::decode_raw(
        &event.stream_id,
        &event.event_type,
        event.schema,
        event.data.raw(),
    )
    .map_err(|e| malformed(event.position, e.to_string()))
}

fn malformed(position: i64, reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position,
        reason: reason.into(),
    }
}

impl Watch {
    /// Loaded rows: the accounts and monitors as stored, and the batch's events `needed`
    /// decoded.
    pub fn of(
        accounts: HashMap<Key, Tracked>,
        monitors: Vec<Watched>,
        decoded: HashMap<i64, Event>,
    ) -> Watch {
        let mut watch = Watch {
            accounts,
            decoded,
            ..Watch::default()
        };
        for watched in monitors {
            watch.insert(watched);
        }
        watch
    }

    fn insert(&mut self, watched: Watched) {
        let id = watched.created.monitor_id.clone();
        if watched.deleted_at.is_none() {
            let ids = self.by_key.entry(watched.key()).or_default();
            ids.push(id.clone());
            ids.sort_unstable();
        }
        self.monitors.insert(id, watched);
    }

    /// Takes the next event of the log; a crossing it causes is a row numbered after `seq`.
    pub fn push(
        &mut self,
        event: &RecordedEvent,
        seq: &mut i64,
        rows: &mut Vec<Row>,
    ) -> Result<(), ProjectionError> {
        if !matches!(
            event.event_type.as_str(),
            "EntryPosted" | "AccountDeclared" | "MonitorCreated" | "MonitorDeleted"
        ) {
            return Ok(());
        }
        let at = event.position;
        let overflow = |_| malformed(at, "a balance overflows i128");
        let decoded = match self.decoded.remove(&event.position) {
            Some(decoded) => decoded,
            None => decode(event)?,
        };
        match decoded {
            Event::Guard(GuardEvent::AccountDeclared(declared)) => {
                let Some(StreamKind::Guard {
                    tenant,
                    account,
                    currency,
                }) = StreamKind::parse(&event.stream_id)
                else {
                    return Err(malformed(at, "an AccountDeclared outside a guard stream"));
                };
                let key = (
                    tenant.as_str().to_owned(),
                    account.as_str().to_owned(),
                    currency.code().to_owned(),
                );
                let mut standings = self.standings(&key);
                let tracked = self.accounts.entry(key.clone()).or_default();
                tracked
                    .declare(declared.policy.normal_balance, &mut standings)
                    .map_err(overflow)?;
                self.changed_accounts.insert(key.clone());
                self.restand(&key, &standings);
            }
            Event::BalanceMonitor(MonitorEvent::MonitorCreated(created)) => {
                let mut watched = Watched {
                    created,
                    deleted_at: None,
                    matching: false,
                };
                let tracked = self
                    .accounts
                    .get(&watched.key())
                    .cloned()
                    .unwrap_or_default();
                watched.matching = tracked
                    .watch(watched.created.threshold)
                    .map_err(overflow)?
                    .matching;
                self.changed_monitors
                    .insert(watched.created.monitor_id.clone());
                self.insert(watched);
            }
            Event::BalanceMonitor(MonitorEvent::MonitorDeleted(deleted)) => {
                let Some(watched) = self.monitors.get_mut(&deleted.monitor_id) else {
                    return Err(malformed(at, "a monitor deleted before it was created"));
                };
                watched.deleted_at = Some(deleted.at);
                let key = watched.key();
                if let Some(ids) = self.by_key.get_mut(&key) {
                    ids.retain(|id| *id != deleted.monitor_id);
                }
                self.changed_monitors.insert(deleted.monitor_id);
            }
            decoded => {
                let Some(entry) = decoded.entry() else {
                    return Err(malformed(at, "an EntryPosted without a journal entry"));
                };
                let tenant = entry.tenant().as_str().to_owned();
                // Each client account's legs, in the order the entry first names it.
                let mut legs: BTreeMap<usize, (Key, Vec<(LegTarget, Amount)>)> = BTreeMap::new();
                let mut slot: HashMap<Key, usize> = HashMap::new();
                for leg in entry.legs() {
                    let Some((owner, target)) = monitor::leg_owner(&leg.account) else {
                        continue;
                    };
                    let key = (
                        tenant.clone(),
                        owner.as_str().to_owned(),
                        leg.currency.code().to_owned(),
                    );
                    let next = slot.len();
                    let index = *slot.entry(key.clone()).or_insert(next);
                    legs.entry(index)
                        .or_insert_with(|| (key, Vec::new()))
                        .1
                        .push((target, leg.amount));
                }
                for (key, moves) in legs.into_values() {
                    let mut standings = self.standings(&key);
                    let tracked = self.accounts.entry(key.clone()).or_default();
                    let before = tracked.balances;
                    let fired = tracked.post(&moves, &mut standings).map_err(overflow)?;
                    let (after, normal) = (tracked.balances, tracked.normal());
                    self.changed_accounts.insert(key.clone());
                    let ids = self.restand(&key, &standings);
                    for (id, fired) in ids.iter().zip(fired) {
                        if !fired {
                            continue;
                        }
                        let watched = &self.monitors[id];
                        *seq += 1;
                        rows.push(crossing_row(
                            *seq,
                            event,
                            &entry.id().to_string(),
                            watched,
                            (&before, &after),
                            normal,
                        )?);
                    }
                }
            }
        }
        Ok(())
    }

    /// The standings of the account's active monitors, in `by_key` order.
    fn standings(&self, key: &Key) -> Vec<Standing> {
        self.by_key
            .get(key)
            .map(|ids| {
                ids.iter()
                    .map(|id| {
                        let watched = &self.monitors[id];
                        Standing {
                            threshold: watched.created.threshold,
                            matching: watched.matching,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes the standings back to the monitors they came from; returns those monitors' ids.
    fn restand(&mut self, key: &Key, standings: &[Standing]) -> Vec<String> {
        let ids = self.by_key.get(key).cloned().unwrap_or_default();
        for (id, standing) in ids.iter().zip(standings) {
            if let Some(watched) = self.monitors.get_mut(id) {
                if watched.matching != standing.matching {
                    watched.matching = standing.matching;
                    self.changed_monitors.insert(id.clone());
                }
            }
        }
        ids
    }
}

/// The id of the crossing of `monitor_id` caused by the event at (stream, version).
fn crossing_id(monitor_id: &str, event: &RecordedEvent) -> String {
    crate::event_id(&format!("{monitor_id}/{}", event.stream_id), event.version)
}

fn crossing_row(
    seq: i64,
    event: &RecordedEvent,
    entry_id: &str,
    watched: &Watched,
    (before, after): (&Balances, &Balances),
    normal: asiento_domain::NormalBalance,
) -> Result<Row, ProjectionError> {
    let id = crossing_id(&watched.created.monitor_id, event);
    let kind = EventKind::BalanceThresholdCrossed;
    let body = json!({
        "id": id,
        "object": "event",
        "type": kind.as_str(),
        "created": asiento_objects::time(&event.recorded_at),
        "position": event.position,
        "data": {
            "object": monitor_json(&watched.created, None),
            "entry": {"id": entry_id, "position": event.position},
            "balance_before": balances_json(before, normal),
            "balance_after": balances_json(after, normal),
        },
    });
    Ok(Row {
        seq,
        event_id: id,
        tenant: watched.created.tenant.as_str().to_owned(),
        event_type: kind.as_str(),
        position: event.position,
        body: serde_json::to_string(&body).map_err(|e| malformed(event.position, e.to_string()))?,
    })
}
