//! The events relay against a real NATS server (a `nats-server -js` of the test's own, on a free
//! port, with its own store directory), through the real binary, on PostgreSQL and SQLite.
//!
//! Payments are made for two tenants the whole time while the relay publishes the feed; the
//! process whose relay is active is SIGKILLed mid-stream and started again; the NATS server is
//! SIGKILLed, left down for a few seconds and started again on the same port and store. Then a
//! JetStream consumer reads the stream and checks, by id, that it holds every event of each
//! tenant's `GET /v1/events` exactly once, with the feed's bodies, on the tenant's subject, in
//! the feed's order. On PostgreSQL a second process (`--role worker`) relays too: one of the two
//! holds the relay's lease at a time.
//!
//! `nats-server` is `$ASIENTO_TEST_NATS_SERVER`, else `/usr/sbin/nats-server`, else the one on
//! PATH (Debian's `nats-server` package). If it cannot be started or reached, the test fails:
//! it is never skipped.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read as _, Seek as _};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use common::{payment_body, Backend, Client, Server, TestDatabase};
use futures::StreamExt as _;
use serde_json::Value;

const STREAM: &str = "ASIENTO_EVENTS";
const TENANTS: [(&str, &str); 2] = [
    ("acme", "sk_test_acme_0123456789abcdef"),
    ("beta", "sk_test_beta_0123456789abcdef"),
];
/// Payment makers per tenant.
const MAKERS: usize = 2;
/// How long the NATS server stays down: longer than the relay's acknowledgement timeout, so
/// that publishes fail and are retried.
const NATS_DOWN: Duration = Duration::from_secs(4);

/// A `nats-server` with JetStream, on a port and a store directory of its own that outlive its
/// restarts.
struct Nats {
    binary: String,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Nats {
    fn binary() -> String {
        if let Ok(path) = std::env::var("ASIENTO_TEST_NATS_SERVER") {
            return path;
        }
        if std::path::Path::new("/usr/sbin/nats-server").exists() {
            return "/usr/sbin/nats-server".to_owned();
        }
        "nats-server".to_owned()
    }

    fn start() -> Nats {
        let mut nats = Nats {
            binary: Nats::binary(),
            port: common::free_port(),
            dir: tempfile::tempdir().expect("a store directory"),
            child: None,
        };
        nats.spawn();
        nats
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("nats-server.log")
    }

    /// Starts the server and waits until it accepts connections.
    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("the nats-server log file");
        let store = self.dir.path().join("store");
        let child = Command::new(&self.binary)
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-sd",
            ])
            .arg(&store)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log file, again"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start {} ({error}): the relay's tests need a NATS server; install \
                     Debian's nats-server package or set ASIENTO_TEST_NATS_SERVER",
                    self.binary
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{} exited ({status}) before it listened on {}:\n{}",
                    self.binary,
                    self.port,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} does not listen on {} after 20 s:\n{}",
                self.binary,
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The last 4 KiB of the server's log.
    fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = std::fs::File::open(self.log_path()) {
            let length = file.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = file.seek(std::io::SeekFrom::Start(length.saturating_sub(4096)));
            let _ = file.read_to_string(&mut text);
        }
        text
    }

    /// A JetStream context of a client of the test's own.
    async fn jetstream(&self) -> jetstream::Context {
        let client = tokio::time::timeout(
            Duration::from_secs(20),
            async_nats::connect(self.url().as_str()),
        )
        .await
        .unwrap_or_else(|_| panic!("NATS at {} unreachable for 20 s", self.url()))
        .unwrap_or_else(|error| panic!("NATS at {} refused: {error}", self.url()));
        jetstream::new(client)
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- the end of nats-server's log ----\n{}", self.log());
        }
    }
}

/// Payments for both tenants, made until stopped, at whatever address the API has now.
struct Workload {
    base: tokio::sync::watch::Sender<String>,
    stop: Arc<AtomicBool>,
    makers: Vec<tokio::task::JoinHandle<usize>>,
}

