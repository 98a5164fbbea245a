//! The Adyen dialect's report routes: downloads as Adyen's Customer Area serves them, for the
//! report user only, and the control routes that generate files (`crate::adyen::reports`
//! says when and what) and announce each with REPORT_AVAILABLE.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use chrono::{NaiveDate, Utc};
use serde_json::json;

use super::notifications::report_available;
use super::reports::Generated;
use crate::routes::redirect_base;
use crate::state::SimState;
use crate::Simulator;
use asiento_psp::adyen::BasicCredentials;

/// The control routes, nested under `/sim`.
pub(crate) fn control_routes() -> Router<Simulator> {
    Router::new()
        .route("/reports/accounting", post(close_days))
        .route("/reports/settlement", post(settle))
}

fn report_user(sim: &Simulator) -> Option<BasicCredentials> {
    let config = sim.config();
    Some(BasicCredentials {
        username: config.report_username.clone()?,
        password: config.report_password.clone().unwrap_or_default(),
    })
}

/// Brings the journal's amounts to the charge model's: the simulator's control route that
/// changes a charge's amount tells no notification, and the reports are Adyen's only account of
/// what it holds.
fn restate_amounts(state: &mut SimState) {
    let restated: Vec<(String, i64)> = state
        .adyen
        .reports
        .booked_payments()
        .into_iter()
        .filter_map(|psp| {
            let amount = state.charge(&psp)?.amount_minor;
            Some((psp, amount))
        })
        .collect();
    for (psp, amount) in restated {
        state.adyen.reports.restate_amount(&psp, amount);
    }
}

/// `GET /reports/download/MerchantAccount/{merchant}/{file}`.
pub(super) async fn download(
    State(sim): State<Simulator>,
    Path((merchant, file)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let given = headers
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if !report_user(&sim).is_some_and(|user| user.accepts(given)) {
        return (
            StatusCode::UNAUTHORIZED,
            [("www-authenticate", "Basic realm=\"Adyen\"")],
            "401 Unauthorized",
        )
            .into_response();
    }
    let mut state = sim.state();
    restate_amounts(&mut state);
    let file = state.adyen.reports.file(&merchant, &file, Utc::now());
    drop(state);
    match file {
        Some(body) => (
            StatusCode::OK,
            [(CONTENT_TYPE, HeaderValue::from_static("text/csv"))],
            body,
        )
            .into_response(),
        None => (StatusCode::NOT_FOUND, "404 Not Found").into_response(),
    }
}

/// Announces each generated file, and answers their names.
fn announce(sim: &Simulator, headers: &HeaderMap, generated: Vec<Generated>) -> Response {
    let base = redirect_base(sim, headers);
    let now = Utc::now();
    let mut state = sim.state();
    let mut items = Vec::with_capacity(generated.len());
    let mut files = Vec::with_capacity(generated.len());
    for Generated {
        merchant_account,
        file,
    } in generated
    {
        let url = format!("{base}/reports/download/MerchantAccount/{merchant_account}/{file}");
        items.push(report_available(
            &state,
            &merchant_account,
            &file,
            url.clone(),
            now,
        ));
        files.push(json!({"merchant_account": merchant_account, "file": file, "url": url}));
    }
    state.send(items);
    axum::Json(json!({ "data": files })).into_response()
}

/// `POST /sim/reports/accounting` `{"through": "YYYY-MM-DD"}` (today by default).
async fn close_days(State(sim): State<Simulator>, headers: HeaderMap, body: Bytes) -> Response {
    let asked = if body.is_empty() {
        Ok(None)
    } else {
        serde_json::from_slice::<serde_json::Value>(&body)
            .map_err(|_| ())
            .map(|value| value.get("through").cloned())
    };
    let through = match asked {
        Ok(None) => Ok(Utc::now().date_naive()),
        Ok(Some(day)) => day
            .as_str()
            .and_then(|day| NaiveDate::parse_from_str(day, "%Y-%m-%d").ok())
            .ok_or(()),
        Err(()) => Err(()),
    };
    let Ok(through) = through else {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": {"code": "parameter_invalid", "message": "through must be a date, YYYY-MM-DD"}})),
        )
            .into_response();
    };
    let generated = sim.state().adyen.reports.close_days(through);
    announce(&sim, &headers, generated)
}

/// `POST /sim/reports/settlement`: closes a batch per merchant account and currency.
async fn settle(State(sim): State<Simulator>, headers: HeaderMap) -> Response {
    let generated = {
        let mut state = sim.state();
        restate_amounts(&mut state);
        state.adyen.reports.settle(Utc::now())
    };
    announce(&sim, &headers, generated)
}
