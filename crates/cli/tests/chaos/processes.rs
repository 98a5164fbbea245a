//! The processes the campaign runs: `asiento serve` on a fixed port, SIGKILLed and started again
//! on the same database and port (a client must find it where it was), the external
//! `asiento psp-sim` it pays through (a separate process, so that the provider outlives every
//! kill), and bounded runs of the binary (a manual `asiento reconcile` may wait on a lease held
//! elsewhere, and must not hang the run).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::{url_after, Process, BIN};
use crate::knobs;
use crate::settings::{
    ADYEN_HMAC_KEY, ADYEN_MODIFICATION_DELAY_MS, ADYEN_REPORT_PASSWORD, ADYEN_REPORT_USER,
    ADYEN_WEBHOOK_PASSWORD, ADYEN_WEBHOOK_USER, API_KEY, PROVIDER_ENV, SECRET,
};

/// `asiento serve` on a fixed port, against the external simulator.
pub struct ChaosServer {
    child: Child,
    args: Vec<String>,
}

impl ChaosServer {
    /// Spawns the server and waits for it to listen; `None` if it exits first (the port can take
    /// a moment to be free again after a SIGKILL).
    fn spawn(args: &[String]) -> Option<Child> {
        let mut child = Command::new(BIN)
            .args(args)
            .env("ASIENTO_LOG", knobs::server_log())
            .envs(PROVIDER_ENV.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn asiento serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut listening = false;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if !listening && line.contains("asiento listening on ") {
                    listening = true;
                    let _ = tx.send(());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(()) => Some(child),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                None
            }
        }
    }

    fn spawn_retrying(args: &[String]) -> Child {
        for _ in 0..50 {
            if let Some(child) = Self::spawn(args) {
                return child;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!("the server does not start: {args:?}");
    }

    pub fn start(
        database_url: &str,
        port: u16,
        provider: &[String; 2],
        pending_timeout: &str,
        report_settle: &str,
        operation_pending_deadline: &str,
    ) -> Self {
        let args: Vec<String> = [
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            database_url,
            "--api-keys",
            &format!("acme:{API_KEY}"),
            &provider[0],
            &provider[1],
            "--webhook-secret",
            SECRET,
            "--psp-timeout",
            "500ms",
            "--idempotency-lease",
            "2s",
            "--payment-lease",
            "3s",
            "--pending-timeout",
            pending_timeout,
            "--reconcile-interval",
            "1s",
            "--operation-timeout",
            "1s",
            "--report-settle",
            report_settle,
            "--operation-pending-deadline",
            operation_pending_deadline,
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect();
        let child = Self::spawn_retrying(&args);
        Self { child, args }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGKILL, then the same command again (same database, same port).
    pub fn crash_and_restart(&mut self) {
        self.kill();
        self.child = Self::spawn_retrying(&self.args);
    }
}

impl Drop for ChaosServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Starts `asiento psp-sim` in `dialect`, seeded with the run's seed, sending its webhooks to
/// the server at `base`; the simulator's process and its URL once it listens.
pub fn spawn_simulator(dialect: &str, seed: u64, base: &str) -> (Process, String) {
    let seed = seed.to_string();
    let webhook_url = format!("{base}/webhooks/sim");
    let mut sim_args = vec![
        "psp-sim",
        "--dialect",
        dialect,
        "--listen",
        "127.0.0.1:0",
        "--seed",
        &seed,
        "--webhook-url",
        &webhook_url,
        "--webhook-secret",
        SECRET,
        "--slow-ms",
        "300",
        "--hang-ms",
        "1500",
    ];
    if dialect == "adyen" {
        sim_args.extend([
            "--webhook-hmac-key",
            ADYEN_HMAC_KEY,
            "--webhook-username",
            ADYEN_WEBHOOK_USER,
            "--webhook-password",
            ADYEN_WEBHOOK_PASSWORD,
            "--report-username",
            ADYEN_REPORT_USER,
            "--report-password",
            ADYEN_REPORT_PASSWORD,
            "--modification-delay-ms",
            ADYEN_MODIFICATION_DELAY_MS,
        ]);
    }
    let mut simulator = Process::spawn(&sim_args, &[]);
    let sim = url_after(
        &simulator.wait_for_line("psp-sim listening on "),
        "listening on ",
    );
    (simulator, sim)
}

/// Runs the binary, killing it after `limit`.
pub fn asiento_bounded(args: &[String], limit: Duration) -> (bool, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .env("ASIENTO_LOG", "warn")
        .envs(PROVIDER_ENV.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + limit;
    let timed_out = loop {
        if child.try_wait().unwrap().is_some() {
            break false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break true;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        if timed_out { " (timed out)" } else { "" }
    );
    (output.status.success() && !timed_out, text)
}
