//! Fuzzing webhook signatures beyond the unit properties in `src/signature.rs` (which cover
//! short arbitrary headers against one body, and sign-then-verify at the same instant).
//!
//! Here: any header (up to and past the length limit), any body, any secret, any clock and any
//! tolerance never panic and never verify without the secret; a signed header verifies exactly
//! while the clock is within the tolerance, in either direction and at the extremes of `i64`;
//! any change to the body or to the signature is refused; a genuine signature is found among up
//! to the allowed number of others, in any position, with unknown schemes and spaces around.
#![allow(clippy::unwrap_used)]

use asiento_psp::signature::{HEADER_LEN_MAX, SIGNATURES_PER_HEADER_MAX};
use asiento_psp::{sign, verify, SignatureError};
use proptest::prelude::*;
use proptest::sample::Index;

/// Each property runs in well under a second in a debug build on 2 cores.
const CASES: u32 = 256;

fn secret() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("whsec_test".to_owned()),
        Just(String::new()),
        "\\PC{1,80}",
        // Longer than SHA-256's block: HMAC hashes the key first.
        "[a-z0-9]{65,200}",
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        Just(br#"{"id":"evt_1","type":"charge.succeeded"}"#.to_vec()),
    ]
}

/// Headers from garbage to almost right: parts of known and unknown keys with values of digits,
/// hex, signs and spaces, joined by commas, sometimes padded past the length limit.
fn header() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        "(t|v1|v0|T|V1| t |v1 )=[0-9a-fA-F +-]{0,80}",
        "t=[0-9]{0,25}",
        "v1=[0-9a-f]{64}",
        "[^,]{0,20}",
        Just(String::new()),
    ];
    prop_oneof![
        4 => proptest::collection::vec(part, 0..12).prop_map(|parts| parts.join(",")),
        1 => ".{0,1100}",
        1 => ("t=[0-9]{1,10},v1=[0-9a-f]{64}", 0usize..1100)
            .prop_map(|(h, pad)| format!("{h},{}", "x".repeat(pad))),
    ]
}

fn clock() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => 0i64..4_000_000_000,
        1 => any::<i64>(),
        1 => Just(i64::MIN),
        1 => Just(i64::MAX),
    ]
}

fn tolerance() -> impl Strategy<Value = i64> {
    prop_oneof![
        3 => Just(300i64),
        2 => 0i64..100_000,
        1 => any::<i64>(),
        1 => Just(i64::MAX),
    ]
}

