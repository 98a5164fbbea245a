//! Failover, on clusters the test makes (`common::cluster`): a primary with a synchronous
//! standby, `asiento serve --database-url` naming both hosts. Clients make payments, each
//! retrying its Idempotency-Key until it is answered 2xx; the primary's postmaster is SIGKILLed
//! mid-load and the test promotes the standby. asiento finds the new primary by itself; while it
//! switches clients get only retryable answers (503, or 409 for a key still in flight); every
//! payment answered 2xx is in the new primary's log, once, charged once at the provider, and
//! `asiento verify` is clean there.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{payment_body, Client, Server};

/// The campaign's knobs, from the environment (`scripts/chaos` sets them for its longer rounds):
/// clients, seconds of load before the kill, milliseconds the standby stays unpromoted after it,
/// and payments each client makes after the promotion.
struct Knobs {
    clients: usize,
    before_kill: Duration,
    unpromoted: Duration,
    after_promotion: usize,
}

impl Knobs {
    fn from_env() -> Knobs {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|raw| {
                    raw.parse::<u64>()
                        .unwrap_or_else(|_| panic!("{name}={raw}"))
                })
                .unwrap_or(default)
        };
        Knobs {
            clients: usize::try_from(number("FAILOVER_CLIENTS", 4)).unwrap(),
            before_kill: Duration::from_secs(number("FAILOVER_SECONDS", 2)),
            unpromoted: Duration::from_millis(number("FAILOVER_UNPROMOTED_MS", 1_500)),
            after_promotion: usize::try_from(number("FAILOVER_AFTER", 5)).unwrap(),
        }
    }
}

#[derive(Default)]
struct Seen {
    /// Every answer's status, counted.
    statuses: HashMap<u16, usize>,
    /// Payment id by Idempotency-Key, once answered 2xx.
    acknowledged: HashMap<String, String>,
    /// The largest position a 2xx answered.
    newest: i64,
    /// When the first 2xx to a request sent after the kill came.
    first_after_kill: Option<Instant>,
}

