//! The NATS subject of a merchant event: `asiento.<tenant>.<event type>`, e.g.
//! `asiento.acme.payment.created`.
//!
//! A subject is a list of tokens separated by `.`; a token must not be empty nor contain `.`,
//! `*`, `>` or whitespace, or a subscriber's wildcard would match what it did not ask for (or the
//! server would refuse the publish). So every token is encoded:
//!
//! - the tenant is one token;
//! - the event type keeps its dots as token separators (`payment.created` is the two tokens
//!   `payment` and `created`), so that `asiento.*.payment.>` is every tenant's payment events and
//!   `asiento.acme.>` every event of tenant `acme`;
//! - within a token, `A`–`Z`, `a`–`z`, `0`–`9`, `_` and `-` stand for themselves and every other
//!   byte is written `~XX` (two upper-case hex digits of the byte, `~` itself included); an empty
//!   token is written `~`.
//!
//! The encoding is injective, and the identity on what the ledger produces today: tenant ids
//! are `[a-z0-9_-]{1,64}` (`asiento_domain::TenantId`) and event types are lower-case words
//! with `_` joined by `.` (`asiento_merchant_events::EventKind`).

use std::fmt::Write as _;

/// The first token of every subject the relay publishes; the stream it creates holds
/// `asiento.>`.
pub const PREFIX: &str = "asiento";

/// The subjects the relay's stream is created with.
pub const STREAM_SUBJECTS: &str = "asiento.>";

/// The subject of an event of `tenant` of type `event_type`.
#[must_use]
pub fn subject(tenant: &str, event_type: &str) -> String {
    let mut subject = String::with_capacity(PREFIX.len() + tenant.len() + event_type.len() + 2);
    subject.push_str(PREFIX);
    subject.push('.');
    push_token(&mut subject, tenant);
    for part in event_type.split('.') {
        subject.push('.');
        push_token(&mut subject, part);
    }
    subject
}

/// One subject token for `raw` (see the module docs).
#[must_use]
pub fn token(raw: &str) -> String {
    let mut token = String::with_capacity(raw.len());
    push_token(&mut token, raw);
    token
}

fn push_token(out: &mut String, raw: &str) {
    if raw.is_empty() {
        out.push('~');
        return;
    }
    for byte in raw.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-' {
            out.push(char::from(byte));
        } else {
            // Writing to a String cannot fail.
            let _ = write!(out, "~{byte:02X}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_ledger_produces_is_unchanged() {
        assert_eq!(
            subject("acme", "payment.created"),
            "asiento.acme.payment.created"
        );
        assert_eq!(
            subject("shop_2-eu", "payment.requires_action"),
            "asiento.shop_2-eu.payment.requires_action"
        );
        for kind in asiento_merchant_events::EventKind::ALL {
            let subject = subject("acme", kind.as_str());
            assert_eq!(subject, format!("asiento.acme.{}", kind.as_str()));
            assert!(!subject.contains('~'), "{subject}");
        }
        assert!(asiento_domain::TenantId::parse("shop_2-eu").is_ok());
    }

    #[test]
    fn wildcards_separators_and_whitespace_are_escaped() {
        assert_eq!(token("a.b"), "a~2Eb");
        assert_eq!(token("*"), "~2A");
        assert_eq!(token(">"), "~3E");
        assert_eq!(token("a b\tc\r\n"), "a~20b~09c~0D~0A");
        assert_eq!(token("~"), "~7E");
        assert_eq!(token("$SYS"), "~24SYS");
        assert_eq!(token("é"), "~C3~A9");
        assert_eq!(token(""), "~");
        assert_eq!(subject("a.b", "x"), "asiento.a~2Eb.x");
        assert_eq!(
            subject(">", "payment..created"),
            "asiento.~3E.payment.~.created"
        );
    }

    #[test]
    fn every_token_is_a_valid_nats_token() {
        let samples = [
            "",
            "~",
            ".",
            "..",
            "*",
            ">",
            " ",
            "a.b",
            "a*b",
            "a>b",
            "tab\there",
            "ü",
            "$JS",
            "x~2Ey",
            "acme",
            "ACME",
            "a-b_c",
        ];
        for raw in samples {
            let token = token(raw);
            assert!(!token.is_empty(), "{raw:?}");
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'~')),
                "{raw:?} gave {token:?}"
            );
        }
    }

    #[test]
    fn the_encoding_is_injective() {
        let samples = [
            "", "~", "~7E", ".", "~2E", "a.b", "a~2Eb", "a", "A", "a b", "a~20b", "ü", "~C3~BC",
            "a-b", "a_b",
        ];
        let mut seen = std::collections::HashMap::new();
        for raw in samples {
            if let Some(other) = seen.insert(token(raw), raw) {
                panic!("{raw:?} and {other:?} share the token {:?}", token(raw));
            }
        }
        // A tenant's dots cannot move events into another tenant's subtree.
        assert_ne!(subject("a.b", "c.d"), subject("a", "b.c.d"));
    }
}
