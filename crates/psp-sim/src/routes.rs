//! The simulator's HTTP surface. Provider routes go through
//! [`provider_call`], which refuses service while unreachable, draws the
//! call's fault, answers 409 for a key still in use, applies latency,
//! slowness and hangs, and starts the timers of later changes; control and
//! truth routes never fail on purpose.
//!
//! Bodies are parsed by hand rather than with axum's `Json` extractor, so
//! that every malformed request is a Stripe-like 400 with a code (axum would
//! answer 415/422 with plain text).

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::header::{CONTENT_TYPE, HOST};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::{DateTime, Utc};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;

use super::faults::{CallFault, FaultsPatch};
use super::state::{
    check_idempotency_key, AnswerDelay, CancelRequest, CaptureRequest, CreateChargeRequest,
    RefundRequest, Reply, SimError, SimState,
};
use super::{Dialect, Simulator};
use asiento_psp::client::IDEMPOTENCY_KEY_HEADER;
use asiento_psp::provider::SettlementReport;

/// Marks an answer replayed from an idempotency record.
pub const REPLAYED_HEADER: &str = "Idempotent-Replayed";

fn provider_routes() -> Router<Simulator> {
    Router::new()
        .route("/v1/charges", post(create_charge).get(find_charge_by_key))
        .route("/v1/charges/{id}", get(get_charge))
        .route("/v1/charges/{id}/capture", post(capture))
        .route("/v1/charges/{id}/cancel", post(cancel))
        .route("/v1/refunds", post(refund))
        .route("/v1/operations", get(find_operation_by_key))
        .route("/v1/operations/{id}", get(get_operation))
        .route("/v1/settlement_report", get(settlement_report))
}

/// Paths relative to `/sim`.
fn control_routes() -> Router<Simulator> {
    Router::new()
        .route(
            "/faults",
            get(get_faults).post(post_faults).delete(reset_faults),
        )
        .route("/charges", get(list_charges))
        .route("/events", get(list_events))
        .route("/charges/{id}/authenticate", get(authenticate))
        .route("/charges/{id}/complete", post(complete))
        .route("/charges/{id}/refund_out_of_band", post(refund_out_of_band))
        .route("/charges/{id}/dispute", post(open_dispute))
        .route("/charges/{id}/dispute/close", post(close_dispute))
        .route(
            "/charges/{id}/dispute/second_chargeback",
            post(second_chargeback),
        )
        .route("/charges/{id}/amount", post(set_amount))
        .route("/operations", get(list_operations))
        .route("/operations/{id}/fail", post(fail_operation))
}

pub(super) fn standalone(sim: Simulator) -> Router {
    let (provider, control) = match sim.config().dialect {
        Dialect::Sim => (provider_routes(), control_routes()),
        Dialect::Stripe => (
            super::stripe::routes(),
            control_routes().merge(super::stripe::control_routes()),
        ),
        Dialect::Adyen => (
            super::adyen::routes(),
            control_routes().merge(super::adyen::control_routes()),
        ),
    };
    provider.nest("/sim", control).with_state(sim)
}

pub(super) fn mounted(sim: Simulator) -> Router {
    Router::new()
        .nest("/sim", provider_routes().merge(control_routes()))
        .with_state(sim)
}

impl IntoResponse for SimError {
    fn into_response(self) -> Response {
        let body = match self.code() {
            Some(code) => {
                json!({"error": {"type": self.kind(), "code": code, "message": self.to_string()}})
            }
            None => json!({"error": {"type": self.kind(), "message": self.to_string()}}),
        };
        (self.status(), axum::Json(body)).into_response()
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
            self.body,
        )
            .into_response();
        if self.replayed {
            response
                .headers_mut()
                .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
        }
        response
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, SimError> {
    serde_json::from_slice(body).map_err(|e| SimError::InvalidRequest(e.to_string()))
}

/// Like [`parse`], an empty body meaning `T::default()`.
fn parse_or_default<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, SimError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        Ok(T::default())
    } else {
        parse(body)
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, SimError> {
    let value = match headers.get(IDEMPOTENCY_KEY_HEADER) {
        Some(v) => Some(v.to_str().map_err(|_| SimError::IdempotencyKeyInvalid)?),
        None => None,
    };
    check_idempotency_key(value).map(str::to_string)
}

/// Marks a key in use while its request's answer is held back; dropped when
/// the answer leaves or the connection is abandoned.
struct InFlight {
    sim: Simulator,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.sim.state().leave(&self.key);
    }
}

