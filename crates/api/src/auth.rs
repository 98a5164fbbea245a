//! Bearer-key authentication. Every `/v1` route takes an `AuthenticatedTenant` argument, so a route
//! cannot be written that forgets to authenticate.

use asiento_app::api_keys::KeyCache;
use asiento_eventstore::Database;
use axum::{extract::FromRequestParts, http::request::Parts, http::StatusCode};

use crate::problem::Problem;

/// The tenant whose key came with the request. A tenant sees only its own data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthenticatedTenant(pub String);

/// State the extractor needs: the database and the keys recently found in it.
pub trait HasDatabase {
    fn database(&self) -> &Database;
    fn key_cache(&self) -> &KeyCache;
}

impl<S> FromRequestParts<S> for AuthenticatedTenant
where
    S: HasDatabase + Send + Sync,
{
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let unauthorized = |detail: &str| {
            Problem::new(StatusCode::UNAUTHORIZED, "unauthorized", detail.to_owned())
        };
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing Authorization: Bearer <key>"))?;
        let value = header
            .to_str()
            .map_err(|_| unauthorized("the Authorization header is not ASCII"))?;
        let key = value
            .strip_prefix("Bearer ")
            .map(str::trim)
            .filter(|key| !key.is_empty())
            .ok_or_else(|| unauthorized("expected Authorization: Bearer <key>"))?;
        match state
            .key_cache()
            .tenant_for_key(state.database(), key)
            .await
        {
            Ok(Some(tenant)) => Ok(Self(tenant)),
            Ok(None) => Err(unauthorized("unknown API key")),
            Err(error) => Err(Problem::server(&error)),
        }
    }
}
