//! The front of a process that serves several cells: every request goes to its tenant's cell,
//! whose router (the same API and console a process of one database serves) answers it.
//!
//! - An API request by its key: the cells' `api_keys` say whose key it is, the directory where
//!   that tenant lives.
//! - A console session by its cookie, which the front writes as `{cell}.{token}` when the cell
//!   signs a browser in (the sign-in form by the key it posts; the platform operator's key, which
//!   is no tenant's, to the cell the form was asked for: `/console/sign-in?cell=eu2`).
//! - A provider's webhook by the payment it names (`asiento_domain::cell`); an Adyen batch whose
//!   items name payments of several cells is split into one batch per cell (each item carries
//!   its own signature). A payment minted before the deployment had cells is the home cell's;
//!   what names no payment (a payout) goes to every cell, each of which posts its own part.
//! - Anything else (sign-in form, `/openapi.json`, `/metrics`) to the home cell; `/readyz` asks
//!   every cell.
//!
//! The front reads no body it does not route by and verifies nothing: the cell refuses what does
//! not authenticate, exactly as it would alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use asiento_api::metrics_cell::in_cell;
use asiento_api::problem::Problem;
use asiento_app::api_keys::{KeyCache, KEY_CACHE_TTL};
use asiento_app::webhooks::{EventFormat, WebhookSecrets};
use asiento_domain::{CellNumber, TenantId};
use asiento_eventstore::Database;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_LENGTH, COOKIE, SET_COOKIE};
use axum::http::{HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::stream::{FuturesUnordered, StreamExt as _};
use sha2::{Digest as _, Sha256};
use tower::ServiceExt as _;

use super::Directory;

/// One cell this process serves.
pub struct ServedCell {
    /// Its name in the directory, also the `cell` label of what its requests record.
    pub name: Arc<str>,
    /// The cell's whole router: API, console, webhooks, health.
    pub router: Router,
    /// The cell's primary, where its API keys are.
    pub database: Database,
}

/// What routes: the directory, the cells served here, the providers' webhook formats.
pub struct Front {
    directory: Directory,
    served: Vec<ServedCell>,
    keys: Vec<KeyCache>,
    /// Keys routed lately (by SHA-256), to the served cell's index: believed for the cells' own
    /// [`KEY_CACHE_TTL`], so that a moved tenant's key follows it as soon as its old cell's does.
    recent: Mutex<HashMap<[u8; 32], (usize, Instant)>>,
    formats: WebhookSecrets,
}

/// Keys the front remembers at most; when full, it starts over.
const RECENT_KEYS_MAX: usize = 10_000;

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Cell(usize),
    /// A cell of the directory that this process does not serve.
    Elsewhere(String),
    /// The tenant is paused (being moved): the client or provider retries later.
    Paused,
    /// Refused by the front: a status and the problem's code and detail.
    Refused(StatusCode, &'static str, &'static str),
}

const UNKNOWN_CELL: Route = Route::Refused(
    StatusCode::BAD_REQUEST,
    "unknown_cell",
    "the payment named was made in a cell the directory does not list",
);

/// How soon a paused tenant's client is told to retry.
const PAUSED_RETRY_AFTER_S: u64 = 5;

impl Front {
    pub fn new(directory: Directory, served: Vec<ServedCell>, formats: WebhookSecrets) -> Front {
        assert!(!served.is_empty(), "a front serves at least one cell");
        let keys = served.iter().map(|_| KeyCache::default()).collect();
        Front {
            directory,
            served,
            keys,
            recent: Mutex::default(),
            formats,
        }
    }

    /// The front's router: every request to the cell it belongs to.
    pub fn router(self) -> Router {
        Router::new()
            .route("/readyz", axum::routing::get(ready))
            .fallback(route)
            .with_state(Arc::new(self))
    }

    fn served_named(&self, name: &str) -> Route {
        match self.served.iter().position(|cell| &*cell.name == name) {
            Some(index) => Route::Cell(index),
            None => Route::Elsewhere(name.to_owned()),
        }
    }

    /// The home cell when served here, else the first cell served.
    fn home(&self) -> usize {
        let home = &self.directory.home().name;
        self.served
            .iter()
            .position(|cell| *cell.name == **home)
            .unwrap_or(0)
    }

