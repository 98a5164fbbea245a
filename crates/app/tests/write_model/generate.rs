//! Batches of steps as concurrent requests make them: a few payments' streams and customers'
//! guards shared between steps; provider facts and ledger commands (single transfers and atomic
//! batches of them, one append per guard) decided against the log as it
//! stands, against the state the batch's earlier steps would leave (a process's memory of its own
//! steps in flight), or against an older state (a read that another write overtook); claims of
//! new keys and of keys that exist; completions under the key's lease or a lost one; webhook
//! events new and delivered twice.

use std::collections::{BTreeMap, HashSet};

use asiento_domain::guard::{decide_entry, declare, GuardKey, Origin};
use asiento_domain::transfer_batch::decide_batch;
use asiento_domain::{
    AccountName, AccountPolicy, Amount, Currency, EntryId, JournalEntry, Leg, RequestTransfer,
    TenantId, TransferId,
};
use asiento_eventstore::{ExpectedVersion, Metadata, NewEvent, StreamAppend};
use chrono::{DateTime, Utc};
use serde_json::json;
use uuid::Uuid;

use crate::model::{Key, Model};
use crate::step::{Step, TENANT};
use asiento_testkit::Rng;

/// The names one case's batches draw from: a case's streams and keys are its own.
pub struct Pool {
    prefix: String,
    payments: Vec<String>,
    guards: Vec<GuardKey>,
}

impl Pool {
    pub fn new(case: u64) -> Pool {
        let prefix = format!("m{case}-");
        let tenant = TenantId::parse(TENANT).expect("tenant");
        let currency = Currency::parse("USD").expect("currency");
        Pool {
            payments: (0..4).map(|i| format!("{prefix}payment-{i}")).collect(),
            guards: (0..3)
                .map(|i| GuardKey {
                    tenant: tenant.clone(),
                    account: AccountName::parse(&format!("customer:{prefix}{i}:available"))
                        .expect("account"),
                    currency,
                })
                .collect(),
            prefix,
        }
    }

    /// What every key and inbox id of this case starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn guards(&self) -> &[GuardKey] {
        &self.guards
    }
}

pub struct Generator {
    rng: Rng,
    /// The keys the batch being generated claims or completes: a request holds one key and
    /// has one step in flight, so no key is completed by two steps of a batch, nor completed
    /// by a step after the one that claims it.
    keys_in_batch: HashSet<String>,
    /// Makes every new stream, key, inbox id and entry unique.
    next: u64,
    at: DateTime<Utc>,
}

impl Generator {
    pub fn new(seed: u64) -> Generator {
        Generator {
            rng: Rng::new(seed),
            keys_in_batch: HashSet::new(),
            next: 0,
            at: DateTime::from_timestamp(1_764_000_000, 0).expect("time"),
        }
    }

    /// A batch decided against `log` (the model as the log stands).
    pub fn batch(&mut self, pool: &Pool, log: &Model) -> Vec<Step> {
        let size = if self.rng.chance(10) {
            self.rng.between(13, 48)
        } else {
            self.rng.between(1, 12)
        } as usize;
        // The log as if every step generated so far were written.
        let mut ahead = log.clone();
        let mut steps = Vec::with_capacity(size);
        self.keys_in_batch.clear();
        while steps.len() < size {
            let Some(step) = self.step(pool, log, &ahead) else {
                continue;
            };
            self.keys_in_batch
                .extend(step.claim.iter().map(|(key, _)| key.clone()));
            self.keys_in_batch
                .extend(step.completion.iter().map(|(key, _)| key.clone()));
            if let Ok(accepted) = ahead.judge(&step) {
                ahead.apply(&step, &accepted);
            }
            steps.push(step);
        }
        steps
    }

