//! The load: clients that create payments under keys of their own, some with manual capture, and
//! capture and refund some of them, each under its own key, until the load run ends. Every key is
//! retried with the same body until it gets a final answer, as a real client does, so that what
//! the clients were answered can be held against the books afterwards: every payment id a 2xx
//! named, every body sent, every refusal, every key left without a final answer, every capture
//! and refund with its final answer ([`Record`]), and every answer with when it was sent and
//! came ([`Observation`], which the outage's verdict reads).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asiento_testkit::Rng;
use serde_json::{json, Value};

use crate::settings::API_KEY;

/// A capture or refund a client asked for, and the answer it ended with.
#[derive(Clone, Debug)]
pub struct OpRecord {
    pub payment: String,
    /// `capture` or `refund`, as the payment's `operations[].kind` names it.
    pub kind: &'static str,
    pub key: String,
    /// The final answer's status and problem code (`None`: no final answer in time).
    pub answer: Option<(u16, String)>,
}

/// Everything the clients saw.
#[derive(Default)]
pub struct Record {
    /// Every payment id a 2xx answer named, per key.
    pub ids: BTreeMap<String, BTreeSet<String>>,
    /// The body each key was sent with (for the final replay).
    pub bodies: BTreeMap<String, Value>,
    /// Keys whose last answer was a 4xx other than 409, with it.
    pub refused: BTreeMap<String, String>,
    /// Keys that never got a final answer in time.
    pub unfinished: Vec<String>,
    /// Every capture and refund sent, with its final answer.
    pub ops: Vec<OpRecord>,
}

#[derive(Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub retries: AtomicU64,
    pub accepted: AtomicU64,
    pub unknown: AtomicU64,
    pub captures: AtomicU64,
    pub refunds: AtomicU64,
}

/// One answer a client saw (or the lack of one), and when: the outage's verdict reads these.
#[derive(Clone, Debug)]
pub struct Observation {
    pub sent: Instant,
    pub answered: Instant,
    /// 0 when no answer came (connection refused or broken, timeout).
    pub status: u16,
    pub code: String,
    pub what: String,
}

fn body_for(rng: &mut Rng, key: &str) -> Value {
    let draw = rng.unit();
    let method = if draw < 0.70 {
        "pm_card_ok"
    } else if draw < 0.90 {
        "pm_card_declined"
    } else if draw < 0.95 {
        "pm_card_timeout"
    } else {
        "pm_card_slow"
    };
    let capture = if rng.unit() < 0.25 {
        "manual"
    } else {
        "automatic"
    };
    json!({
        "amount_minor": 100 + rng.below(9_900) as i64,
        "currency": "USD",
        "customer": format!("c{}", rng.below(4)),
        "payment_method": method,
        "capture": capture,
        "metadata": {"chaos_key": key},
    })
}

/// How a key's requests ended.
enum Outcome {
    /// A 2xx, or a 4xx the client takes as final.
    Final {
        status: u16,
        code: String,
        body: Value,
    },
    /// No final answer before the key's deadline.
    Unfinished,
}

/// One client's connection, generator and log of answers.
struct Sender {
    http: reqwest::Client,
    base: String,
    rng: Rng,
    counters: Arc<Counters>,
    observations: Vec<Observation>,
}

impl Sender {
    /// POSTs `body` under `key` until a final answer, as a real client does: a 2xx or a 4xx is
    /// final, except a 409 that is not `invalid_transition` (the key is in flight: wait, ask
    /// again); no answer or a 5xx is asked again with the same key and body.
    async fn send_until_final(&mut self, path: &str, key: &str, body: &Value) -> Outcome {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut first = true;
        loop {
            if Instant::now() > deadline {
                return Outcome::Unfinished;
            }
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            if !first {
                self.counters.retries.fetch_add(1, Ordering::Relaxed);
            }
            first = false;
            let sent_at = Instant::now();
            let sent = self
                .http
                .post(format!("{}{path}", self.base))
                .bearer_auth(API_KEY)
                .header("idempotency-key", key)
                .json(body)
                .send()
                .await;
            let pause = Duration::from_millis(50 + self.rng.below(150));
            let answered = match sent {
                Ok(response) => {
                    let status = response.status().as_u16();
                    let retry_after = response
                        .headers()
                        .get("retry-after")
                        .and_then(|value| value.to_str().ok())
                        .and_then(|value| value.parse::<u64>().ok());
                    response
                        .bytes()
                        .await
                        .map(|bytes| (status, retry_after, bytes))
                        .map_err(|error| format!("{error:?}"))
                }
                Err(error) => Err(format!("{error:?}")),
            };
            let (status, retry_after, bytes) = match answered {
                Ok(answered) => answered,
                Err(error) => {
                    self.observe(sent_at, 0, error, path, key);
                    tokio::time::sleep(pause).await;
                    continue;
                }
            };
            let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let code = answer["code"].as_str().unwrap_or_default().to_owned();
            self.observe(sent_at, status, code.clone(), path, key);
            match status {
                200..=299 => {
                    return Outcome::Final {
                        status,
                        code,
                        body: answer,
                    }
                }
                409 if code != "invalid_transition" => {
                    let wait = retry_after
                        .map(|seconds| Duration::from_secs(seconds.min(1)))
                        .unwrap_or(pause)
                        .max(pause);
                    tokio::time::sleep(wait).await;
                }
                400..=499 => {
                    let body = if answer.is_null() {
                        Value::String(String::from_utf8_lossy(&bytes).into_owned())
                    } else {
                        answer
                    };
                    return Outcome::Final { status, code, body };
                }
                _ => tokio::time::sleep(pause).await,
            }
        }
    }

