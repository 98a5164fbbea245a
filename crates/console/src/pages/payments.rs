//! Payments: the list with its filters, the search box that finds a payment by any id a person
//! may be given, one payment's whole story (its events with their log positions, journal
//! entries, provider operations, webhooks received, exceptions), and capture, cancel and refund
//! behind a confirm step.
//!
//! A capture, cancel or refund is the API's command: the confirm page mints an Idempotency-Key, the form
//! carries it, and the POST runs `PaymentFlow` on the API's route under that key, so a second
//! click (or a reload of the POST) replays the first answer instead of moving money twice.

use asiento_api::commands::answer_response;
use asiento_api::reads::Needs;
use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, Scope as KeyScope};
use asiento_app::log;
use asiento_app::payments::Idempotent;
use asiento_domain::{
    Amount, CustomerId, PaymentEvent, PaymentId, PaymentRecord, PaymentStatus, ProviderName,
};
use asiento_payments_view::PaymentFilter;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use chrono::{NaiveDate, TimeZone as _, Utc};
use maud::{html, Markup};
use serde_json::{json, Value};

use super::{form, param, payment_id, query, see_other};
use crate::audit::{self, Action};
use crate::error::ConsoleError;
use crate::layout::{self, money, Nav};
use crate::session::{self, Session};
use crate::ConsoleState;

/// Payments per page of the list.
const PAGE_SIZE: u32 = 50;

