//! Black-box harness: runs the real `asiento` binary (and, where a test needs a provider that
//! outlives the server, a real `asiento psp-sim`) on port 0, and talks to it over HTTP.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub mod adyen;
pub mod cluster;
pub mod rig;
pub mod stripe;
pub mod webdriver;

pub const BIN: &str = env!("CARGO_BIN_EXE_asiento");
/// How long a process may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A port free when chosen, for a process that must listen on an address known before it starts
/// (a simulator the server is configured with, a server that comes back on its address after a
/// restart, chromedriver). It is taken below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`), where nothing that binds port 0 or connects out can take it
/// in the moment before that process binds it, and no port is handed out twice by one test
/// process. (A port the kernel picked for port 0, released, could be the next one it picks for
/// another test's listener or connection.)
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768)
        .clamp(LOWEST + 1_000, u32::from(u16::MAX));
    let span = ephemeral - LOWEST;
    // `cargo test` runs test binaries one after another, but a port a process of the last one
    // still holds (a child being reaped) is skipped by the bind check. A runner with a process
    // per test (nextest) starts processes with near pids at once: their starts lie
    // `PORTS_APART` apart, more ports than one test takes.
    const PORTS_APART: u32 = 101;
    let start = std::process::id().wrapping_mul(PORTS_APART) % span;
    for _ in 0..span {
        let port = LOWEST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
        let port = u16::try_from(port).expect("below the ephemeral range, so below 65536");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port between {LOWEST} and {ephemeral}");
}

pub use asiento_testkit::{Backend, TestDatabase};

/// Lines of a process's log shown when the test that ran it fails: its last ones, and its first.
const LOG_TAIL_LINES: usize = 40;
const LOG_HEAD_LINES: usize = 10;

/// A running process whose stdout lines are collected. Its log (stderr) goes to a file of its own
/// and is shown, its first [`LOG_HEAD_LINES`] and last [`LOG_TAIL_LINES`] lines, only if the test
/// fails while it holds this `Process`: inside that test's captured output, next to its panic,
/// instead of every process's warnings interleaved on the test binary's stderr.
pub struct Process {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    log: tempfile::NamedTempFile,
    args: Vec<String>,
}

impl Process {
    pub fn spawn(args: &[&str], envs: &[(&str, &str)]) -> Self {
        Self::spawn_bin(BIN, args, envs)
    }

    /// [`Process::spawn`] of another build's binary.
    pub fn spawn_bin(bin: &str, args: &[&str], envs: &[(&str, &str)]) -> Self {
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut command = Command::new(bin);
        command
            .args(args)
            .env("ASIENTO_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log.reopen().expect("the log file, for writing"));
        for (key, value) in envs {
            command.env(key, value);
        }
        let mut child = command.spawn().expect("spawn asiento");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
            log,
            args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        }
    }

    /// Waits for a stdout line containing `needle` and returns it.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        if let Some(line) = self.seen.iter().find(|line| line.contains(needle)) {
            return line.clone();
        }
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(_) => panic!("no line with {needle:?} in time; saw {:?}", self.seen),
            }
        }
    }

    /// Everything the process has logged so far (its stderr), lossy where it was cut off inside a
    /// character.
    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.log.path()).unwrap_or_default()).into_owned()
    }

    /// SIGTERM, then its exit awaited (SIGKILL after 20 s): a graceful stop, which finishes its
    /// work in hand and releases its leases, where a kill leaves them to run out.
    pub fn terminate(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill();
    }

    /// SIGKILL: the process gets no chance to clean up.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            // Lossy: a killed process may have been cut off inside a character.
            let log = String::from_utf8_lossy(&std::fs::read(self.log.path()).unwrap_or_default())
                .into_owned();
            let lines: Vec<&str> = log.lines().collect();
            // The first lines too: a process that failed to start prints its error there, and
            // the backtrace after it.
            let tail_from = lines.len().saturating_sub(LOG_TAIL_LINES);
            let head = &lines[..LOG_HEAD_LINES.min(tail_from)];
            let tail = &lines[tail_from..];
            eprintln!(
                "---- the first {} and the last {} of {} log lines of `asiento {}` ----\n{}\n{}{}",
                head.len(),
                tail.len(),
                lines.len(),
                self.args.join(" "),
                head.join("\n"),
                if head.len() < tail_from { "…\n" } else { "" },
                tail.join("\n")
            );
        }
    }
}

