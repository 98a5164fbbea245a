//! What the edge enforces, written into the document: for each request field and parameter, the
//! pattern, bounds, enum or format that its parser at the edge (or the domain rule behind it)
//! applies, taken from the same constants. A client generated from the document then sends what
//! the server takes; what no JSON Schema can say (a name that must resolve, two accounts that
//! must differ, a time that must be in the future, a position the log must have) is said in the
//! field's description.
//!
//! The rules are applied to the JSON of the generated document, after utoipa wrote it, so that
//! the ones that depend on the deployment (its providers, its amount limit) and the ones built
//! from lists (currencies, statuses, event types) stay next to the rest.

use asiento_domain::exception::NOTE_CHARS_MAX;
use asiento_domain::monitor::{
    BalanceField, Condition, DESCRIPTION_CHARS_MAX as MONITOR_DESCRIPTION_CHARS_MAX,
};
use asiento_domain::payment::{DESCRIPTION_CHARS_MAX, METADATA_BYTES_MAX, METADATA_KEYS_MAX};
use asiento_domain::PaymentStatus;
use asiento_merchant_events::{EventKind, MONITORS_LIMIT_MAX, PAGE_LIMIT_MAX};
use asiento_outbound::endpoints::{
    DESCRIPTION_CHARS_MAX as ENDPOINT_DESCRIPTION_CHARS_MAX, EVERY_TYPE, PREVIOUS_SECRET_S_MAX,
};
use asiento_outbound::url_policy::URL_CHARS_MAX;
use serde_json::{json, Map, Value};

use super::patterns;
use super::Deployment;
use crate::commands::PAYMENT_METHOD_CHARS_MAX;

/// The request bodies: each is read field by field and refuses a field it does not know.
const REQUEST_BODIES: [&str; 12] = [
    "CreatePaymentRequest",
    "CaptureRequest",
    "CancelRequest",
    "RefundRequest",
    "TransferRequest",
    "TransferBatchRequest",
    "PostHoldRequest",
    "DeclareAccountRequest",
    "CreateBalanceMonitor",
    "CreateWebhookEndpoint",
    "RotateSecret",
    "ResolveRequest",
];

/// Applies every rule to `doc`, the JSON of [`super::ApiDoc`].
pub fn apply(doc: &mut Value, deployment: &Deployment) {
    let rules = Rules::new(deployment);
    set(
        doc,
        "/components/schemas/JsonWithoutNul",
        json_without_nul(),
    );
    for name in REQUEST_BODIES {
        set(
            doc,
            &format!("/components/schemas/{name}/additionalProperties"),
            json!(false),
        );
    }
    rules.payments(doc);
    rules.ledger(doc);
    rules.monitors(doc);
    rules.webhooks(doc);
    rules.reconciliation(doc);
    rules.events(doc);
    rules.idempotency_keys(doc);
    refusals(doc);
}

