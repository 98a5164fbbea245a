//! What a console page answers when it cannot show what was asked: a page a person can read,
//! never a stack of JSON. A signed-out browser is sent to the sign-in form; another tenant's id
//! is "not found", exactly like an id that does not exist.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::layout;

#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// No session, or an expired one.
    #[error("not signed in")]
    SignedOut,
    /// A form without the signed-in browser's CSRF token.
    #[error("the form's security token is missing or stale; open the page again and retry")]
    Csrf,
    /// A page of a tenant's data, opened by the platform operator.
    #[error("this page shows a tenant's data: sign in with that tenant's API key")]
    TenantOnly,
    #[error("{0} not found")]
    NotFound(&'static str),
    /// Input a person can correct, said in words.
    #[error("{0}")]
    BadInput(String),
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("{0}")]
    Internal(String),
}

/// A page's read that failed on a standby for another reason than the person's input is read
/// again from the primary.
impl asiento_api::reads::ReadFailure for ConsoleError {
    fn clients_fault(&self) -> bool {
        matches!(self, ConsoleError::BadInput(_) | ConsoleError::NotFound(_))
    }
}

impl ConsoleError {
    /// Any error of the layers below, as a server error (logged, never shown in detail).
    pub fn internal(error: impl std::fmt::Display) -> Self {
        ConsoleError::Internal(error.to_string())
    }

    fn status(&self) -> StatusCode {
        match self {
            ConsoleError::SignedOut => StatusCode::SEE_OTHER,
            ConsoleError::Csrf | ConsoleError::TenantOnly => StatusCode::FORBIDDEN,
            ConsoleError::NotFound(_) => StatusCode::NOT_FOUND,
            ConsoleError::BadInput(_) => StatusCode::BAD_REQUEST,
            ConsoleError::Database(_) | ConsoleError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        }
    }
}

impl IntoResponse for ConsoleError {
    fn into_response(self) -> Response {
        if matches!(self, ConsoleError::SignedOut) {
            return (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, "/console/sign-in")],
            )
                .into_response();
        }
        let status = self.status();
        let message = if status.is_server_error() {
            tracing::error!(error = %self, "console page failed");
            "Something went wrong on our side; it has been logged. Try again in a moment."
                .to_owned()
        } else {
            self.to_string()
        };
        let body = layout::bare(
            status.canonical_reason().unwrap_or("Error"),
            html! {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("Error")) }
                p #error role="alert" { (message) }
                p { a href="/console/payments" { "Back to the console" } }
            },
        );
        (status, body).into_response()
    }
}
