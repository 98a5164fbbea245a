//! Adyen's reconciliation data: CSV reports, since Adyen has no lookup API (docs/adyen-wire.md
//! §5). The daily Payment accounting report is the settlement report of the port (every status
//! change per payment, booking-dated: [`accounting`]); each Settlement details report is one
//! payout batch with the fees Adyen kept ([`settlement`]). Files are read by header name
//! ([`table`]), amounts converted to minor units in one place ([`amount`]), and downloaded as
//! the report user with basic auth ([`download`]).

pub mod accounting;
pub mod amount;
pub mod download;
mod port;
pub mod settlement;
mod table;

pub use amount::{major_units, minor_units, AmountError};
pub use download::{
    accounting_file, batch_of_event, batch_of_payout, payout_id, settlement_file, ReportsAccess,
    ReportsInitError, BATCHES_CACHED_MAX, BATCH_PROBES_MAX, HISTORY_DAYS_MAX, WINDOW_DAYS_MAX,
};
pub use table::ROWS_MAX;

/// Why a report file does not read as one. The file came from the provider: nothing of it is
/// trusted, and a file that does not read is an error, never a partial answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("{report}: not CSV at line {line}: {error}")]
    Csv {
        report: &'static str,
        line: u64,
        error: String,
    },
    #[error("{report}: more than {ROWS_MAX} rows")]
    TooManyRows { report: &'static str },
    #[error("{report}: no column {column:?} in the header")]
    ColumnMissing {
        report: &'static str,
        column: &'static str,
    },
    #[error("{report}, line {line}, {column:?}: {error}")]
    Amount {
        report: &'static str,
        line: u64,
        column: &'static str,
        error: AmountError,
    },
    #[error("{report}, line {line}, {column:?}: {why}")]
    ValueInvalid {
        report: &'static str,
        line: u64,
        column: &'static str,
        why: String,
    },
    #[error("{report}: {why}")]
    Inconsistent { report: &'static str, why: String },
}
