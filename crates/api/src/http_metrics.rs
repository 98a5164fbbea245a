//! Request rate and latency by route, method and status, for alerts on error rates and slow
//! routes: `asiento_http_requests_total` and `asiento_http_request_duration_seconds`.
//!
//! The route is the matched template (`/v1/payments/{id}`), never the path a client sent, so the
//! number of series stays bounded whatever clients send; requests that match no route count as
//! `unmatched`.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;

/// The route label of requests that match no route.
pub const UNMATCHED: &str = "unmatched";

fn record(route: String, method: &axum::http::Method, status: u16, started: Instant) {
    let method = method.as_str().to_owned();
    let status = status.to_string();
    metrics::counter!(
        "asiento_http_requests_total",
        "route" => route.clone(),
        "method" => method.clone(),
        "status" => status.clone(),
    )
    .increment(1);
    metrics::histogram!(
        "asiento_http_request_duration_seconds",
        "route" => route,
        "method" => method,
        "status" => status,
    )
    .record(started.elapsed().as_secs_f64());
}

/// The route layer: every request a route matched.
pub async fn measure(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| UNMATCHED.to_owned(), |path| path.as_str().to_owned());
    let method = request.method().clone();
    let response = next.run(request).await;
    record(route, &method, response.status().as_u16(), started);
    response
}

/// The fallbacks' share: a request no route matched (or matched with another method).
pub fn unmatched(method: &axum::http::Method, status: u16) {
    record(UNMATCHED.to_owned(), method, status, Instant::now());
}
