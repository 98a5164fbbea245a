//! Webhook signatures: `Psp-Signature: t=<unix seconds>,v1=<hex
//! HMAC-SHA256(secret, "<t>.<raw body>")>`.
//!
//! The simulator signs with [`sign`]; the ledger's webhook endpoint checks
//! with [`verify`]. Verification takes any header string an attacker can
//! send, so it parses without panicking, bounds what it reads, compares in
//! constant time and refuses timestamps outside the tolerance in either
//! direction (a replayed old event, or a clock far ahead).

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The header carrying the signature.
pub const SIGNATURE_HEADER: &str = "Psp-Signature";

/// How far `t` may be from our clock (API.md: 5 minutes).
pub const TOLERANCE_S_DEFAULT: i64 = 300;

/// A longer header is refused before any parsing: a real one is ~80 bytes,
/// a few more with rotated secrets.
pub const HEADER_LEN_MAX: usize = 1024;

/// Bounds the work per header: a provider rotating secrets sends a few `v1`.
pub const SIGNATURES_PER_HEADER_MAX: usize = 8;

/// Why a signature was refused. Every variant means "do not trust the body".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("signature header is longer than {HEADER_LEN_MAX} bytes")]
    HeaderTooLong,
    #[error("signature header is malformed: {0}")]
    Malformed(&'static str),
    #[error("signature header has no timestamp `t`")]
    TimestampMissing,
    #[error("signature header has no `v1` signature")]
    SignatureMissing,
    #[error("signature timestamp {t} is more than {tolerance_s} s away from now ({now})")]
    TimestampOutsideTolerance { t: i64, now: i64, tolerance_s: i64 },
    #[error("no signature matches the body")]
    Mismatch,
}

