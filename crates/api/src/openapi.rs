//! `GET /openapi.json`: the OpenAPI 3.1 document of every `/v1` route, generated from the
//! handlers' `#[utoipa::path]` annotations and the body types below (which describe the JSON the
//! renderers write; a test keeps them from drifting apart), then given the rules the edge
//! enforces ([`rules`]: patterns, bounds, enums, formats) and the links between operations
//! ([`links`]). An API process serves it with its own providers and amount limit
//! ([`Deployment`]).

mod links;
pub mod patterns;
mod rules;

use axum::{extract::State, response::IntoResponse, Json};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::AppState;

/// RFC 9457 problem details; `code` is stable and meant to be branched on.
#[derive(Serialize, ToSchema)]
pub struct ProblemDetails {
    #[serde(rename = "type")]
    pub type_uri: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// A stable snake_case code: `idempotency_key_reused`, `insufficient_funds` …
    pub code: String,
    /// The 0-based index of the transfer of a batch that is refused or malformed.
    pub index: Option<u32>,
}

/// `POST /v1/payments`.
#[derive(Serialize, ToSchema)]
pub struct CreatePaymentRequest {
    /// Integer count of the currency's minor unit; positive.
    pub amount_minor: i64,
    /// ISO 4217 code.
    pub currency: String,
    pub customer: String,
    /// A configured provider (default `sim`).
    pub provider: Option<String>,
    /// `pm_card_ok`, `pm_card_declined`, `pm_card_timeout`, `pm_redirect`, `pm_card_slow` on the
    /// simulator.
    pub payment_method: String,
    /// `automatic` (default) or `manual`.
    pub capture: Option<String>,
    pub description: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
}

/// What the customer must do next; present only while `requires_action`.
#[derive(Serialize, ToSchema)]
pub struct NextAction {
    /// `redirect`.
    #[serde(rename = "type")]
    pub kind: String,
    pub redirect_url: String,
}

/// A capture, refund or cancel asked of the provider.
#[derive(Serialize, ToSchema)]
pub struct ProviderOperation {
    /// `capture`, `refund` or `cancel`.
    pub kind: String,
    /// 1-based within its kind; a refund's sequence names it (`/refunds/{sequence}`).
    pub sequence: u32,
    pub amount_minor: i64,
    /// `requested` (no answer yet), `pending` (received, decided later), `succeeded`, `refused`
    /// (nothing moved; what it reserved is free again) or `reversed` (a refund that failed after
    /// it succeeded; a reversing entry undid it).
    pub state: String,
    /// The provider's id of the operation, once known.
    pub provider_id: Option<String>,
    /// Why it was refused or reversed (the provider's code).
    pub reason: Option<String>,
    /// The provider's requests that answered it (Stripe's `Request-Id`), each once.
    pub provider_requests: Vec<ProviderRequestView>,
    pub requested_at: String,
    pub updated_at: String,
}

/// One of the provider's requests that answered an operation.
#[derive(Serialize, ToSchema)]
pub struct ProviderRequestView {
    /// The provider's id of its request (`req_…`): what its support and logs know it by.
    pub id: String,
    /// The provider said it replayed its first answer under our key (`Idempotent-Replayed`).
    pub replayed: bool,
}

/// A fee the provider kept (Stripe's processing fee, a dispute fee), posted from
/// `psp:{provider}:clearing` to `expense:provider_fees:{provider}`.
#[derive(Serialize, ToSchema)]
pub struct ProviderFeeView {
    /// The provider's balance transaction (`txn_…`).
    pub transaction_id: String,
    /// Negative when the provider gave a fee back.
    pub fee_minor: i64,
}

/// A payment.
#[derive(Serialize, ToSchema)]
pub struct Payment {
    pub id: String,
    /// `pending`, `requires_action`, `authorized`, `captured`, `partially_refunded`, `refunded`,
    /// `failed`, `expired`, `disputed`, `canceled`.
    pub status: String,
    pub amount_minor: i64,
    pub currency: String,
    pub customer: String,
    pub provider: String,
    /// The provider's id of the charge (a Stripe PaymentIntent `pi_…`), once the provider has
    /// answered with one: what a support person searches the provider's dashboard for.
    pub provider_charge_id: Option<String>,
    pub capture: String,
    pub captured_minor: i64,
    pub refunded_minor: i64,
    /// The platform fee kept after refunds.
    pub fee_minor: i64,
    /// The fees the provider itself kept, one per balance transaction (single payment only).
    pub provider_fees: Vec<ProviderFeeView>,
    pub description: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    pub failure_reason: Option<String>,
    /// A provider fact contradicted this payment's history; a person must look at it.
    pub needs_review: bool,
    pub created_at: String,
    pub updated_at: String,
    pub next_action: Option<NextAction>,
    /// Every capture, refund and cancel asked of the provider, in the order asked, with its
    /// state.
    pub operations: Vec<ProviderOperation>,
    /// The global log position of the last event the command wrote: pass it as `min_position`.
    pub position: i64,
}

