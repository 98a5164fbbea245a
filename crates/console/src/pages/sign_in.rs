//! Signing in and out. The key is typed into a form posted to us (never put in a URL), checked
//! like an API request's bearer key (or against the platform operator's key), and exchanged for
//! a session cookie. The person's name is asked for too: a tenant's key is shared, and the audit
//! trail must say who acted. Attempts are limited per client address (`serve --rate-limit
//! console=…`, 10 a minute by default), before anything else is read, so that a key cannot be
//! guessed by brute force; a browser over the limit gets this form again, 429, saying how long
//! to wait.

use asiento_api::rate_limit::ClientAddress;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;
use subtle::ConstantTimeEq as _;

use super::{form, see_other};
use crate::audit::{self, Action};
use crate::error::ConsoleError;
use crate::layout;
use crate::session::{self, Scope, Session, SESSION_COOKIE, SIGN_IN_COOKIE};
use crate::ConsoleState;

/// The longest name a person may give.
const OPERATOR_CHARS_MAX: usize = 80;

/// `/console`: the payments when signed in, else the sign-in form.
pub async fn home(session: Result<Session, ConsoleError>) -> Response {
    match session {
        Ok(_) => see_other("/console/payments"),
        Err(_) => see_other("/console/sign-in"),
    }
}

/// The sign-in form, with a fresh double-submitted token.
fn form_page(headers: &HeaderMap, problem: Option<&str>, status: StatusCode) -> Response {
    let token = session::random_token();
    let body = layout::bare(
        "Sign in",
        html! {
            h1 { "asiento console" }
            p { "Sign in with your team's API key to find payments, follow what happened to them, "
                "refund, and resolve reconciliation exceptions." }
            @if let Some(problem) = problem {
                p #error role="alert" .error { (problem) }
            }
            form #sign-in method="post" action="/console/sign-in" {
                input type="hidden" name="csrf" value=(token);
                p {
                    label for="operator" { "Your name" }
                    input #operator name="operator" type="text" required maxlength=(OPERATOR_CHARS_MAX)
                        autocomplete="name";
                    small { "Recorded with every action you take." }
                }
                p {
                    label for="api_key" { "API key" }
                    input #api_key name="api_key" type="password" required autocomplete="off";
                }
                button #sign-in-submit type="submit" { "Sign in" }
            }
        },
    );
    let cookie = session::set_cookie(SIGN_IN_COOKIE, &token, 3_600, headers);
    (status, [(header::SET_COOKIE, cookie)], body).into_response()
}

/// `GET /console/sign-in`
pub async fn show_form(headers: HeaderMap) -> Response {
    form_page(&headers, None, StatusCode::OK)
}

/// `POST /console/sign-in`: opens a session for a known key.
pub async fn sign_in(
    State(state): State<ConsoleState>,
    address: ClientAddress,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    if let Err(limited) = state.api.rate_limits.console_attempt(address) {
        let wait = format!(
            "Too many sign-in attempts from your address. Wait {} seconds, then try again.",
            limited.retry_after_s
        );
        let mut page = form_page(&headers, Some(&wait), StatusCode::TOO_MANY_REQUESTS);
        page.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(limited.retry_after_s),
        );
        return Ok(page);
    }
    let fields = form(&body);
    let sent = fields.get("csrf").map(String::as_str).unwrap_or_default();
    let expected = session::cookie(&headers, SIGN_IN_COOKIE).unwrap_or_default();
    if sent.is_empty() || !bool::from(sent.as_bytes().ct_eq(expected.as_bytes())) {
        return Ok(form_page(
            &headers,
            Some("The sign-in form expired; please sign in again."),
            StatusCode::FORBIDDEN,
        ));
    }
    let operator = fields
        .get("operator")
        .map(|name| name.trim())
        .filter(|name| !name.is_empty() && name.chars().count() <= OPERATOR_CHARS_MAX)
        .filter(|name| !name.chars().any(char::is_control));
    let key = fields
        .get("api_key")
        .map(|key| key.trim())
        .filter(|key| !key.is_empty());
    let (Some(operator), Some(key)) = (operator, key) else {
        return Ok(form_page(
            &headers,
            Some("Give your name (up to 80 characters) and an API key."),
            StatusCode::BAD_REQUEST,
        ));
    };
    let Some(scope) = scope_of(&state, key).await? else {
        return Ok(form_page(
            &headers,
            Some("Unknown API key."),
            StatusCode::UNAUTHORIZED,
        ));
    };
    let now = session::now_ms(&state);
    let (token, opened) = session::create(
        &state.api.database,
        scope,
        operator,
        key,
        now,
        state.session_ttl_ms,
    )
    .await?;
    audit::record(
        &state.api.database,
        &opened,
        now,
        Action::SignIn,
        None,
        "signed in",
        "ok",
    )
    .await?;
    let cookie = session::set_cookie(
        SESSION_COOKIE,
        &token,
        state.session_ttl_ms / 1_000,
        &headers,
    );
    let cleared = session::set_cookie(SIGN_IN_COOKIE, "", 0, &headers);
    let mut response = see_other("/console/payments");
    let set = response.headers_mut();
    for value in [cookie, cleared] {
        let value = value
            .parse()
            .map_err(|_| ConsoleError::Internal("a cookie that is not a header value".into()))?;
        set.append(header::SET_COOKIE, value);
    }
    Ok(response)
}

/// Whose key `key` is: a tenant's API key, or the platform operator's.
async fn scope_of(state: &ConsoleState, key: &str) -> Result<Option<Scope>, ConsoleError> {
    if let Some(operator) = &state.operator_key_sha256 {
        if bool::from(session::sha256(key).ct_eq(operator)) {
            return Ok(Some(Scope::Platform));
        }
    }
    let tenant = state
        .api
        .key_cache
        .tenant_for_key(&state.api.database, key)
        .await
        .map_err(ConsoleError::internal)?;
    tenant
        .map(|tenant| {
            asiento_domain::TenantId::parse(&tenant)
                .map(Scope::Tenant)
                .map_err(ConsoleError::internal)
        })
        .transpose()
}

/// `POST /console/sign-out`: ends the session (with its CSRF token, so no other site can).
pub async fn sign_out(
    State(state): State<ConsoleState>,
    session: Session,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let fields = form(&body);
    session.check_csrf(fields.get("csrf").map(String::as_str))?;
    let now = session::now_ms(&state);
    audit::record(
        &state.api.database,
        &session,
        now,
        Action::SignOut,
        None,
        "signed out",
        "ok",
    )
    .await?;
    session::delete(&state.api.database, &session, now).await?;
    let mut response = see_other("/console/sign-in");
    let cleared = session::set_cookie(SESSION_COOKIE, "", 0, &headers);
    let value = cleared
        .parse()
        .map_err(|_| ConsoleError::Internal("a cookie that is not a header value".into()))?;
    response.headers_mut().insert(header::SET_COOKIE, value);
    Ok(response)
}
