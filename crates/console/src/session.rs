//! Console sessions: sign-in exchanges an API key for a random token in an HttpOnly,
//! SameSite=Strict cookie; the table keeps only the token's SHA-256. A signed-in request carries
//! the cookie, and every form it renders carries the session's CSRF token, checked before any
//! change. The sign-in form itself is protected by a double-submitted token (a cookie and a
//! field that must agree), so no other site can sign a browser in to a session of its choosing.

use asiento_domain::TenantId;
use asiento_eventstore::Database;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, HeaderMap};
use rand::Rng as _;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use crate::error::ConsoleError;
use crate::ConsoleState;

/// The cookie holding a signed-in session's token.
pub const SESSION_COOKIE: &str = "asiento_console";
/// The cookie holding the sign-in form's double-submitted token.
pub const SIGN_IN_COOKIE: &str = "asiento_console_sign_in";

/// Whose data a session sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Tenant(TenantId),
    /// The platform operator: the exceptions that name no tenant's payment.
    Platform,
}

/// A signed-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    token_sha256: [u8; 32],
    pub scope: Scope,
    /// The name typed at sign-in.
    pub operator: String,
    /// The first 12 hex digits of the SHA-256 of the key signed in with.
    pub key_fingerprint: String,
    pub csrf: String,
}

impl Session {
    /// The tenant, or the page's refusal for the platform operator (who has no payments).
    pub fn tenant(&self) -> Result<&TenantId, ConsoleError> {
        match &self.scope {
            Scope::Tenant(tenant) => Ok(tenant),
            Scope::Platform => Err(ConsoleError::TenantOnly),
        }
    }

    /// The tenant column of the rows a signed-in person writes and reads (null for the platform
    /// operator).
    pub fn tenant_column(&self) -> Option<String> {
        match &self.scope {
            Scope::Tenant(tenant) => Some(tenant.to_string()),
            Scope::Platform => None,
        }
    }

    /// Refuses a form whose CSRF token is not the one issued at sign-in.
    pub fn check_csrf(&self, sent: Option<&str>) -> Result<(), ConsoleError> {
        let sent = sent.unwrap_or_default().as_bytes();
        if bool::from(sent.ct_eq(self.csrf.as_bytes())) && !sent.is_empty() {
            Ok(())
        } else {
            Err(ConsoleError::Csrf)
        }
    }
}

pub fn sha256(text: &str) -> [u8; 32] {
    Sha256::digest(text.as_bytes()).into()
}

/// A fresh random token: 32 bytes as hex.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