pub fn url_after(line: &str, marker: &str) -> String {
    let start = line.find(marker).expect("marker") + marker.len();
    line[start..]
        .split_whitespace()
        .next()
        .expect("url")
        .to_owned()
}

/// A running `asiento serve`.
pub struct Server {
    pub process: Process,
    pub base: String,
    pub key: String,
    pub database_url: String,
    extra: Vec<String>,
    envs: Vec<(String, String)>,
}

impl Server {
    fn spawn_process(database_url: &str, extra: &[String], envs: &[(String, String)]) -> Process {
        let mut args = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            database_url,
            "--api-keys",
            "acme:sk_test_acme_0123456789abcdef,beta:sk_test_beta_0123456789abcdef",
        ];
        args.extend(extra.iter().map(String::as_str));
        let envs: Vec<(&str, &str)> = envs
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect();
        Process::spawn(&args, &envs)
    }

    /// Starts the server with tenants `acme` and `beta`; the client uses `acme`'s key.
    pub fn start(database_url: &str, extra: &[&str]) -> Self {
        Self::start_with_env(database_url, extra, &[])
    }

    /// [`Server::start`] with environment variables (a provider's secrets).
    pub fn start_with_env(database_url: &str, extra: &[&str], envs: &[(&str, &str)]) -> Self {
        let extra_owned: Vec<String> = extra.iter().map(|arg| (*arg).to_owned()).collect();
        let envs: Vec<(String, String)> = envs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        let mut process = Self::spawn_process(database_url, &extra_owned, &envs);
        let base = url_after(
            &process.wait_for_line("asiento listening on "),
            "listening on ",
        );
        Self {
            process,
            base,
            key: "sk_test_acme_0123456789abcdef".to_owned(),
            database_url: database_url.to_owned(),
            extra: extra_owned,
            envs,
        }
    }

    /// SIGKILLs the server and starts it again on the same database (a new port).
    pub fn crash_and_restart(&mut self) {
        self.process.kill();
        let mut process = Self::spawn_process(&self.database_url, &self.extra, &self.envs);
        self.base = url_after(
            &process.wait_for_line("asiento listening on "),
            "listening on ",
        );
        self.process = process;
    }

    pub fn client(&self) -> Client {
        Client {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .expect("client"),
            base: self.base.clone(),
            key: self.key.clone(),
        }
    }
}

/// A standalone `asiento psp-sim`, for tests where the provider must outlive the server.
pub struct Simulator {
    pub process: Process,
    pub base: String,
}

impl Simulator {
    pub fn start(extra: &[&str]) -> Self {
        let mut args = vec!["psp-sim", "--listen", "127.0.0.1:0", "--seed", "7"];
        args.extend_from_slice(extra);
        let mut process = Process::spawn(&args, &[]);
        let base = url_after(
            &process.wait_for_line("psp-sim listening on "),
            "listening on ",
        );
        Self { process, base }
    }

    pub async fn charges(&self) -> Vec<Value> {
        let answer: Value = reqwest::get(format!("{}/sim/charges", self.base))
            .await
            .expect("sim charges")
            .json()
            .await
            .expect("json");
        match answer {
            Value::Array(items) => items,
            Value::Object(mut map) => match map.remove("data") {
                Some(Value::Array(items)) => items,
                other => panic!("unexpected /sim/charges body {other:?}"),
            },
            other => panic!("unexpected /sim/charges body {other}"),
        }
    }
}

/// A response as the test sees it.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|_| panic!("not JSON: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true")
    }
}

#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    pub base: String,
    pub key: String,
}