/// Sends one payment under `key` until it is answered 2xx; every answer is noted. Returns when
/// the request answered 2xx was sent.
async fn pay_until_acknowledged(client: &Client, key: &str, seen: &Mutex<Seen>) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let sent = Instant::now();
        let answer = client
            .post("/v1/payments", key, &payment_body(1_000, "pm_card_ok"))
            .await;
        {
            let mut seen = seen.lock().unwrap();
            *seen.statuses.entry(answer.status).or_default() += 1;
            if (200..300).contains(&answer.status) {
                let body = answer.json();
                let id = body["id"].as_str().unwrap().to_owned();
                seen.acknowledged.insert(key.to_owned(), id);
                seen.newest = seen.newest.max(body["position"].as_i64().unwrap());
                return sent;
            }
        }
        assert!(
            matches!(answer.status, 409 | 503),
            "{key}: {} {}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        );
        assert!(Instant::now() < deadline, "{key} never acknowledged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payment_answered_2xx_survives_the_primary_s_death() {
    let knobs = Knobs::from_env();
    let primary = Cluster::primary();
    let standby = primary.standby("failover");
    primary.synchronous_standby("failover");
    let both = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{}?target_session_attrs=read-write",
        primary.port,
        standby.port,
        common::cluster::DATABASE
    );
    // A key in flight when the primary died is taken over by its retry after its lease.
    let server = Server::start(&both, &["--idempotency-lease", "3s"]);
    let client = server.client();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let killed_at = Arc::new(Mutex::new(None::<Instant>));
    let promoted = Arc::new(std::sync::atomic::AtomicBool::new(false));

    let mut clients = Vec::new();
    for number in 0..knobs.clients {
        let (client, seen, killed_at, promoted) = (
            client.clone(),
            Arc::clone(&seen),
            Arc::clone(&killed_at),
            Arc::clone(&promoted),
        );
        let after_promotion = knobs.after_promotion;
        clients.push(tokio::spawn(async move {
            let mut after = 0;
            for n in 0.. {
                let sent =
                    pay_until_acknowledged(&client, &format!("failover-{number}-{n}"), &seen).await;
                let killed = *killed_at.lock().unwrap();
                if let Some(killed) = killed.filter(|killed| sent > *killed) {
                    let mut seen = seen.lock().unwrap();
                    if seen.first_after_kill.is_none() {
                        seen.first_after_kill = Some(Instant::now());
                        eprintln!("first 2xx {:?} after the kill", killed.elapsed());
                    }
                }
                if promoted.load(std::sync::atomic::Ordering::SeqCst) {
                    after += 1;
                    if after == after_promotion {
                        return;
                    }
                }
            }
        }));
    }

    tokio::time::sleep(knobs.before_kill).await;
    let before = seen.lock().unwrap().acknowledged.len();
    assert!(before >= 10, "only {before} payments before the kill");
    primary.kill_postmaster();
    let killed = Instant::now();
    *killed_at.lock().unwrap() = Some(killed);
    tokio::time::sleep(knobs.unpromoted).await;
    standby.promote();
    promoted.store(true, std::sync::atomic::Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let first = seen.first_after_kill.expect("no 2xx after the kill");
    eprintln!(
        "{} payments, {before} before the kill; answers {:?}; first 2xx {:?} after the kill \
         ({:?} after the promotion)",
        seen.acknowledged.len(),
        seen.statuses,
        first - killed,
        first.saturating_duration_since(killed + knobs.unpromoted)
    );
    assert!(
        seen.statuses
            .keys()
            .all(|status| matches!(status, 200..=299 | 409 | 503)),
        "{:?}",
        seen.statuses
    );

    // Every payment answered 2xx is in the new primary's log, and no key made two.
    let new_primary = standby;
    let by_id = |id: &str| format!("/v1/payments/{id}");
    for id in seen.acknowledged.values() {
        let answer = client.get(&by_id(id)).await;
        assert_eq!(answer.status, 200, "{id} lost");
        assert_eq!(answer.json()["status"], "captured", "{id}");
    }
    // The projections went on from their checkpoints: the list has every payment.
    let mut listed = std::collections::HashSet::new();
    let mut cursor = String::new();
    loop {
        let page = client
            .get(&format!(
                "/v1/payments?limit=100&min_position={}{cursor}",
                seen.newest
            ))
            .await;
        assert_eq!(page.status, 200, "{}", String::from_utf8_lossy(&page.body));
        let page = page.json();
        for payment in page["data"].as_array().unwrap() {
            assert!(listed.insert(payment["id"].as_str().unwrap().to_owned()));
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = format!("&cursor={next}"),
            None => break,
        }
    }
    assert!(seen.acknowledged.values().all(|id| listed.contains(id)));
    let streams: usize = new_primary
        .psql(
            common::cluster::DATABASE,
            "SELECT count(*) FROM events WHERE event_type = 'PaymentIntended'",
        )
        .parse()
        .unwrap();
    assert_eq!(
        streams,
        seen.acknowledged.len(),
        "payments in the log against keys answered 2xx"
    );
    // The provider got one charge per payment: no key sent twice across the switch.
    let mut charged = std::collections::HashSet::new();
    for charge in common::sim_list(&client, "/sim/charges").await {
        let reference = charge["reference"].as_str().unwrap().to_owned();
        assert!(
            charged.insert(reference.clone()),
            "{reference} charged twice"
        );
    }
    assert_eq!(
        charged,
        seen.acknowledged.values().cloned().collect(),
        "charges at the provider against payments answered 2xx"
    );
    let (clean, report) = common::asiento(&["verify", "--database-url", &new_primary.url()]);
    assert!(clean, "verify on the new primary: {report}");
    drop(server);
}