    /// The cell of the tenant whose key this is; the home cell (which refuses it) for a key no
    /// served cell knows. A key seen lately goes straight to its cell; another is looked up in
    /// every served cell at once, the first that knows it answering, so that a cell that is down
    /// or slow does not hold up the tenants of the others.
    async fn of_key(&self, key: &str) -> Route {
        self.key_route(key)
            .await
            .unwrap_or_else(|| Route::Cell(self.home()))
    }

    /// [`Front::of_key`], `None` for a key no served cell knows.
    async fn key_route(&self, key: &str) -> Option<Route> {
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        if let Some(index) = self.recent_key(&digest) {
            return Some(Route::Cell(index));
        }
        let mut lookups: FuturesUnordered<_> =
            self.served
                .iter()
                .zip(&self.keys)
                .map(|(cell, keys)| async move {
                    (cell, keys.tenant_for_key(&cell.database, key).await)
                })
                .collect();
        let mut unreachable = false;
        while let Some((cell, found)) = lookups.next().await {
            let tenant = match found {
                Ok(Some(tenant)) => tenant,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(cell = %cell.name, %error, "reading API keys failed");
                    unreachable = true;
                    continue;
                }
            };
            let placed = TenantId::parse(&tenant)
                .ok()
                .and_then(|tenant| self.directory.cell_of_tenant(&tenant));
            if TenantId::parse(&tenant).is_ok_and(|tenant| self.directory.is_paused(&tenant)) {
                return Some(Route::Paused);
            }
            let Some(placed) = placed else {
                tracing::warn!(cell = %cell.name, %tenant, "a key's tenant is in no cell of the directory");
                return Some(Route::Refused(
                    StatusCode::FORBIDDEN,
                    "tenant_without_cell",
                    "this key's tenant is not placed in any cell",
                ));
            };
            let route = self.served_named(&placed.name);
            if let Route::Cell(index) = route {
                self.remember_key(digest, index);
            }
            return Some(route);
        }
        unreachable.then_some(Route::Refused(
            StatusCode::SERVICE_UNAVAILABLE,
            "cell_unavailable",
            "a cell that may hold this key cannot be reached; retry later",
        ))
    }

    /// The cell a key was routed to lately.
    fn recent_key(&self, digest: &[u8; 32]) -> Option<usize> {
        let recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        recent
            .get(digest)
            .filter(|(_, at)| at.elapsed() < KEY_CACHE_TTL)
            .map(|(index, _)| *index)
    }

    fn remember_key(&self, digest: [u8; 32], index: usize) {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if recent.len() >= RECENT_KEYS_MAX {
            recent.clear();
        }
        recent.insert(digest, (index, Instant::now()));
    }

    async fn send(&self, route: Route, request: Request) -> Response {
        match route {
            Route::Cell(index) => {
                let cell = &self.served[index];
                let answer = cell.router.clone().oneshot(request);
                let Ok(response) = in_cell(Arc::clone(&cell.name), answer).await;
                response
            }
            Route::Elsewhere(name) => Problem::new(
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_cell",
                format!("this belongs to cell {name}, which this process does not serve"),
            )
            .into_response(),
            Route::Paused => {
                let mut response = Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "tenant_paused",
                    "this tenant is paused while it moves between cells; retry later",
                )
                .into_response();
                response.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    HeaderValue::from(PAUSED_RETRY_AFTER_S),
                );
                response
            }
            Route::Refused(status, code, detail) => {
                Problem::new(status, code, detail).into_response()
            }
        }
    }
}

async fn route(State(front): State<Arc<Front>>, request: Request) -> Response {
    let path = request.uri().path();
    if let Some(provider) = path.strip_prefix("/webhooks/") {
        let provider = provider.to_owned();
        return webhook(&front, &provider, request).await;
    }
    if path == "/console" || path.starts_with("/console/") {
        return console(&front, request).await;
    }
    let key = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(str::to_owned);
    let route = match key {
        Some(key) => front.of_key(&key).await,
        None => Route::Cell(front.home()),
    };
    front.send(route, request).await
}

