//! `asiento bench e2e --hot-account`, tiny, on both backends: the real binary starts itself
//! as the server, drives it (spread, then every payment to one customer), measures both floors
//! and prints its lines.

use std::process::Command;

fn bench_e2e(database_url: Option<&str>, backend: &str) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_asiento"));
    command.args([
        "bench",
        "e2e",
        "--clients",
        "3",
        "--payments",
        "30",
        "--refund-every",
        "5",
        "--healthz-requests",
        "200",
        "--floor-transactions",
        "200",
        "--hot-account",
    ]);
    command.env_remove("ASIENTO_BENCH_DATABASE_URL");
    if let Some(url) = database_url {
        command.args(["--database-url", url]);
    }
    let output = command.output().expect("running asiento bench e2e");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for prefix in [
        format!("E2E-{backend} asiento="),
        format!("E2E-HOT-{backend} asiento="),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in:\n{stdout}\n{stderr}"));
        for field in ["asiento=", "limit=", "ratio="] {
            assert!(line.contains(field), "{line}");
        }
    }
    assert!(stderr.contains("accepted=30 refunds=6"), "{stderr}");
    assert!(
        stderr.contains("every payment to one customer: accepted=30 "),
        "{stderr}"
    );
}

#[test]
fn bench_e2e_runs_small_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("e2e.db").display());
    bench_e2e(Some(&url), "sqlite");
}

#[test]
fn bench_e2e_runs_small_on_postgres() {
    bench_e2e(None, "postgres");
}
