//! Fuzzing the two pure halves of idempotency: the client's `Idempotency-Key` and the hash of the
//! request body it is bound to.
//!
//! A key is accepted exactly when it is 1–255 printable ASCII characters (API.md), checked here
//! against a model on arbitrary strings. The body hash must be blind to what JSON leaves free (key
//! order at any depth, whitespace) and see everything else (any scalar, key or shape changed):
//! a hash that is too blind replays one request's answer for another; a hash that sees too much
//! answers an honest retry with 422. It must also stay the documented function (SHA-256 of the
//! sorted-key compact form), because hashes are stored and compared across deployments.
#![allow(clippy::unwrap_used)]

use asiento_app::idempotency::{canonical_body_hash, IdempotencyKey, KeyError, KEY_LENGTH_MAX};
use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{Map, Number, Value};
use sha2::{Digest, Sha256};

/// Each property runs in well under a second in a debug build on 2 cores.
const CASES: u32 = 256;

// ---------------------------------------------------------------------------------------------
// Keys

/// What API.md says a key is, written independently of the code under test.
fn model(raw: &str) -> Result<(), KeyError> {
    if raw.is_empty() {
        Err(KeyError::Empty)
    } else if !raw.chars().all(|c| (' '..='~').contains(&c)) {
        Err(KeyError::NotPrintableAscii)
    } else if raw.chars().count() > KEY_LENGTH_MAX {
        Err(KeyError::TooLong)
    } else {
        Ok(())
    }
}

fn key_text() -> impl Strategy<Value = String> {
    prop_oneof![
        // Printable ASCII around the length limit.
        "[ -~]{0,300}",
        "[ -~]{254,256}",
        // Almost printable: one control character, DEL, or a non-ASCII character somewhere.
        (
            "[ -~]{0,40}",
            "[\\x00-\\x1f\\x7f\\u{80}-\\u{10ffff}]",
            "[ -~]{0,40}"
        )
            .prop_map(|(a, b, c)| format!("{a}{b}{c}")),
        // Anything at all, long multibyte strings included.
        ".{0,300}",
        "\\PC{250,260}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn keys_are_exactly_1_to_255_printable_ascii(raw in key_text()) {
        match (IdempotencyKey::parse(&raw), model(&raw)) {
            (Ok(key), Ok(())) => prop_assert_eq!(key.as_str(), raw.as_str()),
            (got, want) => prop_assert_eq!(got.map(|_| ()), want),
        }
    }
}

#[test]
fn key_limits_are_exact() {
    let cases: [(String, Result<(), KeyError>); 8] = [
        (String::new(), Err(KeyError::Empty)),
        (" ".to_owned(), Ok(())),
        ("~".repeat(255), Ok(())),
        ("a".repeat(256), Err(KeyError::TooLong)),
        ("order-1\u{7f}".to_owned(), Err(KeyError::NotPrintableAscii)),
        ("order-1\t".to_owned(), Err(KeyError::NotPrintableAscii)),
        ("pedido-ñ".to_owned(), Err(KeyError::NotPrintableAscii)),
        // 128 two-byte characters are 256 bytes: refused for what they are, not their length.
        ("é".repeat(128), Err(KeyError::NotPrintableAscii)),
    ];
    for (raw, want) in cases {
        assert_eq!(
            IdempotencyKey::parse(&raw).map(|_| ()),
            want,
            "{raw:?} ({} bytes)",
            raw.len()
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Body hashes

fn odd_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,6}",
        ".{0,12}",
        Just("\"\\/\u{0}\u{1f}\u{7f}".to_owned()),
        Just("e\u{301}\u{200f}\u{fffd}\u{1f4b8}".to_owned()),
        // Precomposed and decomposed: different bytes, so different keys.
        Just("\u{e9}".to_owned()),
        Just("e\u{301}".to_owned()),
    ]
}

fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-10i64..10).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        Just(Value::Number(Number::from_f64(1.0).unwrap())),
        Just(Value::Number(Number::from_f64(-0.0).unwrap())),
        Just(Value::Number(Number::from_f64(f64::MAX).unwrap())),
    ]
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number(),
        odd_text().prop_map(Value::String),
    ]
}

/// Any JSON value, at most 5 levels deep and about 64 nodes.
fn json() -> impl Strategy<Value = Value> {
    scalar().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::btree_map(odd_text(), inner, 0..6)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// Writes `value` as JSON text with every object's keys in an order drawn from `seed` and
/// whitespace between tokens, as a client library might.
fn write_scrambled(value: &Value, seed: &mut u64, out: &mut String) {
    let mut next = || {
        *seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *seed >> 33
    };
    let space = [" ", "\n", "\t", "\r\n  ", ""][(next() % 5) as usize];
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            for i in (1..entries.len()).rev() {
                entries.swap(i, (next() % (i as u64 + 1)) as usize);
            }
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(space);
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(space);
                out.push(':');
                write_scrambled(item, seed, out);
            }
            out.push_str(space);
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(space);
                write_scrambled(item, seed, out);
            }
            out.push(']');
        }
        scalar => {
            out.push_str(space);
            out.push_str(&scalar.to_string());
        }
    }
}

/// The same value with every object rebuilt with its keys inserted in reverse order (which
/// matters when serde_json's `preserve_order` is on somewhere in the build).
fn reversed(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, item) in map.iter().rev() {
                out.insert(key.clone(), reversed(item));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
        scalar => scalar.clone(),
    }
}

