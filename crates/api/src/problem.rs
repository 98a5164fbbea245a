//! RFC 9457 problem details: every error a client sees is `application/problem+json` with a stable
//! `code` to branch on. Nothing from the database or a panic ever reaches the body: errors that are
//! ours become a 500 with a generic detail, logged with their cause, or a 503 with `Retry-After`
//! while the database cannot be reached.

use axum::{
    http::{header, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use serde::Serialize;

#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Problem {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    pub code: &'static str,
    /// The 0-based index of the transfer of a batch that is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(skip)]
    pub retry_after_s: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self {
            type_uri: format!("https://asiento.dev/problems/{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail: detail.into(),
            code,
            index: None,
            retry_after_s: None,
        }
    }

    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// An error that is ours, not the client's: logged with its cause, shown without it.
    pub fn internal(error: &dyn std::fmt::Display) -> Self {
        tracing::error!(%error, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "an internal error occurred; the request may be retried with the same Idempotency-Key",
        )
    }

    /// An error of ours from a use case or a read: a 503 with `Retry-After` when its cause is
    /// that the database cannot be reached right now (the connection is refused or broken, the
    /// server is shutting down or starting up, the pool has no connection to give, SQLite is
    /// locked), so a client retries instead of treating it as a failure; a 500 otherwise.
    pub fn server(error: &(dyn std::error::Error + 'static)) -> Self {
        if database_unavailable(error) {
            tracing::warn!(%error, "database unavailable");
            return Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "the service cannot reach its database right now; retry with the same Idempotency-Key",
            )
            .with_retry_after(1);
        }
        Self::internal(&error)
    }

    /// The body exactly as it is sent, for responses that are stored and replayed.
    pub fn body_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec())
    }
}

/// Whether `error`, or any error it was caused by, says the database cannot be reached now.
fn database_unavailable(error: &(dyn std::error::Error + 'static)) -> bool {
    // A transparent wrapper hands on its inner error's source, not the inner error: a chain may
    // skip the `sqlx::Error` and name only what it wraps (the I/O error, the server's error).
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(error) = current.downcast_ref::<sqlx::Error>() {
            return sqlx_unavailable(error);
        }
        if current.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        if let Some(error) = current.downcast_ref::<sqlx::postgres::PgDatabaseError>() {
            return unavailable_code(error.code());
        }
        next = current.source();
    }
    false
}

/// PostgreSQL: connection exceptions (08…), shutting down or starting up (57P01, 57P02,
/// 57P03), too many connections (53300). SQLite: busy or locked (5, 6).
fn unavailable_code(code: &str) -> bool {
    code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "5" | "6")
}

fn sqlx_unavailable(error: &sqlx::Error) -> bool {
    match error {
        // A protocol error here is a connection cut mid-message.
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(database) => {
            database.code().is_some_and(|code| unavailable_code(&code))
        }
        _ => false,
    }
}

pub const PROBLEM_CONTENT_TYPE: &str = "application/problem+json";

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (
            status,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(PROBLEM_CONTENT_TYPE),
            )],
            self.body_bytes(),
        )
            .into_response();
        if let Some(seconds) = self.retry_after_s {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The largest plain-text error body `ensure_problem` reads to quote it in a problem's detail.
const PLAIN_ERROR_BYTES_MAX: usize = 4 * 1024;

/// Every error leaving the router is problem+json, including the rejections axum's own extractors
/// write as plain text (a path parameter that is not UTF-8, a query string that does not parse, a
/// chunked body over the limit). Handlers map their own errors; this is the net under them.
pub async fn ensure_problem(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| {
            value
                .as_bytes()
                .starts_with(PROBLEM_CONTENT_TYPE.as_bytes())
        });
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, PLAIN_ERROR_BYTES_MAX)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
        .unwrap_or_default();
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ if text.contains("query string") => "invalid_query",
        _ if text.contains("URL") || text.contains("path") => "invalid_path",
        _ if status.is_server_error() => return Problem::internal(&text).into_response(),
        _ => "invalid_request",
    };
    let detail = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut problem = Problem::new(status, code, detail).into_response();
    // Keep what the layers below set (request id, Retry-After), bar the body's type and length.
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            problem.headers_mut().insert(name.clone(), value.clone());
        }
    }
    problem
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body_of(response: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("body");
        serde_json::from_slice(&bytes).expect("problem json")
    }

    #[tokio::test]
    async fn plain_text_errors_become_problems() {
        let table = [
            (
                StatusCode::BAD_REQUEST,
                "Invalid URL: Invalid UTF-8 in `id`",
                "invalid_path",
            ),
            (
                StatusCode::BAD_REQUEST,
                "Failed to deserialize query string: x",
                "invalid_query",
            ),
            (
                StatusCode::PAYLOAD_TOO_LARGE,
                "length limit exceeded",
                "body_too_large",
            ),
            (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "",
                "unsupported_media_type",
            ),
        ];
        for (status, text, code) in table {
            let plain = (status, text.to_owned()).into_response();
            let converted = ensure_problem(plain).await;
            assert_eq!(converted.status(), status);
            assert_eq!(
                converted.headers().get(header::CONTENT_TYPE).expect("type"),
                PROBLEM_CONTENT_TYPE
            );
            assert_eq!(body_of(converted).await["code"], code, "{text}");
        }
        // Problems and successes pass through untouched.
        let ok = ensure_problem((StatusCode::OK, "fine").into_response()).await;
        assert_eq!(ok.status(), StatusCode::OK);
        let problem = Problem::bad_request("x_code", "d").into_response();
        assert_eq!(
            body_of(ensure_problem(problem).await).await["code"],
            "x_code"
        );
    }

    #[test]
    fn an_unreachable_database_is_503_anything_else_of_ours_500() {
        use asiento_app::log::LogError;
        use asiento_app::payments::FlowError;
        use asiento_eventstore::StoreError;
        let wrapped =
            |error: sqlx::Error| FlowError::Log(LogError::Store(StoreError::Database(error)));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        for error in [
            wrapped(sqlx::Error::Io(refused)),
            wrapped(sqlx::Error::PoolTimedOut),
        ] {
            let problem = Problem::server(&error);
            assert_eq!(
                (problem.status, problem.code, problem.retry_after_s),
                (503, "service_unavailable", Some(1)),
                "{error}"
            );
        }
        // Through a transparent wrapper, whose source skips the sqlx error itself.
        let through = FlowError::Idempotency(asiento_app::idempotency::IdempotencyError::Database(
            sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            )),
        ));
        assert_eq!(Problem::server(&through).status, 503, "{through}");
        let ours = Problem::server(&wrapped(sqlx::Error::RowNotFound));
        assert_eq!((ours.status, ours.code), (500, "internal_error"));
        let ours = Problem::server(&FlowError::Inconsistent("x".into()));
        assert_eq!(ours.status, 500);
    }
}
