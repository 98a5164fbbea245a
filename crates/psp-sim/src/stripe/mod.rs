//! The simulator's Stripe dialect (`psp-sim --dialect stripe`): the same charge model, faults
//! and truth routes, answering at Stripe's paths in Stripe's wire format, so that Stripe's own
//! client library and asiento's Stripe adapter can be tested against it.
//!
//! - Requests are form-encoded and read strictly ([`params`]): an unknown parameter is a 400
//!   `parameter_unknown`, as Stripe answers it. Any `sk_test_…` key is accepted, as a Bearer
//!   token or as the Basic user.
//! - A PaymentIntent is created unconfirmed (or with `confirm=true`) and confirms into the
//!   charge model ([`book`]); Stripe's test payment methods (`pm_card_visa`,
//!   `pm_card_chargeDeclined`, `pm_card_authenticationRequired`, …) map onto the simulator's
//!   own, which are accepted too. A decline is a 402 `card_error` carrying the PaymentIntent.
//! - Every POST is idempotent as Stripe's are: the first answer (a refusal made after the
//!   request began included) is stored under the key and replayed byte for byte with
//!   `Idempotent-Replayed: true`; the same key with other parameters is a 400
//!   `idempotency_error`; a key still running is a 409 (the `key_in_use_conflict` fault).
//!   A POST without a key is not idempotent.
//! - There is no lookup by our key: only by id and by listing.
//! - Answers carry `Request-Id`, echo `Idempotency-Key`, and carry `Stripe-Version`.

mod balance;
mod book;
mod events;
mod listing;
mod params;
mod payouts;
mod render;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::http::header::AUTHORIZATION;
use axum::http::Uri;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use chrono::Utc;
use serde_json::Value;

pub(crate) use book::IntentBook;
pub(crate) use events::events;
pub(crate) use payouts::control_routes;

use self::book::{charge_id_of, intent_id_of, IntentRecord, StoredAnswer};
use self::listing::Listing;
use self::params::Params;
use self::render::{Expand, StripeError, CHARGE_EXPANSIONS, INTENT_EXPANSIONS};
use super::routes::{provider_call, redirect_base};
use super::state::{
    check_idempotency_key, AnswerDelay, CaptureRequest, CreateChargeRequest, RefundRequest, Reply,
    SimError, SimState, CHARGES_MAX, PM_CARD_DECLINED, PM_CARD_OK, PM_CARD_SLOW, PM_CARD_TIMEOUT,
    PM_REDIRECT,
};
use super::Simulator;
use asiento_psp::client::IDEMPOTENCY_KEY_HEADER;
use asiento_psp::provider::{Charge, Operation, OperationAnswer, OperationKind, OperationStatus};
use asiento_psp::stripe::API_VERSION;

/// Stripe's documented test payment methods, and what the simulator does for each.
const TEST_METHODS: &[(&str, &str)] = &[
    ("pm_card_visa", PM_CARD_OK),
    ("pm_card_visa_debit", PM_CARD_OK),
    ("pm_card_mastercard", PM_CARD_OK),
    ("pm_card_amex", PM_CARD_OK),
    ("pm_card_chargeDeclined", PM_CARD_DECLINED),
    ("pm_card_visa_chargeDeclined", PM_CARD_DECLINED),
    ("pm_card_chargeDeclinedInsufficientFunds", PM_CARD_DECLINED),
    ("pm_card_authenticationRequired", PM_REDIRECT),
    ("pm_card_threeDSecure2Required", PM_REDIRECT),
    (PM_CARD_OK, PM_CARD_OK),
    (PM_CARD_DECLINED, PM_CARD_DECLINED),
    (PM_CARD_TIMEOUT, PM_CARD_TIMEOUT),
    (PM_CARD_SLOW, PM_CARD_SLOW),
    (PM_REDIRECT, PM_REDIRECT),
];

const CAPTURE_METHODS: &[&str] = &["automatic", "automatic_async", "manual"];
const CANCELLATION_REASONS: &[&str] = &[
    "abandoned",
    "duplicate",
    "fraudulent",
    "requested_by_customer",
];
const REFUND_REASONS: &[&str] = &["duplicate", "fraudulent", "requested_by_customer"];