/// The value of cookie `name` in the request, if any.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// A `Set-Cookie` value for a console cookie: HttpOnly, SameSite=Strict, scoped to `/console`,
/// `Secure` when the request reached us over https (through a proxy that says so).
pub fn set_cookie(name: &str, value: &str, max_age_s: i64, headers: &HeaderMap) -> String {
    let secure = headers
        .get("x-forwarded-proto")
        .and_then(|value| value.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    format!(
        "{name}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    )
}

fn sqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

/// Stores a new session; answers its token (the cookie's value) and the session.
pub async fn create(
    database: &Database,
    scope: Scope,
    operator: &str,
    key: &str,
    now_ms: i64,
    ttl_ms: i64,
) -> Result<(String, Session), ConsoleError> {
    let token = random_token();
    let session = Session {
        token_sha256: sha256(&token),
        scope,
        operator: operator.to_owned(),
        key_fingerprint: fingerprint(key),
        csrf: random_token(),
    };
    let tenant = session.tenant_column();
    let sql = "insert into console_sessions \
               (token_sha256, tenant, operator, key_fingerprint, csrf, created_ms, expires_ms) \
               values ($1, $2, $3, $4, $5, $6, $7)";
    let digest = session.token_sha256.to_vec();
    match database {
        Database::Postgres(pool) => {
            sqlx::query(sql)
                .bind(digest)
                .bind(tenant)
                .bind(operator)
                .bind(&session.key_fingerprint)
                .bind(&session.csrf)
                .bind(now_ms)
                .bind(now_ms.saturating_add(ttl_ms))
                .execute(pool)
                .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(&sqlite(sql))
                .bind(digest)
                .bind(tenant)
                .bind(operator)
                .bind(&session.key_fingerprint)
                .bind(&session.csrf)
                .bind(now_ms)
                .bind(now_ms.saturating_add(ttl_ms))
                .execute(pool)
                .await?;
        }
    }
    Ok((token, session))
}

/// Which key a session was opened with, without revealing it.
pub fn fingerprint(key: &str) -> String {
    hex::encode(sha256(key)).chars().take(12).collect()
}

type SessionRow = (Option<String>, String, String, String);

/// The live session of `token`, if there is one.
pub async fn load(
    database: &Database,
    token: &str,
    now_ms: i64,
) -> Result<Option<Session>, ConsoleError> {
    let digest = sha256(token);
    let sql = "select tenant, operator, key_fingerprint, csrf from console_sessions \
               where token_sha256 = $1 and expires_ms > $2";
    let row: Option<SessionRow> = match database {
        Database::Postgres(pool) => {
            sqlx::query_as(sql)
                .bind(digest.to_vec())
                .bind(now_ms)
                .fetch_optional(pool)
                .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_as(&sqlite(sql))
                .bind(digest.to_vec())
                .bind(now_ms)
                .fetch_optional(pool)
                .await?
        }
    };
    let Some((tenant, operator, key_fingerprint, csrf)) = row else {
        return Ok(None);
    };
    let scope = match tenant {
        Some(tenant) => Scope::Tenant(
            TenantId::parse(&tenant)
                .map_err(|error| ConsoleError::Internal(format!("stored tenant: {error}")))?,
        ),
        None => Scope::Platform,
    };
    Ok(Some(Session {
        token_sha256: digest,
        scope,
        operator,
        key_fingerprint,
        csrf,
    }))
}

/// Ends `session`, and drops every expired session while at it.
pub async fn delete(
    database: &Database,
    session: &Session,
    now_ms: i64,
) -> Result<(), ConsoleError> {
    let sql = "delete from console_sessions where token_sha256 = $1 or expires_ms <= $2";
    match database {
        Database::Postgres(pool) => {
            sqlx::query(sql)
                .bind(session.token_sha256.to_vec())
                .bind(now_ms)
                .execute(pool)
                .await?;
        }
        Database::Sqlite(pool) => {
            sqlx::query(&sqlite(sql))
                .bind(session.token_sha256.to_vec())
                .bind(now_ms)
                .execute(pool)
                .await?;
        }
    }
    Ok(())
}

/// The current time of the application clock, in unix milliseconds.
pub fn now_ms(state: &ConsoleState) -> i64 {
    state.api.payments.clock().now().timestamp_millis()
}

impl FromRequestParts<ConsoleState> for Session {
    type Rejection = ConsoleError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &ConsoleState,
    ) -> Result<Self, Self::Rejection> {
        let token = cookie(&parts.headers, SESSION_COOKIE).ok_or(ConsoleError::SignedOut)?;
        load(&state.api.database, token, now_ms(state))
            .await?
            .ok_or(ConsoleError::SignedOut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            "other=1; asiento_console_sign_in=abc; asiento_console=tok"
                .parse()
                .expect("a header"),
        );
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("tok"));
        assert_eq!(cookie(&headers, SIGN_IN_COOKIE), Some("abc"));
        assert_eq!(cookie(&headers, "missing"), None);
    }

    #[test]
    fn a_csrf_token_must_match_exactly_and_be_present() {
        let session = Session {
            token_sha256: [0; 32],
            scope: Scope::Platform,
            operator: "ana".to_owned(),
            key_fingerprint: "abc".to_owned(),
            csrf: "token".to_owned(),
        };
        assert!(session.check_csrf(Some("token")).is_ok());
        assert!(session.check_csrf(Some("toke")).is_err());
        assert!(session.check_csrf(Some("")).is_err());
        assert!(session.check_csrf(None).is_err());
    }

    #[test]
    fn cookies_are_secure_behind_https() {
        let mut headers = HeaderMap::new();
        assert!(!set_cookie("a", "b", 1, &headers).contains("Secure"));
        headers.insert("x-forwarded-proto", "https".parse().expect("a header"));
        let cookie = set_cookie("a", "b", 1, &headers);
        assert!(cookie.contains("Secure") && cookie.contains("HttpOnly"));
        assert!(cookie.contains("SameSite=Strict"));
    }
}
