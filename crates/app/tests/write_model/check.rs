//! Judges one written batch: each step's outcome against the model's verdict on that step applied
//! alone, in batch order, to the log as the written steps before it leave it; then the database
//! against the model (every stream the batch names, event by event; every key and inbox row of
//! the case).

use std::collections::{BTreeMap, HashMap, HashSet};

use asiento_app::commit::{CommitError, Committed};
use asiento_app::log::Store;
use asiento_domain::guard::GuardEvent;
use asiento_domain::StreamKind;
use asiento_eventstore::{Appended, Database, RecordedEvent};

use crate::model::{Held, Key, Model, Refusal};
use crate::step::{answer, Step, TENANT};

/// Where a case's batches are written: its database, the store on it, and what the case's keys
/// and inbox ids start with.
pub struct Case<'a> {
    pub database: &'a Database,
    pub store: &'a Store,
    pub prefix: &'a str,
}

/// The versions a written step's appends took (stream, first, last), and its append's answer.
struct Span {
    appended: Appended,
    versions: Vec<(String, u64, u64)>,
}

/// What the outcomes of a run were, so that a run that exercised nothing fails.
#[derive(Debug, Default)]
pub struct Tally {
    pub written: u64,
    pub rebased: u64,
    pub not_fresh: u64,
    pub conflict: u64,
    pub lease_lost: u64,
    /// Steps answered `Conflict` that the model would have written (a lost race the request
    /// decides again: allowed, never for a step that shares nothing with the rest of its batch
    /// and expects the log as it stands).
    pub conflict_model_writes: u64,
}

/// Applies `outcomes` to `model` as the model judges them, panicking at the first outcome the
/// model contradicts, then compares the database with the model. `context` names the batch.
pub async fn batch(
    case: &Case<'_>,
    model: &mut Model,
    steps: &[Step],
    outcomes: Vec<Result<Committed, CommitError>>,
    tally: &mut Tally,
    context: &str,
) {
    let independent = independent(steps);
    // The batch in one line per step, for a failure's message.
    let summary: Vec<String> = steps
        .iter()
        .zip(&outcomes)
        .enumerate()
        .map(|(i, (step, outcome))| {
            format!(
                "{i}: claim {:?} completion {:?} inbox {:?} appends {:?} facts {} -> {outcome:?}",
                step.claim,
                step.completion,
                step.inbox,
                step.appends
                    .iter()
                    .map(|a| (&a.stream_id, a.expected))
                    .collect::<Vec<_>>(),
                step.facts
            )
        })
        .collect();
    let summary = summary.join("\n");
    // The position span each written step's events must have: its append's answer.
    let mut spans: Vec<Span> = Vec::new();
    let mut answers: HashMap<String, Vec<u8>> = HashMap::new();
    for (i, (step, outcome)) in steps.iter().zip(outcomes).enumerate() {
        let verdict = model.judge(step);
        let at = || format!("{context}\n{summary}\nstep {i}: {step:#?}\nmodel: {verdict:?}");
        let outcome = outcome.unwrap_or_else(|error| panic!("{}\nfailed: {error}", at()));
        match outcome {
            Committed::Written(appended) | Committed::Rebased(appended, _) if verdict.is_err() => {
                panic!(
                    "{}\nwritten ({appended:?}) though the model writes nothing of it",
                    at()
                );
            }
            Committed::Written(appended) => {
                let accepted = verdict.clone().expect("checked above");
                assert!(
                    !accepted.rebased,
                    "{}\nwritten as decided onto another state than it was decided on",
                    at()
                );
                tally.written += 1;
                record(step, &accepted.appends, appended, &mut spans, &mut answers);
                model.apply(step, &accepted);
            }
            Committed::Rebased(appended, states) => {
                let accepted = verdict.clone().expect("checked above");
                tally.rebased += 1;
                record(step, &accepted.appends, appended, &mut spans, &mut answers);
                model.apply(step, &accepted);
                for (key, state) in states {
                    assert_eq!(
                        model.guard(&key.stream()),
                        state,
                        "{}\nthe state a rebased step reports is not the model's",
                        at()
                    );
                }
            }
            Committed::NotFresh => {
                tally.not_fresh += 1;
                refused_for(&verdict, Refusal::NotFresh, &at);
            }
            Committed::LeaseLost => {
                tally.lease_lost += 1;
                refused_for(&verdict, Refusal::LeaseLost, &at);
            }
            Committed::Conflict => {
                tally.conflict += 1;
                // A step the model refuses for any reason may be answered `Conflict`: its
                // request decides again and meets that reason.
                match &verdict {
                    Err(_) => {}
                    Ok(accepted) => {
                        tally.conflict_model_writes += 1;
                        assert!(
                            !independent[i] || accepted.rebased,
                            "{}\nanswered Conflict though it shares nothing with its batch and \
                             expects the log as it stands",
                            at()
                        );
                    }
                }
            }
        }
    }
    let context = &format!("{context}\n{summary}");
    compare_streams(case.store, model, steps, &spans, context).await;
    compare_keys(case.database, case.prefix, model, &answers, context).await;
    compare_inbox(case.database, case.prefix, model, context).await;
}