impl Workload {
    fn start(base: &str) -> Workload {
        let (sender, receiver) = tokio::sync::watch::channel(base.to_owned());
        let stop = Arc::new(AtomicBool::new(false));
        let mut makers = Vec::new();
        for (tenant, key) in TENANTS {
            for maker in 0..MAKERS {
                let (base, stop) = (receiver.clone(), Arc::clone(&stop));
                makers.push(tokio::spawn(async move {
                    let http = reqwest::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .unwrap();
                    let mut made = 0;
                    for n in 1_i64.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let method = if n % 4 == 0 {
                            "pm_card_declined"
                        } else {
                            "pm_card_ok"
                        };
                        let url = format!("{}/v1/payments", base.borrow().as_str());
                        let sent = http
                            .post(url)
                            .bearer_auth(key)
                            .header("idempotency-key", format!("{tenant}-{maker}-{n}"))
                            .json(&payment_body(1_000 + n, method))
                            .send()
                            .await;
                        match sent {
                            Ok(answer) if answer.status().is_success() => made += 1,
                            // The server is down or restarting: the next payment goes to its
                            // new address.
                            _ => tokio::time::sleep(Duration::from_millis(100)).await,
                        }
                    }
                    made
                }));
            }
        }
        Workload {
            base: sender,
            stop,
            makers,
        }
    }

    /// Stops the makers; how many payments they made.
    async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let mut made = 0;
        for maker in self.makers {
            made += maker.await.unwrap();
        }
        made
    }
}

/// How many messages the stream holds (0 before the relay created it).
async fn stored(jetstream: &jetstream::Context) -> u64 {
    match jetstream.get_stream(STREAM).await {
        Ok(stream) => match stream.get_info().await {
            Ok(info) => info.state.messages,
            Err(_) => 0,
        },
        Err(_) => 0,
    }
}

/// Each tenant's feed through `GET /v1/events`, read on from where the last reading stopped
/// (cursors outlive the server's restarts).
#[derive(Default)]
struct Feeds {
    cursors: BTreeMap<&'static str, String>,
    events: BTreeMap<&'static str, Vec<Value>>,
}

impl Feeds {
    /// Reads what the feeds gained; how many events they hold now.
    async fn read_on(&mut self, client: &Client) -> usize {
        for (tenant, key) in TENANTS {
            let client = client.with_key(key);
            let cursor = self.cursors.entry(tenant).or_insert_with(|| "0".to_owned());
            let events = self.events.entry(tenant).or_default();
            loop {
                let answer = client
                    .get(&format!("/v1/events?after={cursor}&limit=100"))
                    .await;
                assert_eq!(
                    answer.status,
                    200,
                    "{}",
                    String::from_utf8_lossy(&answer.body)
                );
                let page = answer.json();
                events.extend(page["data"].as_array().unwrap().iter().cloned());
                *cursor = page["next_cursor"].as_str().unwrap().to_owned();
                if !page["has_more"].as_bool().unwrap() {
                    break;
                }
            }
        }
        self.total()
    }

    fn total(&self) -> usize {
        self.events.values().map(Vec::len).sum()
    }
}

/// The processes whose relay holds the lease now, by index into `servers`.
async fn active(servers: &[&Server]) -> Vec<usize> {
    let mut active = Vec::new();
    for (index, server) in servers.iter().enumerate() {
        if server.client().metric("asiento_events_relay_active").await == 1.0 {
            active.push(index);
        }
    }
    active
}

