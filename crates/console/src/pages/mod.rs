//! One module per screen. Each handler reads what it shows through the same read models and
//! streams as the API, and renders it through `crate::layout`.

pub mod accounts;
pub mod audit;
pub mod exceptions;
pub mod health;
pub mod payments;
pub mod sign_in;

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::ConsoleError;

/// The fields of a submitted form (`application/x-www-form-urlencoded`); a repeated field keeps
/// its first value.
pub fn form(body: &Bytes) -> HashMap<String, String> {
    let mut fields = HashMap::new();
    for (key, value) in form_urlencoded::parse(body) {
        fields
            .entry(key.into_owned())
            .or_insert_with(|| value.into_owned());
    }
    fields
}

/// After a change, the page to look at (Post/Redirect/Get, so a reload never repeats it).
pub fn see_other(location: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, location.to_owned())],
    )
        .into_response()
}

/// The query string's fields (never refused: a field that does not decode is simply absent).
pub fn query(raw: Option<String>) -> HashMap<String, String> {
    form(&Bytes::from(raw.unwrap_or_default()))
}

/// A query value, trimmed; empty counts as absent.
pub fn param<'a>(query: &'a HashMap<String, String>, name: &str) -> Option<&'a str> {
    query
        .get(name)
        .map(|value| value.trim())
        .filter(|value| !value.is_empty())
}

/// A payment id from a URL, or "not found" (a malformed id names no payment).
pub fn payment_id(raw: &str) -> Result<asiento_domain::PaymentId, ConsoleError> {
    asiento_domain::PaymentId::parse(raw).map_err(|_| ConsoleError::NotFound("payment"))
}
