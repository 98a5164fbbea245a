//! The PostgreSQL outage: once mid-load, the PostgreSQL server the test database lives on is
//! stopped with an immediate shutdown for a few seconds and started again, while the same
//! `asiento serve` keeps answering. The server is found from the test database's own connection
//! (the machine's cluster through `pg_ctlcluster`, any other through `pg_ctl`), and is started
//! again even when the test panics mid-outage, because it is shared. Afterwards the service must
//! create a payment again within the recovery bound, and what clients were answered while it was
//! down is judged here.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::load::{Observation, Record};
use crate::settings::API_KEY;

/// How the campaign stops and starts the PostgreSQL server its database lives on: the machine's
/// cluster through `pg_ctlcluster`, any other (the throwaway cluster of scripts/test) through
/// `pg_ctl` on its data directory, as the directory's owner when the test runs as root. The
/// server is found from the test database's own connection (`data_directory`, `port`), so
/// nothing has to name it; a server this test cannot stop is a failure, never a skip.
pub struct PgControl {
    url: String,
    what: String,
    stop: Vec<String>,
    start: Vec<String>,
}

/// Runs `argv`: its stdout, or why it failed.
fn run_command(argv: &[String]) -> Result<String, String> {
    let output = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|error| format!("{argv:?}: {error}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{argv:?} failed ({}): {}",
            output.status,
            text.trim()
        ))
    }
}

/// The arguments of `postmaster.opts` (`/path/postgres "-D" "dir" "-p" "55432" …`), the program
/// and its `-D` left out.
fn postmaster_options(line: &str) -> Vec<String> {
    let mut options = Vec::new();
    let mut rest = line.trim();
    // The program's path is the first word, unquoted.
    rest = rest.split_once(' ').map_or("", |(_, after)| after);
    while let Some(open) = rest.find('"') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('"') else { break };
        options.push(after[..close].to_owned());
        rest = &after[close + 1..];
    }
    let mut kept = Vec::new();
    let mut iter = options.into_iter();
    while let Some(option) = iter.next() {
        if option == "-D" {
            iter.next();
        } else {
            kept.push(option);
        }
    }
    kept
}

