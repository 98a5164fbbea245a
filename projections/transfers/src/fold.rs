//! Folding a transfer stream into a row, through the domain's own decoder and `evolve`.
//!
//! Pure (no IO), so the projection's `apply` and the checker `verify` share exactly one
//! definition of what a row must be: the fold of the stream's contiguous prefix of versions.

use asiento_domain::transfer::evolve;
use asiento_domain::{StreamKind, Transfer, TransferEvent};
use asiento_eventstore::RecordedEvent;
use asiento_projector::history::{Kept, StreamFold};
use asiento_projector::ProjectionError;
use serde::{Deserialize, Serialize};

use crate::TransferRow;

/// The transfer id of a transfer stream's event; None for every other stream.
pub(crate) fn transfer_stream(event: &RecordedEvent) -> Option<String> {
    match StreamKind::parse(&event.stream_id) {
        Some(StreamKind::Transfer(id)) => Some(id.to_string()),
        _ => None,
    }
}

fn malformed(position: i64, reason: impl Into<String>) -> ProjectionError {
    ProjectionError::Malformed {
        position,
        reason: reason.into(),
    }
}

/// A transfer folded event by event, in version order: what a row stores (`state`) and the next
/// batch folds its new events onto.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Folder {
    transfer: Transfer,
    /// The position of the last event folded in.
    position: i64,
}

impl StreamFold for Folder {
    fn version(&self) -> u64 {
        self.transfer.version
    }

    fn push(&mut self, kept: &Kept) -> Result<(), ProjectionError> {
        let event = TransferEvent::decode_raw(&kept.event_type, kept.schema, kept.data.get())
            .map_err(|e| malformed(kept.position, e.to_string()))?;
        if kept.version != self.transfer.version + 1 {
            return Err(malformed(
                kept.position,
                format!(
                    "transfer stream version {} follows version {}",
                    kept.version, self.transfer.version
                ),
            ));
        }
        self.transfer = evolve(std::mem::take(&mut self.transfer), &event);
        self.position = kept.position;
        Ok(())
    }
}

impl Folder {
    /// The row the events so far fold to; None before the transfer's request.
    pub fn row(&self) -> Option<TransferRow> {
        let record = self.transfer.record.as_ref()?;
        let requested = &record.requested;
        Some(TransferRow {
            id: requested.transfer_id.to_string(),
            tenant: requested.tenant.as_str().to_owned(),
            from: requested.from.as_str().to_owned(),
            to: requested.to.as_str().to_owned(),
            status: record.status(),
            created_at: requested.at,
            object: asiento_objects::transfer_json(record, self.position),
            version: self.transfer.version,
            position: self.position,
        })
    }
}