impl Client {
    /// The sum of the `/metrics` samples whose line starts with `line_start` (a name and the
    /// start of its labels).
    pub async fn metric(&self, line_start: &str) -> f64 {
        self.metric_where(|line| line.starts_with(line_start)).await
    }

    /// The sum of metric `name`'s samples whose labels include `label` (`outcome="served"`).
    pub async fn metric_labelled(&self, name: &str, label: &str) -> f64 {
        let start = format!("{name}{{");
        self.metric_where(|line| line.starts_with(&start) && line.contains(label))
            .await
    }

    /// The server's `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn metric_where(&self, matches: impl Fn(&str) -> bool) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .filter(|line| matches(line))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// A client that opens a new connection per request: a server may close a connection whose
    /// body it refused to read (413), and a pooled client would then reuse a dead connection.
    pub fn unpooled(&self) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .pool_max_idle_per_host(0)
                .build()
                .expect("client"),
            ..self.clone()
        }
    }

    pub fn with_key(&self, key: &str) -> Self {
        Self {
            key: key.to_owned(),
            ..self.clone()
        }
    }

    pub async fn send(&self, request: reqwest::RequestBuilder) -> Answer {
        let response = request.send().await.expect("request");
        Answer {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.expect("body").to_vec(),
        }
    }

    /// POSTs raw bytes with an idempotency key (or none).
    pub async fn post_raw(
        &self,
        path: &str,
        key: Option<&str>,
        body: impl Into<Vec<u8>>,
    ) -> Answer {
        let mut request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header("content-type", "application/json")
            .body(body.into());
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        self.send(request).await
    }

    /// A POST sent on a task of its own, so that the server can be killed while it is in flight;
    /// the raw result, because a killed server answers nothing.
    pub fn post_in_background(
        &self,
        path: &str,
        key: &str,
        body: &Value,
    ) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
        let request = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header("idempotency-key", key)
            .json(body);
        tokio::spawn(request.send())
    }

    pub async fn post(&self, path: &str, key: &str, body: &Value) -> Answer {
        self.post_raw(path, Some(key), serde_json::to_vec(body).unwrap())
            .await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send(
            self.http
                .get(format!("{}{path}", self.base))
                .bearer_auth(&self.key),
        )
        .await
    }

    /// The tenant's reconciliation exceptions with `status` (`open`, `resolved`).
    pub async fn exceptions(&self, status: &str) -> Vec<Value> {
        let answer = self
            .get(&format!("/v1/reconciliation/exceptions?status={status}"))
            .await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let value = answer.json();
        value
            .as_array()
            .or(value["data"].as_array())
            .expect("a list of exceptions")
            .clone()
    }

    /// The payment's journal entries, from its own event history.
    pub async fn entries_of(&self, payment_id: &str) -> Vec<Value> {
        let events = self.get(&format!("/v1/payments/{payment_id}/events")).await;
        assert_eq!(
            events.status,
            200,
            "{}",
            String::from_utf8_lossy(&events.body)
        );
        events
            .json()
            .as_array()
            .unwrap()
            .iter()
            .filter(|event| event["type"] == "EntryPosted")
            .map(|event| event["data"]["entry"].clone())
            .collect()
    }
}

/// A list the simulator answers at `path` of the server (`/sim/charges`, `/sim/operations`).
pub async fn sim_list(client: &Client, path: &str) -> Vec<Value> {
    list_at(client, &format!("{}{path}", client.base)).await
}

/// A list answered at `url`, bare or in a `data` envelope (the simulator's truth routes, a
/// Stripe listing).
pub async fn list_at(client: &Client, url: &str) -> Vec<Value> {
    let answer = client
        .send(client.http.get(url).bearer_auth(&client.key))
        .await
        .json();
    answer
        .as_array()
        .or(answer["data"].as_array())
        .unwrap_or_else(|| panic!("unexpected {url} body {answer}"))
        .clone()
}

/// The payment as the API shows it now.
pub async fn payment(client: &Client, id: &str) -> Value {
    client.get(&format!("/v1/payments/{id}")).await.json()
}

