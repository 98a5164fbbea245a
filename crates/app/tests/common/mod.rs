//! Test support shared by this crate's integration tests (each binary uses its own part of it):
//! a fresh database on either backend, the provider simulator on a loopback port, and a payment
//! flow wired to it.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use asiento_app::clock::Clock;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope, StoredResponse};
use asiento_app::payments::{Idempotent, PaymentFlow};
use asiento_app::providers::{ConfiguredProvider, Providers};
use asiento_app::reply::{Render, Reply};
use asiento_domain::{Amount, FeeSchedule, ProviderName};
use asiento_eventstore::Database;
use asiento_psp::{ClientConfig, HttpProvider};
use asiento_psp_sim::{SimConfig, Simulator};
use serde_json::json;

/// The simulator's fee in the tests' provider configuration, in basis points.
pub const FEE_BPS: u32 = 300;

pub use asiento_testkit::{Backend, TestDatabase};

/// The simulator served over loopback HTTP until [`TestSim::stop`].
pub struct TestSim {
    pub sim: Simulator,
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl TestSim {
    pub async fn start(config: SimConfig) -> TestSim {
        let sim = Simulator::new(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(asiento_psp_sim::run(listener, sim.clone(), async move {
            let _ = stopped.await;
        }));
        TestSim {
            sim,
            addr,
            stop: Some(stop),
        }
    }

    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// A payment flow on `database` whose provider `sim` is this simulator, over HTTP.
    pub fn flow(
        &self,
        database: &Database,
        client: ClientConfig,
        clock: Arc<dyn Clock>,
    ) -> PaymentFlow {
        let provider = HttpProvider::new("sim", &format!("http://{}", self.addr), client).unwrap();
        flow_of(database, "sim", Arc::new(provider), clock)
    }
}

/// A payment flow of a test's own: a migrated database, the simulator served over loopback, and
/// the flow paying through it. The tests of this crate that pay start from one, and add their own
/// helpers to it (`impl PaymentRig` in the test file).
pub struct PaymentRig {
    pub db: TestDatabase,
    pub served: TestSim,
    pub flow: PaymentFlow,
    /// How many of the simulator's recorded events [`PaymentRig::new_events`] has taken.
    events_taken: std::sync::Mutex<usize>,
}

impl PaymentRig {
    /// The flow pays through the served simulator as provider `sim`, as `client` configures it.
    pub async fn start(
        backend: Backend,
        sim: SimConfig,
        client: ClientConfig,
        clock: Arc<dyn Clock>,
    ) -> PaymentRig {
        PaymentRig::start_with(backend, sim, |served, database| {
            served.flow(database, client, clock)
        })
        .await
    }

    /// The flow `flow` makes from the served simulator and the database (another adapter).
    pub async fn start_with(
        backend: Backend,
        sim: SimConfig,
        flow: impl FnOnce(&TestSim, &Database) -> PaymentFlow,
    ) -> PaymentRig {
        let db = TestDatabase::open(backend).await;
        let served = TestSim::start(sim).await;
        let flow = flow(&served, db.database());
        PaymentRig {
            served,
            flow,
            db,
            events_taken: std::sync::Mutex::new(0),
        }
    }

    /// Stops the simulator and drops the database.
    pub async fn finish(mut self) {
        self.served.stop();
        self.db.finish().await;
    }

    /// Waits until the log can be read through every event committed so far. On PostgreSQL a
    /// committed event becomes readable only once every older transaction of the cluster has
    /// ended (other tests run beside this one), and the reconciler's watch lists follow what the
    /// log can read: a sweep right after a write may not see it yet.
    pub async fn log_readable(&self) {
        let sql = "select max(position) from events";
        let newest: Option<i64> = match self.db.database() {
            Database::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
            Database::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap();
        let Some(position) = newest else {
            return;
        };
        let store = self.db.database().event_store();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(cursor) = store.cursor_of_position(position).await.unwrap() {
                if store.head().await.unwrap() >= cursor {
                    return;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the log never became readable through position {position}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// The simulator's recorded events not taken before.
    pub fn new_events(&self) -> Vec<asiento_psp::WebhookEvent> {
        let events = self.served.sim.events();
        let mut taken = self.events_taken.lock().unwrap();
        let fresh = events[(*taken).min(events.len())..].to_vec();
        *taken = events.len();
        fresh
    }
}

/// A payment flow on `database` whose one provider, `name`, is `adapter`.
pub fn flow_of(
    database: &Database,
    name: &str,
    adapter: Arc<dyn asiento_psp::Provider>,
    clock: Arc<dyn Clock>,
) -> PaymentFlow {
    let providers = Providers::new([(
        ProviderName::parse(name).unwrap(),
        ConfiguredProvider {
            adapter,
            fees: FeeSchedule::new(FEE_BPS, Amount::ZERO).unwrap(),
        },
    )]);
    PaymentFlow::new(
        database.clone(),
        asiento_app::commit::Writer::new(database.event_store()),
        providers,
        clock,
        Arc::new(TestRender),
    )
}

/// A `POST /v1/payments` request of tenant `acme` with this key (and a body naming it).
pub fn create_request(key: &str) -> Idempotent {
    Idempotent {
        scope: Scope {
            tenant: "acme".into(),
            method: "POST".into(),
            route: "/v1/payments".into(),
        },
        key: IdempotencyKey::parse(key).unwrap(),
        body: canonical_body_hash(&json!({ "key": key })),
        correlation_id: None,
    }
}

/// Renders just what the tests look at.
pub struct TestRender;

impl Render for TestRender {
    fn render(&self, reply: &Reply<'_>) -> StoredResponse {
        let body = match reply {
            Reply::Payment { payment, .. } => json!({
                "id": payment.id.to_string(),
                "status": payment.status.as_str(),
                "next_action": payment.next_action.is_some(),
            }),
            Reply::Transfer { .. }
            | Reply::TransferBatch { .. }
            | Reply::Account { .. }
            | Reply::Monitor { .. } => json!({}),
            Reply::Rejected(rejected) => json!({"rejected": format!("{rejected:?}")}),
        };
        StoredResponse {
            status: 201,
            body: serde_json::to_vec(&body).unwrap(),
        }
    }
}

/// A POST to a simulator's control routes (`/sim/…`) over plain HTTP/1.1: its status and JSON
/// body (`null` when it has none).
pub async fn sim_post(
    addr: SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = body.to_string();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        uuid::Uuid::new_v4(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    let status: u16 = text[9..12].parse().unwrap();
    let payload = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, payload)| payload);
    (
        status,
        serde_json::from_str(payload).unwrap_or(serde_json::Value::Null),
    )
}