/// Ready when every cell served here is.
async fn ready(State(front): State<Arc<Front>>) -> Response {
    let mut cells = BTreeMap::new();
    let mut ready = true;
    for cell in &front.served {
        let request = Request::get("/readyz")
            .body(Body::empty())
            .expect("a fixed request is valid");
        let Ok(response) = cell.router.clone().oneshot(request).await;
        ready &= response.status().is_success();
        cells.insert(cell.name.to_string(), response.status().as_u16());
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = serde_json::json!({ "ready": ready, "cells": cells });
    (status, axum::Json(body)).into_response()
}

/// What a provider's event names, for routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Named {
    /// A payment minted in a cell (or a provider key derived from one).
    Cell(CellNumber),
    /// A reference that carries no cell: a payment minted before the deployment had cells, or
    /// something that is no payment of ours. The home cell answers for it.
    Unstamped,
    /// No payment at all (a payout, a report): every cell has its part in it.
    Nothing,
}

impl Named {
    fn of(reference: Option<&str>) -> Named {
        match reference.map(str::trim).filter(|text| !text.is_empty()) {
            None => Named::Nothing,
            Some(text) => CellNumber::of_reference(text).map_or(Named::Unstamped, Named::Cell),
        }
    }
}

impl Front {
    /// Where a provider's event that names `reference` goes. A payment found in a cell that has
    /// moved tenants out, or holds a paused one, is looked up there to find its tenant: a moved
    /// tenant's payment goes to its new cell, a paused tenant's event is refused for now (the
    /// provider delivers it again).
    async fn routes(&self, reference: Option<&str>) -> Vec<Route> {
        let cell = match Named::of(reference) {
            Named::Nothing => return (0..self.served.len()).map(Route::Cell).collect(),
            Named::Unstamped => Some(self.directory.home()),
            Named::Cell(number) => self.directory.cell_numbered(number),
        };
        let Some(cell) = cell else {
            return vec![UNKNOWN_CELL];
        };
        let route = self.served_named(&cell.name);
        let (Route::Cell(index), true) = (&route, self.directory.has_exceptions(cell)) else {
            return vec![route];
        };
        let Some(payment) = reference.and_then(asiento_domain::payment_of_reference) else {
            return vec![route];
        };
        let database = &self.served[*index].database;
        match payment_tenant(database, payment).await {
            Ok(Some(tenant)) => {
                let Ok(tenant) = TenantId::parse(&tenant) else {
                    return vec![route];
                };
                if self.directory.is_paused(&tenant) {
                    return vec![Route::Paused];
                }
                match self.directory.cell_of_tenant(&tenant) {
                    Some(placed) if placed.name != cell.name => {
                        vec![self.served_named(&placed.name)]
                    }
                    _ => vec![route],
                }
            }
            Ok(None) => vec![route],
            Err(error) => {
                tracing::warn!(cell = %cell.name, %error, "looking up a payment's tenant failed");
                vec![Route::Refused(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "cell_unavailable",
                    "the payment's cell cannot be reached; retry later",
                )]
            }
        }
    }
}

/// The tenant of a payment's stream in one cell's log.
async fn payment_tenant(
    database: &Database,
    payment: asiento_domain::PaymentId,
) -> Result<Option<String>, sqlx::Error> {
    let stream = asiento_domain::payment_stream(payment);
    let tenant: Option<Option<String>> = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar(
                "select metadata->>'tenant' from events where stream_id = $1 and version = 1",
            )
            .bind(stream)
            .fetch_optional(pool)
            .await?
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar(
                "select json_extract(metadata, '$.tenant') from events \
                 where stream_id = ?1 and version = 1",
            )
            .bind(stream)
            .fetch_optional(pool)
            .await?
        }
    };
    Ok(tenant.flatten())
}

/// A provider's delivery, to the cell of the payment it names; one that names none to every
/// cell served here (each stores it in its inbox and applies its own part).
async fn webhook(front: &Front, provider: &str, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = match read_body(body).await {
        Ok(body) => body,
        Err(problem) => return problem.into_response(),
    };
    let deliveries: Vec<(Route, Bytes)> = match front.formats.format(provider) {
        EventFormat::Adyen => match adyen_items(&body) {
            Some(items) if !items.is_empty() => {
                let mut routed = Vec::with_capacity(items.len());
                for (reference, item) in items {
                    routed.push((front.routes(reference.as_deref()).await, item));
                }
                let mut deliveries = Vec::new();
                for (routes, part) in split_adyen(&body, routed) {
                    for route in routes {
                        deliveries.push((route, part.clone()));
                    }
                }
                deliveries
            }
            _ => vec![(Route::Cell(front.home()), body)],
        },
        format => match format.envelope(&body) {
            Ok(envelope) => front
                .routes(envelope.payment_ref.as_deref())
                .await
                .into_iter()
                .map(|route| (route, body.clone()))
                .collect(),
            // Not an event: the home cell refuses it.
            Err(_) => vec![(Route::Cell(front.home()), body)],
        },
    };
    // Answered as one: the first refusal if any (the provider sends it all again, and each cell
    // finds what it stored already), else the first acceptance.
    let mut answer = None;
    for (route, part) in deliveries {
        let mut request = Request::from_parts(clone_parts(&parts), Body::from(part));
        request.headers_mut().remove(CONTENT_LENGTH);
        let response = front.send(route, request).await;
        let failed = !response.status().is_success();
        if failed || answer.is_none() {
            answer = Some(response);
        }
        if failed {
            break;
        }
    }
    answer.expect("a delivery goes to at least one cell")
}