impl PgControl {
    pub async fn locate(url: &str) -> Result<Self, String> {
        use sqlx::Connection as _;
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|error| format!("cannot connect to {url}: {error}"))?;
        let (data, port): (String, String) =
            sqlx::query_as("select current_setting('data_directory'), current_setting('port')")
                .fetch_one(&mut conn)
                .await
                .map_err(|error| format!("cannot read the server's data_directory: {error}"))?;
        let _ = conn.close().await;
        // The directory must be this machine's and belong to the server that answered.
        let pid_file =
            std::fs::read_to_string(format!("{data}/postmaster.pid")).map_err(|error| {
                format!(
                "the server's data directory {data} is not readable here ({error}): a server on \
                 another machine cannot be stopped by this test"
            )
            })?;
        let pid_lines: Vec<&str> = pid_file.lines().collect();
        if pid_lines.get(3).map(|line| line.trim()) != Some(port.as_str()) {
            return Err(format!(
                "{data}/postmaster.pid names port {:?}, the server answers on {port}: not the \
                 same server",
                pid_lines.get(3)
            ));
        }
        let canonical = |path: &str| {
            std::fs::canonicalize(path)
                .map_or_else(|_| path.to_owned(), |p| p.display().to_string())
        };
        let data_canonical = canonical(&data);
        // The machine's cluster (Debian's postgresql-common).
        if let Ok(listing) = run_command(&["pg_lsclusters".to_owned(), "--no-header".to_owned()]) {
            for line in listing.lines() {
                let fields: Vec<&str> = line.split_whitespace().collect();
                if fields.len() >= 6 && canonical(fields[5]) == data_canonical {
                    let base = |action: &str| {
                        let mut argv: Vec<String> = [
                            "pg_ctlcluster",
                            "--skip-systemctl-redirect",
                            fields[0],
                            fields[1],
                        ]
                        .iter()
                        .map(|arg| (*arg).to_owned())
                        .collect();
                        argv.push(action.to_owned());
                        argv
                    };
                    let mut stop = base("stop");
                    stop.extend(["-m".to_owned(), "immediate".to_owned()]);
                    return Ok(Self {
                        url: url.to_owned(),
                        what: format!("cluster {} {} ({data})", fields[0], fields[1]),
                        stop,
                        start: base("start"),
                    });
                }
            }
        }
        // Any other: pg_ctl on the data directory, with the options it was started with.
        let version = std::fs::read_to_string(format!("{data}/PG_VERSION"))
            .map(|text| text.trim().to_owned())
            .unwrap_or_default();
        let versioned = format!("/usr/lib/postgresql/{version}/bin/pg_ctl");
        let pg_ctl = if !version.is_empty() && std::path::Path::new(&versioned).exists() {
            versioned
        } else {
            "pg_ctl".to_owned()
        };
        let opts = std::fs::read_to_string(format!("{data}/postmaster.opts"))
            .map_err(|error| format!("cannot read {data}/postmaster.opts: {error}"))?;
        let options = postmaster_options(&opts)
            .iter()
            .map(|option| format!("\"{option}\""))
            .collect::<Vec<_>>()
            .join(" ");
        let mut prefix = Vec::new();
        let me = run_command(&["id".to_owned(), "-u".to_owned()])?;
        let owner = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata(&data)
                .map_err(|error| format!("{data}: {error}"))?
                .uid()
        };
        if me.trim() == "0" && owner != 0 {
            // pg_ctl refuses root; the directory's owner runs it.
            let name = run_command(&["id".to_owned(), "-nu".to_owned(), owner.to_string()])?;
            prefix = vec![
                "runuser".to_owned(),
                "-u".to_owned(),
                name.trim().to_owned(),
                "--".to_owned(),
            ];
        }
        let parent = std::path::Path::new(&data_canonical)
            .parent()
            .map(|dir| dir.join("log"))
            .filter(|log| log.exists())
            .map_or_else(
                || format!("{data}/chaos-restart.log"),
                |log| log.display().to_string(),
            );
        let argv = |rest: &[&str]| {
            let mut argv = prefix.clone();
            argv.push(pg_ctl.clone());
            argv.extend(rest.iter().map(|arg| (*arg).to_owned()));
            argv
        };
        Ok(Self {
            url: url.to_owned(),
            what: format!("pg_ctl -D {data}"),
            stop: argv(&["-D", &data, "-m", "immediate", "-w", "stop"]),
            start: argv(&[
                "-D", &data, "-l", &parent, "-w", "-t", "120", "-o", &options, "start",
            ]),
        })
    }

    /// Starts the server and waits until it takes connections again (crash recovery included).
    async fn start(&self) -> Result<(), String> {
        use sqlx::Connection as _;
        let start = self.start.clone();
        tokio::task::spawn_blocking(move || run_command(&start))
            .await
            .map_err(|error| error.to_string())??;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            match sqlx::PgConnection::connect(&self.url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    return Ok(());
                }
                Err(error) if Instant::now() > deadline => {
                    return Err(format!("started, but no connection in 120 s: {error}"))
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }
}

/// Starts the server again if it is still stopped when this is dropped (a panic mid-outage):
/// the server is shared, so the test never leaves it down.
struct StartOnDrop(Option<Vec<String>>);

impl Drop for StartOnDrop {
    fn drop(&mut self) {
        if let Some(start) = self.0.take() {
            let _ = run_command(&start);
        }
    }
}

/// What the PostgreSQL outage did: when, and how long the service took to answer again.
#[derive(Clone, Debug, Default)]
pub struct OutageReport {
    /// From the stop command to the restarted server taking connections.
    pub window: Option<(Instant, Instant)>,
    pub down: Duration,
    /// From the server taking connections to the first created payment.
    pub recovered_in: Option<Duration>,
}

