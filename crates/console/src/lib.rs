//! The operator console: the web pages support, finance and on-call people use to answer "what
//! happened to this payment?", resolve reconciliation exceptions and see whether the books are
//! right, served by the same binary under `/console`.
//!
//! Why it is built this way:
//! - **Server-rendered, no script.** Every page is HTML from `maud` templates (checked at compile
//!   time), styled by one stylesheet; forms and links do everything. The content security policy
//!   allows no script at all, so nothing injected into a page can run.
//! - **The same paths as the API.** Reads use the same read models and streams as `/v1`; a
//!   capture or refund goes through `PaymentFlow` under an Idempotency-Key on the API's own route,
//!   so a console refund is exactly an API refund (and a double submit is one refund).
//! - **Sessions, not keys, in the browser.** The API key is typed once into a form (never in a
//!   URL) and exchanged for a random session token in an HttpOnly, SameSite=Strict cookie; every
//!   form carries the session's CSRF token; every action is written to the audit trail with the
//!   name of whoever signed in.

mod audit;
mod error;
mod layout;
mod pages;
mod session;

use std::sync::Arc;

use asiento_api::AppState;
use asiento_projector::Projection;
use axum::http::{header, HeaderValue};
use axum::routing::{get, post};
use axum::Router;

pub use error::ConsoleError;
pub use session::{cookie, set_cookie, SESSION_COOKIE};

/// The console's largest form body: a note of a few KiB is the largest thing anyone types.
pub const FORM_BYTES_MAX: usize = 16 * 1024;

/// How long a console session lasts from sign-in.
pub const SESSION_TTL_MS_DEFAULT: i64 = 8 * 3_600_000;

/// What every console page can reach.
#[derive(Clone)]
pub struct ConsoleState {
    pub api: AppState,
    /// SHA-256 of the platform operator's key (`serve --operator-key`): signing in with it shows
    /// the exceptions that belong to no tenant.
    pub operator_key_sha256: Option<[u8; 32]>,
    /// Every projection this binary runs, for the health page.
    pub projections: Arc<Vec<Arc<dyn Projection>>>,
    pub session_ttl_ms: i64,
}

impl ConsoleState {
    pub fn new(
        api: AppState,
        operator_key: Option<&str>,
        projections: Vec<Arc<dyn Projection>>,
    ) -> Self {
        Self {
            api,
            operator_key_sha256: operator_key.map(session::sha256),
            projections: Arc::new(projections),
            session_ttl_ms: SESSION_TTL_MS_DEFAULT,
        }
    }
}

/// The console's routes, under `/console`, with their own security headers and body limit.
pub fn router(state: ConsoleState) -> Router {
    use pages::{accounts, audit as audit_page, exceptions, health, payments, sign_in};
    Router::new()
        .route("/console", get(sign_in::home))
        .route("/console/", get(sign_in::home))
        .route(
            "/console/sign-in",
            get(sign_in::show_form).post(sign_in::sign_in),
        )
        .route("/console/sign-out", post(sign_in::sign_out))
        .route("/console/payments", get(payments::list))
        .route("/console/search", get(payments::search))
        .route("/console/payments/{id}", get(payments::show))
        .route(
            "/console/payments/{id}/{command}",
            get(payments::confirm).post(payments::run),
        )
        .route("/console/exceptions", get(exceptions::list))
        .route("/console/exceptions/{id}", get(exceptions::show))
        .route(
            "/console/exceptions/{id}/resolve",
            post(exceptions::resolve),
        )
        .route("/console/accounts", get(accounts::list))
        .route("/console/accounts/{account}", get(accounts::entries))
        .route(
            "/console/accounts/{account}/statement.csv",
            get(accounts::statement_csv),
        )
        .route("/console/journal/{entry_id}", get(accounts::journal_entry))
        .route("/console/health", get(health::show))
        .route("/console/audit", get(audit_page::show))
        .route("/console/console.css", get(stylesheet))
        .route_layer(axum::middleware::from_fn(
            asiento_api::http_metrics::measure,
        ))
        .layer(axum::extract::DefaultBodyLimit::max(FORM_BYTES_MAX))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(state)
}

/// The one stylesheet, compiled into the binary.
async fn stylesheet() -> impl axum::response::IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        include_str!("../static/console.css"),
    )
}

/// A same-origin content security policy with no script at all, no framing, no caching of
/// pages that show money, and no referrer leaving the console.
async fn security_headers(mut response: axum::response::Response) -> axum::response::Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}