/// An Adyen batch's items, each with the reference it names (`merchantReference`); `None` when
/// the body is not a batch the front can read (the home cell refuses it).
fn adyen_items(body: &[u8]) -> Option<Vec<(Option<String>, serde_json::Value)>> {
    let batch: serde_json::Value = serde_json::from_slice(body).ok()?;
    let items = batch.get("notificationItems")?.as_array()?;
    Some(
        items
            .iter()
            .map(|item| {
                let reference = item
                    .get("NotificationRequestItem")
                    .and_then(|item| item.get("merchantReference"))
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned);
                (reference, item.clone())
            })
            .collect(),
    )
}

/// An Adyen batch as one batch per destination, in the order they first appear, each item kept
/// as it came (it carries its own signature); the body itself when every item goes to one.
fn split_adyen<K: PartialEq>(body: &Bytes, items: Vec<(K, serde_json::Value)>) -> Vec<(K, Bytes)> {
    let mut parts: Vec<(K, Vec<serde_json::Value>)> = Vec::new();
    for (destination, item) in items {
        match parts.iter_mut().find(|(seen, _)| *seen == destination) {
            Some((_, items)) => items.push(item),
            None => parts.push((destination, vec![item])),
        }
    }
    if parts.len() <= 1 {
        return parts
            .into_iter()
            .map(|(destination, _)| (destination, body.clone()))
            .collect();
    }
    let Ok(mut batch) = serde_json::from_slice::<serde_json::Value>(body) else {
        unreachable!("the items were read from this body");
    };
    parts
        .into_iter()
        .map(|(destination, items)| {
            batch["notificationItems"] = serde_json::Value::Array(items);
            let part = serde_json::to_vec(&batch).expect("a JSON value serialises");
            (destination, Bytes::from(part))
        })
        .collect()
}

/// A console request: to the cell its session cookie names, a sign-in to the cell of the key it
/// posts; the session cookie a cell sets is written with the cell's name in front.
async fn console(front: &Front, request: Request) -> Response {
    let cookie = session_cookie(&request);
    let (route, request) = match cookie {
        Some((cell, token)) => {
            let route = front.served_named(&cell);
            (route, with_session_token(request, &token))
        }
        None if request.method() == Method::POST && request.uri().path() == SIGN_IN_PATH => {
            let (parts, body) = request.into_parts();
            let body = match read_body(body).await {
                Ok(body) => body,
                Err(problem) => return problem.into_response(),
            };
            let key = form_urlencoded::parse(&body)
                .find(|(name, _)| name == "api_key")
                .map(|(_, value)| value.trim().to_owned())
                .filter(|key| !key.is_empty());
            // A tenant's key signs in to its cell; the operator's key (no tenant's) to the cell
            // the sign-in form was asked for (`?cell=`), else the home cell.
            let chosen = asiento_console::cookie(&parts.headers, CHOSEN_CELL_COOKIE)
                .map(|cell| front.served_named(cell))
                .unwrap_or(Route::Cell(front.home()));
            let route = match key {
                Some(key) => front.key_route(&key).await.unwrap_or(chosen),
                None => chosen,
            };
            (route, Request::from_parts(parts, Body::from(body)))
        }
        None => (Route::Cell(front.home()), request),
    };
    let chosen = chosen_cell(front, &request);
    let headers = request.headers().clone();
    let name = match &route {
        Route::Cell(index) => Some(Arc::clone(&front.served[*index].name)),
        _ => None,
    };
    let mut response = front.send(route, request).await;
    if let Some(name) = name {
        name_the_cell_in_session_cookies(&mut response, &name);
    }
    if let Some(cell) = chosen {
        let cookie =
            asiento_console::set_cookie(CHOSEN_CELL_COOKIE, &cell, CHOSEN_CELL_MAX_AGE_S, &headers);
        if let Ok(value) = HeaderValue::from_str(&cookie) {
            response.headers_mut().append(SET_COOKIE, value);
        }
    }
    response
}