/// One immediate shutdown of PostgreSQL under load: stop, `down` without a server, start, then
/// the same `asiento serve` (never restarted here) must create a payment again within
/// `recovery_bound`. The probe's key is recorded like a client's, so the final checks cover it.
pub async fn pg_outage(
    pg: &PgControl,
    down: Duration,
    recovery_bound: Duration,
    base: &str,
    record: &Mutex<Record>,
) -> OutageReport {
    let stop_at = Instant::now();
    let stop = pg.stop.clone();
    let mut guard = StartOnDrop(Some(pg.start.clone()));
    tokio::task::spawn_blocking(move || run_command(&stop))
        .await
        .unwrap()
        .unwrap_or_else(|error| {
            panic!(
                "chaos: cannot stop PostgreSQL ({}): {error}\n(CHAOS_PG_OUTAGE=0 runs the \
                 campaign without the outage)",
                pg.what
            )
        });
    tokio::time::sleep(down).await;
    let stopped_for = stop_at.elapsed();
    if let Err(error) = pg.start().await {
        panic!(
            "chaos: cannot start PostgreSQL again ({}): {error}",
            pg.what
        );
    }
    guard.0 = None;
    let up_at = Instant::now();
    println!(
        "chaos: PostgreSQL ({}) stopped (immediate) for {:.1}s, up after {:.1}s",
        pg.what,
        stopped_for.as_secs_f64(),
        stop_at.elapsed().as_secs_f64()
    );

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let key = "chaos-probe-0".to_owned();
    let body = json!({
        "amount_minor": 100,
        "currency": "USD",
        "customer": "c0",
        "payment_method": "pm_card_ok",
        "metadata": {"chaos_key": key},
    });
    record
        .lock()
        .unwrap()
        .bodies
        .insert(key.clone(), body.clone());
    let mut recovered_in = None;
    while up_at.elapsed() < recovery_bound {
        let sent = http
            .post(format!("{base}/v1/payments"))
            .bearer_auth(API_KEY)
            .header("idempotency-key", &key)
            .json(&body)
            .send()
            .await;
        if let Ok(response) = sent {
            let status = response.status().as_u16();
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            if (200..300).contains(&status) {
                if let Some(id) = answer["id"].as_str() {
                    record
                        .lock()
                        .unwrap()
                        .ids
                        .entry(key.clone())
                        .or_default()
                        .insert(id.to_owned());
                }
                recovered_in = Some(up_at.elapsed());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    OutageReport {
        window: Some((stop_at, up_at)),
        down: stopped_for,
        recovered_in,
    }
}

/// The answers clients saw while PostgreSQL was down (any request in flight during the window),
/// by status, and the ones no client may get then: anything but 202, 409, 503, no answer at all,
/// a 2xx or the provider's refusal (which the final checks prove lasting). A 500 is counted
/// apart.
pub fn outage_verdict(
    observations: &[Observation],
    window: (Instant, Instant),
) -> (BTreeMap<u16, u64>, Vec<String>) {
    let (from, to) = window;
    let mut counts: BTreeMap<u16, u64> = BTreeMap::new();
    let mut wrong = Vec::new();
    for seen in observations {
        if seen.answered < from || seen.sent > to {
            continue;
        }
        *counts.entry(seen.status).or_default() += 1;
        // The provider's refusal of a capture or refund is its answer, outage or not.
        let refused = seen.status == 422 && seen.code.ends_with("_refused");
        let fine = matches!(seen.status, 0 | 202 | 409 | 503)
            || (200..300).contains(&seen.status)
            || refused;
        if !fine && seen.status != 500 {
            wrong.push(format!(
                "during the outage {} answered {} {}",
                seen.what, seen.status, seen.code
            ));
        }
    }
    (counts, wrong)
}

/// The longest a request in the outage `window` waited for its answer, in seconds (0 without an
/// outage).
pub fn longest_wait(observations: &[Observation], window: Option<(Instant, Instant)>) -> f64 {
    window.map_or(0.0, |(from, to)| {
        observations
            .iter()
            .filter(|seen| seen.answered >= from && seen.sent <= to)
            .map(|seen| (seen.answered - seen.sent).as_secs_f64())
            .fold(0.0, f64::max)
    })
}
