//! The stale sweep at a provider without any lookup (the simulator's Adyen dialect over HTTP,
//! through the real Adyen adapter), on both backends, with no webhook delivered: a creation
//! whose answer was lost is sent again under its key while the payment is wanted and settles
//! with the one charge the provider made; a creation that never reached the provider is made
//! by that re-send, once; past its expiry a never-answered creation is cancelled by our
//! reference, and the payment stays pending until the settlement report has been compared past
//! its expiry and the provider's absence window (docs/adyen-wire.md §3); a redirect abandoned past
//! the timeout for customer action is cancelled at the provider without being read; the daily
//! report, compared only as far as Adyen has made it, settles what no notification told.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use asiento_app::clock::ManualClock;
use asiento_app::log;
use asiento_app::payments::NewPayment;
use asiento_app::reconcile::{Reconciler, ReconcilerConfig};
use asiento_app::reply::Answer;
use asiento_domain::{
    Amount, CaptureMode, Currency, CustomerId, PaymentId, PaymentStatus, ProviderName, TenantId,
};
use asiento_eventstore::Database;
use asiento_psp::adyen::{AdyenAccount, AdyenProvider, BasicCredentials, ReportsAccess};
use asiento_psp::{ChargeStatus, ClientConfig};
use asiento_psp_sim::Dialect;
use asiento_psp_sim::SimConfig;
use serde_json::{json, Value};

mod common;

use common::{create_request, flow_of, sim_post, Backend, PaymentRig};

const PROVIDER: &str = "adyen";
/// The payment's expiry: long enough that the re-send happens well inside it.
const PENDING_TIMEOUT_MS: i64 = 15 * 60_000;
/// When the sweep first looks at a payment with no answer.
const OPERATION_TIMEOUT_MS: i64 = 60_000;
const DAY_MS: i64 = 24 * 3_600_000;
const REPORT_USER: &str = "report_asiento@Company.Asiento";
const REPORT_PASSWORD: &str = "report-secret";
/// How long a customer may take to finish a redirect.
const REQUIRES_ACTION_TIMEOUT_MS: i64 = 30 * 60_000;

