//! One client of the campaign: until the load ends it picks, by its seeded generator, what a busy
//! marketplace does to one customer next, and sends it. Money comes in through payments captured
//! at once or later; it goes out through transfers and holds, sized so that the account runs dry
//! and some are refused. The races are built in: two captures of one payment at once, two
//! partial refunds of one payment at once, a post and a void of one hold at once, holds left to
//! the expiry worker. What each answer may be is stated per route ([`Allowed`]); what a race must
//! end in is checked here, where its answers are known.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::{json, Value};

use super::tally::{Allowed, Caller, Reply};
use asiento_testkit::Rng;

/// The busy customer: every payment is its, every transfer and hold takes from it.
pub const CUSTOMER: &str = "busy";
pub const ACCOUNT: &str = "customer:busy:available";

/// Actions one client sends at most, whatever the load's duration.
const ACTIONS_PER_CLIENT_MAX: u32 = 100_000;

const CAPTURE: Allowed = &[
    (409, "invalid_transition"),
    (409, "capture_already_requested"),
    (422, "capture_refused"),
];
const REFUND: Allowed = &[
    (409, "invalid_transition"),
    (422, "refund_exceeds_captured"),
    (422, "refund_refused"),
];
const DEBIT: Allowed = &[(422, "insufficient_funds")];
/// The server decides `expires_at` against its own clock when it decides the hold: a request that
/// waited longer than the hold's life is refused.
const EXPIRING: Allowed = &[(422, "insufficient_funds"), (422, "expires_at_in_the_past")];
const RACED_ENDING: Allowed = &[(409, "hold_posted"), (409, "hold_voided")];

/// The holds given an `expires_at`, for the campaign to see them end.
pub type Expiring = Arc<Mutex<Vec<String>>>;

pub struct Worker {
    caller: Caller,
    rng: Rng,
    number: u64,
    sent: u64,
    expiring: Expiring,
}

impl Worker {
    pub fn new(caller: Caller, seed: u64, number: u64, expiring: Expiring) -> Self {
        Worker {
            caller,
            rng: Rng::new(seed ^ number.wrapping_mul(0x2545_F491_4F6C_DD1D)),
            number,
            sent: 0,
            expiring,
        }
    }

    /// Sends actions until `until`; the number of actions sent.
    pub async fn run(mut self, until: Instant) -> u32 {
        let mut actions = 0;
        while actions < ACTIONS_PER_CLIENT_MAX && Instant::now() < until {
            actions += 1;
            match self.rng.below(100) {
                0..=13 => {
                    let amount = self.rng.between(2_000, 12_000);
                    self.pay(amount, false).await;
                }
                14..=23 => self.authorize_then_capture().await,
                24..=33 => self.double_capture().await,
                34..=43 => self.refund_pair().await,
                44..=65 => self.transfer().await,
                66..=75 => self.expiring_hold().await,
                76..=83 => self.hold_then_end("void").await,
                84..=91 => self.hold_then_end("post").await,
                _ => self.post_racing_void().await,
            }
        }
        actions
    }

    fn key(&mut self, what: &str) -> String {
        self.sent += 1;
        format!("race-{}-{}-{what}", self.number, self.sent)
    }

    fn merchant(&self) -> String {
        format!("merchant:shop-{}", self.number)
    }

    /// A payment of the busy customer: its id once it is captured (automatic) or authorized
    /// (manual).
    async fn pay(&mut self, amount: i64, manual: bool) -> Option<String> {
        let key = self.key("pay");
        let body = json!({
            "amount_minor": amount, "currency": "USD", "customer": CUSTOMER,
            "payment_method": "pm_card_ok",
            "capture": if manual { "manual" } else { "automatic" },
        });
        let reply = self
            .caller
            .post("create payment", "/v1/payments", &key, &body, &[])
            .await?;
        let settled = if manual { "authorized" } else { "captured" };
        if reply.status == 201 && reply.body["status"] == settled {
            reply.id()
        } else {
            None
        }
    }

