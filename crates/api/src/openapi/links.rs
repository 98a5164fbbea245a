//! OpenAPI links: from the answer of an operation that creates or changes a thing to the
//! operations that read or act on it, with the values they take from that answer. A client (or
//! a stateful fuzzer) follows them to reach a payment's capture and refunds, a hold's post and
//! void, an endpoint's deliveries, without guessing ids.

use serde_json::{json, Value};

/// One link: the answer it starts from, its name, the operation it goes to and the values.
struct Link {
    from: (&'static str, &'static str),
    statuses: &'static [&'static str],
    name: &'static str,
    operation_id: &'static str,
    parameters: Value,
    request_body: Option<Value>,
    description: &'static str,
}

/// The id of the answer's object.
const ID: &str = "$response.body#/id";

fn links() -> Vec<Link> {
    let payment_answers: &[&str] = &["201", "202"];
    let payment = ("/v1/payments", "post");
    let capture = ("/v1/payments/{id}/capture", "post");
    let cancel = ("/v1/payments/{id}/cancel", "post");
    let refund = ("/v1/payments/{id}/refunds", "post");
    let transfer = ("/v1/transfers", "post");
    let post = ("/v1/transfers/{id}/post", "post");
    let void = ("/v1/transfers/{id}/void", "post");
    let declare = ("/v1/accounts", "post");
    let endpoint = ("/v1/webhook_endpoints", "post");
    let mut links = Vec::new();

    // A payment, and what a capture, cancel or refund answers with: the payment again.
    for (from, statuses) in [
        (payment, payment_answers),
        (capture, &["200", "202"][..]),
        (cancel, &["200", "202"][..]),
        (refund, payment_answers),
    ] {
        links.push(Link {
            from,
            statuses,
            name: "GetPayment",
            operation_id: "get_payment",
            parameters: json!({"id": ID}),
            request_body: None,
            description: "The payment, from its own stream.",
        });
        links.push(Link {
            from,
            statuses,
            name: "ListPaymentEvents",
            operation_id: "list_payment_events",
            parameters: json!({"id": ID}),
            request_body: None,
            description: "The payment's history.",
        });
        links.push(Link {
            from,
            statuses,
            name: "ListPayments",
            operation_id: "list_payments",
            parameters: json!({"customer": "$response.body#/customer", "min_position": "$response.body#/position"}),
            request_body: None,
            description: "The customer's payments, read after this answer's position.",
        });
    }
    links.push(Link {
        from: payment,
        statuses: payment_answers,
        name: "CapturePayment",
        operation_id: "capture_payment",
        parameters: json!({"id": ID}),
        request_body: Some(json!({"amount_minor": "$response.body#/amount_minor"})),
        description: "Captures a manual payment's whole authorization.",
    });
    links.push(Link {
        from: payment,
        statuses: payment_answers,
        name: "CancelPayment",
        operation_id: "cancel_payment",
        parameters: json!({"id": ID}),
        request_body: Some(json!({})),
        description: "Cancels a manual payment's authorization instead of capturing it.",
    });
    for (from, statuses, amount) in [
        (payment, payment_answers, "$response.body#/amount_minor"),
        (capture, &["200"][..], "$response.body#/captured_minor"),
    ] {
        links.push(Link {
            from,
            statuses,
            name: "RefundPayment",
            operation_id: "refund_payment",
            parameters: json!({"id": ID}),
            request_body: Some(json!({"amount_minor": amount})),
            description: "Refunds what was captured.",
        });
    }

    // A transfer or hold, and what a post or void answers with: the transfer again.
    for (from, statuses) in [
        (transfer, &["201"][..]),
        (post, &["200"][..]),
        (void, &["200"][..]),
    ] {
        links.push(Link {
            from,
            statuses,
            name: "GetTransfer",
            operation_id: "get_transfer",
            parameters: json!({"id": ID}),
            request_body: None,
            description: "The transfer, from its own stream.",
        });
        for (name, account) in [("GetFromBalance", "from"), ("GetToBalance", "to")] {
            links.push(Link {
                from,
                statuses,
                name,
                operation_id: "get_balance",
                parameters: json!({
                    "account": format!("$response.body#/{account}"),
                    "currency": "$response.body#/currency",
                    "min_position": "$response.body#/position",
                }),
                request_body: None,
                description: "The balance of a side, including this answer's entry.",
            });
        }
        links.push(Link {
            from,
            statuses,
            name: "ListFromEntries",
            operation_id: "list_account_entries",
            parameters: json!({
                "account": "$response.body#/from",
                "currency": "$response.body#/currency",
                "min_position": "$response.body#/position",
            }),
            request_body: None,
            description: "The legs of the source account.",
        });
    }
    links.push(Link {
        from: transfer,
        statuses: &["201"],
        name: "GetJournalEntry",
        operation_id: "get_journal_entry",
        parameters: json!({"entry_id": "$response.body#/entry_id", "min_position": "$response.body#/position"}),
        request_body: None,
        description: "The transfer's (or hold's) journal entry.",
    });
    for (from, statuses) in [(post, &["200"][..]), (void, &["200"][..])] {
        links.push(Link {
            from,
            statuses,
            name: "GetSettledJournalEntry",
            operation_id: "get_journal_entry",
            parameters: json!({"entry_id": "$response.body#/settled_entry_id", "min_position": "$response.body#/position"}),
            request_body: None,
            description: "The entry of the hold's post or void.",
        });
    }
    links.push(Link {
        from: transfer,
        statuses: &["201"],
        name: "PostHold",
        operation_id: "post_hold",
        parameters: json!({"id": ID}),
        request_body: Some(json!({"amount_minor": "$response.body#/amount_minor"})),
        description:
            "Posts a hold, all of it (a transfer that is not a hold answers 409 not_a_hold).",
    });
    links.push(Link {
        from: transfer,
        statuses: &["201"],
        name: "VoidHold",
        operation_id: "void_hold",
        parameters: json!({"id": ID}),
        request_body: None,
        description: "Voids a hold (a transfer that is not a hold answers 409 not_a_hold).",
    });

    // A declared account.
    for (name, operation_id) in [
        ("GetBalance", "get_balance"),
        ("ListEntries", "list_account_entries"),
    ] {
        links.push(Link {
            from: declare,
            statuses: &["200", "201"],
            name,
            operation_id,
            parameters: json!({
                "account": "$response.body#/account",
                "currency": "$response.body#/currency",
                "min_position": "$response.body#/position",
            }),
            request_body: None,
            description: "The declared account in its currency.",
        });
    }
    links.push(Link {
        from: declare,
        statuses: &["200", "201"],
        name: "ListAccounts",
        operation_id: "list_accounts",
        parameters: json!({"prefix": "$response.body#/account", "currency": "$response.body#/currency"}),
        request_body: None,
        description: "The accounts whose names start with the declared one's.",
    });

    // A webhook endpoint.
    for (name, operation_id, description) in [
        (
            "GetWebhookEndpoint",
            "get_webhook_endpoint",
            "The endpoint.",
        ),
        (
            "ListWebhookDeliveries",
            "list_webhook_deliveries",
            "Its deliveries.",
        ),
        (
            "RotateWebhookEndpointSecret",
            "rotate_webhook_endpoint_secret",
            "A new signing secret.",
        ),
        (
            "EnableWebhookEndpoint",
            "enable_webhook_endpoint",
            "Enables it again.",
        ),
        (
            "DeleteWebhookEndpoint",
            "delete_webhook_endpoint",
            "Deletes it.",
        ),
    ] {
        links.push(Link {
            from: endpoint,
            statuses: &["201"],
            name,
            operation_id,
            parameters: json!({"id": ID}),
            request_body: None,
            description,
        });
    }
    links.push(Link {
        from: ("/v1/webhook_endpoints/{id}/rotate_secret", "post"),
        statuses: &["200"],
        name: "ListWebhookDeliveries",
        operation_id: "list_webhook_deliveries",
        parameters: json!({"id": ID}),
        request_body: None,
        description: "Its deliveries.",
    });

    links.push(Link {
        from: ("/v1/webhook_endpoints/{id}/deliveries", "get"),
        statuses: &["200"],
        name: "RetryWebhookDelivery",
        operation_id: "retry_webhook_delivery",
        parameters: json!({"id": "$request.path.id", "delivery_id": "$response.body#/data/0/id"}),
        request_body: None,
        description: "Sends the newest delivery again.",
    });

    // An open exception of the list.
    links.push(Link {
        from: ("/v1/reconciliation/exceptions", "get"),
        statuses: &["200"],
        name: "ResolveException",
        operation_id: "resolve_exception",
        parameters: json!({"id": "$response.body#/0/id"}),
        request_body: None,
        description: "Resolves the first exception of the list.",
    });

    // The feed: read on from a page, and read an event of it.
    links.push(Link {
        from: ("/v1/events", "get"),
        statuses: &["200"],
        name: "NextPage",
        operation_id: "list_events",
        parameters: json!({"after": "$response.body#/next_cursor"}),
        request_body: None,
        description: "The events after this page.",
    });
    links.push(Link {
        from: ("/v1/events", "get"),
        statuses: &["200"],
        name: "GetEvent",
        operation_id: "get_event",
        parameters: json!({"id": "$response.body#/data/0/id"}),
        request_body: None,
        description: "The first event of the page.",
    });
    links
}

/// Adds every link to the responses they start from.
pub fn apply(doc: &mut Value) {
    for link in links() {
        for status in link.statuses {
            let pointer = format!(
                "/paths/{}/{}/responses/{status}",
                escape(link.from.0),
                link.from.1
            );
            let Some(response) = doc.pointer_mut(&pointer).and_then(Value::as_object_mut) else {
                debug_assert!(false, "the document has no {pointer}");
                continue;
            };
            let mut object = json!({
                "operationId": link.operation_id,
                "parameters": link.parameters,
                "description": link.description,
            });
            if let (Some(body), Some(map)) = (&link.request_body, object.as_object_mut()) {
                map.insert("requestBody".to_owned(), body.clone());
            }
            let links = response.entry("links").or_insert_with(|| json!({}));
            if let Some(links) = links.as_object_mut() {
                links.insert(link.name.to_owned(), object);
            }
        }
    }
}

/// A JSON pointer token: `~` and `/` escaped.
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
