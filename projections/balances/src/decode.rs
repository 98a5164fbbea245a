//! Reading journal entries out of the log, through the domain's own decoder (so upcasting and
//! the zero-sum rule are the domain's, checked again here where the entry is read).

use asiento_domain::{Balance, Event, JournalEntry, PaymentEvent, TransferEvent};
use asiento_eventstore::RecordedEvent;
use asiento_projector::ProjectionError;

use crate::LegView;

/// The stored type name of a journal entry, in every stream family that posts them.
pub(crate) const ENTRY_POSTED: &str = "EntryPosted";

/// One posted journal entry, reduced to what the read model keeps.
pub(crate) struct Posted {
    pub tenant: String,
    pub legs: Vec<LegView>,
}

/// The journal entry an event posts; None for every other event. An `EntryPosted` that does not
/// decode is an error, never skipped: a skipped entry is a wrong balance.
pub(crate) fn entry_posted(event: &RecordedEvent) -> Result<Option<Posted>, ProjectionError> {
    let Some(entry) = journal_entry(event)? else {
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

/// [`entry_posted`] as the domain's entry, for callers that copy out only what they keep.
pub(crate) fn journal_entry(
    event: &RecordedEvent,
) -> Result<Option<JournalEntry>, ProjectionError> {
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
        | Event::Transfer(TransferEvent::EntryPosted(posted)) => Ok(Some(posted.entry)),
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