    async fn capture(&mut self, id: &str, amount: Option<i64>) -> Option<Reply> {
        let key = self.key("capture");
        let body = amount.map_or_else(|| json!({}), |amount| json!({"amount_minor": amount}));
        self.caller
            .post(
                "capture",
                &format!("/v1/payments/{id}/capture"),
                &key,
                &body,
                CAPTURE,
            )
            .await
    }

    /// A manual capture, whole or in part, of a payment authorized just before.
    async fn authorize_then_capture(&mut self) {
        let amount = self.rng.between(2_000, 12_000);
        let Some(id) = self.pay(amount, true).await else {
            return;
        };
        let part = self
            .rng
            .chance(30)
            .then(|| self.rng.between(1_000, amount - 1));
        self.capture(&id, part).await;
    }

    /// Two captures of one authorized payment at once, each with its own key (most often both of
    /// the whole amount, sometimes the second of a part): at most one capture succeeds, and every
    /// capture answered 200 shows what the payment captured.
    async fn double_capture(&mut self) {
        let amount = self.rng.between(2_000, 12_000);
        let Some(id) = self.pay(amount, true).await else {
            return;
        };
        let part = self
            .rng
            .chance(25)
            .then(|| self.rng.between(1_000, amount - 1));
        let path = format!("/v1/payments/{id}/capture");
        let (first_key, second_key) = (self.key("capture-a"), self.key("capture-b"));
        let first_body = json!({});
        let second_body = part.map_or_else(|| json!({}), |part| json!({"amount_minor": part}));
        let (first, second) = tokio::join!(
            self.caller
                .post("capture", &path, &first_key, &first_body, CAPTURE),
            self.caller
                .post("capture", &path, &second_key, &second_body, CAPTURE),
        );
        let Some(payment) = self
            .caller
            .get("read payment", &format!("/v1/payments/{id}"))
            .await
        else {
            return;
        };
        let succeeded = operations(&payment, "capture", "succeeded");
        let captured = payment["captured_minor"].as_i64();
        let answered_200: Vec<Option<i64>> = [&first, &second]
            .into_iter()
            .flatten()
            .filter(|reply| reply.status == 200)
            .map(|reply| reply.body["captured_minor"].as_i64())
            .collect();
        if succeeded > 1 || answered_200.iter().any(|shown| *shown != captured) {
            self.caller.tally.fail(format!(
                "two captures of {id}: {succeeded} captures succeeded, answered {:?}, the \
                 payment captured {captured:?}: {payment}",
                answered_200
            ));
        }
    }

    /// Two partial refunds of one captured payment at once: together they never refund more
    /// than was captured, and the payment refunded at least what was answered 201.
    async fn refund_pair(&mut self) {
        let amount = self.rng.between(2_000, 12_000);
        let Some(id) = self.pay(amount, false).await else {
            return;
        };
        let amounts = [
            self.rng.between(amount / 4, amount * 3 / 4),
            self.rng.between(amount / 4, amount * 3 / 4),
        ];
        let path = format!("/v1/payments/{id}/refunds");
        let keys = [self.key("refund-a"), self.key("refund-b")];
        let bodies = amounts.map(|amount| json!({"amount_minor": amount}));
        let (first, second) = tokio::join!(
            self.caller
                .post("refund", &path, &keys[0], &bodies[0], REFUND),
            self.caller
                .post("refund", &path, &keys[1], &bodies[1], REFUND),
        );
        let Some(payment) = self
            .caller
            .get("read payment", &format!("/v1/payments/{id}"))
            .await
        else {
            return;
        };
        let settled: i64 = [first, second]
            .iter()
            .zip(amounts)
            .filter(|(reply, _)| reply.as_ref().is_some_and(|reply| reply.status == 201))
            .map(|(_, amount)| amount)
            .sum();
        let refunded = payment["refunded_minor"].as_i64().unwrap_or(-1);
        if refunded < settled || refunded > amount {
            self.caller.tally.fail(format!(
                "two refunds of {id} ({amounts:?} of {amount}): answered 201 for {settled}, the \
                 payment refunded {refunded}: {payment}"
            ));
        }
    }