/// The refusals every handler of a kind can answer, where its annotation does not name them: 401
/// and 429 (every `/v1` route), 400 (a route with a body, a key or a query), 413 (a body), and
/// 409 and 422 (a key still in flight, or reused with another body). Every answer of a `/v1`
/// route may carry the rate-limit fields (`serve --rate-limit`); a 429 carries them and
/// `Retry-After`.
fn refusals(doc: &mut Value) {
    rate_limit_headers(doc);
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for operation in paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(Value::as_object_mut)
    {
        let names: Vec<(String, String)> = operation
            .get("parameters")
            .and_then(Value::as_array)
            .map(|all| {
                all.iter()
                    .filter_map(|p| {
                        Some((p["in"].as_str()?.to_owned(), p["name"].as_str()?.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let body = operation.contains_key("requestBody");
        let key = names.iter().any(|(_, name)| name == "Idempotency-Key");
        let query = names.iter().any(|(place, _)| place == "query");
        let mut wanted = vec![
            ("401", "Missing or unknown API key"),
            (
                "429",
                "rate_limited: the key's, its tenant's or the address's bucket is spent \
                 (`serve --rate-limit`); retry after `Retry-After` seconds",
            ),
        ];
        if body || key || query {
            wanted.push(("400", "Invalid body, key or query: its `code` says which"));
        }
        if body {
            wanted.push(("413", "Body too large"));
        }
        if key {
            wanted.push(("409", "The key's first request is still in flight"));
            wanted.push(("422", "The key was used with another body"));
        }
        let Some(responses) = operation
            .get_mut("responses")
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for (status, description) in wanted {
            responses.entry(status).or_insert_with(|| {
                json!({
                    "description": description,
                    "content": {"application/problem+json": {
                        "schema": {"$ref": "#/components/schemas/ProblemDetails"},
                    }},
                })
            });
        }
        for (status, response) in responses.iter_mut() {
            let Some(response) = response.as_object_mut() else {
                continue;
            };
            let headers = response
                .entry("headers")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            let Some(headers) = headers else {
                continue;
            };
            for name in ["RateLimit-Policy", "RateLimit"] {
                headers.insert(
                    name.to_owned(),
                    json!({"$ref": format!("#/components/headers/{name}")}),
                );
            }
            if status == "429" {
                headers.insert(
                    "Retry-After".to_owned(),
                    json!({"$ref": "#/components/headers/Retry-After"}),
                );
            }
        }
    }
}

/// The rate-limit fields of draft-ietf-httpapi-ratelimit-headers, as the limiter sends them.
fn rate_limit_headers(doc: &mut Value) {
    let Some(components) = doc.get_mut("components").and_then(Value::as_object_mut) else {
        return;
    };
    components.insert(
        "headers".to_owned(),
        json!({
            "RateLimit-Policy": {
                "description": "One item per bucket the request drew on: `\"key\";q=<burst>;w=<seconds a spent bucket takes to fill>`, and `\"tenant\"` (or `\"address\"` without a known key). Sent when the server runs with `--rate-limit`.",
                "schema": {"type": "string"},
            },
            "RateLimit": {
                "description": "What each bucket has left: `\"key\";r=<requests left>;t=<seconds until it is full>`; the refusing bucket of a 429 says `r=0;t=<Retry-After>`.",
                "schema": {"type": "string"},
            },
            "Retry-After": {
                "description": "Seconds until the request may be sent again.",
                "schema": {"type": "integer", "minimum": 1},
            },
        }),
    );
}

struct Rules {
    currencies: Vec<&'static str>,
    amount_max: i64,
    providers: Vec<String>,
}

impl Rules {
    fn new(deployment: &Deployment) -> Self {
        Rules {
            currencies: asiento_domain::money::CURRENCIES
                .iter()
                .map(|(code, _)| *code)
                .collect(),
            amount_max: deployment.amount_max,
            providers: deployment.providers.clone(),
        }
    }

    /// A positive integer count of minor units, at most the deployment's limit.
    fn amount(&self, nullable: bool) -> Value {
        json!({
            "type": if nullable { json!(["integer", "null"]) } else { json!("integer") },
            "format": "int64",
            "minimum": 1,
            "maximum": self.amount_max,
            "description": "A JSON integer literal (`100`; not `100.0`, `1e2` or `\"100\"`: \
                            400 `amount_must_be_integer`).",
        })
    }

    fn currency(&self) -> Value {
        json!({"type": "string", "enum": self.currencies})
    }

    fn payments(&self, doc: &mut Value) {
        let body = "CreatePaymentRequest";
        property(doc, body, "amount_minor", self.amount(false));
        property(doc, body, "currency", self.currency());
        property(
            doc,
            body,
            "customer",
            json!({"type": "string", "pattern": patterns::name()}),
        );
        let provider = if self.providers.is_empty() {
            json!({"type": ["string", "null"], "pattern": patterns::name()})
        } else {
            let mut names: Vec<Value> = self.providers.iter().map(|p| json!(p)).collect();
            names.push(Value::Null);
            json!({"enum": names})
        };
        property(doc, body, "provider", provider);
        property(
            doc,
            body,
            "payment_method",
            json!({
                "type": "string",
                "minLength": 1,
                "maxLength": PAYMENT_METHOD_CHARS_MAX,
                "pattern": patterns::NO_NUL,
                "examples": ["pm_card_ok", "pm_card_declined", "pm_redirect"],
            }),
        );
        property(
            doc,
            body,
            "capture",
            json!({"enum": ["automatic", "manual", null]}),
        );
        property(doc, body, "description", text(DESCRIPTION_CHARS_MAX));
        property(doc, body, "metadata", metadata());
        property(doc, "CaptureRequest", "amount_minor", self.amount(true));
        property(doc, "RefundRequest", "amount_minor", self.amount(false));

        let payment = "/v1/payments/{id}";
        for (path, method) in [
            (payment, "get"),
            ("/v1/payments/{id}/events", "get"),
            ("/v1/payments/{id}/capture", "post"),
            ("/v1/payments/{id}/cancel", "post"),
            ("/v1/payments/{id}/refunds", "post"),
        ] {
            parameter(doc, path, method, "id", id("pay_"));
        }
        let list = ("/v1/payments", "get");
        let statuses: Vec<&str> = PaymentStatus::ALL.iter().map(|s| s.as_str()).collect();
        parameter(
            doc,
            list.0,
            list.1,
            "status",
            json!({"type": "string", "enum": statuses}),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "customer",
            json!({"type": "string", "pattern": patterns::name()}),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "provider",
            json!({"type": "string", "pattern": patterns::name()}),
        );
        for name in ["created_gte", "created_lt", "updated_gte", "updated_lt"] {
            parameter(doc, list.0, list.1, name, date_time());
        }
        for name in ["amount_gte", "amount_lte"] {
            parameter(doc, list.0, list.1, name, position());
        }
        parameter(
            doc,
            list.0,
            list.1,
            "metadata",
            json!({
                "type": "object",
                "maxProperties": asiento_payments_view::METADATA_FILTERS_MAX,
                "propertyNames": {"minLength": 1, "maxLength": 255, "pattern": patterns::NO_NUL},
                "additionalProperties": {"type": "string", "pattern": patterns::NO_NUL},
            }),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "limit",
            limit(asiento_payments_view::LIST_LIMIT_MAX.into()),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "cursor",
            json!({"type": "string", "pattern": patterns::KEYSET_CURSOR}),
        );
        parameter(doc, list.0, list.1, "min_position", position());
        note_position(doc, list.0, list.1, "min_position");
    }

    fn ledger(&self, doc: &mut Value) {
        let client = json!({"type": "string", "pattern": patterns::client_account()});
        let body = "TransferRequest";
        property(
            doc,
            body,
            "from",
            described(client.clone(), "Not the same account as `to`."),
        );
        property(
            doc,
            body,
            "to",
            described(client.clone(), "Not the same account as `from`."),
        );
        property(doc, body, "amount_minor", self.amount(false));
        property(doc, body, "currency", self.currency());
        property(doc, body, "description", text(DESCRIPTION_CHARS_MAX));
        property(
            doc,
            body,
            "expires_at",
            json!({"type": ["string", "null"], "format": "date-time"}),
        );
        // `expires_at` is for a hold only: absent or null, or `pending` is true.
        set(
            doc,
            &format!("/components/schemas/{body}/anyOf"),
            json!([
                {"properties": {"expires_at": {"type": "null"}}},
                {"required": ["pending"], "properties": {"pending": {"const": true}}},
            ]),
        );
        property(doc, "PostHoldRequest", "amount_minor", self.amount(true));
        for (path, method) in [
            ("/v1/transfers/{id}", "get"),
            ("/v1/transfers/{id}/post", "post"),
            ("/v1/transfers/{id}/void", "post"),
        ] {
            parameter(doc, path, method, "id", id("tr_"));
        }
        property(
            doc,
            "TransferBatchRequest",
            "transfers",
            json!({
                "type": "array",
                "minItems": 1,
                "maxItems": asiento_domain::transfer_batch::BATCH_TRANSFERS_MAX,
                "items": {"$ref": "#/components/schemas/TransferRequest"},
            }),
        );
        let transfers = ("/v1/transfers", "get");
        parameter(
            doc,
            transfers.0,
            transfers.1,
            "account",
            json!({"type": "string", "pattern": patterns::any_account()}),
        );
        parameter(
            doc,
            transfers.0,
            transfers.1,
            "status",
            json!({"type": "string", "enum": ["pending", "posted", "voided", "expired"]}),
        );
        for name in ["created_gte", "created_lt"] {
            parameter(doc, transfers.0, transfers.1, name, date_time());
        }
        parameter(
            doc,
            transfers.0,
            transfers.1,
            "limit",
            limit(asiento_transfer_list::LIST_LIMIT_MAX.into()),
        );
        parameter(
            doc,
            transfers.0,
            transfers.1,
            "cursor",
            json!({"type": "string", "pattern": patterns::KEYSET_CURSOR}),
        );
        parameter(doc, transfers.0, transfers.1, "min_position", position());
        note_position(doc, transfers.0, transfers.1, "min_position");

        let body = "DeclareAccountRequest";
        property(doc, body, "account", client);
        property(doc, body, "currency", self.currency());
        property(
            doc,
            body,
            "normal_balance",
            json!({"enum": ["credit", "debit", null]}),
        );
        property(
            doc,
            body,
            "overdraft",
            json!({"oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["policy"],
                    "properties": {"policy": {"type": "string", "enum": ["forbidden", "allowed"]}},
                },
                {
                    "type": "object",
                    "additionalProperties": false,
                    "required": ["policy", "limit_minor"],
                    "properties": {
                        "policy": {"type": "string", "const": "limit"},
                        "limit_minor": self.amount(false),
                    },
                },
            ]}),
        );
        property(doc, body, "metadata", metadata());

        let list = ("/v1/accounts", "get");
        parameter(
            doc,
            list.0,
            list.1,
            "prefix",
            json!({"type": "string", "pattern": patterns::account_prefix()}),
        );
        parameter(doc, list.0, list.1, "currency", self.currency());
        parameter(
            doc,
            list.0,
            list.1,
            "after",
            json!({"type": "string", "pattern": patterns::accounts_after(&self.currencies)}),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "limit",
            limit(asiento_balances::ACCOUNTS_LIMIT_MAX as u64),
        );

        let account = json!({"type": "string", "pattern": patterns::any_account()});
        let balance = ("/v1/accounts/{account}/balance", "get");
        parameter(doc, balance.0, balance.1, "account", account.clone());
        parameter(doc, balance.0, balance.1, "currency", self.currency());
        parameter(doc, balance.0, balance.1, "min_position", position());
        note_position(doc, balance.0, balance.1, "min_position");
        parameter(doc, balance.0, balance.1, "at_position", position());
        note_position(doc, balance.0, balance.1, "at_position");
        parameter(doc, balance.0, balance.1, "at", date_time());
        let statement = ("/v1/accounts/{account}/statement", "get");
        parameter(doc, statement.0, statement.1, "account", account.clone());
        parameter(doc, statement.0, statement.1, "currency", self.currency());
        parameter(doc, statement.0, statement.1, "from", date_time());
        parameter(doc, statement.0, statement.1, "to", date_time());
        for name in ["to_position", "after"] {
            parameter(doc, statement.0, statement.1, name, position());
            note_position(doc, statement.0, statement.1, name);
        }
        parameter(
            doc,
            statement.0,
            statement.1,
            "limit",
            limit(asiento_balances::ENTRIES_LIMIT_MAX as u64),
        );
        let entries = ("/v1/accounts/{account}/entries", "get");
        parameter(doc, entries.0, entries.1, "account", account);
        parameter(doc, entries.0, entries.1, "currency", self.currency());
        parameter(doc, entries.0, entries.1, "after", position());
        note_position(doc, entries.0, entries.1, "after");
        parameter(
            doc,
            entries.0,
            entries.1,
            "limit",
            limit(asiento_balances::ENTRIES_LIMIT_MAX as u64),
        );
        parameter(doc, entries.0, entries.1, "min_position", position());
        note_position(doc, entries.0, entries.1, "min_position");
        let period = ("/v1/journal", "get");
        parameter(doc, period.0, period.1, "from", date_time());
        parameter(doc, period.0, period.1, "to", date_time());
        parameter(
            doc,
            period.0,
            period.1,
            "after",
            json!({"type": "string", "pattern": "^-?[0-9]{1,18}\\.-?[0-9]{1,18}\\.-?[0-9]{1,18}$"}),
        );
        parameter(
            doc,
            period.0,
            period.1,
            "limit",
            limit(asiento_balances::JOURNAL_LIMIT_MAX as u64),
        );
        let journal = ("/v1/journal/{entry_id}", "get");
        parameter(doc, journal.0, journal.1, "entry_id", id("je_"));
        parameter(doc, journal.0, journal.1, "min_position", position());
        note_position(doc, journal.0, journal.1, "min_position");
    }

    fn monitors(&self, doc: &mut Value) {
        let body = "CreateBalanceMonitor";
        let client = json!({"type": "string", "pattern": patterns::client_account()});
        property(doc, body, "account", client);
        property(doc, body, "currency", self.currency());
        property(
            doc,
            body,
            "field",
            json!({"type": "string", "enum": BalanceField::ALL.map(BalanceField::as_str)}),
        );
        property(
            doc,
            body,
            "condition",
            json!({"type": "string", "enum": Condition::ALL.map(Condition::as_str)}),
        );
        property(
            doc,
            body,
            "amount_minor",
            json!({
                "type": "integer",
                "format": "int64",
                "minimum": -self.amount_max,
                "maximum": self.amount_max,
                "description": "A JSON integer literal, at most the deployment's amount limit \
                                from zero (422 `amount_too_large`).",
            }),
        );
        property(
            doc,
            body,
            "description",
            text(MONITOR_DESCRIPTION_CHARS_MAX),
        );
        for method in ["get", "delete"] {
            parameter(doc, "/v1/balance_monitors/{id}", method, "id", id("bm_"));
        }
        let list = ("/v1/balance_monitors", "get");
        parameter(
            doc,
            list.0,
            list.1,
            "account",
            json!({"type": "string", "pattern": patterns::any_account()}),
        );
        parameter(doc, list.0, list.1, "currency", self.currency());
        parameter(doc, list.0, list.1, "after", id("bm_"));
        parameter(
            doc,
            list.0,
            list.1,
            "limit",
            limit(u64::from(MONITORS_LIMIT_MAX)),
        );
        parameter(doc, list.0, list.1, "min_position", position());
        note_position(doc, list.0, list.1, "min_position");
    }

    fn webhooks(&self, doc: &mut Value) {
        let body = "CreateWebhookEndpoint";
        property(
            doc,
            body,
            "url",
            json!({
                "type": "string",
                "maxLength": URL_CHARS_MAX,
                "pattern": patterns::webhook_url(),
                "description": "Its host must resolve, and only to addresses a webhook may reach \
                                (422 `webhook_url_refused`).",
            }),
        );
        property(
            doc,
            body,
            "enabled_events",
            json!({"anyOf": [
                {"type": "array", "minItems": 1, "items": {"type": "string", "enum": event_types()}},
                {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "const": EVERY_TYPE}},
            ]}),
        );
        property(
            doc,
            body,
            "description",
            text(ENDPOINT_DESCRIPTION_CHARS_MAX),
        );
        property(
            doc,
            "RotateSecret",
            "expire_previous_in_s",
            json!({"type": ["integer", "null"], "minimum": 0, "maximum": PREVIOUS_SECRET_S_MAX}),
        );
        for (path, method) in [
            ("/v1/webhook_endpoints/{id}", "get"),
            ("/v1/webhook_endpoints/{id}", "delete"),
            ("/v1/webhook_endpoints/{id}/rotate_secret", "post"),
            ("/v1/webhook_endpoints/{id}/enable", "post"),
            ("/v1/webhook_endpoints/{id}/deliveries", "get"),
            (
                "/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry",
                "post",
            ),
        ] {
            parameter(doc, path, method, "id", id("we_"));
        }
        parameter(
            doc,
            "/v1/webhook_endpoints/{id}/deliveries/{delivery_id}/retry",
            "post",
            "delivery_id",
            id("wd_"),
        );
    }

    fn reconciliation(&self, doc: &mut Value) {
        property(
            doc,
            "ResolveRequest",
            "note",
            json!({"type": "string", "minLength": 1, "maxLength": NOTE_CHARS_MAX, "pattern": patterns::not_blank()}),
        );
        let list = ("/v1/reconciliation/exceptions", "get");
        parameter(
            doc,
            list.0,
            list.1,
            "status",
            json!({"type": "string", "enum": ["open", "resolved"]}),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "limit",
            limit(asiento_app::exceptions::EXCEPTIONS_PAGE_MAX.unsigned_abs()),
        );
        parameter(
            doc,
            "/v1/reconciliation/exceptions/{id}/resolve",
            "post",
            "id",
            id("exc_"),
        );
    }

    fn events(&self, doc: &mut Value) {
        let list = ("/v1/events", "get");
        parameter(
            doc,
            list.0,
            list.1,
            "after",
            json!({"type": "string", "pattern": patterns::FEED_CURSOR}),
        );
        parameter(
            doc,
            list.0,
            list.1,
            "type",
            json!({"type": "array", "items": {"type": "string", "enum": event_types()}}),
        );
        // `type=a,b`: one parameter, its values joined by commas.
        if let Some(parameter) = find_parameter(doc, list.0, list.1, "type") {
            parameter.insert("style".to_owned(), json!("form"));
            parameter.insert("explode".to_owned(), json!(false));
        }
        parameter(doc, list.0, list.1, "limit", limit(PAGE_LIMIT_MAX.into()));
        parameter(doc, "/v1/events/{id}", "get", "id", id("evt_"));
    }

    /// Every `Idempotency-Key` header parameter.
    fn idempotency_keys(&self, doc: &mut Value) {
        let key = json!({
            "type": "string",
            "minLength": 1,
            "maxLength": asiento_app::idempotency::KEY_LENGTH_MAX,
            "pattern": patterns::idempotency_key(asiento_app::idempotency::KEY_LENGTH_MAX),
        });
        let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
            return;
        };
        for operation in paths
            .values_mut()
            .filter_map(Value::as_object_mut)
            .flat_map(|item| item.values_mut())
        {
            let Some(parameters) = operation
                .get_mut("parameters")
                .and_then(Value::as_array_mut)
            else {
                continue;
            };
            for parameter in parameters.iter_mut().filter_map(Value::as_object_mut) {
                if parameter.get("name") == Some(&json!("Idempotency-Key")) {
                    parameter.insert("schema".to_owned(), key.clone());
                    append(
                        parameter,
                        "One key per request: the same key with the same body replays the first \
                         answer, with another body it is 422 `idempotency_key_reused`.",
                    );
                }
            }
        }
    }
}

fn event_types() -> Vec<&'static str> {
    EventKind::ALL.iter().map(|kind| kind.as_str()).collect()
}

fn id(prefix: &str) -> Value {
    json!({"type": "string", "pattern": patterns::prefixed_id(prefix)})
}

fn limit(max: u64) -> Value {
    json!({"type": "integer", "minimum": 1, "maximum": max})
}

/// A `min_position`: 0, or a position the log has (one a command returned).
fn date_time() -> Value {
    json!({"type": "string", "format": "date-time"})
}

fn position() -> Value {
    json!({"type": "integer", "format": "int64", "minimum": 0, "maximum": i64::MAX})
}

fn text(length_max: usize) -> Value {
    json!({"type": ["string", "null"], "maxLength": length_max, "pattern": patterns::NO_NUL})
}

fn metadata() -> Value {
    json!({
        "type": ["object", "null"],
        "maxProperties": METADATA_KEYS_MAX,
        "propertyNames": {"pattern": patterns::NO_NUL},
        "additionalProperties": {"$ref": "#/components/schemas/JsonWithoutNul"},
        "description": format!(
            "At most {METADATA_KEYS_MAX} keys and {METADATA_BYTES_MAX} bytes of JSON."
        ),
    })
}

/// Any JSON value whose strings and keys hold no U+0000 (NUL).
fn json_without_nul() -> Value {
    let itself = json!({"$ref": "#/components/schemas/JsonWithoutNul"});
    json!({
        "description": "Any JSON value whose strings and keys hold no U+0000 (NUL).",
        "anyOf": [
            {"type": ["null", "boolean", "number"]},
            {"type": "string", "pattern": patterns::NO_NUL},
            {"type": "array", "items": itself},
            {"type": "object", "propertyNames": {"pattern": patterns::NO_NUL}, "additionalProperties": itself},
        ],
    })
}

/// Puts `value` at `pointer` (whose parent must exist).
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    match doc.pointer_mut(parent).and_then(Value::as_object_mut) {
        Some(object) => {
            object.insert(key.to_owned(), value);
        }
        None => debug_assert!(false, "the document has nothing at {parent}"),
    }
}

