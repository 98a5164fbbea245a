//! Accounts: every balance of the tenant per account and currency with the log position it is
//! exact at, one account's statement for a period (with its CSV), and one journal entry with its
//! legs and their zero sum. All read from the balances projections, as the API reads them.

use asiento_api::reads::Needs;
use asiento_balances::{AccountQuery, BalanceError, Point, StatementQuery};
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use super::{param, query};
use crate::error::ConsoleError;
use crate::layout::{self, money, Nav};
use crate::session::Session;
use crate::ConsoleState;

/// Accounts per page.
const ACCOUNTS_PAGE: usize = 200;
/// Legs per page of an account's entries.
const LEGS_PAGE: usize = 100;

fn balance_error(error: BalanceError) -> ConsoleError {
    match error {
        BalanceError::UnknownPosition { .. } | BalanceError::InvalidCursor => {
            ConsoleError::BadInput("that page link is no longer valid".into())
        }
        other => ConsoleError::internal(other),
    }
}

/// `GET /console/accounts?prefix=&after_account=&after_currency=`
pub async fn list(
    State(state): State<ConsoleState>,
    session: Session,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.to_string();
    let query = query(raw);
    let prefix = param(&query, "prefix").unwrap_or_default().to_owned();
    let after = param(&query, "after_account")
        .zip(param(&query, "after_currency"))
        .map(|(account, currency)| (account.to_owned(), currency.to_owned()));
    let query = &AccountQuery {
        tenant,
        prefix: prefix.clone(),
        currency: None,
        after,
        limit: ACCOUNTS_PAGE,
    };
    let page = state
        .api
        .reads
        .read(
            Needs::Projection(asiento_balances::NAME),
            None,
            |side| async move { asiento_balances::list_accounts(&side.database, query).await },
        )
        .await
        .map_err(balance_error)?;
    let next = (page.accounts.len() == ACCOUNTS_PAGE)
        .then(|| page.accounts.last())
        .flatten()
        .map(|last| {
            format!(
                "/console/accounts?prefix={}&after_account={}&after_currency={}",
                layout::encode(&prefix),
                layout::encode(&last.account),
                layout::encode(&last.currency)
            )
        });
    let content = html! {
        form .filters method="get" action="/console/accounts" {
            label { "Name starts with " input #prefix type="text" name="prefix" value=(prefix) placeholder="customer:42:"; }
            button #prefix-submit type="submit" { "List" }
        }
        p .hint { "Balances are exact as of log position " strong #as-of { (page.as_of_position) } "." }
        @if page.accounts.is_empty() {
            (layout::empty("No account matches."))
        } @else {
            table #accounts {
                thead { tr {
                    th scope="col" { "Account" } th scope="col" { "Currency" }
                    th scope="col" .num { "Posted" } th scope="col" .num { "Pending debits" }
                    th scope="col" .num { "Pending credits" } th scope="col" .num { "Available" }
                    th scope="col" { "Policy" }
                } }
                tbody {
                    @for account in &page.accounts {
                        tr {
                            td { a href={ "/console/accounts/" (layout::encode(&account.account)) "?currency=" (account.currency) } { (account.account) } }
                            td { (account.currency) }
                            td .num { (money(account.balance_minor.minor(), &account.currency)) }
                            td .num { (money(account.pending_debits_minor.minor(), &account.currency)) }
                            td .num { (money(account.pending_credits_minor.minor(), &account.currency)) }
                            td .num { (money(account.available_minor.minor(), &account.currency)) }
                            td {
                                (policy_text(&account.policy))
                                @if !account.declared { " (implied by its name)" }
                            }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next { p { a #next-page href=(next) { "More accounts →" } } }
    };
    Ok(layout::page(&session, Nav::Accounts, "Accounts", content).into_response())
}

/// A policy as words: `normal_balance: credit, overdraft: forbidden, frozen: false`.
fn policy_text(policy: &asiento_domain::AccountPolicy) -> String {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(policy) else {
        return String::new();
    };
    fields
        .iter()
        .map(|(key, value)| match value.as_str() {
            Some(text) => format!("{key}: {text}"),
            None => format!("{key}: {value}"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The statement a console page or download asks for: `currency`, the period as days (`from`,
/// `to`, both UTC and inclusive), and for a later page `after` and `to_position`.
fn statement_query(
    tenant: String,
    account: &str,
    query: &std::collections::HashMap<String, String>,
) -> Result<(asiento_domain::AccountName, StatementQuery), ConsoleError> {
    let currency = param(query, "currency")
        .ok_or_else(|| ConsoleError::BadInput("currency: say which currency".into()))?
        .to_owned();
    asiento_domain::Currency::parse(&currency)
        .map_err(|error| ConsoleError::BadInput(format!("currency: {error}")))?;
    let name = asiento_domain::AccountName::parse(account)
        .map_err(|_| ConsoleError::NotFound("account"))?;
    let day = |field: &str, days_after: u64| {
        param(query, field)
            .map(|raw| {
                chrono::NaiveDate::parse_from_str(raw, "%Y-%m-%d")
                    .ok()
                    .and_then(|date| date.checked_add_days(chrono::Days::new(days_after)))
                    .and_then(|date| date.and_hms_opt(0, 0, 0))
                    .map(|time| time.and_utc())
                    .ok_or_else(|| {
                        ConsoleError::BadInput(format!("{field}: not a day (YYYY-MM-DD)"))
                    })
            })
            .transpose()
    };
    let number = |field: &str| {
        param(query, field)
            .map(|raw| {
                raw.parse::<i64>()
                    .map_err(|_| ConsoleError::BadInput(format!("{field}: not a position")))
            })
            .transpose()
    };
    let statement = StatementQuery {
        tenant,
        account: name.as_str().to_owned(),
        currency,
        from: day("from", 0)?,
        // The last day is whole: the period ends before the next day begins.
        to: Point {
            position: number("to_position")?,
            time: day("to", 1)?,
        },
        after: number("after")?,
        limit: LEGS_PAGE,
    };
    Ok((name, statement))
}

/// `GET /console/accounts/{account}?currency=&from=&to=&after=&to_position=`: the account's
/// balances now, and its statement for a period (every day when none is given): the opening
/// balance, the legs oldest first with the balance after each, the closing balance, and the
/// period's CSV. The balances come from the server (the legs and their marks), never from a
/// figure carried in a link.
pub async fn entries(
    State(state): State<ConsoleState>,
    session: Session,
    Path(account): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.to_string();
    let query = query(raw);
    let (name, statement) = statement_query(tenant.clone(), &account, &query)?;
    let currency = statement.currency.clone();
    // The statement and the balance from one database, so that they agree.
    let (statement_query, tenant_id, account_name, currency_code) =
        (&statement, tenant.as_str(), &name, currency.as_str());
    let (page, balance) = state
        .api
        .reads
        .read(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            statement.to.position,
            |side| async move {
                let store = side.store.as_ref();
                let page =
                    asiento_balances::statement(&side.database, store, statement_query).await?;
                let balance = asiento_balances::read_balance(
                    &side.database,
                    store,
                    tenant_id,
                    account_name,
                    currency_code,
                    None,
                )
                .await?;
                Ok::<_, asiento_balances::BalanceError>((page, balance))
            },
        )
        .await
        .map_err(balance_error)?;
    let (from, to) = (
        param(&query, "from").unwrap_or_default(),
        param(&query, "to").unwrap_or_default(),
    );
    let base = format!(
        "/console/accounts/{}?currency={currency}&from={}&to={}",
        layout::encode(name.as_str()),
        layout::encode(from),
        layout::encode(to)
    );
    let next = page
        .next_after
        .map(|after| format!("{base}&after={after}&to_position={}", page.closing_position));
    let csv = format!(
        "/console/accounts/{}/statement.csv?currency={currency}&from={}&to={}",
        layout::encode(name.as_str()),
        layout::encode(from),
        layout::encode(to)
    );
    let content = html! {
        dl .summary {
            div { dt { "Posted balance" } dd #balance { (money(balance.balance_minor.minor(), &currency)) } }
            div { dt { "Pending debits" } dd { (money(balance.pending_debits_minor.minor(), &currency)) } }
            div { dt { "Pending credits" } dd { (money(balance.pending_credits_minor.minor(), &currency)) } }
            div { dt { "As of log position" } dd { (balance.as_of_position) } }
        }
        form .filters method="get" action={ "/console/accounts/" (layout::encode(name.as_str())) } {
            input type="hidden" name="currency" value=(currency);
            label { "From (UTC) " input #from type="date" name="from" value=(from); }
            label { "To, inclusive (UTC) " input #to type="date" name="to" value=(to); }
            button #period-submit type="submit" { "Show statement" }
        }
        p { a #csv href=(csv) download { "Download the statement as CSV" } }
        dl .summary {
            div { dt { "Opening balance" } dd #opening { (money(page.opening_balance_minor.minor(), &currency)) } }
            div { dt { "Closing balance" } dd #closing { (money(page.closing_balance_minor.minor(), &currency)) } }
        }
        @if page.lines.is_empty() {
            (layout::empty("No legs on this account in this currency and period."))
        } @else {
            table #legs {
                caption { "Legs of the period, oldest first" }
                thead { tr {
                    th scope="col" { "Journal entry" } th scope="col" { "Position" }
                    th scope="col" { "Recorded (UTC)" } th scope="col" .num { "Amount" }
                    th scope="col" .num { "Balance after" }
                    th scope="col" { "Source" } th scope="col" { "Description" }
                } }
                tbody {
                    @for line in &page.lines {
                        tr {
                            td { a href={ "/console/journal/" (line.entry_id) } { (layout::id(&line.entry_id)) } }
                            td { (line.position) }
                            td { (layout::time(&line.recorded_at)) }
                            td .num { (money(i128::from(line.amount_minor), &currency)) }
                            td .num { (money(line.balance_minor.minor(), &currency)) }
                            td { (source_link(line.source.as_deref())) }
                            td { (line.description.as_deref().unwrap_or("")) }
                        }
                    }
                }
            }
        }
        @if let Some(next) = next { p { a #next-page href=(next) { "Later legs →" } } }
    };
    let title = format!("{} ({currency})", name.as_str());
    Ok(layout::page(&session, Nav::Accounts, &title, content).into_response())
}

/// The stream that posted an entry, linked to its page where the console has one (a payment's).
fn source_link(source: Option<&str>) -> Markup {
    match source.and_then(|stream| stream.strip_prefix("payment-")) {
        Some(payment) => {
            html! { a href={ "/console/payments/" (payment) } { (layout::id(payment)) } }
        }
        None => html! { (source.unwrap_or("")) },
    }
}

/// `GET /console/accounts/{account}/statement.csv?currency=&from=&to=`: the period's statement
/// as the API's CSV, streamed.
pub async fn statement_csv(
    State(state): State<ConsoleState>,
    session: Session,
    Path(account): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.to_string();
    let (_, statement) = statement_query(tenant, &account, &query(raw))?;
    asiento_api::statement::csv(&state.api.reads, statement)
        .await
        .map_err(balance_error)
}

/// `GET /console/journal/{entry_id}`: one entry, its legs and their sum per currency.
pub async fn journal_entry(
    State(state): State<ConsoleState>,
    session: Session,
    Path(entry_id): Path<String>,
) -> Result<Response, ConsoleError> {
    let tenant = session.tenant()?.to_string();
    let (tenant, entry_id) = (tenant.as_str(), entry_id.as_str());
    let entry = state
        .api
        .reads
        .find(
            Needs::Projection(asiento_balances::ENTRIES_NAME),
            None,
            |side| async move {
                asiento_balances::journal_entry(
                    &side.database,
                    side.store.as_ref(),
                    tenant,
                    entry_id,
                    None,
                )
                .await
            },
        )
        .await
        .map_err(balance_error)?
        .ok_or(ConsoleError::NotFound("journal entry"))?;
    let mut sums: std::collections::BTreeMap<&str, i128> = Default::default();
    for leg in &entry.legs {
        *sums.entry(leg.currency.as_str()).or_default() += i128::from(leg.amount_minor);
    }
    let content = html! {
        p { "Position " (entry.position) " · " (layout::time(&entry.recorded_at))
            @if let Some(reversed) = &entry.reverses {
                " · reverses " a href={ "/console/journal/" (reversed) } { (layout::id(reversed)) }
            }
        }
        table #legs {
            thead { tr { th scope="col" { "Account" } th scope="col" .num { "Amount" } } }
            tbody {
                @for leg in &entry.legs {
                    tr {
                        td { a href={ "/console/accounts/" (layout::encode(&leg.account)) "?currency=" (leg.currency) } { (leg.account) } }
                        td .num { (money(i128::from(leg.amount_minor), &leg.currency)) }
                    }
                }
            }
            tfoot {
                @for (currency, sum) in &sums {
                    tr #zero-sum {
                        th scope="row" { "Sum (" (currency) ")" }
                        td .num { (money(*sum, currency)) @if *sum == 0 { " ✓ balanced" } @else { " ✗ NOT balanced" } }
                    }
                }
            }
        }
    };
    let title = format!("Journal entry {}", entry.entry_id);
    Ok(layout::page(&session, Nav::Accounts, &title, content).into_response())
}