/// Stripe's routes; any other path is Stripe's 404 "Unrecognized request URL".
pub(super) fn routes() -> Router<Simulator> {
    Router::new()
        .route("/v1/payment_intents", post(create_intent).get(list_intents))
        .route("/v1/payment_intents/{id}", get(get_intent))
        .route("/v1/payment_intents/{id}/confirm", post(confirm_intent))
        .route("/v1/payment_intents/{id}/capture", post(capture_intent))
        .route("/v1/payment_intents/{id}/cancel", post(cancel_intent))
        .route("/v1/refunds", post(create_refund))
        .route("/v1/refunds/{id}", get(get_refund))
        .route("/v1/charges/{id}", get(get_charge))
        .route("/v1/disputes", get(list_disputes))
        .route("/v1/disputes/{id}", get(get_dispute))
        .route("/v1/events", get(events::list_events))
        .route("/v1/events/{id}", get(events::get_event))
        .route("/v1/balance_transactions", get(list_balance_transactions))
        .route(
            "/v1/balance_transactions/{id}",
            get(get_balance_transaction),
        )
        .route("/v1/payouts", get(payouts::list_payouts))
        .route("/v1/payouts/{id}", get(payouts::get_payout))
        .fallback(no_route)
}

async fn no_route(method: Method, uri: Uri) -> Response {
    StripeError::no_route(method.as_str(), uri.path()).into_response()
}

/// Any `sk_test_…` key, as `Bearer` or as the Basic user (`curl -u sk_test_…:`).
fn authorize(headers: &HeaderMap) -> Result<(), StripeError> {
    let Some(value) = headers.get(AUTHORIZATION) else {
        return Err(StripeError::unauthorized(
            "You did not provide an API key. You need to provide your API key in the \
             Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY').",
        ));
    };
    let value = value.to_str().unwrap_or_default();
    let key = if let Some(token) = value.strip_prefix("Bearer ") {
        token.trim().to_owned()
    } else if let Some(basic) = value.strip_prefix("Basic ") {
        basic_user(basic.trim()).unwrap_or_default()
    } else {
        String::new()
    };
    let valid = key.strip_prefix("sk_test_").is_some_and(|rest| {
        !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    if valid {
        Ok(())
    } else {
        Err(StripeError::unauthorized(
            "Invalid API Key provided: the simulator accepts any sk_test_ key.",
        ))
    }
}

fn basic_user(encoded: &str) -> Option<String> {
    use base64::Engine as _;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    Some(
        text.split_once(':')
            .map_or(text.clone(), |(user, _)| user.to_owned()),
    )
}

/// The request's idempotency key: the header's when it is usable, else a fresh one (a POST
/// without a key is not idempotent).
fn request_key(headers: &HeaderMap) -> Result<(String, bool), StripeError> {
    match headers.get(IDEMPOTENCY_KEY_HEADER) {
        None => Ok((
            format!("asiento_sim_{}", uuid::Uuid::new_v4().simple()),
            false,
        )),
        Some(value) => {
            let text = value
                .to_str()
                .map_err(|_| StripeError::from(SimError::IdempotencyKeyInvalid))?;
            let key = check_idempotency_key(Some(text)).map_err(StripeError::from)?;
            Ok((key.to_owned(), true))
        }
    }
}

/// Adds the headers every Stripe answer has.
fn stamp(mut response: Response, key: Option<&str>) -> Response {
    let headers = response.headers_mut();
    let request_id = format!("req_{}", &uuid::Uuid::new_v4().simple().to_string()[..14]);
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        headers.insert("Request-Id", value);
    }
    headers.insert("Stripe-Version", HeaderValue::from_static(API_VERSION));
    if let Some(value) = key.and_then(|key| HeaderValue::from_str(key).ok()) {
        headers.insert(IDEMPOTENCY_KEY_HEADER, value);
    }
    response
}

/// A read: authorized, its query read by `read` (whatever it leaves is refused), then through
/// the simulator's faults.
async fn read_call<P>(
    sim: &Simulator,
    headers: &HeaderMap,
    query: Option<String>,
    read: impl FnOnce(&mut Params) -> Result<P, StripeError>,
    op: impl FnOnce(&mut SimState, P) -> Result<Reply, StripeError>,
) -> Response {
    let checked = authorize(headers).and_then(|()| {
        let mut params = Params::parse(query.unwrap_or_default().as_bytes())?;
        let read = read(&mut params)?;
        params.finish()?;
        Ok(read)
    });
    let params = match checked {
        Ok(params) => params,
        Err(error) => return stamp(error.into_response(), None),
    };
    stamp(
        provider_call(sim, None, |state| op(state, params)).await,
        None,
    )
}

/// A read of one object that takes no parameters: `find` renders it, or says it is missing.
async fn read_object(
    sim: &Simulator,
    headers: &HeaderMap,
    query: Option<String>,
    find: impl FnOnce(&SimState) -> Result<Value, StripeError>,
) -> Response {
    read_call(
        sim,
        headers,
        query,
        |_| Ok(()),
        |state, ()| Ok(ok(&find(state)?)),
    )
    .await
}

/// A write: authorized, its parameters read by `read` (whatever it leaves is refused; a refusal
/// here is never stored), keyed, then through the simulator's faults and Stripe's idempotency
/// layer, which compares the request as Stripe does: route and parameters.
async fn write_call<P>(
    sim: &Simulator,
    headers: &HeaderMap,
    route: String,
    body: &[u8],
    read: impl FnOnce(&mut Params) -> Result<P, StripeError>,
    op: impl FnOnce(&mut SimState, &str, P) -> Result<Reply, StripeError>,
) -> Response {
    let checked = authorize(headers).and_then(|()| {
        let mut params = Params::parse(body)?;
        let read = read(&mut params)?;
        params.finish()?;
        Ok((read, request_key(headers)?))
    });
    let (params, (key, given)) = match checked {
        Ok(checked) => checked,
        Err(error) => return stamp(error.into_response(), None),
    };
    let fingerprint = format!("{route} {}", String::from_utf8_lossy(body));
    let echoed = given.then_some(key.clone());
    let response = provider_call(sim, Some(key.clone()), |state| {
        stored_write(state, &key, fingerprint, |state| op(state, &key, params))
    })
    .await;
    stamp(response, echoed.as_deref())
}

/// Replays the answer stored under `key`, refuses the key for another request, or runs `op` and
/// stores what it answered. A refusal made while the request ran is stored too, as Stripe
/// stores it; a conflict or a server error is not.
fn stored_write(
    state: &mut SimState,
    key: &str,
    fingerprint: String,
    op: impl FnOnce(&mut SimState) -> Result<Reply, StripeError>,
) -> Result<Reply, StripeError> {
    if let Some(stored) = state.stripe.answer(key) {
        if stored.fingerprint != fingerprint {
            return Err(SimError::IdempotencyKeyReused.into());
        }
        return Ok(Reply {
            status: stored.status,
            body: stored.body.clone(),
            replayed: true,
            delay: AnswerDelay::None,
        });
    }
    let reply = match op(state) {
        Ok(reply) => reply,
        Err(error)
            if error.status() == StatusCode::CONFLICT || error.status().is_server_error() =>
        {
            return Err(error)
        }
        Err(error) => Reply {
            status: error.status(),
            body: json_bytes(&error.body()),
            replayed: false,
            delay: AnswerDelay::None,
        },
    };
    state.stripe.store_answer(
        key,
        StoredAnswer {
            fingerprint,
            status: reply.status,
            body: reply.body.clone(),
        },
    );
    Ok(reply)
}

fn json_bytes(value: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("a JSON value always serializes"))
}

