//! The sequential model the writer is judged against: the log as it stood before a batch, and
//! the batch's steps applied to it one at a time, in batch order.
//!
//! A step the model accepts writes exactly what its request decided, except a provider fact's
//! guard events, which the model decides again against the guard's state at that point (a guard
//! never refuses a fact: only the balances it carries and its overdraft flags can differ). A step
//! the model refuses writes nothing, and the model says every reason it has to refuse it.

use std::collections::{HashMap, HashSet};

use asiento_domain::guard::{rebase_fact, DebitGuard, GuardEvent, GuardKey};
use asiento_domain::StreamKind;
use asiento_eventstore::{ExpectedVersion, StreamAppend};
use uuid::Uuid;

use crate::step::Step;

/// One event as the model holds it: a plain event by its id (written as decided), a guard's by
/// what it says (a rebased one gets new ids).
#[derive(Clone, Debug, PartialEq)]
pub enum Held {
    Plain(Uuid),
    Guard(GuardEvent),
}

/// An idempotency key's record: who holds it, and the stored answer once completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Key {
    InFlight(Uuid),
    Completed(Uuid),
}

/// Why the model writes nothing of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Its key or its inbox row exists.
    NotFresh,
    /// A stream is not at the version the step expects (a fact's guard never is a reason).
    Conflict,
    /// Its completion's key is not held by its lease.
    LeaseLost,
}

/// What a step the model accepts writes: per append, the stream, the version it starts after,
/// and its events.
#[derive(Clone, Debug)]
pub struct Accepted {
    pub appends: Vec<(String, u64, Vec<Held>)>,
    /// A fact's guard append was decided against another state than the one it is written onto.
    pub rebased: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Model {
    pub streams: HashMap<String, Vec<Held>>,
    pub keys: HashMap<String, Key>,
    pub inbox: HashSet<String>,
}

impl Model {
    /// A stream's version (0: no events).
    pub fn version(&self, stream: &str) -> u64 {
        self.streams
            .get(stream)
            .map_or(0, |events| events.len() as u64)
    }

    /// A guard's state at `version`, as the log reads it (`log::load_guard`).
    pub fn guard_at(&self, stream: &str, version: u64) -> DebitGuard {
        if version == 0 {
            return DebitGuard::default();
        }
        match self
            .streams
            .get(stream)
            .map(|events| &events[version as usize - 1])
        {
            Some(Held::Guard(event)) => DebitGuard::from_last(version, event),
            other => panic!("{stream} at {version} is not a guard event: {other:?}"),
        }
    }

    pub fn guard(&self, stream: &str) -> DebitGuard {
        self.guard_at(stream, self.version(stream))
    }

    /// What applying `step` alone to the model writes, or every reason it writes nothing.
    pub fn judge(&self, step: &Step) -> Result<Accepted, Vec<Refusal>> {
        let mut refusals = Vec::new();
        if let Some((key, _)) = &step.claim {
            if self.keys.contains_key(key) {
                refusals.push(Refusal::NotFresh);
            }
        }
        if let Some(id) = &step.inbox {
            if self.inbox.contains(id) {
                refusals.push(Refusal::NotFresh);
            }
        }
        let mut appends = Vec::with_capacity(step.appends.len());
        let mut rebased = false;
        for append in &step.appends {
            let version = self.version(&append.stream_id);
            let guard = guard_events(append);
            if let (true, Some((key, decided))) = (step.facts, &guard) {
                if let Some(events) = rebase_fact(key, self.guard(&append.stream_id), decided) {
                    rebased |= start(append) != Some(version);
                    let held = events.into_iter().map(Held::Guard).collect();
                    appends.push((append.stream_id.clone(), version, held));
                    continue;
                }
            }
            let current = match append.expected {
                ExpectedVersion::NoStream => version == 0,
                ExpectedVersion::Exact(expected) => expected == version,
                ExpectedVersion::Any => true,
                ExpectedVersion::StreamExists => version > 0,
            };
            if !current {
                refusals.push(Refusal::Conflict);
            }
            let held = match guard {
                Some((_, events)) => events.into_iter().map(Held::Guard).collect(),
                None => append
                    .events
                    .iter()
                    .map(|e| Held::Plain(e.event_id))
                    .collect(),
            };
            appends.push((append.stream_id.clone(), version, held));
        }
        if let Some((key, owner)) = &step.completion {
            let claimed_here = step.claim.as_ref() == Some(&(key.clone(), *owner));
            let held = self.keys.get(key) == Some(&Key::InFlight(*owner));
            if !(claimed_here || held) {
                refusals.push(Refusal::LeaseLost);
            }
        }
        refusals.dedup();
        if refusals.is_empty() {
            Ok(Accepted { appends, rebased })
        } else {
            Err(refusals)
        }
    }

    /// Applies a step [`Model::judge`] accepted.
    pub fn apply(&mut self, step: &Step, accepted: &Accepted) {
        for (stream, from, events) in &accepted.appends {
            let held = self.streams.entry(stream.clone()).or_default();
            assert_eq!(
                held.len() as u64,
                *from,
                "{stream}: judged on another state"
            );
            held.extend(events.iter().cloned());
        }
        if let Some((key, owner)) = &step.claim {
            self.keys.insert(key.clone(), Key::InFlight(*owner));
        }
        if let Some((key, owner)) = &step.completion {
            self.keys.insert(key.clone(), Key::Completed(*owner));
        }
        if let Some(id) = &step.inbox {
            self.inbox.insert(id.clone());
        }
    }
}

/// A guard stream's append: its key and its events decoded.
pub fn guard_events(append: &StreamAppend) -> Option<(GuardKey, Vec<GuardEvent>)> {
    let Some(StreamKind::Guard {
        tenant,
        account,
        currency,
    }) = StreamKind::parse(&append.stream_id)
    else {
        return None;
    };
    let events = append
        .events
        .iter()
        .map(|event| {
            GuardEvent::decode(&event.event_type, event.schema, &event.data)
                .expect("the generator encodes guard events it decided")
        })
        .collect();
    Some((
        GuardKey {
            tenant,
            account,
            currency,
        },
        events,
    ))
}

/// The version an append expects its stream at, when it names one.
pub fn start(append: &StreamAppend) -> Option<u64> {
    match append.expected {
        ExpectedVersion::NoStream => Some(0),
        ExpectedVersion::Exact(version) => Some(version),
        ExpectedVersion::Any | ExpectedVersion::StreamExists => None,
    }
}