impl PaymentRig {
    /// The rig with the simulator in Adyen's dialect, paid through the Adyen adapter, on a clock
    /// the test moves.
    async fn for_adyen(backend: Backend) -> (PaymentRig, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::at_ms(chrono::Utc::now().timestamp_millis()));
        let sim = SimConfig {
            seed: 5,
            dialect: Dialect::Adyen,
            // Modifications are decided this long after Adyen received them.
            modification_delay_ms: 20,
            report_username: Some(REPORT_USER.into()),
            report_password: Some(REPORT_PASSWORD.into()),
            ..SimConfig::default()
        };
        let flow_clock = clock.clone();
        let rig = PaymentRig::start_with(backend, sim, |served, database| {
            let adapter = AdyenProvider::new(
                PROVIDER,
                &format!("http://{}", served.addr),
                "AQE_test_key",
                AdyenAccount {
                    merchant_account: "AsientoECOM".into(),
                    return_url: "https://shop.example/return".into(),
                },
                // One attempt: a 500 stays a lost answer for the sweep to settle.
                ClientConfig {
                    request_timeout_ms: 2_000,
                    attempts_max: 1,
                    ..ClientConfig::default()
                },
            )
            .unwrap()
            .with_reports(&ReportsAccess {
                base_url: format!("http://{}", served.addr),
                credentials: BasicCredentials {
                    username: REPORT_USER.into(),
                    password: REPORT_PASSWORD.into(),
                },
            })
            .unwrap();
            flow_of(database, PROVIDER, Arc::new(adapter), flow_clock)
        })
        .await;
        (rig, clock)
    }

    fn reconciler(&self) -> Reconciler {
        Reconciler::new(
            self.flow.clone(),
            ReconcilerConfig {
                pending_timeout_ms: PENDING_TIMEOUT_MS,
                operation_timeout_ms: OPERATION_TIMEOUT_MS,
                requires_action_timeout_ms: REQUIRES_ACTION_TIMEOUT_MS,
                report_settle_ms: 0,
                ..ReconcilerConfig::default()
            },
        )
    }

    async fn create(&self, capture_mode: CaptureMode) -> PaymentId {
        self.create_with("pm_card_ok", capture_mode).await
    }

    async fn create_with(&self, payment_method: &str, capture_mode: CaptureMode) -> PaymentId {
        let key = uuid::Uuid::new_v4().to_string();
        let payment = NewPayment {
            tenant: TenantId::parse("acme").unwrap(),
            amount: Amount::new(2_500),
            currency: Currency::parse("EUR").unwrap(),
            customer: CustomerId::parse("42").unwrap(),
            provider: ProviderName::parse(PROVIDER).unwrap(),
            payment_method: payment_method.into(),
            capture_mode,
            description: None,
            metadata: serde_json::Map::new(),
        };
        let answer = self
            .flow
            .create(&create_request(&key), payment)
            .await
            .unwrap();
        let Answer::Done(response) = answer else {
            panic!("unexpected answer {answer:?}")
        };
        let body: Value = serde_json::from_slice(&response.body).unwrap();
        PaymentId::parse(body["id"].as_str().unwrap()).unwrap()
    }

    /// The charges the provider holds for `payment`.
    fn charges_of(&self, payment: PaymentId) -> Vec<asiento_psp::Charge> {
        let reference = payment.to_string();
        self.served
            .sim
            .charges()
            .into_iter()
            .filter(|charge| charge.reference.as_deref() == Some(reference.as_str()))
            .collect()
    }

    /// The provider's charges for `payment` once one has left `status` (the provider decides
    /// a cancel some milliseconds after receiving it), or as they are after ten seconds.
    async fn charges_leaving(
        &self,
        payment: PaymentId,
        status: ChargeStatus,
    ) -> Vec<asiento_psp::Charge> {
        let mut charges = self.charges_of(payment);
        for _ in 0..500 {
            if charges.iter().any(|charge| charge.status != status) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            charges = self.charges_of(payment);
        }
        charges
    }

    /// A payment whose creation answered 500: with `reached`, after the provider made the
    /// charge; without, before. Payments are made until one lands on the asked side (the
    /// simulator's seed decides which): answers it and how many were made, all unanswered.
    async fn unanswered(&self, capture_mode: CaptureMode, reached: bool) -> (PaymentId, usize) {
        self.set_error_rate(1.0);
        let mut found = None;
        let mut made_ids = Vec::new();
        for _ in 0..40 {
            let id = self.create(capture_mode).await;
            made_ids.push(id);
            assert_eq!(self.status(id).await, PaymentStatus::Pending);
            if self.charges_of(id).is_empty() != reached {
                found = Some(id);
                break;
            }
        }
        self.set_error_rate(0.0);
        let id = found.expect("a creation on the asked side of the provider's effect");
        self.watching(&made_ids).await;
        (id, made_ids.len())
    }

    /// Waits until the reconciler's watch list holds `payments` (it follows the log, which on
    /// PostgreSQL shows a commit only once no earlier transaction is still open).
    async fn watching(&self, payments: &[PaymentId]) {
        let sql = "select count(*) from reconciliation_watch where payment_id = $1";
        for _ in 0..500 {
            asiento_app::watch::catch_up(self.db.database(), self.flow.store().as_ref())
                .await
                .unwrap();
            let mut watched = 0;
            for payment in payments {
                let count: i64 = match self.db.database() {
                    Database::Postgres(pool) => sqlx::query_scalar(sql)
                        .bind(payment.to_string())
                        .fetch_one(pool)
                        .await
                        .unwrap(),
                    Database::Sqlite(pool) => sqlx::query_scalar(&sql.replace('$', "?"))
                        .bind(payment.to_string())
                        .fetch_one(pool)
                        .await
                        .unwrap(),
                };
                watched += usize::from(count > 0);
            }
            if watched == payments.len() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("the watch list never held {payments:?}");
    }

    fn set_error_rate(&self, rate: f64) {
        self.served
            .sim
            .set_faults(&serde_json::from_value(json!({ "error_rate": rate })).unwrap())
            .unwrap();
    }

    async fn status(&self, payment: PaymentId) -> PaymentStatus {
        log::load_payment(self.flow.store().as_ref(), payment)
            .await
            .unwrap()
            .aggregate
            .record
            .unwrap()
            .status
    }

    /// How far the provider's settlement report has been compared.
    async fn report_compared(&self) -> Option<i64> {
        let name = format!("report:{PROVIDER}");
        let sql = "select mark from reconciliation_cursors where name = $1";
        match self.db.database() {
            Database::Postgres(pool) => sqlx::query_scalar(sql)
                .bind(&name)
                .fetch_optional(pool)
                .await
                .unwrap(),
            Database::Sqlite(pool) => sqlx::query_scalar(&sql.replace('$', "?"))
                .bind(&name)
                .fetch_optional(pool)
                .await
                .unwrap(),
        }
    }

    /// The settlement report of the provider compared up to `mark_ms`.
    async fn report_compared_to(&self, mark_ms: i64) {
        let name = format!("report:{PROVIDER}");
        match self.db.database() {
            Database::Postgres(pool) => {
                sqlx::query(
                    "insert into reconciliation_cursors (name, mark) values ($1, $2) \
                     on conflict (name) do update set mark = excluded.mark",
                )
                .bind(&name)
                .bind(mark_ms)
                .execute(pool)
                .await
                .unwrap();
            }
            Database::Sqlite(pool) => {
                sqlx::query(
                    "insert into reconciliation_cursors (name, mark) values (?1, ?2) \
                     on conflict (name) do update set mark = excluded.mark",
                )
                .bind(&name)
                .bind(mark_ms)
                .execute(pool)
                .await
                .unwrap();
            }
        }
    }
}

