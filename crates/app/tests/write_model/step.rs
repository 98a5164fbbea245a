//! A generated step: what its request decided, kept by the test beside the `Work` the writer
//! takes (which the writer consumes).

use asiento_app::commit::{Completion, Respond, Work};
use asiento_app::idempotency::{
    canonical_body_hash, Completing, FreshClaim, IdempotencyKey, Lease, Scope, StoredResponse,
};
use asiento_app::webhooks::InboxRow;
use asiento_eventstore::StreamAppend;
use serde_json::json;
use uuid::Uuid;

pub const NOW_MS: i64 = 1_000_000;
const LEASE_MS: i64 = 60_000;
pub const TENANT: &str = "acme";

#[derive(Clone, Debug)]
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
}

impl Step {
    pub fn work(&self) -> Work {
        Work {
            claim: self.claim.as_ref().map(|(key, owner)| FreshClaim {
                scope: scope(),
                key: IdempotencyKey::parse(key).expect("a generated key"),
                body: canonical_body_hash(&json!({ "key": key })),
                resource_id: format!("resource-{key}"),
                lease: lease(*owner),
                now_ms: NOW_MS,
            }),
            appends: self.appends.clone().into(),
            completion: self.completion.as_ref().map(|(key, owner)| {
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
            inbox: self.inbox.as_ref().map(|id| InboxRow {
                provider: "sim".into(),
                event_id: id.clone(),
                event_type: "charge.succeeded".into(),
                payment_ref: None,
                payload: b"{}".to_vec(),
                now_ms: NOW_MS,
            }),
            facts: self.facts,
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