/// `GET /console/payments?status=&customer=&provider=&from=&to=&cursor=`
pub async fn list(
    State(state): State<ConsoleState>,
    session: Session,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.clone();
    let query = query(raw);
    let status = param(&query, "status")
        .map(|raw| {
            PaymentStatus::ALL
                .into_iter()
                .find(|status| status.as_str() == raw)
                .ok_or_else(|| ConsoleError::BadInput(format!("unknown status {raw:?}")))
        })
        .transpose()?;
    let customer = param(&query, "customer")
        .map(|raw| {
            CustomerId::parse(raw)
                .map_err(|error| ConsoleError::BadInput(format!("customer: {error}")))
        })
        .transpose()?;
    let provider = param(&query, "provider")
        .map(|raw| {
            ProviderName::parse(raw)
                .map(|name| name.as_str().to_owned())
                .map_err(|error| ConsoleError::BadInput(format!("provider: {error}")))
        })
        .transpose()?;
    let day = |name: &str| -> Result<Option<chrono::DateTime<Utc>>, ConsoleError> {
        param(&query, name)
            .map(|raw| {
                NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                    .ok()
                    .and_then(|date| date.and_hms_opt(0, 0, 0))
                    .map(|start| Utc.from_utc_datetime(&start))
                    .ok_or_else(|| {
                        ConsoleError::BadInput(format!("{name}: expected a date as YYYY-MM-DD"))
                    })
            })
            .transpose()
    };
    let from = day("from")?;
    // "To" is a whole day: payments created before the next midnight.
    let to = day("to")?.map(|day| day + chrono::Duration::days(1));
    let filter = PaymentFilter {
        status,
        customer,
        provider,
        created_gte: from,
        created_lt: to,
        limit: PAGE_SIZE,
        cursor: param(&query, "cursor").map(str::to_owned),
        ..PaymentFilter::default()
    };
    let (tenant, filter) = (&tenant, &filter);
    let page = state
        .api
        .reads
        .read(
            Needs::Projection(asiento_payments_view::NAME),
            None,
            |side| async move {
                asiento_payments_view::list_payments(&side.database, tenant, filter.clone()).await
            },
        )
        .await
        .map_err(|error| match error {
            asiento_payments_view::ViewError::InvalidCursor => {
                ConsoleError::BadInput("that page link is no longer valid".into())
            }
            other => ConsoleError::internal(other),
        })?;
    let keep = |name: &str| param(&query, name).unwrap_or_default().to_owned();
    let next = page.next_cursor.as_ref().map(|cursor| {
        let mut link = String::from("/console/payments?");
        for name in ["status", "customer", "provider", "from", "to"] {
            if let Some(value) = param(&query, name) {
                link.push_str(&format!("{name}={}&", layout::encode(value)));
            }
        }
        link.push_str(&format!("cursor={}", layout::encode(cursor)));
        link
    });
    let content = html! {
        form #filters .filters method="get" action="/console/payments" {
            label { "Status "
                select name="status" {
                    option value="" { "any" }
                    @for status in PaymentStatus::ALL {
                        option value=(status.as_str()) selected[keep("status") == status.as_str()] {
                            (status.as_str().replace('_', " "))
                        }
                    }
                }
            }
            label { "Customer " input type="text" name="customer" value=(keep("customer")); }
            label { "Provider " input type="text" name="provider" value=(keep("provider")); }
            label { "Created from " input type="date" name="from" value=(keep("from")); }
            label { "to " input type="date" name="to" value=(keep("to")); }
            button #filter-submit type="submit" { "Filter" }
            " " a href="/console/payments" { "Clear" }
        }
        @if page.data.is_empty() {
            (layout::empty("No payments match."))
        } @else {
            table #payments {
                caption .visually-hidden { "Payments, newest first" }
                thead { tr {
                    th scope="col" { "Payment" } th scope="col" { "Status" }
                    th scope="col" .num { "Amount" } th scope="col" .num { "Refunded" }
                    th scope="col" { "Customer" } th scope="col" { "Provider" }
                    th scope="col" { "Created (UTC)" }
                } }
                tbody {
                    @for row in &page.data {
                        tr {
                            td { a href={ "/console/payments/" (row.id) } { (layout::id(&row.id.to_string())) } }
                            td { (layout::status(row.status.as_str())) }
                            td .num { (money(i128::from(row.amount_minor), &row.currency)) }
                            td .num { (money(i128::from(row.refunded_minor), &row.currency)) }
                            td { (row.customer) }
                            td { (row.provider) }
                            td { time datetime=(layout::iso(&row.created_at)) { (layout::time(&row.created_at)) } }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next {
            p { a #next-page href=(next) { "Older payments →" } }
        }
    };
    Ok(layout::page(&session, Nav::Payments, "Payments", content).into_response())
}

/// `GET /console/search?q=`: one payment found opens it; several are listed.
pub async fn search(
    State(state): State<ConsoleState>,
    session: Session,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.clone();
    let query = query(raw);
    let Some(term) = param(&query, "q") else {
        return Ok(see_other("/console/payments"));
    };
    // What a standby does not find (yet), the primary may.
    let tenant = &tenant;
    let matches = state
        .api
        .reads
        .find(
            Needs::Projection(asiento_payment_search::NAME),
            None,
            |side| async move {
                let found = asiento_payment_search::find(&side.database, tenant, term, 50)
                    .await
                    .map_err(ConsoleError::internal)?;
                Ok::<_, ConsoleError>((!found.is_empty()).then_some(found))
            },
        )
        .await?
        .unwrap_or_default();
    if let [only] = matches.as_slice() {
        return Ok(see_other(&format!("/console/payments/{}", only.payment_id)));
    }
    let content = html! {
        @if matches.is_empty() {
            p #no-match { "No payment of yours has the id, key or reference " code { (term) } "." }
            p { "The search knows payment ids, the provider's ids (charges, PaymentIntents, "
                "refunds, disputes), Idempotency-Keys of creates, captures and refunds, and the "
                "values of a payment's metadata and description, exactly as written." }
        } @else {
            p { (matches.len()) " payments have " code { (term) } ":" }
            ul #matches {
                @for found in &matches {
                    li { a href={ "/console/payments/" (found.payment_id) } { (layout::id(&found.payment_id)) }
                         " (" (found.kind.replace('_', " ")) ")" }
                }
            }
        }
    };
    Ok(layout::page(&session, Nav::Payments, "Search", content).into_response())
}

/// The payment and its events, if `session`'s tenant owns it (else "not found", as for an id
/// that does not exist).
async fn load(
    state: &ConsoleState,
    session: &Session,
    raw_id: &str,
) -> Result<
    (
        PaymentRecord,
        asiento_app::log::Loaded<asiento_domain::payment::Payment, PaymentEvent>,
    ),
    ConsoleError,
> {
    let tenant = session.tenant()?;
    let id = payment_id(raw_id)?;
    let loaded = log::load_payment(state.api.payments.store().as_ref(), id)
        .await
        .map_err(ConsoleError::internal)?;
    let record = loaded
        .aggregate
        .record
        .clone()
        .filter(|record| &record.tenant == tenant)
        .ok_or(ConsoleError::NotFound("payment"))?;
    Ok((record, loaded))
}

/// `GET /console/payments/{id}`
pub async fn show(
    State(state): State<ConsoleState>,
    session: Session,
    Path(raw_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let (record, loaded) = load(&state, &session, &raw_id).await?;
    let id = record.id.to_string();
    let query = query(raw);
    let webhooks = asiento_app::webhooks::of_payment(&state.api.database, &id)
        .await
        .map_err(ConsoleError::internal)?;
    let exceptions = asiento_app::exceptions::of_payment(&state.api.database, &record.tenant, &id)
        .await
        .map_err(ConsoleError::internal)?;
    let position = loaded.last_position().unwrap_or(0);
    let currency = record.currency.code();
    let content = html! {
        (layout::notice(param(&query, "notice")))
        (summary(&record, position))
        (actions(&record))
        section #timeline aria-labelledby="timeline-h" {
            h2 #timeline-h { "Timeline" }
            p .hint { "Every event of the payment's stream, oldest first, with its version and its position in the log." }
            ol .timeline {
                @for (recorded, event) in &loaded.events {
                    li {
                        span .event-type { (recorded.event_type) }
                        " · version " (recorded.version) " · position " (recorded.position) " · "
                        time datetime=(layout::iso(&recorded.recorded_at)) { (layout::time(&recorded.recorded_at)) }
                        @if let Some(key) = &recorded.metadata.idempotency_key {
                            " · Idempotency-Key " code { (key) }
                        }
                        (event_fields(event, recorded))
                    }
                }
            }
        }
        section #entries aria-labelledby="entries-h" {
            h2 #entries-h { "Journal entries" }
            (entries(&loaded.events))
        }
        section #operations aria-labelledby="operations-h" {
            h2 #operations-h { "Provider operations" }
            @if record.operations.is_empty() {
                (layout::empty("No capture, cancel or refund has been sent to the provider."))
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Operation" } th scope="col" .num { "Amount" }
                        th scope="col" { "State" } th scope="col" { "Provider id" }
                        th scope="col" { "Our key at the provider" } th scope="col" { "Reason" }
                        th scope="col" { "Requested (UTC)" } th scope="col" { "Updated (UTC)" }
                    } }
                    tbody {
                        @for op in &record.operations {
                            tr {
                                td { (op.kind.as_str()) " #" (op.sequence) }
                                td .num { (money(i128::from(op.amount.minor()), currency)) }
                                td { (layout::status(op.state.as_str())) }
                                td { @if let Some(provider_id) = &op.provider_id { (layout::id(provider_id)) } @else { "—" } }
                                td { (layout::id(&op.psp_key)) }
                                td { (op.reason.as_deref().unwrap_or("—")) }
                                td { (layout::time(&op.requested_at)) }
                                td { (layout::time(&op.updated_at)) }
                            }
                        }
                    }
                }
            }
        }
        section #webhooks aria-labelledby="webhooks-h" {
            h2 #webhooks-h { "Webhooks received" }
            @if webhooks.is_empty() {
                (layout::empty("No webhook event from the provider named this payment."))
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Event" } th scope="col" { "Type" } th scope="col" { "Provider" }
                        th scope="col" { "State" } th scope="col" .num { "Attempts" }
                        th scope="col" { "Received (UTC)" } th scope="col" { "Done (UTC)" }
                    } }
                    tbody {
                        @for hook in &webhooks {
                            tr {
                                td { (layout::id(&hook.event_id)) }
                                td { (hook.event_type) }
                                td { (hook.provider) }
                                td {
                                    (layout::status(&hook.status))
                                    @if let Some(outcome) = &hook.outcome { " (" (outcome) ")" }
                                    @if let Some(reason) = &hook.dead_reason { " (" (reason) ")" }
                                }
                                td .num { (hook.attempts) }
                                td { (layout::time_ms(hook.received_ms)) }
                                td { (hook.finished_ms.map(layout::time_ms).unwrap_or_else(|| "—".to_owned())) }
                            }
                        }
                    }
                }
            }
        }
        section #exceptions aria-labelledby="exceptions-h" {
            h2 #exceptions-h { "Reconciliation exceptions" }
            @if exceptions.is_empty() {
                (layout::empty("None: the provider and the ledger agree on this payment."))
            } @else {
                ul {
                    @for exception in &exceptions {
                        li {
                            a href={ "/console/exceptions/" (exception.id) } { (layout::id(&exception.id)) }
                            " " (exception.kind.replace('_', " ")) " · " (layout::status(&exception.status))
                            " · " (exception.resolution)
                        }
                    }
                }
            }
        }
    };
    let title = format!("Payment {id}");
    Ok(layout::page(&session, Nav::Payments, &title, content).into_response())
}