fn mac(secret: &[u8], t: i64, body: &[u8]) -> HmacSha256 {
    // HMAC hashes over-long keys and pads short ones, so no key length (and
    // nothing a caller sends) can make this fail.
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC accepts keys of any length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

/// The header value for `body` signed at unix time `t`.
pub fn sign(secret: &str, t: i64, body: &[u8]) -> String {
    let tag = mac(secret.as_bytes(), t, body).finalize().into_bytes();
    format!("t={t},v1={}", hex::encode(tag))
}

/// Checks `header` (the value of [`SIGNATURE_HEADER`]) against the raw body.
/// Any `v1` that matches is enough, so a provider can sign with an old and a
/// new secret while it rotates them. Unknown keys (`v0`, future schemes) are
/// ignored, as Stripe's are.
pub fn verify(
    secret: &str,
    header: &str,
    body: &[u8],
    now_unix: i64,
    tolerance_s: i64,
) -> Result<(), SignatureError> {
    if header.len() > HEADER_LEN_MAX {
        return Err(SignatureError::HeaderTooLong);
    }
    let mut t: Option<i64> = None;
    let mut signatures: Vec<Vec<u8>> = Vec::new();
    for part in header.split(',') {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (key, value) = part
            .split_once('=')
            .ok_or(SignatureError::Malformed("a part has no `=`"))?;
        match key.trim() {
            "t" => {
                if t.is_some() {
                    return Err(SignatureError::Malformed("more than one `t`"));
                }
                let value = value.trim();
                if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(SignatureError::Malformed("`t` is not unix seconds"));
                }
                t = Some(
                    value
                        .parse::<i64>()
                        .map_err(|_| SignatureError::Malformed("`t` is out of range"))?,
                );
            }
            "v1" => {
                if signatures.len() >= SIGNATURES_PER_HEADER_MAX {
                    return Err(SignatureError::Malformed("too many `v1` signatures"));
                }
                let bytes = hex::decode(value.trim())
                    .map_err(|_| SignatureError::Malformed("`v1` is not hex"))?;
                signatures.push(bytes);
            }
            _ => {}
        }
    }
    let t = t.ok_or(SignatureError::TimestampMissing)?;
    if signatures.is_empty() {
        return Err(SignatureError::SignatureMissing);
    }
    // `t` is non-negative (digits only), so the difference cannot overflow
    // unless `now_unix` is absurd; checked arithmetic treats that as stale.
    let within = now_unix
        .checked_sub(t)
        .map(|d| d.checked_abs().is_some_and(|d| d <= tolerance_s))
        .unwrap_or(false);
    if !within {
        return Err(SignatureError::TimestampOutsideTolerance {
            t,
            now: now_unix,
            tolerance_s,
        });
    }
    let expected = mac(secret.as_bytes(), t, body);
    // `verify_slice` compares in constant time; a wrong-length candidate is
    // refused without comparing.
    if signatures
        .iter()
        .any(|candidate| expected.clone().verify_slice(candidate).is_ok())
    {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "whsec_test";
    const NOW: i64 = 1_764_000_000;
    const BODY: &[u8] = br#"{"id":"evt_1","type":"charge.succeeded"}"#;

    fn check(header: &str, body: &[u8], now: i64) -> Result<(), SignatureError> {
        verify(SECRET, header, body, now, TOLERANCE_S_DEFAULT)
    }

    #[test]
    fn matches_the_format_of_api_md() {
        // Computed independently with
        // `printf '%s' '1764000000.<BODY>' | openssl dgst -sha256 -hmac whsec_test`
        // and pinned, so a change to the signed string is caught.
        let header = sign(SECRET, NOW, BODY);
        assert_eq!(
            header,
            "t=1764000000,v1=cffbf20f217625f27109a9098aaea3c6048a55fae038fb09a819f167fa1749f1"
        );
        assert_eq!(check(&header, BODY, NOW), Ok(()));
    }

    #[test]
    fn table() {
        let good = sign(SECRET, NOW, BODY);
        let other_secret = sign("whsec_other", NOW, BODY);
        let good_sig = good.split_once("v1=").unwrap().1.to_string();
        type Case<'a> = (&'a str, String, &'a [u8], i64, Result<(), SignatureError>);
        let cases: Vec<Case> = vec![
            ("valid", good.clone(), BODY, NOW, Ok(())),
            (
                "valid at the edge of tolerance",
                good.clone(),
                BODY,
                NOW + 300,
                Ok(()),
            ),
            (
                "too old",
                good.clone(),
                BODY,
                NOW + 301,
                Err(SignatureError::TimestampOutsideTolerance {
                    t: NOW,
                    now: NOW + 301,
                    tolerance_s: 300,
                }),
            ),
            (
                "too far ahead",
                good.clone(),
                BODY,
                NOW - 301,
                Err(SignatureError::TimestampOutsideTolerance {
                    t: NOW,
                    now: NOW - 301,
                    tolerance_s: 300,
                }),
            ),
            (
                "body changed",
                good.clone(),
                b"{}",
                NOW,
                Err(SignatureError::Mismatch),
            ),
            (
                "wrong secret",
                other_secret.clone(),
                BODY,
                NOW,
                Err(SignatureError::Mismatch),
            ),
            (
                "rotated secrets: one matching v1 is enough",
                format!(
                    "t={NOW},v1={},v1={good_sig}",
                    other_secret.split_once("v1=").unwrap().1
                ),
                BODY,
                NOW,
                Ok(()),
            ),
            (
                "unknown scheme ignored",
                format!("t={NOW},v0=abc,v1={good_sig}"),
                BODY,
                NOW,
                Ok(()),
            ),
            (
                "spaces tolerated",
                format!(" t={NOW} , v1={good_sig} "),
                BODY,
                NOW,
                Ok(()),
            ),
            (
                "empty",
                String::new(),
                BODY,
                NOW,
                Err(SignatureError::TimestampMissing),
            ),
            (
                "no timestamp",
                format!("v1={good_sig}"),
                BODY,
                NOW,
                Err(SignatureError::TimestampMissing),
            ),
            (
                "no signature",
                format!("t={NOW}"),
                BODY,
                NOW,
                Err(SignatureError::SignatureMissing),
            ),
            (
                "no equals",
                "garbage".to_string(),
                BODY,
                NOW,
                Err(SignatureError::Malformed("a part has no `=`")),
            ),
            (
                "negative t",
                format!("t=-5,v1={good_sig}"),
                BODY,
                NOW,
                Err(SignatureError::Malformed("`t` is not unix seconds")),
            ),
            (
                "huge t",
                format!("t=99999999999999999999,v1={good_sig}"),
                BODY,
                NOW,
                Err(SignatureError::Malformed("`t` is out of range")),
            ),
            (
                "two t",
                format!("t={NOW},t={NOW},v1={good_sig}"),
                BODY,
                NOW,
                Err(SignatureError::Malformed("more than one `t`")),
            ),
            (
                "odd hex",
                format!("t={NOW},v1=abc"),
                BODY,
                NOW,
                Err(SignatureError::Malformed("`v1` is not hex")),
            ),
            (
                "short signature",
                format!("t={NOW},v1=abcd"),
                BODY,
                NOW,
                Err(SignatureError::Mismatch),
            ),
            (
                "too long",
                format!("t={NOW},v1={}", "a".repeat(2000)),
                BODY,
                NOW,
                Err(SignatureError::HeaderTooLong),
            ),
        ];
        for (name, header, body, now, expected) in cases {
            assert_eq!(check(&header, body, now), expected, "case: {name}");
        }
    }

    #[test]
    fn extreme_clocks_do_not_overflow() {
        let header = sign(SECRET, NOW, BODY);
        assert!(check(&header, BODY, i64::MIN).is_err());
        assert!(check(&header, BODY, i64::MAX).is_err());
        assert!(verify(SECRET, &header, BODY, NOW, i64::MAX).is_ok());
    }

    proptest! {
        #[test]
        fn never_panics_on_any_header(header in ".{0,200}", now in any::<i64>(), tol in any::<i64>()) {
            let _ = verify(SECRET, &header, BODY, now, tol);
        }

        #[test]
        fn never_panics_on_header_like_strings(
            parts in proptest::collection::vec("(t|v1|v0|x)=[0-9a-f-]{0,70}", 0..6),
            now in any::<i64>(),
        ) {
            let _ = verify(SECRET, &parts.join(","), BODY, now, TOLERANCE_S_DEFAULT);
        }

        #[test]
        fn what_is_signed_verifies(body in proptest::collection::vec(any::<u8>(), 0..256), t in 0i64..4_000_000_000) {
            prop_assert_eq!(check(&sign(SECRET, t, &body), &body, t), Ok(()));
        }
    }
}