/// A page of payments, newest first.
#[derive(Serialize, ToSchema)]
pub struct PaymentList {
    pub data: Vec<Payment>,
    pub next_cursor: Option<String>,
}

/// One event of a payment's history.
#[derive(Serialize, ToSchema)]
pub struct PaymentEventView {
    pub position: i64,
    pub version: i64,
    #[serde(rename = "type")]
    pub kind: String,
    pub recorded_at: String,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// `POST /v1/payments/{id}/capture`.
#[derive(Serialize, ToSchema)]
pub struct CaptureRequest {
    /// At most the authorized amount (422 `capture_exceeds_authorized`); the whole of it when
    /// absent.
    pub amount_minor: Option<i64>,
}

/// `POST /v1/payments/{id}/cancel`: no fields (an empty body or `{}`).
#[derive(Serialize, ToSchema)]
pub struct CancelRequest {}

/// `POST /v1/payments/{id}/refunds`.
#[derive(Serialize, ToSchema)]
pub struct RefundRequest {
    /// At most what is left to refund (captured less refunded; 422 `refund_exceeds_captured`).
    pub amount_minor: i64,
}

/// `POST /v1/transfers`.
#[derive(Serialize, ToSchema)]
pub struct TransferRequest {
    pub from: String,
    pub to: String,
    pub amount_minor: i64,
    pub currency: String,
    pub description: Option<String>,
    /// A hold: reserve the amount now (on the pending accounts), post or void it later.
    pub pending: Option<bool>,
    /// For a hold: when the worker voids it if nobody posted or voided it (RFC 3339, future).
    pub expires_at: Option<String>,
}

/// `POST /v1/transfers/batch`: transfers written all or none.
#[derive(Serialize, ToSchema)]
pub struct TransferBatchRequest {
    /// 1 to 100 transfers (holds included), each as `POST /v1/transfers` takes it, decided in
    /// this order: a later one sees what the earlier ones moved.
    pub transfers: Vec<TransferRequest>,
}

/// A batch's answer: every transfer written.
#[derive(Serialize, ToSchema)]
pub struct TransferBatch {
    /// `transfer_batch`.
    pub object: String,
    /// Each transfer as `GET /v1/transfers/{id}` answers it, without `position`.
    pub data: Vec<TransferInBatch>,
    /// The position of the batch's last event: a read-your-writes token for every transfer.
    pub position: i64,
}

/// A transfer of a batch's answer.
#[derive(Serialize, ToSchema)]
pub struct TransferInBatch {
    pub id: String,
    pub from: String,
    pub to: String,
    pub amount_minor: i64,
    pub currency: String,
    pub description: Option<String>,
    pub pending: bool,
    pub status: String,
    pub posted_amount_minor: i64,
    pub expires_at: Option<String>,
    pub entry_id: Option<String>,
    pub settled_entry_id: Option<String>,
    pub settled_at: Option<String>,
    pub created_at: String,
}

/// `POST /v1/transfers/{id}/post`: posts a hold, whole or in part.
#[derive(Serialize, ToSchema)]
pub struct PostHoldRequest {
    /// At most the hold's amount (422 `amount_exceeds_hold`); absent: all of it. The rest is
    /// released.
    pub amount_minor: Option<i64>,
}

/// A transfer or hold and its journal entries.
#[derive(Serialize, ToSchema)]
pub struct Transfer {
    pub id: String,
    pub from: String,
    pub to: String,
    pub amount_minor: i64,
    pub currency: String,
    pub description: Option<String>,
    /// A hold.
    pub pending: bool,
    /// `posted` (a transfer, or a posted hold), `pending`, `voided` or `expired`.
    pub status: String,
    /// What moved between the posted balances.
    pub posted_amount_minor: i64,
    pub expires_at: Option<String>,
    /// The transfer's entry, or the hold's.
    pub entry_id: Option<String>,
    /// The entry of a hold's post, void or expiry.
    pub settled_entry_id: Option<String>,
    pub settled_at: Option<String>,
    pub created_at: String,
    pub position: i64,
}

/// A page of transfers, newest first.
#[derive(Serialize, ToSchema)]
pub struct TransferList {
    pub data: Vec<Transfer>,
    pub next_cursor: Option<String>,
}

/// An account's balance: the snapshot plus every entry after it.
#[derive(Serialize, ToSchema)]
pub struct Balance {
    pub account: String,
    pub currency: String,
    /// A sum of amounts: an integer that may exceed 2^63 (i128); parse it with a big-integer
    /// aware JSON reader.
    #[schema(value_type = i128)]
    pub balance_minor: i128,
    /// Reserved to leave the account by open holds.
    #[schema(value_type = i128)]
    pub pending_debits_minor: i128,
    /// Reserved to reach the account by open holds.
    #[schema(value_type = i128)]
    pub pending_credits_minor: i128,
    /// What a command may still draw on: `balance_minor` less pending debits (credit-normal)
    /// or plus pending credits (debit-normal).
    #[schema(value_type = i128)]
    pub available_minor: i128,
    pub as_of_position: i64,
}

/// A page of the journal of a period.
#[derive(Serialize, ToSchema)]
pub struct JournalList {
    pub object: String,
    pub data: Vec<JournalEntry>,
    /// The `after` of the next page, or null on the last one.
    pub next_after: Option<String>,
}

/// One line of a statement: a leg on the account and the posted balance after it.
#[derive(Serialize, ToSchema)]
pub struct StatementLine {
    pub entry_id: String,
    pub position: i64,
    pub recorded_at: String,
    pub amount_minor: i64,
    #[schema(value_type = i128)]
    pub balance_minor: i128,
    /// The stream whose event posted the entry: `payment-pay_…`, `transfer-tr_…`, `payout-…`.
    pub source: Option<String>,
    /// What the merchant wrote of the transfer the entry posts (`description`), if anything.
    pub description: Option<String>,
}

/// A page of an account's statement (`Accept: text/csv`: the whole period as CSV).
#[derive(Serialize, ToSchema)]
pub struct AccountStatement {
    pub object: String,
    pub account: String,
    pub currency: String,
    /// The posted balance before the period's first leg.
    #[schema(value_type = i128)]
    pub opening_balance_minor: i128,
    /// The position of the event the opening balance is read after (0: before any).
    pub opening_position: i64,
    /// The opening balance plus every leg of the period.
    #[schema(value_type = i128)]
    pub closing_balance_minor: i128,
    /// Where the period ends: pass it as `to_position` with `after` for the next page.
    pub closing_position: i64,
    pub data: Vec<StatementLine>,
    /// The `after` of the next page, or null on the last one.
    pub next_after: Option<i64>,
}

/// An overdraft policy: `{"policy": "forbidden"}`, `{"policy": "allowed"}` or
/// `{"policy": "limit", "limit_minor": 5000}`.
#[derive(Serialize, ToSchema)]
pub struct OverdraftPolicy {
    /// `forbidden`, `allowed` or `limit`.
    pub policy: String,
    /// With `limit`: how far past zero (on the normal side) a command may take the account.
    pub limit_minor: Option<i64>,
}

/// `POST /v1/accounts`: declares an account's policy for one currency.
#[derive(Serialize, ToSchema)]
pub struct DeclareAccountRequest {
    /// A client account (not `psp:`, `revenue:`, `expense:` or `bank:`).
    pub account: String,
    pub currency: String,
    /// `credit` (default) or `debit`.
    pub normal_balance: Option<String>,
    /// Default: forbidden for `customer:` accounts, allowed for others.
    pub overdraft: Option<OverdraftPolicy>,
    pub frozen: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<serde_json::Value>,
}

/// An account in one currency: its balance and the policy in force.
#[derive(Serialize, ToSchema)]
pub struct Account {
    pub account: String,
    pub currency: String,
    /// The posted balance, an integer that may exceed 2^63.
    #[schema(value_type = i128)]
    pub balance_minor: i128,
    #[schema(value_type = i128)]
    pub pending_debits_minor: i128,
    #[schema(value_type = i128)]
    pub pending_credits_minor: i128,
    #[schema(value_type = i128)]
    pub available_minor: i128,
    /// `credit` or `debit`.
    pub normal_balance: String,
    pub overdraft: OverdraftPolicy,
    pub frozen: bool,
    /// False: the policy is the one the name implies.
    pub declared: bool,
    pub declared_at: Option<String>,
    #[schema(value_type = Object)]
    pub metadata: serde_json::Value,
    /// In a declaration's answer: the position it was written at.
    pub position: Option<i64>,
}

/// A page of accounts in (account, currency) order.
#[derive(Serialize, ToSchema)]
pub struct AccountList {
    pub data: Vec<Account>,
    /// Pass as `after` for the next page.
    pub next_after: Option<String>,
    pub as_of_position: i64,
}

/// One leg on an account.
#[derive(Serialize, ToSchema)]
pub struct AccountLeg {
    pub entry_id: String,
    pub amount_minor: i64,
    pub position: i64,
    pub recorded_at: String,
}

/// A page of an account's legs, oldest first.
#[derive(Serialize, ToSchema)]
pub struct AccountEntries {
    pub account: String,
    pub currency: String,
    pub data: Vec<AccountLeg>,
    /// Pass as `after` for the next page.
    pub next_after: Option<i64>,
}

/// One leg of a journal entry.
#[derive(Serialize, ToSchema)]
pub struct Leg {
    pub account: String,
    pub currency: String,
    pub amount_minor: i64,
}

/// A journal entry: its legs sum to zero per currency.
#[derive(Serialize, ToSchema)]
pub struct JournalEntry {
    pub entry_id: String,
    pub tenant: String,
    pub position: i64,
    pub reverses: Option<String>,
    pub legs: Vec<Leg>,
    pub recorded_at: String,
    /// The stream whose event posted it: `payment-pay_…`, `transfer-tr_…`, `payout-…`.
    pub source: String,
    /// What the merchant wrote of the transfer it posts, if anything.
    pub description: Option<String>,
}

/// A difference between our ledger and a provider's, found by reconciliation.
#[derive(Serialize, ToSchema)]
pub struct ReconciliationException {
    pub id: String,
    pub payment_id: Option<String>,
    /// `refunded_out_of_band`, `amount_mismatch`, `unknown_charge` … (docs/reconciliation.md).
    pub kind: String,
    #[schema(value_type = Object)]
    pub local: serde_json::Value,
    #[schema(value_type = Object)]
    pub provider: serde_json::Value,
    #[schema(value_type = Object)]
    pub difference: serde_json::Value,
    /// `auto` (fixed by the sweep) or `manual` (needs a person).
    pub resolution: String,
    /// `open` or `resolved`.
    pub status: String,
    pub note: Option<String>,
}

/// A merchant event: what happened, and the object as it stood then (docs/API.md "Events").
#[derive(Serialize, ToSchema)]
pub struct MerchantEvent {
    /// `evt_…`, the same on every delivery and in the feed: dedup by it.
    pub id: String,
    /// Always `event`.
    pub object: String,
    /// `payment.captured`, `payment.refunded`, `transfer.posted`, `exception.opened` …
    #[serde(rename = "type")]
    pub kind: String,
    /// When the log recorded it (RFC 3339, UTC).
    pub created: String,
    /// The log position of the event it was derived from.
    pub position: i64,
    /// `object`: the payment, transfer or exception as the API renders it at that position (a
    /// payment lists its latest 10 operations, `operations_total` says how many it has);
    /// `operation`: the capture, refund or cancel the event is about, where there is one.
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// A page of the feed, in log order.
#[derive(Serialize, ToSchema)]
pub struct EventPage {
    pub data: Vec<MerchantEvent>,
    /// Pass as `after` to read on (the same cursor again when the page is empty).
    pub next_cursor: String,
    pub has_more: bool,
}

/// `POST /v1/webhook_endpoints`.
#[derive(Serialize, ToSchema)]
pub struct CreateWebhookEndpoint {
    /// `https://…` (`http` only to hosts the operator allows); never a private, loopback or
    /// link-local address.
    pub url: String,
    /// Event types (docs/API.md "Events"), or `["*"]` for every type.
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
}

/// `POST /v1/webhook_endpoints/{id}/rotate_secret`.
#[derive(Serialize, ToSchema)]
pub struct RotateSecret {
    /// How long the previous secret stays valid (0 to 604800 s; default 86400).
    pub expire_previous_in_s: Option<i64>,
}

/// A webhook endpoint.
#[derive(Serialize, ToSchema)]
pub struct WebhookEndpoint {
    /// `we_…`
    pub id: String,
    pub object: String,
    pub url: String,
    pub enabled_events: Vec<String>,
    pub description: Option<String>,
    /// `enabled` or `disabled` (after three days in which every delivery failed).
    pub status: String,
    pub disabled_reason: Option<String>,
    pub created_at: String,
    /// The signing secret: only in the answers to registration and rotation.
    pub secret: Option<String>,
}

/// The tenant's webhook endpoints.
#[derive(Serialize, ToSchema)]
pub struct WebhookEndpointList {
    pub data: Vec<WebhookEndpoint>,
}

/// `POST /v1/balance_monitors`: tell `balance.threshold_crossed` when an entry takes the field
/// from not matching `condition amount_minor` to matching it.
#[derive(Serialize, ToSchema)]
pub struct CreateBalanceMonitor {
    /// A client account (not a system account).
    pub account: String,
    pub currency: String,
    /// `available`, `posted`, `pending_debits` or `pending_credits`.
    pub field: String,
    /// `lt`, `lte`, `gt` or `gte`.
    pub condition: String,
    /// The threshold in minor units, of either sign.
    pub amount_minor: i64,
    pub description: Option<String>,
}

/// A balance monitor.
#[derive(Serialize, ToSchema)]
pub struct BalanceMonitor {
    /// `bm_…`
    pub id: String,
    pub object: String,
    pub account: String,
    pub currency: String,
    pub field: String,
    pub condition: String,
    pub amount_minor: i64,
    pub description: Option<String>,
    /// `active` or `deleted`.
    pub status: String,
    pub created_at: String,
    pub deleted_at: Option<String>,
    /// The position of the monitor's last event (absent in a list).
    pub position: Option<i64>,
    /// In a list: whether the condition holds as of the projection's checkpoint.
    pub matching: Option<bool>,
}

/// A page of the tenant's balance monitors.
#[derive(Serialize, ToSchema)]
pub struct BalanceMonitorList {
    pub object: String,
    pub data: Vec<BalanceMonitor>,
    /// The `after` of the next page, or null on the last one.
    pub next_after: Option<String>,
}

/// `POST /v1/reconciliation/exceptions/{id}/resolve`.
#[derive(Serialize, ToSchema)]
pub struct ResolveRequest {
    pub note: String,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "asiento", description = "A payments ledger that never moves money twice."),
    paths(
        crate::commands::create_payment,
        crate::queries::list_payments,
        crate::queries::get_payment,
        crate::queries::payment_events,
        crate::commands::capture_payment,
        crate::commands::cancel_payment,
        crate::commands::refund_payment,
        crate::commands::create_transfer,
        crate::commands::create_transfer_batch,
        crate::queries::get_transfer,
        crate::transfer_list::list,
        crate::commands::post_hold,
        crate::commands::void_hold,
        crate::accounts::declare,
        crate::accounts::list,
        crate::ledger::balance,
        crate::ledger::entries,
        crate::statement::statement,
        crate::ledger::journal_entry,
        crate::journal::list,
        crate::balance_monitors::create,
        crate::balance_monitors::list,
        crate::balance_monitors::get,
        crate::balance_monitors::delete,
        crate::exceptions::list,
        crate::exceptions::resolve,
        crate::events::list,
        crate::events::get,
        crate::webhook_endpoints::create,
        crate::webhook_endpoints::list,
        crate::webhook_endpoints::get,
        crate::webhook_endpoints::delete,
        crate::webhook_endpoints::rotate_secret,
        crate::webhook_endpoints::enable,
        crate::webhook_endpoints::list_deliveries,
        crate::webhook_endpoints::retry_delivery,
    ),
    modifiers(&BearerAuth),
    security(("bearer" = [])),
)]
pub struct ApiDoc;

