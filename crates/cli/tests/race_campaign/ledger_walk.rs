//! The busy account's history, replayed from its legs in log order: its posted balance (the legs
//! of the account) and its available balance (posted, less what open holds reserve: the legs of
//! `pending_debits:{account}`, as docs/ledger.md defines it for a credit-normal account), entry by
//! entry. Both are read through the API (`GET /v1/accounts/{account}/entries`), so this is what
//! a client can prove from outside.
//!
//! Every entry that touches the account changes its one debit guard, and a guard's appends
//! follow each other in commit order, so the two lists merge by position into the order the
//! guard decided them in. A command (a transfer, a hold, its post) never takes either balance
//! below zero; a provider fact (a refund of money the customer has spent since) may, and the
//! domain records and flags it (docs/ledger.md, Accounts): such a dip is counted and shown, not
//! failed. An entry whose legs name a `psp:` account is a provider fact.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::tally::Caller;

/// Legs per page, the route's most.
const PAGE: usize = 1_000;
/// Pages read at most (a million legs).
const PAGES_MAX: usize = 1_000;
/// How long a read waits, at most, for the read model to reach the last position.
const CATCH_UP: Duration = Duration::from_secs(60);
/// Reads of one page at most while the read model lags (each waits up to 5 s in the server).
const CATCH_UP_TRIES: u32 = 60;

/// What the replay found.
pub struct Walk {
    pub entries: usize,
    pub posted: i64,
    pub available: i64,
    pub lowest_posted: i64,
    pub lowest_available: i64,
    /// Provider facts that took a balance below zero (allowed, and flagged by the guard).
    pub fact_dips: Vec<String>,
    /// Commands that took a balance below zero, or a replay that disagrees with the balance
    /// route: each a failure.
    pub wrong: Vec<String>,
}

/// One entry's effect on the account: on its posted balance and on its pending debits' account.
#[derive(Default)]
struct Effect {
    entry_id: String,
    posted: i64,
    pending: i64,
}

/// Replays `account`'s legs up to `last_position`.
pub async fn walk(caller: &Caller, account: &str, last_position: i64) -> Result<Walk, String> {
    let mut effects: BTreeMap<i64, Effect> = BTreeMap::new();
    for (which, name) in [
        (Side::Posted, account.to_owned()),
        (Side::Pending, format!("pending_debits:{account}")),
    ] {
        for (position, entry_id, amount) in legs(caller, &name, last_position).await? {
            let effect = effects.entry(position).or_default();
            if !effect.entry_id.is_empty() && effect.entry_id != entry_id {
                return Err(format!(
                    "entries {} and {entry_id} at one position {position}",
                    effect.entry_id
                ));
            }
            effect.entry_id = entry_id;
            match which {
                Side::Posted => effect.posted += amount,
                Side::Pending => effect.pending += amount,
            }
        }
    }
    let mut walk = Walk {
        entries: effects.len(),
        posted: 0,
        available: 0,
        lowest_posted: 0,
        lowest_available: 0,
        fact_dips: Vec::new(),
        wrong: Vec::new(),
    };
    let mut pending = 0i64;
    for (position, effect) in &effects {
        walk.posted += effect.posted;
        pending += effect.pending;
        // `pending_debits:{account}` is negative by what holds reserve.
        walk.available = walk.posted + pending;
        walk.lowest_posted = walk.lowest_posted.min(walk.posted);
        walk.lowest_available = walk.lowest_available.min(walk.available);
        let posted_dip = effect.posted < 0 && walk.posted < 0;
        let available_dip = effect.posted + effect.pending < 0 && walk.available < 0;
        if !(posted_dip || available_dip) {
            continue;
        }
        let entry = caller
            .get(
                "read journal",
                &format!(
                    "/v1/journal/{}?min_position={last_position}",
                    effect.entry_id
                ),
            )
            .await
            .ok_or_else(|| format!("journal entry {} unreadable", effect.entry_id))?;
        let fact = entry["legs"].as_array().is_some_and(|legs| {
            legs.iter().any(|leg| {
                leg["account"]
                    .as_str()
                    .is_some_and(|a| a.starts_with("psp:"))
            })
        });
        let line = format!(
            "at position {position} entry {} left posted {} and available {}: {entry}",
            effect.entry_id, walk.posted, walk.available
        );
        if fact {
            walk.fact_dips.push(line);
        } else {
            walk.wrong
                .push(format!("a command overdrew the account {line}"));
        }
    }
    let balance = caller
        .get(
            "read balance",
            &format!("/v1/accounts/{account}/balance?currency=USD&min_position={last_position}"),
        )
        .await
        .ok_or("the balance route did not answer")?;
    let read = (
        balance["balance_minor"].as_i64(),
        balance["available_minor"].as_i64(),
    );
    if read != (Some(walk.posted), Some(walk.available)) {
        walk.wrong.push(format!(
            "the legs replay to posted {} and available {}, the balance route says {balance}",
            walk.posted, walk.available
        ));
    }
    Ok(walk)
}

enum Side {
    Posted,
    Pending,
}

/// `account`'s legs, oldest first, as (position, entry id, amount), once the read model holds
/// `last_position`.
async fn legs(
    caller: &Caller,
    account: &str,
    last_position: i64,
) -> Result<Vec<(i64, String, i64)>, String> {
    let mut legs = Vec::new();
    let mut after: Option<i64> = None;
    for _ in 0..PAGES_MAX {
        let mut path = format!(
            "/v1/accounts/{account}/entries?currency=USD&limit={PAGE}&min_position={last_position}"
        );
        if let Some(after) = after {
            path.push_str(&format!("&after={after}"));
        }
        let page = page(caller, &path).await?;
        for leg in page["data"].as_array().ok_or("a page without data")? {
            let position = leg["position"].as_i64().ok_or("a leg without position")?;
            let entry_id = leg["entry_id"].as_str().ok_or("a leg without entry")?;
            let amount = leg["amount_minor"].as_i64().ok_or("a leg without amount")?;
            legs.push((position, entry_id.to_owned(), amount));
        }
        match page["next_after"].as_i64() {
            Some(next) => after = Some(next),
            None => return Ok(legs),
        }
    }
    Err(format!("{account} has more than {PAGES_MAX} pages of legs"))
}

/// One page, waiting out the read model's lag (503 `projection_lagging`) for at most
/// [`CATCH_UP`].
async fn page(caller: &Caller, path: &str) -> Result<Value, String> {
    let deadline = Instant::now() + CATCH_UP;
    for _ in 0..CATCH_UP_TRIES {
        let request = caller
            .client
            .http
            .get(format!("{}{path}", caller.client.base))
            .bearer_auth(&caller.client.key);
        let response = request.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.map_err(|e| format!("{path}: {e}"))?;
        match status {
            200 => return Ok(body),
            503 if body["code"] == "projection_lagging" && Instant::now() < deadline => {}
            _ => return Err(format!("{path} answered {status}: {body}")),
        }
    }
    Err(format!(
        "{path}: still lagging after {CATCH_UP_TRIES} tries"
    ))
}
