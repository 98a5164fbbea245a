//! Reconciliation exceptions: open ones waiting for a person first, then those the sweep is
//! still working on, then the resolved history; one exception with our side and the provider's
//! side next to each other and the difference; resolving takes a note, always.

use asiento_app::exceptions::{self, ExceptionError, ExceptionView, Scope as ExceptionScope};
use asiento_domain::exception::{ExceptionRejection, ExceptionStatus};
use asiento_domain::ExceptionId;
use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use super::{form, param, query, see_other};
use crate::audit::{self, Action};
use crate::error::ConsoleError;
use crate::layout::{self, Nav};
use crate::session::{self, Scope, Session};
use crate::ConsoleState;

/// The longest note a person may write.
const NOTE_CHARS_MAX: usize = 2_000;

fn scope_of(session: &Session) -> ExceptionScope {
    match &session.scope {
        Scope::Tenant(tenant) => ExceptionScope::Tenant(tenant.clone()),
        Scope::Platform => ExceptionScope::Platform,
    }
}

fn table(id: &str, rows: &[&ExceptionView], resolved: bool) -> Markup {
    html! {
        @if rows.is_empty() {
            div #(id) { (layout::empty("None.")) }
        } @else {
            table #(id) {
                thead { tr {
                    th scope="col" { "Exception" } th scope="col" { "Kind" }
                    th scope="col" { "Payment" } th scope="col" { "Provider" }
                    th scope="col" { "Recorded (UTC)" }
                    @if resolved { th scope="col" { "Resolved (UTC)" } th scope="col" { "Note" } }
                } }
                tbody {
                    @for exception in rows {
                        tr {
                            td { a href={ "/console/exceptions/" (exception.id) } { (layout::id(&exception.id)) } }
                            td { (exception.kind.replace('_', " ")) }
                            td {
                                @if let Some(payment) = &exception.payment_id {
                                    a href={ "/console/payments/" (payment) } { (layout::id(payment)) }
                                } @else { "—" }
                            }
                            td { (exception.provider) }
                            td { (layout::time_ms(exception.recorded_ms)) }
                            @if resolved {
                                td { (exception.resolved_ms.map(layout::time_ms).unwrap_or_default()) }
                                td { (exception.note.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `GET /console/exceptions`
pub async fn list(
    State(state): State<ConsoleState>,
    session: Session,
) -> Result<Response, ConsoleError> {
    let scope = scope_of(&session);
    let database = &state.api.database;
    let open = exceptions::list(
        database,
        &scope,
        Some(ExceptionStatus::Open),
        exceptions::EXCEPTIONS_PAGE_MAX,
    )
    .await
    .map_err(ConsoleError::internal)?;
    let mut resolved = exceptions::list(
        database,
        &scope,
        Some(ExceptionStatus::Resolved),
        exceptions::EXCEPTIONS_PAGE_MAX,
    )
    .await
    .map_err(ConsoleError::internal)?;
    resolved.reverse();
    let manual: Vec<_> = open.iter().filter(|e| e.resolution == "manual").collect();
    let automatic: Vec<_> = open.iter().filter(|e| e.resolution != "manual").collect();
    let resolved: Vec<_> = resolved.iter().collect();
    let content = html! {
        section aria-labelledby="manual-h" {
            h2 #manual-h { "Open, waiting for a person (" (manual.len()) ")" }
            (table("open-manual", &manual, false))
        }
        section aria-labelledby="auto-h" {
            h2 #auto-h { "Open, being fixed by the sweep (" (automatic.len()) ")" }
            (table("open-auto", &automatic, false))
        }
        section aria-labelledby="resolved-h" {
            h2 #resolved-h { "Resolved, newest first (" (resolved.len()) ")" }
            (table("resolved", &resolved, true))
        }
    };
    Ok(layout::page(
        &session,
        Nav::Exceptions,
        "Reconciliation exceptions",
        content,
    )
    .into_response())
}

async fn find(
    state: &ConsoleState,
    session: &Session,
    raw_id: &str,
) -> Result<ExceptionView, ConsoleError> {
    exceptions::get(&state.api.database, &scope_of(session), raw_id)
        .await
        .map_err(ConsoleError::internal)?
        .ok_or(ConsoleError::NotFound("exception"))
}

/// `GET /console/exceptions/{id}`
pub async fn show(
    State(state): State<ConsoleState>,
    session: Session,
    Path(raw_id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let exception = find(&state, &session, &raw_id).await?;
    let query = query(raw);
    let history = audit::list(&state.api.database, &session, Some(&exception.id)).await?;
    let content = html! {
        (layout::notice(param(&query, "notice")))
        dl .summary {
            div { dt { "Status" } dd #exception-status { (layout::status(&exception.status)) } }
            div { dt { "Kind" } dd { (exception.kind.replace('_', " ")) } }
            div { dt { "Resolution" } dd { (exception.resolution) } }
            div { dt { "Payment" } dd {
                @if let Some(payment) = &exception.payment_id {
                    a href={ "/console/payments/" (payment) } { (layout::id(payment)) }
                } @else { "none of ours" }
            } }
            div { dt { "Provider" } dd { (exception.provider)
                @if let Some(charge) = &exception.charge_id { " · " (layout::id(charge)) } } }
            div { dt { "Recorded" } dd { (layout::time_ms(exception.recorded_ms)) } }
            @if let Some(resolved) = exception.resolved_ms {
                div { dt { "Resolved" } dd { (layout::time_ms(resolved)) } }
            }
            @if let Some(note) = &exception.note {
                div { dt { "Note" } dd #exception-note { (note) } }
            }
        }
        section .sides aria-label="Both sides" {
            div { h2 { "Our side (the ledger)" } (layout::json(&exception.local)) }
            div { h2 { "The provider's side" } (layout::json(&exception.provider_state)) }
            div { h2 { "Difference" } (layout::json(&exception.difference)) }
        }
        @if exception.status == "open" {
            form #resolve method="post" action={ "/console/exceptions/" (exception.id) "/resolve" } {
                (layout::csrf_field(&session))
                p {
                    label for="note" { "How was it resolved? (required)" }
                    textarea #note name="note" required maxlength=(NOTE_CHARS_MAX) rows="4" {}
                }
                button #resolve-submit type="submit" { "Resolve with this note" }
            }
        }
        @if !history.is_empty() {
            section aria-labelledby="history-h" {
                h2 #history-h { "Console actions on it" }
                ul { @for row in &history {
                    li { (layout::time_ms(row.at_ms)) " · " (row.operator) " · " (row.detail) " · " (row.outcome) }
                } }
            }
        }
    };
    let title = format!("Exception {}", exception.id);
    Ok(layout::page(&session, Nav::Exceptions, &title, content).into_response())
}

/// `POST /console/exceptions/{id}/resolve`: resolves with the note, records who did.
pub async fn resolve(
    State(state): State<ConsoleState>,
    session: Session,
    Path(raw_id): Path<String>,
    body: Bytes,
) -> Result<Response, ConsoleError> {
    let fields = form(&body);
    session.check_csrf(fields.get("csrf").map(String::as_str))?;
    let exception = find(&state, &session, &raw_id).await?;
    let note = fields
        .get("note")
        .map(|note| note.trim())
        .filter(|note| !note.is_empty())
        .ok_or_else(|| {
            ConsoleError::BadInput("a note is required to resolve an exception".into())
        })?;
    if note.chars().count() > NOTE_CHARS_MAX {
        return Err(ConsoleError::BadInput(format!(
            "the note is longer than {NOTE_CHARS_MAX} characters"
        )));
    }
    let id = ExceptionId::parse(&exception.id).map_err(ConsoleError::internal)?;
    let now = state.api.payments.clock().now();
    // The note names who resolved it, so the exception's own history says so too.
    let recorded_note = format!("{note} (by {})", session.operator);
    let outcome = exceptions::resolve(
        &state.api.database,
        state.api.payments.store().as_ref(),
        &scope_of(&session),
        id,
        recorded_note,
        now,
    )
    .await;
    let (answer, refusal) = match &outcome {
        Ok(_) => ("resolved".to_owned(), None),
        Err(ExceptionError::Rejected(ExceptionRejection::AlreadyResolved)) => (
            "already resolved".to_owned(),
            Some("It was resolved meanwhile, by someone else or by the sweep."),
        ),
        Err(ExceptionError::Rejected(rejection)) => (rejection.to_string(), Some("Refused.")),
        Err(error) => return Err(ConsoleError::internal(error)),
    };
    audit::record(
        &state.api.database,
        &session,
        session::now_ms(&state),
        Action::ResolveException,
        Some(&exception.id),
        &format!("resolve: {note}"),
        &answer,
    )
    .await?;
    match refusal {
        None => Ok(see_other(&format!(
            "/console/exceptions/{}?notice=resolved",
            exception.id
        ))),
        Some(why) => Err(ConsoleError::BadInput(format!("{why} ({answer})"))),
    }
}
