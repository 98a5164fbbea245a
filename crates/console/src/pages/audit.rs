//! The audit trail as a page: who did what in the console, newest first.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::html;

use crate::audit;
use crate::error::ConsoleError;
use crate::layout::{self, Nav};
use crate::session::Session;
use crate::ConsoleState;

/// `GET /console/audit`
pub async fn show(
    State(state): State<ConsoleState>,
    session: Session,
) -> Result<Response, ConsoleError> {
    let rows = audit::list(&state.api.database, &session, None).await?;
    let content = html! {
        p .hint { "Every action taken in the console for your "
            @if session.tenant().is_ok() { "tenant" } @else { "platform scope" }
            ", newest first (the last " (audit::AUDIT_PAGE_MAX) ")." }
        table #audit {
            thead { tr {
                th scope="col" { "When (UTC)" } th scope="col" { "Who" } th scope="col" { "Key" }
                th scope="col" { "Action" } th scope="col" { "On" } th scope="col" { "What" }
                th scope="col" { "Answer" }
            } }
            tbody {
                @for row in &rows {
                    tr {
                        td { (layout::time_ms(row.at_ms)) }
                        td { (row.operator) }
                        td { (layout::id(&row.key_fingerprint)) }
                        td { (row.action.replace('_', " ")) }
                        td {
                            @match row.subject.as_deref() {
                                Some(subject) if subject.starts_with("pay_") => {
                                    a href={ "/console/payments/" (subject) } { (layout::id(subject)) }
                                }
                                Some(subject) if subject.starts_with("exc_") => {
                                    a href={ "/console/exceptions/" (subject) } { (layout::id(subject)) }
                                }
                                Some(subject) => { (subject) }
                                None => { "—" }
                            }
                        }
                        td { (row.detail) }
                        td { (row.outcome) }
                    }
                }
            }
        }
    };
    Ok(layout::page(&session, Nav::Audit, "Audit trail", content).into_response())
}
