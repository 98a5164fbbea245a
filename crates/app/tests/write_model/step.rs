//! A generated step: what its request decided, kept by the test beside the typed step the writer
//! takes (which the writer consumes).

use std::collections::BTreeMap;

use asiento_app::commit::{Command, Completion, Facts, GuardWrite, Respond, Settle};
use asiento_app::idempotency::{
    canonical_body_hash, Completing, FreshClaim, IdempotencyKey, Lease, Scope, StoredResponse,
};
use asiento_app::webhooks::InboxRow;
use asiento_domain::guard::{DebitGuard, GuardAppend, GuardKey};
use asiento_eventstore::StreamAppend;
use serde_json::json;
use uuid::Uuid;

pub const NOW_MS: i64 = 1_000_000;
const LEASE_MS: i64 = 60_000;
pub const TENANT: &str = "acme";

#[derive(Clone, Debug, Default)]
pub struct Step {
    /// A key to claim as new: its name and the claim's lease owner.
    pub claim: Option<(String, Uuid)>,
    /// A webhook event to store: its id.
    pub inbox: Option<String>,
    /// The appends as the request decided them.
    pub appends: Vec<StreamAppend>,
    /// A held key to complete: its name and the lease owner completing it.
    pub completion: Option<(String, Uuid)>,
    /// Its guard appends are provider facts.
    pub facts: bool,
    /// The guard states its decision read, and what it appends to them (their encoded events
    /// are among `appends`).
    pub read: BTreeMap<GuardKey, DebitGuard>,
    pub guard_appends: Vec<GuardAppend>,
}

impl Step {
    /// The step as the writer takes it: its kind follows from what it writes. A key claimed and
    /// completed by one step is one key (a command's), and only a fact's guard appends are
    /// rebased.
    pub fn step(&self) -> asiento_app::commit::Step {
        use asiento_app::commit::Step as Typed;
        let appends: std::sync::Arc<[asiento_eventstore::StreamAppend]> =
            self.appends.clone().into();
        let guards = GuardWrite {
            read: self.read.clone(),
            appends: self.guard_appends.clone(),
        };
        if let Some(id) = &self.inbox {
            assert!(
                self.claim.is_none() && self.completion.is_none() && self.appends.is_empty(),
                "a webhook's step is its inbox row alone"
            );
            return Typed::Inbox(InboxRow {
                provider: "sim".into(),
                event_id: id.clone(),
                event_type: "charge.succeeded".into(),
                payment_ref: None,
                payload: b"{}".to_vec(),
                now_ms: NOW_MS,
            });
        }
        match (&self.claim, &self.completion) {
            (Some(claim), Some(completion)) => {
                assert_eq!(claim, completion, "a step settles one key");
                assert!(!self.facts, "a key settled at once is a command's");
                let name = claim.0.clone();
                Typed::Command(Command {
                    appends,
                    guards,
                    key: Some(Settle {
                        claim: fresh_claim(claim),
                        respond: Respond::new(move |position| answer(&name, position)),
                    }),
                })
            }
            (Some(claim), None) => {
                assert!(
                    self.guard_appends.is_empty(),
                    "a claim's first events touch no guard"
                );
                Typed::Claim {
                    claim: fresh_claim(claim),
                    appends,
                }
            }
            (None, completion) if self.facts || completion.is_some() => {
                assert!(
                    self.facts || self.guard_appends.is_empty(),
                    "a completion's step is a payment's facts"
                );
                Typed::Facts(Facts {
                    appends,
                    guards,
                    payment: None,
                    completion: completion.as_ref().map(|(key, owner)| {
                        let name = key.clone();
                        Completion {
                            completing: Completing {
                                scope: scope(),
                                key: IdempotencyKey::parse(key).expect("a generated key"),
                                lease: lease(*owner),
                                response: StoredResponse::default(),
                                now_ms: NOW_MS,
                            },
                            respond: Respond::new(move |position| answer(&name, position)),
                        }
                    }),
                })
            }
            (None, _) => Typed::Command(Command {
                appends,
                guards,
                key: None,
            }),
        }
    }

    /// The streams, keys and inbox rows the step names, each once.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .appends
            .iter()
            .map(|append| append.stream_id.clone())
            .collect();
        names.extend(self.claim.iter().map(|(key, _)| format!("key:{key}")));
        names.extend(self.completion.iter().map(|(key, _)| format!("key:{key}")));
        names.extend(self.inbox.iter().map(|id| format!("inbox:{id}")));
        names.sort();
        names.dedup();
        names
    }
}

fn fresh_claim((key, owner): &(String, Uuid)) -> FreshClaim {
    FreshClaim {
        scope: scope(),
        key: IdempotencyKey::parse(key).expect("a generated key"),
        body: canonical_body_hash(&json!({ "key": key })),
        resource_id: format!("resource-{key}"),
        lease: lease(*owner),
        now_ms: NOW_MS,
    }
}

/// The answer a completion stores: it names the position its step's last event took.
pub fn answer(key: &str, position: Option<i64>) -> StoredResponse {
    let position = position.map_or_else(|| "null".to_owned(), |p| p.to_string());
    StoredResponse {
        status: 201,
        body: format!(r#"{{"key":"{key}","position":{position}}}"#).into_bytes(),
    }
}

pub fn scope() -> Scope {
    Scope {
        tenant: TENANT.into(),
        method: "POST".into(),
        route: "/v1/model".into(),
    }
}

fn lease(owner: Uuid) -> Lease {
    Lease {
        owner,
        expires_ms: NOW_MS + LEASE_MS,
    }
}