/// Replaces a property's schema with `rule`, keeping its description (the field's doc comment)
/// unless the rule brings its own.
fn property(doc: &mut Value, schema: &str, name: &str, rule: Value) {
    let pointer = format!("/components/schemas/{schema}/properties/{name}");
    let Some(slot) = doc.pointer_mut(&pointer) else {
        debug_assert!(false, "the document has no {pointer}");
        return;
    };
    *slot = with_description(slot, rule);
}

/// Replaces a parameter's schema with `rule`.
fn parameter(doc: &mut Value, path: &str, method: &str, name: &str, rule: Value) {
    match find_parameter(doc, path, method, name) {
        Some(parameter) => {
            parameter.insert("schema".to_owned(), rule);
        }
        None => debug_assert!(false, "{method} {path} has no parameter {name}"),
    }
}

fn find_parameter<'a>(
    doc: &'a mut Value,
    path: &str,
    method: &str,
    name: &str,
) -> Option<&'a mut Map<String, Value>> {
    doc.get_mut("paths")?
        .get_mut(path)?
        .get_mut(method)?
        .get_mut("parameters")?
        .as_array_mut()?
        .iter_mut()
        .filter_map(Value::as_object_mut)
        .find(|parameter| parameter.get("name") == Some(&json!(name)))
}