fn summary(record: &PaymentRecord, position: i64) -> Markup {
    let currency = record.currency.code();
    let row = |label: &str, value: Markup| html! { div { dt { (label) } dd { (value) } } };
    html! {
        dl #summary .summary {
            (row("Status", html! {
                (layout::status(record.status.as_str()))
                @if record.needs_review() { " · " span .status.status-flagged { "needs review" } }
            }))
            (row("Amount", html! { (money(i128::from(record.amount.minor()), currency)) }))
            (row("Captured", html! { (money(i128::from(record.captured.minor()), currency)) }))
            (row("Refunded", html! { (money(i128::from(record.refunded.minor()), currency)) }))
            (row("Customer", html! { (layout::id(record.customer.as_str())) }))
            (row("Provider", html! { (record.provider.as_str()) }))
            (row("Provider's id", html! {
                @if let Some(charge) = &record.provider_charge_id { (layout::id(charge)) } @else { "—" }
            }))
            (row("Description", html! { (record.description.as_deref().unwrap_or("—")) }))
            (row("Metadata", html! {
                @if record.metadata.is_empty() { "—" } @else {
                    @for (key, value) in &record.metadata {
                        code { (key) "=" (value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string())) } " "
                    }
                }
            }))
            (row("Failure reason", html! { (record.failure_reason.as_deref().unwrap_or("—")) }))
            (row("Created", html! { (layout::time(&record.created_at)) }))
            (row("Updated", html! { (layout::time(&record.updated_at)) }))
            (row("Read at log position", html! { (position) }))
        }
    }
}