/// Waits until exactly one of `servers` relays; its index.
async fn the_active_one(servers: &[&Server]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = active(servers).await;
        if let [one] = now.as_slice() {
            return *one;
        }
        assert!(
            Instant::now() < deadline,
            "not exactly one relay active: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One message of the stream as the consumer read it.
#[derive(Debug)]
struct Relayed {
    subject: String,
    id: String,
    tenant: String,
    seq: i64,
    body: Value,
}

/// Every message of the stream, through a durable pull consumer, acknowledged one by one.
async fn consume(jetstream: &jetstream::Context) -> Vec<Relayed> {
    let stream = jetstream.get_stream(STREAM).await.unwrap();
    let consumer: consumer::PullConsumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("relay-test".to_owned()),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut read = Vec::new();
    let mut last_stream_sequence = 0;
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(500)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .unwrap();
        let mut got = 0;
        while let Some(message) = batch.next().await {
            let message = message.unwrap();
            got += 1;
            let sequence = message.info().unwrap().stream_sequence;
            assert!(sequence > last_stream_sequence, "redelivered: {sequence}");
            last_stream_sequence = sequence;
            let headers = message.headers.clone().expect("headers");
            let header = |name: async_nats::HeaderName| {
                headers
                    .get(name.clone())
                    .unwrap_or_else(|| panic!("no {name} on {}", message.subject))
                    .as_str()
                    .to_owned()
            };
            let custom = |name: &str| header(name.parse().unwrap());
            read.push(Relayed {
                subject: message.subject.to_string(),
                id: header(async_nats::header::NATS_MESSAGE_ID),
                tenant: custom("Asiento-Tenant"),
                seq: custom("Asiento-Seq").parse().unwrap(),
                body: serde_json::from_slice(&message.payload).unwrap(),
            });
            message.ack().await.unwrap();
        }
        if got == 0 {
            return read;
        }
    }
}

/// The relay rounds that failed, over every server.
async fn relay_errors(servers: &[&Server]) -> f64 {
    let mut errors = 0.0;
    for server in servers {
        errors += server
            .client()
            .metric("asiento_events_relay_errors_total")
            .await;
    }
    errors
}

async fn a_consumer_reads_every_event_once_in_order_across_crashes(backend: Backend) {
    let started = Instant::now();
    let mut nats = Nats::start();
    let jetstream = nats.jetstream().await;
    let database = TestDatabase::new(backend).await;
    let sim = common::Simulator::start(&[]);
    let url = nats.url();
    let relay = [
        "--events-relay",
        url.as_str(),
        "--events-relay-lease",
        "3s",
        "--events-relay-ack-timeout",
        "1s",
    ];
    let with = |role: &[&'static str]| {
        let mut args = vec!["--psp-url", sim.base.as_str()];
        args.extend_from_slice(role);
        args.extend_from_slice(&relay);
        args
    };
    // The relay's own log lines (lease taken, rounds failed, resumed past the cursor) are shown
    // if the test fails.
    let log = [("ASIENTO_LOG", "warn,asiento_relay=info,async_nats=info")];
    let mut api = Server::start_with_env(&database.url, &with(&[]), &log);
    // On PostgreSQL a second process relays too; one of them holds the lease.
    let mut standby = (backend == Backend::Postgres)
        .then(|| Server::start_with_env(&database.url, &with(&["--role", "worker"]), &log));
    let workload = Workload::start(&api.base);

    // The relay publishes as the payments are made; the active one dies mid-stream.
    let deadline = Instant::now() + Duration::from_secs(60);
    while stored(&jetstream).await < 40 {
        assert!(Instant::now() < deadline, "the relay published nothing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let servers: Vec<&Server> = std::iter::once(&api).chain(standby.as_ref()).collect();
    let killed = the_active_one(&servers).await;
    let before_kill = stored(&jetstream).await;
    if killed == 0 {
        api.crash_and_restart();
        workload.base.send_replace(api.base.clone());
    } else if let Some(standby) = standby.as_mut() {
        standby.crash_and_restart();
    }
    // A relay takes over (the restarted one, or the other process, once the lease ran out), the
    // feed grows again (the projector's lease of a killed process runs out too), and the relay
    // keeps up with it.
    let mut feeds = Feeds::default();
    let at_kill = feeds.read_on(&api.client()).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while feeds.read_on(&api.client()).await < at_kill + 40 {
        assert!(Instant::now() < deadline, "the feed stopped after the kill");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let live = feeds.total();
    while usize::try_from(stored(&jetstream).await).unwrap() < live {
        assert!(
            Instant::now() < deadline,
            "no relay published after the kill"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The NATS server goes away as events keep coming, for a while and at least until a relay
    // round failed (a round held up by a slow read of the log may span a short outage), then
    // comes back on its port with its store.
    let servers: Vec<&Server> = std::iter::once(&api).chain(standby.as_ref()).collect();
    let errors_before = relay_errors(&servers).await;
    nats.kill();
    tokio::time::sleep(NATS_DOWN).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while relay_errors(&servers).await == errors_before {
        assert!(
            Instant::now() < deadline,
            "no relay round failed while NATS was down"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    nats.spawn();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let made = workload.stop().await;
    assert!(made >= 20, "only {made} payments were made");

    // The relay catches up with the feed: the stream holds as many events as the feeds.
    let client = api.client();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut before = usize::MAX;
    loop {
        // The stream first: what it held then, the feed held by the time it is read.
        let held = usize::try_from(stored(&jetstream).await).unwrap();
        let total = feeds.read_on(&client).await;
        assert!(
            held <= total,
            "the stream holds {held} events, the feeds {total}"
        );
        if held == total && total == before {
            break;
        }
        before = total;
        assert!(
            Instant::now() < deadline,
            "the stream holds {held} of the feeds' {total} events"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let feeds = feeds.events;

    // The consumer: every event once by id, each tenant's in its feed's order, as the feed says.
    let relayed = consume(&jetstream).await;
    let mut ids = HashSet::new();
    let mut last_seq = 0;
    for message in &relayed {
        assert!(ids.insert(message.id.clone()), "{} twice", message.id);
        assert!(
            message.seq > last_seq,
            "feed seq {} after {last_seq}: not in log order",
            message.seq
        );
        last_seq = message.seq;
        assert_eq!(message.body["id"].as_str(), Some(message.id.as_str()));
        let kind = message.body["type"].as_str().unwrap();
        assert_eq!(
            message.subject,
            format!("asiento.{}.{kind}", message.tenant),
            "{message:?}"
        );
    }
    for (tenant, events) in &feeds {
        let theirs: Vec<&Relayed> = relayed.iter().filter(|m| m.tenant == *tenant).collect();
        let want: Vec<&str> = events.iter().map(|e| e["id"].as_str().unwrap()).collect();
        let got: Vec<&str> = theirs.iter().map(|m| m.id.as_str()).collect();
        assert_eq!(got, want, "{tenant}'s events in the stream and in its feed");
        for (message, event) in theirs.iter().zip(events) {
            assert_eq!(&message.body, event, "{tenant}'s event {}", message.id);
        }
        assert!(events.len() >= 10, "{tenant} has {} events", events.len());
    }
    assert_eq!(relayed.len(), feeds.values().map(Vec::len).sum::<usize>());

    // The stream drops an event published again with its id within the duplicate window (as after
    // a crash between the acknowledgements and the cursor's move): it keeps one copy.
    let info = jetstream
        .get_stream(STREAM)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    assert_eq!(info.config.subjects, ["asiento.>"]);
    assert_eq!(info.config.duplicate_window, Duration::from_secs(120));
    let newest = relayed.last().unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, newest.id.as_str());
    let again = jetstream
        .publish_with_headers(
            newest.subject.clone(),
            headers,
            serde_json::to_vec(&newest.body).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(again.duplicate, "{again:?}");
    assert_eq!(stored(&jetstream).await, info.state.messages);

    // One relay holds the lease.
    let servers: Vec<&Server> = std::iter::once(&api).chain(standby.as_ref()).collect();
    let errors = relay_errors(&servers).await;
    let mut duplicates = 0.0;
    for server in &servers {
        duplicates += server
            .client()
            .metric("asiento_events_relay_duplicates_total")
            .await;
    }
    assert_eq!(active(&servers).await.len(), 1);
    eprintln!(
        "{backend:?}: {made} payments, {} events relayed once each ({before_kill} before the \
         kill of process {killed}), {errors} failed rounds, {duplicates} re-publishes dropped \
         by JetStream, in {:.1} s",
        relayed.len(),
        started.elapsed().as_secs_f64()
    );
    drop(standby);
    drop(api);
    database.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_reads_every_event_once_in_order_across_crashes_postgres() {
    a_consumer_reads_every_event_once_in_order_across_crashes(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_consumer_reads_every_event_once_in_order_across_crashes_sqlite() {
    a_consumer_reads_every_event_once_in_order_across_crashes(Backend::Sqlite).await;
}

/// A relay of one tenant, to a stream of its own name: that tenant's events, in its feed's
/// order, and no other tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_of_some_tenants_publishes_theirs_alone() {
    const ONLY: &str = "BETA_EVENTS";
    let nats = Nats::start();
    let jetstream = nats.jetstream().await;
    let database = TestDatabase::new(Backend::Sqlite).await;
    let url = nats.url();
    let server = Server::start(
        &database.url,
        &[
            "--events-relay",
            &url,
            "--events-relay-stream",
            ONLY,
            "--events-relay-tenants",
            "beta",
        ],
    );
    let client = server.client();
    for (tenant, key) in TENANTS {
        for n in 0..3 {
            let answer = client
                .with_key(key)
                .post(
                    "/v1/payments",
                    &format!("{tenant}-{n}"),
                    &payment_body(500 + n, "pm_card_ok"),
                )
                .await;
            assert!(answer.status < 300, "{}", answer.status);
        }
    }
    let mut feeds = Feeds::default();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        feeds.read_on(&client).await;
        let beta = feeds.events.get("beta").map_or(0, Vec::len);
        let held = match jetstream.get_stream(ONLY).await {
            Ok(stream) => stream.get_info().await.map_or(0, |i| i.state.messages),
            Err(_) => 0,
        };
        if beta >= 6 && usize::try_from(held).unwrap() == beta {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{ONLY} holds {held} of beta's {beta}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let stream = jetstream.get_stream(ONLY).await.unwrap();
    let want: Vec<&str> = feeds.events["beta"]
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    let mut got = Vec::new();
    for sequence in 1..=want.len() as u64 {
        let message = stream.get_raw_message(sequence).await.unwrap();
        assert!(
            message.subject.starts_with("asiento.beta."),
            "{}",
            message.subject
        );
        got.push(
            message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .unwrap()
                .as_str()
                .to_owned(),
        );
    }
    assert_eq!(got, want);
    assert!(jetstream.get_stream(STREAM).await.is_err(), "{STREAM} made");
    assert_eq!(
        client
            .metric("asiento_events_relay_active{relay=\"BETA_EVENTS:beta\"}")
            .await,
        1.0
    );
    drop(server);
    database.finish().await;
}

/// Two relays, one per tenant, sharing one stream: each finds the other's messages between its
/// own (its expectation of the last message fails) and goes on one event at a time; the stream
/// ends holding every event of both tenants once, each tenant's in its feed's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relays_sharing_a_stream_keep_each_tenant_s_order() {
    const SHARED: &str = "SHARED_EVENTS";
    let nats = Nats::start();
    let jetstream = nats.jetstream().await;
    let database = TestDatabase::new(Backend::Postgres).await;
    let url = nats.url();
    let relay_of = |tenant: &'static str| {
        Server::start(
            &database.url,
            &[
                "--events-relay",
                &url,
                "--events-relay-stream",
                SHARED,
                "--events-relay-tenants",
                tenant,
            ],
        )
    };
    let servers = [relay_of("acme"), relay_of("beta")];
    let mut makers = Vec::new();
    for (n, (tenant, key)) in TENANTS.iter().enumerate() {
        let client = servers[n].client().with_key(key);
        makers.push(tokio::spawn(async move {
            for i in 0..40 {
                let answer = client
                    .post(
                        "/v1/payments",
                        &format!("{tenant}-{i}"),
                        &payment_body(500 + i, "pm_card_ok"),
                    )
                    .await;
                assert!(answer.status < 300, "{}", answer.status);
            }
        }));
    }
    for maker in makers {
        maker.await.unwrap();
    }
    let client = servers[0].client();
    let mut feeds = Feeds::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let total = loop {
        feeds.read_on(&client).await;
        let want: usize = TENANTS
            .iter()
            .map(|(tenant, _)| feeds.events.get(*tenant).map_or(0, Vec::len))
            .sum();
        let held = match jetstream.get_stream(SHARED).await {
            Ok(stream) => stream.get_info().await.map_or(0, |i| i.state.messages),
            Err(_) => 0,
        };
        if want >= 2 * 40 && usize::try_from(held).unwrap() == want {
            break held;
        }
        assert!(Instant::now() < deadline, "{SHARED} holds {held} of {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let stream = jetstream.get_stream(SHARED).await.unwrap();
    let mut got: std::collections::HashMap<String, Vec<String>> = Default::default();
    for sequence in 1..=total {
        let message = stream.get_raw_message(sequence).await.unwrap();
        let tenant = message.subject.split('.').nth(1).unwrap().to_owned();
        got.entry(tenant).or_default().push(
            message
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .unwrap()
                .as_str()
                .to_owned(),
        );
    }
    for (tenant, _) in TENANTS {
        let want: Vec<String> = feeds.events[tenant]
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got[tenant], want, "{tenant}");
    }
    drop(servers);
    database.finish().await;
}