/// The documented canonical form, built independently: keys inserted in sorted order, compact.
fn documented_hash(value: &Value) -> [u8; 32] {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                let mut out = Map::new();
                for key in keys {
                    out.insert(key.clone(), sorted(&map[key]));
                }
                Value::Object(out)
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            scalar => scalar.clone(),
        }
    }
    Sha256::digest(serde_json::to_string(&sorted(value)).unwrap().as_bytes()).into()
}

/// Paths to every scalar and every object key of `value`.
#[derive(Debug, Clone)]
enum Step {
    Index(usize),
    Key(String),
}

fn scalar_paths(value: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        Value::Object(map) => {
            for (key, item) in map {
                path.push(Step::Key(key.clone()));
                scalar_paths(item, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                path.push(Step::Index(index));
                scalar_paths(item, path, out);
                path.pop();
            }
        }
        _ => out.push(path.clone()),
    }
}

fn at_path<'a>(value: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(value, |value, step| match step {
        Step::Index(index) => &mut value[*index],
        Step::Key(key) => &mut value[key.as_str()],
    })
}

/// Objects of `value`, by path, that have at least one key.
fn object_paths(value: &Value, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    match value {
        Value::Object(map) => {
            if !map.is_empty() {
                out.push(path.clone());
            }
            for (key, item) in map {
                path.push(Step::Key(key.clone()));
                object_paths(item, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                path.push(Step::Index(index));
                object_paths(item, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    /// Key order at any depth and whitespace do not change the hash: bytes a client may send
    /// for the same body, parsed the way the API parses them, hash alike.
    #[test]
    fn hash_ignores_key_order_and_whitespace(value in json(), seed in any::<u64>()) {
        let compact = serde_json::to_string(&value).unwrap();
        let mut scrambled = String::new();
        let mut state = seed;
        write_scrambled(&value, &mut state, &mut scrambled);
        let from_compact: Value = serde_json::from_str(&compact).unwrap();
        let from_scrambled: Value = serde_json::from_str(&scrambled).unwrap();
        let hash = canonical_body_hash(&from_compact);
        prop_assert_eq!(canonical_body_hash(&from_scrambled), hash, "{} vs {}", compact, scrambled);
        prop_assert_eq!(canonical_body_hash(&reversed(&value)), canonical_body_hash(&value));
        prop_assert_eq!(canonical_body_hash(&value).0, documented_hash(&value));
    }

    /// Any scalar changed anywhere changes the hash.
    #[test]
    fn hash_sees_every_scalar(value in json(), which in any::<Index>(), replacement in scalar()) {
        let mut paths = Vec::new();
        scalar_paths(&value, &mut Vec::new(), &mut paths);
        prop_assume!(!paths.is_empty());
        let path = &paths[which.index(paths.len())];
        let mut changed = value.clone();
        let slot = at_path(&mut changed, path);
        prop_assume!(*slot != replacement);
        *slot = replacement;
        prop_assert_ne!(canonical_body_hash(&changed), canonical_body_hash(&value), "{} vs {}", value, changed);
    }

    /// A key renamed, removed or added anywhere changes the hash; so does wrapping a value.
    #[test]
    fn hash_sees_every_key_and_shape(
        value in json(),
        which in any::<Index>(),
        key in odd_text(),
        action in 0u8..3,
    ) {
        let before = canonical_body_hash(&value);
        let mut paths = Vec::new();
        object_paths(&value, &mut Vec::new(), &mut paths);
        let mut changed = value.clone();
        if paths.is_empty() {
            changed = Value::Array(vec![changed]);
        } else {
            let Value::Object(map) = at_path(&mut changed, &paths[which.index(paths.len())]) else {
                unreachable!("an object path names an object");
            };
            let first = map.keys().next().unwrap().clone();
            match action {
                0 => {
                    prop_assume!(!map.contains_key(&key));
                    let item = map.remove(&first).unwrap();
                    map.insert(key, item);
                }
                1 => {
                    map.remove(&first);
                }
                _ => {
                    prop_assume!(!map.contains_key(&key));
                    map.insert(key, Value::Null);
                }
            }
        }
        prop_assert_ne!(canonical_body_hash(&changed), before, "{} vs {}", value, changed);
    }
}

/// Nesting far beyond what the API lets through (32 levels) still hashes.
#[test]
fn deep_and_wide_values_hash_without_panicking() {
    let mut deep = Value::Null;
    for depth in 0..256 {
        deep = if depth % 2 == 0 {
            Value::Array(vec![deep])
        } else {
            let mut map = Map::new();
            map.insert(format!("k{depth}"), deep);
            Value::Object(map)
        };
    }
    let _ = canonical_body_hash(&deep);
    let wide = Value::Array((0..10_000).map(Value::from).collect());
    let _ = canonical_body_hash(&wide);
    // Integer and float forms of one number are different bodies.
    assert_ne!(
        canonical_body_hash(&serde_json::json!({"amount_minor": 1})),
        canonical_body_hash(&serde_json::json!({"amount_minor": 1.0}))
    );
}

/// Pinned: hashes are stored on idempotency records, so the function may not drift between
/// releases (a retry after a deployment would be answered 422).
#[test]
fn hash_of_a_known_body_is_pinned() {
    let body: Value = serde_json::from_str(
        r#"{"currency":"USD","amount_minor":10000,"metadata":{"b":[1,2.5,null],"a":"é"}}"#,
    )
    .unwrap();
    let canonical =
        r#"{"amount_minor":10000,"currency":"USD","metadata":{"a":"é","b":[1,2.5,null]}}"#;
    let want: [u8; 32] = Sha256::digest(canonical.as_bytes()).into();
    assert_eq!(canonical_body_hash(&body).0, want);
}