fn ok(value: &Value) -> Reply {
    Reply {
        status: StatusCode::OK,
        body: json_bytes(value),
        replayed: false,
        delay: AnswerDelay::None,
    }
}

/// Reads the simulator's own JSON answer back.
fn decoded<T: serde::de::DeserializeOwned>(reply: &Reply) -> T {
    serde_json::from_slice(&reply.body).expect("the simulator decodes what it encoded")
}

fn intent_record<'a>(state: &'a SimState, id: &str) -> Result<&'a IntentRecord, StripeError> {
    state
        .stripe
        .get(id)
        .ok_or_else(|| StripeError::not_found("payment_intent", id))
}

/// Every refund of a charge, oldest first: ours (the simulator's refund operations) and those
/// made outside the API.
pub(crate) fn refunds_of(state: &SimState, charge_id: &str) -> Vec<Operation> {
    let mut refunds = state.operations_of(charge_id, OperationKind::Refund);
    refunds.extend(state.stripe.dashboard_refunds_of(charge_id).cloned());
    refunds.sort_by_key(|refund| refund.created);
    refunds
}

/// The PaymentIntent as it stands.
fn render_intent(state: &SimState, record: &IntentRecord, expand: &Expand) -> Value {
    let charge_id = charge_id_of(&record.id);
    let charge = state.charge(&charge_id);
    let refunds = refunds_of(state, &charge_id);
    render::intent(record, charge, &refunds, state.fee_bps(), expand)
}

fn intent_with(state: &SimState, record: &IntentRecord, charge: &Charge, expand: &Expand) -> Value {
    let refunds = refunds_of(state, &charge.id);
    render::intent(record, Some(charge), &refunds, state.fee_bps(), expand)
}