/// Capture and cancel (while authorized) and refund (while something captured is not refunded)
/// forms; each leads to a confirm page.
fn actions(record: &PaymentRecord) -> Markup {
    let currency = record.currency;
    let refundable = record.captured.minor() - record.refunded.minor();
    let id = record.id.to_string();
    html! {
        @if record.status == PaymentStatus::Authorized {
            form #capture .action method="get" action={ "/console/payments/" (id) "/capture" } {
                label for="capture-amount" { "Capture (" (currency.code()) ", empty for all)" }
                input #capture-amount name="amount" type="text" inputmode="decimal"
                    placeholder=(asiento_domain::format_major(i128::from(record.amount.minor()), currency));
                button #capture-submit type="submit" { "Capture…" }
            }
            form #cancel .action method="get" action={ "/console/payments/" (id) "/cancel" } {
                span { "Release the authorization instead of capturing it" }
                button #cancel-submit type="submit" { "Cancel authorization…" }
            }
        }
        @if refundable > 0 && matches!(record.status, PaymentStatus::Captured | PaymentStatus::PartiallyRefunded) {
            form #refund .action method="get" action={ "/console/payments/" (id) "/refund" } {
                label for="refund-amount" { "Refund (" (currency.code()) ", up to "
                    (asiento_domain::format_major(i128::from(refundable), currency)) ")" }
                input #refund-amount name="amount" type="text" inputmode="decimal" required;
                button #refund-submit type="submit" { "Refund…" }
            }
        }
    }
}

/// An event's own fields, as the API's events view shows them (the same redaction).
fn event_fields(event: &PaymentEvent, recorded: &asiento_eventstore::RecordedEvent) -> Markup {
    let mut data = event
        .encode()
        .unwrap_or_else(|_| recorded.data.value().clone());
    asiento_api::queries::redact(event, &mut data);
    if let PaymentEvent::EntryPosted(_) = event {
        return html! { " · see Journal entries" };
    }
    let Value::Object(fields) = data else {
        return html! {};
    };
    html! {
        dl .fields {
            @for (key, value) in fields.iter().filter(|(key, _)| key.as_str() != "at") {
                div { dt { (key) } dd { (value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string())) } }
            }
        }
    }
}

