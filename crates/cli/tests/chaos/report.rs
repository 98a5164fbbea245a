//! What a run prints at its end and what fails it: the slowest key of the load with its answers in
//! order, the one summary line (every count a reader and `scripts/chaos` compare runs by, with the
//! seed that replays the run), then the problems (the first 40), and notes on what passes only
//! because it is left to a person. The problems are answered, not asserted here, so that the test
//! states what fails it.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::checks::Findings;
use crate::knobs::Knobs;
use crate::load::{Counters, Observation, Record};
use crate::pg_outage::OutageReport;

/// A key's first attempt, last answer, and its answers in order (status, how many in a row).
type KeySpan = (Instant, Instant, Vec<(u16, u32)>);

/// The request that took longest from its key's first attempt to its last answer, with its
/// answers in order (`POST … (key): 4.2s, answers 0x3 503x1 201x1`).
pub fn slowest_key(observations: &[Observation]) -> String {
    let mut spans: BTreeMap<&str, KeySpan> = BTreeMap::new();
    for seen in observations {
        let span =
            spans
                .entry(seen.what.as_str())
                .or_insert((seen.sent, seen.answered, Vec::new()));
        span.0 = span.0.min(seen.sent);
        span.1 = span.1.max(seen.answered);
        match span.2.last_mut() {
            Some((status, times)) if *status == seen.status => *times += 1,
            _ => span.2.push((seen.status, 1)),
        }
    }
    spans
        .iter()
        .max_by_key(|(_, span)| span.1 - span.0)
        .map(|(what, span)| {
            let answers: Vec<String> = span
                .2
                .iter()
                .map(|(status, times)| format!("{status}x{times}"))
                .collect();
            format!(
                "{what}: {:.1}s, answers {}",
                (span.1 - span.0).as_secs_f64(),
                answers.join(" ")
            )
        })
        .unwrap_or_default()
}

/// Everything one run found and counted, for its last lines.
pub struct Run<'a> {
    pub knobs: &'a Knobs,
    pub started: Instant,
    pub load_seconds: f64,
    pub kills_done: u32,
    pub counters: &'a Counters,
    pub record: &'a Record,
    pub findings: &'a Findings,
    pub replay_mismatches: &'a [String],
    pub outage: &'a OutageReport,
    /// The answers clients saw during the outage, by status.
    pub outage_answers: &'a BTreeMap<u16, u64>,
    /// The answers no client may get during the outage.
    pub outage_wrong: &'a [String],
    /// The longest a request in the outage waited for its answer, in seconds.
    pub outage_wait: f64,
    pub verified: bool,
    /// `asiento verify`'s `N not sealed`.
    pub unsealed: &'a str,
}

impl Run<'_> {
    /// Prints the summary line, the problems (the first 40) and the notes; answers the problems,
    /// each of which fails the run.
    pub fn conclude(&self) -> Vec<String> {
        let Run {
            knobs,
            started,
            load_seconds,
            kills_done,
            counters,
            record,
            findings,
            replay_mismatches,
            outage,
            outage_answers,
            outage_wrong,
            outage_wait,
            verified,
            unsealed,
        } = *self;
        let outage_500 = outage_answers.get(&500).copied().unwrap_or_default();
        let mismatches =
            findings.mismatches.len() + findings.pending.len() + replay_mismatches.len();
        let lost = findings.lost.len();
        let outage_text = match (outage.window, outage.recovered_in) {
            (None, _) => "none".to_owned(),
            (Some(_), recovered) => format!(
                "{:.1}s answers={outage_answers:?} longest_wait={outage_wait:.1}s recovered_in={}",
                outage.down.as_secs_f64(),
                recovered.map_or("NEVER".to_owned(), |took| format!(
                    "{:.1}s",
                    took.as_secs_f64()
                ))
            ),
        };
        println!(
            "chaos: requests={} retries={} kills={} charges={} payments={} keys={} accepted={} \
             unknown_202={} review={} captures={} refunds={} operations={} provider_operations={} \
             reversed={} unposted_reversals={} absent_pending={} unresolved_operations={} \
             open_operations={} \
             operation_mismatches={} \
             double_operations={} \
             mismatches={} double_charges={} lost={} split_keys={} pg_outage={outage_text} \
             verify={} ({unsealed}) load={:.1}s total={:.1}s seed={}",
            counters.requests.load(Ordering::Relaxed),
            counters.retries.load(Ordering::Relaxed),
            kills_done,
            findings.charges,
            findings.payments,
            record.bodies.len(),
            counters.accepted.load(Ordering::Relaxed),
            counters.unknown.load(Ordering::Relaxed),
            findings.review.len(),
            counters.captures.load(Ordering::Relaxed),
            counters.refunds.load(Ordering::Relaxed),
            findings.operations,
            findings.provider_operations,
            findings.reversed,
            findings.unposted_reversals.len(),
            findings.absent_pending.len(),
            findings.unresolved_operations.len(),
            findings.open_operations.len(),
            findings.operation_mismatches.len(),
            findings.double_operations.len(),
            mismatches,
            findings.double_charges.len(),
            lost,
            findings.keys_split.len(),
            if verified { "ok" } else { "FAILED" },
            load_seconds,
            started.elapsed().as_secs_f64(),
            knobs.seed,
        );
        let recovery = match (outage.window, outage.recovered_in) {
            (Some(_), None) => vec![format!(
                "the service did not create a payment within {:?} of PostgreSQL's restart",
                knobs.recovery
            )],
            _ => Vec::new(),
        };
        let mut strict = Vec::new();
        if outage_500 > 0 {
            strict.push(format!(
                "{outage_500} answer(s) during the outage were 500, not 503"
            ));
        }
        if knobs.strict {
            strict.extend(
                findings
                    .unposted_reversals
                    .iter()
                    .map(|reversal| format!("{reversal} (CHAOS_STRICT=1)")),
            );
            strict.extend(
                findings
                    .unresolved_operations
                    .iter()
                    .map(|unresolved| format!("{unresolved} (CHAOS_STRICT=1)")),
            );
        }
        let problems: Vec<&String> = findings
            .pending
            .iter()
            .chain(&findings.mismatches)
            .chain(&findings.double_charges)
            .chain(&findings.lost)
            .chain(&findings.keys_split)
            .chain(&findings.open_operations)
            .chain(&findings.operation_mismatches)
            .chain(&findings.double_operations)
            .chain(&findings.operation_answers)
            .chain(replay_mismatches)
            .chain(outage_wrong)
            .chain(&recovery)
            .chain(&strict)
            .collect();
        for problem in problems.iter().take(40) {
            println!("chaos: problem: {problem}");
        }
        for reversal in &findings.unposted_reversals {
            println!(
                "chaos: note: {reversal} (its webhook was lost; docs/reconciliation.md: `ambiguous`, \
                 manual; CHAOS_STRICT=1 fails on it)"
            );
        }
        for unresolved in &findings.unresolved_operations {
            println!(
                "chaos: note: {unresolved} (all its notifications dropped; docs/providers.md: \
                 `operation_unresolved`, manual; CHAOS_STRICT=1 fails on it)"
            );
        }
        if !findings.absent_pending.is_empty() {
            println!(
                "chaos: note: pending, never at the provider (concluded absent only after two days \
                 of reports): {:?}",
                findings.absent_pending
            );
        }
        if !findings.review.is_empty() {
            println!("chaos: flagged for review: {:?}", findings.review);
        }
        problems.into_iter().cloned().collect()
    }
}
