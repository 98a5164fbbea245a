//! Balances at a point of the past and statements, on both backends, against a model that reads
//! the log in its own order: an account with thousands of legs (so several marks), reads at
//! random positions and times, statements paged through, `verify_marks` naming a mark edited
//! by hand, and the spans that place a position in log order (`verify_spans`).

#![allow(clippy::unwrap_used)] // test code: a failed setup step should panic loudly

mod common;

use asiento_balances::{
    balance_at, entries_projection, statement, verify_marks, verify_spans, verify_spans_in_pages,
    Point, StatementQuery, MARK_LEGS,
};
use asiento_domain::{AccountName, Event};
use asiento_eventstore::Cursor;
use asiento_eventstore::StreamAppend;
use asiento_testkit::Rng;
use chrono::{DateTime, Utc};
use common::{entry_event, harness, start, Harness};

const TENANT: &str = "acme";
const ACCOUNT: &str = "customer:1:available";
const DEBITS: &str = "pending_debits:customer:1:available";
const CREDITS: &str = "pending_credits:customer:1:available";

/// (posted, pending debits, pending credits) of [`ACCOUNT`] after each entry of its tenant, in
/// log order, with the event's cursor, position and time; and its legs on [`ACCOUNT`] alone.
struct Model {
    after: Vec<(Cursor, i64, DateTime<Utc>, [i128; 3])>,
    /// (cursor, position, time, amount) of each leg on the account itself.
    legs: Vec<(Cursor, i64, DateTime<Utc>, i64)>,
}

async fn model(h: &Harness) -> Model {
    let mut figures = [0i128; 3];
    let mut model = Model {
        after: Vec::new(),
        legs: Vec::new(),
    };
    for recorded in &asiento_testkit::whole_log(h.store.as_ref()).await {
        let event = Event::decode_raw(
            &recorded.stream_id,
            &recorded.event_type,
            recorded.schema,
            recorded.data.raw(),
        )
        .unwrap();
        let Some(entry) = event.entry() else { continue };
        if entry.tenant().as_str() != TENANT {
            continue;
        }
        for leg in entry.legs().iter().filter(|l| l.currency.code() == "USD") {
            let amount = leg.amount.minor();
            let slot = match leg.account.as_str() {
                ACCOUNT => {
                    model.legs.push((
                        recorded.cursor,
                        recorded.position,
                        recorded.recorded_at,
                        amount,
                    ));
                    0
                }
                DEBITS => 1,
                CREDITS => 2,
                _ => continue,
            };
            // Pending debits are shown positive: the negated balance of `pending_debits:`.
            figures[slot] += if slot == 1 {
                -i128::from(amount)
            } else {
                i128::from(amount)
            };
        }
        model.after.push((
            recorded.cursor,
            recorded.position,
            recorded.recorded_at,
            figures,
        ));
    }
    model
}

/// Posts `n` entries on the account and its pending accounts (holds placed and released),
/// seeded, with other accounts' entries between them.
async fn post_history(h: &Harness, seed: u64, n: usize) {
    let mut rng = Rng::new(seed);
    for i in 0..n {
        let amount = rng.between(1, 5_000);
        let legs: Vec<(&str, &str, i64)> = match rng.below(5) {
            0 | 1 => vec![
                (ACCOUNT, "USD", amount),
                ("psp:sim:clearing", "USD", -amount),
            ],
            2 => vec![(ACCOUNT, "USD", -amount), ("merchant:shop", "USD", amount)],
            // A hold placed: money reserved to leave, and to reach the merchant.
            3 => vec![(DEBITS, "USD", -amount), (CREDITS, "USD", amount)],
            _ => vec![
                ("customer:2:available", "USD", amount),
                ("psp:sim:clearing", "USD", -amount),
            ],
        };
        h.post(TENANT, &legs).await;
        if i % 10 == 0 {
            // Another currency of the same account: never in its USD figures.
            h.post(
                TENANT,
                &[
                    (ACCOUNT, "EUR", amount),
                    ("psp:sim:clearing", "EUR", -amount),
                ],
            )
            .await;
        }
    }
}

async fn project(h: &Harness) -> tokio::sync::oneshot::Sender<()> {
    let (stop, _handle) = start(h.runner(entries_projection(), "points"));
    h.caught_up_to(&[asiento_balances::ENTRIES_NAME]).await;
    stop
}

/// The account's (posted, pending debits, pending credits) at a point, and the position read
/// after.
async fn read_at(
    h: &Harness,
    position: Option<i64>,
    time: Option<DateTime<Utc>>,
) -> Result<([i128; 3], i64), asiento_balances::BalanceError> {
    let account = AccountName::parse(ACCOUNT).unwrap();
    let read = balance_at(
        &h.db,
        h.store.as_ref(),
        TENANT,
        &account,
        "USD",
        Point { position, time },
    )
    .await?;
    let figures = [
        read.balance_minor.minor(),
        read.pending_debits_minor.minor(),
        read.pending_credits_minor.minor(),
    ];
    Ok((figures, read.as_of_position))
}

