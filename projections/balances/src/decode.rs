//! Reading journal entries out of the log, through the domain's own decoder (so upcasting and
//! the zero-sum rule are the domain's, checked again here where the entry is read).

use asiento_domain::guard::AccountDeclared;
use asiento_domain::{
    Balance, Event, GuardEvent, JournalEntry, PaymentEvent, PayoutEvent, StreamKind, TransferEvent,
};
use asiento_eventstore::RecordedEvent;
use asiento_projector::ProjectionError;

use crate::{BalanceKey, LegView};

/// The stored type name of a journal entry, in every stream family that posts them.
pub(crate) const ENTRY_POSTED: &str = "EntryPosted";
/// The stored type name of an account declaration (in a guard stream).
pub(crate) const ACCOUNT_DECLARED: &str = "AccountDeclared";

/// One account declaration: which (tenant, account, currency) and what was declared.
pub(crate) struct Declared {
    pub key: BalanceKey,
    pub declared: AccountDeclared,
}

/// The declaration an event records; None for every other event.
pub(crate) fn account_declared(event: &RecordedEvent) -> Result<Option<Declared>, ProjectionError> {
    if event.event_type != ACCOUNT_DECLARED {
        return Ok(None);
    }
    let malformed = |reason: String| ProjectionError::Malformed {
        position: event.position,
        reason,
    };
    let Some(StreamKind::Guard {
        tenant,
        account,
        currency,
    }) = StreamKind::parse(&event.stream_id)
    else {
        return Err(malformed(
            "an AccountDeclared outside a guard stream".to_owned(),
        ));
    };
    let decoded = Event::decode_raw(
        &event.stream_id,
        &event.event_type,
        event.schema,
        event.data.raw(),
    )
    .map_err(|e| malformed(e.to_string()))?;
    let Event::Guard(GuardEvent::AccountDeclared(declared)) = decoded else {
        return Err(malformed("an AccountDeclared that is not one".to_owned()));
    };
    Ok(Some(Declared {
        key: BalanceKey {
            tenant: tenant.as_str().to_owned(),
            account: account.as_str().to_owned(),
            currency: currency.code().to_owned(),
        },
        declared,
    }))
}

/// One posted journal entry, reduced to what the read model keeps.
pub(crate) struct Posted {
    pub tenant: String,
    pub legs: Vec<LegView>,
}

/// The journal entry an event posts; None for every other event. An `EntryPosted` that does not
/// decode is an error, never skipped: a skipped entry is a wrong balance.
pub(crate) fn entry_posted(event: &RecordedEvent) -> Result<Option<Posted>, ProjectionError> {
    let Some((entry, _)) = journal_entry(event)? else {
        return Ok(None);
    };
    Ok(Some(Posted {
        tenant: entry.tenant().as_str().to_owned(),
        legs: entry
            .legs()
            .iter()
            .map(|leg| LegView {
                account: leg.account.as_str().to_owned(),
                currency: leg.currency.code().to_owned(),
                amount_minor: leg.amount.minor(),
            })
            .collect(),
    }))
}

/// [`entry_posted`] as the domain's entry, for callers that copy out only what they keep, with
/// the merchant's description of the transfer it posts (a transfer's or hold's first entry).
pub(crate) fn journal_entry(
    event: &RecordedEvent,
) -> Result<Option<(JournalEntry, Option<String>)>, ProjectionError> {
    if event.event_type != ENTRY_POSTED {
        return Ok(None);
    }
    let decoded = Event::decode_raw(
        &event.stream_id,
        &event.event_type,
        event.schema,
        event.data.raw(),
    )
    .map_err(|e| ProjectionError::Malformed {
        position: event.position,
        reason: e.to_string(),
    })?;
    match decoded {
        Event::Payment(PaymentEvent::EntryPosted(posted))
        | Event::Transfer(TransferEvent::EntryPosted(posted))
        | Event::Payout(PayoutEvent::EntryPosted(posted)) => {
            let description = posted.transfer.and_then(|requested| requested.description);
            Ok(Some((posted.entry, description)))
        }
        _ => Err(ProjectionError::Malformed {
            position: event.position,
            reason: "an EntryPosted without a journal entry".to_owned(),
        }),
    }
}

/// A balance column as stored: `NUMERIC` read as text on PostgreSQL, decimal `TEXT` on SQLite.
/// Anything else in it is a corrupt read model, reported as a decode error.
pub(crate) fn balance(text: &str) -> Result<Balance, sqlx::Error> {
    text.parse::<Balance>()
        .map_err(|error| sqlx::Error::Decode(format!("balance {text:?}: {error}").into()))
}
