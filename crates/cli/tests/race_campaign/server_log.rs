//! The server's own account of its 500s: an `internal_error` answer carries no detail (by
//! design), so the campaign reads the server's log for its `internal error` lines and groups
//! them by message, ids blanked, with one example each.

use std::collections::BTreeMap;

/// (message with ids blanked) → (count, one line as logged).
pub fn internal_errors(log: &str) -> BTreeMap<String, (u64, String)> {
    let mut found: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for line in log.lines().filter(|line| line.contains("internal error")) {
        let message = line
            .split_once("error=")
            .map_or(line, |(_, message)| message);
        let entry = found
            .entry(blank_ids(message))
            .or_insert_with(|| (0, line.to_owned()));
        entry.0 += 1;
    }
    found
}

/// `pay_…`, `tr_…`, `je_…` ids replaced by their prefix and `…`.
fn blank_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (n, word) in text.split(' ').enumerate() {
        if n > 0 {
            out.push(' ');
        }
        match ["pay_", "tr_", "je_"]
            .iter()
            .find(|prefix| word.starts_with(**prefix))
        {
            Some(prefix) => {
                out.push_str(prefix);
                out.push('…');
            }
            None => out.push_str(word),
        }
    }
    out
}