/// What one deployment accepts beyond the code's own rules: the providers a payment may name,
/// and the largest amount one request may carry (`serve --amount-max`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Empty: any well-formed name (the document of a process that has no providers).
    pub providers: Vec<String>,
    pub amount_max: i64,
}

impl Default for Deployment {
    fn default() -> Self {
        Deployment {
            providers: Vec::new(),
            amount_max: asiento_domain::AMOUNT_MAX_DEFAULT,
        }
    }
}

impl Deployment {
    /// The deployment an API process serves.
    #[must_use]
    pub fn of(state: &AppState) -> Self {
        Deployment {
            providers: state
                .payments
                .providers()
                .names()
                .map(|name| name.as_str().to_owned())
                .collect(),
            amount_max: state.amount_limit.max().minor(),
        }
    }
}

/// The whole document for a deployment: utoipa's, with the edge's rules and the links.
#[must_use]
pub fn document_for(deployment: &Deployment) -> serde_json::Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).expect("the document is JSON");
    rules::apply(&mut doc, deployment);
    links::apply(&mut doc);
    doc
}

/// `GET /openapi.json` of an API process: with its providers and amount limit.
pub async fn deployment_document(State(state): State<AppState>) -> impl IntoResponse {
    Json(document_for(&Deployment::of(&state)))
}

