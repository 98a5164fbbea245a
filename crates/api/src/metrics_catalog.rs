//! Every metric the process exports, with the help text `/metrics` shows for it (`# HELP`), and
//! the buckets of its latency histograms. docs/operations.md gives the alert rules.
//!
//! One list, so that an on-call engineer reading `/metrics` finds every series explained; the
//! black-box test `every_metric_has_help` fails on a metric recorded without an entry here.

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};

/// Latency buckets in seconds, for every `*_seconds` histogram: from a cached read to a provider
/// call near its timeout.
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Describes every metric to the installed recorder.
pub fn describe() {
    describe_counter!(
        "asiento_http_requests_total",
        "HTTP requests answered, by route template, method and status"
    );
    describe_histogram!(
        "asiento_http_request_duration_seconds",
        Unit::Seconds,
        "Time from request to response, by route template, method and status"
    );
    describe_counter!(
        "asiento_provider_calls_total",
        "Calls to payment providers, by provider, operation and outcome (ok, declined, rejected, unknown, protocol_error, unsupported)"
    );
    describe_histogram!(
        "asiento_provider_call_duration_seconds",
        Unit::Seconds,
        "Duration of provider calls including the transport's retries, by provider and operation"
    );
    describe_gauge!(
        "asiento_reconciliation_exceptions_open",
        "Reconciliation exceptions open now, by kind and resolution (manual ones need a person)"
    );
    describe_gauge!(
        "asiento_idempotency_keys_in_flight",
        "Idempotency keys whose request has not completed; stuck: past their lease"
    );
    describe_gauge!(
        "asiento_provider_operations_pending",
        "Captures and refunds sent to a provider and not yet answered for good, by age band"
    );
    describe_counter!(
        "asiento_events_sealed_total",
        "Log events covered by the hash chain's seals"
    );
    describe_gauge!(
        "asiento_events_unsealed",
        "Log events the sealer has not covered yet"
    );
    describe_counter!(
        "asiento_seal_failures_total",
        "Sealer passes that failed (retried)"
    );
    describe_gauge!(
        "asiento_invariant_violations",
        "Violations found by the last scheduled invariant check, by check (0 when the books verify)"
    );
    describe_counter!(
        "asiento_facts_flagged_total",
        "Provider facts that contradicted a payment and flagged it for review"
    );
    describe_counter!(
        "asiento_finalize_conflicts_total",
        "Payment decisions that lost a version race and were decided again"
    );
    describe_histogram!(
        "asiento_group_commit_batch_size",
        "Steps written together by one group commit"
    );
    describe_histogram!(
        "asiento_group_commit_write_seconds",
        Unit::Seconds,
        "Time the group commit writer took to write one batch and answer its steps; the rate of its sum is the share of the time the writer is busy"
    );
    describe_counter!(
        "asiento_group_commit_guard_rebased_total",
        "Group-commit batches whose guard appends were rebased onto the log"
    );
    describe_counter!(
        "asiento_group_commit_retried_alone_total",
        "Steps written again alone after their batch could not commit"
    );
    describe_counter!(
        "asiento_holds_expired_total",
        "Holds the worker voided after their expires_at"
    );
    describe_counter!(
        "asiento_ledger_conflicts_total",
        "Ledger commands that lost a guard race and were decided again"
    );
    describe_histogram!(
        "asiento_projection_batch_seconds",
        Unit::Seconds,
        "Time to apply one batch of events to a projection, by projection"
    );
    describe_gauge!(
        "asiento_projection_lag_events",
        "Events in the log not yet applied by a projection, by projection"
    );
    describe_gauge!(
        "asiento_projection_lag_seconds",
        "Age of the oldest event a projection has not applied, by projection"
    );
    describe_gauge!(
        "asiento_projection_owner",
        "1 while this process holds the projection's lease, by projection"
    );
    describe_counter!(
        "asiento_reconciliation_exceptions_total",
        "Reconciliation exceptions recorded, by kind and resolution"
    );
    describe_counter!(
        "asiento_reconciliation_flagged_total",
        "Differences the reconciler found, by kind"
    );
    describe_counter!(
        "asiento_reconciliation_sweeps_total",
        "Reconciliation sweeps completed"
    );
    describe_counter!(
        "asiento_webhook_dead_letters_total",
        "Provider webhooks given up on and flagged, by reason"
    );
    describe_counter!(
        "asiento_webhook_events_processed_total",
        "Provider webhook events the worker finished, by outcome"
    );
    describe_gauge!(
        "asiento_webhook_inbox_depth",
        "Provider webhook events stored and not yet processed"
    );
    describe_histogram!(
        "asiento_webhook_processing_lag_seconds",
        Unit::Seconds,
        "Time from a provider webhook's receipt to its processing"
    );
    describe_counter!(
        "asiento_webhook_retries_total",
        "Provider webhook events whose processing failed and is retried"
    );
    describe_counter!(
        "asiento_webhook_deliveries_total",
        "Delivery attempts of merchant events to webhook endpoints, by outcome (succeeded, failed)"
    );
    describe_histogram!(
        "asiento_webhook_delivery_duration_seconds",
        Unit::Seconds,
        "Duration of one delivery attempt to a merchant's endpoint"
    );
    describe_gauge!(
        "asiento_webhook_deliveries_pending",
        "Deliveries to merchants' endpoints not yet succeeded nor given up"
    );
    describe_counter!(
        "asiento_webhooks_received_total",
        "Provider webhook requests received, by outcome"
    );
    describe_counter!(
        "asiento_rate_limited_total",
        "Requests refused 429 by a rate limit, by scope (key, tenant, address: /v1 without a known key, console: sign-in attempts)"
    );
    describe_counter!(
        "asiento_events_relay_published_total",
        "Merchant events the events relay published and JetStream stored, by relay"
    );
    describe_counter!(
        "asiento_events_relay_duplicates_total",
        "Publishes JetStream answered as duplicates (events published again after a crash, a lost acknowledgement or an outage), by relay"
    );
    describe_counter!(
        "asiento_events_relay_errors_total",
        "Events relay rounds that failed and are retried from the stored cursor, by relay and kind (nats, stream, database, config)"
    );
    describe_counter!(
        "asiento_standby_reads_total",
        "Query route reads meant for a standby, by standby and outcome: served, or asked of the primary because the standby was lagging (min_position not reached within --read-standby-wait), missing (a lookup by id it did not find) or failed"
    );
    describe_gauge!(
        "asiento_standby_lag_positions",
        "Log positions the primary is ahead of a standby, sampled each second by API processes with --read-database-url, by standby"
    );
    describe_gauge!(
        "asiento_standby_lag_seconds",
        Unit::Seconds,
        "Age of the newest transaction a standby applied while it has WAL left to apply (0 when it applied all it received), by standby"
    );
    describe_gauge!(
        "asiento_events_relay_lag_events",
        "Merchant events after the events relay's cursor, reported by the process holding its lease, by relay"
    );
    describe_gauge!(
        "asiento_events_relay_active",
        "1 on the process holding the events relay's lease, 0 on those waiting, by relay"
    );
    describe_gauge!(
        "asiento_events_relay_last_error_timestamp_seconds",
        "Unix time of the events relay's last failed round, by relay"
    );
}
