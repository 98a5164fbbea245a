//! `asiento bench e2e --hot-account`, tiny, on both backends (SQLite with `--rss-after`): the
//! real binary starts itself as the server, drives it (spread, then every payment to one
//! customer), measures both floors
//! and, on PostgreSQL, the plain-SQL baseline (whose books must hold what it answered), and
//! prints its lines.

use std::process::Command;

fn bench_e2e(database_url: Option<&str>, backend: &str, extra: &[&str]) {
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
    command.args(extra);
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
    // The spread load's figure is against the baseline on PostgreSQL, the database floor on
    // SQLite; the hot load's against the spread load.
    let against = if backend == "postgres" {
        "baseline="
    } else {
        "limit="
    };
    for (prefix, against) in [
        (format!("E2E-{backend} asiento="), against),
        (format!("E2E-HOT-{backend} asiento="), "limit="),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in:\n{stdout}\n{stderr}"));
        for field in ["asiento=", against, "ratio="] {
            assert!(line.contains(field), "{line}");
        }
    }
    assert!(
        stderr.contains(&format!("E2E-{backend} clients=3 accepted=30 refunds=6")),
        "{stderr}"
    );
    if extra.contains(&"--rss-after") {
        let prefix = format!("E2E-MEMORY-{backend} rss_peak_kb_after_10=");
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} line in:\n{stdout}"));
        assert!(
            line.contains(" rss_peak_kb_after_30=") && line.contains(" ratio="),
            "{line}"
        );
    }
    if backend == "postgres" {
        assert!(
            stderr.contains("E2E-postgres baseline clients=3 accepted=30 refunds=6"),
            "{stderr}"
        );
        // 30 payments of 100.00 taken, 6 refunds of 25.00 given back, two legs each.
        let books = "baseline books: entries sum to 0, 72 legs, clearing 285000 of 285000 owed, \
                     30 payments and 6 refunds succeeded";
        assert!(stderr.contains(books), "{stderr}");
        assert!(stderr.contains("cpu_ratio="), "{stderr}");
    }
    assert!(
        stderr.contains("every payment to one customer: accepted=30 "),
        "{stderr}"
    );
}

#[test]
fn bench_e2e_runs_small_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let url = format!("sqlite://{}", dir.path().join("e2e.db").display());
    // The spread load in two parts, the server's peak read after the first.
    bench_e2e(Some(&url), "sqlite", &["--rss-after", "10"]);
}

#[test]
fn bench_e2e_runs_small_on_postgres() {
    bench_e2e(None, "postgres", &[]);
}
