//! `asiento bench replay`, tiny, on both backends: the real binary seeds its log, reads it back,
//! rebuilds the balances, reads balances in the past and exports the journal through a server
//! it starts itself, and prints a line per workload; and `asiento bench projections`, whose
//! payments' streams grow round by round under every read model.

use std::process::Command;

fn bench_replay(database_url: Option<&str>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_asiento"));
    command.args([
        "bench",
        "replay",
        "--events",
        "2500",
        "--streams",
        "300",
        "--customers",
        "7",
        "--batch-size",
        "100",
        "--rounds",
        "2",
        "--rebuild-rounds",
        "2",
        "--rebuild-batch-size",
        "400",
    ]);
    command.env_remove("ASIENTO_BENCH_DATABASE_URL");
    if let Some(url) = database_url {
        command.args(["--database-url", url]);
    }
    let output = command.output().expect("running asiento bench replay");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for (prefix, fields) in [
        ("W3-read ", &["asiento=", "limit=", "ratio="][..]),
        ("W3-rebuild ", &["asiento=", "limit=", "ratio="][..]),
        ("W3-past ", &["at_us=", "now_us=", "ratio="][..]),
        (
            "W3-export ",
            &["entries=2500 ", "rows=", "rss_idle_kb=", "ratio="][..],
        ),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in:\n{stdout}\n{stderr}"));
        for field in fields {
            assert!(line.contains(field), "{line}");
        }
    }
}

#[test]
fn bench_replay_runs_small_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("replay.db").display());
    bench_replay(Some(&url));
}

#[test]
fn bench_replay_runs_small_on_postgres() {
    bench_replay(None);
}

fn bench_projections(database_url: Option<&str>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_asiento"));
    command.args(["bench", "projections", "--payments", "3", "--refunds", "8"]);
    command.env_remove("ASIENTO_BENCH_DATABASE_URL");
    if let Some(url) = database_url {
        command.args(["--database-url", url]);
    }
    let output = command.output().expect("running asiento bench projections");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("PROJ-LONG "))
        .unwrap_or_else(|| panic!("no PROJ-LONG line in:\n{stdout}\n{stderr}"));
    for field in ["first_us=", "last_us=", "ratio="] {
        assert!(line.contains(field), "{line}");
    }
    assert!(
        stderr.contains("3 payments, 8 refunds each") && stderr.contains("merchant_events "),
        "{stderr}"
    );
}

#[test]
fn bench_projections_runs_small_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("streams.db").display());
    bench_projections(Some(&url));
}

#[test]
fn bench_projections_runs_small_on_postgres() {
    bench_projections(None);
}
