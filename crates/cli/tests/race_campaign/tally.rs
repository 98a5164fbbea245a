//! Every answer of the campaign, counted by route, status and problem code, and every finding that
//! fails the run (a 5xx with its body, an answer no client of the route could be given, a race
//! that ended wrongly), kept and printed at the end: one run reports everything it found, not
//! only its first failure.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;

use crate::common::Client;

/// What a route may answer besides a 2xx: statuses with the problem codes that go with them.
pub type Allowed = &'static [(u16, &'static str)];

/// Sends of one request at most while it is answered 409 `account_busy`.
const BUSY_RETRIES_MAX: u32 = 5;
/// The `Retry-After` of `account_busy`.
const BUSY_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct Tally {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// (route, status, code) → answers.
    counts: BTreeMap<(&'static str, u16, String), u64>,
    findings: Vec<String>,
    /// The highest log position any answer named: the legs are read up to it.
    last_position: i64,
}

impl Tally {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A finding that fails the run.
    pub fn fail(&self, finding: String) {
        self.inner().findings.push(finding);
    }

    pub fn findings(&self) -> Vec<String> {
        self.inner().findings.clone()
    }

    pub fn last_position(&self) -> i64 {
        self.inner().last_position
    }

    /// Answers of `route` with `status` and `code`.
    pub fn count(&self, route: &str, status: u16, code: &str) -> u64 {
        self.inner()
            .counts
            .iter()
            .filter(|((r, s, c), _)| *r == route && *s == status && c == code)
            .map(|(_, n)| n)
            .sum()
    }

    /// Every answer, one line per (route, status, code).
    pub fn table(&self) -> String {
        let inner = self.inner();
        let mut text = String::new();
        for ((route, status, code), n) in &inner.counts {
            let code = if code.is_empty() { "-" } else { code.as_str() };
            let _ = writeln!(text, "  {route:<16} {status} {code:<28} {n}");
        }
        text
    }

    fn record(&self, route: &'static str, status: u16, code: &str, body: &Value) {
        let mut inner = self.inner();
        *inner
            .counts
            .entry((route, status, code.to_owned()))
            .or_default() += 1;
        if let Some(position) = body["position"].as_i64() {
            inner.last_position = inner.last_position.max(position);
        }
    }
}

/// An answer: its status, its problem code (empty without one) and its body (`Null` if not JSON).
pub struct Reply {
    pub status: u16,
    pub code: String,
    pub body: Value,
}

impl Reply {
    pub fn id(&self) -> Option<String> {
        self.body["id"].as_str().map(str::to_owned)
    }
}

/// A client of the server that counts every answer in the campaign's tally.
#[derive(Clone)]
pub struct Caller {
    pub client: Client,
    pub tally: Arc<Tally>,
}

impl Caller {
    /// POSTs `body` under `key`. A 2xx and the answers in `allowed` are counted; anything else
    /// (a 5xx above all) is also a finding, with its body. `None`: no answer at all (a finding).
    /// A 409 `account_busy` (nothing was done) is counted and sent again with the same key after
    /// its `Retry-After`, as a client does, a few times at most.
    pub async fn post(
        &self,
        route: &'static str,
        path: &str,
        key: &str,
        body: &Value,
        allowed: Allowed,
    ) -> Option<Reply> {
        let mut reply = None;
        for _ in 0..BUSY_RETRIES_MAX {
            let request = self
                .client
                .http
                .post(format!("{}{path}", self.client.base))
                .bearer_auth(&self.client.key)
                .header("idempotency-key", key)
                .json(body);
            let answer = self.send(route, &format!("POST {path}"), request).await?;
            let busy = answer.status == 409 && answer.code == "account_busy";
            reply = Some(answer);
            if !busy {
                break;
            }
            tokio::time::sleep(BUSY_RETRY_AFTER).await;
        }
        let reply = reply?;
        let expected = (200..300).contains(&reply.status)
            || allowed
                .iter()
                .any(|(status, code)| *status == reply.status && *code == reply.code);
        if !expected && reply.status < 500 {
            self.tally.fail(format!(
                "{route}: POST {path} (key {key}) answered {} {}: {}",
                reply.status, reply.code, reply.body
            ));
        }
        Some(reply)
    }

    /// GETs `path`; anything but a 200 is a finding.
    pub async fn get(&self, route: &'static str, path: &str) -> Option<Value> {
        let request = self
            .client
            .http
            .get(format!("{}{path}", self.client.base))
            .bearer_auth(&self.client.key);
        let reply = self.send(route, &format!("GET {path}"), request).await?;
        if reply.status == 200 {
            return Some(reply.body);
        }
        if reply.status < 500 {
            self.tally.fail(format!(
                "{route}: GET {path} answered {} {}: {}",
                reply.status, reply.code, reply.body
            ));
        }
        None
    }

    /// Sends, counts, and makes a finding of a 5xx (printed with its body) or of no answer.
    async fn send(
        &self,
        route: &'static str,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Option<Reply> {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                self.tally
                    .fail(format!("{route}: {what}: no answer: {error}"));
                return None;
            }
        };
        let status = response.status().as_u16();
        let bytes = match response.bytes().await {
            Ok(bytes) => bytes,
            Err(error) => {
                self.tally
                    .fail(format!("{route}: {what}: {status} without a body: {error}"));
                return None;
            }
        };
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let code = body["code"].as_str().unwrap_or_default().to_owned();
        self.tally.record(route, status, &code, &body);
        if status >= 500 {
            self.tally.fail(format!(
                "{route}: {what} answered {status}: {}",
                String::from_utf8_lossy(&bytes)
            ));
        }
        Some(Reply { status, code, body })
    }
}