async fn lost_answers_are_sent_again(backend: Backend) {
    let (h, clock) = PaymentRig::for_adyen(backend).await;
    let (reached, made_reached) = h.unanswered(CaptureMode::Automatic, true).await;
    let (never, made_never) = h.unanswered(CaptureMode::Manual, false).await;

    // Not yet due: the sweep leaves a fresh payment alone.
    h.log_readable().await;
    let early = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(early.charges_resent, 0, "{early}");

    clock.advance_ms(OPERATION_TIMEOUT_MS + 1_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(
        summary.charges_resent,
        made_reached + made_never,
        "{summary}"
    );
    // The provider answered the first outcome under the same key: still one charge.
    assert_eq!(
        h.status(reached).await,
        PaymentStatus::Captured,
        "{summary}"
    );
    assert_eq!(h.charges_of(reached).len(), 1);
    // The first request never arrived: the re-send made the one charge.
    assert_eq!(
        h.status(never).await,
        PaymentStatus::Authorized,
        "{summary}"
    );
    let made = h.charges_of(never);
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].status, ChargeStatus::RequiresCapture);

    // Settled: the next sweep sends nothing again.
    clock.advance_ms(OPERATION_TIMEOUT_MS);
    h.log_readable().await;
    let again = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(again.charges_resent, 0, "{again}");
    h.finish().await;
}

#[tokio::test]
async fn lost_answers_are_sent_again_under_their_key_sqlite() {
    lost_answers_are_sent_again(Backend::Sqlite).await;
}

#[tokio::test]
async fn lost_answers_are_sent_again_under_their_key_postgres() {
    lost_answers_are_sent_again(Backend::Postgres).await;
}

async fn unwanted_creations_are_cancelled_then_expire(backend: Backend) {
    let (h, clock) = PaymentRig::for_adyen(backend).await;
    let (absent, made) = h.unanswered(CaptureMode::Manual, false).await;
    let expired_ms = h.flow.clock().now_ms() + PENDING_TIMEOUT_MS;

    // Past its expiry the payment is no longer wanted: nothing is sent again, whatever its
    // request made is cancelled by our reference, and it stays pending.
    clock.advance_ms(PENDING_TIMEOUT_MS + 1_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.charges_resent, 0, "{summary}");
    assert_eq!(summary.cancelled_by_reference, made, "{summary}");
    assert_eq!(h.status(absent).await, PaymentStatus::Pending);
    assert!(h.charges_of(absent).is_empty());

    // A report compared a day past its expiry is not enough at this provider: it may list a
    // payment a day late.
    h.report_compared_to(expired_ms + DAY_MS).await;
    clock.advance_ms(2 * DAY_MS);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.expired, 0, "{summary}");
    assert_eq!(h.status(absent).await, PaymentStatus::Pending);

    // Two days of reports without it: the payment expires.
    h.report_compared_to(expired_ms + 2 * DAY_MS).await;
    clock.advance_ms(2 * DAY_MS);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert!(summary.expired >= 1, "{summary}");
    assert_eq!(h.status(absent).await, PaymentStatus::Expired);

    h.finish().await;
}

#[tokio::test]
async fn unwanted_creations_are_cancelled_by_reference_then_expire_sqlite() {
    unwanted_creations_are_cancelled_then_expire(Backend::Sqlite).await;
}

#[tokio::test]
async fn unwanted_creations_are_cancelled_by_reference_then_expire_postgres() {
    unwanted_creations_are_cancelled_then_expire(Backend::Postgres).await;
}

