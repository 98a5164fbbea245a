//! Health, for on-call and finance: whether the books verify (the last run of the invariant
//! checker, with links to what it names), each projection's checkpoint, lag and owner, the
//! webhook inbox, idempotency keys in flight or stuck, and provider operations still pending by
//! age. The counts are the same ones the gauges on `/metrics` export.
//!
//! A tenant sees the checker's violations that name its own payments, journal entries and
//! accounts (with links) and only counts of the rest; the platform operator sees every one.

use asiento_app::invariants::{self, VerifyRun};
use asiento_domain::PaymentId;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use crate::error::ConsoleError;
use crate::layout::{self, Nav};
use crate::session::{self, Scope, Session};
use crate::ConsoleState;

/// `GET /console/health`
pub async fn show(
    State(state): State<ConsoleState>,
    session: Session,
) -> Result<Response, ConsoleError> {
    let database = &state.api.database;
    let store = state.api.payments.store().as_ref();
    let run = invariants::last_run(database)
        .await
        .map_err(ConsoleError::internal)?;
    let verify = match &run {
        None => html! {
            p #verify-result { "The invariant checker has not run on this database yet "
                "(serve runs it every --verify-interval; " code { "asiento verify" } " runs it now)." }
        },
        Some(run) => verify_section(&state, &session, run).await?,
    };
    let projections: Vec<&dyn asiento_projector::Projection> = state
        .projections
        .iter()
        .map(|projection| projection.as_ref())
        .collect();
    let statuses = asiento_projector::status(database, store, &projections)
        .await
        .map_err(ConsoleError::internal)?;
    let inbox = asiento_app::webhooks::inbox_counts(database)
        .await
        .map_err(ConsoleError::internal)?;
    let counts = asiento_app::gauges::count(database, session::now_ms(&state))
        .await
        .map_err(ConsoleError::internal)?;
    let content = html! {
        section #verify aria-labelledby="verify-h" {
            h2 #verify-h { "Do the books verify?" }
            (verify)
        }
        section #projections aria-labelledby="projections-h" {
            h2 #projections-h { "Projections" }
            table {
                thead { tr {
                    th scope="col" { "Projection" } th scope="col" { "Checkpoint (position)" }
                    th scope="col" .num { "Lag (events)" } th scope="col" .num { "Lag (ms)" }
                    th scope="col" { "Owner" } th scope="col" { "State" } th scope="col" { "Last batch (UTC)" }
                } }
                tbody {
                    @for status in &statuses {
                        tr {
                            td { (status.name) " (generation " (status.generation) ")" }
                            td { (status.checkpoint.position()) }
                            td .num { (status.lag_events) }
                            td .num { (status.lag_ms) }
                            td { (status.owner.as_deref().unwrap_or("none")) @if !status.lease_live { " (lease expired)" } }
                            td {
                                @if status.rebuild_needed {
                                    (layout::status("rebuild_needed"))
                                } @else if status.lag_events == 0 {
                                    (layout::status("caught_up"))
                                } @else {
                                    (layout::status("behind"))
                                }
                                @if let Some(rebuild) = &status.rebuild {
                                    " · rebuilding generation " (rebuild.generation)
                                }
                            }
                            td { (status.applied_at.as_ref().map(layout::time).unwrap_or_else(|| "never".to_owned())) }
                        }
                    }
                }
            }
        }
        section #work aria-labelledby="work-h" {
            h2 #work-h { "Work in flight" }
            dl .summary {
                div { dt { "Webhook inbox waiting" } dd #inbox-pending { (inbox.pending) } }
                div { dt { "Webhook events dead-lettered" } dd #inbox-dead { (inbox.dead) } }
                div { dt { "Idempotency keys in flight" } dd #keys-in-flight { (counts.keys_in_flight) } }
                div { dt { "… stuck past their lease" } dd #keys-stuck { (counts.keys_stuck) } }
            }
            h3 { "Provider operations pending, by age" }
            table #pending-operations {
                thead { tr { @for (band, _) in asiento_app::gauges::OPERATION_AGE_BANDS { th scope="col" .num { (band.replace('_', " ")) } } } }
                tbody { tr { @for count in counts.operations_by_age { td .num { (count) } } } }
            }
            h3 { "Open exceptions, every tenant" }
            @if counts.exceptions_open.is_empty() {
                (layout::empty("None."))
            } @else {
                ul { @for (kind, resolution, count) in &counts.exceptions_open {
                    li { (kind.replace('_', " ")) " (" (resolution) "): " (count) }
                } }
            }
        }
    };
    Ok(layout::page(&session, Nav::Health, "Health", content).into_response())
}