/// Runs `op` under the state lock after drawing the call's fault, then
/// holds the answer as the fault, the payment method and `latency_ms` say.
/// `key` is the write's idempotency key (`None` for reads, or when the
/// header is unusable and `op` will refuse it).
pub(super) async fn provider_call<E: From<SimError> + IntoResponse>(
    sim: &Simulator,
    key: Option<String>,
    op: impl FnOnce(&mut SimState) -> Result<Reply, E>,
) -> Response {
    let (fault, latency_ms, result, in_flight, scheduled) = {
        let mut state = sim.state();
        // Refused before anything is drawn: the request never reached.
        if state.unreachable(std::time::Instant::now()) {
            return E::from(SimError::Unreachable).into_response();
        }
        let fault = state.draw_fault();
        let latency_ms = state.faults.latency_ms;
        let in_use =
            state.conflicts_while_in_flight() && key.as_deref().is_some_and(|k| state.in_use(k));
        if in_use && fault != CallFault::ErrorBefore {
            // Answered at once, as a provider's idempotency layer does,
            // without the latency of the request it stands behind.
            return E::from(SimError::IdempotencyKeyInUse).into_response();
        }
        let result = match fault {
            CallFault::ErrorBefore => None,
            _ => Some(op(&mut state)),
        };
        let held = fault == CallFault::Hang
            || latency_ms > 0
            || matches!(&result, Some(Ok(reply)) if reply.delay != AnswerDelay::None);
        let in_flight = match key {
            Some(key) if held => {
                state.enter(&key);
                Some(InFlight {
                    sim: sim.clone(),
                    key,
                })
            }
            _ => None,
        };
        (fault, latency_ms, result, in_flight, state.take_scheduled())
    };
    sim.spawn_scheduled(scheduled);
    let config = sim.config();
    let response = match (fault, result) {
        (CallFault::ErrorBefore | CallFault::ErrorAfter, _) | (_, None) => {
            E::from(SimError::Simulated).into_response()
        }
        (_, Some(Ok(reply))) => {
            match reply.delay {
                AnswerDelay::None => {}
                AnswerDelay::Slow => sim.hold(config.slow_ms).await,
                AnswerDelay::Hang => sim.hold(config.hang_ms).await,
            }
            reply.into_response()
        }
        (_, Some(Err(error))) => error.into_response(),
    };
    if fault == CallFault::Hang {
        sim.hold(config.hang_ms).await;
    }
    if latency_ms > 0 {
        sim.hold(latency_ms).await;
    }
    drop(in_flight);
    response
}

/// The key of a write, if its header is usable; an unusable one is refused
/// by the route itself, after the fault draw.
fn key_of(headers: &HeaderMap) -> Option<String> {
    idempotency_key(headers).ok()
}

pub(super) fn redirect_base(sim: &Simulator, headers: &HeaderMap) -> String {
    if let Some(url) = &sim.config().public_url {
        return url.clone();
    }
    let host = headers
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}")
}

async fn create_charge(State(sim): State<Simulator>, headers: HeaderMap, body: Bytes) -> Response {
    let redirect = redirect_base(&sim, &headers);
    provider_call(&sim, key_of(&headers), |state| {
        let key = idempotency_key(&headers)?;
        let req: CreateChargeRequest = parse(&body)?;
        state.create_charge(&key, &req, Utc::now(), &redirect)
    })
    .await
}

#[derive(Deserialize)]
struct KeyQuery {
    idempotency_key: Option<String>,
}

fn required_key(query: &KeyQuery) -> Result<&str, SimError> {
    query
        .idempotency_key
        .as_deref()
        .ok_or_else(|| SimError::InvalidRequest("idempotency_key is required".to_string()))
}

async fn find_charge_by_key(State(sim): State<Simulator>, query: Query<KeyQuery>) -> Response {
    provider_call(&sim, None, |state| state.find_by_key(required_key(&query)?)).await
}

async fn get_charge(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    provider_call(&sim, None, |state| state.get_charge(&id)).await
}

async fn find_operation_by_key(State(sim): State<Simulator>, query: Query<KeyQuery>) -> Response {
    provider_call(&sim, None, |state| {
        state.find_operation_by_key(required_key(&query)?)
    })
    .await
}

async fn get_operation(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    provider_call(&sim, None, |state| state.get_operation(&id)).await
}

async fn capture(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    provider_call(&sim, key_of(&headers), |state| {
        let key = idempotency_key(&headers)?;
        let req: CaptureRequest = parse_or_default(&body)?;
        state.capture(&key, &id, &req, Utc::now())
    })
    .await
}

async fn cancel(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    provider_call(&sim, key_of(&headers), |state| {
        let key = idempotency_key(&headers)?;
        let _: CancelRequest = parse_or_default(&body)?;
        state.cancel(&key, &id, Utc::now())
    })
    .await
}

async fn refund(State(sim): State<Simulator>, headers: HeaderMap, body: Bytes) -> Response {
    provider_call(&sim, key_of(&headers), |state| {
        let key = idempotency_key(&headers)?;
        let req: RefundRequest = parse(&body)?;
        state.refund(&key, &req, Utc::now())
    })
    .await
}

#[derive(Deserialize)]
struct WindowQuery {
    from: Option<String>,
    to: Option<String>,
    /// The most lines a settlement report tells (its window then ends earlier).
    limit: Option<usize>,
}

