//! Request bodies, parsed at the edge into validated domain types (parse, don't validate).
//!
//! Bodies are read as JSON values first and picked apart field by field, so that each way a client
//! can get a field wrong (a float amount, a string amount, a negative one, one too large, an
//! unknown currency, a bad account name) has its own stable `code`, and nothing a client sends can
//! reach a panic or a 5xx. The raw value is also what the idempotency hash is computed over.

use asiento_domain::{AccountName, Amount, AmountLimit, Currency};
use axum::{
    body::Bytes,
    extract::{FromRequest, Request},
    http::StatusCode,
};
use chrono::{DateTime, Utc};
use serde_json::{Map, Value};

use crate::problem::Problem;

/// Nesting deeper than this is refused before serde_json's own recursion limit is reached.
pub const JSON_DEPTH_MAX: usize = 32;

/// A request body that is a JSON object.
#[derive(Debug, Clone)]
pub struct JsonObject(pub Map<String, Value>);

impl<S: Send + Sync> FromRequest<S> for JsonObject {
    type Rejection = Problem;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(request, state)
            .await
            .map_err(|rejection| {
                let status = rejection.status();
                if status == StatusCode::PAYLOAD_TOO_LARGE {
                    Problem::new(status, "body_too_large", "the request body is too large")
                } else {
                    Problem::bad_request("invalid_body", rejection.body_text())
                }
            })?;
        let object = parse_object(&bytes)?;
        refuse_nul(&object)?;
        Ok(JsonObject(object))
    }
}