    /// A transfer out of the busy account, refused when the account cannot cover it.
    async fn transfer(&mut self) {
        let key = self.key("transfer");
        let body = json!({
            "from": ACCOUNT, "to": self.merchant(),
            "amount_minor": self.rng.between(1_000, 30_000), "currency": "USD",
        });
        self.caller
            .post("transfer", "/v1/transfers", &key, &body, DEBIT)
            .await;
    }

    /// A hold on the busy account: its id once it reserved the amount.
    async fn hold(&mut self, amount: i64, expires_in_ms: Option<i64>) -> Option<String> {
        let key = self.key("hold");
        let mut body = json!({
            "from": ACCOUNT, "to": self.merchant(), "amount_minor": amount,
            "currency": "USD", "pending": true,
        });
        let mut allowed = DEBIT;
        if let Some(ms) = expires_in_ms {
            let at = chrono::Utc::now() + chrono::Duration::milliseconds(ms);
            body["expires_at"] = json!(at.to_rfc3339());
            allowed = EXPIRING;
        }
        let reply = self
            .caller
            .post("hold", "/v1/transfers", &key, &body, allowed)
            .await?;
        if reply.status == 201 {
            reply.id()
        } else {
            None
        }
    }

    /// A hold that expires within a few seconds, left to the expiry worker.
    async fn expiring_hold(&mut self) {
        let amount = self.rng.between(500, 6_000);
        let expires_in = self.rng.between(1_000, 3_000);
        if let Some(id) = self.hold(amount, Some(expires_in)).await {
            self.expiring
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(id);
        }
    }

    /// A hold without an expiry, then its void or its post (whole or in part). Nobody else ends
    /// it, so the ending must succeed.
    async fn hold_then_end(&mut self, action: &'static str) {
        let amount = self.rng.between(500, 8_000);
        let Some(id) = self.hold(amount, None).await else {
            return;
        };
        let body = if action == "post" && self.rng.chance(50) {
            json!({"amount_minor": self.rng.between(1, amount)})
        } else {
            json!({})
        };
        let key = self.key(action);
        let route = if action == "post" { "post" } else { "void" };
        self.caller
            .post(
                route,
                &format!("/v1/transfers/{id}/{action}"),
                &key,
                &body,
                &[],
            )
            .await;
    }

    /// A hold, then its post and its void at once: exactly one wins, and the other is told how
    /// the hold ended.
    async fn post_racing_void(&mut self) {
        let amount = self.rng.between(500, 8_000);
        let Some(id) = self.hold(amount, None).await else {
            return;
        };
        let (post_key, void_key) = (self.key("post"), self.key("void"));
        let (post_path, void_path) = (
            format!("/v1/transfers/{id}/post"),
            format!("/v1/transfers/{id}/void"),
        );
        let empty = json!({});
        let (posted, voided) = tokio::join!(
            self.caller
                .post("post", &post_path, &post_key, &empty, RACED_ENDING),
            self.caller
                .post("void", &void_path, &void_key, &empty, RACED_ENDING),
        );
        let (Some(posted), Some(voided)) = (posted, voided) else {
            return;
        };
        let fine = matches!(
            (
                posted.status,
                posted.code.as_str(),
                voided.status,
                voided.code.as_str()
            ),
            (200, _, 409, "hold_posted") | (409, "hold_voided", 200, _)
        );
        if !fine {
            self.caller.tally.fail(format!(
                "a post and a void of hold {id} at once: post {} {}, void {} {}",
                posted.status, posted.code, voided.status, voided.code
            ));
        }
    }
}

/// How many of the payment's operations of `kind` are in `state`.
fn operations(payment: &Value, kind: &str, state: &str) -> usize {
    payment["operations"].as_array().map_or(0, |operations| {
        operations
            .iter()
            .filter(|op| op["kind"] == kind && op["state"] == state)
            .count()
    })
}
