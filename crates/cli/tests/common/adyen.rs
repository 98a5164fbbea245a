//! A server whose provider `adyen` is `asiento psp-sim --dialect adyen` in its own process. The
//! dialect's notification batches reach the server's `/webhooks/adyen` through a relay in the
//! test process that records every delivery and the server's answer to it, so that a test sees
//! that a batch was `[accepted]`. Also: signing items as Adyen does, and posting batches by hand.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use asiento_psp::adyen::hmac::sign_item;
use asiento_psp::adyen::wire::{Amount, NotificationItem, HMAC_SIGNATURE};
use asiento_psp::adyen::HmacKey;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{json, Value};

use super::free_port;
use super::{payment_body, Client, Process, Server, TestDatabase};

pub const API_KEY: &str = "AQE_asiento_adyen_test_key";
pub const MERCHANT: &str = "AsientoECOM";
pub const HMAC_KEY: &str = "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056";
pub const WEBHOOK_USER: &str = "adyen-webhooks";
pub const WEBHOOK_PASSWORD: &str = "s3cret:with:colons";
/// The Report service user, who alone may download the reports.
pub const REPORT_USER: &str = "report_asiento@Company.Asiento";
pub const REPORT_PASSWORD: &str = "r3port:s3cret";
/// How long the dialect takes to decide a capture, refund or cancel: long enough that a test
/// sees the operation pending first.
pub const MODIFICATION_DELAY_MS: &str = "500";
/// The server's webhook body limit (`asiento_api::REQUEST_BODY_BYTES_MAX`).
pub const WEBHOOK_BODY_BYTES_MAX: usize = 64 * 1024;

/// The environment that configures provider `name` (upper case, as its variables spell it) as
/// Adyen with this module's credentials.
pub fn provider_env(name: &str) -> Vec<(String, String)> {
    [
        ("API_KEY", API_KEY),
        ("MERCHANT_ACCOUNT", MERCHANT),
        ("HMAC_KEY", HMAC_KEY),
        ("WEBHOOK_USERNAME", WEBHOOK_USER),
        ("WEBHOOK_PASSWORD", WEBHOOK_PASSWORD),
        ("REPORT_USERNAME", REPORT_USER),
        ("REPORT_PASSWORD", REPORT_PASSWORD),
    ]
    .into_iter()
    .map(|(what, value)| (format!("ASIENTO_PROVIDER_{name}_{what}"), value.to_owned()))
    .collect()
}

/// One delivery of the dialect, and what the server answered it.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub body: Bytes,
    pub status: u16,
    pub answer: String,
}

pub type Deliveries = Arc<Mutex<Vec<Delivery>>>;

#[derive(Clone)]
struct Relay {
    target: String,
    http: reqwest::Client,
    deliveries: Deliveries,
}

async fn relay(State(relay): State<Relay>, headers: HeaderMap, body: Bytes) -> impl IntoResponse {
    let mut request = relay.http.post(&relay.target).body(body.clone());
    for name in ["authorization", "content-type"] {
        if let Some(value) = headers.get(name) {
            request = request.header(name, value);
        }
    }
    let (status, answer) = match request.send().await {
        Ok(response) => (
            response.status().as_u16(),
            response.text().await.unwrap_or_default(),
        ),
        Err(error) => (502, error.to_string()),
    };
    relay.deliveries.lock().unwrap().push(Delivery {
        body,
        status,
        answer: answer.clone(),
    });
    (StatusCode::from_u16(status).unwrap(), answer)
}