/// Refuses a body with U+0000 (NUL) in any string or key, at any depth: PostgreSQL's `text` and
/// `jsonb` cannot store it, so such a request would end in a 500 there (and be taken on SQLite).
pub fn refuse_nul(object: &Map<String, Value>) -> Result<(), Problem> {
    match object
        .iter()
        .find(|(key, value)| key.contains('\0') || holds_nul(value))
    {
        Some((key, _)) => Err(Problem::bad_request(
            "invalid_field",
            format!("{key:?} holds U+0000 (NUL), which no text of a request may"),
        )),
        None => Ok(()),
    }
}

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(text) => text.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(map) => map
            .iter()
            .any(|(key, value)| key.contains('\0') || holds_nul(value)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Parses bytes into a JSON object; an empty body is an empty object, so that routes whose fields
/// are all optional accept no body at all.
pub fn parse_object(bytes: &[u8]) -> Result<Map<String, Value>, Problem> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    let value: Value = serde_json::from_slice(bytes).map_err(|error| {
        Problem::bad_request("malformed_json", format!("malformed JSON: {error}"))
    })?;
    if depth(&value) > JSON_DEPTH_MAX {
        return Err(Problem::bad_request(
            "invalid_body",
            format!("JSON nested deeper than {JSON_DEPTH_MAX} levels"),
        ));
    }
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(Problem::bad_request(
            "invalid_body",
            "the request body must be a JSON object",
        )),
    }
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Field accessors over a body object. Each names the field in its error.
pub struct Fields<'a>(pub &'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|value| !value.is_null())
    }

    /// Refuses fields this route does not know, so that a typo (`ammount_minor`) is an error and
    /// not a silently ignored value.
    pub fn only(&self, known: &[&str]) -> Result<(), Problem> {
        match self.0.keys().find(|key| !known.contains(&key.as_str())) {
            Some(unknown) => Err(Problem::bad_request(
                "unknown_field",
                format!("unknown field {unknown:?}; expected one of {known:?}"),
            )),
            None => Ok(()),
        }
    }

    /// A strictly positive integer amount of minor units, at most `limit`.
    pub fn positive_amount(&self, name: &str, limit: AmountLimit) -> Result<Amount, Problem> {
        self.optional_positive_amount(name, limit)?
            .ok_or_else(|| missing(name))
    }

    /// A number that is an integer beyond i64 or above `limit` is 422 `amount_too_large`: the
    /// request is well formed, the deployment refuses the amount (so that no sum of accepted
    /// amounts can overflow; see `asiento_domain::money`).
    pub fn optional_positive_amount(
        &self,
        name: &str,
        limit: AmountLimit,
    ) -> Result<Option<Amount>, Problem> {
        let Some(minor) = self.bounded_integer(name, limit)? else {
            return Ok(None);
        };
        if minor <= 0 {
            return Err(Problem::bad_request(
                "amount_must_be_positive",
                format!("{name} must be positive, got {minor}"),
            ));
        }
        Ok(Some(Amount::new(minor)))
    }

    /// An integer amount of minor units of either sign (a threshold, not money moved), at most
    /// `limit` from zero.
    pub fn signed_amount(&self, name: &str, limit: AmountLimit) -> Result<Amount, Problem> {
        self.bounded_integer(name, limit)?
            .map(Amount::new)
            .ok_or_else(|| missing(name))
    }

    /// A JSON integer at most `limit` from zero (see [`Fields::optional_positive_amount`]).
    fn bounded_integer(&self, name: &str, limit: AmountLimit) -> Result<Option<i64>, Problem> {
        let Some(value) = self.get(name) else {
            return Ok(None);
        };
        let too_large = || {
            Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "amount_too_large",
                format!(
                    "{name} is more than the largest amount accepted ({} minor units)",
                    limit.max()
                ),
            )
        };
        let minor = match value {
            Value::Number(number) => match number.as_i64() {
                Some(minor) => minor,
                None if number.is_u64() => return Err(too_large()),
                None if number.is_f64() => {
                    return Err(Problem::bad_request(
                        "amount_must_be_integer",
                        format!("{name} must be an integer count of minor units, not {number}"),
                    ))
                }
                None => return Err(too_large()),
            },
            _ => {
                return Err(Problem::bad_request(
                    "amount_must_be_integer",
                    format!("{name} must be a JSON integer of minor units"),
                ))
            }
        };
        if minor.unsigned_abs() > limit.max().minor().unsigned_abs() {
            return Err(too_large());
        }
        Ok(Some(minor))
    }

    pub fn currency(&self, name: &str) -> Result<Currency, Problem> {
        let raw = self.string(name)?;
        Currency::parse(raw)
            .map_err(|error| Problem::bad_request("unknown_currency", error.to_string()))
    }

    pub fn account(&self, name: &str) -> Result<AccountName, Problem> {
        let raw = self.string(name)?;
        AccountName::parse(raw)
            .map_err(|error| Problem::bad_request("invalid_account", error.to_string()))
    }

    pub fn string(&self, name: &str) -> Result<&str, Problem> {
        self.optional_string(name)?.ok_or_else(|| missing(name))
    }

    pub fn optional_string(&self, name: &str) -> Result<Option<&str>, Problem> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(Problem::bad_request(
                "invalid_field",
                format!("{name} must be a string"),
            )),
        }
    }

    /// A string of at most `length_max` characters (descriptions, notes).
    pub fn optional_text(&self, name: &str, length_max: usize) -> Result<Option<String>, Problem> {
        match self.optional_string(name)? {
            Some(text) if text.chars().count() > length_max => Err(Problem::bad_request(
                "invalid_field",
                format!("{name} is longer than {length_max} characters"),
            )),
            other => Ok(other.map(str::to_owned)),
        }
    }

    /// `true` or `false`; absent or null is `false`.
    pub fn flag(&self, name: &str) -> Result<bool, Problem> {
        match self.get(name) {
            None => Ok(false),
            Some(Value::Bool(flag)) => Ok(*flag),
            Some(_) => Err(Problem::bad_request(
                "invalid_field",
                format!("{name} must be true or false"),
            )),
        }
    }

    /// An RFC 3339 timestamp with its offset (`2026-12-01T18:00:00Z`).
    pub fn optional_time(&self, name: &str) -> Result<Option<DateTime<Utc>>, Problem> {
        let Some(raw) = self.optional_string(name)? else {
            return Ok(None);
        };
        DateTime::parse_from_rfc3339(raw)
            .map(|time| Some(time.with_timezone(&Utc)))
            .map_err(|error| {
                Problem::bad_request(
                    "invalid_field",
                    format!("{name} must be an RFC 3339 timestamp ({error}), got {raw:?}"),
                )
            })
    }

    pub fn optional_object(&self, name: &str) -> Result<Option<Map<String, Value>>, Problem> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map.clone())),
            Some(_) => Err(Problem::bad_request(
                "invalid_field",
                format!("{name} must be a JSON object"),
            )),
        }
    }
}