async fn verify_section(
    state: &ConsoleState,
    session: &Session,
    run: &VerifyRun,
) -> Result<Markup, ConsoleError> {
    let total: usize = run.violations.len() + run.omitted.values().sum::<usize>();
    let mut shown = Vec::new();
    for violation in &run.violations {
        match &session.scope {
            Scope::Platform => shown.push((violation, None)),
            Scope::Tenant(_) => {
                if let Some(link) = own_link(state, session, &violation.subject).await? {
                    shown.push((violation, Some(link)));
                }
            }
        }
    }
    let hidden = run.violations.len() - shown.len();
    Ok(html! {
        p #verify-result {
            @if run.ok {
                (layout::status("verified")) " The last check found every invariant holding."
            } @else {
                (layout::status("violations")) " The last check found " strong { (total) } " violations."
            }
        }
        p .hint {
            "Checked " (run.events_checked) " events in " (run.streams_checked) " streams, "
            (layout::time_ms(run.started_ms)) " to " (layout::time_ms(run.finished_ms)) "; "
            (run.unsealed) " events not yet under the hash chain."
        }
        @if !shown.is_empty() {
            table #violations {
                thead { tr { th scope="col" { "Check" } th scope="col" { "About" } th scope="col" { "What is wrong" } } }
                tbody {
                    @for (violation, link) in &shown {
                        tr {
                            td { (violation.check) }
                            td { @if let Some(link) = link { a href=(link) { (violation.subject) } } @else { (violation.subject) } }
                            td { (violation.detail) }
                        }
                    }
                }
            }
        }
        @if hidden > 0 {
            p { (hidden) " more concern other tenants or the platform; the platform operator sees them." }
        }
        @if !run.omitted.is_empty() {
            p { "Not listed (too many of one check): "
                @for (check, count) in &run.omitted { (check) " " (count) "; " } }
        }
    })
}

/// Where a violation's subject can be looked at, if it is the tenant's own payment, journal
/// entry or account; `None` for anything else (it is not shown to the tenant).
async fn own_link(
    state: &ConsoleState,
    session: &Session,
    subject: &str,
) -> Result<Option<String>, ConsoleError> {
    let tenant = session.tenant()?;
    let store = state.api.payments.store().as_ref();
    let payment = subject
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find_map(|word| PaymentId::parse(word).ok());
    if let Some(id) = payment {
        let loaded = asiento_app::log::load_payment(store, id)
            .await
            .map_err(ConsoleError::internal)?;
        let owned = loaded
            .aggregate
            .record
            .is_some_and(|record| &record.tenant == tenant);
        return Ok(owned.then(|| format!("/console/payments/{id}")));
    }
    if let Some(rest) = subject.strip_prefix(&format!("{tenant}:")) {
        // A debit guard: tenant:account:currency.
        if let Some((account, currency)) = rest.rsplit_once(':') {
            return Ok(Some(format!(
                "/console/accounts/{}?currency={}",
                layout::encode(account),
                layout::encode(currency)
            )));
        }
    }
    let entry =
        asiento_balances::journal_entry(&state.api.database, store, tenant.as_str(), subject, None)
            .await
            .map_err(ConsoleError::internal)?;
    Ok(entry.map(|_| format!("/console/journal/{}", layout::encode(subject))))
}
