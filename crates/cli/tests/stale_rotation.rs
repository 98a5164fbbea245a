//! The stale sweep cannot starve, through the real binary on both backends: with more abandoned
//! redirects than one sweep looks at (twice `STALE_PAYMENTS_PER_SWEEP_MAX`), a pending payment
//! that the provider charged is resolved within two sweeps (`asiento reconcile`, one sweep each),
//! because the watch list is visited in rotation.
#![allow(clippy::unwrap_used)]

mod common;

use common::{asiento, payment_body, Backend, Server, TestDatabase};
use futures::stream::{self, StreamExt as _};

const ABANDONED: usize = 2_000;

async fn abandoned_redirects_cannot_starve_the_sweep(backend: Backend) {
    assert_eq!(
        ABANDONED as i64,
        2 * asiento_app::reconcile::STALE_PAYMENTS_PER_SWEEP_MAX
    );
    let database = TestDatabase::new(backend).await;
    // The API alone: the sweeps below are the only ones.
    let server = Server::start(&database.url, &["--role", "api", "--psp-timeout", "300ms"]);
    let client = server.client();
    let statuses: Vec<u16> = stream::iter(0..ABANDONED)
        .map(|index| {
            let client = client.clone();
            async move {
                client
                    .post(
                        "/v1/payments",
                        &format!("abandoned-{index}"),
                        &payment_body(1_000, "pm_redirect"),
                    )
                    .await
                    .status
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|status| *status == 201), "{statuses:?}");
    // Charged at the provider, its answer lost: pending until a sweep looks it up.
    let charged = client
        .post(
            "/v1/payments",
            "charged",
            &payment_body(4_200, "pm_card_timeout"),
        )
        .await;
    assert_eq!(
        charged.status,
        202,
        "{}",
        String::from_utf8_lossy(&charged.body)
    );
    let id = charged.json()["id"].as_str().unwrap().to_owned();

    let psp = format!("{}/sim", server.base);
    let mut resolved_in = None;
    for sweep in 1..=2 {
        // The report's window ends an hour ago: only the stale sweep can find the charge.
        let (ok, output) = asiento(&[
            "reconcile",
            "--database-url",
            &database.url,
            "--psp-url",
            &psp,
            "--pending-timeout",
            "0s",
            "--settle",
            "1h",
        ]);
        assert!(ok, "reconcile failed: {output}");
        let payment = client.get(&format!("/v1/payments/{id}")).await.json();
        if payment["status"] == "captured" {
            resolved_in = Some(sweep);
            break;
        }
    }
    assert!(
        resolved_in.is_some(),
        "the charged payment is still pending after two sweeps"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_redirects_cannot_starve_the_sweep_sqlite() {
    abandoned_redirects_cannot_starve_the_sweep(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_redirects_cannot_starve_the_sweep_postgres() {
    abandoned_redirects_cannot_starve_the_sweep(Backend::Postgres).await;
}