fn sig_of(header: &str) -> &str {
    header.split_once("v1=").unwrap().1
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Whatever arrives, the answer is a value; without the secret it is never `Ok`; a header
    /// over the limit is refused before it is read.
    #[test]
    fn any_header_any_body_any_clock(
        secret in secret(),
        header in header(),
        body in body(),
        now in clock(),
        tolerance in tolerance(),
    ) {
        let result = verify(&secret, &header, &body, now, tolerance);
        prop_assert!(result.is_err(), "{header:?} verified without the secret");
        if header.len() > HEADER_LEN_MAX {
            prop_assert_eq!(result, Err(SignatureError::HeaderTooLong));
        } else {
            prop_assert!(!result.unwrap_err().to_string().is_empty());
        }
    }

    /// A signed header verifies exactly while `|now − t| ≤ tolerance`, whichever side `now` is
    /// on (with `now` up to `i64::MAX` away, where a naive subtraction overflows), and the refusal names the timestamp and the clock.
    #[test]
    fn signed_headers_verify_exactly_within_tolerance(
        secret in secret(),
        body in body(),
        t in prop_oneof![0i64..4_000_000_000, Just(0i64), Just(i64::MAX)],
        offset in prop_oneof![-1_000i64..1_000, any::<i64>()],
        tolerance in prop_oneof![0i64..1_000, Just(300i64), any::<i64>()],
    ) {
        let header = sign(&secret, t, &body);
        let now = t.saturating_add(offset);
        // A negative tolerance admits nothing.
        let within = u128::try_from(tolerance)
            .is_ok_and(|tolerance| i128::from(now).abs_diff(i128::from(t)) <= tolerance);
        let result = verify(&secret, &header, &body, now, tolerance);
        if within {
            prop_assert_eq!(result, Ok(()));
        } else {
            prop_assert_eq!(
                result,
                Err(SignatureError::TimestampOutsideTolerance { t, now, tolerance_s: tolerance })
            );
        }
    }

    /// Any body byte changed, a byte dropped or one added: refused.
    #[test]
    fn any_change_to_the_body_is_refused(
        secret in secret(),
        body in proptest::collection::vec(any::<u8>(), 1..512),
        t in 0i64..4_000_000_000,
        which in any::<Index>(),
        flip in 1u8..=255,
        change in 0u8..3,
    ) {
        let header = sign(&secret, t, &body);
        let mut changed = body.clone();
        let at = which.index(body.len());
        match change {
            0 => changed[at] ^= flip,
            1 => { changed.remove(at); }
            _ => changed.insert(at, flip),
        }
        prop_assert_eq!(verify(&secret, &header, &changed, t, 300), Err(SignatureError::Mismatch));
    }

    /// Any hex digit of the signature changed, or the signature cut short: refused.
    #[test]
    fn any_change_to_the_signature_is_refused(
        secret in secret(),
        body in body(),
        t in 0i64..4_000_000_000,
        which in any::<Index>(),
        digit in 0u32..16,
        cut in any::<bool>(),
    ) {
        let header = sign(&secret, t, &body);
        let signature = sig_of(&header);
        let at = which.index(signature.len());
        let changed = if cut {
            signature[..at].to_owned()
        } else {
            let digit = char::from_digit(digit, 16).unwrap();
            prop_assume!(signature.as_bytes()[at] != digit as u8);
            let mut s = signature.to_owned();
            s.replace_range(at..=at, &digit.to_string());
            s
        };
        let result = verify(&secret, &format!("t={t},v1={changed}"), &body, t, 300);
        if changed.len() % 2 == 1 {
            prop_assert_eq!(result, Err(SignatureError::Malformed("`v1` is not hex")));
        } else {
            prop_assert_eq!(result, Err(SignatureError::Mismatch));
        }
    }

    /// Signed with another secret, or at another second: refused.
    #[test]
    fn another_secret_or_timestamp_is_refused(
        secret in secret(),
        other in secret(),
        body in body(),
        t in 1i64..4_000_000_000,
        shift in prop_oneof![Just(-1i64), Just(1i64), -300i64..300],
    ) {
        prop_assume!(secret != other && shift != 0);
        let header = sign(&other, t, &body);
        prop_assert_eq!(verify(&secret, &header, &body, t, 300), Err(SignatureError::Mismatch));
        // The signature of second t presented as second t + shift.
        let moved = format!("t={},v1={}", t + shift, sig_of(&sign(&secret, t, &body)));
        prop_assert_eq!(verify(&secret, &moved, &body, t, 300), Err(SignatureError::Mismatch));
    }

    /// A provider rotating secrets: the genuine signature is found among up to the allowed
    /// number of `v1`, wherever it is, with unknown schemes and spaces around; one more `v1` is
    /// refused as malformed.
    #[test]
    fn a_genuine_signature_is_found_among_others(
        body in body(),
        t in 0i64..4_000_000_000,
        decoys in proptest::collection::vec("[0-9a-f]{64}", 0..SIGNATURES_PER_HEADER_MAX),
        position in any::<Index>(),
        unknown in proptest::collection::vec("v[02-9]=[a-z0-9]{0,20}", 0..3),
        pad in "[ ]{0,2}",
    ) {
        let genuine = sign("whsec_test", t, &body);
        let mut v1: Vec<String> = decoys.iter().map(|d| format!("v1={d}")).collect();
        v1.insert(position.index(v1.len() + 1), format!("v1={}", sig_of(&genuine)));
        let mut parts = vec![format!("t={t}")];
        parts.extend(unknown);
        parts.extend(v1.iter().cloned());
        let header = parts.iter().map(|p| format!("{pad}{p}{pad}")).collect::<Vec<_>>().join(",");
        prop_assert_eq!(verify("whsec_test", &header, &body, t, 300), Ok(()));
        if v1.len() == SIGNATURES_PER_HEADER_MAX {
            let over = format!("{header},v1={}", "0".repeat(64));
            prop_assert_eq!(
                verify("whsec_test", &over, &body, t, 300),
                Err(SignatureError::Malformed("too many `v1` signatures"))
            );
        }
    }
}

/// `sign` takes any `i64`, but `verify` reads only unix seconds: a timestamp before 1970 cannot
/// be verified. Pinned so that a change to either side is deliberate (providers sign with the
/// current time, so this is never reached in practice).
#[test]
fn timestamps_before_1970_are_refused() {
    let header = sign("whsec_test", -5, b"{}");
    assert_eq!(header.split_once(',').unwrap().0, "t=-5");
    assert_eq!(
        verify("whsec_test", &header, b"{}", -5, 300),
        Err(SignatureError::Malformed("`t` is not unix seconds"))
    );
}