/// `GET /openapi.json` of a process without the API: the defaults.
pub async fn document() -> impl IntoResponse {
    Json(document_for(&Deployment::default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_properties(doc: &serde_json::Value, name: &str) -> Vec<String> {
        let mut keys: Vec<String> = doc["components"]["schemas"][name]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("schema {name} is missing"))
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    #[test]
    fn every_v1_route_is_documented() {
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("json");
        let mut paths: Vec<&str> = doc["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .map(String::as_str)
            .collect();
        paths.sort_unstable();
        assert_eq!(
            paths,
            [
                "/v1/accounts",
                "/v1/accounts/{account}/balance",
                "/v1/accounts/{account}/entries",
                "/v1/accounts/{account}/statement",
                "/v1/balance_monitors",
                "/v1/balance_monitors/{id}",
                "/v1/events",
                "/v1/events/{id}",
                "/v1/journal",
                "/v1/journal/{entry_id}",
                "/v1/payments",
                "/v1/payments/{id}",
                "/v1/payments/{id}/cancel",
                "/v1/payments/{id}/capture",
                "/v1/payments/{id}/events",
                "/v1/payments/{id}/refunds",
                "/v1/reconciliation/exceptions",
                "/v1/reconciliation/exceptions/{id}/resolve",
                "/v1/transfers",
                "/v1/transfers/batch",
                "/v1/transfers/{id}",
                "/v1/transfers/{id}/post",
                "/v1/transfers/{id}/void",
                "/v1/webhook_endpoints",
                "/v1/webhook_endpoints/{id}",
                "/v1/webhook_endpoints/{id}/deliveries",
                "/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry",
                "/v1/webhook_endpoints/{id}/enable",
                "/v1/webhook_endpoints/{id}/rotate_secret",
            ]
        );
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    /// Every operation may be refused 429 with `Retry-After`, and every answer names the
    /// rate-limit fields, which the components describe.
    #[test]
    fn every_operation_documents_its_rate_limit() {
        let doc = document_for(&Deployment::default());
        for name in ["RateLimit-Policy", "RateLimit", "Retry-After"] {
            assert!(
                doc["components"]["headers"][name]["schema"].is_object(),
                "{name}"
            );
        }
        let mut operations = 0;
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("item") {
                operations += 1;
                let responses = operation["responses"].as_object().expect("responses");
                let limited = &responses["429"];
                assert_eq!(
                    limited["headers"]["Retry-After"]["$ref"], "#/components/headers/Retry-After",
                    "{method} {path}"
                );
                for (status, response) in responses {
                    assert!(
                        response["headers"]["RateLimit"].is_object()
                            && response["headers"]["RateLimit-Policy"].is_object(),
                        "{method} {path} {status}"
                    );
                }
            }
        }
        assert!(operations > 30);
    }

    /// Every rule and link lands where it is meant to (a misplaced one fails a debug assertion),
    /// operation ids are unique, and every link names an operation and parameters it has.
    #[test]
    fn rules_and_links_name_what_exists() {
        let doc = document_for(&Deployment {
            providers: vec!["sim".to_owned()],
            amount_max: 500,
        });
        let mut operations = std::collections::BTreeMap::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("path item") {
                let id = operation["operationId"].as_str().expect("an operationId");
                let parameters: Vec<String> = operation["parameters"]
                    .as_array()
                    .map(|all| {
                        all.iter()
                            .filter_map(|p| p["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                let previous = operations.insert(id.to_owned(), (path, method, parameters));
                assert!(previous.is_none(), "operationId {id} twice");
            }
        }
        let mut count = 0;
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for operation in item.as_object().expect("path item").values() {
                for response in operation["responses"]
                    .as_object()
                    .expect("responses")
                    .values()
                {
                    let Some(links) = response["links"].as_object() else {
                        continue;
                    };
                    for (name, link) in links {
                        count += 1;
                        let target = link["operationId"].as_str().expect("operationId");
                        let (_, _, parameters) = operations
                            .get(target)
                            .unwrap_or_else(|| panic!("{path} {name}: no operation {target}"));
                        for parameter in link["parameters"].as_object().expect("parameters").keys()
                        {
                            assert!(
                                parameters.contains(parameter),
                                "{path} {name}: {target} has no parameter {parameter}"
                            );
                        }
                    }
                }
            }
        }
        assert!(count >= 20, "{count} links");
        let amount = &doc["components"]["schemas"]["RefundRequest"]["properties"]["amount_minor"];
        assert_eq!(
            (amount["minimum"].as_i64(), amount["maximum"].as_i64()),
            (Some(1), Some(500))
        );
        let provider =
            &doc["components"]["schemas"]["CreatePaymentRequest"]["properties"]["provider"];
        assert_eq!(provider["enum"], serde_json::json!(["sim", null]));
        let keys = doc["paths"]
            .as_object()
            .expect("paths")
            .values()
            .flat_map(|item| item.as_object().expect("item").values())
            .filter_map(|operation| operation["parameters"].as_array())
            .flatten()
            .filter(|parameter| parameter["name"] == "Idempotency-Key")
            .inspect(|parameter| assert!(parameter["schema"]["pattern"].is_string()))
            .count();
        assert_eq!(keys, 12);
    }

    /// The account patterns are anchored, and flat: one alternation, not a group per character of
    /// the words they leave out (deep nesting makes regex tools recurse deeply).
    #[test]
    fn the_account_patterns_are_anchored_and_flat() {
        let client = patterns::client_account();
        let any = patterns::any_account();
        assert!(client.starts_with('^') && client.ends_with('$'));
        assert!(any.contains("pending_debits") && any.contains("pending_credits"));
        assert!(!client.contains("(?:(?:(?:"), "flat enough: {client}");
    }

    /// The documented payment is exactly what the renderer writes.
    #[test]
    fn the_payment_schema_matches_the_rendered_payment() {
        use asiento_domain::*;
        let at = chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("time");
        let create = CreatePayment {
            id: PaymentId::from_uuid(uuid::Uuid::from_u128(1)),
            tenant: TenantId::parse("acme").expect("tenant"),
            amount: Amount::new(100),
            currency: Currency::parse("USD").expect("currency"),
            customer: CustomerId::parse("42").expect("customer"),
            provider: ProviderName::parse("sim").expect("provider"),
            capture_mode: CaptureMode::Automatic,
            description: None,
            metadata: serde_json::Map::new(),
            payment_method: None,
            at,
        };
        let events =
            decide_payment(&Payment::default(), PaymentCommand::Create(create)).expect("create");
        let payment = events.iter().fold(Payment::default(), evolve_payment);
        let rendered = crate::render::payment_json(payment.record.as_ref().expect("record"), 1);
        let mut keys: Vec<String> = rendered
            .as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("json");
        assert_eq!(keys, schema_properties(&doc, "Payment"));
    }

    /// The documented transfer is exactly what the renderer writes.
    #[test]
    fn the_transfer_schema_matches_the_rendered_transfer() {
        use asiento_domain::*;
        let request = RequestTransfer {
            id: TransferId::from_uuid(uuid::Uuid::from_u128(1)),
            tenant: TenantId::parse("acme").expect("tenant"),
            from: AccountName::parse("customer:1:available").expect("account"),
            to: AccountName::parse("merchant:2").expect("account"),
            amount: Amount::new(100),
            currency: Currency::parse("USD").expect("currency"),
            description: None,
            pending: true,
            expires_at: None,
            at: chrono::DateTime::from_timestamp(1_764_000_000, 0).expect("time"),
        };
        let events = transfer::decide(&Transfer::default(), request).expect("decided");
        let record = events
            .iter()
            .fold(Transfer::default(), transfer::evolve)
            .record
            .expect("record");
        let rendered = crate::render::transfer_json(&record, 1);
        let mut keys: Vec<String> = rendered
            .as_object()
            .expect("object")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        let doc = serde_json::to_value(ApiDoc::openapi()).expect("json");
        assert_eq!(keys, schema_properties(&doc, "Transfer"));
    }
}