    fn observe(&mut self, sent: Instant, status: u16, code: String, path: &str, key: &str) {
        self.observations.push(Observation {
            sent,
            answered: Instant::now(),
            status,
            code,
            what: format!("POST {path} ({key})"),
        });
    }

    /// A capture or refund of `payment` under its own key, recorded with its final answer; the
    /// payment object the answer carries, if it was a 2xx.
    async fn operation(
        &mut self,
        record: &Mutex<Record>,
        payment: &str,
        kind: &'static str,
        key: String,
        body: Value,
    ) -> Option<Value> {
        let path = match kind {
            "capture" => format!("/v1/payments/{payment}/capture"),
            _ => format!("/v1/payments/{payment}/refunds"),
        };
        let counter = match kind {
            "capture" => &self.counters.captures,
            _ => &self.counters.refunds,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let outcome = self.send_until_final(&path, &key, &body).await;
        let (answer, paid) = match outcome {
            Outcome::Final { status, code, body } => {
                let paid = (200..300).contains(&status).then_some(body);
                (Some((status, code)), paid)
            }
            Outcome::Unfinished => (None, None),
        };
        record.lock().unwrap().ops.push(OpRecord {
            payment: payment.to_owned(),
            kind,
            key,
            answer,
        });
        paid
    }
}

/// One client: new keys until the load run ends; every key is retried with the same body until it
/// gets a final answer, as a real client would. Some authorised payments are captured (in full
/// or in part) and some captured ones refunded (once or twice), each under its own key.
pub async fn client_task(
    index: u32,
    base: String,
    seed: u64,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    record: Arc<Mutex<Record>>,
) -> Vec<Observation> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut sender = Sender {
        http,
        base,
        rng: Rng::new(seed ^ (u64::from(index) + 1).wrapping_mul(0xA24B_AED4_963E_E407)),
        counters,
        observations: Vec::new(),
    };
    let mut number = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("chaos-{index}-{number}");
        number += 1;
        let body = body_for(&mut sender.rng, &key);
        record
            .lock()
            .unwrap()
            .bodies
            .insert(key.clone(), body.clone());
        let (status, answer) = match sender.send_until_final("/v1/payments", &key, &body).await {
            Outcome::Unfinished => {
                record.lock().unwrap().unfinished.push(key.clone());
                continue;
            }
            Outcome::Final { status, body, .. } if !(200..300).contains(&status) => {
                record
                    .lock()
                    .unwrap()
                    .refused
                    .insert(key.clone(), format!("{status} {body}"));
                continue;
            }
            Outcome::Final { status, body, .. } => (status, body),
        };
        let id = answer["id"].as_str().unwrap_or("<no id>").to_owned();
        if status == 202 {
            sender.counters.unknown.fetch_add(1, Ordering::Relaxed);
        }
        sender.counters.accepted.fetch_add(1, Ordering::Relaxed);
        record
            .lock()
            .unwrap()
            .ids
            .entry(key.clone())
            .or_default()
            .insert(id.clone());
        if status != 201 {
            continue;
        }
        let mut payment = answer;
        if payment["status"] == "authorized" && sender.rng.unit() < 0.8 {
            let authorized = payment["amount_minor"].as_i64().unwrap_or(1);
            let body = if sender.rng.unit() < 0.7 || authorized < 2 {
                json!({})
            } else {
                let half = authorized / 2;
                json!({"amount_minor": half + sender.rng.below(half as u64) as i64})
            };
            match sender
                .operation(&record, &id, "capture", format!("{key}-capture"), body)
                .await
            {
                Some(after) => payment = after,
                None => continue,
            }
        }
        if payment["status"] != "captured" || sender.rng.unit() >= 0.5 {
            continue;
        }
        let captured = payment["captured_minor"].as_i64().unwrap_or_default();
        if captured < 1 {
            continue;
        }
        let first = if sender.rng.unit() < 0.4 || captured < 2 {
            captured
        } else {
            1 + sender.rng.below((captured / 2) as u64) as i64
        };
        let answered = sender
            .operation(
                &record,
                &id,
                "refund",
                format!("{key}-refund-1"),
                json!({"amount_minor": first}),
            )
            .await;
        let left = captured - first;
        if answered.is_some() && left > 0 && sender.rng.unit() < 0.5 {
            let second = 1 + sender.rng.below(left as u64) as i64;
            sender
                .operation(
                    &record,
                    &id,
                    "refund",
                    format!("{key}-refund-2"),
                    json!({"amount_minor": second}),
                )
                .await;
        }
    }
    sender.observations
}