/// Polls the payment until `done` holds (at most 30 s).
pub async fn wait_for(
    client: &Client,
    id: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let current = payment(client, id).await;
        if done(&current) {
            return current;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: payment is {current}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The merchant events about `object_id` of the given types (comma-separated), once the feed
/// holds `count` of them: the feed follows the log by the projection's lag.
pub async fn merchant_events_of(
    client: &Client,
    types: &str,
    object_id: &str,
    count: usize,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let answer = client
            .get(&format!("/v1/events?type={types}&limit=100"))
            .await;
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let found: Vec<Value> = answer.json()["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter(|event| event["data"]["object"]["id"] == object_id)
            .cloned()
            .collect();
        if found.len() >= count {
            return found;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{types} of {object_id}: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A payment's entries without the provider's fees (Stripe reports one per balance transaction;
/// the simulator's protocol none outside its settlement report): the ones that move its money.
pub fn without_provider_fees(entries: Vec<Value>) -> Vec<Value> {
    entries
        .into_iter()
        .filter(|entry| {
            !entry["legs"].as_array().unwrap().iter().any(|leg| {
                leg["account"]
                    .as_str()
                    .is_some_and(|account| account.starts_with("expense:provider_fees:"))
            })
        })
        .collect()
}

/// `asiento verify` until it passes (at most 30 s: the projections and the sealer catch up).
pub fn verify(database: &TestDatabase) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, output) = asiento(&["verify", "--database-url", &database.url]);
        if ok {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "verify: {output}");
        std::thread::sleep(Duration::from_millis(300));
    }
}

pub fn payment_body(amount_minor: i64, method: &str) -> Value {
    serde_json::json!({
        "amount_minor": amount_minor,
        "currency": "USD",
        "customer": "42",
        "payment_method": method,
    })
}

/// Sends a POST's headers, declaring `content_length` bytes but sending none, and returns the
/// status and body of the answer.
pub async fn raw_post_headers_only(
    base: &str,
    path: &str,
    key: &str,
    content_length: usize,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         Idempotency-Key: big\r\nContent-Type: application/json\r\n\
         Content-Length: {content_length}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer)).await;
    assert!(read.is_ok(), "no answer to a too-large body");
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

/// Runs `asiento ARGS` to the end: whether it succeeded, and its stdout and stderr together.
pub fn asiento(args: &[&str]) -> (bool, String) {
    asiento_with_env(args, &[])
}

/// [`asiento`] with `envs` set (a provider's secrets).
pub fn asiento_with_env(args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    run_bin(BIN, args, envs)
}

/// [`asiento_with_env`] of another build's binary.
pub fn run_bin(bin: &str, args: &[&str], envs: &[(&str, &str)]) -> (bool, String) {
    let output = Command::new(bin)
        .args(args)
        .envs(envs.iter().copied())
        .env("ASIENTO_LOG", "warn")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// The status a payment must have, given the provider's charge (from the simulator's truth).
pub fn expected_status(charge: &Value) -> &'static str {
    let captured = charge["amount_captured"].as_i64().unwrap();
    let refunded = charge["amount_refunded"].as_i64().unwrap();
    match charge["status"].as_str().unwrap() {
        "succeeded" if refunded == 0 => "captured",
        "succeeded" if refunded < captured => "partially_refunded",
        "succeeded" => "refunded",
        "requires_capture" => "authorized",
        "requires_action" => "requires_action",
        _ => "failed",
    }
}

/// An UPDATE that adds `delta` to one account's balance snapshot by hand (a corruption for
/// `verify` to find): the column is NUMERIC on PostgreSQL and decimal text on SQLite.
pub fn shift_balance_sql(backend: Backend, account: &str, delta: i64) -> String {
    let shifted = match backend {
        Backend::Postgres => format!("balance_minor + {delta}"),
        Backend::Sqlite => format!("CAST(CAST(balance_minor AS INTEGER) + {delta} AS TEXT)"),
    };
    format!("UPDATE balances_g1 SET balance_minor = {shifted} WHERE account = '{account}'")
}
