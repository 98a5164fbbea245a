//! A merchant's webhook endpoint, as far as the log knows it: only what the merchant must be told
//! about it. The endpoint itself (its URL, its secrets, its deliveries) is configuration kept
//! beside the log; that it was disabled after days of failures is a fact the merchant's feed
//! says, so it is an event of the endpoint's own stream.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::ids::TenantId;

/// Whether `text` is an endpoint id: `we_` and 32 lowercase hex digits.
#[must_use]
pub fn is_endpoint_id(text: &str) -> bool {
    text.strip_prefix("we_").is_some_and(|hex| {
        hex.len() == 32
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointDisabled {
    pub endpoint_id: String,
    pub tenant: TenantId,
    pub url: String,
    pub reason: String,
    pub at: DateTime<Utc>,
}

crate::event::event_family! {
    /// Events of a `webhook_endpoint-…` stream.
    EndpointEvent {
        EndpointDisabled = 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_ids_are_we_and_32_hex_digits() {
        assert!(is_endpoint_id("we_0123456789abcdef0123456789abcdef"));
        for text in [
            "we_0123456789abcdef0123456789abcde",
            "we_0123456789ABCDEF0123456789abcdef",
            "wd_0123456789abcdef0123456789abcdef",
            "",
        ] {
            assert!(!is_endpoint_id(text), "{text}");
        }
    }
}
