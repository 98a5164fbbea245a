//! A server and the simulator it charges through, in any dialect: the simulator `serve`
//! mounts (provider `sim`), `asiento psp-sim --dialect stripe` in its own process (provider
//! `stripe`), or `asiento psp-sim --dialect adyen` in its own process (provider `adyen`, its
//! batches through the recording relay of [`adyen`], its reports read by the report user), so
//! that one black-box test runs against all three.

use std::time::Duration;

use serde_json::{json, Value};

use super::adyen::AdyenSim;
use super::{
    adyen, asiento, asiento_with_env, list_at, payment_body, stripe, Client, Process, Server,
    TestDatabase,
};

/// The provider a test runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Psp {
    /// The simulator `serve` mounts under `/sim`, as provider `sim`.
    Sim,
    /// `asiento psp-sim --dialect stripe` in its own process, as provider `stripe`.
    Stripe,
    /// `asiento psp-sim --dialect adyen` in its own process, as provider `adyen`: no lookup,
    /// modifications decided after they are received, batched notifications, CSV reports.
    Adyen,
}

/// A server and the simulator it charges through, whichever dialect it speaks.
pub struct Rig {
    pub server: Server,
    pub psp: Psp,
    /// The simulator's control and truth routes (`…/sim`).
    sim_base: String,
    /// The Stripe dialect's address, when it runs in its own process.
    stripe_listen: Option<String>,
    _stripe_sim: Option<Process>,
    /// The Adyen dialect, its relay's deliveries and its report routes.
    pub adyen: Option<AdyenSim>,
}

impl Rig {
    pub async fn start(database: &TestDatabase, psp: Psp, extra: &[&str]) -> Rig {
        match psp {
            Psp::Sim => {
                let server = Server::start(&database.url, extra);
                let sim_base = format!("{}/sim", server.base);
                Rig {
                    server,
                    psp,
                    sim_base,
                    stripe_listen: None,
                    _stripe_sim: None,
                    adyen: None,
                }
            }
            Psp::Stripe => {
                let rig = stripe::start_rig(database, extra);
                Rig {
                    server: rig.server,
                    psp,
                    sim_base: format!("http://{}/sim", rig.sim_listen),
                    stripe_listen: Some(rig.sim_listen),
                    _stripe_sim: Some(rig.sim),
                    adyen: None,
                }
            }
            Psp::Adyen => {
                let rig = adyen::start_rig(database, extra).await;
                // Every day's accounting report exists from the start (and keeps growing), so
                // that a sweep finds what the dialect booked, as it would the next day at Adyen.
                rig.sim.close_accounting_days(&rig.server.client()).await;
                Rig {
                    server: rig.server,
                    psp,
                    sim_base: format!("http://{}/sim", rig.sim.listen),
                    stripe_listen: None,
                    _stripe_sim: None,
                    adyen: Some(rig.sim),
                }
            }
        }
    }

    /// The Adyen dialect (panics at another provider).
    pub fn adyen(&self) -> &AdyenSim {
        self.adyen.as_ref().expect("the Adyen dialect only")
    }