/// A relay on loopback that forwards every POST to `target` and records it.
pub async fn start_relay(target: String) -> (String, Deliveries) {
    let deliveries = Deliveries::default();
    let state = Relay {
        target,
        http: reqwest::Client::new(),
        deliveries: Arc::clone(&deliveries),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/relay", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .route("/relay", axum::routing::post(relay))
        .with_state(state);
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (url, deliveries)
}

/// The Adyen dialect on `listen`, delivering its batches to `webhook_url`.
pub fn start_adyen_sim(listen: &str, webhook_url: &str) -> Process {
    let mut process = Process::spawn(
        &[
            "psp-sim",
            "--dialect",
            "adyen",
            "--listen",
            listen,
            "--seed",
            "11",
            "--webhook-url",
            webhook_url,
            "--webhook-hmac-key",
            HMAC_KEY,
            "--webhook-username",
            WEBHOOK_USER,
            "--webhook-password",
            WEBHOOK_PASSWORD,
            "--modification-delay-ms",
            MODIFICATION_DELAY_MS,
            // `pm_card_timeout` answers after 1.5 s: past any test's `--psp-timeout`, and short
            // enough that a request sent again under its key soon gets the first answer.
            "--hang-ms",
            "1500",
            "--report-username",
            REPORT_USER,
            "--report-password",
            REPORT_PASSWORD,
        ],
        &[],
    );
    process.wait_for_line("psp-sim listening on ");
    process
}

/// The dialect of provider `adyen` on a port chosen first, with the relay in front of the
/// server's `/webhooks/adyen`.
pub struct AdyenSim {
    pub listen: String,
    pub deliveries: Deliveries,
    pub process: Process,
}

impl AdyenSim {
    /// Starts the relay to `server` and the dialect on `listen`.
    pub async fn start(listen: String, server: &Server) -> AdyenSim {
        let (relay_url, deliveries) = start_relay(format!("{}/webhooks/adyen", server.base)).await;
        let process = start_adyen_sim(&listen, &relay_url);
        AdyenSim {
            listen,
            deliveries,
            process,
        }
    }

    /// Every item the dialect delivered, with the server's answer to its delivery.
    pub fn items(&self) -> Vec<(Value, Delivery)> {
        let deliveries = self.deliveries.lock().unwrap().clone();
        deliveries
            .into_iter()
            .flat_map(|delivery| {
                assert!(
                    delivery.body.len() <= WEBHOOK_BODY_BYTES_MAX,
                    "a batch of {} bytes is over the server's body limit",
                    delivery.body.len()
                );
                let batch: Value = serde_json::from_slice(&delivery.body).unwrap();
                batch["notificationItems"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|wrapper| (wrapper["NotificationRequestItem"].clone(), delivery.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Waits for the item of `event_code` whose pspReference or originalReference is
    /// `reference`, and returns it with the answer to its delivery.
    pub async fn item(&self, event_code: &str, reference: &str) -> (Value, Delivery) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let found = self.items().into_iter().find(|(item, _)| {
                item["eventCode"] == event_code
                    && (item["pspReference"] == reference || item["originalReference"] == reference)
            });
            if let Some(found) = found {
                return found;
            }
            assert!(
                Instant::now() < deadline,
                "no {event_code} for {reference}: {:#?}",
                self.items()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A control route of the dialect (`/sim/faults`, `/sim/charges/{psp}/dispute`, …).
    pub async fn control(&self, client: &Client, path: &str, body: Value) -> Value {
        super::stripe::sim_control(client, &self.listen, path, body).await
    }

    /// Closes the Payment accounting report of every day through today (`POST
    /// /sim/reports/accounting`); a closed day keeps showing what is booked on it later.
    pub async fn close_accounting_days(&self, client: &Client) -> Value {
        let today = chrono::Utc::now()
            .date_naive()
            .format("%Y-%m-%d")
            .to_string();
        self.control(
            client,
            "/sim/reports/accounting",
            json!({ "through": today }),
        )
        .await
    }

    /// Closes a Settlement details batch (`POST /sim/reports/settlement`): the files it made.
    pub async fn close_settlement_batch(&self, client: &Client) -> Vec<Value> {
        self.control(client, "/sim/reports/settlement", json!({}))
            .await["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// A server whose provider `adyen` is the Adyen dialect.
pub struct Rig {
    pub server: Server,
    pub sim: AdyenSim,
}

pub async fn start_rig(database: &TestDatabase, extra: &[&str]) -> Rig {
    let listen = format!("127.0.0.1:{}", free_port());
    let providers = format!("adyen=adyen:http://{listen}");
    let mut args = vec!["--providers", providers.as_str()];
    args.extend_from_slice(extra);
    let env = provider_env("ADYEN");
    let env: Vec<(&str, &str)> = env
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect();
    let server = Server::start_with_env(&database.url, &args, &env);
    let sim = AdyenSim::start(listen, &server).await;
    Rig { server, sim }
}

pub fn adyen_payment(amount_minor: i64, method: &str) -> Value {
    let mut body = payment_body(amount_minor, method);
    body["provider"] = json!("adyen");
    body["currency"] = json!("EUR");
    body
}

/// An item as Adyen would send it, signed with [`HMAC_KEY`].
pub fn signed_item(
    event_code: &str,
    psp_reference: &str,
    original_reference: Option<&str>,
    merchant_reference: &str,
    value: i64,
) -> NotificationItem {
    let mut item = NotificationItem {
        psp_reference: psp_reference.to_owned(),
        original_reference: original_reference.map(str::to_owned),
        merchant_account_code: MERCHANT.to_owned(),
        merchant_reference: merchant_reference.to_owned(),
        amount: Amount {
            currency: "EUR".to_owned(),
            value,
        },
        event_code: event_code.to_owned(),
        success: "true".to_owned(),
        event_date: "2026-01-01T10:00:00+01:00".to_owned(),
        payment_method: Some("visa".to_owned()),
        reason: None,
        additional_data: Default::default(),
    };
    let signature = sign_item(&HmacKey::from_hex(HMAC_KEY).unwrap(), &item);
    item.additional_data
        .insert(HMAC_SIGNATURE.to_owned(), signature);
    item
}

/// `{"live":"false","notificationItems":[…]}` around `items`.
pub fn batch(items: &[NotificationItem]) -> Vec<u8> {
    let wrapped: Vec<Value> = items
        .iter()
        .map(|item| json!({"NotificationRequestItem": item}))
        .collect();
    serde_json::to_vec(&json!({"live": "false", "notificationItems": wrapped})).unwrap()
}

/// `Basic base64(user:password)`.
pub fn basic(user: &str, password: &str) -> String {
    asiento_psp::adyen::BasicCredentials {
        username: user.to_owned(),
        password: password.to_owned(),
    }
    .header_value()
}

/// POSTs a batch to the server's `/webhooks/{provider}`: the status and the body.
pub async fn deliver(
    client: &Client,
    provider: &str,
    authorization: Option<&str>,
    body: Vec<u8>,
) -> (u16, String) {
    let mut request = client
        .http
        .post(format!("{}/webhooks/{provider}", client.base))
        .header("content-type", "application/json")
        .body(body);
    if let Some(authorization) = authorization {
        request = request.header("authorization", authorization);
    }
    let answer = client.send(request).await;
    (
        answer.status,
        String::from_utf8_lossy(&answer.body).into_owned(),
    )
}