async fn unwanted_authorisations_are_cancelled(backend: Backend) {
    let (h, clock) = PaymentRig::for_adyen(backend).await;
    // An authorisation whose answer was lost, past its expiry: the cancel by reference reaches
    // it at the provider (its webhook, not delivered here, would fail the payment).
    let (authorised, made) = h.unanswered(CaptureMode::Manual, true).await;
    clock.advance_ms(PENDING_TIMEOUT_MS + 1_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.cancelled_by_reference, made, "{summary}");
    // The cancel is received, then decided.
    let charges = h
        .charges_leaving(authorised, ChargeStatus::RequiresCapture)
        .await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0].status, ChargeStatus::Failed, "{charges:?}");
    assert_eq!(h.status(authorised).await, PaymentStatus::Pending);
    h.finish().await;
}

#[tokio::test]
async fn an_unwanted_authorisation_is_cancelled_by_reference_sqlite() {
    unwanted_authorisations_are_cancelled(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_unwanted_authorisation_is_cancelled_by_reference_postgres() {
    unwanted_authorisations_are_cancelled(Backend::Postgres).await;
}

async fn abandoned_redirects_are_cancelled_unread(backend: Backend) {
    let (h, clock) = PaymentRig::for_adyen(backend).await;
    let redirect = h.create_with("pm_redirect", CaptureMode::Automatic).await;
    assert_eq!(h.status(redirect).await, PaymentStatus::RequiresAction);
    h.watching(&[redirect]).await;

    // The customer may still finish: nothing is cancelled before the timeout.
    clock.advance_ms(REQUIRES_ACTION_TIMEOUT_MS - 60_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.redirects_cancelled, 0, "{summary}");

    clock.advance_ms(2 * 60_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.redirects_cancelled, 1, "{summary}");
    let charges = h
        .charges_leaving(redirect, ChargeStatus::RequiresAction)
        .await;
    assert_eq!(charges.len(), 1, "{charges:?}");
    assert_eq!(charges[0].status, ChargeStatus::Failed, "{charges:?}");
    // Its notification (not delivered here) decides the payment; the sweep asks again only
    // an hour later.
    assert_eq!(h.status(redirect).await, PaymentStatus::RequiresAction);
    h.log_readable().await;
    let again = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(again.redirects_cancelled, 0, "{again}");
    h.finish().await;
}

#[tokio::test]
async fn an_abandoned_redirect_is_cancelled_without_a_lookup_sqlite() {
    abandoned_redirects_are_cancelled_unread(Backend::Sqlite).await;
}

#[tokio::test]
async fn an_abandoned_redirect_is_cancelled_without_a_lookup_postgres() {
    abandoned_redirects_are_cancelled_unread(Backend::Postgres).await;
}

async fn the_daily_report_settles_what_nothing_told(backend: Backend) {
    let (h, clock) = PaymentRig::for_adyen(backend).await;
    // Captured at Adyen, its answer lost, no notification delivered, not due for a re-send.
    let (captured, _) = h.unanswered(CaptureMode::Automatic, true).await;

    // Today's report is not made yet: the report is compared up to today's start, no further.
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert_eq!(summary.charges_resent, 0, "{summary}");
    assert_eq!(summary.report_lines, 0, "{summary}");
    let today_ms = chrono::Utc::now()
        .date_naive()
        .and_time(chrono::NaiveTime::MIN)
        .and_utc()
        .timestamp_millis();
    assert_eq!(h.report_compared().await, Some(today_ms));
    assert_eq!(h.status(captured).await, PaymentStatus::Pending);

    // Adyen makes today's report: the next sweep compares it and the payment is captured.
    let (status, made) = sim_post(h.served.addr, "/sim/reports/accounting", &json!({})).await;
    assert_eq!(status, 200, "{made}");
    // Our clock stands still while Adyen books by its own: move past the booking.
    clock.advance_ms(5_000);
    h.log_readable().await;
    let summary = h.reconciler().sweep_once().await.unwrap();
    assert!(summary.report_lines >= 1, "{summary}");
    assert_eq!(
        h.status(captured).await,
        PaymentStatus::Captured,
        "{summary}"
    );
    assert!(h.report_compared().await > Some(today_ms));
    assert_eq!(h.charges_of(captured).len(), 1);
    h.finish().await;
}

#[tokio::test]
async fn the_daily_report_settles_what_nothing_told_sqlite() {
    the_daily_report_settles_what_nothing_told(Backend::Sqlite).await;
}

#[tokio::test]
async fn the_daily_report_settles_what_nothing_told_postgres() {
    the_daily_report_settles_what_nothing_told(Backend::Postgres).await;
}