const SIGN_IN_PATH: &str = "/console/sign-in";

/// The cell the sign-in form was asked for (`/console/sign-in?cell=eu2`), for the operator's key.
const CHOSEN_CELL_COOKIE: &str = "asiento_console_cell";
const CHOSEN_CELL_MAX_AGE_S: i64 = 3600;

/// A cell served here that the sign-in form's query names.
fn chosen_cell(front: &Front, request: &Request) -> Option<String> {
    if request.method() != Method::GET || request.uri().path() != SIGN_IN_PATH {
        return None;
    }
    let query = request.uri().query()?;
    let (_, cell) = form_urlencoded::parse(query.as_bytes()).find(|(name, _)| name == "cell")?;
    match front.served_named(&cell) {
        Route::Cell(_) => Some(cell.into_owned()),
        _ => None,
    }
}

/// The session cookie's cell and token, when the request carries one the front wrote.
fn session_cookie(request: &Request) -> Option<(String, String)> {
    let value = asiento_console::cookie(request.headers(), asiento_console::SESSION_COOKIE)?;
    let (cell, token) = value.split_once('.')?;
    Some((cell.to_owned(), token.to_owned()))
}

/// The request with its session cookie as the cell wrote it (the token alone).
fn with_session_token(mut request: Request, token: &str) -> Request {
    let name = asiento_console::SESSION_COOKIE;
    let rewritten: Vec<String> = request
        .headers()
        .get_all(COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .map(|value| {
            value
                .split(';')
                .map(|pair| match pair.trim().split_once('=') {
                    Some((key, _)) if key == name => format!("{name}={token}"),
                    _ => pair.trim().to_owned(),
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect();
    let headers = request.headers_mut();
    headers.remove(COOKIE);
    for value in rewritten {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.append(COOKIE, value);
        }
    }
    request
}

/// A session cookie the cell sets (`asiento_console=TOKEN; …`) as `asiento_console=CELL.TOKEN; …`;
/// a cleared one (empty value) is left as it is.
fn name_the_cell_in_session_cookies(response: &mut Response, cell: &str) {
    let prefix = format!("{}=", asiento_console::SESSION_COOKIE);
    let cookies: Vec<HeaderValue> = response
        .headers()
        .get_all(SET_COOKIE)
        .iter()
        .map(|value| match value.to_str() {
            Ok(text) if text.starts_with(&prefix) && !text[prefix.len()..].starts_with(';') => {
                let named = format!("{prefix}{cell}.{}", &text[prefix.len()..]);
                HeaderValue::from_str(&named).unwrap_or_else(|_| value.clone())
            }
            _ => value.clone(),
        })
        .collect();
    let headers = response.headers_mut();
    headers.remove(SET_COOKIE);
    for cookie in cookies {
        headers.append(SET_COOKIE, cookie);
    }
}

async fn read_body(body: Body) -> Result<Bytes, Problem> {
    axum::body::to_bytes(body, asiento_api::REQUEST_BODY_BYTES_MAX)
        .await
        .map_err(|_| {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the request body is larger than {} bytes",
                    asiento_api::REQUEST_BODY_BYTES_MAX
                ),
            )
        })
}

/// What a request is besides its body, for a second request made of one.
fn clone_parts(parts: &axum::http::request::Parts) -> axum::http::request::Parts {
    let (mut cloned, ()) = Request::new(()).into_parts();
    cloned.method = parts.method.clone();
    cloned.uri = parts.uri.clone();
    cloned.version = parts.version;
    cloned.headers = parts.headers.clone();
    cloned.extensions = parts.extensions.clone();
    cloned
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use asiento_domain::PaymentId;

    fn stamped(cell: u64) -> String {
        let number = CellNumber::new(cell).unwrap();
        PaymentId::from_uuid(number.stamp(uuid::Uuid::now_v7())).to_string()
    }

    fn item(reference: &str) -> serde_json::Value {
        serde_json::json!({"NotificationRequestItem": {
            "merchantReference": reference, "pspReference": "ABC", "eventCode": "CAPTURE",
            "additionalData": {"hmacSignature": "sig"}
        }})
    }

    #[test]
    fn an_event_names_a_cell_the_home_cell_or_every_cell() {
        let one = CellNumber::new(1).unwrap();
        let id = stamped(1);
        assert_eq!(Named::of(Some(&id)), Named::Cell(one));
        let key = format!("psp_{}_refund_2", id.trim_start_matches("pay_"));
        assert_eq!(Named::of(Some(&key)), Named::Cell(one));
        let unstamped = PaymentId::from_uuid(uuid::Uuid::now_v7()).to_string();
        assert_eq!(Named::of(Some(&unstamped)), Named::Unstamped);
        assert_eq!(Named::of(Some("order-17")), Named::Unstamped);
        assert_eq!(Named::of(Some("  ")), Named::Nothing);
        assert_eq!(Named::of(None), Named::Nothing);
    }

    #[test]
    fn an_adyen_batch_is_split_by_cell_keeping_every_item_as_it_came() {
        let (a, b) = (stamped(1), stamped(2));
        let items = vec![item(&a), item(&b), item(""), item(&a)];
        let body = Bytes::from(
            serde_json::to_vec(&serde_json::json!({"live": "false", "notificationItems": items}))
                .unwrap(),
        );
        let named = |body: &Bytes| -> Vec<(Named, serde_json::Value)> {
            adyen_items(body)
                .unwrap()
                .into_iter()
                .map(|(reference, item)| (Named::of(reference.as_deref()), item))
                .collect()
        };
        let split = split_adyen(&body, named(&body));
        let destinations: Vec<Named> = split.iter().map(|(named, _)| *named).collect();
        let (one, two) = (CellNumber::new(1).unwrap(), CellNumber::new(2).unwrap());
        assert_eq!(
            destinations,
            [Named::Cell(one), Named::Cell(two), Named::Nothing]
        );
        let parts: Vec<serde_json::Value> = split
            .iter()
            .map(|(_, part)| serde_json::from_slice(part).unwrap())
            .collect();
        assert_eq!(parts[0]["live"], "false");
        assert_eq!(
            parts[0]["notificationItems"],
            serde_json::json!([item(&a), item(&a)])
        );
        assert_eq!(parts[1]["notificationItems"], serde_json::json!([item(&b)]));
        assert_eq!(parts[2]["notificationItems"], serde_json::json!([item("")]));
        // A batch for one cell goes on byte for byte.
        let single = Bytes::from(
            serde_json::to_vec(
                &serde_json::json!({"live": "false", "notificationItems": [item(&b)]}),
            )
            .unwrap(),
        );
        let split = split_adyen(&single, named(&single));
        assert_eq!(split.len(), 1);
        assert_eq!(split[0].1, single);
        assert!(adyen_items(b"not json").is_none());
    }

    #[test]
    fn session_cookies_carry_the_cell_both_ways() {
        let request = Request::get("/console/payments")
            .header(COOKIE, "theme=dark; asiento_console=eu2.abc123")
            .body(Body::empty())
            .unwrap();
        assert_eq!(
            session_cookie(&request),
            Some(("eu2".to_owned(), "abc123".to_owned()))
        );
        let forwarded = with_session_token(request, "abc123");
        assert_eq!(
            forwarded.headers()[COOKIE],
            "theme=dark; asiento_console=abc123"
        );

        let mut response = Response::new(Body::empty());
        for cookie in [
            "asiento_console=tok; Path=/console; HttpOnly",
            "asiento_console=; Path=/console; Max-Age=0",
            "asiento_console_sign_in=x; Path=/console",
        ] {
            response
                .headers_mut()
                .append(SET_COOKIE, HeaderValue::from_static(cookie));
        }
        name_the_cell_in_session_cookies(&mut response, "eu2");
        let set: Vec<&str> = response
            .headers()
            .get_all(SET_COOKIE)
            .iter()
            .map(|value| value.to_str().unwrap())
            .collect();
        assert_eq!(
            set,
            [
                "asiento_console=eu2.tok; Path=/console; HttpOnly",
                "asiento_console=; Path=/console; Max-Age=0",
                "asiento_console_sign_in=x; Path=/console",
            ]
        );
    }
}