/// The journal entries the payment's stream posted, each with its legs and their zero sum.
fn entries(events: &[(asiento_eventstore::RecordedEvent, PaymentEvent)]) -> Markup {
    let posted: Vec<_> = events
        .iter()
        .filter_map(|(recorded, event)| match event {
            PaymentEvent::EntryPosted(posted) => Some((recorded, &posted.entry)),
            _ => None,
        })
        .collect();
    if posted.is_empty() {
        return layout::empty("No journal entry yet.");
    }
    html! {
        @for (recorded, entry) in posted {
            table .entry {
                caption {
                    a href={ "/console/journal/" (entry.id()) } { (layout::id(&entry.id().to_string())) }
                    " · position " (recorded.position) " · " (layout::time(&recorded.recorded_at))
                    @if let Some(reversed) = entry.reverses() { " · reverses " (layout::id(&reversed.to_string())) }
                }
                thead { tr { th scope="col" { "Account" } th scope="col" .num { "Amount" } } }
                tbody {
                    @for leg in entry.legs() {
                        tr {
                            td { a href={ "/console/accounts/" (layout::encode(leg.account.as_str())) "?currency=" (leg.currency.code()) } { (leg.account.as_str()) } }
                            td .num { (money(i128::from(leg.amount.minor()), leg.currency.code())) }
                        }
                    }
                }
            }
        }
    }
}

/// What a capture or refund page asks: the amount typed, in the payment's currency (a cancel
/// asks none).
fn amount_of(
    state: &ConsoleState,
    record: &PaymentRecord,
    text: Option<&str>,
) -> Result<Option<Amount>, ConsoleError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let minor = asiento_domain::parse_major(text, record.currency)
        .map_err(|error| ConsoleError::BadInput(format!("amount: {error}")))?;
    if minor <= 0 {
        return Err(ConsoleError::BadInput(
            "amount: must be more than zero".into(),
        ));
    }
    state
        .api
        .amount_limit
        .check(Amount::new(minor))
        .map(Some)
        .map_err(|error| ConsoleError::BadInput(format!("amount: {error}")))
}

/// Which money command a confirm page and its POST are about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Capture,
    Refund,
    Cancel,
}

impl Command {
    /// The command a URL's last segment names; anything else names no page.
    fn parse(segment: &str) -> Result<Command, ConsoleError> {
        match segment {
            "capture" => Ok(Command::Capture),
            "refund" => Ok(Command::Refund),
            "cancel" => Ok(Command::Cancel),
            _ => Err(ConsoleError::NotFound("page")),
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Command::Capture => "capture",
            Command::Refund => "refund",
            Command::Cancel => "cancel",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Command::Capture => "Capture",
            Command::Refund => "Refund",
            Command::Cancel => "Cancel the authorization of",
        }
    }

    /// The API route the command is keyed on, so a console command is an API command.
    fn route(self, id: PaymentId) -> String {
        match self {
            Command::Capture => format!("/v1/payments/{id}/capture"),
            Command::Refund => format!("/v1/payments/{id}/refunds"),
            Command::Cancel => format!("/v1/payments/{id}/cancel"),
        }
    }

    fn action(self) -> Action {
        match self {
            Command::Capture => Action::Capture,
            Command::Refund => Action::Refund,
            Command::Cancel => Action::Cancel,
        }
    }
}

/// `GET /console/payments/{id}/{refund|capture|cancel}?amount=`: the confirm step says exactly
/// what will happen, with a fresh Idempotency-Key in the form.
pub async fn confirm(
    State(state): State<ConsoleState>,
    session: Session,
    Path((raw_id, command)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let command = Command::parse(&command)?;
    let (record, _) = load(&state, &session, &raw_id).await?;
    let query = query(raw);
    let amount = amount_of(&state, &record, param(&query, "amount"))?;
    if command == Command::Refund && amount.is_none() {
        return Err(ConsoleError::BadInput(
            "amount: say how much to refund".into(),
        ));
    }
    if command == Command::Cancel && amount.is_some() {
        return Err(ConsoleError::BadInput(
            "amount: a cancel releases the whole authorization".into(),
        ));
    }
    let currency = record.currency;
    let shown = match (command, amount) {
        (_, Some(amount)) => money(i128::from(amount.minor()), currency.code()),
        (Command::Cancel, None) => format!(
            "{} held",
            money(i128::from(record.authorized.minor()), currency.code())
        ),
        (_, None) => "the whole authorized amount".to_owned(),
    };
    let key = format!("console-{}", uuid::Uuid::new_v4());
    let id = record.id.to_string();
    let content = html! {
        p #confirm-text {
            (command.title()) " "
            strong #confirm-amount { (shown) }
            " of payment " (layout::id(&id)) " (customer " (record.customer.as_str()) ", "
            (money(i128::from(record.amount.minor()), currency.code())) " through " (record.provider.as_str()) ")?"
        }
        p .hint { "This sends the " (command.verb()) " to the provider. Submitting twice sends it once." }
        form #confirm method="post" action={ "/console/payments/" (id) "/" (command.verb()) } {
            (layout::csrf_field(&session))
            input type="hidden" name="key" value=(key);
            @if let Some(amount) = amount {
                input type="hidden" name="amount_minor" value=(amount.minor());
            }
            button #confirm-submit type="submit" { "Yes, " (command.verb()) }
            " " a #confirm-cancel href={ "/console/payments/" (id) } { "Cancel" }
        }
    };
    let title = format!("Confirm {}", command.verb());
    Ok(layout::page(&session, Nav::Payments, &title, content).into_response())
}

