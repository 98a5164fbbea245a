//! The page shell every console page shares (navigation, the search box, who is signed in) and
//! the few ways a value is shown: money by its currency's minor units (the ledger's one
//! formatter, `asiento_domain::format_major`), times in UTC with the zone written out, ids as
//! text that selects whole, and a status as a word (its colour only repeats it).

use asiento_domain::Currency;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{html, Markup, DOCTYPE};

use crate::session::{Scope, Session};

/// The navigation's sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Payments,
    Exceptions,
    Accounts,
    Health,
    Audit,
}

/// Every page's head: its title and the one stylesheet.
fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · asiento console" }
            link rel="stylesheet" href="/console/console.css";
        }
    }
}

/// A page without navigation (sign-in, errors).
pub fn bare(title: &str, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                main .narrow { (content) }
            }
        }
    }
}

/// A signed-in page: navigation, the search box, who is signed in, and `content`.
pub fn page(session: &Session, nav: Nav, title: &str, content: Markup) -> Markup {
    let item = |section: Nav, id: &str, href: &str, label: &str| {
        html! {
            li {
                @if section == nav {
                    a #(id) href=(href) aria-current="page" { (label) }
                } @else {
                    a #(id) href=(href) { (label) }
                }
            }
        }
    };
    let who = match &session.scope {
        Scope::Tenant(tenant) => format!("tenant {tenant}"),
        Scope::Platform => "platform operator".to_owned(),
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(title))
            body {
                a .skip href="#content" { "Skip to content" }
                header .top {
                    span .brand { "asiento" }
                    nav aria-label="Sections" {
                        ul {
                            (item(Nav::Payments, "nav-payments", "/console/payments", "Payments"))
                            (item(Nav::Exceptions, "nav-exceptions", "/console/exceptions", "Exceptions"))
                            (item(Nav::Accounts, "nav-accounts", "/console/accounts", "Accounts"))
                            (item(Nav::Health, "nav-health", "/console/health", "Health"))
                            (item(Nav::Audit, "nav-audit", "/console/audit", "Audit trail"))
                        }
                    }
                    form #search role="search" method="get" action="/console/search" {
                        label for="q" .visually-hidden { "Find a payment by any id" }
                        input #q type="search" name="q" placeholder="pay_…, pi_…, order reference, Idempotency-Key" required;
                        button #search-submit type="submit" { "Find" }
                    }
                    form .sign-out method="post" action="/console/sign-out" {
                        span .who { (session.operator) " · " (who) }
                        (csrf_field(session))
                        button #sign-out-submit type="submit" { "Sign out" }
                    }
                }
                main #content tabindex="-1" {
                    h1 { (title) }
                    (content)
                }
            }
        }
    }
}

/// The hidden field every form of a signed-in page carries.
pub fn csrf_field(session: &Session) -> Markup {
    html! { input type="hidden" name="csrf" value=(session.csrf); }
}

/// `minor` units of `currency` in its major unit with the code: `25.00 USD`. A code the ledger
/// does not know (never written by it) shows its minor units as they are.
pub fn money(minor: i128, currency: &str) -> String {
    match Currency::parse(currency) {
        Ok(known) => format!("{} {currency}", asiento_domain::format_major(minor, known)),
        Err(_) => format!("{minor} {currency} (minor units)"),
    }
}

/// A time in UTC, to the second, with the zone written out.
pub fn time(at: &DateTime<Utc>) -> String {
    format!("{} UTC", at.format("%Y-%m-%d %H:%M:%S"))
}

/// A unix-milliseconds time as [`time`] shows it.
pub fn time_ms(ms: i64) -> String {
    DateTime::from_timestamp_millis(ms)
        .map(|at| time(&at))
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// An RFC 3339 timestamp, for `datetime` attributes.
pub fn iso(at: &DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// An id a person copies: one click selects it whole.
pub fn id(text: &str) -> Markup {
    html! { code .id { (text) } }
}

/// A status as a word; the class only colours what the word already says.
pub fn status(word: &str) -> Markup {
    html! { span class={ "status status-" (word) } { (word.replace('_', " ")) } }
}

/// A JSON value as readable text (the exception's two sides and their difference).
pub fn json(value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    html! { pre .json { (text) } }
}

/// Percent-encodes one URL query value or path segment.
pub fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// A short notice after an action (a code from our own redirect, never text from the URL).
pub fn notice(code: Option<&str>) -> Markup {
    let text = match code {
        Some("refund_accepted") => {
            "Refund accepted: the provider decides it; its state is under Provider operations."
        }
        Some("capture_accepted") => "Capture accepted: its state is under Provider operations.",
        Some("cancel_accepted") => {
            "Cancel accepted: the provider releases the authorization; its state is under Provider operations."
        }
        Some("resolved") => "Exception resolved; your note is recorded.",
        Some("signed_in") => "Signed in.",
        _ => return html! {},
    };
    html! { p #notice role="status" .notice { (text) } }
}

/// Nothing: an empty table says so in words.
pub fn empty(text: &str) -> Markup {
    html! { p .empty { (text) } }
}