fn refused_for(
    verdict: &Result<crate::model::Accepted, Vec<Refusal>>,
    reason: Refusal,
    at: &dyn Fn() -> String,
) {
    match verdict {
        Err(refusals) if refusals.contains(&reason) => {}
        _ => panic!(
            "{}\nanswered {reason:?}, which the model does not give",
            at()
        ),
    }
}

/// Keeps what a written step's answer must show: the positions its events took, and the
/// stored answer of its completion.
fn record(
    step: &Step,
    appends: &[(String, u64, Vec<Held>)],
    appended: Option<Appended>,
    spans: &mut Vec<Span>,
    answers: &mut HashMap<String, Vec<u8>>,
) {
    if let Some((key, _)) = &step.completion {
        let position = appended.as_ref().map(|a| a.last_position);
        answers.insert(key.clone(), answer(key, position).body);
    }
    match appended {
        Some(appended) => {
            let versions = appends
                .iter()
                .map(|(stream, from, events)| {
                    (stream.clone(), from + 1, from + events.len() as u64)
                })
                .collect();
            spans.push(Span { appended, versions });
        }
        None => assert!(appends.is_empty(), "a step with events answered no append"),
    }
}

/// Every stream the batch names holds exactly the model's events, and each written step's
/// answer names the streams' new versions and the positions its events took.
async fn compare_streams(
    store: &Store,
    model: &Model,
    steps: &[Step],
    spans: &[Span],
    context: &str,
) {
    let names: Vec<String> = steps
        .iter()
        .flat_map(|step| step.appends.iter().map(|a| a.stream_id.clone()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let events = store
        .read_streams(&names)
        .await
        .expect("read the batch's streams");
    let mut by_stream: BTreeMap<&str, Vec<&RecordedEvent>> = BTreeMap::new();
    for event in &events {
        by_stream.entry(&event.stream_id).or_default().push(event);
    }
    for name in &names {
        let held = model.streams.get(name).map_or(&[][..], Vec::as_slice);
        let logged = by_stream.get(name.as_str()).map_or(&[][..], Vec::as_slice);
        let logged_held: Vec<Held> = logged
            .iter()
            .map(|event| match StreamKind::parse(name) {
                Some(StreamKind::Guard { .. }) => Held::Guard(
                    GuardEvent::decode_raw(&event.event_type, event.schema, event.data.raw())
                        .expect("a guard event"),
                ),
                _ => Held::Plain(event.event_id),
            })
            .collect();
        assert_eq!(
            logged_held, held,
            "{context}: stream {name} in the log is not the model's"
        );
    }
    for Span { appended, versions } in spans {
        let mut positions = Vec::new();
        for (stream, first, last) in versions {
            let logged = &by_stream[stream.as_str()];
            positions.extend(
                logged
                    .iter()
                    .filter(|e| (*first..=*last).contains(&e.version))
                    .map(|e| e.position),
            );
        }
        let streams: Vec<(String, u64)> = versions
            .iter()
            .map(|(stream, _, last)| (stream.clone(), *last))
            .collect();
        assert_eq!(appended.streams, streams, "{context}: the append's answer");
        assert_eq!(
            (positions.iter().min(), positions.iter().max()),
            (
                Some(&appended.first_position),
                Some(&appended.last_position)
            ),
            "{context}: the positions the append answered for {streams:?}"
        );
    }
}

/// Every key of the case is held, completed, or absent as in the model, and a completed key
/// stores the answer rendered with its step's last position.
async fn compare_keys(
    database: &Database,
    prefix: &str,
    model: &Model,
    answers: &HashMap<String, Vec<u8>>,
    context: &str,
) {
    let rows: Vec<(String, String, String, Option<Vec<u8>>)> = match database {
        Database::Postgres(pool) => sqlx::query_as(
            "select key, state, lease_owner::text, response_body from idempotency_keys \
             where tenant = $1 and key like $2",
        )
        .bind(TENANT)
        .bind(format!("{prefix}%"))
        .fetch_all(pool)
        .await
        .expect("read keys"),
        Database::Sqlite(pool) => sqlx::query_as(
            "select key, state, lease_owner, response_body from idempotency_keys \
             where tenant = ?1 and key like ?2",
        )
        .bind(TENANT)
        .bind(format!("{prefix}%"))
        .fetch_all(pool)
        .await
        .expect("read keys"),
    };
    let logged: HashMap<String, Key> = rows
        .iter()
        .map(|(key, state, owner, body)| {
            let owner = owner.parse().expect("a uuid");
            let record = match state.as_str() {
                "in_flight" => Key::InFlight(owner),
                _ => {
                    if let Some(expected) = answers.get(key) {
                        assert_eq!(
                            body.as_deref(),
                            Some(&expected[..]),
                            "{context}: key {key}'s stored answer"
                        );
                    }
                    Key::Completed(owner)
                }
            };
            (key.clone(), record)
        })
        .collect();
    let differ: Vec<_> = logged
        .keys()
        .chain(model.keys.keys())
        .collect::<HashSet<_>>()
        .into_iter()
        .filter(|key| logged.get(*key) != model.keys.get(*key))
        .map(|key| (key, logged.get(key), model.keys.get(key)))
        .collect();
    assert!(
        differ.is_empty(),
        "{context}: keys (log, model) that are not the model's: {differ:?}"
    );
}

async fn compare_inbox(database: &Database, prefix: &str, model: &Model, context: &str) {
    let ids: Vec<String> = match database {
        Database::Postgres(pool) => {
            sqlx::query_scalar("select event_id from webhook_inbox where event_id like $1")
                .bind(format!("{prefix}%"))
                .fetch_all(pool)
                .await
        }
        Database::Sqlite(pool) => {
            sqlx::query_scalar("select event_id from webhook_inbox where event_id like ?1")
                .bind(format!("{prefix}%"))
                .fetch_all(pool)
                .await
        }
    }
    .expect("read the inbox");
    let logged: HashSet<String> = ids.into_iter().collect();
    assert_eq!(
        logged, model.inbox,
        "{context}: the inbox is not the model's"
    );
}

/// Per step, whether no other step of the batch names one of its streams, keys or inbox rows.
fn independent(steps: &[Step]) -> Vec<bool> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for step in steps {
        for name in step.names() {
            *seen.entry(name).or_default() += 1;
        }
    }
    steps
        .iter()
        .map(|step| step.names().iter().all(|name| seen[name] == 1))
        .collect()
}
