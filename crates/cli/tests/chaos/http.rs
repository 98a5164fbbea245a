//! The campaign's own calls to the simulator's control routes and to the server's read routes.
//! Each is asked again for a while, because either side may be briefly away when it is made: the
//! simulator closes its listener during an `unreachable_ms` period, and the server may be between
//! a kill and its restart.

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::settings::API_KEY;

/// A control call to the simulator, asked again for a while: an `unreachable_ms` period closes
/// its listener, control routes included.
pub async fn sim_call(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    body: Option<Value>,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut request = http.request(method.clone(), url);
        if let Some(body) = &body {
            request = request.json(body);
        }
        let failure = match request.send().await {
            Ok(answer) if answer.status().is_success() => return,
            Ok(answer) => format!("{}", answer.status()),
            Err(error) => error.to_string(),
        };
        assert!(Instant::now() < deadline, "{url}: {failure}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A list route of the simulator (`/sim/charges`, `/sim/operations`).
pub async fn sim_list(http: &reqwest::Client, sim: &str, what: &str) -> Vec<Value> {
    let url = format!("{sim}/sim/{what}");
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer: Value = loop {
        match http.get(&url).send().await {
            Ok(response) if response.status().is_success() => {
                break response.json().await.expect("json")
            }
            other => assert!(Instant::now() < deadline, "{url}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    match answer {
        Value::Array(items) => items,
        mut other => other["data"].take().as_array().cloned().unwrap_or_default(),
    }
}

pub async fn get_json(http: &reqwest::Client, url: &str) -> (u16, Value) {
    for _ in 0..50 {
        if let Ok(response) = http.get(url).bearer_auth(API_KEY).send().await {
            let status = response.status().as_u16();
            if status < 500 {
                let value = response.json().await.unwrap_or(Value::Null);
                return (status, value);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} never answered");
}

/// Every payment of the tenant, from the list (newest first, paged).
pub async fn list_payments(http: &reqwest::Client, base: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/payments?limit=100");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let (status, page) = get_json(http, &url).await;
        assert_eq!(status, 200, "{page}");
        all.extend(page["data"].as_array().cloned().unwrap_or_default());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return all,
        }
    }
}
