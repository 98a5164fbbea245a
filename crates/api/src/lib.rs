//! The HTTP face of asiento: axum routes, bearer-key auth, problem+json errors.
//!
//! `router(state)` builds the whole application, so that tests drive it in process and `serve`
//! mounts exactly the same thing. Handlers parse their input into domain types at the edge and
//! call the use cases of `asiento_app`; no handler talks SQL.

pub mod accounts;
pub mod auth;
pub mod balance_monitors;
pub mod body;
pub mod commands;
mod csv;
pub mod events;
pub mod exceptions;
pub mod http_metrics;
pub mod journal;
pub mod ledger;
pub mod metrics_catalog;
pub mod metrics_cell;
pub mod openapi;
mod payment_export;
pub mod problem;
pub mod queries;
pub mod rate_limit;
pub mod reads;
pub mod render;
pub mod statement;
pub mod transfer_list;
pub mod webhook_endpoints;
pub mod webhooks;

use asiento_app::ledger::LedgerFlow;
use asiento_app::payments::PaymentFlow;
use asiento_eventstore::Database;
use axum::{
    extract::{DefaultBodyLimit, State},
    http::{HeaderMap, HeaderName, Request, StatusCode},
    response::IntoResponse,
    routing::{get, post},
    Json, Router,
};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use uuid::Uuid;

use crate::problem::Problem;

/// The request id header: set on every request that lacks one, echoed on every response, carried
/// into the events a request writes as their correlation id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The request id of a request, if it is a uuid (ours always are).
pub fn request_id(headers: &HeaderMap) -> Option<Uuid> {
    headers
        .get(REQUEST_ID_HEADER)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| Uuid::parse_str(text).ok())
}

/// Request bodies larger than this are refused with 413 before they are read into memory.
pub const REQUEST_BODY_BYTES_MAX: usize = 64 * 1024;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The primary: every write, and the reads that must see the newest state.
    pub database: Database,
    /// Where the query routes read: a standby when one is configured and has what they need.
    pub reads: std::sync::Arc<reads::Reads>,
    pub payments: PaymentFlow,
    pub ledger: LedgerFlow,
    pub webhooks: asiento_app::webhooks::WebhookReceiver,
    /// API keys found recently (`auth`).
    pub key_cache: std::sync::Arc<asiento_app::api_keys::KeyCache>,
    /// The largest amount one request may carry (`serve --amount-max`).
    pub amount_limit: asiento_domain::AmountLimit,
    /// Which webhook endpoint URLs may be registered (`serve --webhook-allow-hosts`).
    pub webhook_urls: std::sync::Arc<asiento_outbound::url_policy::UrlPolicy>,
    /// The buckets of `/v1` requests and console sign-ins (`serve --rate-limit`).
    pub rate_limits: std::sync::Arc<rate_limit::RateLimits>,
}

impl webhooks::HasWebhooks for AppState {
    fn webhooks(&self) -> &asiento_app::webhooks::WebhookReceiver {
        &self.webhooks
    }
}

impl auth::HasDatabase for AppState {
    fn database(&self) -> &Database {
        &self.database
    }

    fn key_cache(&self) -> &asiento_app::api_keys::KeyCache {
        &self.key_cache
    }
}

/// The whole HTTP application of an API process: the `/v1` routes and the operational ones.
pub fn router(state: AppState) -> Router {
    let database = state.database.clone();
    let v1 = Router::new()
        .route(
            "/v1/payments",
            post(commands::create_payment).get(queries::list_payments),
        )
        .route("/v1/payments/{id}", get(queries::get_payment))
        .route("/v1/payments/{id}/events", get(queries::payment_events))
        .route("/v1/payments/{id}/capture", post(commands::capture_payment))
        .route("/v1/payments/{id}/cancel", post(commands::cancel_payment))
        .route("/v1/payments/{id}/refunds", post(commands::refund_payment))
        .route(
            "/v1/transfers",
            post(commands::create_transfer).get(transfer_list::list),
        )
        .route("/v1/transfers/batch", post(commands::create_transfer_batch))
        .route("/v1/transfers/{id}", get(queries::get_transfer))
        .route("/v1/transfers/{id}/post", post(commands::post_hold))
        .route("/v1/transfers/{id}/void", post(commands::void_hold))
        .route("/v1/accounts", post(accounts::declare).get(accounts::list))
        .route("/v1/accounts/{account}/balance", get(ledger::balance))
        .route("/v1/accounts/{account}/entries", get(ledger::entries))
        .route(
            "/v1/accounts/{account}/statement",
            get(statement::statement),
        )
        .route("/v1/journal", get(journal::list))
        .route("/v1/journal/{entry_id}", get(ledger::journal_entry))
        .route(
            "/v1/balance_monitors",
            post(balance_monitors::create).get(balance_monitors::list),
        )
        .route(
            "/v1/balance_monitors/{id}",
            get(balance_monitors::get).delete(balance_monitors::delete),
        )
        .route(
            "/v1/webhook_endpoints",
            post(webhook_endpoints::create).get(webhook_endpoints::list),
        )
        .route(
            "/v1/webhook_endpoints/{id}",
            get(webhook_endpoints::get).delete(webhook_endpoints::delete),
        )
        .route(
            "/v1/webhook_endpoints/{id}/rotate_secret",
            post(webhook_endpoints::rotate_secret),
        )
        .route(
            "/v1/webhook_endpoints/{id}/enable",
            post(webhook_endpoints::enable),
        )
        .route(
            "/v1/webhook_endpoints/{id}/deliveries",
            get(webhook_endpoints::list_deliveries),
        )
        .route(
            "/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry",
            post(webhook_endpoints::retry_delivery),
        )
        .route("/v1/events", get(events::list))
        .route("/v1/events/{id}", get(events::get))
        .route("/v1/reconciliation/exceptions", get(exceptions::list))
        .route(
            "/v1/reconciliation/exceptions/{id}/resolve",
            post(exceptions::resolve),
        )
        // Every route above is rate limited; none below is.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            rate_limit::enforce,
        ))
        // Authenticated by the provider's signature, not by an API key.
        .route("/webhooks/{provider}", post(webhooks::receive::<AppState>))
        // With this deployment's providers and amount limit.
        .route("/openapi.json", get(openapi::deployment_document))
        .with_state(state);
    with_layers(v1.merge(ops_routes(database)))
}