/// `POST /console/payments/{id}/{refund|capture|cancel}`: runs the confirmed command through the
/// API's command path and records it in the audit trail.
pub async fn run(
    State(state): State<ConsoleState>,
    session: Session,
    Path((raw_id, command)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let command = Command::parse(&command)?;
    let fields = form(&body);
    session.check_csrf(fields.get("csrf").map(String::as_str))?;
    let (record, _) = load(&state, &session, &raw_id).await?;
    let tenant = record.tenant.clone();
    let key = fields
        .get("key")
        .and_then(|key| IdempotencyKey::parse(key).ok())
        .ok_or_else(|| ConsoleError::BadInput("the form has no valid key; open it again".into()))?;
    let amount = fields
        .get("amount_minor")
        .map(|raw| {
            raw.parse::<i64>()
                .ok()
                .filter(|minor| *minor > 0)
                .map(Amount::new)
                .ok_or_else(|| ConsoleError::BadInput("amount: not a positive amount".into()))
        })
        .transpose()?
        .map(|amount| {
            state
                .api
                .amount_limit
                .check(amount)
                .map_err(|error| ConsoleError::BadInput(format!("amount: {error}")))
        })
        .transpose()?;
    // The body the API would have received, so the key's body hash is the API's.
    let request_body = match amount {
        Some(amount) => json!({"amount_minor": amount.minor()}),
        None => json!({}),
    };
    let request = Idempotent {
        scope: KeyScope {
            tenant: tenant.to_string(),
            method: "POST".to_owned(),
            route: command.route(record.id),
        },
        key,
        body: canonical_body_hash(&request_body),
        correlation_id: None,
    };
    let flow = &state.api.payments;
    let answer = match (command, amount) {
        (Command::Refund, Some(amount)) => flow.refund(&request, &tenant, record.id, amount).await,
        (Command::Refund, None) => {
            return Err(ConsoleError::BadInput(
                "amount: say how much to refund".into(),
            ))
        }
        (Command::Capture, amount) => flow.capture(&request, &tenant, record.id, amount).await,
        (Command::Cancel, None) => flow.cancel(&request, &tenant, record.id).await,
        (Command::Cancel, Some(_)) => {
            return Err(ConsoleError::BadInput(
                "amount: a cancel releases the whole authorization".into(),
            ))
        }
    };
    let response = answer_response(answer);
    let status = response.status();
    let answered = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .map_err(ConsoleError::internal)?;
    let answered: Value = serde_json::from_slice(&answered).unwrap_or(Value::Null);
    let shown_amount = amount.map_or_else(
        || "all".to_owned(),
        |amount| money(i128::from(amount.minor()), record.currency.code()),
    );
    let outcome = if status.is_success() {
        format!("{} accepted", status.as_u16())
    } else {
        format!(
            "{} {}",
            status.as_u16(),
            answered["code"].as_str().unwrap_or("refused")
        )
    };
    audit::record(
        &state.api.database,
        &session,
        session::now_ms(&state),
        command.action(),
        Some(&record.id.to_string()),
        &format!("{} {shown_amount}", command.verb()),
        &outcome,
    )
    .await?;
    if status.is_success() {
        return Ok(see_other(&format!(
            "/console/payments/{}?notice={}_accepted",
            record.id,
            command.verb()
        )));
    }
    let detail = answered["detail"]
        .as_str()
        .unwrap_or("the command was refused")
        .to_owned();
    let code = answered["code"].as_str().unwrap_or("refused").to_owned();
    let content = html! {
        p #error role="alert" .error {
            "The " (command.verb()) " was not made: " (detail) " (" code { (code) } ")."
        }
        p { a href={ "/console/payments/" (record.id) } { "Back to the payment" } }
    };
    let title = format!("{} refused", command.title());
    Ok((
        status,
        layout::page(&session, Nav::Payments, &title, content),
    )
        .into_response())
}