/// Reads at twenty random positions and twenty random times equal the model's figures after
/// the same event; the account has passed several marks.
async fn balances_at_random_points_equal_the_log_read_in_order(h: Harness) {
    post_history(&h, 50, 3_600).await;
    let _stop = project(&h).await;
    let model = model(&h).await;
    assert!(
        model.legs.len() as i64 > 2 * MARK_LEGS,
        "two marks and more"
    );
    let mut rng = Rng::new(51);
    for _ in 0..20 {
        let (_, position, _, figures) = *rng.pick(&model.after);
        let read = read_at(&h, Some(position), None).await.unwrap();
        assert_eq!(read, (figures, position), "at position {position}");
    }
    for _ in 0..20 {
        let (_, _, time, _) = *rng.pick(&model.after);
        // The model: after the tenant's last entry recorded at or before `time`, by time and
        // then log order.
        let (_, position, _, figures) = *model
            .after
            .iter()
            .filter(|(_, _, at, _)| *at <= time)
            .max_by_key(|(cursor, _, at, _)| (*at, *cursor))
            .unwrap();
        let read = read_at(&h, None, Some(time)).await.unwrap();
        assert_eq!(read, (figures, position), "at {time}");
    }
    // Before anything: zero, read after no event.
    let before = model.after[0].2 - chrono::Duration::seconds(1);
    assert_eq!(read_at(&h, None, Some(before)).await.unwrap(), ([0; 3], 0));
    assert!(matches!(
        read_at(&h, Some(1 << 40), None).await,
        Err(asiento_balances::BalanceError::UnknownPosition { .. })
    ));
}

/// A statement paged through: opening plus every line is the closing, each line's balance is
/// the one before plus its amount, and the lines are exactly the account's legs of the period.
async fn a_statement_adds_up_on_every_page(h: Harness) {
    post_history(&h, 60, 1_500).await;
    let _stop = project(&h).await;
    let model = model(&h).await;
    let from = model.legs[100].2;
    let to = model.legs[model.legs.len() - 100].2;
    let want: Vec<(i64, i64)> = model
        .legs
        .iter()
        .filter(|(_, _, at, _)| *at >= from && *at < to)
        .map(|(_, position, _, amount)| (*position, *amount))
        .collect();
    let mut query = StatementQuery {
        tenant: TENANT.to_owned(),
        account: ACCOUNT.to_owned(),
        currency: "USD".to_owned(),
        from: Some(from),
        to: Point {
            position: None,
            time: Some(to),
        },
        after: None,
        limit: 97,
    };
    let first = statement(&h.db, h.store.as_ref(), &query).await.unwrap();
    let (opening, closing) = (first.opening_balance_minor, first.closing_balance_minor);
    // Every later page reads the same period.
    query.to = Point {
        position: Some(first.closing_position),
        time: None,
    };
    let mut page = first;
    let mut running = opening;
    let mut got = Vec::new();
    loop {
        assert_eq!(
            (page.opening_balance_minor, page.closing_balance_minor),
            (opening, closing)
        );
        for line in &page.lines {
            running = running
                .checked_add(asiento_domain::Amount::new(line.amount_minor))
                .unwrap();
            assert_eq!(line.balance_minor, running, "line at {}", line.position);
            got.push((line.position, line.amount_minor));
        }
        let Some(after) = page.next_after else { break };
        query.after = Some(after);
        page = statement(&h.db, h.store.as_ref(), &query).await.unwrap();
    }
    assert_eq!(running, closing);
    assert_eq!(got, want);
    let before: i128 = model
        .legs
        .iter()
        .filter(|(_, _, at, _)| *at < from)
        .map(|(.., amount)| i128::from(*amount))
        .sum();
    assert_eq!(opening.minor(), before);
}