fn parse_time(name: &str, value: Option<&str>) -> Result<DateTime<Utc>, SimError> {
    let value = value.ok_or_else(|| SimError::InvalidRequest(format!("{name} is required")))?;
    DateTime::parse_from_rfc3339(value)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| SimError::InvalidRequest(format!("{name} is not RFC 3339: {e}")))
}

async fn settlement_report(State(sim): State<Simulator>, query: Query<WindowQuery>) -> Response {
    provider_call(&sim, None, |state| -> Result<Reply, SimError> {
        let from = parse_time("from", query.from.as_deref())?;
        let to = parse_time("to", query.to.as_deref())?;
        if query.limit == Some(0) {
            return Err(SimError::InvalidRequest("limit must be at least 1".into()));
        }
        state.record_report_window(from, to);
        let (data, to) = state.report_at_most(from, to, query.limit)?;
        let report = SettlementReport { from, to, data };
        Ok(Reply {
            status: StatusCode::OK,
            body: Bytes::from(serde_json::to_vec(&report).map_err(|e| {
                SimError::InvalidRequest(format!("report does not serialize: {e}"))
            })?),
            replayed: false,
            delay: AnswerDelay::None,
        })
    })
    .await
}

// --- control and truth ---

fn with_body<T: DeserializeOwned>(body: &[u8], f: impl FnOnce(T) -> Response) -> Response {
    match parse(body) {
        Ok(value) => f(value),
        Err(error) => error.into_response(),
    }
}

async fn get_faults(State(sim): State<Simulator>) -> Response {
    axum::Json(sim.faults()).into_response()
}

async fn post_faults(State(sim): State<Simulator>, body: Bytes) -> Response {
    let patch: FaultsPatch = match parse_or_default(&body) {
        Ok(patch) => patch,
        Err(error) => return error.into_response(),
    };
    match sim.set_faults(&patch) {
        Ok(faults) => axum::Json(faults).into_response(),
        Err(error) => SimError::InvalidRequest(error.to_string()).into_response(),
    }
}

async fn reset_faults(State(sim): State<Simulator>) -> Response {
    axum::Json(sim.reset_faults()).into_response()
}

async fn list_operations(State(sim): State<Simulator>) -> Response {
    axum::Json(json!({"data": sim.state().operations()})).into_response()
}

async fn fail_operation(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    into_response(sim.state().fail_operation(&id, Utc::now()))
}

async fn list_charges(State(sim): State<Simulator>) -> Response {
    axum::Json(json!({"data": sim.charges()})).into_response()
}

async fn list_events(State(sim): State<Simulator>) -> Response {
    axum::Json(json!({"data": sim.events()})).into_response()
}

async fn authenticate(Path(id): Path<String>) -> Response {
    // What a customer's browser would land on. A person (or a test) then
    // decides the result through the control route.
    let text = format!(
        "Simulated authentication for charge {id}.\n\
         Finish it with: POST /sim/charges/{id}/complete {{\"result\": \"succeeded\"|\"failed\"}}\n"
    );
    (StatusCode::OK, text).into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteBody {
    result: CompleteResult,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum CompleteResult {
    Succeeded,
    Failed,
}

async fn complete(State(sim): State<Simulator>, Path(id): Path<String>, body: Bytes) -> Response {
    let sim = &sim;
    with_body(&body, |b: CompleteBody| {
        let succeeded = matches!(b.result, CompleteResult::Succeeded);
        let (result, scheduled) = {
            let mut state = sim.state();
            let result = state.complete(&id, succeeded, Utc::now());
            (result, state.take_scheduled())
        };
        sim.spawn_scheduled(scheduled);
        into_response(result)
    })
}

fn into_response<T: serde::Serialize>(result: Result<T, SimError>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AmountBody {
    amount_minor: i64,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DisputeBody {
    #[serde(default)]
    amount_minor: Option<i64>,
}

async fn refund_out_of_band(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    with_body(&body, |b: AmountBody| {
        into_response(
            sim.state()
                .refund_out_of_band(&id, b.amount_minor, Utc::now()),
        )
    })
}

async fn open_dispute(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match parse_or_default::<DisputeBody>(&body) {
        Ok(b) => into_response(sim.state().open_dispute(&id, b.amount_minor, Utc::now())),
        Err(error) => error.into_response(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CloseBody {
    outcome: CloseOutcome,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum CloseOutcome {
    Won,
    Lost,
}

async fn close_dispute(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    with_body(&body, |b: CloseBody| {
        let won = matches!(b.outcome, CloseOutcome::Won);
        into_response(sim.state().close_dispute(&id, won, Utc::now()))
    })
}

/// A won dispute lost after all: the disputed money is withdrawn again.
async fn second_chargeback(State(sim): State<Simulator>, Path(id): Path<String>) -> Response {
    into_response(sim.state().second_chargeback(&id, Utc::now()))
}

async fn set_amount(State(sim): State<Simulator>, Path(id): Path<String>, body: Bytes) -> Response {
    with_body(&body, |b: AmountBody| {
        into_response(sim.state().set_amount(&id, b.amount_minor, Utc::now()))
    })
}