fn missing(name: &str) -> Problem {
    Problem::bad_request("missing_field", format!("{name} is required"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amount(body: &str) -> Result<Amount, &'static str> {
        let map = parse_object(body.as_bytes()).map_err(|problem| problem.code)?;
        Fields(&map)
            .positive_amount("amount_minor", AmountLimit::DEFAULT)
            .map_err(|problem| problem.code)
    }

    #[test]
    fn amounts_are_positive_integers_of_minor_units_within_the_limit() {
        let table: [(&str, Result<Amount, &str>); 13] = [
            (r#"{"amount_minor": 10000}"#, Ok(Amount::new(10_000))),
            (
                r#"{"amount_minor": 1000000000000000}"#,
                Ok(Amount::new(asiento_domain::AMOUNT_MAX_DEFAULT)),
            ),
            (
                r#"{"amount_minor": 1000000000000001}"#,
                Err("amount_too_large"),
            ),
            (
                r#"{"amount_minor": 9223372036854775807}"#,
                Err("amount_too_large"),
            ),
            (
                r#"{"amount_minor": 18446744073709551615}"#,
                Err("amount_too_large"),
            ),
            (r#"{"amount_minor": 10.5}"#, Err("amount_must_be_integer")),
            (r#"{"amount_minor": 1e3}"#, Err("amount_must_be_integer")),
            (r#"{"amount_minor": "100"}"#, Err("amount_must_be_integer")),
            (r#"{"amount_minor": -5}"#, Err("amount_must_be_positive")),
            (r#"{"amount_minor": 0}"#, Err("amount_must_be_positive")),
            (
                r#"{"amount_minor": 9223372036854775808}"#,
                Err("amount_too_large"),
            ),
            (r#"{}"#, Err("missing_field")),
            (r#"{"amount_minor": 1"#, Err("malformed_json")),
        ];
        for (body, want) in table {
            assert_eq!(amount(body), want, "{body}");
        }
        let map = parse_object(br#"{"amount_minor": 501}"#).expect("object");
        let limit = AmountLimit::new(500).expect("a valid limit");
        let problem = Fields(&map)
            .positive_amount("amount_minor", limit)
            .expect_err("above a configured limit");
        assert_eq!((problem.status, problem.code), (422, "amount_too_large"));
        assert!(problem.detail.contains("500"), "{}", problem.detail);
    }

    #[test]
    fn bodies_must_be_objects_of_bounded_depth() {
        assert_eq!(
            parse_object(b"[1]").map(|_| ()).map_err(|p| p.code),
            Err("invalid_body")
        );
        assert_eq!(
            parse_object(b"  ").map(|m| m.len()).map_err(|p| p.code),
            Ok(0)
        );
        let deep = format!("{{\"a\":{}1{}}}", "[".repeat(40), "]".repeat(40));
        assert_eq!(
            parse_object(deep.as_bytes())
                .map(|_| ())
                .map_err(|p| p.code),
            Err("invalid_body")
        );
    }

    #[test]
    fn nul_is_refused_anywhere_in_a_body() {
        for body in [
            r#"{"description": "a\u0000b"}"#,
            r#"{"metadata": {"k": ["x", {"y": "\u0000"}]}}"#,
            r#"{"metadata": {"k\u0000": 1}}"#,
            r#"{"a\u0000": 1}"#,
        ] {
            let map = parse_object(body.as_bytes()).expect("an object");
            let problem = refuse_nul(&map).expect_err(body);
            assert_eq!(
                (problem.status, problem.code),
                (400, "invalid_field"),
                "{body}"
            );
        }
        let map = parse_object(br#"{"description": "a\u0001b", "metadata": {"k": [1, null]}}"#)
            .expect("an object");
        assert_eq!(refuse_nul(&map).map_err(|p| p.code), Ok(()));
    }

    #[test]
    fn unknown_fields_are_named() {
        let map = parse_object(br#"{"ammount_minor": 1}"#).expect("object");
        let problem = Fields(&map).only(&["amount_minor"]).expect_err("unknown");
        assert_eq!(problem.code, "unknown_field");
        assert!(problem.detail.contains("ammount_minor"));
    }
}