/// The rule, with the field's own description first and the rule's (if any) after it.
fn with_description(old: &Value, mut rule: Value) -> Value {
    if let (Some(Value::String(description)), Some(object)) =
        (old.get("description"), rule.as_object_mut())
    {
        let text = match object.get("description") {
            Some(Value::String(added)) => format!("{description}\n\n{added}"),
            _ => description.clone(),
        };
        object.insert("description".to_owned(), json!(text));
    }
    rule
}

/// `rule` with `text` as its description.
fn described(mut rule: Value, text: &str) -> Value {
    if let Some(object) = rule.as_object_mut() {
        object.insert("description".to_owned(), json!(text));
    }
    rule
}

/// Appends `text` to an object's description.
fn append(object: &mut Map<String, Value>, text: &str) {
    let joined = match object.get("description") {
        Some(Value::String(description)) => {
            format!("{}. {text}", description.trim_end_matches('.'))
        }
        _ => text.to_owned(),
    };
    object.insert("description".to_owned(), json!(joined));
}

/// A parameter that names a log position: what the schema cannot say about it.
fn note_position(doc: &mut Value, path: &str, method: &str, name: &str) {
    if let Some(parameter) = find_parameter(doc, path, method, name) {
        append(
            parameter,
            "0, or a position a response returned: a position the log never had is 400 \
             `unknown_position`",
        );
    }
}