    fn step(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> Option<Step> {
        match self.rng.weighted(&[30, 20, 15, 8, 10, 5, 7, 5, 8]) {
            0 => self.fact(pool, log, ahead),
            1 => self.command(pool, log, ahead),
            8 => self.transfer_batch(pool, log, ahead),
            2 => {
                let stream = self.rng.pick(&pool.payments).clone();
                let expected = self.expectation(log, ahead, &stream);
                Some(self.plain(pool, log, ahead, stream, expected))
            }
            3 => {
                let stream = self.rng.pick(&pool.payments).clone();
                Some(self.plain(pool, log, ahead, stream, ExpectedVersion::Any))
            }
            4 => Some(Step {
                claim: Some(self.claim(pool, log, ahead)),
                inbox: None,
                appends: {
                    let stream = self.fresh_stream(pool);
                    vec![self.append(stream, ExpectedVersion::NoStream)]
                },
                completion: None,
                facts: false,
                ..Step::default()
            }),
            5 => self.declaration(pool, log),
            6 => Some(Step {
                claim: None,
                inbox: Some(self.inbox_id(pool, log, ahead)),
                appends: Vec::new(),
                completion: None,
                facts: false,
                ..Step::default()
            }),
            _ => Some(Step {
                claim: None,
                inbox: None,
                appends: Vec::new(),
                completion: Some(self.completion(log)?),
                facts: false,
                ..Step::default()
            }),
        }
    }

    /// A payment's provider fact: its own stream's append and the guard events of its entry on
    /// one customer (against the provider's clearing account) or two.
    fn fact(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> Option<Step> {
        let (stream, expected) = if self.rng.chance(50) {
            (self.fresh_stream(pool), ExpectedVersion::NoStream)
        } else {
            let stream = self.rng.pick(&pool.payments).clone();
            let expected = self.expectation(log, ahead, &stream);
            (stream, expected)
        };
        let first = self.rng.pick(&pool.guards).clone();
        let delta = loop {
            let delta = self.rng.between(-500, 1_000);
            if delta != 0 {
                break delta;
            }
        };
        let mut legs = vec![Leg::new(
            first.account.clone(),
            first.currency,
            Amount::new(delta),
        )];
        let second = self.rng.pick(&pool.guards).clone();
        if self.rng.chance(30) && second != first {
            legs.push(Leg::new(
                second.account,
                second.currency,
                Amount::new(-delta),
            ));
        } else {
            legs.push(Leg::new(
                AccountName::parse("psp:sim:clearing").expect("account"),
                first.currency,
                Amount::new(-delta),
            ));
        }
        let mut step = self.entry_step(log, legs, Origin::ProviderFact)?;
        step.appends.insert(0, self.append(stream, expected));
        if self.rng.chance(30) {
            step.completion = self.completion(log);
        }
        Some(step)
    }

    /// A ledger transfer between two customers, its key claimed and completed at once (or not);
    /// None when its guard refuses it.
    fn command(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> Option<Step> {
        let from = self.rng.pick(&pool.guards).clone();
        let to = self.rng.pick(&pool.guards).clone();
        if from == to {
            return None;
        }
        let amount = self.rng.between(1, 300);
        let legs = vec![
            Leg::new(from.account, from.currency, Amount::new(-amount)),
            Leg::new(to.account, to.currency, Amount::new(amount)),
        ];
        let mut step = self.entry_step(log, legs, Origin::Command)?;
        let stream = self.fresh_stream(pool);
        step.appends
            .insert(0, self.append(stream, ExpectedVersion::NoStream));
        if self.rng.chance(60) {
            let claim = self.claim(pool, log, ahead);
            step.completion = Some(claim.clone());
            step.claim = Some(claim);
        }
        Some(step)
    }

    /// An atomic batch of two to five transfers (holds among them) between customers, decided in
    /// order on one read of each guard (`decide_batch`): a fresh stream per transfer and one
    /// append per guard moved, its key claimed and completed at once (or not); None when a
    /// guard refuses one of them.
    fn transfer_batch(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> Option<Step> {
        let tenant = TenantId::parse(TENANT).expect("tenant");
        let count = self.rng.between(2, 5);
        let mut requests = Vec::new();
        for _ in 0..count {
            let from = self.rng.pick(&pool.guards).clone();
            let to = self.rng.pick(&pool.guards).clone();
            if from == to {
                continue;
            }
            self.next += 1;
            requests.push(RequestTransfer {
                id: TransferId::from_uuid(Uuid::from_u128(self.next.into())),
                tenant: tenant.clone(),
                from: from.account,
                to: to.account,
                amount: Amount::new(self.rng.between(1, 200)),
                currency: from.currency,
                description: None,
                pending: self.rng.chance(30),
                expires_at: None,
                at: self.at,
            });
        }
        if requests.is_empty() {
            return None;
        }
        let read: BTreeMap<GuardKey, _> = pool
            .guards
            .iter()
            .map(|key| (key.clone(), self.guard_read(log, &key.stream())))
            .collect();
        let decision = decide_batch(requests, &read).ok()?;
        let moved: HashSet<&GuardKey> = decision.guards.iter().map(|g| &g.key).collect();
        let read = read
            .into_iter()
            .filter(|(key, _)| moved.contains(key))
            .collect();
        let mut appends = Vec::new();
        for _ in &decision.transfers {
            let stream = self.fresh_stream(pool);
            appends.push(self.append(stream, ExpectedVersion::NoStream));
        }
        appends.extend(
            asiento_app::log::guard_appends(&decision.guards, &Metadata::default())
                .expect("encoded"),
        );
        let mut step = Step {
            appends,
            read,
            guard_appends: decision.guards,
            ..Step::default()
        };
        if self.rng.chance(60) {
            let claim = self.claim(pool, log, ahead);
            step.completion = Some(claim.clone());
            step.claim = Some(claim);
        }
        Some(step)
    }

    /// An account's policy declared again (a command on its guard alone).
    fn declaration(&mut self, pool: &Pool, log: &Model) -> Option<Step> {
        let key = self.rng.pick(&pool.guards).clone();
        let read = self.guard_read(log, &key.stream());
        let policy = AccountPolicy::implied(&key.account);
        let append = declare(key.clone(), &read, policy, serde_json::Map::new(), self.at).ok()?;
        Some(Step {
            claim: None,
            inbox: None,
            appends: asiento_app::log::guard_appends(
                std::slice::from_ref(&append),
                &Metadata::default(),
            )
            .expect("encoded"),
            completion: None,
            facts: false,
            read: BTreeMap::from([(key, read)]),
            guard_appends: vec![append],
        })
    }

    /// An entry's guard appends, decided against a read of each guard.
    fn entry_step(&mut self, log: &Model, legs: Vec<Leg>, origin: Origin) -> Option<Step> {
        self.next += 1;
        let tenant = TenantId::parse(TENANT).expect("tenant");
        let entry = JournalEntry::new(
            EntryId::from_uuid(Uuid::from_u128(self.next.into())),
            tenant,
            legs,
            None,
        )
        .expect("a balanced entry");
        let reads: BTreeMap<GuardKey, _> = asiento_domain::guard::guarded_keys(&entry)
            .into_iter()
            .map(|key| {
                let read = self.guard_read(log, &key.stream());
                (key, read)
            })
            .collect();
        let appends = decide_entry(&entry, origin, &reads, self.at).ok()?;
        Some(Step {
            claim: None,
            inbox: None,
            appends: asiento_app::log::guard_appends(&appends, &Metadata::default())
                .expect("encoded"),
            completion: None,
            facts: origin == Origin::ProviderFact,
            read: reads,
            guard_appends: appends,
        })
    }

    /// A plain append to a payment's stream, sometimes with a claim or a completion.
    fn plain(
        &mut self,
        pool: &Pool,
        log: &Model,
        ahead: &Model,
        stream: String,
        expected: ExpectedVersion,
    ) -> Step {
        // A key claimed and completed in one step is one key, settled at once.
        let (claim, completion) = match self.rng.weighted(&[60, 15, 15, 10]) {
            0 => (None, None),
            1 => (Some(self.claim(pool, log, ahead)), None),
            2 => (None, self.completion(log)),
            _ => {
                let claim = self.claim(pool, log, ahead);
                (Some(claim.clone()), Some(claim))
            }
        };
        Step {
            claim,
            inbox: None,
            appends: vec![self.append(stream, expected)],
            completion,
            facts: false,
            ..Step::default()
        }
    }

    /// The version a step expects `stream` at: as the log stands, as the batch would leave it,
    /// behind the log, or ahead of the batch.
    fn expectation(&mut self, log: &Model, ahead: &Model, stream: &str) -> ExpectedVersion {
        let version = match self.rng.weighted(&[55, 25, 12, 8]) {
            0 => log.version(stream),
            1 => ahead.version(stream),
            2 => self.rng.below(log.version(stream) + 1),
            _ => ahead.version(stream) + 1,
        };
        if version == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(version)
        }
    }

    /// A guard's state as a request read it: as the log stands, or an older state of the log
    /// (a read another write overtook). Never a state the log never held: a guard's version
    /// names one state, and a process decides only on states it read or its own committed
    /// writes left.
    fn guard_read(&mut self, log: &Model, stream: &str) -> asiento_domain::guard::DebitGuard {
        let version = if self.rng.chance(70) {
            log.version(stream)
        } else {
            self.rng.below(log.version(stream) + 1)
        };
        log.guard_at(stream, version)
    }

    /// A claim of a new key, or of one that exists (in the log or claimed earlier in the batch).
    fn claim(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> (String, Uuid) {
        let mut known: Vec<&String> = if self.rng.chance(25) {
            let source = if self.rng.chance(50) { log } else { ahead };
            source.keys.keys().collect()
        } else {
            Vec::new()
        };
        known.sort();
        let key = if known.is_empty() {
            self.next += 1;
            format!("{}k{}", pool.prefix, self.next)
        } else {
            (*self.rng.pick(&known)).clone()
        };
        (key, Uuid::new_v4())
    }

    /// A completion of a key in flight under its lease; now and then (a lost lease is rare, and
    /// it refuses a one-statement batch whole) one under a lost lease, or of a key already
    /// completed. None when no key is left to complete.
    fn completion(&mut self, log: &Model) -> Option<(String, Uuid)> {
        let lost = self.rng.chance(10);
        let mut keys: Vec<(&String, &Key)> = log
            .keys
            .iter()
            .filter(|(key, record)| {
                !self.keys_in_batch.contains(*key) && (lost || matches!(record, Key::InFlight(_)))
            })
            .collect();
        keys.sort_by(|a, b| a.0.cmp(b.0));
        if keys.is_empty() {
            return None;
        }
        let (key, record) = *self.rng.pick(&keys);
        let owner = match record {
            Key::InFlight(owner) if !lost => *owner,
            _ => Uuid::new_v4(),
        };
        Some((key.clone(), owner))
    }

    fn inbox_id(&mut self, pool: &Pool, log: &Model, ahead: &Model) -> String {
        if self.rng.chance(30) {
            let source = if self.rng.chance(50) { log } else { ahead };
            let mut ids: Vec<&String> = source.inbox.iter().collect();
            ids.sort();
            if !ids.is_empty() {
                return (*self.rng.pick(&ids)).clone();
            }
        }
        self.next += 1;
        format!("{}evt{}", pool.prefix, self.next)
    }

    fn fresh_stream(&mut self, pool: &Pool) -> String {
        self.next += 1;
        format!("{}stream-{}", pool.prefix, self.next)
    }

    fn append(&mut self, stream: String, expected: ExpectedVersion) -> StreamAppend {
        let n = if self.rng.chance(20) { 2 } else { 1 };
        StreamAppend {
            stream_id: stream,
            expected,
            events: (0..n)
                .map(|i| NewEvent {
                    event_id: Uuid::now_v7(),
                    event_type: "Tested".into(),
                    schema: 1,
                    data: json!({ "i": i }),
                    metadata: Metadata::default(),
                })
                .collect(),
        }
    }
}
