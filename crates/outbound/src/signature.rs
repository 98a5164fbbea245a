//! The `Asiento-Signature` header of a delivery: `t=<unix seconds>,v1=<hex HMAC-SHA256(secret,
//! "<t>.<raw body>")>`, with one `v1` per secret valid when it is sent (two during a rotation),
//! so a merchant can rotate without a moment in which its check fails. docs/API.md gives the
//! verification.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The header's name.
pub const SIGNATURE_HEADER: &str = "Asiento-Signature";
/// The header naming the event, for a consumer that dedups before it parses.
pub const EVENT_ID_HEADER: &str = "Asiento-Event-Id";

/// The hex HMAC-SHA256 of `"<t>.<body>"` under `secret`.
#[must_use]
pub fn signature(secret: &str, t: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// The header's value for `body` sent at `t` under each of `secrets`.
#[must_use]
pub fn header(secrets: &[String], t: i64, body: &[u8]) -> String {
    let mut value = format!("t={t}");
    for secret in secrets {
        value.push_str(",v1=");
        value.push_str(&signature(secret, t, body));
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_carries_one_signature_per_secret_over_t_and_the_body() {
        let body = br#"{"id":"evt_1"}"#;
        let one = header(&["whsec_a".to_owned()], 1_764_000_000, body);
        let two = header(
            &["whsec_a".to_owned(), "whsec_b".to_owned()],
            1_764_000_000,
            body,
        );
        assert_eq!(
            one,
            format!(
                "t=1764000000,v1={}",
                signature("whsec_a", 1_764_000_000, body)
            )
        );
        assert_eq!(
            two,
            format!("{one},v1={}", signature("whsec_b", 1_764_000_000, body))
        );
        // The signature covers t and every byte of the body.
        assert_ne!(
            signature("whsec_a", 1_764_000_001, body),
            signature("whsec_a", 1_764_000_000, body)
        );
        assert_ne!(
            signature("whsec_a", 1_764_000_000, b"{}"),
            signature("whsec_a", 1_764_000_000, body)
        );
        // Known answer: HMAC-SHA256("key", "The quick brown fox jumps over the lazy dog").
        let mut mac = Hmac::<Sha256>::new_from_slice(b"key").unwrap_or_else(|_| unreachable!());
        mac.update(b"The quick brown fox jumps over the lazy dog");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }
}
