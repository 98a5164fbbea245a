//! `/metrics` as an on-call engineer reads it, from the real binary: request rate and latency
//! histograms by route template and status, provider calls by provider, operation and outcome
//! with their latency, the gauges of what is open now, a `# HELP` for every metric, and logs
//! without colour codes when they go to a pipe.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{payment_body, Backend, Client, Server, TestDatabase};

/// The value of the sample named exactly `series` (name and labels as Prometheus prints them).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn metrics_text(client: &Client) -> String {
    client
        .http
        .get(format!("{}/metrics", client.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn metrics_an_on_call_engineer_alerts_on(backend: Backend) {
    let database = TestDatabase::new(backend).await;
    let started = Instant::now();
    let server = Server::start(&database.url, &["--gauges-interval", "200ms"]);
    let client = server.client();
    let paid = client
        .post("/v1/payments", "m-1", &payment_body(2_000, "pm_card_ok"))
        .await;
    assert_eq!(paid.status, 201);
    let declined = client
        .post(
            "/v1/payments",
            "m-2",
            &payment_body(2_000, "pm_card_declined"),
        )
        .await;
    assert_eq!(
        declined.status,
        201,
        "{}",
        String::from_utf8_lossy(&declined.body)
    );
    let id = paid.json()["id"].as_str().unwrap().to_owned();
    assert_eq!(client.get(&format!("/v1/payments/{id}")).await.status, 200);
    assert_eq!(client.get("/v1/payments/pay_nope").await.status, 404);
    assert_eq!(client.get("/v1/no/such/route").await.status, 404);

    // The gauges are sampled every 200 ms: a sample taken while the second create was in flight
    // counts its key. Every key ends in flight no more once a later sample is taken.
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = metrics_text(&client).await;
        let in_flight = sample(
            &text,
            "asiento_idempotency_keys_in_flight{state=\"in_flight\"}",
        );
        if text.contains("asiento_provider_operations_pending{") && in_flight == Some(0.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no gauges, or a key stays in flight:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Requests by route template (never the id a client sent), method and status.
    let requests = |route: &str, method: &str, status: u16| {
        sample(
            &text,
            &format!(
                "asiento_http_requests_total{{route=\"{route}\",method=\"{method}\",status=\"{status}\"}}"
            ),
        )
    };
    assert_eq!(requests("/v1/payments", "POST", 201), Some(2.0), "{text}");
    assert_eq!(requests("/v1/payments/{id}", "GET", 200), Some(1.0));
    assert_eq!(requests("/v1/payments/{id}", "GET", 404), Some(1.0));
    assert_eq!(requests("unmatched", "GET", 404), Some(1.0));
    assert!(!text.contains(&id), "a payment id became a label");
    // Latency as a histogram, with buckets.
    assert!(
        text.contains("asiento_http_request_duration_seconds_bucket{route=\"/v1/payments\",method=\"POST\",status=\"201\",le=\"0.005\"}"),
        "{text}"
    );
    // Provider calls by provider, operation and outcome, with their latency.
    let calls = |outcome: &str| {
        sample(
            &text,
            &format!(
                "asiento_provider_calls_total{{provider=\"sim\",operation=\"create_charge\",outcome=\"{outcome}\"}}"
            ),
        )
    };
    assert_eq!((calls("ok"), calls("declined")), (Some(1.0), Some(1.0)));
    assert!(text.contains(
        "asiento_provider_call_duration_seconds_bucket{provider=\"sim\",operation=\"create_charge\",le=\"+Inf\"} 2"
    ), "{text}");
    // What is open now (no key in flight, as waited for above).
    assert_eq!(
        sample(&text, "asiento_idempotency_keys_in_flight{state=\"stuck\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&text, "asiento_provider_operations_pending{age=\"lt_1m\"}"),
        Some(0.0)
    );
    // The group commit writer's busy time, in seconds: every payment's steps went through it,
    // and it cannot have been busy longer than the server has run.
    let (batches, busy) = (
        sample(&text, "asiento_group_commit_write_seconds_count"),
        sample(&text, "asiento_group_commit_write_seconds_sum"),
    );
    assert!(batches.is_some_and(|batches| batches >= 2.0), "{text}");
    assert!(
        busy.is_some_and(|busy| busy > 0.0 && busy < started.elapsed().as_secs_f64()),
        "busy {busy:?}"
    );
    // Every metric says what it is.
    let families: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split(' ').next())
        .collect();
    assert!(families.len() > 10, "{families:?}");
    for family in families {
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "{family} has no # HELP"
        );
    }
}

/// Logs written to a pipe (a file, a log collector) carry no terminal colour codes.
#[test]
fn logs_to_a_pipe_have_no_colour_codes() {
    let (_dir, url) = asiento_eventstore::scratch::temp_sqlite_url();
    // `verify` on a fresh database logs at info as it migrates and checks.
    let output = std::process::Command::new(common::BIN)
        .args(["verify", "--database-url", &url])
        .env("ASIENTO_LOG", "debug")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.lines().count() > 2, "nothing logged: {log}");
    assert!(!log.contains('\u{1b}'), "colour codes in the log:\n{log}");
}

asiento_testkit::both_backends!(threads = 2; metrics_an_on_call_engineer_alerts_on);
