//! A report file as a table read by header name: Adyen reorders and adds columns (the 2023
//! platform migration did both), so a column is found by its name in the header, never by its
//! position, and a column the reader does not ask for is ignored.

use chrono::{DateTime, FixedOffset, NaiveDateTime, TimeZone as _, Utc};

use super::amount::{minor_units, AmountError};
use super::ReportError;

/// The most rows one report file may have; a bigger one is refused rather than read into memory.
pub const ROWS_MAX: usize = 1_000_000;

/// A parsed header and the file's rows.
pub(super) struct Table {
    report: &'static str,
    header: Vec<String>,
    rows: Vec<csv::StringRecord>,
}

impl Table {
    pub fn parse(report: &'static str, text: &[u8]) -> Result<Table, ReportError> {
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(true)
            .flexible(false)
            .trim(csv::Trim::All)
            .from_reader(text);
        let csv_error = |error: csv::Error| ReportError::Csv {
            report,
            line: error.position().map_or(0, csv::Position::line),
            error: error.to_string(),
        };
        let header = reader
            .headers()
            .map_err(csv_error)?
            .iter()
            // A file saved by a spreadsheet may start with a byte order mark.
            .map(|name| name.trim_start_matches('\u{feff}').to_owned())
            .collect();
        let mut rows = Vec::new();
        for record in reader.records() {
            if rows.len() >= ROWS_MAX {
                return Err(ReportError::TooManyRows { report });
            }
            rows.push(record.map_err(csv_error)?);
        }
        Ok(Table {
            report,
            header,
            rows,
        })
    }

    /// Where the column `name` is; an error naming it when the file has none.
    pub fn column(&self, name: &'static str) -> Result<Column, ReportError> {
        self.optional_column(name)
            .ok_or(ReportError::ColumnMissing {
                report: self.report,
                column: name,
            })
    }

    /// Where the column `name` is, if the file has it.
    pub fn optional_column(&self, name: &'static str) -> Option<Column> {
        self.header
            .iter()
            .position(|header| header == name)
            .map(|index| Column { index, name })
    }

    /// Every row with its line number (the header is line 1).
    pub fn rows(&self) -> impl Iterator<Item = Row<'_>> {
        self.rows.iter().enumerate().map(|(index, record)| Row {
            report: self.report,
            line: index as u64 + 2,
            record,
        })
    }
}

/// A column found in the header.
#[derive(Clone, Copy, Debug)]
pub(super) struct Column {
    index: usize,
    name: &'static str,
}

/// One row, read by [`Column`].
pub(super) struct Row<'a> {
    report: &'static str,
    pub line: u64,
    record: &'a csv::StringRecord,
}

impl Row<'_> {
    pub fn text(&self, column: Column) -> &str {
        self.record.get(column.index).unwrap_or_default()
    }

    pub fn optional_text(&self, column: Option<Column>) -> Option<&str> {
        column
            .map(|column| self.text(column))
            .filter(|text| !text.is_empty())
    }

    /// A non-empty value.
    pub fn required(&self, column: Column) -> Result<&str, ReportError> {
        let text = self.text(column);
        if text.is_empty() {
            return Err(self.invalid(column, "is empty".to_owned()));
        }
        Ok(text)
    }

    /// An amount of `currency`, in minor units (empty is zero).
    pub fn minor(&self, column: Column, currency: &str) -> Result<i64, ReportError> {
        minor_units(self.text(column), currency).map_err(|error| self.amount(column, error))
    }

    /// A date (`2026-07-01 10:15:00`, in the row's `TimeZone`), or ISO 8601 with an offset.
    pub fn date(&self, column: Column, zone: Option<Column>) -> Result<DateTime<Utc>, ReportError> {
        let text = self.required(column)?;
        if let Ok(date) = DateTime::parse_from_rfc3339(text) {
            return Ok(date.with_timezone(&Utc));
        }
        let local = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
            .map_err(|error| self.invalid(column, format!("{text:?} is not a date: {error}")))?;
        let zone_text = self.optional_text(zone).unwrap_or("UTC");
        let offset = offset_of(zone_text).ok_or_else(|| {
            let zone = zone.unwrap_or(column);
            self.invalid(
                zone,
                format!("{zone_text:?} is not a time zone the reader knows"),
            )
        })?;
        offset
            .from_local_datetime(&local)
            .single()
            .map(|date| date.with_timezone(&Utc))
            .ok_or_else(|| self.invalid(column, format!("{text:?} is not a time")))
    }

    pub fn invalid(&self, column: Column, why: String) -> ReportError {
        ReportError::ValueInvalid {
            report: self.report,
            line: self.line,
            column: column.name,
            why,
        }
    }

    fn amount(&self, column: Column, error: AmountError) -> ReportError {
        ReportError::Amount {
            report: self.report,
            line: self.line,
            column: column.name,
            error,
        }
    }
}

/// The offset a report's `TimeZone` names: UTC, the central European zones Adyen's sample files
/// use, or an explicit `+01:00`. Anything else is refused rather than guessed.
fn offset_of(zone: &str) -> Option<FixedOffset> {
    let hours = |h: i32| FixedOffset::east_opt(h * 3600);
    match zone {
        "UTC" | "GMT" | "Z" => hours(0),
        "CET" => hours(1),
        "CEST" => hours(2),
        _ => {
            let (sign, rest) = match zone.as_bytes().first() {
                Some(b'+') => (1, &zone[1..]),
                Some(b'-') => (-1, &zone[1..]),
                _ => return None,
            };
            let (h, m) = rest.split_once(':')?;
            let (h, m): (i32, i32) = (h.parse().ok()?, m.parse().ok()?);
            if !(0..=14).contains(&h) || !(0..60).contains(&m) {
                return None;
            }
            FixedOffset::east_opt(sign * (h * 3600 + m * 60))
        }
    }
}