    /// The currency the rig's payments are in.
    pub fn currency(&self) -> &'static str {
        match self.psp {
            Psp::Sim | Psp::Stripe => "USD",
            Psp::Adyen => "EUR",
        }
    }

    pub fn client(&self) -> Client {
        self.server.client()
    }

    pub fn payment(&self, amount_minor: i64, method: &str) -> Value {
        match self.psp {
            Psp::Sim => payment_body(amount_minor, method),
            Psp::Stripe => stripe::stripe_payment(amount_minor, method),
            Psp::Adyen => adyen::adyen_payment(amount_minor, method),
        }
    }

    /// A control route of the simulator (`/faults`, `/charges/{id}/…`).
    pub async fn sim(&self, path: &str, body: Value) -> Value {
        let client = self.client();
        let answer = client
            .send(
                client
                    .http
                    .post(format!("{}{path}", self.sim_base))
                    .json(&body),
            )
            .await;
        assert_eq!(
            answer.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        answer.json()
    }

    /// A truth list of the simulator (`/charges`, `/operations`).
    async fn truth(&self, path: &str) -> Vec<Value> {
        list_at(&self.client(), &format!("{}{path}", self.sim_base)).await
    }

    /// The simulator's charges.
    pub async fn charges(&self) -> Vec<Value> {
        self.truth("/charges").await
    }

    /// The simulator's operations (captures, refunds, cancels) on the charge of payment `id`,
    /// of `kind`.
    pub async fn operations_of(&self, payment_id: &str, kind: &str) -> Vec<Value> {
        let charge = self.charge_of(payment_id).await;
        self.truth("/operations")
            .await
            .into_iter()
            .filter(|op| op["charge"] == charge["id"] && op["kind"] == kind)
            .collect()
    }

    /// The Stripe dialect's PaymentIntents (see [`stripe::payment_intents`]).
    pub async fn payment_intents(&self) -> Vec<Value> {
        let listen = self
            .stripe_listen
            .as_deref()
            .expect("PaymentIntents exist in the Stripe dialect only");
        stripe::payment_intents(&self.client(), listen).await
    }

    /// The simulator's charge for our payment.
    pub async fn charge_of(&self, payment_id: &str) -> Value {
        self.charges()
            .await
            .into_iter()
            .find(|charge| charge["reference"] == payment_id)
            .unwrap_or_else(|| panic!("no charge for {payment_id}"))
    }

    /// Changes the amount of the provider's charge for `payment_id` behind our back: the
    /// mismatch a reconciliation sweep finds and leaves open for a person.
    pub async fn change_charge_amount(&self, payment_id: &str, amount_minor: i64) {
        let charge = self.charge_of(payment_id).await;
        self.sim(
            &format!(
                "/charges/{}/amount",
                charge["id"].as_str().expect("a charge id")
            ),
            json!({ "amount_minor": amount_minor }),
        )
        .await;
    }

    /// The provider's name in the ledger (`psp:{name}:clearing`).
    pub fn provider(&self) -> &'static str {
        match self.psp {
            Psp::Sim => "sim",
            Psp::Stripe => "stripe",
            Psp::Adyen => "adyen",
        }
    }

    pub async fn drop_every_webhook(&self) {
        self.sim("/faults", json!({"webhook_drop_rate": 1.0})).await;
    }

    /// `asiento reconcile` once, against this provider. Stripe's and Adyen's times are in
    /// seconds and a window ends before the current one, so the sweep waits for the second to
    /// turn. At Adyen the accounting report of today is closed first.
    pub async fn reconcile(&self, database_url: &str) -> String {
        if let Some(adyen) = &self.adyen {
            adyen.close_accounting_days(&self.client()).await;
            tokio::time::sleep(Duration::from_millis(1_100)).await;
            let providers = format!("adyen=adyen:http://{}", adyen.listen);
            let env = adyen::provider_env("ADYEN");
            let env: Vec<(&str, &str)> = env
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str()))
                .collect();
            let (ok, output) = asiento_with_env(
                &[
                    "reconcile",
                    "--database-url",
                    database_url,
                    "--providers",
                    &providers,
                    "--settle",
                    "0s",
                ],
                &env,
            );
            assert!(ok, "reconcile failed: {output}");
            return output;
        }
        let (ok, output) = match &self.stripe_listen {
            None => {
                let psp = format!("{}/sim", self.server.base);
                asiento(&[
                    "reconcile",
                    "--database-url",
                    database_url,
                    "--psp-url",
                    &psp,
                    "--settle",
                    "0s",
                ])
            }
            Some(listen) => {
                tokio::time::sleep(Duration::from_millis(1_100)).await;
                let providers = format!("stripe=stripe:http://{listen}");
                asiento_with_env(
                    &[
                        "reconcile",
                        "--database-url",
                        database_url,
                        "--providers",
                        &providers,
                        "--settle",
                        "0s",
                    ],
                    &[("ASIENTO_PROVIDER_STRIPE_API_KEY", stripe::API_KEY)],
                )
            }
        };
        assert!(ok, "reconcile failed: {output}");
        output
    }
}
