//! After the load: every hold given an `expires_at` ends, by its expiry through the worker unless
//! a client ended it first (none does: the campaign leaves them to the worker). A hold still
//! pending long after its expiry is a finding; so is a campaign in which no hold expired at all
//! (it would not have tested the worker against the busy account).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::tally::Caller;

/// How long after the load the last hold may take to end.
const ENDED_WITHIN: Duration = Duration::from_secs(30);
/// Reads of one hold at most.
const READS_MAX: u32 = 300;

/// Waits for each hold in `ids` to end; how many ended in each status.
pub async fn ended(caller: &Caller, ids: &[String]) -> BTreeMap<String, u64> {
    let deadline = Instant::now() + ENDED_WITHIN;
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    for id in ids {
        let mut status = String::new();
        for _ in 0..READS_MAX {
            let Some(hold) = caller
                .get("read hold", &format!("/v1/transfers/{id}"))
                .await
            else {
                break;
            };
            status = hold["status"].as_str().unwrap_or_default().to_owned();
            if status != "pending" || Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if status != "expired" {
            caller.tally.fail(format!(
                "hold {id} with an expiry ended {status:?}, not \"expired\""
            ));
        }
        *statuses.entry(status).or_default() += 1;
    }
    if statuses.get("expired").copied().unwrap_or(0) == 0 {
        caller
            .tally
            .fail("no hold expired: the expiry worker was never raced".to_owned());
    }
    statuses
}