/// What every process answers, whatever its role: `/healthz`, `/readyz`, `/metrics`, and
/// `/openapi.json` (with the defaults: such a process knows no providers).
pub fn ops_router(database: Database) -> Router {
    with_layers(ops_routes(database).route("/openapi.json", get(openapi::document)))
}

fn ops_routes(database: Database) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(database)
}

/// Problem+json for unknown routes and methods, body limits, request ids and tracing spans.
fn with_layers(router: Router) -> Router {
    let request_id = HeaderName::from_static(REQUEST_ID_HEADER);
    router
        .route_layer(axum::middleware::from_fn(http_metrics::measure))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::map_response(problem::ensure_problem))
        .layer(DefaultBodyLimit::max(REQUEST_BODY_BYTES_MAX))
        .layer(axum::middleware::from_fn(refuse_declared_oversize))
        .layer(
            TraceLayer::new_for_http().make_span_with(|request: &Request<_>| {
                let id = request
                    .headers()
                    .get(REQUEST_ID_HEADER)
                    .and_then(|value| value.to_str().ok())
                    .unwrap_or_default();
                tracing::info_span!("request", method = %request.method(), path = %request.uri().path(), request_id = %id)
            }),
        )
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
}

/// The Prometheus text of every metric recorded in this process.
async fn metrics() -> impl IntoResponse {
    let body = metrics_handle()
        .map(|handle| handle.render())
        .unwrap_or_default();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        body,
    )
}

/// How often the recorder folds the histogram samples recorded since into their buckets. The
/// exporter does it on its own only when it also serves the scrape endpoint; this process serves
/// `/metrics` itself, and without this every sample would be kept until the next scrape: memory
/// growing with every request served while nobody scrapes.
pub const METRICS_UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// The thread that does it.
pub const METRICS_UPKEEP_THREAD: &str = "metrics-upkeep";

static METRICS: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    std::sync::OnceLock::new();

/// Installs the process-wide Prometheus recorder once; later calls return the same handle. `None`
/// when another recorder was installed first (then `/metrics` answers empty).
pub fn metrics_handle() -> Option<&'static metrics_exporter_prometheus::PrometheusHandle> {
    METRICS
        .get_or_init(|| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new()
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Suffix("_seconds".to_owned()),
                    &metrics_catalog::SECONDS_BUCKETS,
                )
                .map_err(|error| tracing::warn!(%error, "metrics recorder not built"))
                .ok()?
                .build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(metrics_cell::CellLabelled(recorder))
                .map_err(|error| tracing::warn!(%error, "metrics recorder not installed"))
                .ok()?;
            metrics_catalog::describe();
            let upkeep = handle.clone();
            let started = std::thread::Builder::new()
                .name(METRICS_UPKEEP_THREAD.to_owned())
                .spawn(move || loop {
                    std::thread::sleep(METRICS_UPKEEP_INTERVAL);
                    upkeep.run_upkeep();
                });
            if let Err(error) = started {
                tracing::warn!(%error, "metrics upkeep not started: histograms drain at each scrape only");
            }
            Some(handle)
        })
        .as_ref()
}

async fn healthz() -> impl IntoResponse {
    Json(serde_json::json!({"status": "ok"}))
}

/// Ready means: the database answers and every migration this binary embeds is applied.
async fn readyz(State(database): State<Database>) -> impl IntoResponse {
    let ready = match database.ping().await {
        Ok(()) => match database.migrations_pending().await {
            Ok(false) => Ok(()),
            Ok(true) => Err("migrations pending"),
            Err(_) => Err("cannot read the migration state"),
        },
        Err(_) => Err("database unreachable"),
    };
    match ready {
        Ok(()) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Err(reason) => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", reason).into_response()
        }
    }
}

/// Refuses a body whose declared length is over the limit before reading any of it, so that a
/// client cannot hold a connection by announcing megabytes; bodies without a declared length are
/// still cut off at the limit while they are read.
async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse::<u64>().ok());
    match declared {
        Some(length) if length > REQUEST_BODY_BYTES_MAX as u64 => Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the request body is larger than {REQUEST_BODY_BYTES_MAX} bytes"),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

async fn not_found(method: axum::http::Method) -> Problem {
    http_metrics::unmatched(&method, StatusCode::NOT_FOUND.as_u16());
    Problem::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed(method: axum::http::Method) -> Problem {
    http_metrics::unmatched(&method, StatusCode::METHOD_NOT_ALLOWED.as_u16());
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not accept that method",
    )
}