fn expand_of(params: &mut Params, allowed: &[&str]) -> Result<Expand, StripeError> {
    Expand::new(params.list("expand")?, allowed)
}

/// A listing's expansions: each names a field of the listed objects under `data.`.
fn list_expand_of(params: &mut Params, allowed: &[&str]) -> Result<Expand, StripeError> {
    let expand: Vec<String> = params
        .list("expand")?
        .into_iter()
        .map(|path| {
            path.strip_prefix("data.")
                .map(str::to_owned)
                .ok_or_else(|| {
                    StripeError::invalid_param(
                        "expand",
                        format!("This property cannot be expanded ({path})."),
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    Expand::new(expand, allowed)
}

fn currency_of(text: &str) -> Result<String, StripeError> {
    if text.len() == 3 && text.bytes().all(|b| b.is_ascii_alphabetic()) {
        Ok(text.to_ascii_lowercase())
    } else {
        Err(StripeError::invalid_param(
            "currency",
            format!("Invalid currency: {text}. Stripe currently supports these currencies: usd, eur, gbp, …"),
        ))
    }
}

fn test_method(id: &str) -> Result<&'static str, StripeError> {
    TEST_METHODS
        .iter()
        .find(|(name, _)| *name == id)
        .map(|(_, sim)| *sim)
        .ok_or_else(|| {
            StripeError::invalid_param("payment_method", format!("No such PaymentMethod: '{id}'"))
                .with_code("resource_missing")
        })
}

/// What a confirmation asks beside the intent's own fields.
struct Confirmation {
    payment_method: Option<String>,
    return_url: Option<String>,
    expand: Expand,
}

struct NewIntent {
    record: IntentRecord,
    confirm: Option<Confirmation>,
}

fn read_new_intent(params: &mut Params) -> Result<NewIntent, StripeError> {
    let amount = params
        .integer("amount")?
        .ok_or_else(|| StripeError::missing("amount"))?;
    if amount < 1 {
        return Err(SimError::AmountMustBePositive.into());
    }
    let currency = currency_of(&params.required_text("currency")?)?;
    let payment_method = params.text("payment_method")?;
    if let Some(method) = &payment_method {
        test_method(method)?;
    }
    let confirm = params.boolean("confirm")?.unwrap_or(false);
    let capture_method = params
        .one_of("capture_method", CAPTURE_METHODS)?
        .unwrap_or("automatic_async");
    let description = params.text("description")?;
    let metadata = params.metadata()?;
    let payment_method_types = params.list("payment_method_types")?;
    if payment_method_types.iter().any(|kind| kind != "card") {
        return Err(StripeError::invalid_param(
            "payment_method_types",
            "The simulator takes card payments only.",
        ));
    }
    let mut redirects_allowed = payment_method_types.is_empty();
    if let Some(mut automatic) = params.hash("automatic_payment_methods")? {
        let enabled = automatic.boolean("enabled")?.unwrap_or(false);
        let allow = automatic.one_of("allow_redirects", &["always", "never"])?;
        automatic.finish_hash("automatic_payment_methods")?;
        redirects_allowed = enabled && allow != Some("never");
    }
    let return_url = params.text("return_url")?;
    params.one_of("off_session", &["true", "false", "one_off", "recurring"])?;
    params.boolean("error_on_requires_action")?;
    params.text("receipt_email")?;
    params.text("statement_descriptor")?;
    params.text("statement_descriptor_suffix")?;
    let expand = expand_of(params, INTENT_EXPANSIONS)?;
    if confirm && redirects_allowed && return_url.is_none() {
        return Err(return_url_trap());
    }
    let record = IntentRecord {
        id: format!("pi_{}", uuid::Uuid::now_v7().simple()),
        amount,
        currency,
        capture_method,
        description,
        metadata,
        payment_method: payment_method.clone(),
        payment_method_types: if redirects_allowed {
            Vec::new()
        } else {
            vec!["card".to_owned()]
        },
        return_url: return_url.clone(),
        created: Utc::now().timestamp(),
        confirmed: false,
        canceled: None,
    };
    Ok(NewIntent {
        record,
        confirm: confirm.then_some(Confirmation {
            payment_method,
            return_url,
            expand,
        }),
    })
}

fn return_url_trap() -> StripeError {
    StripeError::invalid_param(
        "return_url",
        "A `return_url` must be specified because this Payment Intent is configured to \
         automatically accept the payment methods enabled in the Dashboard, some of which may \
         require a full page redirect to succeed. If you do not want to accept redirect-based \
         payment methods, set `automatic_payment_methods[enabled]` to `true` and \
         `automatic_payment_methods[allow_redirects]` to `never` when creating Setup Intents \
         and Payment Intents.",
    )
}

async fn create_intent(State(sim): State<Simulator>, headers: HeaderMap, body: Bytes) -> Response {
    let redirect = redirect_base(&sim, &headers);
    write_call(
        &sim,
        &headers,
        "POST /v1/payment_intents".into(),
        &body,
        read_new_intent,
        |state, key, new| {
            if state.stripe.len() >= CHARGES_MAX {
                return Err(SimError::CapacityExhausted.into());
            }
            let id = new.record.id.clone();
            state.stripe.insert(new.record);
            match new.confirm {
                Some(confirmation) => confirm(state, key, &id, confirmation, &redirect),
                None => {
                    let record = intent_record(state, &id)?;
                    Ok(ok(&render_intent(state, record, &Expand::default())))
                }
            }
        },
    )
    .await
}

/// Confirms `id` into the charge model under `key`.
fn confirm(
    state: &mut SimState,
    key: &str,
    id: &str,
    confirmation: Confirmation,
    redirect: &str,
) -> Result<Reply, StripeError> {
    let record = intent_record(state, id)?.clone();
    let status = render::intent_status(&record, state.charge(&charge_id_of(id)));
    if !matches!(status, "requires_payment_method" | "requires_confirmation") || record.confirmed {
        return Err(StripeError::unexpected_state(format!(
            "You cannot confirm this PaymentIntent because it has a status of {status}."
        )));
    }
    let payment_method = confirmation
        .payment_method
        .or(record.payment_method.clone())
        .ok_or_else(|| {
            StripeError::invalid_param(
                "payment_method",
                "You cannot confirm this PaymentIntent because it's missing a payment method.",
            )
            .with_code("payment_intent_unexpected_state")
        })?;
    let method = test_method(&payment_method)?;
    let return_url = confirmation.return_url.or(record.return_url.clone());
    if record.payment_method_types.is_empty() && return_url.is_none() {
        return Err(return_url_trap());
    }
    let request = CreateChargeRequest {
        amount_minor: record.amount,
        currency: record.currency.to_ascii_uppercase(),
        payment_method: method.to_owned(),
        capture: record.capture_method != "manual",
        reference: record.metadata.get("asiento_payment_id").cloned(),
        metadata: record.metadata.clone(),
    };
    let reply = state
        .create_charge_as(key, &request, Utc::now(), redirect, charge_id_of(id))
        .map_err(StripeError::from)?;
    let charge: Charge = decoded(&reply);
    let record = {
        let stored = state
            .stripe
            .get_mut(id)
            .expect("the intent was read above under the same lock");
        stored.payment_method = Some(payment_method);
        stored.return_url = return_url;
        stored.confirmed = true;
        stored.clone()
    };
    let intent = intent_with(state, &record, &charge, &confirmation.expand);
    if render::intent_status(&record, Some(&charge)) == "requires_payment_method" {
        return Err(StripeError::declined(intent, &charge.id));
    }
    Ok(Reply {
        delay: reply.delay,
        ..ok(&intent)
    })
}

async fn confirm_intent(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let redirect = redirect_base(&sim, &headers);
    let read = |params: &mut Params| {
        let payment_method = params.text("payment_method")?;
        if let Some(method) = &payment_method {
            test_method(method)?;
        }
        let return_url = params.text("return_url")?;
        params.one_of("off_session", &["true", "false", "one_off", "recurring"])?;
        params.boolean("error_on_requires_action")?;
        params.text("receipt_email")?;
        let expand = expand_of(params, INTENT_EXPANSIONS)?;
        Ok(Confirmation {
            payment_method,
            return_url,
            expand,
        })
    };
    let route = format!("POST /v1/payment_intents/{id}/confirm");
    write_call(
        &sim,
        &headers,
        route,
        &body,
        read,
        |state, key, confirmation| confirm(state, key, &id, confirmation, &redirect),
    )
    .await
}

async fn capture_intent(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let read = |params: &mut Params| {
        let amount = params.integer("amount_to_capture")?;
        if params.boolean("final_capture")? == Some(false) {
            return Err(StripeError::invalid_param(
                "final_capture",
                "Multicapture is not available on this account.",
            ));
        }
        let metadata = params.metadata()?;
        params.text("statement_descriptor")?;
        params.text("statement_descriptor_suffix")?;
        let expand = expand_of(params, INTENT_EXPANSIONS)?;
        Ok((amount, metadata, expand))
    };
    let route = format!("POST /v1/payment_intents/{id}/capture");
    write_call(
        &sim,
        &headers,
        route,
        &body,
        read,
        |state, key, (amount, metadata, expand)| {
            let record = intent_record(state, &id)?.clone();
            let status = render::intent_status(&record, state.charge(&charge_id_of(&id)));
            if status != "requires_capture" {
                return Err(StripeError::unexpected_state(format!(
                "This PaymentIntent could not be captured because it has a status of {status}. \
                 Only a PaymentIntent with one of the following statuses may be captured: \
                 requires_capture."
            )));
            }
            let reply = state
                .capture(
                    key,
                    &charge_id_of(&id),
                    &CaptureRequest {
                        amount_minor: amount,
                    },
                    Utc::now(),
                )
                .map_err(StripeError::from)?;
            let answer: OperationAnswer = decoded(&reply);
            let charge = answer
                .charge
                .clone()
                .or_else(|| state.charge(&charge_id_of(&id)).cloned())
                .ok_or_else(|| StripeError::not_found("payment_intent", &id))?;
            let record = {
                let stored = state
                    .stripe
                    .get_mut(&id)
                    .expect("the intent was read above under the same lock");
                stored.metadata.extend(metadata);
                stored.clone()
            };
            let mut intent = intent_with(state, &record, &charge, &expand);
            if answer.operation.status == OperationStatus::Pending {
                intent["status"] = Value::from("processing");
            }
            Ok(ok(&intent))
        },
    )
    .await
}

async fn cancel_intent(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let read = |params: &mut Params| {
        let reason = params.one_of("cancellation_reason", CANCELLATION_REASONS)?;
        let expand = expand_of(params, INTENT_EXPANSIONS)?;
        Ok((reason, expand))
    };
    let route = format!("POST /v1/payment_intents/{id}/cancel");
    write_call(
        &sim,
        &headers,
        route,
        &body,
        read,
        |state, key, (reason, expand)| {
            let record = intent_record(state, &id)?.clone();
            let status = render::intent_status(&record, state.charge(&charge_id_of(&id)));
            let cancelable = [
                "requires_payment_method",
                "requires_confirmation",
                "requires_action",
                "requires_capture",
            ];
            if !cancelable.contains(&status) {
                return Err(StripeError::unexpected_state(format!(
                "You cannot cancel this PaymentIntent because it has a status of {status}. Only \
                 a PaymentIntent with one of the following statuses may be canceled: {}.",
                cancelable.join(", ")
            )));
            }
            let now = Utc::now();
            if record.confirmed
                && state.charge(&charge_id_of(&id)).is_some_and(|c| {
                    matches!(
                        c.status,
                        asiento_psp::provider::ChargeStatus::RequiresCapture
                            | asiento_psp::provider::ChargeStatus::RequiresAction
                    )
                })
            {
                state
                    .cancel(key, &charge_id_of(&id), now)
                    .map_err(StripeError::from)?;
            }
            let record = {
                let stored = state
                    .stripe
                    .get_mut(&id)
                    .expect("the intent was read above under the same lock");
                stored.canceled = Some((now.timestamp(), reason));
                stored.clone()
            };
            Ok(ok(&render_intent(state, &record, &expand)))
        },
    )
    .await
}

async fn get_intent(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        params.text("client_secret")?;
        expand_of(params, INTENT_EXPANSIONS)
    };
    read_call(&sim, &headers, query, read, |state, expand| {
        let record = intent_record(state, &id)?;
        Ok(ok(&render_intent(state, record, &expand)))
    })
    .await
}

async fn list_intents(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        let listing = Listing::read(params)?;
        let expand = list_expand_of(params, INTENT_EXPANSIONS)?;
        Ok((listing, expand))
    };
    read_call(&sim, &headers, query, read, |state, (listing, expand)| {
        let matching: Vec<&IntentRecord> = state
            .stripe
            .newest_first()
            .filter(|record| listing.created(record.created))
            .collect();
        listing.answer(
            "/v1/payment_intents",
            &matching,
            |record| record.id.as_str(),
            |record| render_intent(state, record, &expand),
        )
    })
    .await
}

async fn create_refund(State(sim): State<Simulator>, headers: HeaderMap, body: Bytes) -> Response {
    let read = |params: &mut Params| {
        let intent = params.text("payment_intent")?;
        let charge = params.text("charge")?;
        let amount = params.integer("amount")?;
        params.one_of("reason", REFUND_REASONS)?;
        let metadata = params.metadata()?;
        params.text("instructions_email")?;
        expand_of(params, &[])?;
        let charge_id = match (intent, charge) {
            (Some(intent), None) => charge_id_of(&intent),
            (None, Some(charge)) => charge,
            _ => {
                return Err(StripeError::invalid(
                    "You must provide exactly one of payment_intent or charge.",
                ))
            }
        };
        Ok((charge_id, amount, metadata))
    };
    write_call(
        &sim,
        &headers,
        "POST /v1/refunds".into(),
        &body,
        read,
        |state, key, (charge_id, amount, metadata)| {
            let charge = state
                .charge(&charge_id)
                .filter(|_| state.stripe.get(&intent_id_of(&charge_id)).is_some())
                .ok_or_else(|| StripeError::not_found("charge", &charge_id))?
                .clone();
            let amount = match amount {
                Some(amount) => amount,
                None => {
                    let pending: i64 = state
                        .operations_of(&charge.id, OperationKind::Refund)
                        .iter()
                        .filter(|operation| operation.status == OperationStatus::Pending)
                        .map(|operation| operation.amount_minor)
                        .sum();
                    charge.amount_captured - charge.amount_refunded - pending
                }
            };
            let reply = state
                .refund(
                    key,
                    &RefundRequest {
                        charge: charge.id.clone(),
                        amount_minor: amount,
                    },
                    Utc::now(),
                )
                .map_err(StripeError::from)?;
            let answer: OperationAnswer = decoded(&reply);
            state
                .stripe
                .set_refund_metadata(&answer.operation.id, metadata.clone());
            Ok(ok(&render::refund(&answer.operation, &metadata)))
        },
    )
    .await
}

async fn get_refund(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| expand_of(params, &[]);
    read_call(&sim, &headers, query, read, |state, _| {
        let operation = state
            .operation(&id)
            .filter(|operation| operation.kind == OperationKind::Refund)
            .or_else(|| state.stripe.dashboard_refund(&id))
            .ok_or_else(|| StripeError::not_found("refund", &id))?;
        Ok(ok(&render::refund(
            operation,
            &state.stripe.refund_metadata(&id),
        )))
    })
    .await
}

async fn get_charge(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| expand_of(params, CHARGE_EXPANSIONS);
    read_call(&sim, &headers, query, read, |state, expand| {
        let record = state
            .stripe
            .get(&intent_id_of(&id))
            .ok_or_else(|| StripeError::not_found("charge", &id))?;
        let charge = state
            .charge(&id)
            .ok_or_else(|| StripeError::not_found("charge", &id))?;
        let refunds = refunds_of(state, &id);
        Ok(ok(&render::charge(
            charge,
            record,
            &refunds,
            state.fee_bps(),
            &expand,
        )))
    })
    .await
}

/// Disputes, newest first: one per disputed charge (the simulator keeps a charge's latest).
async fn list_disputes(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        let intent = params.text("payment_intent")?;
        let charge = params.text("charge")?;
        Ok((
            intent.map(|intent| charge_id_of(&intent)).or(charge),
            params.limit()?,
        ))
    };
    read_call(&sim, &headers, query, read, |state, (wanted, limit)| {
        let charges: Vec<Charge> = match wanted {
            Some(id) => state.charge(&id).cloned().into_iter().collect(),
            None => state.charges(),
        };
        let mut disputes: Vec<(i64, Value)> = charges
            .iter()
            .filter(|charge| state.stripe.get(&intent_id_of(&charge.id)).is_some())
            .filter_map(|charge| {
                let created = charge.dispute.as_ref()?.created.timestamp_millis();
                render::dispute(charge).map(|dispute| (created, dispute))
            })
            .collect();
        disputes.sort_by_key(|(created, _)| std::cmp::Reverse(*created));
        let has_more = disputes.len() > limit;
        let data = disputes
            .into_iter()
            .take(limit)
            .map(|(_, dispute)| dispute)
            .collect();
        Ok(ok(&render::list("/v1/disputes", data, has_more)))
    })
    .await
}

async fn get_dispute(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    read_object(&sim, &headers, query, |state| {
        let charge_id = format!("ch_{}", id.strip_prefix("dp_").unwrap_or(&id));
        state
            .charge(&charge_id)
            .filter(|_| state.stripe.get(&intent_id_of(&charge_id)).is_some())
            .and_then(render::dispute)
            .ok_or_else(|| StripeError::not_found("dispute", &id))
    })
    .await
}

/// The account's balance transactions, newest first, by `created` window, `type`, `source`,
/// `currency` and `payout` (the ones it paid out), paged with `starting_after` /
/// `ending_before`.
async fn list_balance_transactions(
    State(sim): State<Simulator>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| {
        let listing = Listing::read(params)?;
        let kind = params.text("type")?;
        let source = params.text("source")?;
        let currency = params.text("currency")?;
        let payout = params.text("payout")?;
        let expand = list_expand_of(params, BALANCE_EXPANSIONS)?;
        Ok((listing, (kind, source, currency, payout), expand))
    };
    read_call(
        &sim,
        &headers,
        query,
        read,
        |state, (listing, filters, expand)| {
            let (kind, source, currency, payout) = filters;
            let all = balance::all(state);
            let paid_out = match payout {
                Some(id) => Some(
                    state
                        .stripe
                        .payouts()
                        .iter()
                        .find(|payout| payout.id == id)
                        .ok_or_else(|| StripeError::not_found("payout", &id))?,
                ),
                None => None,
            };
            let matching: Vec<&balance::BalanceTransaction> = all
                .iter()
                // What the payout covered, and the payout's own withdrawal, as Stripe lists them.
                .filter(|txn| {
                    paid_out.is_none_or(|payout| {
                        payout.transactions.contains(&txn.id)
                            || (txn.kind == "payout" && txn.source == payout.id)
                    })
                })
                .filter(|txn| listing.created(txn.created))
                .filter(|txn| kind.as_deref().is_none_or(|kind| txn.kind == kind))
                .filter(|txn| source.as_deref().is_none_or(|source| txn.source == source))
                .filter(|txn| {
                    currency
                        .as_deref()
                        .is_none_or(|currency| txn.currency.eq_ignore_ascii_case(currency))
                })
                .collect();
            listing.answer(
                "/v1/balance_transactions",
                &matching,
                |txn| txn.id.as_str(),
                |txn| render_balance_transaction(state, txn, &expand),
            )
        },
    )
    .await
}

async fn get_balance_transaction(
    State(sim): State<Simulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let read = |params: &mut Params| expand_of(params, BALANCE_EXPANSIONS);
    read_call(&sim, &headers, query, read, |state, expand| {
        let txn = balance::all(state)
            .into_iter()
            .find(|txn| txn.id == id)
            .ok_or_else(|| StripeError::not_found("balance_transaction", &id))?;
        Ok(ok(&render_balance_transaction(state, &txn, &expand)))
    })
    .await
}

/// What a balance transaction's answer may expand: its source.
const BALANCE_EXPANSIONS: &[&str] = &["source"];

/// A balance transaction, with its source object when `source` is expanded.
fn render_balance_transaction(
    state: &SimState,
    txn: &balance::BalanceTransaction,
    expand: &Expand,
) -> Value {
    let mut rendered = txn.render();
    if expand.has("source") {
        if let Some(source) = render_source(state, &txn.source) {
            rendered["source"] = source;
        }
    }
    rendered
}

/// The charge, refund, dispute or payout a balance transaction names.
fn render_source(state: &SimState, source: &str) -> Option<Value> {
    if let Some(payout) = state
        .stripe
        .payouts()
        .iter()
        .find(|payout| payout.id == source)
    {
        return Some(payouts::render(payout));
    }
    if let Some(refund) = state
        .operation(source)
        .or_else(|| state.stripe.dashboard_refund(source))
    {
        return Some(render::refund(
            refund,
            &state.stripe.refund_metadata(source),
        ));
    }
    let (charge_id, dispute) = match source.strip_prefix("dp_") {
        Some(suffix) => (format!("ch_{suffix}"), true),
        None => (source.to_owned(), false),
    };
    let charge = state.charge(&charge_id)?;
    if dispute {
        return render::dispute(charge);
    }
    let record = state.stripe.get(&intent_id_of(&charge_id))?;
    let refunds = refunds_of(state, &charge_id);
    Some(render::charge(
        charge,
        record,
        &refunds,
        state.fee_bps(),
        &Expand::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_users_decode() {
        // "sk_test_abc:" in base64.
        assert_eq!(
            basic_user("c2tfdGVzdF9hYmM6").as_deref(),
            Some("sk_test_abc")
        );
        assert_eq!(basic_user("not base64!"), None);
    }
}
