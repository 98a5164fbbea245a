//! What a seed did, counted for the run's summary line: requests, payments, crashes, what the
//! provider did (operations, asynchronous ones, refusals, reversals, disputes, dark ones), what
//! was left for a person (unresolved operations, flagged payments, counted by the shape of their
//! flags) and what the sweeps did about charges never answered. The summary shows that a run
//! exercised what it claims to, not only that it passed.

use std::collections::BTreeMap;

use asiento_app::exceptions::{self, Scope as ExceptionScope};

use super::knobs::Profile;
use super::world::Sim;

/// What one seed did, for the summary line.
#[derive(Default)]
pub struct SeedStats {
    crashes: u64,
    requests: u64,
    payments: u64,
    /// Captures and refunds the provider holds, and of those the asynchronous ones.
    operations: u64,
    asynchronous: u64,
    refusals: u64,
    reversals: u64,
    disputes: u64,
    /// Disputes whose webhooks were all dropped.
    dark: u64,
    /// Operations left open with their `operation_unresolved` exception.
    unresolved: u64,
    /// Payments left flagged for a person at the end, by the shape of their flags.
    flagged: u64,
    /// Never-answered charges the sweeps sent again, and cancelled by reference.
    resent: u64,
    cancelled_by_reference: u64,
    flags: BTreeMap<String, u64>,
}

impl SeedStats {
    pub fn add(&mut self, other: &SeedStats) {
        self.crashes += other.crashes;
        self.requests += other.requests;
        self.payments += other.payments;
        self.operations += other.operations;
        self.asynchronous += other.asynchronous;
        self.refusals += other.refusals;
        self.reversals += other.reversals;
        self.disputes += other.disputes;
        self.dark += other.dark;
        self.unresolved += other.unresolved;
        self.flagged += other.flagged;
        self.resent += other.resent;
        self.cancelled_by_reference += other.cancelled_by_reference;
        for (flag, count) in &other.flags {
            *self.flags.entry(flag.clone()).or_default() += count;
        }
    }

    /// What `sim` did, once it has converged (`unresolved` operations left with their exception).
    pub async fn of(sim: &Sim, profile: Profile, unresolved: usize) -> SeedStats {
        let mut flags: BTreeMap<String, u64> = BTreeMap::new();
        let mut flagged = 0;
        for record in sim.all_payments().await {
            flagged += usize::from(record.needs_review());
            for flag in &record.flags {
                // The reconciler's flags name their exception, shaped below.
                if !flag.detail.starts_with("reconciliation exception") {
                    *flags.entry(flag_shape(&flag.detail)).or_default() += 1;
                }
            }
        }
        let listed = exceptions::list(&sim.process.database, &ExceptionScope::All, None, i64::MAX)
            .await
            .unwrap();
        for exception in listed.iter().filter(|e| e.resolution == "manual") {
            let shape = format!(
                "{} exception, difference {}",
                exception.kind, exception.difference
            );
            *flags.entry(flag_shape(&shape)).or_default() += 1;
        }
        let state = sim.provider.state.lock().unwrap();
        SeedStats {
            crashes: u64::from(sim.crashes),
            requests: sim.requests.len() as u64,
            payments: sim.payments.len() as u64,
            operations: state.operations.len() as u64,
            asynchronous: if profile.async_modifications {
                state.operations.len() as u64
            } else {
                0
            },
            refusals: state.refusals,
            reversals: state.reversals,
            disputes: state.disputes,
            dark: state.dark.len() as u64,
            unresolved: unresolved as u64,
            flagged: flagged as u64,
            resent: sim.resent,
            cancelled_by_reference: sim.cancelled_by_reference,
            flags,
        }
    }

    /// The run's summary line, then its flags counted by shape.
    pub fn print_total(&self, count: u64, start: u64, steps: u32, began: std::time::Instant) {
        println!(
            "simulation: {count} seeds from {start} x {steps} steps in {:.1}s: {} requests, {} payments, {} crashes; provider: {} captures and refunds ({} asynchronous), {} refused, {} reversed, {} disputes ({} with every webhook dropped); {} operations left unresolved with their exception, {} payments flagged for review; {} never-answered charges sent again, {} cancelled by reference",
            began.elapsed().as_secs_f64(),
            self.requests,
            self.payments,
            self.crashes,
            self.operations,
            self.asynchronous,
            self.refusals,
            self.reversals,
            self.disputes,
            self.dark,
            self.unresolved,
            self.flagged,
            self.resent,
            self.cancelled_by_reference,
        );
        for (flag, count) in &self.flags {
            println!("  flagged {count}x: {flag}");
        }
    }
}

/// A flag's detail without its amounts and ids, to count flags by kind.
fn flag_shape(detail: &str) -> String {
    let mut shape = String::with_capacity(detail.len());
    for c in detail.chars() {
        if !c.is_ascii_digit() {
            shape.push(c);
        } else if !shape.ends_with('#') {
            shape.push('#');
        }
    }
    shape
}