/// Every mark and run agrees with the legs, the journal with the legs and the legs with the log;
/// a mark, a run, a leg and a journal entry edited by hand are named.
async fn verify_names_an_edited_mark(h: Harness) {
    post_history(&h, 70, 2_000).await;
    let stop = project(&h).await;
    stop.send(()).unwrap();
    assert_eq!(verify_marks(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    let marks: i64 = asiento_projector::on_db!(&h.db, pool => {
        sqlx::query_scalar("SELECT COUNT(*) FROM balance_marks").fetch_one(pool).await.unwrap()
    });
    assert!(marks >= 1, "{marks} marks");
    let g = asiento_projector::checkpoint(&h.db, asiento_balances::ENTRIES_NAME)
        .await
        .unwrap()
        .unwrap()
        .generation;
    h.execute(&format!(
        "UPDATE balance_marks_g{g} SET balance_minor = '7' \
         WHERE legs = (SELECT MIN(legs) FROM balance_marks_g{g})"
    ))
    .await;
    h.execute(&format!(
        "UPDATE balance_runs_g{g} SET legs = legs + 1 WHERE account = '{ACCOUNT}' AND currency = 'EUR'"
    ))
    .await;
    // A leg edited by hand: its account's legs no longer sum to what the log gives it.
    h.execute(&format!(
        "UPDATE balance_legs_g{g} SET amount_minor = amount_minor + 1 \
         WHERE account = 'psp:sim:clearing' AND currency = 'USD' \
         AND position = (SELECT MAX(position) FROM balance_legs_g{g} \
         WHERE account = 'psp:sim:clearing' AND currency = 'USD')"
    ))
    .await;
    // A journal entry deleted by hand: the journal no longer lists its accounts' legs.
    h.execute(&format!(
        "DELETE FROM journal_entries_g{g} WHERE entry_id = \
         (SELECT MIN(entry_id) FROM journal_entries_g{g})"
    ))
    .await;
    let found = verify_marks(&h.db, h.store.as_ref()).await.unwrap();
    assert!(
        found
            .iter()
            .any(|m| m.detail.starts_with("the journal's entries give")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|m| m.detail.contains("stored mark")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|m| m.account == "psp:sim:clearing"
                && m.detail.contains("the log's entries give it")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|m| m.currency == "EUR" && m.detail.starts_with("run")),
        "{found:?}"
    );
}

/// `entries` journal entries of `amount` from clearing to the account, each a stream of its own,
/// to append in one transaction.
fn entries_to_clearing(tenant: &str, amount: i64, entries: usize) -> Vec<StreamAppend> {
    (0..entries)
        .map(|_| {
            let (stream_id, event) = entry_event(
                tenant,
                &[
                    (ACCOUNT, "USD", amount),
                    ("psp:sim:clearing", "USD", -amount),
                ],
            );
            StreamAppend {
                stream_id,
                expected: asiento_eventstore::ExpectedVersion::NoStream,
                events: vec![event],
            }
        })
        .collect()
}

/// Legs near the largest amount a deployment may allow: the legs between two marks add up far
/// beyond i64 (SQLite's integer sum would refuse them), and every read stays exact.
async fn balances_of_the_largest_amounts_are_exact(h: Harness) {
    let mut rng = Rng::new(70);
    for _ in 0..(2 * MARK_LEGS + 40) {
        let amount = 900_000_000_000_000_000 - rng.between(0, 1 << 40);
        let amount = if rng.below(4) == 0 { -amount } else { amount };
        h.post(
            TENANT,
            &[
                (ACCOUNT, "USD", amount),
                ("psp:sim:clearing", "USD", -amount),
            ],
        )
        .await;
    }
    let _stop = project(&h).await;
    let model = model(&h).await;
    assert!(
        model
            .after
            .iter()
            .any(|(.., figures)| figures[0] > i128::from(i64::MAX)),
        "the account's balance passes i64"
    );
    for _ in 0..20 {
        let (_, position, _, figures) = *rng.pick(&model.after);
        let read = read_at(&h, Some(position), None).await.unwrap();
        assert_eq!(read, (figures, position), "at position {position}");
    }
}

/// Entries posted by four writers at once, some several to a transaction, among other tenants'
/// entries: on PostgreSQL transactions take positions in any order, so a position's place in
/// log order is its transaction's. A read at any event's position (an entry of the account's
/// tenant or not) equals the model after the last of the tenant's entries up to that place;
/// with a span deleted by hand the read still answers right (the log places the position), and
/// `verify_spans` names the deleted span and a span edited by hand.
async fn balances_at_any_position_follow_the_log_order(h: Harness) {
    let mut writers = Vec::new();
    for writer in 0..4u64 {
        let store = h.store.clone();
        writers.push(tokio::spawn(async move {
            let mut rng = Rng::new(80 + writer);
            for _ in 0..150 {
                let amount = rng.between(1, 5_000);
                let tenant = if rng.below(3) == 0 { "globex" } else { TENANT };
                let entries = usize::try_from(rng.between(1, 3)).unwrap();
                store
                    .append(&entries_to_clearing(tenant, amount, entries))
                    .await
                    .unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let stop = project(&h).await;
    stop.send(()).unwrap();
    let model = model(&h).await;
    let log = asiento_testkit::whole_log(h.store.as_ref()).await;
    let figures_at = |cursor: Cursor| {
        model
            .after
            .iter()
            .rfind(|(at, ..)| *at <= cursor)
            .map_or(([0; 3], 0), |(_, position, _, figures)| {
                (*figures, *position)
            })
    };
    let mut rng = Rng::new(90);
    for _ in 0..40 {
        let event = rng.pick(&log);
        let (figures, _) = figures_at(event.cursor);
        let read = read_at(&h, Some(event.position), None).await.unwrap();
        assert_eq!(read, (figures, event.position), "at {}", event.position);
    }
    assert_eq!(verify_spans(&h.db, h.store.as_ref()).await.unwrap(), vec![]);
    let g = asiento_projector::checkpoint(&h.db, asiento_balances::ENTRIES_NAME)
        .await
        .unwrap()
        .unwrap()
        .generation;
    let gone = rng.pick(&log).position;
    h.execute(&format!(
        "DELETE FROM log_spans_g{g} WHERE first_position = \
         (SELECT MAX(first_position) FROM log_spans_g{g} WHERE first_position <= {gone})"
    ))
    .await;
    let read = read_at(&h, Some(gone), None).await.unwrap();
    let event = log.iter().find(|e| e.position == gone).unwrap();
    assert_eq!(
        read,
        (figures_at(event.cursor).0, gone),
        "at {gone}, its span deleted"
    );
    h.execute(&format!(
        "UPDATE log_spans_g{g} SET xact = xact + 1 \
         WHERE first_position = (SELECT MAX(first_position) FROM log_spans_g{g})"
    ))
    .await;
    let found: Vec<String> = verify_spans(&h.db, h.store.as_ref())
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.detail)
        .collect();
    assert!(
        found
            .iter()
            .any(|d| d.contains(&format!("the event at {gone} "))),
        "{found:?}"
    );
    assert!(found.iter().any(|d| d.contains("says xact")), "{found:?}");
    let sorted = |mut found: Vec<asiento_balances::SpanMismatch>| {
        found.sort_by(|a, b| (a.position, &a.detail).cmp(&(b.position, &b.detail)));
        found
    };
    // The first span made to reach into the second: an overlap across pages of one span.
    h.execute(&format!(
        "UPDATE log_spans_g{g} SET last_position = \
         (SELECT MIN(first_position) FROM log_spans_g{g} \
          WHERE first_position > (SELECT MIN(first_position) FROM log_spans_g{g})) \
         WHERE first_position = (SELECT MIN(first_position) FROM log_spans_g{g})"
    ))
    .await;
    let whole = sorted(verify_spans(&h.db, h.store.as_ref()).await.unwrap());
    assert!(
        whole.iter().any(|m| m.detail.contains("overlaps")),
        "{whole:?}"
    );
    for page_spans in 1..=3 {
        let paged = verify_spans_in_pages(&h.db, h.store.as_ref(), page_spans)
            .await
            .unwrap();
        assert_eq!(sorted(paged), whole, "{page_spans} spans a page");
    }
}

/// `verify_spans` and `verify_marks` while the legs projection applies four writers' appends:
/// every check answers, whatever commits meanwhile (each reads one snapshot), and finds the
/// spans and marks right (a check that stopped reading the log at a short page named spans the
/// log held, within a second).
async fn spans_and_marks_are_right_while_the_projection_runs(h: Harness) {
    let (_stop, _handle) = start(h.runner(entries_projection(), "race"));
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let mut writers = Vec::new();
    for writer in 0..4u64 {
        let store = h.store.clone();
        writers.push(tokio::spawn(async move {
            let mut n = 0u64;
            while std::time::Instant::now() < until {
                n += 1;
                let entries = usize::try_from(1 + (n + writer) % 13).unwrap();
                store
                    .append(&entries_to_clearing(TENANT, 5, entries))
                    .await
                    .unwrap();
            }
        }));
    }
    let mut checked = 0;
    while std::time::Instant::now() < until {
        let spans = verify_spans(&h.db, h.store.as_ref()).await.unwrap();
        assert_eq!(spans, vec![], "check {checked}");
        let spans = verify_spans_in_pages(&h.db, h.store.as_ref(), 2)
            .await
            .unwrap();
        assert_eq!(spans, vec![], "check {checked}, two spans a page");
        let marks = verify_marks(&h.db, h.store.as_ref()).await.unwrap();
        assert_eq!(marks, vec![], "check {checked}");
        checked += 1;
    }
    assert!(checked > 0, "no check ran");
    for writer in writers {
        writer.await.unwrap();
    }
}

asiento_testkit::both_backends!(
    fixture = harness;
    balances_at_random_points_equal_the_log_read_in_order,
    a_statement_adds_up_on_every_page,
    verify_names_an_edited_mark,
    balances_at_any_position_follow_the_log_order,
    balances_of_the_largest_amounts_are_exact,
    spans_and_marks_are_right_while_the_projection_runs,
);
