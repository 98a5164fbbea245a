//! `asiento bench e2e`, tiny, on both backends: the real binary starts itself
//! as the server, drives it, measures both floors and prints its line.

use std::process::Command;

fn bench_e2e(database_url: Option<&str>, expected_prefix: &str) {
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
    let line = stdout
        .lines()
        .find(|l| l.starts_with(expected_prefix))
        .unwrap_or_else(|| panic!("no {expected_prefix} line in:\n{stdout}\n{stderr}"));
    for field in ["asiento=", "limit=", "ratio="] {
        assert!(line.contains(field), "{line}");
    }
    assert!(stderr.contains("accepted=30 refunds=6"), "{stderr}");
}

#[test]
fn bench_e2e_runs_small_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("e2e.db").display());
    bench_e2e(Some(&url), "E2E-sqlite asiento=");
}

#[test]
fn bench_e2e_runs_small_on_postgres() {
    bench_e2e(None, "E2E-postgres asiento=");
}
